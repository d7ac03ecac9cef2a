"""Shell completion (click's): host and group names for --limit, baseline tags.

Completion runs without the group's callback, so the inventory and the
baselines repository are found here the way a command would find them
(-i / $K26OPS_INVENTORY / the config file / the running lab; --baselines /
$K26OPS_BASELINES / the config file / the default). It never prints or fails.
"""

from __future__ import annotations

import re

from click.shell_completion import CompletionItem

from k26ops import config
from k26ops.cli.context import Settings, load_inventory

_LAST_TERM = re.compile(r"^(.*[,:])?([!&]?)([^,:]*)$", re.S)


def _inventory(ctx):
    params = {}
    for c in reversed(_chain(ctx)):  # the root's, then the command's own -i
        params.update({k: v for k, v in c.params.items() if v is not None})
    path = params.get("inventory") or params.get("global_inventory")
    settings = Settings(inventory=path or config.load().get("inventory"), lab_dir=params.get("lab_dir"))
    return load_inventory(settings.inventory_path())


def _chain(ctx) -> list:
    out = []
    while ctx is not None:
        out.append(ctx)
        ctx = ctx.parent
    return out


def host_patterns(ctx, param, incomplete: str) -> list[CompletionItem]:
    """The pattern's last term (after `,` or `:`, past `!`/`&`) completed to a host or group."""
    try:
        inv = _inventory(ctx)
    except Exception:  # no inventory yet, or a broken one: nothing to offer
        return []
    head, op, term = _LAST_TERM.match(incomplete).groups()
    names = sorted(set(inv.hosts) | {g for g in inv.groups if g != "all"}) + ["all"]
    return [CompletionItem(f"{head or ''}{op}{n}") for n in names if n.startswith(term)]


def baseline_tags(ctx, param, incomplete: str) -> list[CompletionItem]:
    # lazy: the baselines package (about 60 ms) only when completing a tag
    from k26ops.baselines import Baselines

    path = None
    for c in _chain(ctx):
        path = path or c.params.get("baselines_dir")
    try:
        return [CompletionItem(t) for t in Baselines(path).tag_names() if t.startswith(incomplete)]
    except Exception:
        return []
