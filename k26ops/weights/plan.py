"""Who fetches which shard from whom: the origin once per site, then host to host.

Per site, every shard comes from the origin (the Hub, an HTTP mirror, a path on a
host) exactly once; every other copy is taken from a host that already holds a
verified copy. A host asks `next(host)` for its next transfer:

1. a shard it lacks that some peer holds, rarest first, from the holder with the
   fewest uploads running (at most `max_uploads` each): each finished copy is one
   more source, so the copies spread as a tree (1, 2, 4, ... holders), and shards
   pipeline (a host serves shard 1 while it fetches shard 2);
2. else a shard no host holds and none is fetching from the origin: from the origin;
3. else it waits for a transfer to end (`WAIT`); `None` when it has every shard.

So the origin sends each byte once per site, and the control node sends none.
Pure bookkeeping under one lock (the transfers are the caller's).
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field

ORIGIN = "<origin>"
WAIT = "wait"


@dataclass
class Site:
    """One site's state: which host holds (a verified copy of) which shard."""

    sizes: dict[str, int]  # shard -> bytes
    need: dict[str, set[str]]  # host -> shards it lacks
    holders: dict[str, set[str]] = field(default_factory=dict)  # shard -> hosts holding it verified
    max_uploads: int = 2
    uploads: dict[str, int] = field(default_factory=dict)
    from_origin: set[str] = field(default_factory=set)  # shards being fetched from the origin now
    origin_bytes: int = 0
    peer_bytes: int = 0
    failed: set[str] = field(default_factory=set)

    def __post_init__(self):
        self._cond = threading.Condition()
        for s in self.sizes:
            self.holders.setdefault(s, set())

    def next(self, host: str, timeout: float | None = None):
        """(shard, source host or ORIGIN), WAIT (after `timeout` with nothing to do), or None (done)."""
        with self._cond:
            while True:
                pick = self._pick(host)
                if pick != WAIT:
                    return pick
                if not self._cond.wait(timeout):
                    return WAIT

    def _pick(self, host: str):
        lacking = self.need.get(host) or set()
        if not lacking:
            return None
        served = []
        for shard in lacking:
            peers = [
                h
                for h in self.holders[shard]
                if h != host and h not in self.failed and self.uploads.get(h, 0) < self.max_uploads
            ]
            if peers:
                src = min(peers, key=lambda h: (self.uploads.get(h, 0), h))
                served.append((len(self.holders[shard]), shard, src))
        if served:
            _n, shard, src = min(served)
            self.uploads[src] = self.uploads.get(src, 0) + 1
            return shard, src
        for shard in sorted(lacking):
            if not (self.holders[shard] - self.failed) and shard not in self.from_origin:
                self.from_origin.add(shard)
                return shard, ORIGIN
        return WAIT  # every shard it lacks is coming from the origin to another host, or its holders are busy

    def done(self, host: str, shard: str, source: str, ok: bool, fetched: int = 0) -> None:
        with self._cond:
            if source == ORIGIN:
                self.from_origin.discard(shard)
                self.origin_bytes += fetched
            else:
                self.uploads[source] -= 1
                self.peer_bytes += fetched
            if ok:
                self.holders[shard].add(host)
                self.need[host].discard(shard)
            self._cond.notify_all()

    def drop(self, host: str) -> None:
        """`host` failed: it serves no more, and wants nothing more."""
        with self._cond:
            self.failed.add(host)
            self.need[host] = set()
            self._cond.notify_all()
