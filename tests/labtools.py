"""Test helpers around the lab: free ports, ssh with the lab's key, running k26ops."""

from __future__ import annotations

import ast
import atexit
import contextlib
import functools
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent


PORT_CHUNK = 100  # ports handed out per xdist worker in chunks of this many (a block fits in one)
# k26ops.lab.machines.ENGINE_PORT_OFFSET (a lab host's engine port is its sshd port + this), not
# imported: that import costs seconds at every test start (test_marks checks the two agree)
ENGINE_PORT_OFFSET = 20000


def _port_owner(port: int, workers: int) -> int:
    """Which xdist worker may take `port`: chunks of PORT_CHUNK ports dealt in turn, counted
    modulo ENGINE_PORT_OFFSET so that a port and its engine port (+20000) have the same owner."""
    return (port % ENGINE_PORT_OFFSET) // PORT_CHUNK % workers


_HANDED_OUT: set[int] = set()  # every port free_port_block gave in this process


def free_port_block(count: int, start: int = 23000, stop: int = 29000) -> int:
    """The first port of `count` consecutive free loopback ports. Under pytest-xdist, only
    ports this worker owns (_port_owner), whatever the range: a port is free only until the
    lab's sshd binds it (seconds of boot later), and two workers probing the same ports
    could both take it (the ranges of the callers overlap too). Never a port it gave before
    in this process: a module that set the shared lab's engine_port to one leaves that engine
    listening there, free whenever it restarts (a full run's port-in-use: test_faults_rehearse
    was given the 38000 that test_faults_input's engine came back to)."""
    workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT") or 1)
    me = int(os.environ.get("PYTEST_XDIST_WORKER", "gw0")[2:] or 0)
    assert count <= PORT_CHUNK or workers == 1, count
    first = start + (os.getpid() * 7) % max(1, min(3000, stop - start - count))  # inside the range asked
    port, wrapped = first, False
    while port + count < stop or not wrapped:
        if port + count >= stop:  # the range's start, once, up to where this began
            port, wrapped, stop = start, True, first + count
            continue
        if workers > 1 and {_port_owner(p, workers) for p in (port, port + count - 1)} != {me}:
            port = (port // PORT_CHUNK + 1) * PORT_CHUNK  # the next chunk
            continue
        ok = not _HANDED_OUT.intersection(range(port, port + count))
        # the sshd ports and the engine ports the lab derives from them; and not the engine port of a
        # lab up now (its sshd port bound 20000 below), free only while its engine is not serving
        below = range(max(1024, port - ENGINE_PORT_OFFSET), max(1024, port - ENGINE_PORT_OFFSET + count))
        for p in [
            *range(port, port + count),
            *range(port + ENGINE_PORT_OFFSET, port + ENGINE_PORT_OFFSET + count),
            *below,
        ]:
            with socket.socket() as s:
                try:
                    s.bind(("127.0.0.1", p))
                except OSError:
                    ok = False
                    break
        if ok:
            _HANDED_OUT.update(range(port, port + count))
            return port
        port += count + 1
    raise RuntimeError("no free port block")


def lab_ssh(
    lab_dir: Path, port: int, command: str, timeout: float = 60, user: str = "root", known_hosts: Path | None = None
) -> subprocess.CompletedProcess:
    """OpenSSH with the lab's key and known_hosts (or `known_hosts`), strict host key checking."""
    return subprocess.run(
        [
            "ssh",
            "-i",
            str(lab_dir / "id_ed25519"),
            "-o",
            f"UserKnownHostsFile={known_hosts or lab_dir / 'known_hosts'}",
            "-o",
            "StrictHostKeyChecking=yes",
            "-o",
            "BatchMode=yes",
            "-o",
            "ConnectTimeout=10",
            "-p",
            str(port),
            f"{user}@127.0.0.1",
            command,
        ],
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def k26ops(*args: str, env: dict | None = None, timeout: float = 600, input: str | None = None):
    """Run the real CLI in a subprocess (as a user would)."""
    full_env = {**os.environ, **(env or {})}
    return subprocess.run(
        [sys.executable, "-m", "k26ops", *args],
        capture_output=True,
        text=True,
        env=full_env,
        timeout=timeout,
        cwd=REPO,
        input=input,
    )


def cli(
    *args: str,
    env: dict | None = None,
    timeout: float | None = None,
    input: str | None = None,
    cwd: Path | str | None = None,
):
    """Run the CLI in this process (no interpreter start: ~0.8 s saved a call), for
    tests that never reach a host. Same result as `k26ops()`: returncode, stdout,
    stderr. Keep `k26ops()` where the test needs a real process: signals, real
    pipes or a TTY, a host (threads and sessions that may outlive the call).
    `timeout` is accepted for `k26ops()`'s signature and not enforced here."""
    import signal
    import traceback

    from click.testing import CliRunner

    from k26ops import cli as entry

    saved = (list(sys.argv), os.getcwd(), {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGHUP)})
    rc = 0
    with CliRunner().isolation(input=input, env=env) as (out, err, _):
        sys.argv = ["k26ops", *args]  # jsonout.wanted() reads it, as in a real run
        os.chdir(cwd or REPO)
        try:
            entry.main()
        except SystemExit as exc:
            code = exc.code
            rc = code if isinstance(code, int) else (0 if code is None else 1)
            if not isinstance(code, (int, type(None))):
                sys.stderr.write(f"{code}\n")
        except Exception:  # what a real run shows as a traceback, exit 1
            sys.stderr.write(traceback.format_exc())
            rc = 1
        finally:
            sys.stdout.flush()
            sys.stderr.flush()
            sys.argv = saved[0]
            os.chdir(saved[1])
            for sig, handler in saved[2].items():
                signal.signal(sig, handler)
            _forget_run_state()
    return subprocess.CompletedProcess(
        ["k26ops", *args], rc, out.getvalue().decode(errors="replace"), err.getvalue().decode(errors="replace")
    )


def _forget_run_state() -> None:
    """What one k26ops process keeps in module globals for its one run: a next
    in-process run must start as a fresh process would."""
    from k26ops import interrupt
    from k26ops.cli import jsonout
    from k26ops.engine import secret_policy
    from k26ops.steps import release

    interrupt.requested.clear()
    secret_policy.set_secret_policy()
    jsonout.CURRENT["command"] = ""
    release._PREP.clear()
    release._FLAGS.clear()


def cli_json(*args: str, **kw) -> tuple[int, dict]:
    """`k26ops_json` in this process (see `cli`)."""
    return k26ops_json(*args, run=cli, **kw)


def k26ops_json(*args: str, run=None, **kw) -> tuple[int, dict]:
    proc = (run or k26ops)("--json", *args, **kw)
    try:
        doc = json.loads(proc.stdout)
    except json.JSONDecodeError:
        raise AssertionError(f"not JSON (rc {proc.returncode}): {proc.stdout!r} {proc.stderr!r}")
    from jsonshape import validate

    validate(doc)  # every command's --json has one shape (docs/json)
    assert doc["exit_code"] == proc.returncode, (doc["exit_code"], proc.returncode)
    return proc.returncode, doc


LAB_RECIPE = REPO / "playbooks/recipes/lab.yml"


def lab_base() -> str:
    """The lab recipe's engine base (sglang@<the lab fixture's commit>)."""
    from k26ops.release import recipe

    return recipe.load("lab").base


def harmless_patch(note: str) -> str:
    """A patch for the lab base that adds a comment line to sglang/version.py."""
    import sglang_release

    first = (sglang_release.site_packages() / "sglang/version.py").read_text().splitlines()[0]
    return (
        f"Base: {lab_base()} (k26ops lab fixture)\n{note}\n"
        "--- a/sglang/version.py\n+++ b/sglang/version.py\n"
        f"@@ -1,1 +1,2 @@\n {first}\n+# k26ops {note}\n"
    )


def write_series(path: Path, lines: list[str]) -> Path:
    """A series file for the lab base: its `# Base:` line, the lab series' own
    active patch (by absolute path, as line 2), then `lines`."""
    from k26ops.release import recipe

    shipped = recipe.load("lab").series
    marker = shipped.parent / "lab-series-marker.patch"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(f"# Base: {lab_base()}\n{marker}\n" + "".join(line + "\n" for line in lines))
    return path


def lab_recipe_copy(path: Path, series: Path | None = None) -> Path:
    """The lab recipe written elsewhere with a copy of its lock beside it (a recipe's lock
    path stays in its directory; same name and bytes: the same release), optionally
    another series."""
    import yaml

    doc = yaml.safe_load(LAB_RECIPE.read_text())
    lock = LAB_RECIPE.with_suffix(".lock")
    path.parent.mkdir(parents=True, exist_ok=True)
    (path.parent / lock.name).write_bytes(lock.read_bytes())
    doc["engine"]["lock"] = lock.name
    if series is not None:
        doc["patches"]["series"] = str(series)
    path.parent.mkdir(parents=True, exist_ok=True)
    for section, key in (("rehearsal", "model_config"), ("rehearsal", "draft_config"), ("model", "manifest")):
        rel = (doc.get(section) or {}).get(key)  # rehearsal configs and the model manifest: beside the recipe
        if rel:
            (path.parent / rel).parent.mkdir(parents=True, exist_ok=True)
            (path.parent / rel).write_bytes((LAB_RECIPE.parent / rel).read_bytes())
    path.write_text(yaml.safe_dump(doc))
    return path


def recipe_with_extra_patch(d: Path, label: str) -> Path:
    """The lab recipe plus one harmless patch (a comment line in
    sglang/version.py): a second, different release of the same engine."""
    series = d / "patches" / "series"
    series.parent.mkdir(parents=True)
    (series.parent / f"{label}.patch").write_text(harmless_patch(f"{label} patch"))
    write_series(series, [f"{label}.patch"])
    return lab_recipe_copy(d / "changed.yml", series)


def lab_kernel_log(tmp_path: Path, name: str, at: float, command: str | None = None) -> str:
    """What `command` (default `journalctl -k -o short-iso`) prints on a lab host whose
    journalctl stand-in replays recorded kernel log tests/data/facts/`name` stamped `at`
    (the stand-ins run here as programs: k26ops/lab/fixtures on PATH, the lab's nvidia-smi)."""
    fixtures = REPO / "k26ops" / "lab" / "fixtures"
    log = tmp_path / name
    log.write_bytes((REPO / "tests" / "data" / "facts" / name).read_bytes())
    os.utime(log, (at, at))
    env = {k: v for k, v in os.environ.items() if not k.startswith("K26OPS_LAB_")}
    env.update(PATH=f"{fixtures}:{env['PATH']}", K26OPS_LAB_KERNEL_LOG=str(log))
    cmd = (command or "journalctl -k -o short-iso").replace("journalctl", str(fixtures / "journalctl"))
    p = subprocess.run(["sh", "-c", cmd], capture_output=True, text=True, env=env, timeout=30)
    return p.stdout + p.stderr


def lab_bus_ids() -> str:
    """The lab nvidia-smi's `--query-gpu=index,pci.bus_id --format=csv,noheader`."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("K26OPS_LAB_")}
    p = subprocess.run(
        [
            str(REPO / "k26ops" / "lab" / "fixtures" / "nvidia-smi"),
            "--query-gpu=index,pci.bus_id",
            "--format=csv,noheader",
        ],
        capture_output=True,
        text=True,
        timeout=30,
        env=env,
    )
    return p.stdout


# ---------------------------------------------------------------- shared by test modules (issue 32 item 6:
# no test module imports another; these were in test_engine_source, test_lab_engine_standin, test_fleet)

import http.client  # noqa: E402
import time  # noqa: E402

import yaml  # noqa: E402

from k26ops.engine import launch  # noqa: E402

# Hostile path values: each would run `touch` if it reached a shell unquoted.
HOSTILE = [
    "/tmp/a b",
    "/tmp/it's",
    '/tmp/"q"',
    "/tmp/$(touch /tmp/PWNED1)",
    "/tmp/x; touch /tmp/PWNED2",
    "/tmp/`touch /tmp/PWNED3`",
    "/tmp/line\ntouch /tmp/PWNED4",
    "/tmp/$HOME|touch /tmp/PWNED5",
]


def git(repo: Path, *args: str) -> str:
    """git with a fixed author and date: the same files make the same commit (a build
    cache keyed by commit then serves every test that makes that engine)."""
    env = {
        **os.environ,
        "GIT_AUTHOR_DATE": "2026-01-01T00:00:00+0000",
        "GIT_COMMITTER_DATE": "2026-01-01T00:00:00+0000",
    }
    return subprocess.run(
        ["git", "-C", str(repo), "-c", "user.name=t", "-c", "user.email=t@t.invalid", *args],
        check=True,
        capture_output=True,
        text=True,
        env=env,
    ).stdout.strip()


def tiny_engine(
    tmp_path: Path, version: str = "1.0", build_requires: str = '"setuptools>=61.0"', deps: str = '"tqdm"'
) -> tuple[Path, str]:
    """A tiny real Python project in a git repo (python/ subdir, like sglang's layout)."""
    repo = tmp_path / "engine-src"
    py = repo / "python"
    (py / "tinyengine").mkdir(parents=True, exist_ok=True)
    (py / "tinyengine/__init__.py").write_text(f'__version__ = "{version}"\n')
    (py / "pyproject.toml").write_text(
        f'[build-system]\nrequires = [{build_requires}]\nbuild-backend = "setuptools.build_meta"\n\n'
        f'[project]\nname = "tinyengine"\nversion = "{version}"\ndependencies = [{deps}]\n'
    )
    if not (repo / ".git").exists():
        subprocess.run(["git", "init", "-q", "-b", "main", str(repo)], check=True)
    git(repo, "add", "-A")
    git(repo, "commit", "-q", "-m", f"v{version}")
    return repo, git(repo, "rev-parse", "HEAD")


def recipe_for(tmp_path: Path, url: str, commit: str) -> Path:
    """A git-source recipe in a directory of its own (its series says its base)."""
    d = tmp_path / "recipes"
    (d / "patches").mkdir(parents=True, exist_ok=True)
    (d / "patches/series").write_text(f"# Base: sglang@{commit}\n")
    doc = yaml.safe_load((REPO / "playbooks/recipes/lab.yml").read_text())
    doc["name"] = "mine"
    doc.pop("rehearsal", None)  # its config files live beside the shipped recipes
    doc["engine"] = {
        "source": {"git": url, "commit": commit, "subdir": "python", "ref": "refs/heads/main"},
        "python": "3.11",
        "lock": "mine.lock",
    }
    doc["patches"]["series"] = str(d / "patches/series")
    text = "# my recipe\n" + yaml.safe_dump(doc, sort_keys=False)
    (d / "mine.yml").write_text(text)
    return d / "mine.yml"


STANDIN = REPO / "k26ops/lab/fixtures/engine_standin.py"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Standin:
    def __init__(self, tmp: Path, *flags: str, env: dict | None = None, python: str = sys.executable, **profile):
        self.port = free_port()
        self.out, self.err = tmp / f"out-{self.port}.log", tmp / f"err-{self.port}.log"
        argv = launch.engine_argv(
            {
                "python": python,
                "model_path": "/models/Kimi-K2.6",
                "draft_model_path": "/models/draft",
                "speculative_ddtree_budget": 32,
                "speculative_dflash_block_size": 8,
                "cuda_graph_max_bs_decode": 8,
                "port": self.port,
                "extra_args": list(flags),
                **profile,
            }
        )
        argv[1:3] = [str(STANDIN)]  # the lab runs it as a module; here as a script
        full_env = {
            "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
            "K26OPS_STANDIN_LOAD_SECONDS": "0.2",
            "SGLANG_CACHE_DIR": str(tmp / "engine-cache"),
            **(env or {}),
        }
        with open(self.out, "w") as o, open(self.err, "w") as e:
            self.proc = subprocess.Popen(argv, stdout=o, stderr=e, env=full_env, stdin=subprocess.DEVNULL)

    def request(self, method: str, path: str, body: dict | None = None, timeout: float = 5):
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=timeout)
        try:
            conn.request(
                method,
                path,
                body=json.dumps(body) if body is not None else None,
                headers={"Content-Type": "application/json"},
            )
            resp = conn.getresponse()
            data = resp.read()
            return resp.status, (json.loads(data) if data and data[:1] in b"{[" else data.decode())
        finally:
            conn.close()

    def status(self, path: str = "/health") -> int | None:
        try:
            return self.request("GET", path, timeout=2)[0]
        except OSError:
            return None

    def wait_ready(self, deadline: float = 15) -> list[int | None]:
        seen, end = [], time.monotonic() + deadline
        while time.monotonic() < end:
            code = self.status()
            seen.append(code)
            if code == 200:
                return seen
            if self.proc.poll() is not None:
                raise AssertionError(f"exited {self.proc.returncode}: {self.err.read_text()}")
            time.sleep(0.05)
        raise AssertionError(f"not ready in {deadline}s: {seen[-5:]}")

    def wait_exit(self, timeout: float = 15) -> int:
        return self.proc.wait(timeout=timeout)

    def stop(self):
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(timeout=10)


@functools.cache
def _parsed(path: str, mtime_ns: int, size: int) -> ast.Module:
    return ast.parse(Path(path).read_text(), filename=path)


def parsed(path: Path) -> ast.Module:
    """`path` parsed, once per run for the same file contents (keyed by mtime and size):
    five test modules walk every module of k26ops/ (~0.3 CPU-s a parse). The tree is
    shared: read it (ast.walk, a NodeVisitor), never change it."""
    st = Path(path).stat()
    return _parsed(str(path), st.st_mtime_ns, st.st_size)


# -- private labs: booted by the `lab`/`scratch_lab` fixtures (conftest.py) and by tests that
# need their own hosts; conftest marks a test that calls private_lab(...) `lab`.


class RunningLab:
    def __init__(self, directory: Path, count: int, deployed: bool = False):
        from k26ops.lab.machines import Lab

        self.lab = Lab(directory)
        self.dir = directory
        self.base_port = free_port_block(count)
        self.hosts = self.lab.up(count, self.base_port, log=lambda m: None, deployed=deployed)
        self.inventory = directory / "inventory.yml"

    def env(self) -> dict:
        return {"K26OPS_INVENTORY": str(self.inventory), "K26OPS_LAB_DIR": str(self.dir)}

    def port(self, name: str) -> int:
        return next(h.port for h in self.hosts if h.name == name)

    def ssh(self, host: str, command: str, timeout: float = 60) -> str:
        """`command`'s stdout on lab host `host` (OpenSSH, the lab's key, strict host key
        checking); a non-zero exit fails the test. The one way tests run a command on a lab host."""
        proc = lab_ssh(self.dir, self.port(host), command, timeout=timeout)
        assert proc.returncode == 0, (host, command, proc.stdout, proc.stderr)
        return proc.stdout

    def down(self) -> None:
        self.lab.down()


@contextlib.contextmanager
def sglang_router(workdir: Path, *extra: str):
    """The real SGLang Model Gateway (PyPI sglang-router) on loopback, with an admin key for
    its worker API: {"url", "port", "key", "log"}; stopped (its process group) after the block."""
    import secrets
    import signal
    import time
    import urllib.request

    port, key, log = free_port(), secrets.token_hex(12), workdir / "router.log"
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_ENDPOINT": "http://127.0.0.1:9"}  # loopback only
    with open(log, "w") as out:
        p = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "sglang_router.launch_router",
                "--host",
                "127.0.0.1",
                "--port",
                str(port),
                "--prometheus-host",
                "127.0.0.1",
                "--prometheus-port",
                str(free_port()),
                "--log-level",
                "warn",
                "--control-plane-api-keys",
                f"t:test:admin:{key}",
                *extra,
            ],
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    try:
        end = time.monotonic() + 30
        while True:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2) as r:
                    if r.status == 200:
                        break
            except OSError:
                pass
            if time.monotonic() > end or p.poll() is not None:
                raise AssertionError(f"sglang-router did not answer /health: {log.read_text()[-2000:]}")
            time.sleep(0.1)
        yield {"url": f"http://127.0.0.1:{port}", "port": port, "key": key, "log": log}
    finally:
        if p.poll() is None:
            os.killpg(p.pid, signal.SIGKILL)
            p.wait(10)


@contextlib.contextmanager
def private_lab(count: int, tag: str, deployed: bool = False):
    """Boot a lab of `count` hosts for the duration of the block; always torn
    down (also on failure, Ctrl-C, or, through atexit, a dying interpreter).
    `deployed=True`: the hosts boot with the lab recipe already deployed and its
    engine serving (the cached deployed layer, k26ops/lab/deployed.py), for tests
    that need a converged host, not a first deploy; keep a bare host (the default)
    for what a first deploy does (wheel bytes, first-deploy faults, custom roots)."""
    if os.geteuid() != 0:
        pytest.fail("lab tests need root (systemd-nspawn); run the test suite as root")
    directory = Path(tempfile.mkdtemp(prefix=f"k26ops-{tag}-", dir="/var/tmp"))
    try:
        running = RunningLab(directory, count, deployed)  # a failed `up` stops what it started
    except BaseException:
        shutil.rmtree(directory, ignore_errors=True)
        raise

    def cleanup():
        running.down()
        shutil.rmtree(directory, ignore_errors=True)

    atexit.register(cleanup)
    try:
        yield running
    finally:
        cleanup()
        atexit.unregister(cleanup)


# -- the order xdist hands files out in (conftest.py, `make test`): the longest files first

LAB_FILE_GUESS = 60.0  # seconds assumed for a lab file with no record (most take 30 s to 5 min)


def file_order(nodeids: list[str], lab: set[str], seconds: dict[str, float]) -> list[int]:
    """The tests' indexes in run order: the files that took longest last time (`seconds`,
    per file) first, a lab file with no record counted as LAB_FILE_GUESS (so a fresh
    checkout starts with the lab files) and any other as 0. The quick files then fill the
    workers' last minutes, instead of one worker starting a 5-minute lab file while the
    other has run out of work. A file's tests keep their order; ties keep collection order."""
    paths = [n.split("::")[0] for n in nodeids]
    first = {}
    for i, path in enumerate(paths):
        first.setdefault(path, i)

    def key(i):
        path = paths[i]
        return (-seconds.get(path, LAB_FILE_GUESS if path in lab else 0.0), path not in lab, first[path])

    return sorted(range(len(paths)), key=key)  # stable: a file's tests stay in order


def whole_file_seconds(run: dict[str, float], args: list[str], selected: bool) -> dict[str, float]:
    """What a run may keep for file_order: each file's seconds, for whole files only. Nothing
    after a -k or -m selection (`selected`: parts of files ran), and no file named as
    FILE::TEST on the command line."""
    if selected:
        return {}
    parts = {arg.split("::")[0] for arg in args if "::" in arg}
    return {
        path: round(sec, 1)
        for path, sec in run.items()
        if not any(path == p or p.endswith("/" + path) or path.endswith(p) for p in parts)
    }


# --- The HTML report in a real browser (Debian's chromium, headless) --------------------------

CHROMIUM_FLAGS = (
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
    "--hide-scrollbars",
)
# Injected into a copy of the page (the report itself has no script): what the browser laid out.
_MEASURE = """<script>
const charts = [...document.querySelectorAll('figure[data-chart]')].map(f => {
  const svg = f.querySelector('svg'); const box = svg.getBoundingClientRect();
  const drawn = [...svg.querySelectorAll('path,use,rect')].filter(e => {
    const b = e.getBoundingClientRect(); return b.width > 0 || b.height > 0; }).length;
  return {name: f.dataset.chart, width: box.width, height: box.height, drawn: drawn,
          text: svg.textContent};
});
const pre = document.createElement('pre'); pre.id = 'k26-measure';
pre.textContent = JSON.stringify({charts: charts, scroll_width: document.documentElement.scrollWidth,
                                  inner_width: window.innerWidth});
document.body.appendChild(pre);
</script>"""


def chromium() -> str | None:
    return shutil.which("chromium") or shutil.which("chromium-browser")


def browse(page: Path, work: Path, width: int = 1000, height: int = 2400, phone: bool = False) -> tuple[dict, Path]:
    """Open `page` in headless Chromium at width x height (a fresh profile, no network):
    (what it laid out: each chart's size and drawn elements, the page's scroll width;
    a screenshot PNG of the page as it is, without the measuring script).
    phone: headless Chromium's window is at least 500 px wide, so the page is laid out in
    a frame of `width` px inside a wider window (as a phone's browser would show it)."""
    exe = chromium()
    if not exe:
        pytest.skip("chromium is not installed (Debian package `chromium`; `make system-deps` installs it)")
    work.mkdir(parents=True, exist_ok=True)
    measured = work / f"measured-{width}.html"
    measured.write_text(page.read_text().replace("</body>", _MEASURE + "</body>"))

    def run(*args: str) -> subprocess.CompletedProcess:
        profile = tempfile.mkdtemp(prefix="chromium-", dir=work)
        cmd = [exe, *CHROMIUM_FLAGS, f"--user-data-dir={profile}", f"--window-size={width},{height}", *args]
        return subprocess.run(cmd, capture_output=True, text=True, timeout=120, env={**os.environ, "HOME": profile})

    target, shown = measured, page
    if phone:
        frame = (
            '<!DOCTYPE html><html><body style="margin:0">'
            f'<iframe id="f" src="{{}}" style="width:{width}px;height:{height}px;border:0"></iframe>'
            "<script>addEventListener('load', () => document.body.appendChild("
            "document.importNode(frames[0].document.getElementById('k26-measure'), true)));</script>"
            "</body></html>"
        )
        target, shown = work / "phone-measured.html", work / "phone.html"
        target.write_text(frame.format(measured.name))
        shown.write_text(frame.format(page.as_uri()).replace("<script>", "<!--").replace("</script>", "-->"))
        width = max(width, 500)
    proc = run("--allow-file-access-from-files", "--virtual-time-budget=5000", "--dump-dom", target.as_uri())
    import html as html_mod
    import re

    m = re.search(r'<pre id="k26-measure">(.*?)</pre>', proc.stdout, re.S)
    assert m, f"chromium ran no layout (rc {proc.returncode}): {proc.stderr[-2000:]}"
    shot = work / f"screenshot-{width}.png"
    proc = run(f"--screenshot={shot}", shown.as_uri())
    assert shot.exists(), f"chromium wrote no screenshot (rc {proc.returncode}): {proc.stderr[-2000:]}"
    return json.loads(html_mod.unescape(m.group(1))), shot


def colour_pixels(png: Path, rgb: tuple[int, int, int], tol: int = 12) -> int:
    """How many pixels of the screenshot are within `tol` of colour `rgb`."""
    from PIL import Image

    img = Image.open(png).convert("RGB")
    colours = img.getcolors(maxcolors=img.width * img.height)
    return sum(n for n, px in colours if all(abs(a - b) <= tol for a, b in zip(px, rgb)))
