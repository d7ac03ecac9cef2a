"""Engine locks that do not depend on the control node: registry recipes locked
like git sources, resolved by uv for the recipe's target python and platform
whatever python runs `k26ops engine lock`, one wheel per package (the hosts'
pip's pick), the CUDA runtime wheels named in the header; a registry deploy
without its lock refuses before any host."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

sys.path.insert(0, str(Path(__file__).parent.parent))
from k26ops.errors import UserError  # noqa: E402
from k26ops.release import enginelock  # noqa: E402
from k26ops.release import recipe as rc  # noqa: E402
from k26ops.steps.release import lock_for  # noqa: E402
from labtools import REPO
from labtools.invoke import cli

REG = rc.RECIPES_DIR / "k26-tp8-dflash-0.5.23.yml"


def _registry_recipe(d: Path, src: Path = REG, **engine) -> Path:
    """A copy of a registry recipe in a directory of its own (series by absolute path;
    no rehearsal section: its config files live beside the shipped recipes)."""
    d.mkdir(parents=True, exist_ok=True)
    doc = yaml.safe_load(src.read_text())
    doc.pop("rehearsal", None)
    doc["patches"]["series"] = str(rc.load(src).series)
    doc["engine"].update(engine)
    p = d / "reg.yml"
    p.write_text(yaml.safe_dump(doc, sort_keys=False))
    return p


# --- pure: the header, the wheel the hosts' pip picks, what a lock belongs to -------------


def test_lock_header_lists_the_cuda_runtime_wheels_with_their_versions():
    entries = [
        ("torch", "2.14.1", "a" * 64),
        ("nvidia-cuda-runtime", "13.0.96", "b" * 64),
        ("nvidia_nvjitlink", "13.5.37", "c" * 64),
        ("nvidia-cudnn-cu13", "9.24.0.43", "d" * 64),
        ("nvidia-ml-py", "13.615.71", "e" * 64),
        ("nvidia-cudnn-frontend", "1.32.0", "f" * 64),
    ]
    r = rc.load(REG)
    text = enginelock.render("k26-tp8-dflash-0.5.23", enginelock.registry_meta(r), entries)
    lock = enginelock.parse(text, "x.lock")
    assert lock.meta["cuda runtime wheels"] == (
        "nvidia-cuda-runtime 13.0.96, nvidia-cudnn-cu13 9.24.0.43, nvidia-nvjitlink 13.5.37"
    )
    assert lock.meta["source"] == "registry" and lock.meta["engine"] == "sglang==0.5.23"
    assert lock.meta["platform"] == "cp312 manylinux_2_35 x86_64" and lock.commit == ""
    assert len(lock.entries) == 6
    # the shipped lock, made by the command: a review sees nvjitlink 13.5 beside the recipe's CUDA 13.0
    shipped = lock_for(r)
    assert r.toolkit.version == "13.0"
    cuda = dict(x.split(" ") for x in shipped.meta["cuda runtime wheels"].split(", "))
    assert cuda["nvidia-cuda-runtime"].startswith("13.0.") and cuda["nvidia-nvjitlink"].startswith("13.5.")
    assert {"nvidia-cuda-nvcc", "nvidia-nvvm"} <= set(cuda)
    names = {enginelock._norm(n): v for n, v, _ in shipped.entries}
    assert (names["sglang"], names["torch"], names["triton"], names["flashinfer-python"]) == (
        "0.5.23",
        "2.14.1",
        "3.8.0",
        "0.7.2",
    )
    assert len(shipped.entries) > 150  # the whole closure, not the four pins


def test_the_lock_keeps_the_one_wheel_the_hosts_pip_would_install():
    fns = [
        "cryptography-50.0.2-cp311-abi3-manylinux2014_x86_64.manylinux_2_17_x86_64.whl",
        "cryptography-50.0.2-cp311-abi3-manylinux_2_34_x86_64.whl",
        "cryptography-50.0.2-cp39-abi3-manylinux_2_34_x86_64.whl",
        "cryptography-50.0.2-cp311-abi3-manylinux_2_39_x86_64.whl",  # newer glibc than Ubuntu 22.04's
        "cryptography-50.0.2.tar.gz",
    ]
    assert enginelock.best_wheel(fns, "3.12") == "cryptography-50.0.2-cp311-abi3-manylinux_2_34_x86_64.whl"
    mp = [f"multiprocess-0.70.19-py3{m}-none-any.whl" for m in (9, 10, 11, 12)]
    assert enginelock.best_wheel(mp, "3.11") == "multiprocess-0.70.19-py311-none-any.whl"
    assert enginelock.best_wheel(mp, "3.12") == "multiprocess-0.70.19-py312-none-any.whl"
    cn = [
        "charset_normalizer-3.5.3-cp312-cp312-manylinux1_x86_64.manylinux_2_28_x86_64.manylinux_2_5_x86_64.whl",
        "charset_normalizer-3.5.3-cp37-abi3-manylinux1_x86_64.manylinux_2_28_x86_64.manylinux_2_5_x86_64.whl",
        "charset_normalizer-3.5.3-py3-none-any.whl",
    ]
    assert enginelock.best_wheel(cn, "3.12") == cn[0] and enginelock.best_wheel(cn, "3.11") == cn[1]
    assert (
        enginelock.best_wheel(
            ["sglang-0.5.23-cp312-cp312-manylinux_2_39_x86_64.whl", "x-1-cp312-cp312-macosx_11_0_arm64.whl"], "3.12"
        )
        is None
    )


def test_a_registry_lock_belongs_to_its_recipes_version_install_mode_and_pins(tmp_path):
    r = rc.load(REG)
    assert lock_for(r).meta["requirements"] == " ".join(r.requirements())
    moved = rc.parse(REG.read_text().replace('triton: "3.8.0"', 'triton: "3.8.1"'), REG)
    with pytest.raises(
        UserError,
        match=r"the lock's requirements is .*triton==3\.8\.0.*triton==3\.8\.1.*"
        r"k26ops engine lock",
    ):
        lock_for(moved)
    lab = rc.load("lab-registry")
    lk = lock_for(lab)
    assert lk.meta["install"] == "no-deps" and [e[0] for e in lk.entries] == ["sglang"]
    # the lock's hash is part of the release id: another locked set is another release
    a = rc.release_id(r, "1" * 64, [])
    assert a.startswith("sglang0.5.23-") and a != rc.release_id(r, "2" * 64, [])


def test_registry_deploy_without_its_lock_refuses_in_one_line_before_any_host(tmp_path):
    """The example inventory names unreachable addresses: exit 2 proves nothing was contacted."""
    recipe = _registry_recipe(tmp_path / "r")
    doc = yaml.safe_load((REPO / "inventory/example-rtxpro6000.yml").read_text())
    doc["vars"]["recipe"] = str(recipe)
    inv = tmp_path / "inv.yml"
    inv.write_text(yaml.safe_dump(doc))
    for args in (("deploy", "--check"), ("deploy",)):
        proc = cli("-i", str(inv), *args, timeout=60)
        assert proc.returncode == 2 and proc.stderr.count("\n") == 1 and proc.stdout == "", proc.stderr
        # the recipe lists 3.11 and 3.12: each python's lock is looked for, the first missing named
        assert f"no dependency lock for sglang==0.5.23 ({tmp_path}/r/reg.py3.11.lock is missing)" in proc.stderr
        assert f"k26ops engine lock {recipe}" in proc.stderr


# --- the resolver: the same lock whatever python the control node runs --------------------


def _python312() -> str | None:
    for cand in (shutil.which("python3.12"), *sorted(Path("/root/.pyenv/versions").glob("3.12*/bin/python3.12"))):
        if (
            cand
            and subprocess.run(
                [str(cand), "-c", "import sys; assert sys.version_info[:2] == (3, 12)"], capture_output=True
            ).returncode
            == 0
        ):
            return str(cand)
    uv = enginelock.uv_bin()
    found = subprocess.run([uv, "python", "find", "--no-python-downloads", "3.12"], capture_output=True, text=True)
    return found.stdout.strip() or None if found.returncode == 0 else None


@pytest.fixture(scope="module")
def control_node_312(tmp_path_factory):
    """A Python 3.12 control node: a venv with k26ops' own dependencies (from the index,
    through uv's cache), the same uv as this one; k26ops itself from the checkout."""
    if sys.version_info[:2] == (3, 12):
        pytest.skip("this test runs on a 3.11 control node and makes the 3.12 one")
    py = _python312()
    if py is None:
        pytest.skip("no Python 3.12 on this machine (uv python install 3.12 needs GitHub)")
    venv = tmp_path_factory.mktemp("cn312") / "venv"
    uv = enginelock.uv_bin()
    uv_version = subprocess.run([uv, "--version"], capture_output=True, text=True, check=True).stdout.split()[1]
    subprocess.run([uv, "venv", "-q", "--python", py, str(venv)], check=True)
    deps = [
        d
        for d in __import__("tomllib").loads((REPO / "pyproject.toml").read_text())["project"]["dependencies"]
        if not d.startswith("uv")
    ]
    proc = subprocess.run(
        [uv, "pip", "install", "-q", "--python", str(venv / "bin/python"), *deps, f"uv=={uv_version}"],
        capture_output=True,
        text=True,
        timeout=600,
    )
    if proc.returncode != 0:
        pytest.skip(f"cannot install k26ops' dependencies for python 3.12: {proc.stderr.strip()[-200:]}")
    return venv / "bin/python"


def test_engine_lock_is_byte_identical_from_311_and_312_control_nodes(tmp_path, control_node_312, real_index):
    """The full 0.5.23 closure for cp312 (the recipe's python) locked by a 3.11 and by a 3.12
    control node: the same file, byte for byte. pip's resolver gave 3 different versions
    (scipy, networkx, airportsdata): it evaluated markers for the interpreter running it."""
    recipe = _registry_recipe(tmp_path / "r")
    proc = cli("engine", "lock", str(recipe), timeout=300)  # this interpreter: 3.11
    assert proc.returncode == 0, proc.stderr
    lock = recipe.with_name("reg.py3.12.lock")  # the last python the recipe lists
    made_by_311 = lock.read_bytes()
    assert made_by_311.count(b"--hash=sha256:") == len(enginelock.load(lock).entries) > 150
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    proc = subprocess.run(
        [str(control_node_312), "-m", "k26ops", "--json", "engine", "lock", str(recipe)],
        capture_output=True,
        text=True,
        cwd=REPO,
        env=env,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr
    data = json.loads(proc.stdout)
    assert not data["changed"], data["diff"][:2000]
    assert lock.read_bytes() == made_by_311
    # and the 3.12 node really ran 3.12 (not this interpreter by another name)
    ver = subprocess.run(
        [str(control_node_312), "-c", "import sys; print(sys.version_info[:2])"], capture_output=True, text=True
    ).stdout.strip()
    assert ver == "(3, 12)"


def test_a_lock_in_the_format_before_uv_still_parses():
    """Locks made by pip's resolver (no `cuda runtime wheels:` line, `manylinux x86_64`) still load."""
    old = (
        "# k26ops engine lock: made by `k26ops engine lock lab`; commit it beside the recipe\n"
        "# source: file:///x\n# commit: " + "a" * 40 + "\n# subdir: python\n# engine: sglang 0.5.23+lab\n"
        "# python: 3.11\n# platform: cp311 manylinux x86_64\n"
        "tqdm==4.70.1 \\\n    --hash=sha256:" + "c" * 64 + "\n"
    )
    lock = enginelock.parse(old, "old.lock")
    assert lock.commit == "a" * 40 and lock.entries == (("tqdm", "4.70.1", "c" * 64),)
    assert "cuda runtime wheels" not in lock.meta
