"""The config file (k26ops.config): defaults for inventory, baselines, forks and
deadline; flags and environment override it; `config show` says where each
setting came from; baselines are found from any working directory."""

from __future__ import annotations

import json
import os
from pathlib import Path

import git
import pytest
from click.testing import CliRunner

from k26ops.cli import cli, hoist_global_flags
from labtools.invoke import cli as k26ops_cli


def _show(*args, env=None) -> dict:
    res = CliRunner().invoke(cli, hoist_global_flags([*args, "config", "show", "--json"]), env=env)
    assert res.exit_code == 0, res.output
    return json.loads(res.stdout)


@pytest.fixture
def conf(tmp_path, monkeypatch):
    monkeypatch.delenv("K26OPS_INVENTORY", raising=False)
    monkeypatch.delenv("K26OPS_BASELINES", raising=False)
    path = tmp_path / "etc" / "config.toml"
    path.parent.mkdir()
    path.write_text('inventory = "fleet.yml"\nbaselines = "~/bl"\nforks = 4\ndeadline = 120.5\n')
    monkeypatch.setenv("K26OPS_CONFIG", str(path))
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    return path


def test_config_file_gives_defaults_and_says_so(conf, tmp_path):
    doc = _show()
    s = doc["settings"]
    here = f"config {conf}"
    assert s["inventory"] == {"value": str(conf.parent / "fleet.yml"), "source": here}  # relative to the file
    assert s["baselines"] == {"value": str(tmp_path / "home/bl"), "source": here}
    assert s["forks"] == {"value": 4, "source": here} and s["deadline"]["value"] == 120.5
    assert s["connect_timeout"] == {"value": 10.0, "source": "default"}
    assert doc["command"] == "config show" and doc["ok"] is True and doc["config_file"] == str(conf)


def test_flags_and_environment_override_the_file(conf, tmp_path):
    s = _show("-f", "7", "--deadline", "9", "-i", "x.yml", env={"K26OPS_BASELINES": str(tmp_path / "b")})["settings"]
    assert s["forks"] == {"value": 7, "source": "--forks"}
    assert s["deadline"] == {"value": 9.0, "source": "--deadline"}
    assert s["inventory"] == {"value": "x.yml", "source": "--inventory"}
    assert s["baselines"] == {"value": str(tmp_path / "b"), "source": "env K26OPS_BASELINES"}
    s = _show(env={"K26OPS_INVENTORY": "y.yml"})["settings"]
    assert s["inventory"] == {"value": "y.yml", "source": "env K26OPS_INVENTORY"}


def test_without_a_file_baselines_are_in_the_home_directory_never_the_cwd(tmp_path, monkeypatch):
    monkeypatch.delenv("K26OPS_BASELINES", raising=False)
    monkeypatch.delenv("XDG_DATA_HOME", raising=False)
    monkeypatch.setenv("K26OPS_CONFIG", os.devnull)
    monkeypatch.setenv("HOME", str(tmp_path))
    s = _show()["settings"]
    assert s["baselines"] == {"value": str(tmp_path / ".local/share/k26ops/baselines"), "source": "default"}


def test_the_recipes_dir_from_the_file_the_environment_or_the_default(conf, tmp_path, monkeypatch):
    monkeypatch.delenv("K26OPS_RECIPES", raising=False)
    monkeypatch.delenv("XDG_CONFIG_HOME", raising=False)
    assert _show()["settings"]["recipes"] == {
        "value": str(tmp_path / "home/.config/k26ops/recipes"),
        "source": "default",
    }
    conf.write_text(conf.read_text() + 'recipes = "recipes"\n')
    assert _show()["settings"]["recipes"] == {"value": str(conf.parent / "recipes"), "source": f"config {conf}"}
    s = _show(env={"K26OPS_RECIPES": str(tmp_path / "r")})["settings"]
    assert s["recipes"] == {"value": str(tmp_path / "r"), "source": "env K26OPS_RECIPES"}


@pytest.mark.parametrize(
    "text,needle",
    [
        ("fork = 4\n", "unknown setting 'fork' (did you mean forks?)"),
        ("forks = 0\n", "forks must be 1..512, got 0"),
        ("forks = 2.5\n", "forks must be an integer"),
        ("deadline = nan\n", "deadline must be >= 1, got nan"),
        ("inventory = 3\n", "inventory must be a path string"),
        ("forks = \n", "not valid TOML"),
        ("# defaults\nforks = 4\n\ndeadline = -1\n", "deadline must be >= 1"),
        ("forks = 4\n[inventory]\n", "inventory must be a path string"),
        ('forks = 4\nbaselines = "a"\nforks =\n', "not valid TOML"),
    ],
)
def test_a_bad_config_file_is_one_line_naming_file_and_line_exit_2(tmp_path, monkeypatch, text, needle):
    path = tmp_path / "config.toml"
    path.write_text(text)
    monkeypatch.setenv("K26OPS_CONFIG", str(path))
    line = len(text.rstrip("\n").splitlines())  # each bad setting is the file's last line
    res = CliRunner().invoke(cli, ["config", "show"])
    assert res.exit_code == 2 and res.stdout == ""
    assert res.stderr.count("\n") == 1 and needle in res.stderr, res.stderr
    assert res.stderr.startswith(f"k26ops: error: {path}:{line}: "), res.stderr


def test_lab_down_and_help_work_with_a_bad_config_file_others_refuse(tmp_path, monkeypatch):
    """A broken config file must not keep the operator from taking a lab down or reading help."""
    path = tmp_path / "config.toml"
    path.write_text("forks = 4\nforks = [\n")
    env = {"K26OPS_INVENTORY": None, "K26OPS_BASELINES": None, "K26OPS_CONFIG": str(path)}

    def k26(*args):
        return k26ops_cli(*args, env=env, cwd=tmp_path)

    for args in (["lab", "down", "--dir", str(tmp_path / "nolab")], ["deploy", "--help"], ["lab", "down", "-h"]):
        res = k26(*args)
        assert res.returncode == 0 and "Traceback" not in res.stderr, (args, res.stderr)
        warning = [ln for ln in res.stderr.splitlines() if ln.startswith("k26ops: warning:")]
        assert len(warning) == 1 and f"{path}:2: not valid TOML" in warning[0], (args, res.stderr)
    assert "Usage: k26ops deploy" in k26("deploy", "--help").stdout
    res = k26("facts")
    assert (
        res.returncode == 2
        and res.stderr
        == f"k26ops: error: {path}:2: not valid TOML: "
        "Invalid value (at end of document); to run without the file: K26OPS_CONFIG=/dev/null k26ops ...\n"
    ), res.stderr  # the way round it said (issue 42)


def test_a_named_config_file_that_is_missing_is_an_error(tmp_path, monkeypatch):
    monkeypatch.setenv("K26OPS_CONFIG", str(tmp_path / "nope.toml"))
    res = CliRunner().invoke(cli, ["config", "show"])
    assert res.exit_code == 2 and "no such file" in res.stderr


def test_baselines_are_found_from_any_working_directory(tmp_path):
    """A repository with one tag, named only by the config file: `baselines list`
    from two unrelated directories finds it (it used to look in ./baselines)."""
    repo_dir = tmp_path / "data/baselines"
    repo = git.Repo.init(repo_dir)
    (repo_dir / "baseline.json").write_text(json.dumps({"hosts": {"gpu1": {"release_id": "r1", "health": "ok"}}}))
    repo.index.add(["baseline.json"])
    repo.index.commit("snapshot", author=git.Actor("t", "t@t"), committer=git.Actor("t", "t@t"))
    repo.create_tag("k26-good", message="good")
    conf = tmp_path / "config.toml"
    conf.write_text(f'baselines = "{repo_dir}"\n')
    env = {"K26OPS_BASELINES": None, "K26OPS_CONFIG": str(conf)}
    for cwd in (tmp_path, Path("/")):
        proc = k26ops_cli("baselines", "list", "--json", cwd=cwd, env=env)
        assert proc.returncode == 0, proc.stderr
        doc = json.loads(proc.stdout)
        assert doc["repo"] == str(repo_dir) and [t["tag"] for t in doc["tags"]] == ["k26-good"]
