"""Shell completion: host and group names for --limit (each term of a pattern),
baseline tags for `baselines show|delete` and `rollback --tag`; through click's
real completion protocol (the env vars a shell sets) and the functions."""

from __future__ import annotations

import os

import git

from k26ops.cli import cli
from k26ops.cli.complete import host_patterns
from labtools.invoke import cli as k26ops_cli

INVENTORY = """\
all:
  children:
    gpu:
      children:
        b300: {hosts: {b300-01: {ansible_host: 127.0.0.1}, b300-02: {ansible_host: 127.0.0.1}}}
        rtx: {hosts: {rtx01: {ansible_host: 127.0.0.1}}}
    monitoring: {hosts: {rtx01: {}}}
"""


def complete(words: list[str], env: dict | None = None) -> list[str]:
    """What bash gets for the last word (click's bash_complete protocol)."""
    full = {
        **{k: None for k in os.environ if k.startswith("K26OPS_")},
        "COMP_WORDS": " ".join(["k26ops", *words]),
        "COMP_CWORD": str(len(words)),
        "_K26OPS_COMPLETE": "bash_complete",
        **(env or {}),
    }
    proc = k26ops_cli(env=full)
    assert proc.returncode == 0 and proc.stderr == "", proc.stderr
    return [line.split(",", 1)[1] for line in proc.stdout.splitlines() if line]


def test_limit_completes_hosts_and_groups_per_term(tmp_path):
    inv = tmp_path / "inv.yml"
    inv.write_text(INVENTORY)
    assert complete(["-i", str(inv), "--limit", "rt"]) == ["rtx", "rtx01"]
    assert complete(["-i", str(inv), "status", "-l", "gpu:!b"]) == ["gpu:!b300", "gpu:!b300-01", "gpu:!b300-02"]
    assert complete(["-i", str(inv), "inventory", "list", "--limit", "rtx01,mon"]) == ["rtx01,monitoring"]
    assert complete(["--limit", "gpu:&"], env={"K26OPS_INVENTORY": str(inv)})[:2] == ["gpu:&b300", "gpu:&b300-01"]
    # no inventory to read: nothing offered, nothing printed
    assert complete(["-i", str(tmp_path / "missing.yml"), "--limit", "r"]) == []


def test_host_patterns_function(tmp_path):
    inv = tmp_path / "inv.yml"
    inv.write_text(INVENTORY)
    ctx = cli.make_context("k26ops", ["-i", str(inv)], resilient_parsing=True)
    assert [c.value for c in host_patterns(ctx, None, "")] == [
        "b300",
        "b300-01",
        "b300-02",
        "gpu",
        "monitoring",
        "rtx",
        "rtx01",
        "ungrouped",
        "all",
    ]
    assert [c.value for c in host_patterns(ctx, None, "b300:!b300-0")] == ["b300:!b300-01", "b300:!b300-02"]


def test_baseline_tags_complete(tmp_path):
    repo = git.Repo.init(tmp_path / "baselines")
    (tmp_path / "baselines" / "index.json").write_text("{}\n")
    repo.index.add(["index.json"])
    repo.index.commit("first")
    for t in ("k26-baseline-working", "k26-before-upgrade", "other"):
        repo.create_tag(t, message=t)
    env = {"K26OPS_BASELINES": str(tmp_path / "baselines")}
    assert complete(["baselines", "show", "k26-b"], env=env) == ["k26-baseline-working", "k26-before-upgrade"]
    assert complete(["baselines", "delete", "other", "k26-ba"], env=env) == ["k26-baseline-working"]
    assert complete(["rollback", "--tag", "o"], env=env) == ["other"]
    assert complete(["baselines", "show", "--baselines", str(tmp_path / "baselines"), "ot"]) == ["other"]
