"""A first deploy on each OS the README names (issue 45 item 1): a recipe locks for several
pythons (one lock each), `check` reports what the release step would refuse (the lock's
python, wheel platform and CUDA runtime against the host), and a recipe shipped in an
installed wheel is locked into the operator's recipes dir, never into site-packages.

Pure parts read the real platform output recorded on Debian 12 and the shipped recipe and
locks; the lab test runs `check` and `deploy --check` on a lab host (Debian 12, python 3.11)."""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

import pytest
import yaml

sys.path.insert(0, str(Path(__file__).parent.parent))
from k26ops import resources  # noqa: E402
from k26ops.engine.profile import lock_for  # noqa: E402
from k26ops.errors import UserError  # noqa: E402
from k26ops.facts.platform import parse_platform, wheel_platform_problem  # noqa: E402
from k26ops.host import preflight  # noqa: E402
from k26ops.release import recipe as rc  # noqa: E402
from labtools.invoke import cli, k26ops_json

DATA = Path(__file__).parent.parent / "data" / "facts"
PROD = "k26-tp8-dflash-0.5.23"
CC12 = {"gpus": [{"compute_cap": "12.0"}] * 8}


def _facts(py="3.11.2", glibc=(2, 36), machine="x86_64", gpus=CC12) -> dict:
    return {
        "python3": {"version": py},
        "gpus": gpus,
        "platform": {"libc": "glibc", "version": list(glibc), "machine": machine, "error": None},
    }


def test_platform_fact_on_the_recorded_debian12_output():
    got = parse_platform((DATA / "debian12-platform.txt").read_text(), 0)
    assert got == {"libc": "glibc", "version": [2, 36], "machine": "x86_64", "error": None}
    # Alpine's getconf knows no GNU_LIBC_VERSION: no glibc, manylinux wheels do not install
    musl = parse_platform("getconf: GNU_LIBC_VERSION: unknown variable\nx86_64\n", 0)
    assert musl["libc"] is None and musl["error"].startswith("no glibc")
    line = "cp311 manylinux_2_35 x86_64"
    assert wheel_platform_problem(got, line) is None
    assert wheel_platform_problem({**got, "version": [2, 31]}, line) == (
        "the lock's wheels are manylinux_2_35 (glibc 2.35+), this host has glibc 2.31"
    )
    assert wheel_platform_problem({**got, "machine": "aarch64"}, line) == (
        "the lock's wheels are for x86_64, this host is aarch64"
    )
    assert "no glibc" in wheel_platform_problem(musl, line)
    assert wheel_platform_problem({**got, "version": [2, 17]}, "cp311 manylinux x86_64") is None  # older lock format


def test_the_shipped_registry_recipe_is_locked_for_debian12_and_ubuntu2404():
    r = rc.load(PROD)
    assert r.pythons == ("3.11", "3.12") and r.python == "3.12"
    for py in r.pythons:
        lock = lock_for(rc.for_python(r, py))
        assert lock.path.name == f"{PROD}.py{py}.lock"
        assert lock.meta["python"] == py and lock.meta["platform"] == f"cp{py.replace('.', '')} manylinux_2_35 x86_64"
        assert [v for n, v, _ in lock.entries if n == "sglang"] == ["0.5.23"]
    with pytest.raises(
        UserError,
        match=r"no engine lock for python 3\.10 \(engine\.python lists 3\.11, 3\.12\): "
        r"add \"3\.10\" .*`k26ops engine lock k26-tp8-dflash-0\.5\.23 --python 3\.10`",
    ):
        rc.for_python(r, "3.10")


def test_a_baselines_recorded_lock_keeps_its_name_for_the_hosts_python(tmp_path):
    """rollback writes the one lock a baseline recorded under its own name (engine.lock:
    NAME.py3.11.lock) beside the recorded recipe: a 3.11 host's rebuild finds that file."""
    doc = yaml.safe_load((rc.RECIPES_DIR / f"{PROD}.yml").read_text())
    doc["engine"]["lock"] = f"{PROD}.py3.11.lock"
    doc["patches"]["series"] = str(rc.load(PROD).series)
    (tmp_path / "recipe.yml").write_text(yaml.safe_dump(doc, sort_keys=False))
    shutil.copy(rc.RECIPES_DIR / f"{PROD}.py3.11.lock", tmp_path / f"{PROD}.py3.11.lock")
    r = rc.for_python(rc.load(tmp_path / "recipe.yml"), "3.11")
    assert r.lock_path == tmp_path / f"{PROD}.py3.11.lock" and lock_for(r).meta["python"] == "3.11"


def test_check_reports_what_the_release_step_would_refuse():
    hv = {"recipe": PROD}
    ok = preflight.lock_check(hv, _facts())
    assert ok.ok and ok.detail == (f"{PROD}.py3.11.lock: python 3.11, cp311 manylinux_2_35 x86_64, CUDA 13 runtime")
    assert preflight.lock_check(hv, _facts(py="3.12.3")).detail.startswith(f"{PROD}.py3.12.lock: python 3.12")
    # Ubuntu 22.04: python 3.10 (sglang 0.5.23 publishes no cp310 wheel), glibc 2.35
    c = preflight.lock_check(hv, _facts(py="3.10.12", glibc=(2, 35)))
    assert not c.ok and "no engine lock for python 3.10" in c.detail and "\n" not in c.detail
    c = preflight.lock_check(hv, _facts(glibc=(2, 31)))
    assert not c.ok and c.detail == (
        f"{PROD}.py3.11.lock: the lock's wheels are manylinux_2_35 (glibc 2.35+), this host has glibc 2.31"
    )
    c = preflight.lock_check(hv, _facts(gpus={"gpus": [{"compute_cap": "7.0"}, {"compute_cap": "9.0"}]}))
    assert not c.ok and c.detail == (
        f"{PROD}.py3.11.lock: the CUDA 13 runtime runs on compute capability 7.5 and newer, this host's GPUs are 7.0"
    )
    # a recipe of one python: the deploy's own message, with the command that adds this host's python
    c = preflight.lock_check({"recipe": "lab-registry"}, _facts(py="3.12.3"))
    assert not c.ok and c.detail == (
        "the engine lock lab-registry.lock is for python 3.11, this host has python "
        '3.12: list "3.12" in lab-registry.yml\'s engine.python and run '
        "`k26ops engine lock lab-registry --python 3.12`"
    )


def test_check_reports_a_launch_rule_the_deploy_refuses():
    hv = {"recipe": PROD, "model_path": "/models/Kimi-K2.6"}
    ok = preflight.launch_check(hv)
    assert ok.ok, ok
    bad = preflight.launch_check({**hv, "extra_flags": ["--pipeline-parallel-size", "2"]})
    assert not bad.ok and bad.detail.startswith("pp-size-1: ") and "\n" not in bad.detail, bad


def test_check_refuses_the_inventory_values_deploy_refuses_before_any_host(tmp_path):
    """The example inventory names unreachable addresses: exit 2 proves no host was contacted."""
    doc = yaml.safe_load((Path(__file__).parent.parent.parent / "inventory/example-rtxpro6000.yml").read_text())
    doc["vars"]["release_installer"] = "conda"
    inv = tmp_path / "inv.yml"
    inv.write_text(yaml.safe_dump(doc))
    for args in (("check",), ("deploy", "--check")):
        proc = cli("-i", str(inv), *args)
        assert proc.returncode == 2 and proc.stderr.count("\n") == 1 and proc.stdout == "", (args, proc.stderr)
        assert "inventory var release_installer: 'conda': choose one of uv, pip" in proc.stderr


def test_a_recipe_name_is_the_operators_before_the_shipped_one(tmp_path, monkeypatch):
    mine = tmp_path / "recipes"
    mine.mkdir()
    monkeypatch.setenv("K26OPS_RECIPES", str(mine))
    assert rc.resolve(PROD) == rc.RECIPES_DIR / f"{PROD}.yml"
    shutil.copy(rc.RECIPES_DIR / f"{PROD}.yml", mine / f"{PROD}.yml")
    assert rc.resolve(PROD) == mine / f"{PROD}.yml"
    r = rc.load(PROD)
    assert r.lock_path == mine / f"{PROD}.py3.12.lock"
    with pytest.raises(UserError, match=r"py3\.12\.lock is missing\).*commit it beside the recipe"):
        lock_for(r)


def test_a_wheel_install_never_asks_to_write_into_site_packages(tmp_path, monkeypatch):
    """Installed from a wheel, the shipped recipes are read-only package data: the refusal and
    `engine lock` both point at the recipes dir, which then holds the recipe and its lock."""
    mine = tmp_path / "recipes"
    monkeypatch.setenv("K26OPS_RECIPES", str(mine))
    monkeypatch.setattr(resources, "installed", lambda: True)
    shipped = tmp_path / "site-packages" / "recipes"
    shipped.mkdir(parents=True)
    for f in ("lab-registry.yml",):  # a shipped recipe whose lock the wheel lacks
        shutil.copy(rc.RECIPES_DIR / f, shipped / f)
    monkeypatch.setattr(rc, "RECIPES_DIR", shipped)
    r = rc.load("lab-registry")
    assert rc.shipped(r.source)
    with pytest.raises(UserError) as ei:
        lock_for(r)
    msg = str(ei.value)
    assert "`k26ops engine lock lab-registry` on a control node" in msg and f"recipes dir ({mine})" in msg
    assert "commit it beside" not in msg and "\n" not in msg


def test_engine_lock_writes_the_recipe_and_its_lock_to_the_recipes_dir_or_out(tmp_path, monkeypatch, real_index):
    mine = tmp_path / "recipes"
    monkeypatch.setenv("K26OPS_RECIPES", str(mine))
    monkeypatch.setattr(resources, "installed", lambda: True)  # the shipped recipes are package data
    proc = cli("engine", "lock", "lab-registry", timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert sorted(p.name for p in mine.iterdir()) == ["lab-registry.lock", "lab-registry.yml"]
    assert (mine / "lab-registry.lock").read_bytes() == (rc.RECIPES_DIR / "lab-registry.lock").read_bytes()
    assert rc.resolve("lab-registry") == mine / "lab-registry.yml"  # the deploy's recipe NAME finds them
    monkeypatch.undo()
    out = tmp_path / "fleet-recipes"
    proc = cli("engine", "lock", "lab-registry", "--out", str(out), timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert (out / "lab-registry.yml").read_text() == (rc.RECIPES_DIR / "lab-registry.yml").read_text()
    assert (out / "lab-registry.lock").read_bytes() == (rc.RECIPES_DIR / "lab-registry.lock").read_bytes()
    assert proc.stdout.strip().endswith("written")
    assert lock_for(rc.load(out / "lab-registry.yml")).path == out / "lab-registry.lock"
    # a different recipe of that name already there is not overwritten
    (out / "lab-registry.yml").write_text((out / "lab-registry.yml").read_text() + "# mine\n")
    proc = cli("engine", "lock", "lab-registry", "--out", str(out), timeout=300)
    assert proc.returncode == 2 and "exists and differs" in proc.stderr and proc.stderr.count("\n") == 1


def _inv(lab, tmp_path, name: str, **vars) -> str:
    inv = yaml.safe_load(lab.inventory.read_text())
    inv["vars"].update(vars)
    p = tmp_path / f"{name}.yml"
    p.write_text(yaml.safe_dump(inv))
    return str(p)


def test_check_on_a_debian12_host_takes_the_shipped_registry_recipe(lab, tmp_path):
    """The lab's hosts are Debian 12 (python 3.11): the production registry recipe's 3.11 lock
    passes `check`; a copy locked for 3.12 only is refused by `check` itself in one line that
    says how to proceed, and `deploy --check` refuses it with the same words, changing nothing."""
    rc_, data = k26ops_json("-i", _inv(lab, tmp_path, "prod", recipe=PROD), "--limit", "lab1", "check", timeout=300)
    checks = {c["check"]: c for c in data["hosts"]["lab1"]["checks"]}
    assert checks["engine_lock"]["ok"], data["hosts"]["lab1"]
    assert checks["engine_lock"]["detail"].startswith(f"{PROD}.py3.11.lock: python 3.11, cp311 manylinux_2_35")
    assert rc_ == 0, data["hosts"]["lab1"]
    # and the deploy plans it: --check takes the engine wheel alone (flags, the series applied to its
    # files), not the 207 locked wheels (GBs of torch and CUDA) that only the build needs
    rc_, data = k26ops_json(
        "-i", _inv(lab, tmp_path, "prod2", recipe=PROD), "--limit", "lab1", "deploy", "--check", timeout=600
    )
    assert rc_ == 0, data["hosts"]["lab1"]
    release = next(st for st in data["hosts"]["lab1"]["steps"] if st["step"] == "release")
    assert any(c.startswith("build release sglang0.5.23-") for c in release["changes"]), release

    d = tmp_path / "only312"
    d.mkdir()
    doc = yaml.safe_load((rc.RECIPES_DIR / f"{PROD}.yml").read_text())
    doc["engine"]["python"] = "3.12"
    doc["patches"]["series"] = str(rc.load(PROD).series)
    (d / "p.yml").write_text(yaml.safe_dump(doc, sort_keys=False))
    shutil.copy(rc.RECIPES_DIR / f"{PROD}.py3.12.lock", d / "p.lock")
    inv = _inv(lab, tmp_path, "only312", recipe=str(d / "p.yml"))
    want = (
        'engine_lock: the engine lock p.lock is for python 3.12, this host has python 3.11: list "3.11" in '
        f"p.yml's engine.python and run `k26ops engine lock {d}/p.yml --python 3.11`"
    )
    rc_, data = k26ops_json("-i", inv, "--limit", "lab1", "check", timeout=300)
    assert rc_ == 1 and data["hosts"]["lab1"]["error"] == want, data["hosts"]["lab1"]
    rc_, data = k26ops_json("-i", inv, "--limit", "lab1", "deploy", "--check", timeout=300)
    assert rc_ == 1 and want.split(": ", 1)[1] in data["hosts"]["lab1"]["error"], data["hosts"]["lab1"]
