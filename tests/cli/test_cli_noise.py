"""Noise and stale help (issue 34.10): each inventory warning once per command,
options listed only where they mean something, the help's defaults as the code
has them, and a lab started with --dir found by later commands. The CLI in this
process (labtools.invoke.cli), in a subprocess where it reaches the lab; a `connection:
local` host (no SSH, no GPU)."""

from __future__ import annotations

from labtools.invoke import cli, k26ops


def test_deploy_check_prints_each_unknown_key_warning_once(tmp_path):
    inv = tmp_path / "inv.yml"
    inv.write_text("hosts:\n  here:\n    connection: local\n    vars:\n      modle_path: /models/x\n")
    proc = cli("-i", str(inv), "deploy", "-C")
    warned = [ln for ln in proc.stderr.splitlines() if "modle_path" in ln]
    assert len(warned) == 1 and warned[0].startswith("k26ops: warning: "), proc.stderr


def _host_options(*cmd: str) -> set[str]:
    proc = cli(*cmd, "--help")
    assert proc.returncode == 0, proc.stderr
    return {o for o in ("--inventory", "--limit", "--forks") if f" {o} " in proc.stdout}


def test_inventory_limit_forks_only_where_they_mean_something():
    for cmd in (
        ["lab", "up"],
        ["diagnose", "log"],
        ["engine", "lock"],
        ["baselines", "show"],
        ["baselines", "list"],
        ["inventory", "vars"],
    ):
        assert _host_options(*cmd) == set(), cmd
    assert _host_options("inventory", "list") == {"--inventory", "--limit"}
    assert _host_options("inventory", "show") == {"--inventory"}
    for cmd in (["deploy"], ["status"], ["logs"], ["bench"], ["baselines", "delete"], ["diagnose", "service"]):
        assert _host_options(*cmd) == {"--inventory", "--limit", "--forks"}, cmd
    proc = cli("diagnose", "log", "-f", "4", "x.log")
    assert proc.returncode == 2 and "No such option '-f'" in proc.stderr, proc.stderr


def test_help_gives_the_baselines_default_the_code_uses():
    from k26ops.baselines.repo import default_dir

    assert str(default_dir()).endswith(".local/share/k26ops/baselines")  # as the help says (no env, no config)
    for cmd in ("deploy", "bench", "snapshot", "rollback"):
        text = " ".join(cli(cmd, "--help", env={"K26OPS_BASELINES": ""}).stdout.split())
        assert "./baselines" not in text, cmd
        assert "$K26OPS_BASELINES, else the config file's `baselines`, else ~/.local/share/k26ops/baselines" in text, (
            cmd,
            text,
        )


def test_a_lab_started_with_dir_is_found_by_later_commands(lab, tmp_path):
    import json

    # no K26OPS_LAB_DIR, no inventory: only what `lab up --dir` remembered can lead to this lab
    env = {"K26OPS_LAB_DIR": "", "K26OPS_INVENTORY": "", "XDG_STATE_HOME": str(tmp_path / "state")}
    before = k26ops("--json", "inventory", "list", env=env)
    assert before.returncode == 2 and "no inventory" in before.stderr, before.stderr
    up = k26ops(
        "lab", "up", "--hosts", str(len(lab.hosts)), "--dir", str(lab.dir), "--base-port", str(lab.base_port), env=env
    )  # already up: nothing booted, the directory remembered
    assert up.returncode == 0, up.stderr
    listed = k26ops("--json", "inventory", "list", env=env)
    assert listed.returncode == 0, listed.stderr
    doc = json.loads(listed.stdout)
    assert doc["inventory"] == str(lab.inventory) and set(doc["hosts"]) == {h.name for h in lab.hosts}
    status = json.loads(k26ops("--json", "lab", "status", env=env).stdout)
    assert status["dir"] == str(lab.dir.resolve())
    # K26OPS_LAB_DIR still wins
    other = k26ops("--json", "lab", "status", env={**env, "K26OPS_LAB_DIR": str(tmp_path / "none")})
    assert json.loads(other.stdout)["dir"] == str(tmp_path / "none")
