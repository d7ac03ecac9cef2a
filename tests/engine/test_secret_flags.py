"""Secrets off the command line and out of sight (issue 35 items 2 and 8, 34.10).

- The engine's secret flags (--api-key) go to a root-only YAML file that the
  engine reads with `--config`: checked here against SGLang 0.5.17's and 0.5.23's
  own ConfigArgumentMerger (loaded from the real releases, not copied), and against
  the lab stand-in, which must read it the same way.
- Credentials inside values whose names say nothing (DATABASE_URL, SENTRY_DSN)
  and typo'd secret names (hf_tokn) are masked in output and baselines.
- A unit k26ops did not write is never overwritten (foreign_unit).
The lab side (non-root `ps`, `systemctl status`, journal; ssh.service refused)
is in tests/engine/test_steps_engine.py.
"""

from __future__ import annotations

import argparse
import importlib.util
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
import sglang_release  # noqa: E402

from k26ops.cli import cli  # noqa: E402
from k26ops.engine import (
    launch,
    secret_policy,
    units,  # noqa: E402
)
from k26ops.errors import UserError  # noqa: E402
from k26ops.lab.fixtures import engine_standin  # noqa: E402
from k26ops.steps.engine import foreign_unit  # noqa: E402

KEYS = [
    "sk-plain-123",
    'qu"ote\\back',
    "ünï€😀",
    "tab\tx",
    "$HOME `id` %n",
    "x: y # z",
    "'q'",
    "@at",
    "*star",
    "!tag",
    "123",
    "true",
    "null",
    "~",
    "a" * 300,
    "\u0085\u2028nel",
]
PROFILE = {"model_path": "/models/m", "python": "/v/bin/python"}


def _sglang_merger(version: str):
    """SGLang's own --config reader, from the release's sources (0.5.17 keeps it
    beside server_args.py, 0.5.23 under utils/)."""
    root = sglang_release.site_packages(version) / "sglang/srt"
    path = next(
        p for p in (root / "utils/server_args_config_parser.py", root / "server_args_config_parser.py") if p.exists()
    )
    spec = importlib.util.spec_from_file_location(f"sglang_config_parser_{version}", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod.ConfigArgumentMerger


def _engine_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser()
    for flag in ("--model-path", "--api-key", "--admin-api-key", "--config", "--host"):
        p.add_argument(flag)
    p.add_argument("--tp-size", type=int)
    p.add_argument("--port", type=int)
    p.add_argument("--trust-remote-code", action="store_true")
    p.add_argument("--speculative-algorithm")
    return p


@pytest.mark.parametrize("version", ["0.5.17", "0.5.23"])
@pytest.mark.parametrize("key", KEYS)
def test_the_engine_reads_the_secret_flags_from_its_config_file(tmp_path, key, version):
    """The unit's argv plus the rendered file give SGLang's parser the exact key
    (and the stand-in too), while the argv itself holds no trace of it."""
    profile = {
        **PROFILE,
        "extra_args": {"api-key": key, "admin-api-key": "adm-" + key[:5]},
        "secrets_file": str(tmp_path / "sglang-secrets.yaml"),
    }
    argv, text = launch.engine_launch(profile)
    assert key not in " ".join(argv) and argv[-2:] == ["--config", profile["secrets_file"]]
    Path(profile["secrets_file"]).write_text(text)
    flags = argv[3:]
    parser = _engine_parser()
    ns = parser.parse_args(_sglang_merger(version)(parser).merge_config_with_args(flags))
    assert (ns.api_key, ns.admin_api_key, ns.model_path) == (key, "adm-" + key[:5], "/models/m")
    args, _unknown = engine_standin.parse_args(flags)
    assert args.api_key == key and args.model_path == "/models/m"


def test_a_profile_without_secret_flags_has_no_config_file_and_keeps_its_own():
    argv, text = launch.engine_launch({**PROFILE, "extra_args": ["--config", "/etc/mine.yaml"]})
    assert text is None and argv[-2:] == ["--config", "/etc/mine.yaml"]


@pytest.mark.parametrize(
    "profile, needle",
    [
        ({"extra_args": ["--config", "/etc/mine.yaml", "--api-key", "k"]}, "--config and the secret flag --api-key"),
        ({"extra_args": {"api-key": "-starts-with-dash"}}, "starts with '-'"),
        ({"extra_args": {"api-key": "k"}, "secrets_file": "/etc/k26ops/secrets.env"}, "absolute .yaml path"),
    ],
)
def test_secret_flags_that_cannot_reach_the_engine_are_refused(profile, needle):
    with pytest.raises(UserError, match=needle):
        launch.engine_launch({**PROFILE, **profile})


def test_the_secrets_file_lives_beside_the_env_file():
    assert launch.secrets_file_beside(units.ENV_FILE) == launch.SECRETS_FILE
    assert launch.secrets_file_beside("/srv/eng/prod.env") == "/srv/eng/prod-secrets.yaml"


def test_list_flags_named_like_secrets_stay_on_the_command_line():
    argv, text = launch.engine_launch({**PROFILE, "extra_args": ["--bucket-time-to-first-token", "0.1", "0.5"]})
    assert argv[-3:] == ["--bucket-time-to-first-token", "0.1", "0.5"] and text is None


# ---------------------------------------------------------------- credentials in values, typo'd names

URL_VALUES = {
    "DATABASE_URL": ("postgres://app:pw-Zq81x@db.example:5432/app", "pw-Zq81x"),
    "SENTRY_DSN": (
        "https://0123456789abcdef0123456789abcdef@o1.ingest.sentry.io/42",
        "0123456789abcdef0123456789abcdef",
    ),
    "REDIS": ("redis://:r3dis-pass@cache:6379/0", "r3dis-pass"),
    "MODEL_MIRROR": ("hf_AbCdEfGhIjKlMnOpQrStUv", "hf_AbCdEfGhIjKlMnOpQrStUv"),
}


def test_credentials_inside_values_are_secrets_whatever_the_name():
    env = {k: v for k, (v, _c) in URL_VALUES.items()} | {"GIT": "git+ssh://git@github.com/o/r", "X": "plain"}
    assert sorted(secret_policy.secrets_of(env)) == sorted(c for _v, c in URL_VALUES.values())
    shown = secret_policy.redact_vars({"engine_env": env, "mirrors": [env["DATABASE_URL"]]})
    assert "pw-Zq81x" not in str(shown) and "0123456789abcdef" not in str(shown)
    assert shown["engine_env"]["DATABASE_URL"] == "postgres://app:<redacted>@db.example:5432/app"
    assert shown["engine_env"]["GIT"] == "git+ssh://git@github.com/o/r" and shown["engine_env"]["X"] == "plain"
    base = secret_policy.env_for_baseline(units.render_env({"env": env}))
    assert all(c not in base for _v, c in URL_VALUES.values()) and "git@github.com" in base
    assert secret_policy.env_for_baseline(base) == base
    assert all(c in secret_policy.secret_values({"engine_env": env}) for _v, c in URL_VALUES.values())


def test_every_aliased_copy_is_redacted_and_walked_once():
    """A YAML alias is the same object in many places: each place shows it redacted,
    from the one redacted copy (an alias bomb has millions of places); a recursive
    value still comes back (the walk never loops)."""
    inner = {"hf_token": "v-Secret-1", "flags": ["--api-key", "v-Secret-2"], "n": 1}
    shown = secret_policy.redact_vars({"a": [inner, inner], "b": inner, "c": {"d": inner}})
    assert "v-Secret" not in str(shown) and shown["b"]["n"] == 1
    assert shown["a"][0] is shown["a"][1] is shown["b"] is shown["c"]["d"]
    loop = {"hf_token": "v-Secret-3"}
    loop["self"] = [loop]
    assert secret_policy.redact_vars({"x": loop, "y": loop})["y"]["hf_token"] == secret_policy.REDACTED


@pytest.mark.parametrize("name", ["hf_tokn", "HF_TOKN", "DB_PASWORD", "MY_SECRT", "OPENAI_APIKY", "gcp_credentails"])
def test_typod_secret_names_are_secret(name):
    assert secret_policy.is_secret_key(name)
    assert secret_policy.redact_vars({name: "v-Secret-1"}) == {name: secret_policy.REDACTED}


@pytest.mark.parametrize(
    "name",
    [
        "--max-total-tokens",
        "--tokenizer-path",
        "--enable-forward-pass-metrics",
        "passes",
        "--tokenizer-mode",
        "model_path",
    ],
)
def test_near_words_that_are_not_secrets(name):
    assert not secret_policy.is_secret_key(name)


def test_inventory_show_masks_a_typod_secret_under_its_unknown_key_warning(tmp_path):
    inv = tmp_path / "inv.yml"
    inv.write_text(
        "hosts:\n  h1:\n    address: 127.0.0.1\n    vars:\n      hf_tokn: hf_TypoedTokenValue1234\n"
        "      DATABASE_URL: postgres://app:s3cret-pw@db/app\n"
    )
    res = CliRunner(env={"COLUMNS": "200"}).invoke(
        cli, ["-i", str(inv), "inventory", "show", "h1"], catch_exceptions=False
    )
    assert res.exit_code == 0 and "hf_tokn: unknown; did you mean hf_token?" in res.stderr
    assert "hf_TypoedTokenValue1234" not in res.output and "s3cret-pw" not in res.output
    assert "postgres://app:<redacted>@db/app" in res.stdout


# ---------------------------------------------------------------- units k26ops did not write

SSH_SHOW = {"LoadState": "loaded", "FragmentPath": "/lib/systemd/system/ssh.service", "ActiveState": "active"}


def test_a_unit_k26ops_did_not_write_is_foreign():
    upath = "/etc/systemd/system/ssh.service"
    assert "systemd already has ssh.service from /lib/systemd/system/ssh.service" in foreign_unit(
        "ssh.service", upath, None, SSH_SHOW
    )
    assert "not written by k26ops" in foreign_unit(
        "x.service", "/etc/systemd/system/x.service", "[Unit]\nDescription=mine\n", {"LoadState": "loaded"}
    )
    ours = units.render_unit({"profile": PROFILE})
    assert (
        foreign_unit(
            "k26-engine.service",
            "/etc/systemd/system/k26-engine.service",
            ours,
            {"LoadState": "loaded", "FragmentPath": "/etc/systemd/system/k26-engine.service"},
        )
        is None
    )
    assert (
        foreign_unit(
            "new.service", "/etc/systemd/system/new.service", None, {"LoadState": "not-found", "FragmentPath": ""}
        )
        is None
    )


def test_a_unit_template_without_the_marker_is_refused(tmp_path):
    (tmp_path / units.UNIT_TEMPLATE).write_text("[Service]\nExecStart={{ argv | systemd_exec }}\n")
    with pytest.raises(UserError, match="must start with the line '# Managed by k26ops"):
        units.render_unit({"argv": ["/bin/true"]}, templates_dir=tmp_path)


def test_loading_an_inventory_puts_no_policy_in_force_the_command_does(tmp_path):
    """inventory.load is pure (issue 48: no hidden channel): it returns the inventory's
    secret_vars / secret_patterns as its SecretPolicy; the command puts them in force."""
    import yaml

    from k26ops import inventory
    from k26ops.engine import secret_policy

    inv = tmp_path / "inv.yml"
    doc = {
        "vars": {"secret_vars": ["my_passphrase"], "secret_patterns": ["*_SIGNATURE"]},
        "hosts": {"h": {"address": "127.0.0.1"}},
    }
    inv.write_text(yaml.safe_dump(doc))
    before = secret_policy.in_force()
    loaded = inventory.load(inv, ssh_config=None)
    assert secret_policy.in_force() == before and not secret_policy.is_secret_key("MY_PASSPHRASE")
    assert loaded.secret_policy == secret_policy.SecretPolicy.of(["MY_PASSPHRASE"], ["*_SIGNATURE"])
    try:
        secret_policy.use(loaded.secret_policy)
        assert secret_policy.is_secret_key("my_passphrase") and secret_policy.is_secret_key("CORP_SIGNATURE")
        assert secret_policy.redact_vars({"MY_PASSPHRASE": "x"}) == {"MY_PASSPHRASE": secret_policy.REDACTED}
    finally:
        secret_policy.use(before)


def test_a_command_puts_the_inventorys_secret_names_in_force(tmp_path):
    """The CLI's one place that loads the inventory for a command puts its policy in force
    before printing: a value named only by secret_vars never shows."""
    import yaml

    from labtools.invoke import cli

    inv = tmp_path / "inv.yml"
    doc = {"vars": {"secret_vars": ["MY_PASSPHRASE"], "MY_PASSPHRASE": "hunter2-x"}, "hosts": {"h": {}}}
    doc["hosts"]["h"]["address"] = "127.0.0.1"
    inv.write_text(yaml.safe_dump(doc))
    for args in (("inventory", "show", "h"), ("--json", "inventory", "list")):
        proc = cli("-i", str(inv), *args)
        assert proc.returncode == 0, proc.stderr
        assert "hunter2-x" not in proc.stdout + proc.stderr and "MY_PASSPHRASE" in proc.stdout, args


def test_only_the_clis_load_inventory_loads_an_inventory():
    """Every command's inventory goes through cli.context.load_inventory, which puts its
    secret policy in force; a second loader would print the secret_vars it did not apply."""
    import ast

    from labtools import REPO
    from labtools.source import parsed

    found = []
    for path in sorted((REPO / "k26ops").rglob("*.py")):
        rel = path.relative_to(REPO).as_posix()
        if rel.startswith("k26ops/inventory/") or rel == "k26ops/cli/context.py":
            continue
        for node in ast.walk(parsed(path)):
            if isinstance(node, ast.ImportFrom) and node.module == "k26ops.inventory":
                found += [f"{rel}:{node.lineno}" for a in node.names if a.name == "load"]
            if isinstance(node, ast.Attribute) and node.attr == "load" and getattr(node.value, "id", "") == "inventory":
                found.append(f"{rel}:{node.lineno}")
    assert not found, "load it with k26ops.cli.context.load_inventory: " + ", ".join(found)
