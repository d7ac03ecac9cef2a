"""Shared fixtures. `lab` is a real lab of nspawn hosts, booted once per test
session and always torn down (also on failure or Ctrl-C)."""

from __future__ import annotations

import atexit
import functools
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

import pytest

from labtools.labs import private_lab
from labtools.order import file_order, whole_file_seconds

LAB_HOSTS = int(os.environ.get("K26OPS_TEST_LAB_HOSTS", "3"))
# Tests never read the operator's own ~/.config/k26ops/config.toml (k26ops.config);
# tests of the config file point K26OPS_CONFIG at their own.
os.environ["K26OPS_CONFIG"] = os.devnull
# ... nor the lab directory the operator's last `lab up` remembered (k26ops.cli.context.default_lab_dir).
os.environ["XDG_STATE_HOME"] = tempfile.mkdtemp(prefix="k26ops-test-state-")
atexit.register(shutil.rmtree, os.environ["XDG_STATE_HOME"], True)


def _bytecode_outside_the_checkout() -> None:
    """Keep compiled test modules (pytest's assertion rewrite) and k26ops' bytecode between
    runs, in a cache outside the checkout: with PYTHONDONTWRITEBYTECODE=1 (set here) every
    run rewrote and compiled ~100 test modules and the package from source (~4 CPU-s of a
    ~6 s collection). This overrides that variable for the test run only, writing under
    ~/.cache/k26ops/test/pycache (sys.pycache_prefix: no __pycache__ in the checkout); the
    pyc files are checked against each source's mtime and size as usual. This process only:
    a child Python given the prefix looks there for the standard library's bytecode too, and
    under PYTHONDONTWRITEBYTECODE compiles all of it at each start (measured: +30 CPU-s a run).
    K26OPS_TEST_PYCACHE=0 turns it off."""
    if os.environ.get("K26OPS_TEST_PYCACHE", "1") == "0" or sys.pycache_prefix:
        return
    from sglang_release import CACHE

    prefix = str(CACHE / "pycache")
    sys.pycache_prefix = prefix
    sys.dont_write_bytecode = False


_bytecode_outside_the_checkout()


def pytest_sessionstart(session):
    """Remove lab dirs that killed test runs left in /var/tmp: their hosts are
    gone, but their overlays hold what the hosts installed (GBs: CUDA wheels)."""
    from k26ops.lab.machines import Lab, _is_ours

    for d in Path("/var/tmp").glob("k26ops-*-*"):
        state = d / "lab.json"
        if not d.is_dir() or not state.exists() or time.time() - state.stat().st_mtime < 600:
            continue
        try:
            if not any(_is_ours(h) for h in Lab(d).hosts()):
                shutil.rmtree(d, ignore_errors=True)
        except (OSError, ValueError, TypeError):
            continue


@pytest.fixture(scope="session")
def lab():
    """A shared lab (3 hosts). Tests must leave its hosts as they found them: the lab
    recipe's release current (toolchain, wheelhouse, store), no engine unit, env file
    or pins. It boots on the deployed layer and drops the layer's unit, env file and
    pins: the state its modules expect and leave, without the first deploy (toolkit and
    release, 25-50 s a host) that the first module using each host paid every run."""
    with private_lab(LAB_HOSTS, "lab", deployed=True) as running:
        _no_engine_unit(running)
        yield running
        _warn_failed_units(running)


def _no_engine_unit(running) -> None:
    """Stop and remove the deployed layer's engine unit, env file and pins on every host
    (the layer's releases, toolchain and wheelhouse stay)."""
    from k26ops.engine.units import ENV_FILE
    from k26ops.layout import DEFAULT_UNIT, UNIT_DIR, Layout
    from labtools.invoke import lab_ssh

    cmd = (
        f"systemctl disable --now {DEFAULT_UNIT} && rm -f {UNIT_DIR}/{DEFAULT_UNIT} {ENV_FILE} "
        f"{Layout().pins_file} && systemctl daemon-reload && systemctl reset-failed; "
        f"test ! -e {UNIT_DIR}/{DEFAULT_UNIT} && test -L {Layout().current}"
    )
    for h in running.hosts:
        res = lab_ssh(running.dir, h.port, cmd, timeout=60)
        assert res.returncode == 0, (h.name, res.stdout, res.stderr)


def _warn_failed_units(running) -> None:
    """Say which units the tests left failed on the shared lab (a hint for
    whoever sees a later test trip over one); never fails the run."""
    import warnings

    from labtools.invoke import lab_ssh

    for h in running.hosts:
        res = lab_ssh(running.dir, h.port, "systemctl --failed --no-legend --plain", timeout=20)
        if res.stdout.strip():
            warnings.warn(f"shared lab {h.name}: units left failed: {res.stdout.strip()}")


@pytest.fixture
def scratch_lab():
    """A private 1-host lab for tests that break their host."""
    with private_lab(1, "scratch") as running:
        yield running


# ---------------------------------------------------------------- the `lab` mark, applied by the rule

LAB_FIXTURES = {"lab", "scratch_lab"}


def _needs_lab(item) -> bool:
    """A test needs the lab when it uses a lab fixture, or a fixture (or its own body)
    that boots a private one (private_lab(...)), at any depth of its fixture closure."""
    if LAB_FIXTURES & set(getattr(item, "fixturenames", ())):
        return True
    funcs = [getattr(item, "function", None)]
    info = getattr(item, "_fixtureinfo", None)
    for defs in info.name2fixturedefs.values() if info else ():
        funcs += [d.func for d in defs]
    return any(fn is not None and _boots_a_lab(fn) for fn in funcs)


@functools.cache
def _boots_a_lab(fn) -> bool:
    """Does `fn`'s source boot a private lab? (Once per function: the same fixtures
    come back for most of the ~1300 items; getsource re-tokenizes each time.)"""
    import inspect

    try:
        src = inspect.getsource(fn)
    except (OSError, TypeError):
        return False
    # a private lab through the fixture helper, or the lab machinery booted by hand (Lab(...).up)
    return "private_lab(" in src or ("Lab(" in src and ".up(" in src)


def pytest_collection_finish(session):
    """What collection made (every test module, k26ops, torch for test_probe_patch: ~1M
    objects) lives to the end of the run: frozen out of the collector's sight, the
    gen-2 collections during the tests and pytest's five at the end each scan only
    what the tests made (measured: 5.7 CPU-s of GC a run before)."""
    import gc

    gc.collect()
    gc.freeze()


def pytest_collection_modifyitems(config, items):
    """`pytest -m "not lab"` runs every test that needs no nspawn host (the inner loop),
    less the outer-loop tests (OUTER_FIXTURES): they are marked `outer` and `lab`."""
    for item in items:
        if _needs_lab(item):
            item.add_marker(pytest.mark.lab)
        if OUTER_FIXTURES & set(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.outer)
            item.add_marker(pytest.mark.lab)
    if hasattr(config, "workerinput"):
        items[:] = _longest_files_first(config, items)


# ---------------------------------------------------------------- xdist: the longest files first

FILE_SECONDS = "k26ops/file_seconds"  # pytest's cache: the seconds each test file took in its last run


def _longest_files_first(config, items):
    """On xdist workers (`make test`: -n 2 --dist loadfile --no-loadscope-reorder, so the
    controller hands out files in this order): labtools.order.file_order. Every worker computes
    the same order from the same cache file (written only by the controller, at the end of
    a run), as xdist requires."""
    seconds = config.cache.get(FILE_SECONDS, {}) if getattr(config, "cache", None) else {}
    lab = {item.nodeid.split("::")[0] for item in items if item.get_closest_marker("lab")}
    return [items[i] for i in file_order([item.nodeid for item in items], lab, seconds)]


_RUN_SECONDS: dict[str, float] = {}


def pytest_runtest_logreport(report):
    """Each file's seconds (setup, call, teardown of its tests), summed where the reports end
    up: in the controller under xdist, in the one process otherwise."""
    path = report.nodeid.split("::")[0]
    _RUN_SECONDS[path] = _RUN_SECONDS.get(path, 0.0) + report.duration


def pytest_sessionfinish(session):
    """Keep this run's file seconds for the next run's order (files not run keep theirs)."""
    config = session.config
    if hasattr(config, "workerinput") or not getattr(config, "cache", None):
        return
    whole = whole_file_seconds(_RUN_SECONDS, config.args, bool(config.option.keyword or config.option.markexpr))
    if whole:
        config.cache.set(FILE_SECONDS, {**config.cache.get(FILE_SECONDS, {}), **whole})


# ---------------------------------------------------------------- the outer loop (issue 32): no host, but heavy

# A test that uses one of these runs in the full suite and in `-m outer`, not in `-m "not lab"`
# (tests/README.md lists them and why). They do nothing: using one is the mark.
OUTER_FIXTURES = {"real_index", "full_size"}


@pytest.fixture(scope="session")
def real_index():
    """The test builds a real package with pip or resolves a large closure against the
    real package index (seconds of pip and network each, however small the package)."""


@pytest.fixture(scope="session")
def full_size():
    """The test measures a bound at the input size limit (tens of CPU-seconds)."""
