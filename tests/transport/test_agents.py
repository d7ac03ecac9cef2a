"""The host agents (k26ops/agents/), run on this machine as a host runs them:
the command agents.command builds, through agents.run and a real local
session, on real local inputs (directories, an HTTP server, commands). Their
pure parts are unit-tested by loading the files (they are not importable
modules on a host). No lab: what needs systemd skips where it is absent.
"""

import ast
import hashlib
import http.server
import importlib.util
import json
import os
import re
import shutil
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path
from types import SimpleNamespace

import pytest

from k26ops import shell
from k26ops.host import ownership
from k26ops.inventory import Host
from k26ops.release import wheelsource
from k26ops.transport import agents, ssh
from k26ops.transport.ssh import LocalSession
from labtools.source import parsed

ROOT = Path(__file__).resolve().parent.parents[1]
AGENTS = sorted(p for p in agents.DIR.glob("*.py") if p.name != "__init__.py")
NAMES = [p.stem for p in AGENTS]


def load(name):
    """Import agents/<name>.py by path (its `__main__` part does not run)."""
    spec = importlib.util.spec_from_file_location(f"k26ops_agent_{name}", agents.DIR / f"{name}.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.fixture
def host(tmp_path, monkeypatch):
    """A local session run from an empty directory with no PYTHONPATH: the agent
    has only the standard library, as on a host."""
    cwd = tmp_path / "cwd"
    cwd.mkdir()
    monkeypatch.chdir(cwd)
    monkeypatch.delenv("PYTHONPATH", raising=False)
    # a tied agent's watchdog (shell.tied_to_channel) probes every 0.1 s, not 1 s: the
    # same shell code, a finished agent returns at once and a dropped one dies sooner
    monkeypatch.setattr(shell, "WATCHDOG_PERIOD", 0.1)
    monkeypatch.setattr(shell, "WATCHDOG_GRACE", 0.3)
    return LocalSession(Host(name="local", address="127.0.0.1", connection="local"))


def call(session, name, op, **req):
    return agents.run(session, name, op, 60, interpreter=sys.executable, **req)


# --- every agent: the oldest host Python's grammar, standard library only, runs standalone


def imported(tree) -> set[str]:
    names = set()
    for n in ast.walk(tree):
        if isinstance(n, ast.Import):
            names.update(a.name.split(".")[0] for a in n.names)
        elif isinstance(n, ast.ImportFrom):
            assert n.level == 0, "an agent is sent alone: no relative import"
            names.add(n.module.split(".")[0])
    return names


@pytest.mark.parametrize("name", NAMES)
def test_agent_is_oldest_python_and_stdlib_only(name):
    src = agents.source(name)
    tree = ast.parse(src, feature_version=agents.OLDEST_PYTHON)
    foreign = imported(tree) - set(sys.stdlib_module_names) - {"__future__"}
    assert not foreign, f"agents/{name}.py imports {sorted(foreign)}: a host has only the standard library"
    main = [n for n in tree.body if isinstance(n, ast.If) and "__main__" in ast.unparse(n.test)]
    assert main, f"agents/{name}.py: the request is read under `if __name__ == '__main__'` (tests import it)"
    assert ast.get_docstring(tree), f"agents/{name}.py says what it is for"


def test_oldest_python_is_the_documented_one():
    import k26ops.agents  # the host agents' package: its docstring says what Python they may use

    doc = k26ops.agents.__doc__
    ver = "%d.%d" % agents.OLDEST_PYTHON
    assert f"{ver} or newer" in doc and f"Python {ver} or newer" in (ROOT / "README.md").read_text()


def test_an_agent_that_breaks_is_a_clear_error(host):
    with pytest.raises(agents.AgentFailed, match=r"ownership agent \(nope\) exited 1: KeyError: 'op_nope'"):
        agents.run(host, "ownership", "nope", 30, interpreter=sys.executable)
    with pytest.raises(agents.AgentFailed, match="exited 127"):
        agents.run(host, "ownership", "state", 30, interpreter="/nonexistent/python3")


# --- no host-side Python left in a string literal

PYTHON_C = re.compile(r"python[0-9.]*['\"]?\s+(?:-[A-Za-z]+\s+)*-c\b")
# Known, owned elsewhere: steps/release.py asks the release venv's python for its
# purelib path in the build's shell script (one sysconfig call, not an agent).
KNOWN: set = set()  # (file, snippet) allowed; none left


def host_python_in_strings(root: Path) -> list[str]:
    """Module files' string constants that are host-side Python: a long one
    that parses as Python with an import, or one that runs `python -c`."""
    found = []
    for path in sorted(root.rglob("*.py")):
        rel = path.relative_to(root.parent).as_posix()
        if "agents" in path.relative_to(root).parts[:1] or rel == "k26ops/transport/agents.py":
            continue  # the agents themselves, and transport/agents.py, which builds the one `python3 -c`
        for node in ast.walk(parsed(path)):
            if isinstance(node, ast.JoinedStr):
                text = "".join(v.value for v in node.values if isinstance(v, ast.Constant))
            elif isinstance(node, ast.Constant) and isinstance(node.value, str):
                text = node.value
            else:
                continue
            if any(rel == k and snippet in text for k, snippet in KNOWN):
                continue
            if any(f.startswith(f"{rel}:{node.lineno}:") for f in found):
                continue  # an f-string's parts are visited again
            if PYTHON_C.search(text):
                found.append(f"{rel}:{node.lineno}: runs python -c: {text[:60]!r}")
            elif len(text) > 200 and re.search(r"^\s*(import|from)\s", text, re.M):
                try:
                    code = ast.parse(text)
                except (SyntaxError, ValueError):
                    continue
                if any(isinstance(n, (ast.Import, ast.ImportFrom)) for n in ast.walk(code)):
                    found.append(f"{rel}:{node.lineno}: a Python program in a string ({len(text)} chars)")
    return found


def test_no_host_python_in_string_literals():
    assert host_python_in_strings(ROOT / "k26ops") == []


def test_the_scan_finds_a_script_in_a_string(tmp_path):
    pkg = tmp_path / "k26ops"
    pkg.mkdir()
    script = "import json, sys\n" + "".join(f"x{i} = json.loads(sys.stdin.read())\n" for i in range(8))
    (pkg / "a.py").write_text(f"SCRIPT = {script!r}\n")
    (pkg / "b.py").write_text("def f(q, s):\n    return f'python3 -c {q(s)} arg'\n")
    (pkg / "c.py").write_text("DOC = '''" + "plain words, no code here. " * 12 + "'''\n")
    found = host_python_in_strings(pkg)
    assert [f.split(":")[0] for f in found] == ["k26ops/a.py", "k26ops/b.py"]


# --- ownership


def release_dir(d: Path, name: str, how: str = "marker") -> Path:
    p = d / name
    p.mkdir(parents=True)
    if how == "marker":
        (p / ownership.RELEASE_MARKER).write_text("")
    elif how == "manifest":
        (p / "manifest.json").write_text(json.dumps({"release_id": name}))
    elif how == "other-manifest":
        (p / "manifest.json").write_text(json.dumps({"release_id": "someone-else"}))
    return p


def test_ownership_state_of_a_root(host, tmp_path):
    root = tmp_path / "root"
    assert ownership.state(host, str(root), "root") == {"state": "absent"}
    root.mkdir()
    assert ownership.state(host, str(root), "root")["state"] == "empty"
    for n in ("state", "releases", "wheelhouse"):
        (root / n).mkdir()
    assert ownership.state(host, str(root), "root")["state"] == "ours"
    for n in ("weights", "a b", "x'; touch y"):
        (root / n).write_text("not ours")
    st = ownership.state(host, str(root), "root")
    assert st == {"state": "foreign", "foreign": ["a b", "weights", "x'; touch y"], "count": 3}
    assert "k26ops_root" in ownership.refusal(str(root), "root", st)
    ownership.claim(host, str(root))
    assert ownership.state(host, str(root), "root") == {"state": "owned"}
    (tmp_path / "file").write_text("")
    assert ownership.state(host, str(tmp_path / "file"), "root") == {"state": "notdir"}


def test_ownership_releases_are_only_what_k26ops_made(host, tmp_path):
    d = tmp_path / "releases"
    old, named = release_dir(d, "r-old"), release_dir(d, "r-named", "manifest")
    os.utime(old, (1_000_000, 1_000_000))
    release_dir(d, "r-foreign", "other-manifest")
    (d / "current").symlink_to("r-named")
    (d / "link").symlink_to(named)
    assert ownership.releases(host, str(d)) == ["r-named", "r-old"]
    st = ownership.state(host, str(d), "releases")
    assert st == {"state": "foreign", "foreign": ["link", "r-foreign"], "count": 2}
    assert ownership.releases(host, str(tmp_path / "none")) == []


def test_ownership_delete_checks_again_on_the_host(host, tmp_path):
    d = tmp_path / "releases"
    release_dir(d, "r1")
    release_dir(d, "r2")
    release_dir(d, ".hidden")
    release_dir(d, "r-foreign", "other-manifest")
    release_dir(tmp_path, "outside")
    gone = ownership.delete(host, str(d), ["r1", "r-foreign", ".hidden", "../outside", "absent"])
    assert gone == ["r1"]
    assert sorted(p.name for p in d.iterdir()) == [".hidden", "r-foreign", "r2"]
    assert (tmp_path / "outside").is_dir()
    assert ownership.delete(host, str(d), []) == []


# --- baseline (snapshot, rollback, drift)


def deployed_release(root: Path, rid="r1"):
    site = root / rid / "venv" / "site-packages"
    (site / "pkg").mkdir(parents=True)
    (site / "pkg" / "mod.py").write_bytes(b"patched = True\n")
    meta = site / "demo-1.2.dist-info"
    meta.mkdir()
    (meta / "METADATA").write_text("Metadata-Version: 2.1\nName: demo\nVersion: 1.2\n\nVersion: not-this\n")
    man = {"release_id": rid, "site_packages": str(site), "patched_files": {"pkg/mod.py": "x"}}
    (root / rid / "manifest.json").write_text(json.dumps(man))
    (root / rid / "k26ops" / "patches").mkdir(parents=True)
    (root / rid / "k26ops" / "patches" / "series").write_text("a.patch\n")
    (root / "current").symlink_to(rid)
    return site


def test_baseline_probe_reads_release_hashes_unit_and_env(host, tmp_path):
    from k26ops.baselines import hostscript

    rels = tmp_path / "releases"
    deployed_release(rels)
    unit = tmp_path / "k26.service"
    unit.write_text("[Service]\n")
    out = hostscript.call(
        host, "probe", releases_root=str(rels), release=None, unit_path=str(unit), env_path=str(tmp_path / "absent.env")
    )
    assert out["unit"] == "[Service]\n" and out["env"] is None
    rel = out["release"]
    assert rel["current"] == "r1" and rel["exists"] and rel["manifest"]["release_id"] == "r1"
    assert rel["hashes"] == {"pkg/mod.py": hashlib.sha256(b"patched = True\n").hexdigest()}
    assert rel["probe_files"] == []
    out = hostscript.call(host, "probe", releases_root=str(rels), release="r0", unit_path=str(unit), env_path=str(unit))
    assert out["release"]["exists"] is False and out["current"]["release"] == "r1"


def test_baseline_release_content_is_packages_patches_and_bytes(tmp_path):
    mod = load("baseline")
    rels = tmp_path / "releases"
    deployed_release(rels)
    rel = mod.release(str(rels), None, content=True)
    assert rel["packages"] == {"demo": "1.2"}
    assert rel["patches"] == {"series": "a.patch\n"}
    assert rel["files"] == {"pkg/mod.py": "cGF0Y2hlZCA9IFRydWUK"}  # base64 of the bytes
    assert rel["patch_state"] is None


# --- journal (diagnose service)


def entry(inv, msg, own=True, ts=1):
    key = "_SYSTEMD_INVOCATION_ID" if own else "INVOCATION_ID"
    return json.dumps({key: inv, "MESSAGE": msg, "__REALTIME_TIMESTAMP": str(ts)})


def test_journal_picks_the_newest_failed_invocation():
    mod = load("journal")
    # CONSTRUCTED journal entries; the systemd lines are systemd's own wording
    # ("Main process exited, code=..., status=...", "Failed with result '...'").
    lines = [
        entry("a", "Loading weights"),
        entry("a", "Traceback: boom", ts=2),
        entry("a", "k26.service: Main process exited, code=exited, status=1/FAILURE", own=False, ts=3),
        entry("a", "k26.service: Failed with result 'exit-code'.", own=False, ts=4),
        entry("b", "serving"),
        entry("b", "k26.service: Main process exited, code=killed, status=15/TERM", own=False),
        entry("c", "started"),
        "not json",
        json.dumps({"_SYSTEMD_INVOCATION_ID": "c", "MESSAGE": list(b"bytes \xff line")}),
        entry("c", "k26.service: Failed with result 'timeout'.", own=False, ts=9),
        entry("d", "running"),
    ]
    out = mod.last_crash("\n".join(lines), {"InvocationID": "d"}, keep=1)
    assert out["invocations"] == 4 and out["crashes"] == 2
    assert out["invocation"] == "c" and out["why"] == "result timeout" and out["current"] is False
    assert out["text"] == "bytes \ufffd line" and out["ended_us"] == "9"
    out = mod.last_crash("\n".join(lines[:4]), {"InvocationID": "a"}, keep=5)
    assert out["why"] == "code=exited, status=1/FAILURE" and out["text"] == "Loading weights\nTraceback: boom"
    assert out["current"] is True and out["started_us"] == "1"
    assert mod.last_crash("\n".join(lines[4:6]), {}, 5) == {"show": {}, "invocations": 1, "crashes": 0}


def test_a_requested_stop_that_ends_by_the_engines_own_sigkill_is_no_crash():
    """The real engine drains on SIGTERM, then SIGKILLs its own tree, itself included
    (tests/data/drain: the process ended with -9): under systemd a stop then ends
    "code=killed, status=9/KILL" and "Failed with result 'signal'". After systemd's
    "Stopping ..." that is the stop, not a crash; the same kill without a stop is one."""
    mod = load("journal")
    drain = (ROOT / "tests/data/drain/engine-cold-then-drain-h100.log").read_text().splitlines()[-4:]
    stop = [
        entry("s", "The server is fired up and ready to roll!"),
        entry("s", "Stopping k26-engine.service - SGLang engine (k26ops)...", own=False, ts=2),
        *[entry("s", line, ts=3) for line in drain],
        entry("s", "k26-engine.service: Main process exited, code=killed, status=9/KILL", own=False, ts=4),
        entry("s", "k26-engine.service: Failed with result 'signal'.", own=False, ts=5),
        entry("s", "Stopped k26-engine.service - SGLang engine (k26ops).", own=False, ts=6),
    ]
    out = mod.last_crash("\n".join(stop), {"InvocationID": "n"}, keep=5)
    assert out["crashes"] == 0 and "invocation" not in out
    killed = [line for line in stop if "Stopping" not in line]  # the same end with no stop asked: a crash
    out = mod.last_crash("\n".join(killed), {"InvocationID": "n"}, keep=5)
    assert out["crashes"] == 1 and out["why"] == "code=killed, status=9/KILL"


def test_journal_agent_runs_on_this_machine(host):
    from k26ops.diagnose import journal

    if not shutil.which("journalctl"):
        pytest.skip("no journalctl here")
    out = journal.last_crash(host, "k26ops-test-no-such-unit.service", lines=10)
    assert out["invocations"] == 0 and out["crashes"] == 0 and "invocation" not in out


# --- probe (diagnose probe)


def test_probe_prepare_says_what_is_missing(host, tmp_path):
    from k26ops.diagnose import probe

    rels = tmp_path / "releases"
    rels.mkdir()
    req = dict(unit="k26ops-test-none.service", dropin="zz-test.conf", probe_state="probe-state", dry=True)
    out = probe.agent(host, "prepare", releases=str(rels), **req)
    assert out == {"ok": False, "error": f"no current release under {rels} (deploy first)"}
    (rels / "r1").mkdir()
    (rels / "current").symlink_to("r1")
    out = probe.agent(host, "prepare", releases=str(rels), **req)
    assert out["error"] == f"release {rels}/r1 has no readable manifest.json (not built by k26ops?)"
    (rels / "r1" / "manifest.json").write_text(json.dumps({"site_packages": str(tmp_path / "gone")}))
    out = probe.agent(host, "prepare", releases=str(rels), **req)
    assert out["error"] == f"release {rels}/r1: site-packages {tmp_path}/gone is missing"
    out = probe.agent(host, "prepare", **req)  # an op that raises answers ok: false, named
    assert out == {"ok": False, "error": "KeyError: 'releases'"}
    with pytest.raises(probe.ProbeFailed, match=r"host agent \(prepare\) exited 127"):
        probe.agent(host, "prepare", interpreter="/nonexistent/python3", **req)


def test_probe_revert_without_a_probe_and_dropin_listing(tmp_path):
    mod = load("probe")
    assert mod.probe_revert(str(tmp_path), str(tmp_path), str(tmp_path / "none")) == {
        "reverted": [],
        "had_probe": False,
    }
    sdir, site = tmp_path / "probe-state", tmp_path / "site"
    sdir.mkdir()
    site.mkdir()
    (site / "f.py").write_text("x")
    (sdir / "mtimes.json").write_text(json.dumps({"f.py": 1_000_000_000_000_000_000}))
    assert mod.probe_revert(str(tmp_path), str(site), str(sdir))["had_probe"] is False
    assert not sdir.exists() and (site / "f.py").stat().st_mtime_ns == 1_000_000_000_000_000_000
    assert mod.runtime_dropin("k.service", "zz.conf") == "/run/systemd/system/k.service.d/zz.conf"
    assert mod.sha(str(tmp_path / "absent")) is None and mod.sha(str(site / "f.py")) == hashlib.sha256(b"x").hexdigest()


# --- wheelfetch (wheels from a relay)


@pytest.fixture
def relay(tmp_path):
    """A real HTTP server on loopback serving a wheelhouse, as the relay's `python3 -m http.server`."""
    served = tmp_path / "served"
    served.mkdir()
    handler_cls = type("Quiet", (http.server.SimpleHTTPRequestHandler,), {"log_message": lambda *a: None})
    handler = lambda *a, **kw: handler_cls(*a, directory=str(served), **kw)  # noqa: E731
    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    t = threading.Thread(target=srv.serve_forever, args=(0.05,), daemon=True)  # shutdown() waits a poll
    t.start()
    yield SimpleNamespace(dir=served, url=f"http://127.0.0.1:{srv.server_address[1]}", port=srv.server_address[1])
    srv.shutdown()
    srv.server_close()


def wheel(d: Path, name: str, data: bytes):
    (d / name).write_bytes(data)
    return SimpleNamespace(name=name, sha256=hashlib.sha256(data).hexdigest(), size=len(data))


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_wheelfetch_keeps_only_the_expected_bytes(host, relay, tmp_path):
    ctx = SimpleNamespace(session=host)
    dest = tmp_path / "wheelhouse" / "new"
    a = wheel(relay.dir, "a-1-py3-none-any.whl", b"A" * 3_000_000)
    b = wheel(relay.dir, "b+x 1-py3-none-any.whl", b"B")  # quoted in the URL
    assert wheelsource._fetch(ctx, [a, b], str(dest), relay.url) == (None, "")
    assert (dest / a.name).read_bytes() == b"A" * 3_000_000 and (dest / b.name).read_bytes() == b"B"
    c = wheel(relay.dir, "c-1-py3-none-any.whl", b"C")
    (relay.dir / c.name).write_bytes(b"changed on the relay")
    refused, why = wheelsource._fetch(ctx, [c], str(dest), relay.url)
    assert refused == (c.name, hashlib.sha256(b"changed on the relay").hexdigest(), c.sha256) and why == ""
    assert sorted(p.name for p in dest.iterdir()) == sorted([a.name, b.name])  # no temp file, no bad wheel


def test_wheelfetch_unreachable_relay_is_a_reason_not_a_failure(host, relay, tmp_path):
    ctx = SimpleNamespace(session=host)
    w = SimpleNamespace(name="gone-1-py3-none-any.whl", sha256="0" * 64, size=1)
    refused, why = wheelsource._fetch(ctx, [w], str(tmp_path / "wh"), relay.url)
    assert refused is None and "404" in why
    refused, why = wheelsource._fetch(ctx, [w], str(tmp_path / "wh"), f"http://127.0.0.1:{free_port()}")
    assert refused is None and "refused" in why.lower()
    assert list((tmp_path / "wh").iterdir()) == []


def test_wheelfetch_connect(host, relay):
    assert wheelsource._answers(host, "127.0.0.1", relay.port) is True
    assert wheelsource._answers(host, "127.0.0.1", free_port()) is False


class Stalled:
    """A real loopback relay that accepts and then stalls: `silent` never answers;
    `trickle` promises 10 MB and sends a byte every `every` s (for 30 s at most).
    `closed` counts connections whose client went away (the agent's end)."""

    def __init__(self, mode: str, every: float = 0.5):
        self.mode, self.every, self.closed, self.conns = mode, every, 0, 0
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self.sock.getsockname()[1]}"
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self):
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            self.conns += 1
            threading.Thread(target=self._one, args=(conn,), daemon=True).start()

    def _one(self, conn):
        with conn:
            conn.settimeout(self.every)
            end = time.monotonic() + 30
            if self.mode == "trickle":
                conn.recv(65536)
                conn.sendall(b"HTTP/1.0 200 OK\r\nContent-Length: 10000000\r\n\r\n")
            while time.monotonic() < end:
                try:
                    if self.mode == "trickle":
                        conn.sendall(b"x")
                        time.sleep(self.every)
                    elif conn.recv(65536) == b"":
                        break
                except socket.timeout:
                    continue
                except OSError:
                    break
            self.closed += 1


def test_wheelfetch_a_silent_or_trickling_relay_fails_fast(host, tmp_path, monkeypatch):
    monkeypatch.setattr(wheelsource, "READ_TIMEOUT", 0.4)
    monkeypatch.setattr(wheelsource, "MIN_BYTES", 1024)
    ctx = SimpleNamespace(session=host)
    w = SimpleNamespace(name="a-1-py3-none-any.whl", sha256="0" * 64, size=1)
    # the trickle: a byte every 0.05 s, each read well within READ_TIMEOUT, 1024 bytes never
    for mode, says in (("silent", "no data from the relay within 0.4"), ("trickle", "stalled")):
        t0 = time.monotonic()
        refused, why = wheelsource._fetch(ctx, [w], str(tmp_path / "wh"), Stalled(mode, every=0.05).url)
        took = time.monotonic() - t0
        assert refused is None and says in why, (mode, why)
        assert took < 6, f"{mode} relay held the host {took:.0f}s"  # the relay stalls 30 s; unbounded per read before
        assert list((tmp_path / "wh").iterdir()) == []  # no temp file left


def test_wheelfetch_ctrl_c_ends_the_fetch_and_its_agent_at_once(host, tmp_path):
    from k26ops import interrupt
    from k26ops.steps import Interrupted

    relay = Stalled("silent", every=0.1)  # READ_TIMEOUT (15 s) would end it later: Ctrl-C must not wait for it
    w = SimpleNamespace(name="a-1-py3-none-any.whl", sha256="0" * 64, size=1)

    def ctrl_c_once_connected():  # the agent is mid-fetch: connected to the relay
        deadline = time.monotonic() + 10
        while relay.conns < 1 and time.monotonic() < deadline:
            time.sleep(0.02)
        interrupt.requested.set()

    threading.Thread(target=ctrl_c_once_connected, daemon=True).start()
    t0 = time.monotonic()
    try:
        with pytest.raises(Interrupted, match="during the wheel fetch agent on local"):
            wheelsource._fetch(SimpleNamespace(session=host), [w], str(tmp_path / "wh"), relay.url)
    finally:
        interrupt.requested.clear()
    assert time.monotonic() - t0 < 8  # the agent's own wait: READ_TIMEOUT, 15 s (60 s before)
    deadline = time.monotonic() + 5  # the agent is gone: its connection to the relay closed
    while relay.closed < relay.conns and time.monotonic() < deadline:
        time.sleep(0.1)
    assert relay.conns == 1 and relay.closed == 1


def test_an_agent_printing_garbage_is_one_line_naming_host_and_agent(host, tmp_path, monkeypatch):
    monkeypatch.setattr(ssh, "OUTPUT_LIMIT", 1 << 20)
    noisy = tmp_path / "python3-noisy"  # a python3 that prints 5 MB before the agent runs
    noisy.write_text(f"#!/bin/sh\nhead -c 5000000 /dev/zero | tr '\\0' x; echo\nexec {sys.executable} \"$@\"\n")
    noisy.chmod(0o755)
    with pytest.raises(agents.AgentFailed) as e:
        agents.run(
            host,
            "ownership",
            "state",
            60,
            interpreter=str(noisy),
            dir=str(tmp_path),
            kind="root",
            names=[],
            marker="m",
            release_marker="r",
            root_entries=[],
        )
    assert str(e.value).startswith("ownership agent (state) on local printed more than 1 MiB: stopped reading")
    garbage = tmp_path / "python3-garbage"
    garbage.write_text("#!/bin/sh\nprintf 'Welcome to host\\n\\001\\002'\n")
    garbage.chmod(0o755)
    with pytest.raises(agents.AgentFailed, match=r"^ownership agent \(state\) on local printed no JSON answer"):
        agents.run(host, "ownership", "state", 60, interpreter=str(garbage))


# --- gather (facts)


def test_gather_kills_a_command_past_its_timeout_with_its_children(host, tmp_path):
    pidfile = tmp_path / "child-pid"  # a background child that would sleep 60 s, off the agent's pipes
    child = f"sh -c 'echo $$ > {pidfile}; exec sleep 60' >/dev/null 2>&1 </dev/null"
    out = call(
        host,
        "gather",
        "gather",
        commands=[
            {"name": "slow", "command": f"{child} & sleep 30", "timeout": 0.5},
            {"name": "env", "command": "echo $LC_ALL; cat", "timeout": 5},
        ],
    )
    assert out["slow"]["rc"] == 124 and "timed out after 0.5 s" in out["slow"]["stderr"]
    assert out["env"] == {"rc": 0, "stdout": "C\n", "stderr": ""}
    pid = int(pidfile.read_text())
    deadline = time.monotonic() + 3
    while _alive(pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not _alive(pid)  # the whole process group was killed, the child with it


def _alive(pid: int) -> bool:
    """Is `pid` a live process (a zombie is dead: killed, not yet reaped)?"""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return False


def test_gather_answers_the_python_version_itself_byte_for_byte(host):
    """The gather agent answers `python3 --version` from its own interpreter: the same bytes
    as the command under that interpreter (here sys.executable runs both), no second start."""
    cmd = f"{sys.executable} --version 2>&1"
    out = call(
        host,
        "gather",
        "gather",
        commands=[{"name": "own", "command": "exit 9", "own": "python_version"}, {"name": "ran", "command": cmd}],
    )
    assert out["own"] == out["ran"] and out["ran"]["stdout"].startswith("Python 3.")


def test_gather_answers_os_release_itself_byte_for_byte_and_runs_the_command_where_it_cannot(host):
    """The os_release fact read by the gather agent (no sh, no cat): the same bytes as its
    command on this machine; when /etc/os-release does not read, the command runs."""
    from k26ops.facts import FACTS

    fact = FACTS["os_release"]
    assert fact.own == "os_release"
    out = call(
        host,
        "gather",
        "gather",
        commands=[{"name": "own", "command": "exit 9", "own": "os_release"}, {"name": "ran", "command": fact.command}],
    )
    assert out["own"] == out["ran"] and "ID=" in out["ran"]["stdout"]

    def unreadable(*a, **k):
        raise PermissionError(13, "Permission denied")

    mod = load("gather")
    mod.open = unreadable
    got = mod.op_gather({"commands": [{"name": "os_release", "command": "echo ran; exit 3", "own": "os_release"}]})
    assert got == {"os_release": {"rc": 3, "stdout": "ran\n", "stderr": ""}}


def test_gather_answers_file_facts_itself_byte_for_byte(tmp_path):
    """release_current, cuda_toolchains_verified, model and drafter read by the gather agent
    (no sh, ls, head, readlink, tr): for each layout, the same bytes as the fact's command
    under /bin/sh on this machine; None (the command runs) only where the test says so."""
    from k26ops.facts.drafter import drafter_fact
    from k26ops.facts.model import model_fact
    from k26ops.steps.release import current_fact
    from k26ops.steps.toolchain import verified_fact

    mod = load("gather")
    root = tmp_path / "root"

    def same(fact, own_expected=True):
        assert fact.own, fact
        own = mod.OWN[fact.own](*fact.own_args)
        ran = mod.run_one({"command": fact.command})
        assert (own is not None) == own_expected, (fact.name, own, ran)
        if own is not None:
            assert own == ran, (fact.name, own, ran)
        return ran["stdout"]

    rel = root / "releases"
    assert same(current_fact(str(rel))) == ""  # no releases root
    rel.mkdir(parents=True)
    assert same(current_fact(str(rel))) == "===\n===\n"
    (rel / "r1").mkdir()
    (rel / "current").symlink_to("r1")
    assert same(current_fact(str(rel))) == "r1\n===\n===\n"
    (rel / "r1" / "manifest.json").write_text('{"release_id": "r1", "site_p')  # truncated (issue 42)
    assert same(current_fact(str(rel))) == "r1\n===\n===\n"
    (rel / "r1" / "manifest.json").write_text("{}")
    assert same(current_fact(str(rel))) == "r1\n===\ncomplete\n===\n"
    (rel / "r1" / "rehearse-probe-state").mkdir()  # a probe a killed rehearsal left applied (issue 42)
    (rel / "r1" / "rehearse-probe-state" / "state.json").write_text("{}")
    assert same(current_fact(str(rel))) == "r1\n===\ncomplete\n===\ncurrent/rehearse-probe-state/state.json\n"
    from k26ops.steps.release import _current_and_complete

    assert _current_and_complete("r1\n===\ncomplete\n===\ncurrent/rehearse-probe-state/state.json\n") == {
        "current": "r1",
        "complete": True,
        "probes": ["rehearse-probe-state"],
    }

    tc = root / "toolchain"
    assert same(verified_fact(str(root))) == ""  # no toolchain dir
    for name, marker in (("cuda-12.9", "sm_90\nsm_120\n"), ("b", None), (".hidden", "sm_80\n"), ("Z é", "sm_100")):
        (tc / name).mkdir(parents=True)
        if marker is not None:
            (tc / name / "k26ops-verified").write_text(marker)
    (tc / "a-file").write_text("x")
    (tc / "c").mkdir()
    (tc / "c" / "k26ops-verified").mkdir()  # not a file: left out, as [ -f ] does
    out = same(verified_fact(str(root)))
    assert out == f"{tc}/Z é\tsm_100\n{tc}/cuda-12.9\tsm_90 sm_120 \n", out

    d, m = root / "drafter", root / "model"
    for fact, path in ((drafter_fact, d), (model_fact, m)):  # missing, then a file, then an empty dir
        assert same(fact(str(path))).endswith("missing\n")
        path.write_text("")
        assert same(fact(str(path))).endswith("notdir\n")
        path.unlink()
        path.mkdir()
    same(drafter_fact(str(d)), own_expected=False)  # a dir without config.json: its listing is the command's
    (d / "config.json").write_text('{"block_size": 16}')
    assert same(drafter_fact(str(d))).endswith('config\n{"block_size": 16}')

    assert same(model_fact(str(m))).endswith("dir\n== k26ops-model files\n")
    for name in (
        "model-00002-of-00002.safetensors",
        "model-00001-of-00002.safetensors",
        "B.safetensors",
        "model.safetensors.index.json",
        ".hidden.safetensors",
        "README.md",
        "x.safetensors.bak",
        "é.safetensors",
    ):
        (m / name).write_text("w")
    (m / "config.json").write_text('{"model_type": "kimi_k2"}')
    out = same(model_fact(str(m)))
    assert '{"model_type": "kimi_k2"}\n' in out and out.endswith(
        "files\nB.safetensors\nmodel-00001-of-00002.safetensors\nmodel-00002-of-00002.safetensors\n"
        "model.safetensors.index.json\né.safetensors\n"
    ), out


def test_hub_error_is_the_traceback_last_line_without_traceback():
    import json as json_mod
    import traceback

    hub = load("hub")
    for exc in (
        KeyError("commands"),
        ValueError(),
        OSError(2, "No such file"),
        RuntimeError("a\nlast line"),
        json_mod.JSONDecodeError("Expecting value", "x", 0),
        subprocess.TimeoutExpired(["sleep"], 1),
    ):
        try:
            raise exc
        except Exception as e:
            assert hub.last_line(e) == traceback.format_exc().strip().splitlines()[-1]


def test_gather_one_command_and_none():
    mod = load("gather")
    assert mod.run_one({"command": "exit 5"}) == {"rc": 5, "stdout": "", "stderr": ""}
    assert mod.op_gather({"commands": []}) == {}
    with pytest.raises(KeyError, match="command"):  # a bad item fails the request, not only its fact
        mod.op_gather({"commands": [{"name": "bad"}, {"name": "ok", "command": "true"}]})


# --- engine


def test_engine_write_is_atomic_and_leaves_the_same_text_alone(tmp_path):
    mod = load("engine")
    p = tmp_path / "etc" / "k26.env"
    mod.write(str(p), "A=1\n", 0o600)
    assert p.read_text() == "A=1\n" and p.stat().st_mode & 0o7777 == 0o600
    before = p.stat().st_ino
    mod.write(str(p), "A=1\n", 0o600)
    assert p.stat().st_ino == before  # untouched: no room needed on a full disk
    mod.write(str(p), "A=2\n", 0o640)
    assert p.read_text() == "A=2\n" and p.stat().st_mode & 0o7777 == 0o640
    assert sorted(x.name for x in p.parent.iterdir()) == ["k26.env"]


def test_engine_names_a_crash_from_the_unit_state():
    mod = load("engine")
    base = {"MainPID": 10, "NRestarts": 0}
    assert mod.crashed({"ActiveState": "active", "SubState": "running", "MainPID": 10, "NRestarts": 0}, base) is None
    assert mod.crashed({"ActiveState": "failed", "Result": "exit-code"}, base) == "unit is failed (exit-code)"
    assert (
        mod.crashed({"ActiveState": "active", "SubState": "running", "MainPID": 11}, base)
        == "engine process 10 exited (now 11)"
    )
    assert mod.last_meaningful("a\nLoad weight begin\nnoise\n") == "Load weight begin"


def test_ownership_states_answers_several_dirs_in_one_call(host, tmp_path):
    root, rel = tmp_path / "root", tmp_path / "elsewhere"
    root.mkdir()
    (rel / "wheelhouse").mkdir(parents=True)  # ours under k26ops_root, foreign among releases
    calls = []
    real = host.run
    host.run = lambda *a, **kw: calls.append(a) or real(*a, **kw)
    got = ownership.states(host, [(str(root), "root"), (str(rel), "releases"), (str(tmp_path / "no"), "releases")])
    assert len(calls) == 1
    assert got == [
        ownership.state(host, str(root), "root"),
        ownership.state(host, str(rel), "releases"),
        {"state": "absent"},
    ]
    assert got[1]["state"] == "foreign"


def test_engine_converge_checks_health_and_smoke_only_when_nothing_differs(tmp_path):
    """The decision of op_converge: the host's real files against the wanted
    hashes; the unit's state, the poll and the smoke are stand-ins here (no
    systemd on this machine; the lab tests run the real ones)."""
    mod = load("engine")
    unit, env = tmp_path / "k26.service", tmp_path / "k26.env"
    unit.write_text("[Service]\n")
    mod.write(str(env), "A=1\n", 0o600)
    state = {"UnitFileState": "enabled", "ActiveState": "active"}
    asked = []
    mod.show = lambda u: dict(state)
    mod.op_poll = lambda r: asked.append(("poll", r["window"])) or {"state": "healthy", "base": {"MainPID": 7}}
    mod.op_smoke = lambda r: asked.append(("smoke", r["base"])) or {"results": [], "failed": None, "crash": None}
    want = {"unit_sha": mod.sha256("[Service]\n"), "env_sha": mod.sha256("A=1\n"), "lab_module_sha": None}
    req = {
        "unit": "k26.service",
        "unit_path": str(unit),
        "env_path": str(env),
        "current": str(tmp_path / "cur"),
        "want": want,
        "poll": {"window": 2.0},
        "smoke": {"prompt": "hi"},
    }
    out = mod.op_converge(dict(req))
    assert out["converged"] and out["poll"]["state"] == "healthy" and out["smoke"]["failed"] is None
    assert asked == [("poll", 2.0), ("smoke", {"MainPID": 7})]
    for changed in (
        lambda: unit.write_text("[Service]\nX=1\n"),
        lambda: os.chmod(env, 0o644),
        lambda: state.update(UnitFileState="disabled"),
        lambda: state.update(ActiveState="activating"),
    ):
        unit.write_text("[Service]\n")
        os.chmod(env, 0o600)
        state.update(UnitFileState="enabled", ActiveState="active")
        changed()
        asked.clear()
        out = mod.op_converge(dict(req))
        assert not out["converged"] and "poll" not in out and "smoke" not in out and asked == []
    assert mod.op_converge({k: v for k, v in req.items() if k != "want"})["converged"] is False


def _standin(port: int, *extra: str, **env):
    script = Path(__file__).resolve().parent.parents[1] / "k26ops/lab/fixtures/engine_standin.py"
    p = subprocess.Popen(
        [
            sys.executable,
            str(script),
            "--model-path",
            "/m",
            "--port",
            str(port),
            "--speculative-algorithm",
            "DFLASH",
            *extra,
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        env={**os.environ, "K26OPS_STANDIN_LOAD_SECONDS": "0", **env},
    )
    import urllib.request

    for _ in range(100):
        try:
            if urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=1).status == 200:
                return p
        except OSError:
            time.sleep(0.1)
    p.kill()
    raise AssertionError("stand-in did not come up")


def test_loadgen_accept_per_cell_from_counters_not_the_lifetime_average():
    """bench_serving stores /server_info's lifetime avg_spec_accept_length; the agent's
    per-cell figure (cumulative counters read before and after the cell) must be each
    cell's own: a T=0 cell at 4.0 then a T=0.7 cell at 2.0 accepted tokens per step."""
    from k26ops.agents import loadgen

    port = free_port()
    p = _standin(port, "--enable-metrics", K26OPS_STANDIN_ACCEPT_LENGTH="4", K26OPS_STANDIN_ACCEPT_LENGTH_SAMPLED="2")
    try:

        def cell(temperature):
            before = loadgen.spec_counters("127.0.0.1", port)
            outs = [loadgen.one_request("127.0.0.1", port, "hello there", 64, temperature, 30) for _ in range(3)]
            assert all(o["ok"] and o["output_len"] == 64 for o in outs), outs
            after = loadgen.spec_counters("127.0.0.1", port)
            return loadgen.cell_accept(before, after), [o["accept"] for o in outs]

        greedy, greedy_meta = cell(0.0)
        sampled, sampled_meta = cell(0.7)
        lifetime = loadgen.server_accept("127.0.0.1", port)
    finally:
        p.kill()
        p.wait()
    assert greedy == pytest.approx(4.0) and greedy_meta == [4.0] * 3
    assert sampled == pytest.approx(2.0) and sampled_meta == [2.0] * 3
    # what bench_serving would have stored for the second cell: both cells mixed
    assert lifetime == pytest.approx((3 * 64 + 3 * 64) / (3 * 16 + 3 * 32))
    assert sampled < lifetime < greedy


def test_loadgen_without_metrics_keeps_no_per_cell_figure():
    """Without --enable-metrics there is no /metrics: no per-cell figure (the agent then
    labels bench_serving's value as the lifetime one)."""
    from k26ops.agents import loadgen

    port = free_port()
    p = _standin(port)
    try:
        assert loadgen.spec_counters("127.0.0.1", port) is None
        assert loadgen.cell_accept(None, None) is None
    finally:
        p.kill()
        p.wait()
    assert loadgen.cell_accept((10.0, 5.0), (10.0, 5.0)) is None  # no verify step in the cell
    assert loadgen.LIFETIME.startswith("/server_info lifetime")
    text = (
        "# TYPE sglang:generation_tokens_total counter\n"
        'sglang:generation_tokens_total{engine_type="unified",model_name="m",is_streaming="true"} 120.0\n'
        'sglang:generation_tokens_total{engine_type="unified",model_name="m",is_streaming="false"} 8.0\n'
        'sglang:spec_verify_calls_total{engine_type="unified",model_name="m"} 40.0\n'
        'sglang:spec_verify_calls_created{engine_type="unified",model_name="m"} 1.7e9\n'
    )
    assert loadgen.parse_counters(text) == {
        "sglang:generation_tokens_total": 128.0,
        "sglang:spec_verify_calls_total": 40.0,
    }
