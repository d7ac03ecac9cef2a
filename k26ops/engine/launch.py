"""The engine's command line from its profile (the profile table, k26ops.engine.profile_table),
extra_args checked against it, and the secret flags moved to a root-only --config file so their
values are in no argv. Pure: no host access."""

from __future__ import annotations

import os
import re
from collections.abc import Mapping

import yaml

from k26ops.engine import profile_table
from k26ops.engine.secret_policy import split_secret_flags
from k26ops.engine.systemd import check_text
from k26ops.errors import UserError
from k26ops.layout import Layout

LAUNCH_MODULE = "sglang.launch_server"
# The engine's secret flags (--api-key ...): a root-only YAML that SGLang reads with
# `--config` (ConfigArgumentMerger), so their values are in no argv (`ps`, `systemctl status`).
SECRETS_FILE = "/etc/k26ops/sglang-secrets.yaml"
# Flags engine_argv sets itself (the profile table's); extra_args may not repeat them.
MANAGED_FLAGS = profile_table.MANAGED
_MODULE = re.compile(r"[A-Za-z_]\w*(\.[A-Za-z_]\w*)*")

# ---------------------------------------------------------------- engine argv


def _req(profile: Mapping, key: str):
    if profile.get(key) in (None, ""):
        raise UserError(f"engine profile: missing required setting {key!r}")
    return profile[key]


_int = profile_table.integer


def _extra_args(extra) -> list[str]:
    """extra_args (flag_words), none of the flags engine_argv sets itself."""
    return unmanaged_words(
        extra, "engine profile: extra_args", MANAGED_FLAGS, "; it comes from the profile's own setting"
    )


def unmanaged_words(value, what: str, managed, why: str) -> list[str]:
    """flag_words(value, what), none of them a flag in `managed` (k26ops sets those itself): UserError
    `{what} may not set FLAG{why}`. The engine's extra_args and the gateway's gateway_flags."""
    words = flag_words(value, what)
    for word in words:
        flag = word.split("=", 1)[0]
        if flag in managed:
            raise UserError(f"{what} may not set {flag}{why}")
    return words


def flag_words(extra, what: str) -> list[str]:
    """Command-line words from a list of words, or a mapping flag -> value (True: bare flag;
    False/None: omitted; list: the flag once, then every item, as a `nargs='+'` flag
    such as --cuda-graph-bs-decode takes them: repeating the flag per item would
    leave argparse with the last item only). `what` names the setting in errors."""
    if extra is None:
        return []
    out: list[str] = []
    if isinstance(extra, Mapping):
        for flag, value in extra.items():
            flag = str(flag) if str(flag).startswith("--") else f"--{flag}"
            if value is None or value is False:
                continue
            if isinstance(value, (list, tuple)):
                out += [flag] + [str(v) for v in value]
            else:
                out += [flag] if value is True else [flag, str(value)]
    elif isinstance(extra, (list, tuple)):
        out = [str(a) for a in extra]
    else:
        raise UserError(f"{what} must be a list or mapping, got {extra!r}")
    for word in out:
        check_text(word, what)
    return out


def engine_argv(profile: Mapping) -> list[str]:
    """The engine's command line (python -m launch_module and flags) for a profile: the flags
    from the profile table (k26ops.engine.profile_table, its keys and defaults: docs/reference/profile.md),
    then multinode's (nnodes > 1, with node_rank and dist_init_addr from the caller), extra_args."""
    # the default host's release, when the profile names neither
    python = profile.get("python") or f"{profile.get('release_dir') or Layout().current}/venv/bin/python"
    module = profile.get("launch_module") or LAUNCH_MODULE
    if not isinstance(module, str) or not _MODULE.fullmatch(module):
        raise UserError(f"engine profile: launch_module is not a Python module name: {module!r}")
    _req(profile, "model_path")
    argv = [str(python), "-m", module, *profile_table.argv(profile)]
    nnodes = _int(profile, "nnodes", 1) or 1
    if nnodes > 1:
        rank = _int(profile, "node_rank", 0)
        addr = profile.get("dist_init_addr")
        if rank is None or rank >= nnodes:
            raise UserError(f"engine profile: node_rank must be in 0..{nnodes - 1}, got {rank!r}")
        if not addr or not isinstance(addr, str) or any(c.isspace() for c in addr):
            raise UserError(f"engine profile: nnodes={nnodes} needs dist_init_addr host:port, got {addr!r}")
        argv += ["--nnodes", str(nnodes), "--node-rank", str(rank), "--dist-init-addr", addr]
    argv += _extra_args(profile.get("extra_args"))
    for word in argv:
        check_text(word, "engine argument")
    argv, secret = split_secret_flags(argv)
    if secret:
        if any(w.split("=", 1)[0] == "--config" for w in argv):
            raise UserError(
                f"engine profile: extra_args has --config and the secret flag {next(iter(secret))}: "
                "k26ops passes secret flags in its own --config file and the engine reads only one; "
                "put that file's settings in extra_args instead"
            )
        render_secret_config(secret)  # a value the file cannot carry is refused here, before any host
        argv += ["--config", secrets_file(profile)]
    return argv


def secrets_file(profile: Mapping) -> str:
    """Where the profile's secret flags are kept on the host (profile `secrets_file`)."""
    path = str(profile.get("secrets_file") or SECRETS_FILE)
    if not path.startswith("/") or not path.endswith((".yaml", ".yml")) or any(c.isspace() for c in path):
        raise UserError(f"engine secrets file must be an absolute .yaml path without whitespace: {path!r}")
    return path


def secrets_file_beside(env_path: str) -> str:
    """The secret-flags file kept beside an env file: /etc/k26ops/sglang.env -> sglang-secrets.yaml."""
    head, name = os.path.split(str(env_path))
    return os.path.join(head or "/", (name.rsplit(".", 1)[0] if "." in name[1:] else name) + "-secrets.yaml")


def engine_flag_secrets(profile: Mapping) -> dict[str, str]:
    """The profile's secret flags and their values ({"--api-key": value}): what
    engine_argv leaves out of the command line and render_secret_config writes."""
    extra = _extra_args(profile.get("extra_args"))
    return split_secret_flags(extra)[1]


def _yaml_quote(text: str) -> str:
    """A YAML double-quoted scalar that PyYAML's safe_load reads back as `text`
    (printable ASCII as is, everything else as \\u / \\U escapes)."""
    out = []
    for ch in text:
        if ch in '"\\':
            out.append("\\" + ch)
        elif " " <= ch <= "~":
            out.append(ch)
        else:
            out.append(f"\\u{ord(ch):04x}" if ord(ch) < 0x10000 else f"\\U{ord(ch):08x}")
    return '"' + "".join(out) + '"'


def render_secret_config(flags: Mapping[str, str]) -> str:
    """The secret flags as the engine's `--config` YAML (keys: the long option
    without dashes, as SGLang's ConfigArgumentMerger reads them; it turns each
    back into `--key value` inside the engine process, never into an argv)."""
    lines = ["# Managed by k26ops: the engine's secret flags, read with --config. Mode 0600, root only."]
    for flag, value in flags.items():
        check_text(value, f"engine flag {flag}")
        if value.startswith("-"):
            raise UserError(
                f"engine flag {flag}: its value starts with '-', which the engine would read as an "
                "option (a --config file passes it as a word of its own)"
            )
        lines.append(f"{flag.lstrip('-')}: {_yaml_quote(value)}")
    return "\n".join(lines) + "\n"


def secret_config_values(text: str | None) -> list[str]:
    """The values in a host's secret-flags file (to redact them; [] when unreadable)."""
    try:
        data = yaml.safe_load(text or "") or {}
    except yaml.YAMLError:
        return []
    return [str(v) for v in data.values() if v not in (None, "")] if isinstance(data, dict) else []


def engine_launch(profile: Mapping) -> tuple[list[str], str | None]:
    """(the unit's command line, the secret config file's text or None): what a
    deploy puts on a host for this profile (bench/device/apikey_check.sh calls it)."""
    secret = engine_flag_secrets(profile)
    return engine_argv(profile), (render_secret_config(secret) if secret else None)
