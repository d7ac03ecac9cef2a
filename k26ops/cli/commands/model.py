"""`k26ops model manifest|verify|sync`: the weights as part of the release
(docs/how-to/weights-sync.md)."""

from __future__ import annotations

import os
import sys
import tempfile
from pathlib import Path

import click
from rich.console import Console

from k26ops.cli import jsonout
from k26ops.cli.report import print_results, run_and_report
from k26ops.errors import EXIT_INTERRUPTED, StepFailed, UserError
from k26ops.transport import agents
from k26ops.transport.fleet import Connections, FleetInterrupted, Outcome, exit_code
from k26ops.weights import hostops
from k26ops.weights import manifest as mf


@click.group(name="model")
def group():
    """The model's weights: make the manifest, verify hosts against it, sync them."""


def _write(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    with os.fdopen(fd, "w") as f:
        f.write(text)
    os.chmod(tmp, 0o644)
    os.replace(tmp, path)


@group.command(name="manifest")
@click.argument("source")
@click.option(
    "-o",
    "--output",
    type=click.Path(dir_okay=False, path_type=Path),
    help="Write the manifest here (beside the recipe, like its lock); default: stdout.",
)
@click.pass_obj
def manifest_cmd(settings, source, output):
    """Make the manifest (sha256, size, path of every file) of SOURCE: hf://ORG/REPO@REVISION
    (the Hub's LFS hashes, token from $HF_TOKEN), a directory here, or HOST:/PATH (a reference
    copy on an inventory host, hashed there)."""
    if source.startswith("hf://"):
        m = mf.from_hub(mf.hub_spec(source), os.environ.get("HF_TOKEN") or None)
    elif Path(source).is_dir():
        m = mf.from_dir(source)
    elif ":" in source and not source.startswith("/"):
        name, _, path = source.partition(":")
        inv, hosts = settings.select(name)
        host = next((h for h in hosts if h.name == name), None)
        if host is None or not path.startswith("/"):
            raise UserError(f"{source!r}: want HOST:/ABSOLUTE/PATH with HOST in {inv.path}")
        with Connections(settings.fleet_options()) as conns:
            res = agents.run(
                conns.session(host),
                "weights",
                "manifest",
                hostops.VERIFY_TIMEOUT,
                what="model manifest",
                tied=True,
                path=path,
            )
        if res.get("error"):
            raise UserError(f"{name}: {res['error']}")
        for rel, _n, _h in res["entries"]:
            if mf.path_problem(rel):
                raise UserError(f"{source}/{rel}: {mf.path_problem(rel)}")
        m = mf.make((mf.Entry(r, n, h) for r, n, h in res["entries"]), f"host:{source}")
    else:
        raise UserError(f"{source!r}: not hf://ORG/REPO@REVISION, a directory, or HOST:/PATH")
    if output:
        _write(output, m.text())
    elif not settings.as_json:
        click.echo(m.text(), nl=False)
    summary = {
        "source": m.source,
        "files": len(m.entries),
        "bytes": m.total,
        "sha256": m.sha256,
        "output": str(output) if output else None,
    }
    if settings.as_json:
        jsonout.emit({**summary, "entries": [[e.path, e.size, e.sha256] for e in m.entries]})
        return
    click.echo(
        f"{len(m.entries)} files, {m.total / 1e9:.3f} GB, manifest {m.sha256[:12]}"
        + (f", written to {output}" if output else ""),
        err=True,
    )


def _manifest_for(hosts, manifest):
    wants = {h.name: hostops.wanted(h.vars, manifest) for h in hosts}
    loaded: dict[Path, mf.Manifest] = {}
    for w in wants.values():
        if w.manifest_path not in loaded:
            loaded[w.manifest_path] = mf.load(w.manifest_path)
    return wants, loaded


@group.command(name="verify")
@click.option(
    "--full", is_flag=True, help="Also sha256 every file the host's record does not vouch for, on all its cores."
)
@click.option("--force", is_flag=True, help="With --full: hash every file, even those the record vouches for.")
@click.option(
    "--manifest",
    type=click.Path(dir_okay=False, path_type=Path),
    help="Compare with this manifest (default: the recipe's model.manifest).",
)
@click.pass_obj
def verify_cmd(settings, full, force, manifest):
    """Each host's model against the manifest: sizes and the file set (fast, reads no byte);
    with --full the sha256 of every file, with the hash rate beside a plain read's."""
    wants, loaded = _manifest_for(settings.selected_hosts(), manifest)

    def work(session):
        w = wants[session.host.name]
        m = loaded[w.manifest_path]
        fast = hostops.fast(session, w, m)
        if fast["problems"]:
            raise StepFailed(f"{w.model_path}: " + "; ".join(fast["problems"]))
        out = Outcome(
            manifest=m.sha256[:12],
            files=len(m.entries),
            gb=round(m.total / 1e9, 3),
            changed_files=len(fast["changed"]),
            last_full=((fast["record"] or {}).get("last_full") or {}).get("at"),
        )
        if full or force:
            res = hostops.full(session, w, m, force=force)
            if res["bad"]:
                raise StepFailed(f"{w.model_path}: " + "; ".join(f"{rel}: {why}" for rel, why in res["bad"]))
            out.update(
                hashed=res["hashed"],
                verify_gbps=res["verify_gbps"],
                read_gbps=res["read_gbps"],
                workers=res["workers"],
                last_full=(res.get("last_full") or {}).get("at"),
                changed_files=0,
            )
        elif fast["changed"] and fast["record"]:
            out["note"] = f"{len(fast['changed'])} file(s) changed since their last sha256 check: run --full"
        return out

    cols = [
        ("manifest", "manifest"),
        ("files", "files"),
        ("GB", "gb"),
        ("changed", "changed_files"),
        ("last full verify", "last_full"),
    ]
    if full or force:
        cols += [("hashed", "hashed"), ("verify GB/s", "verify_gbps"), ("read GB/s", "read_gbps")]
    run_and_report(settings, work, title="model verify", columns=cols)


@group.command(name="sync")
@click.option(
    "--origin",
    metavar="SOURCE",
    help="Where the site's one download comes from: hf://ORG/REPO@REVISION, https://MIRROR/DIR "
    "or HOST:/PATH (default: the recipe's model.source).",
)
@click.option(
    "--manifest",
    type=click.Path(dir_okay=False, path_type=Path),
    help="Sync this manifest's files (default: the recipe's model.manifest).",
)
@click.option("--bwlimit", type=click.FloatRange(0.001), metavar="MB/S", help="Limit each transfer to this many MB/s.")
@click.option(
    "--max-uploads", type=click.IntRange(1, 64), default=2, show_default=True, help="Transfers one host serves at once."
)
@click.pass_obj
def sync_cmd(settings, origin, manifest, bwlimit, max_uploads):
    """Get the manifest's files onto the selected hosts: one origin download per site, then
    host to host over the hosts' SSH (rsync), each shard sha256-checked before it is renamed
    into place. Resumable; verified shards are never fetched again; nothing is deleted."""
    from k26ops.weights import sync as sync_mod  # lazy: only this command plans transfers

    inv, hosts = settings.select(settings.limit)
    if not hosts:
        raise UserError(f"{inv.path}: no hosts selected")
    wants, loaded = _manifest_for(hosts, manifest)
    if len(loaded) != 1:
        raise UserError("the selected hosts' recipes name different model manifests: sync one recipe's hosts at a time")
    m = next(iter(loaded.values()))
    origin = origin or next(iter(wants.values())).source
    err = Console(stderr=True)
    opts = sync_mod.SyncOptions(
        origin=origin,
        bwlimit_kbps=int(bwlimit * 1000) if bwlimit else 0,
        max_uploads=max_uploads,
        token=os.environ.get("HF_TOKEN") or None,
        progress=None if settings.as_json else (lambda h, msg: err.print(f"[dim]{h}: {msg}[/dim]")),
    )
    all_hosts = {h.name: h for h in inv.select(None)}
    try:
        results, totals = sync_mod.sync(hosts, settings.fleet_options(), m, wants, opts, all_hosts)
    except FleetInterrupted as exc:
        print_results(settings, exc.results, "model sync", [], code=EXIT_INTERRUPTED)
        click.echo(f"k26ops: {exc}", err=True)
        sys.exit(EXIT_INTERRUPTED)
    code = exit_code(results)
    _decorate(results)
    print_results(
        settings,
        results,
        "model sync",
        [("fetched", "fetched"), ("MB", "mb"), ("GB/s", "gbps"), ("from", "from")],
        code=code,
        extra=totals,
    )
    if not settings.as_json:
        click.echo(
            f"origin sent {totals['bytes_from_origin'] / 1e6:.1f} MB, hosts sent each other "
            f"{totals['bytes_between_hosts'] / 1e6:.1f} MB, this node 0 MB; {totals['wall_s']:.1f} s",
            err=True,
        )
    sys.exit(code)


def _decorate(results) -> None:
    """The table's cells of each host's sync result."""
    for r in results:
        if r.data.get("fetched_bytes") is not None:
            r.data["mb"] = round(r.data["fetched_bytes"] / 1e6, 1)
        src = r.data.get("sources") or {}
        r.data["from"] = ", ".join(f"{k} x{v}" for k, v in sorted(src.items())) or ("-" if r.data else None)
