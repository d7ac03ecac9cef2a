"""Where a host gets a release's wheels, so that the control node's bytes do
not grow with the host count. Every wheel is named with its sha256 (the
release lock, or the wheelhouse manifest), so any source will do: a host
keeps only bytes whose hash is the one the control node expects.

`wheel_source` (inventory var):
- `push` (default): the control node uploads the wheels to each host over SSH.
- `index`: hosts that reach the package index (`wheel_index_url`, default
  PyPI) download the wheels themselves: `pip download --require-hashes
  --no-deps` with the release's pins and hashes. A wheel that is not on an
  index (the engine wheel built from the pinned commit) is still pushed.
- `peer`: the first host of each batch (the canary batch, then the rest)
  receives the wheels from the control node once and serves its wheelhouse
  over HTTP (`python3 -m http.server`, on `wheel_peer_address`, default the
  host's inventory address, port `wheel_peer_port`, default 8873), for as long
  as the batch runs. The other hosts fetch from it and check each wheel's
  sha256 before it enters their wheelhouse: a relay cannot change a byte; a
  changed wheel is refused and the host fails, naming the relay. A relay
  that cannot be reached falls back to the push.

The relay is a host like the others: nothing is written to it (no wheel, no
server) before its own run holds its host lock and found its `k26ops_root`
k26ops's to write (`admit`); a relay whose root is refused, that another run
holds, or that is unreachable receives no byte, and the others push. Its lock
is then kept until the batch ends (`stop`), so no other run takes the host
while it serves. A stalled relay fails fast: the fetch agent gives up after
READ_TIMEOUT seconds without data (or a trickle under MIN_BYTES per window),
and the host falls back to the push. The fetch agent dies with its SSH
channel, and Ctrl-C closes that channel at once (agents.run `tied`).
"""

from __future__ import annotations

import re
import threading
import time
from dataclasses import dataclass

from k26ops.errors import StepFailed, UserError
from k26ops.hostvars import Var, declare
from k26ops.interrupt import check as check_interrupted
from k26ops.layout import Layout
from k26ops.release import wheelhouse
from k26ops.shell import q, tied_to_channel
from k26ops.transport import agents

MODES = ("push", "index", "peer")
DEFAULT_MODE = "push"
DEFAULT_INDEX = "https://pypi.org/simple"
DEFAULT_PEER_PORT = 8873
declare(
    __name__,
    "where hosts get a release's wheels",
    Var(
        "wheel_source",
        "|".join(MODES),
        DEFAULT_MODE,
        "how hosts get a release's wheels: pushed by this node, from a relay host of the batch, or the index",
    ),
    Var("wheel_index_url", "url", DEFAULT_INDEX, "the package index hosts download from with wheel_source: index"),
    Var(
        "wheel_peer_address",
        "str",
        None,
        "address a relay host serves wheels on (wheel_source: peer)",
        "the host's address",
    ),
    Var("wheel_peer_port", "int", DEFAULT_PEER_PORT, "port a relay host serves wheels on (1024-65535)"),
)
RELAY_LIFETIME = 4 * 3600  # the relay's server exits by itself after this, whatever happens to the run
READ_TIMEOUT = 15.0  # seconds without a byte from the relay (connect, headers, any read): it is stalled
MIN_BYTES = 256 << 10  # fewer bytes than this in a READ_TIMEOUT window: a trickling relay, stalled too
ADMIT_WAIT = 300.0  # how long a host waits for the relay's own run to take its host lock
FETCH_TIMEOUT = 3600.0  # the whole fetch; a stalled relay ends it long before (READ_TIMEOUT)
_ADDRESS = re.compile(r"[A-Za-z0-9][A-Za-z0-9.:_-]*")
_URL = re.compile(r"https?://[^\s'\"\\]+")


@dataclass(frozen=True)
class Settings:
    mode: str
    index_url: str
    peer_address: str
    peer_port: int


def settings(host) -> Settings:
    """The host's wheel source from its vars; bad values are one line (exit 2)."""
    hv = host.vars
    mode = hv.get("wheel_source", DEFAULT_MODE)
    if mode not in MODES:
        raise UserError(f"host {host.name}: wheel_source {mode!r}: must be one of {', '.join(MODES)}")
    url = hv.get("wheel_index_url", DEFAULT_INDEX)
    if not isinstance(url, str) or not _URL.fullmatch(url):
        raise UserError(f"host {host.name}: wheel_index_url {url!r}: must be an http(s) URL")
    addr = hv.get("wheel_peer_address", host.address)
    if not isinstance(addr, str) or not _ADDRESS.fullmatch(addr or ""):
        raise UserError(f"host {host.name}: wheel_peer_address {addr!r}: must be an IP address or host name")
    port = hv.get("wheel_peer_port", DEFAULT_PEER_PORT)
    if not isinstance(port, int) or isinstance(port, bool) or not 1024 <= port <= 65535:
        raise UserError(f"host {host.name}: wheel_peer_port {port!r}: must be a port number 1024-65535")
    return Settings(mode, url, addr, port)


def deliver(ctx, wheels: list, remote_dir: str, local: tuple = ()) -> dict:
    """Put `wheels` into the host's `remote_dir` from the host's wheel source.
    `local`: the wheels no index has (built on the control node). Returns
    what came from where: {"pushed": [...], "index": [...], "peer": [...]}."""
    s = settings(ctx.host)
    batch = getattr(ctx.session, "relay", None)  # the rollout batch's relay, on the host's session
    got: dict = {"pushed": [], "index": [], "peer": []}
    if s.mode == "push" or (s.mode == "peer" and batch is None):
        got["pushed"] = _push(ctx, wheels, remote_dir)
        return _note(ctx, got)
    todo = wheelhouse.missing(ctx.session, wheels, remote_dir)
    if not todo:
        return got
    local_names = {w.name for w in local}
    if s.mode == "index":
        from_index = [w for w in todo if w.name not in local_names]
        if from_index:
            ctx.progress(f"downloading {len(from_index)} wheel(s) from {s.index_url} on the host")
            _download(ctx, from_index, remote_dir, s.index_url)
            got["index"] = [w.name for w in from_index]
        todo = [w for w in todo if w.name in local_names]
    elif s.mode == "peer" and batch is not None and batch.relay.name != ctx.host.name:
        url, why = batch.serve(todo)
        if url:
            ctx.progress(f"fetching {len(todo)} wheel(s) from relay {batch.relay.name}")
            refused, why = _fetch(ctx, todo, remote_dir, url)
            if refused:
                raise StepFailed(
                    f"wheel {refused[0]} from relay {batch.relay.name} ({url}) has sha256 "
                    f"{refused[1][:16]}..., the release expects {refused[2][:16]}...: refused "
                    "(the relay's copy is not the control node's)"
                )
            if not why:
                got["peer"] = [w.name for w in todo]
                return _note(ctx, got)
        ctx.progress(f"relay {batch.relay.name} unavailable ({why}): pushing the wheels")
    elif s.mode == "peer" and batch is not None:  # the relay itself: one push, shared with serve()
        batch.receive(todo)
        got["pushed"] = [w.name for w in todo]
        return _note(ctx, got)
    if todo:
        got["pushed"] = _push(ctx, todo, remote_dir)
    return _note(ctx, got)


def _push(ctx, wheels: list, remote_dir: str) -> list[str]:
    ctx.progress("pushing wheels")
    return wheelhouse.push(ctx.session, wheels, remote_dir)


def _note(ctx, got: dict) -> dict:
    """Where this host's wheels came from, in its report (`wheels` in --json)."""
    seen = ctx.report.setdefault("wheels", {})
    for how, names in got.items():
        if names:
            seen[how] = seen.get(how, 0) + len(names)
    return got


def _download(ctx, wheels: list, remote_dir: str, index_url: str) -> None:
    """`pip download --require-hashes` on the host: exactly these files, or nothing."""
    wheelhouse.need_free(ctx.session, remote_dir, sum(w.size for w in wheels), "the wheels to download")
    tool = f"{ctx.root}/pip-tool"  # a venv only for its pip (Debian's python3 has none)
    reqs = f"{remote_dir}/.index-requirements.txt"
    ctx.session.put(wheelhouse.requirements_file(wheels).encode(), reqs)
    ca = "/etc/ssl/certs/ca-certificates.crt"  # the host's own trust store (pip's bundled one knows no private CA)
    script = (
        f"set -e; [ -x {q(tool)}/bin/pip ] || python3 -m venv {q(tool)}; "
        f"cert=; [ -f {ca} ] && cert='--cert {ca}'; "
        f"{q(tool)}/bin/pip download -q --disable-pip-version-check --no-deps --only-binary=:all: "
        f"--require-hashes --index-url {q(index_url)} $cert -d {q(remote_dir)} -r {q(reqs)}"
    )
    res = ctx.run(tied_to_channel(script), timeout=3600)
    if not res.ok:
        lines = [x for x in (res.stderr.replace("\0", "") + "\n" + res.stdout).splitlines() if x.strip()]
        err = [x for x in lines if x.startswith("ERROR")] or lines or ["no output"]
        raise StepFailed(f"pip download from {index_url} on the host failed: {err[-1][:300]}")
    left = wheelhouse.missing(ctx.session, wheels, remote_dir)
    if left:
        raise StepFailed(f"pip download from {index_url} did not give {left[0].name} with sha256 {left[0].sha256}")


def _fetch(ctx, wheels: list, remote_dir: str, url: str) -> tuple[tuple | None, str]:
    """(refused: (name, got, expected) or None, why the relay could not be used or '').
    The host fetches and checks each sha256 itself (agents/wheelfetch.py)."""
    wheelhouse.need_free(ctx.session, remote_dir, sum(w.size for w in wheels), "the wheels to fetch")
    try:
        res = agents.run(
            ctx.session,
            "wheelfetch",
            "fetch",
            FETCH_TIMEOUT,
            what="wheel fetch agent",
            tied=True,
            base=url,
            dest=remote_dir,
            wheels=[[w.name, w.sha256] for w in wheels],
            read_timeout=READ_TIMEOUT,
            min_bytes=MIN_BYTES,
        )
    except agents.AgentFailed as exc:
        return None, str(exc)
    if res.get("refused"):
        return tuple(res["refused"]), ""
    return None, res.get("unreachable") or ""


class Batch:
    """One batch's relay: its first host. The control node pushes each wheel
    set to the relay once (under a lock, so the relay's own step and the other
    hosts never upload twice), starts its HTTP server on first need and stops
    it when the batch ends. Nothing goes to the relay before its own run
    admitted it (holds its host lock, owns its root)."""

    def __init__(self, hosts: list, session_for):
        self.relay = hosts[0]
        self._session_for = session_for
        self._lock = threading.Lock()
        self._admitted = threading.Event()  # the relay's run holds its host lock; its root is k26ops's
        self._ended = threading.Event()  # the relay's run ended
        self._relay_lock = None  # that host lock, kept until stop() while other hosts may fetch
        self._not_admitted = ""  # why the relay's run ended without admitting it
        self._peers = any(_is_peer(h) for h in hosts[1:])
        self._stopped = False
        self._kept = False  # the relay's run ended and left its lock to stop()
        self._received: set[str] = set()  # wheel sha256s on the relay
        self._server: threading.Thread | None = None
        self._server_error = ""
        self.url = ""
        self.dir = Layout.of(self.relay.vars).wheelhouse_dir

    def receive(self, wheels: list) -> None:
        with self._lock:
            self._receive(wheels)

    def _receive(self, wheels: list) -> None:
        todo = [w for w in wheels if w.sha256 not in self._received]
        if todo:
            session = self._session_for(self.relay)
            wheelhouse.push(session, todo, self.dir)
            self._received.update(w.sha256 for w in todo)

    def admit(self, host, lock) -> None:
        """`host`'s run holds `lock` and k26ops owns its root: if it is the relay, the
        batch may write to it from now on."""
        if host.name == self.relay.name and lock is not None:
            self._relay_lock = lock
            self._admitted.set()

    def keeps(self, host, lock) -> bool:
        """At the end of `host`'s run: does the batch keep its lock (released by stop())?
        Yes for an admitted relay that other hosts may still fetch from, until stop()."""
        with self._lock:
            self._kept = self._peers and not self._stopped and lock is not None and lock is self._relay_lock
            return self._kept

    def ended(self, host: str, why: str) -> None:
        """`host`'s run ended (`why`: its status and error)."""
        if host == self.relay.name:
            if not self._admitted.is_set():
                self._not_admitted = why
            self._ended.set()

    def _wait_admitted(self) -> str:
        """'' once the relay may be written to; else why not (its run refused or
        failed before taking its lock, or did not take it within ADMIT_WAIT)."""
        deadline = time.monotonic() + ADMIT_WAIT
        while not self._admitted.wait(0.2):
            check_interrupted("the wait for the wheel relay")
            if self._ended.is_set():
                return f"its own run ended before it took its host lock: {self._not_admitted or 'not started'}"
            if time.monotonic() > deadline:
                return f"its own run did not take its host lock within {ADMIT_WAIT:.0f}s"
        return ""

    def serve(self, wheels: list) -> tuple[str, str]:
        """(url of the relay's wheelhouse, '') once it has `wheels` and answers; ('', why) if it cannot."""
        why = self._wait_admitted()
        if why:
            return "", why
        with self._lock:
            try:
                self._receive(wheels)
                if self._server is None:
                    self._start()
            except Exception as exc:  # the relay is down or refuses: the others fall back to the push
                self._server_error = self._server_error or f"{type(exc).__name__}: {exc}"
            return (self.url, "") if self.url and not self._server_error else ("", self._server_error)

    def _start(self) -> None:
        session = self._session_for(self.relay)
        s = settings(self.relay)
        addr, port = s.peer_address, s.peer_port
        pid = f"{self.dir}/.relay.pid"
        script = (
            f"echo $$ > {q(pid)}; exec timeout {RELAY_LIFETIME} python3 -m http.server {port} "
            f"--bind {q(addr)} --directory {q(self.dir)}"
        )

        def run():
            try:
                res = session.run(tied_to_channel(script), timeout=RELAY_LIFETIME + 60)
                if not res.ok and not self.url:
                    err = [x for x in res.stderr.replace("\0", "").splitlines() if x.strip()]
                    self._server_error = err[-1] if err else f"exit {res.exited}"
            except Exception as exc:
                self._server_error = self._server_error or str(exc)

        self._server = threading.Thread(target=run, daemon=True, name="k26ops-wheel-relay")
        self._server.start()
        host = f"[{addr}]" if ":" in addr else addr
        deadline = time.monotonic() + 15
        while time.monotonic() < deadline and not self._server_error:
            if _answers(session, addr, port):
                self.url = f"http://{host}:{port}"
                return
            time.sleep(0.3)
        self._server_error = self._server_error or f"{addr}:{port} did not answer within 15s"

    def stop(self) -> None:
        """Stop the relay's server (the batch is done), then let go of the relay's host
        lock if its run left it to us (a run still restoring after Ctrl-C lets go itself)."""
        with self._lock:
            self._stopped = True
            try:
                self._stop_server()
            finally:
                if self._kept:
                    self._relay_lock.release()
                self._relay_lock = None

    def _stop_server(self) -> None:
        if self._server is None:
            return
        try:
            self._session_for(self.relay).run(
                f'p=$(cat {q(self.dir)}/.relay.pid 2>/dev/null) && kill "$p" 2>/dev/null; '
                f"rm -f {q(self.dir)}/.relay.pid",
                timeout=30,
            )
        except Exception:
            pass  # the connection is gone: so is the server (tied to its channel)
        self._server.join(timeout=10)
        self._server = None


def _is_peer(host) -> bool:
    try:
        return settings(host).mode == "peer"
    except UserError:
        return False


def admit(session, lock) -> None:
    """playbook.run_on_host: the session's host is locked by this run and its root is k26ops's."""
    batch = getattr(session, "relay", None)
    if batch is not None:
        batch.admit(session.host, lock)


def keeps(session, lock) -> bool:
    """playbook.run_on_host's end: True when the batch keeps `lock` for its relay."""
    batch = getattr(session, "relay", None)
    return batch is not None and batch.keeps(session.host, lock)


def _answers(session, addr: str, port: int) -> bool:
    """Does the relay's server accept a connection, seen from the relay itself?"""
    try:
        return bool(
            agents.run(session, "wheelfetch", "connect", 30, what="wheel fetch agent", address=addr, port=port, wait=2)[
                "ok"
            ]
        )
    except agents.AgentFailed:
        return False
