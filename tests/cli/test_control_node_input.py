"""Values that reach git, pip or a path on the control node are data (issue 35,
items 1 and 3), with no lab: a mirror URL, `--source-url`, `--ref`, a recipe's
git URL, subdir and lock path never run a command (no marker file) and never
write or build outside the recipe's directory / the pinned commit; each is
refused in one line naming the value (exit 2). `engine pin` edits the
engine.source.commit node, not a `commit:` line in the description."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

sys.path.insert(0, str(Path(__file__).parent.parent))
from k26ops.errors import UserError  # noqa: E402
from k26ops.release import engine_source  # noqa: E402
from k26ops.release import recipe as rc  # noqa: E402
from labtools.invoke import cli
from labtools.recipes import recipe_for, tiny_engine


def hostile_urls(d: Path) -> list[str]:
    """Each would run `touch` (or read an option) if git took it as an option or a transport."""
    m = [d / f"MARK{i}" for i in range(12)]
    return [
        f"--upload-pack=touch {m[0]}",
        f"--upload-pack=touch${{IFS}}{m[1]}",
        f"-u{m[2]}",
        f"ext::sh -c touch% {m[3]}",
        f"ext::touch${{IFS}}{m[4]}",
        f"ssh://-oProxyCommand=touch {m[5]}/x",
        f"ssh://-oProxyCommand=touch${{IFS}}{m[6]}/x",
        "-oProxyCommand=x@host:path",
        f"x\ntouch {m[7]}",
        "fd::3",
        f"/tmp/x --upload-pack=touch {m[8]}",
        f"--upload-pack=touch{m[9]}",
    ]


def one_line_exit_2(proc, value: str) -> None:
    assert "Traceback" not in proc.stdout + proc.stderr, proc.stderr
    assert proc.returncode == 2, (proc.returncode, proc.stdout, proc.stderr)
    err = [ln for ln in proc.stderr.splitlines() if ln.strip()]
    assert len(err) == 1 and err[0].startswith("k26ops: error: "), proc.stderr
    assert repr(value) in err[0], (value, err[0])  # names the value


def no_marker(tmp_path: Path) -> None:
    left = [p for p in tmp_path.rglob("*") if "MARK" in p.name]
    assert not left, left


@pytest.fixture
def engine(tmp_path, monkeypatch):
    """A tiny engine, its recipe, and a private engine/git cache."""
    monkeypatch.setenv("K26OPS_ENGINE_CACHE", str(tmp_path / "cache"))
    monkeypatch.delenv("K26OPS_GIT_CACHE", raising=False)
    repo, c1 = tiny_engine(tmp_path, "1.0")
    return repo, c1, recipe_for(tmp_path, repo.as_uri(), c1)


@pytest.mark.parametrize("cmd", ["pin", "lock"])
def test_source_url_is_never_an_option_to_git(tmp_path, engine, cmd):
    _, _, recipe = engine
    env = {"K26OPS_ENGINE_CACHE": str(tmp_path / "cache")}
    for url in hostile_urls(tmp_path):
        extra = ["--ref", "refs/heads/main"] if cmd == "pin" else []
        proc = cli("engine", cmd, str(recipe), *extra, "--source-url", url, env=env)
        no_marker(tmp_path)  # main: MARK0 was there (git ran --upload-pack)
        one_line_exit_2(proc, url)
    assert not recipe.with_name("mine.lock").exists()


def test_ref_is_never_an_option_to_git(tmp_path, engine):
    _, _, recipe = engine
    before = recipe.read_text()
    for ref in ("-uMARK", "--upload-pack=touchMARK", "--upload-pack=touch MARK", "refs/../x", "-"):
        proc = cli("engine", "pin", str(recipe), "--ref", ref, env={"K26OPS_ENGINE_CACHE": str(tmp_path / "c")})
        one_line_exit_2(proc, ref)
    assert recipe.read_text() == before
    no_marker(tmp_path)


def test_engine_source_refuses_hostile_urls_refs_and_commits_itself(tmp_path, engine):
    """The library calls too (a caller that skipped the recipe's checks)."""
    repo, c1, _ = engine
    for url in hostile_urls(tmp_path):
        for call in (
            lambda: engine_source.resolve_ref(url, "refs/heads/main"),
            lambda: engine_source.fetch(url, c1),
            lambda: engine_source.build(url, c1, "python"),
        ):
            try:
                call()
                msg = None
            except UserError as exc:
                msg = str(exc)
            no_marker(tmp_path)  # main: MARK0 was there (git ran --upload-pack)
            assert msg and repr(url) in msg and "\n" not in msg, (url, msg)
    with pytest.raises(UserError, match="ref '-uX'"):
        engine_source.resolve_ref(repo.as_uri(), "-uX")
    with pytest.raises(UserError, match="ref '--upload-pack=x'"):
        engine_source.fetch(repo.as_uri(), c1, ref="--upload-pack=x")
    for bad in ("../../../../tmp/x", "-" + c1[1:], c1.upper()):
        with pytest.raises(UserError, match="not a full 40-hex commit"):
            engine_source.build(repo.as_uri(), bad, "python")
    assert not (tmp_path / "cache" / "engine").exists() or not any(
        "tmp" in p.name for p in (tmp_path / "cache" / "engine").iterdir()
    )


def _write_recipe(recipe: Path, edit) -> Path:
    doc = yaml.safe_load(recipe.read_text())
    edit(doc)
    out = recipe.with_name("hostile.yml")
    out.write_text(yaml.safe_dump(doc, sort_keys=False))
    return out


@pytest.mark.parametrize(
    "lock",
    [
        "/tmp/k26ops-MARK-abs.lock",
        "../../MARK-up.lock",
        "../MARK.lock",
        "sub/../../MARK.lock",
        "-MARK.lock",
        "link/MARK.lock",
    ],
)
def test_engine_lock_path_stays_beside_the_recipe(tmp_path, engine, lock):
    _, _, recipe = engine
    outside = tmp_path / "outside"
    outside.mkdir()
    (recipe.parent / "link").symlink_to(outside)
    hostile = _write_recipe(recipe, lambda d: d["engine"].__setitem__("lock", lock))
    with pytest.raises(UserError) as ei:
        rc.load(hostile)
    assert "engine.lock" in str(ei.value) and repr(lock) in str(ei.value) and "\n" not in str(ei.value)
    proc = cli("engine", "lock", str(hostile), env={"K26OPS_ENGINE_CACHE": str(tmp_path / "cache")})
    one_line_exit_2(proc, lock)
    assert not Path("/tmp/k26ops-MARK-abs.lock").exists()
    no_marker(tmp_path)


@pytest.mark.parametrize("subdir", ["/etc", "/tmp", "../python", "python/../..", "-python"])
def test_subdir_stays_inside_the_commit(tmp_path, engine, subdir):
    repo, c1, recipe = engine
    hostile = _write_recipe(recipe, lambda d: d["engine"]["source"].__setitem__("subdir", subdir))
    with pytest.raises(UserError) as ei:
        rc.load(hostile)
    assert "engine.source.subdir" in str(ei.value) and repr(subdir) in str(ei.value)
    proc = cli("engine", "lock", str(hostile), env={"K26OPS_ENGINE_CACHE": str(tmp_path / "cache")})
    one_line_exit_2(proc, subdir)
    with pytest.raises(UserError, match="subdir"):  # the builder itself, called directly
        engine_source.build(repo.as_uri(), c1, subdir)


def test_a_subdir_symlink_out_of_the_commit_is_refused(tmp_path, engine):
    repo, _, _ = engine
    os.symlink("../../outside-tree", repo / "escape")
    subprocess.run(["git", "-C", str(repo), "add", "escape"], check=True)
    subprocess.run(
        ["git", "-C", str(repo), "-c", "user.name=t", "-c", "user.email=t@t.invalid", "commit", "-qm", "link"],
        check=True,
    )
    c2 = subprocess.run(["git", "-C", str(repo), "rev-parse", "HEAD"], capture_output=True, text=True).stdout.strip()
    with pytest.raises(UserError, match="leaves the commit|escape"):
        engine_source.build(repo.as_uri(), c2, "escape")


@pytest.mark.parametrize(
    "url", ["--upload-pack=touch /tmp/MARK", "-x@host:path", "ext::sh -c touch% /tmp/MARK", "ssh://-oProxyCommand=x/y"]
)
def test_recipe_git_url_is_data(tmp_path, engine, url):
    _, _, recipe = engine
    hostile = _write_recipe(recipe, lambda d: d["engine"]["source"].__setitem__("git", url))
    with pytest.raises(UserError, match=r"engine\.source\.git: not a git URL"):
        rc.load(hostile)


def test_inventory_mirror_is_refused_before_any_host(tmp_path, engine):
    """`engine_source_mirrors: {URL: "--upload-pack=..."}` ran the command during `deploy --check`."""
    _, _, recipe = engine
    (recipe.with_name("mine.lock")).write_text(
        f"# commit: {yaml.safe_load(recipe.read_text())['engine']['source']['commit']}\n# python: 3.11\n"
        "# subdir: python\n"
    )
    url = yaml.safe_load(recipe.read_text())["engine"]["source"]["git"]
    for mirror in hostile_urls(tmp_path):
        inv = tmp_path / "inv.yml"
        inv.write_text(
            yaml.safe_dump(
                {
                    "vars": {
                        "recipe": str(recipe),
                        "engine_source_mirrors": {url: mirror},
                        "model_path": "/models/x",
                        "engine_port": 30000,
                    },
                    "hosts": {"h1": {"address": "127.0.0.1", "port": 9, "user": "root"}},
                }
            )
        )
        proc = cli(
            "-i", str(inv), "deploy", "--check", env={"K26OPS_ENGINE_CACHE": str(tmp_path / "cache")}, timeout=120
        )
        no_marker(tmp_path)
        one_line_exit_2(proc, mirror)  # main: exit 1, the host's connection error (the URL was taken)
        assert "engine_source_mirrors" in proc.stderr
    from k26ops.steps.release import recipe_for

    with pytest.raises(UserError, match="engine_source_mirrors"):
        recipe_for({"recipe": str(recipe), "engine_source_mirrors": {url: "--upload-pack=x"}})


def test_engine_pin_edits_the_commit_node_not_the_description(tmp_path, engine):
    repo, c1, recipe = engine
    doc = yaml.safe_load(recipe.read_text())
    doc.pop("description", None)
    body = yaml.safe_dump(doc, sort_keys=False)
    desc = (
        f"description: |\n  Pinned by hand.\n  commit: {c1}\n  (that line is text, not the node)\n"
        f"# commit: {c1} in a comment stays too\n"
    )
    recipe.write_text(desc + body)
    before = recipe.read_text()
    _, c2 = tiny_engine(tmp_path, "2.0")
    proc = cli(
        "engine", "pin", str(recipe), "--ref", "refs/heads/main", env={"K26OPS_ENGINE_CACHE": str(tmp_path / "cache")}
    )
    assert proc.returncode == 0, proc.stderr
    after = recipe.read_text()
    assert after.startswith(desc)  # the description and the comment: untouched
    changed = [(a, b) for a, b in zip(before.splitlines(), after.splitlines()) if a != b]
    assert len(changed) == 1 and changed[0] == (f"    commit: {c1}", f"    commit: {c2}"), changed
    assert yaml.safe_load(after)["engine"]["source"]["commit"] == c2
    assert yaml.safe_load(after)["description"] == yaml.safe_load(before)["description"]


def test_set_commit_keeps_quotes_comments_and_flow_style(tmp_path):
    from k26ops.cli.commands.engine import set_commit

    a, b = "a" * 40, "1" * 40
    series = tmp_path / "series"
    series.write_text(f"# Base: sglang@{a}\n")
    head = (
        f"name: x\ndescription: 'commit: {a}'\n# commit: {a}\n"
        'cuda_toolkit: {method: pip, version: "13.0"}\n'
        f"patches: {{series: {series}}}\n"
    )
    quoted = head + f'engine:\n  source:\n    git: https://e.invalid/x.git\n    commit: "{a}"   # the pin\n'
    out = set_commit(quoted, tmp_path / "x.yml", b)
    assert out == quoted.replace(f'commit: "{a}"', f'commit: "{b}"')
    flow = head + f"engine: {{source: {{git: 'https://e.invalid/x.git', commit: {a}}}}}\n"
    out = set_commit(flow, tmp_path / "x.yml", b)
    assert yaml.safe_load(out)["engine"]["source"]["commit"] == b  # all digits: quoted, still a string
    assert out.count(a) == 2 and yaml.safe_load(out)["description"] == f"commit: {a}"
    with pytest.raises(UserError, match="no engine.source.commit"):
        set_commit(head + "engine: {sglang: '0.5.23'}\n", tmp_path / "x.yml", b)


def test_a_baselines_recorded_url_and_a_prebuilt_wheel_url_are_data(tmp_path, engine):
    """rollback --tag rebuilds from the URL a baseline recorded; a wheel URL is fetched by urllib."""
    from k26ops.steps.release import recipe_for

    _, _, recipe = engine
    with pytest.raises(UserError, match="baseline's recorded source URL '--upload-pack=x'"):
        recipe_for({}, {"recipe": str(recipe), "source_url": "--upload-pack=x"})
    for url in ("file:///etc/passwd", "ftp://x/y.whl", "--x"):
        hostile = _write_recipe(
            recipe, lambda d: d["engine"]["source"].__setitem__("wheel", {"url": url, "sha256": "0" * 64})
        )
        with pytest.raises(UserError, match=r"engine\.source\.wheel\.url: must be an http\(s\) URL"):
            rc.load(hostile)
