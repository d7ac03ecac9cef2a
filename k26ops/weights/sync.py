"""`k26ops model sync`: the manifest's files onto the selected hosts, one origin download
per site, then host to host (k26ops/weights/plan.py), with rsync over the hosts' SSH.

Phases, each over the fleet with one connection per host kept for the run:
1. look: each host hashes what it has that its record does not vouch for (a copy made
   by hand is verified, not fetched again), and says its free space, partial files,
   and any wrong file k26ops did not write (refused: sync never deletes or overwrites
   a file it did not write); it makes this run's SSH keys (their private halves never
   leave the host). A host short of disk space is refused before any byte moves.
2. authorize: each host that may serve (every host of the site, and a HOST:/PATH origin)
   lets the other hosts' keys in for this run only: `restrict`, `expiry-time` (the run's
   deadline), and a forced read-only `rrsync -ro MODEL_DIR`: a key reads that one
   directory and nothing else (no shell, no forwarding, no write).
3. transfer: each host takes its missing shards (plan.Site.next), one rsync per shard
   into its partial dir, resumed where a cut left it, sha256-checked, renamed into place;
   the peer's host key is the one this node verified for that host (its known_hosts),
   given to the fetcher's ssh with StrictHostKeyChecking=yes: nothing is trusted on first use.
4. always, even after Ctrl-C or a failure: the keys are removed from every
   authorized_keys and the private keys deleted.
"""

from __future__ import annotations

import os
import threading
import time
import urllib.parse
from dataclasses import dataclass, field

from k26ops.errors import StepFailed, UserError
from k26ops.hostvars import Var, declare
from k26ops.interrupt import check as check_interrupted
from k26ops.transport import agents
from k26ops.transport.fleet import Connections, Fleet, FleetInterrupted, Outcome, exit_code
from k26ops.weights import hostops
from k26ops.weights import manifest as mf
from k26ops.weights.plan import ORIGIN, WAIT, Site

declare(
    __name__,
    "model weights sync (k26ops model sync)",
    Var("model_site", "str", "default", "hosts of one site share one origin download of the model"),
    Var(
        "model_peer_address",
        "str",
        None,
        "address other hosts of the site reach this host's sshd on",
        "the address this node connects to",
    ),
)
DISK_MARGIN = 1 << 30  # free space kept beyond the shards a host still needs
HUB_ENDPOINT = "https://huggingface.co"


@dataclass
class SyncOptions:
    origin: str | None = None
    bwlimit_kbps: int = 0
    max_uploads: int = 2
    token: str | None = None  # the Hub's token (HF_TOKEN), passed on stdin, never in argv
    progress: object = None  # (host, message) -> None
    report: dict = field(default_factory=dict)


def origin_url(origin: str, rel: str) -> str:
    """The HTTP(S) URL of one file of an hf:// or http(s):// origin."""
    if origin.startswith("hf://"):
        spec = mf.hub_spec(origin)
        base = os.environ.get("HF_ENDPOINT", HUB_ENDPOINT).rstrip("/")
        return f"{base}/{spec.repo_id}/resolve/{spec.revision}/{urllib.parse.quote(rel)}"
    return origin.rstrip("/") + "/" + urllib.parse.quote(rel)


def split_host_path(origin: str) -> tuple[str, str] | None:
    """`HOST:/PATH` -> (HOST, /PATH); None for a URL."""
    if "://" in origin or ":" not in origin:
        return None
    host, _, path = origin.partition(":")
    if not path.startswith("/"):
        raise UserError(f"origin {origin!r}: want HOST:/ABSOLUTE/PATH, hf://ORG/REPO@REVISION or an http(s) URL")
    return host, path


def endpoint(session) -> dict:
    """How another host reaches `session`'s host by SSH, with the host key this node verified."""
    conn = session.conn
    key = conn.client.get_transport().get_remote_server_key()
    addr = session.host.vars.get("model_peer_address") or conn.host
    port = int(conn.port or 22)
    name = addr if port == 22 else f"[{addr}]:{port}"
    return {
        "kind": "peer",
        "address": addr,
        "port": port,
        "user": conn.user or "root",
        "host_keys": [f"{name} {key.get_name()} {key.get_base64()}"],
    }


def _say(opts: SyncOptions, host: str, msg: str) -> None:
    if opts.progress:
        opts.progress(host, msg)


def sync(
    hosts: list, fleet_options, m: mf.Manifest, wants: dict, opts: SyncOptions, inventory_hosts: dict | None = None
) -> tuple[list, dict]:
    """Run the sync; (per-host results, totals). `wants`: host name -> hostops.Wanted."""
    origin = opts.origin
    if not origin:
        raise UserError(
            "no origin: the recipe's model.source is not set; pass --origin "
            "(hf://ORG/REPO@REVISION, https://MIRROR/PATH or HOST:/PATH)"
        )
    hp = split_host_path(origin)
    if origin.startswith("hf://"):
        mf.hub_spec(origin)
    origin_host = None
    if hp:
        origin_host = (inventory_hosts or {}).get(hp[0])
        if origin_host is None:
            raise UserError(
                f"origin {origin!r}: {hp[0]} is not a host of the inventory (a path on a host "
                "is read over that host's SSH, with the host key this node knows)"
            )
    conns = Connections(fleet_options)
    run_id = f"k26ops-model-sync-{os.getpid()}-{int(time.time())}"
    looked: dict[str, dict] = {}
    t_start = time.monotonic()
    try:
        # 1. look (and verify what the record does not vouch for), make this run's keys
        def look(session):
            w = wants[session.host.name]
            ver = hostops.full(session, w, m)
            for rel, why in ver["bad"]:
                if not why.startswith("missing"):
                    _say(opts, session.host.name, f"{rel}: {why}")
            prep = hostops.prepare(session, w, m)
            if not prep["rsync"]:
                raise StepFailed("rsync is not installed on this host (apt-get install rsync)")
            if prep["foreign"]:
                rel, size = prep["foreign"][0]
                e = m.by_path()[rel]
                raise StepFailed(
                    f"{w.model_path}/{rel} ({size} bytes) is not the manifest's ({e.size} bytes, sha256 "
                    f"{e.sha256[:12]}) and k26ops did not write it: sync never replaces a file it did not "
                    "write; move it away, then sync again"
                )
            have = set(prep["have"])
            need = [e for e in m.entries if e.path not in have]
            want_bytes = sum(e.size - prep["partial"].get(e.path, 0) for e in need)
            if want_bytes + DISK_MARGIN > prep["free"]:
                raise StepFailed(
                    f"{w.model_path}: {prep['free'] / 1e9:.1f} GB free, the {len(need)} missing file(s) "
                    f"need {want_bytes / 1e9:.1f} GB (+{DISK_MARGIN >> 30} GiB margin): nothing fetched"
                )
            d = hostops.sync_dir(session.host.vars)
            keys = {
                role: agents.run(session, "weights", "keygen", 60, what="model sync (keygen)", dir=f"{d}/{role}")["pub"]
                for role in ("peer", "origin")
            }
            looked[session.host.name] = {
                "need": {e.path for e in need},
                "keys": keys,
                "dir": d,
                "endpoint": endpoint(session),
                "have": len(have),
            }
            return Outcome(have=len(have), need=len(need), need_bytes=want_bytes)

        looks = {r.host: r for r in Fleet(hosts, fleet_options, connections=conns).run(look)}
        ready = [h for h in hosts if h.name in looked]
        # 2. authorize: every ready host serves its model dir to the others; the origin host its path
        sites: dict[str, list] = {}
        for h in ready:
            sites.setdefault(str(h.vars.get("model_site") or "default"), []).append(h)
        ttl = int(fleet_options.deadline) + 600  # the keys stop working by themselves after the run's deadline
        auth_targets = {}
        for site_hosts in sites.values():
            for h in site_hosts:
                others = [looked[o.name]["keys"]["peer"] for o in site_hosts if o.name != h.name]
                if others:
                    auth_targets.setdefault(h.name, []).append((others, wants[h.name].model_path))
        if origin_host is not None:
            auth_targets.setdefault(origin_host.name, []).append(
                ([looked[h.name]["keys"]["origin"] for h in ready], hp[1])
            )
        all_by_name = {h.name: h for h in hosts} | ({origin_host.name: origin_host} if origin_host else {})

        def authorize(session):
            for keys, d in auth_targets.get(session.host.name, []):
                res = agents.run(
                    session,
                    "weights",
                    "authorize",
                    60,
                    what="model sync (authorize)",
                    keys=keys,
                    dir=d,
                    marker=run_id,
                    ttl_s=ttl,
                )
                if not res.get("ok"):
                    raise StepFailed(res["why"])
            return Outcome()

        auth_hosts = [all_by_name[n] for n in auth_targets]
        auths = {r.host: r for r in Fleet(auth_hosts, fleet_options, connections=conns).run(authorize)}
        origin_src = None
        if origin_host is not None:
            if auths.get(origin_host.name) and auths[origin_host.name].status not in ("ok", "changed"):
                raise UserError(f"origin host {origin_host.name}: {auths[origin_host.name].error}")
            origin_src = endpoint(conns.session(origin_host))
        # 3. transfer
        plans = {}
        for site, site_hosts in sites.items():
            ok_hosts = [h for h in site_hosts if auths.get(h.name) is None or auths[h.name].status in ("ok", "changed")]
            plans[site] = Site(
                {e.path: e.size for e in m.entries},
                {h.name: set(looked[h.name]["need"]) for h in ok_hosts},
                max_uploads=opts.max_uploads,
            )
            for h in ok_hosts:
                for e in m.entries:
                    if e.path not in looked[h.name]["need"]:
                        plans[site].holders[e.path].add(h.name)
        site_of = {h.name: s for s, hs in sites.items() for h in hs}
        by_path = m.by_path()

        def transfer(session):
            name = session.host.name
            if name not in looked:
                raise StepFailed(looks[name].error or "not looked at")
            if auths.get(name) is not None and auths[name].status not in ("ok", "changed"):
                raise StepFailed(auths[name].error or "could not serve its peers")
            site = plans[site_of[name]]
            w, got, secs, srcs, t0 = wants[name], 0, 0.0, {}, time.monotonic()
            try:
                while True:
                    check_interrupted("the model sync")
                    pick = site.next(name, timeout=1.0)
                    if pick is None:
                        break
                    if pick == WAIT:
                        continue
                    rel, src = pick
                    e = by_path[rel]
                    if src == ORIGIN:
                        if origin_src is not None:
                            source = {"kind": "local", "path": hp[1]} if origin_host.name == name else origin_src
                            key = f"{looked[name]['dir']}/origin/id_ed25519"
                        else:
                            source, key = {"kind": "http", "url": origin_url(origin, rel)}, None
                        label = "origin"
                    else:
                        source, key = dict(looked[src]["endpoint"]), f"{looked[name]['dir']}/peer/id_ed25519"
                        label = src
                    try:
                        res = hostops.fetch(
                            session,
                            w,
                            e,
                            source,
                            key,
                            opts.bwlimit_kbps,
                            opts.token if source.get("kind") == "http" and origin.startswith("hf://") else None,
                        )
                    except BaseException:
                        site.done(name, rel, src, False)
                        raise
                    site.done(name, rel, src, True, res["bytes"])
                    got += res["bytes"]
                    secs += res["seconds"]
                    srcs[label] = srcs.get(label, 0) + 1
                    gbps = res["bytes"] / res["seconds"] / 1e9 if res["seconds"] > 0 else 0.0
                    _say(
                        opts,
                        name,
                        f"{rel} from {label}: {res['bytes'] / 1e6:.1f} MB in {res['seconds']:.2f} s "
                        f"({gbps:.2f} GB/s)"
                        + (f", resumed at {res['resumed'] / 1e6:.1f} MB" if res["resumed"] else ""),
                    )
            except BaseException:
                site.drop(name)
                raise
            wall = time.monotonic() - t0
            return Outcome(
                changed=bool(srcs),
                fetched=sum(srcs.values()),
                fetched_bytes=got,
                sources=srcs,
                gbps=round(got / wall / 1e9, 3) if got and wall > 0 else None,
                have=looked[name]["have"],
            )

        results = Fleet(hosts, fleet_options, connections=conns).run(transfer)
        for r in results:  # a host refused in phase 1 or 2 reports why there
            if r.host in looks and looks[r.host].status not in ("ok", "changed"):
                r.error = looks[r.host].error
                r.status = looks[r.host].status
        totals = {
            "bytes_from_origin": sum(p.origin_bytes for p in plans.values()),
            "bytes_between_hosts": sum(p.peer_bytes for p in plans.values()),
            "bytes_through_control_node": 0,
            "wall_s": round(time.monotonic() - t_start, 3),
            "manifest": m.sha256,
            "sites": len(plans),
        }
        return results, totals
    finally:
        conns.close()
        _cleanup(fleet_options, hosts + ([origin_host] if origin_host else []), looked, run_id)


def _cleanup(fleet_options, hosts: list, looked: dict, run_id: str) -> None:
    """Remove this run's keys everywhere, over fresh connections (after Ctrl-C too: the fleet
    closed the run's, and the interrupt flag is not looked at here)."""
    conns = Connections(fleet_options)

    def one(h):
        try:
            s = conns.session(h)
            agents.run(s, "weights", "deauthorize", 60, what="model sync (cleanup)", marker=run_id)
            if h.name in looked:
                agents.run(s, "weights", "forget", 60, what="model sync (cleanup)", dir=looked[h.name]["dir"])
        except Exception:  # the keys expire by themselves (expiry-time) where a host is gone
            pass

    seen, threads = set(), []
    for h in hosts:
        if h.name not in seen:
            seen.add(h.name)
            threads.append(threading.Thread(target=one, args=(h,), daemon=True))
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    conns.close()


__all__ = ["sync", "SyncOptions", "origin_url", "split_host_path", "exit_code", "FleetInterrupted"]
