"""Typed run state: what one step learns on a host and a later step reads.

Why: steps used to pass what they learned through one dict of string keys
(28 of them, "release_changed", "service"...), so nobody could tell who wrote
a key, of what type, or who read it, and the rollback's copy of the service
step's entry silently lacked a field (api_key: issue 29). Now each piece is a small dataclass,
subclassing `HostState`, defined beside the step or module that writes it;
a reader asks its class: `ReleaseDecision.of(ctx)`.

The host context holds the pieces in `ctx.state`, keyed by their class (one of
each per host per run). Inputs of the whole run (the CLI's --allow-reboot,
deploy --rehearse) are not state: they are `ctx.options` (k26ops.steps.RunOptions).
Base layer: imports nothing from k26ops, so that the host layer (profile,
release I/O) can keep state too.
"""

from __future__ import annotations

from typing import TypeVar

S = TypeVar("S", bound="HostState")


class HostState:
    """Base of one typed piece of a host's run state (subclasses are dataclasses)."""

    @classmethod
    def get(cls: type[S], ctx) -> S | None:
        """This host's piece, or None when its writer has not run."""
        return ctx.state.get(cls)

    @classmethod
    def of(cls: type[S], ctx) -> S:
        """This host's piece; its defaults (created and kept) when its writer has not run."""
        got = ctx.state.get(cls)
        if got is None:
            got = ctx.state[cls] = cls()
        return got

    def put(self: S, ctx) -> S:
        """Make this the host's piece of its class (the writer's call)."""
        ctx.state[type(self)] = self
        return self
