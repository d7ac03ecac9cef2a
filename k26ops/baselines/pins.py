"""`k26ops baselines repin` and `baselines delete`: keep each host's
pinned-releases equal to what the tagged baselines still need.

Pins only exist so that prune keeps a release a baseline may roll back to.
Once a tag is gone, its release needs no pin unless another tag records it;
a pin nobody needs keeps several GB on the host forever. So the pins are not
edited one by one: `repin` recomputes each host's list from the tags that
remain (all of them, read from the repository) and rewrites the file
atomically. Deleting tags is a control-node change made first (it cannot be
half done on a host); its hosts are then repinned. A host that cannot be
reached keeps its old pins (more than needed, never fewer) until `repin`.

Release directories are not removed here: the next deploy's prune does that.
The host side is one playbook step (`baseline_pins`) run through the playbook
runner, so it takes the host lock and gets --check/--diff like a deploy.
`snapshot` adds its release through `pin_release`, under the same lock and
through the same writer (`write_pins`): the file has one writer.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from k26ops.baselines.repo import Baselines
from k26ops.errors import UserError
from k26ops.host.lock import HostLock
from k26ops.orchestrate import rollout
from k26ops.runstate import HostState
from k26ops.shell import q
from k26ops.steps import Change, HostContext, Step, text_diff


@dataclass
class NewPins(HostState):
    """The host's pins as the plan computed them; apply writes exactly these."""

    ids: list[str] = field(default_factory=list)


class BaselinePins(Step):
    """Rewrite pinned-releases as exactly the releases the baselines record for this host.
    Params: `pins`, {host name: [release ids the remaining tags record]}."""

    name = "baseline_pins"

    def plan(self, ctx: HostContext) -> list[Change]:
        want = self.params["pins"].get(ctx.host.name, [])
        path = ctx.pins_file
        old, have = read_pins(ctx)
        new = [r for r in have if r in want] + [r for r in want if r not in have]
        unpin = [r for r in have if r not in want]
        pin = [r for r in want if r not in have]
        NewPins(new).put(ctx)
        ctx.report.update(pins=new, unpinned=unpin, newly_pinned=pin)
        changes = [Change(f"unpin {r} (no remaining baseline records it)") for r in unpin] + [
            Change(f"pin {r} (a baseline records it)") for r in pin
        ]
        if changes:
            changes[0].diff = text_diff(path, old, "".join(f"{r}\n" for r in new))
        return changes

    def apply(self, ctx: HostContext, changes: list[Change]) -> None:
        write_pins(ctx, NewPins.of(ctx).ids)


def read_pins(ctx: HostContext) -> tuple[str | None, list[str]]:
    """(the file's text, None when there is none; its release ids in order)."""
    path = ctx.pins_file
    res = ctx.run(f"if test -f {q(path)}; then echo exists; cat -- {q(path)}; fi", check=True)
    mark, _, text = res.stdout.partition("\n")
    return (text if mark == "exists" else None), list(
        dict.fromkeys(ln.strip() for ln in text.splitlines() if ln.strip())
    )


def write_pins(ctx: HostContext, ids: list[str]) -> None:
    """The only writer of the pins file. Its callers hold the host lock, which
    lives in the same state dir (so that dir exists)."""
    data = "".join(f"{r}\n" for r in ids).encode()
    ctx.session.put(data, ctx.pins_file, 0o644)  # atomic (temp + rename), as root under become


def pin_release(session, release_id: str, purpose: str = "baselines snapshot") -> bool:
    """Add one release to the host's pins under the host lock; False when it was pinned already."""
    ctx = HostContext(session=session, host=session.host, vars=dict(session.host.vars), facts={})
    with HostLock(session, ctx.state_dir, purpose):
        _old, have = read_pins(ctx)
        if release_id in have:
            return False
        write_pins(ctx, have + [release_id])
        return True


def repin_hosts(hosts, options, pins: dict[str, list[str]], *, check: bool, log=lambda m: None):
    """Run `baseline_pins` on `hosts` (host lock, --check): the rollout (one result per
    host, and whether Ctrl-C ended it, also when no host was still queued)."""
    if not hosts:
        return rollout.Rollout()
    work = rollout.playbook_work([BaselinePins({"pins": pins})], check=check, purpose="baselines repin")
    return rollout.run(
        hosts,
        lambda session: work(session, lambda m: log(f"{session.host.name}: {m}")),
        options,
        on_event=lambda h, m: log(f"{h}: {m}"),
    )


def open_repo(baselines_dir) -> Baselines:
    """The baselines repository; refused when there is none."""
    repo = Baselines(baselines_dir)
    if not repo.exists():  # never read "no repository" as "no baseline needs anything"
        raise UserError(f"no baselines repository at {repo.path} (use --baselines DIR); nothing was changed")
    return repo


def _stale(results) -> dict[str, str]:
    return {r.host: f"{r.status}: {r.error}" for r in results if r.status not in ("ok", "changed")}


def repin(repo: Baselines, hosts, options, *, check: bool = False, log=lambda m: None) -> dict:
    """Rewrite `hosts`' pins from every tag in the repository."""
    run = repin_hosts(hosts, options, repo.releases_by_host(), check=check, log=log)
    return {
        "repo": str(repo.path),
        "check": check,
        "results": run.results,
        "stale_pins": _stale(run.results),
        "interrupted": bool(run.interrupted),
    }


def recorded_hosts(repo: Baselines, tags: list[str]) -> list[str]:
    """The hosts `tags` recorded (all must exist: an unknown tag is one line naming it, before any change)."""
    infos = [repo.tag(t) for t in dict.fromkeys(tags)]
    return list(dict.fromkeys(h for i in infos for h in ((i.index or {}).get("hosts") or {})))


def delete(
    repo: Baselines, tags: list[str], selected, options, *, limited: bool, check: bool = False, log=lambda m: None
) -> dict:
    """Delete `tags` (all must exist, else nothing changes), then repin the
    `selected` hosts they recorded. The deletion stands whatever the hosts do.
    `limited`: the selection was narrowed by --limit (named in the stale hosts' reason)."""
    tags = list(dict.fromkeys(tags))
    recorded = recorded_hosts(repo, tags)
    hosts = [h for h in selected if h.name in recorded]
    pins = repo.releases_by_host(without=set(tags))
    if not check:
        repo.delete_tags(tags)
    run = repin_hosts(hosts, options, pins, check=check, log=log)
    results = run.results
    stale = _stale(results)
    names = {h.name for h in selected}
    why = "not selected by --limit, or not in the inventory" if limited else "not in the inventory"
    stale.update({h: why for h in recorded if h not in names})
    return {
        "repo": str(repo.path),
        "check": check,
        "tags": tags,
        "results": results,
        "stale_pins": stale,
        "interrupted": bool(run.interrupted),
    }
