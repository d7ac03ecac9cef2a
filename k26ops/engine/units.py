"""The engine's systemd unit and env file: the command line, Jinja rendering of
templates/, and escaping.

Why its own module: every flag and secret reaches the host through these two
files, so escaping (systemd.service(5) "Command lines", systemd.exec(5)
"EnvironmentFile=") and redaction live in one tested place. Everything here is
pure: no host access.
"""

from __future__ import annotations

import difflib
import fnmatch
import functools
import json
import os
import re
import shlex
from collections.abc import Iterable, Mapping
from pathlib import Path

import jinja2
import yaml

from k26ops import resources
from k26ops.engine import profile_table
from k26ops.errors import UserError
from k26ops.layout import Layout

TEMPLATES_DIR = Path(os.environ.get("K26OPS_TEMPLATES") or resources.path("templates"))
UNIT_TEMPLATE = "sglang.service.j2"
ENV_TEMPLATE = "sglang.env.j2"
REDACTED = "<redacted>"

ENV_FILE = "/etc/k26ops/sglang.env"
LAUNCH_MODULE = "sglang.launch_server"
# The engine's secret flags (--api-key ...): a root-only YAML that SGLang reads with
# `--config` (ConfigArgumentMerger), so their values are in no argv (`ps`, `systemctl status`).
SECRETS_FILE = "/etc/k26ops/sglang-secrets.yaml"
# The first line of every unit k26ops renders: a unit without it is not k26ops' to overwrite.
UNIT_MARKER = "# Managed by k26ops"

# Flags engine_argv sets itself (the profile table's); extra_args may not repeat them.
MANAGED_FLAGS = profile_table.MANAGED

UNIT_DEFAULTS = {
    "description": "SGLang engine (k26ops)",
    "release_id": None,
    "user": None,
    "group": None,
    "working_directory": None,
    "env_file": ENV_FILE,
    "restart_sec": 10,
    "timeout_start_sec": 3600,
    "timeout_stop_sec": 120,
    # Only a crash loop trips the start limit (issue 45 item 2). systemd.unit(5): more than
    # StartLimitBurst starts within StartLimitIntervalSec refuse the next one, and *every* start
    # counts (Restart= ones, `systemctl restart` by hand, a deploy's). A crash loop starts once per
    # RestartSec + time-to-crash: 6 starts in 300 s is a loop crashing within ~50 s of its start
    # (bad flag, import error, 203/EXEC, 217/USER, OOM at load: stopped in ~5 min); an engine that
    # loads for minutes before it crashes keeps being restarted, and `status` says crash-looping.
    # An operator's 4-5 restarts in a few minutes stay under it (7200 s / 3 left engines failed).
    "start_limit_interval_sec": 300,
    "start_limit_burst": 5,
    "limit_nofile": 1048576,
    "syslog_identifier": "sglang",
    "service_extra": (),  # unit_settings' other [Service] lines (unit_settings())
}

_SAFE_WORD = re.compile(r"[A-Za-z0-9_@%+=:,./-]+")
_ENV_KEY = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_ENV_ASSIGN = re.compile(r"(?:export[ \t]+)?([A-Za-z_][A-Za-z0-9_.-]*)[ \t]*=[ \t]*")
_MODULE = re.compile(r"[A-Za-z_]\w*(\.[A-Za-z_]\w*)*")


# ---------------------------------------------------------------- escaping


def _check_text(value: str, what: str) -> str:
    if not isinstance(value, str):
        raise UserError(f"{what}: expected text, got {type(value).__name__} {value!r}")
    bad = [c for c in value if (ord(c) < 32 and c != "\t") or ord(c) == 127]
    if bad:
        raise UserError(f"{what}: control character {bad[0]!r} not allowed in {value!r}")
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        raise UserError(f"{what}: not valid UTF-8: {value!r}") from None
    return value


def systemd_quote(arg: str) -> str:
    """One ExecStart= word that systemd turns back into exactly `arg` at exec time.

    Specifiers (`%`) and environment references (`$`) are doubled; anything
    beyond a plain word is double-quoted with C escapes for `\\` and `"`.
    Newlines and other control characters are refused (tab becomes `\\t`)."""
    _check_text(arg, "ExecStart argument")
    word = arg.replace("%", "%%").replace("$", "$$")
    if _SAFE_WORD.fullmatch(arg):
        return word
    word = word.replace("\\", "\\\\").replace('"', '\\"').replace("\t", "\\t")
    return f'"{word}"'


def systemd_exec(argv: Iterable[str]) -> str:
    """An ExecStart= value: the executable (absolute path) and its quoted arguments."""
    argv = list(argv)
    if not argv:
        raise UserError("ExecStart: empty command line")
    exe = _check_text(argv[0], "ExecStart executable")
    if not exe.startswith("/") or "$" in exe:
        raise UserError(f"ExecStart executable must be an absolute path without '$': {exe!r}")
    return " ".join(systemd_quote(a) for a in argv)


def unit_value(value) -> str:
    """A free-text unit setting (Description=, User=): no control chars, `%` doubled."""
    return _check_text(str(value), "unit setting").replace("%", "%%")


def unit_path(value) -> str:
    """A path setting (EnvironmentFile=, WorkingDirectory=): absolute, no whitespace."""
    text = _check_text(str(value), "unit path")
    if not text.startswith("/") or any(c.isspace() for c in text):
        raise UserError(f"unit path must be absolute without whitespace: {text!r}")
    return text.replace("%", "%%")


def int_value(value) -> str:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise UserError(f"unit setting: expected a non-negative integer, got {value!r}")
    return str(value)


def env_quote(value) -> str:
    """A value for an EnvironmentFile= line: double-quoted; `\\ " $ \\`` escaped.

    systemd.exec(5) and a POSIX shell both read it back as `value`."""
    text = _check_text(str(value), "env value")
    for ch in '\\"$`':
        text = text.replace(ch, "\\" + ch)
    return f'"{text}"'


def env_line(key: str, value) -> str:
    if not isinstance(key, str) or not _ENV_KEY.fullmatch(key):
        raise UserError(f"env file: invalid variable name {key!r}")
    if value is None or isinstance(value, (dict, list)):
        raise UserError(f"env file: {key} needs a text or number value, got {value!r}")
    if isinstance(value, bool):
        value = "1" if value else "0"
    return f"{key}={env_quote(value)}"


# ---------------------------------------------------------------- engine argv


def _req(profile: Mapping, key: str):
    if profile.get(key) in (None, ""):
        raise UserError(f"engine profile: missing required setting {key!r}")
    return profile[key]


_int = profile_table.integer


def _extra_args(extra) -> list[str]:
    """extra_args (flag_words), none of the flags engine_argv sets itself."""
    out = flag_words(extra, "engine profile: extra_args")
    for word in out:
        if word.split("=", 1)[0] in MANAGED_FLAGS:
            raise UserError(
                f"engine profile: extra_args may not set {word.split('=', 1)[0]}; "
                "it comes from the profile's own setting"
            )
    return out


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
        _check_text(word, what)
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
        _check_text(word, "engine argument")
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
        _check_text(value, f"engine flag {flag}")
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


# ---------------------------------------------------------------- rendering


@functools.lru_cache(maxsize=16)
def _environment(templates_dir: Path | None) -> jinja2.Environment:
    """One environment per templates dir for the process: jinja's own cache then compiles a
    template once, not once per render (a converged deploy renders the unit and the env file
    per host: 16 compiles for 8 hosts, GIL-bound); auto_reload recompiles an edited file."""
    env = jinja2.Environment(
        loader=jinja2.FileSystemLoader(str(templates_dir or TEMPLATES_DIR)),
        undefined=jinja2.StrictUndefined,
        autoescape=False,
        trim_blocks=True,
        lstrip_blocks=True,
        keep_trailing_newline=True,
    )
    env.filters.update(
        systemd_exec=systemd_exec, unit_value=unit_value, unit_path=unit_path, int_value=int_value, env_quote=env_quote
    )
    env.globals["env_line"] = env_line
    return env


def render(template: str, ctx: Mapping, templates_dir: Path | None = None) -> str:
    """Render one template strictly: an undefined variable is a UserError naming it."""
    try:
        return _environment(templates_dir).get_template(template).render(**ctx)
    except jinja2.TemplateNotFound:
        raise UserError(f"template {template} not found in {templates_dir or TEMPLATES_DIR}") from None
    except jinja2.UndefinedError as exc:
        raise UserError(f"template {template}: undefined variable: {exc.message}") from None
    except jinja2.TemplateSyntaxError as exc:
        raise UserError(f"template {exc.filename or template}:{exc.lineno}: {exc.message}") from None


# unit_settings in systemd's spelling for the settings the template writes itself: the value
# replaces the template's (a second `RestartSec=` line would be ambiguous to a reader).
SETTING_ALIASES = {
    "Description": "description",
    "User": "user",
    "Group": "group",
    "WorkingDirectory": "working_directory",
    "RestartSec": "restart_sec",
    "TimeoutStartSec": "timeout_start_sec",
    "TimeoutStopSec": "timeout_stop_sec",
    "StartLimitIntervalSec": "start_limit_interval_sec",
    "StartLimitBurst": "start_limit_burst",
    "LimitNOFILE": "limit_nofile",
    "SyslogIdentifier": "syslog_identifier",
}
# What the engine's launch depends on: the profile and `env` set these, never unit_settings.
OWNED_DIRECTIVES = {
    "ExecStart": "the profile",
    "Type": "k26ops (exec)",
    "EnvironmentFile": "k26ops",
    "Environment": "the `env` inventory variable",
}
_INT_SETTINGS = frozenset(
    {
        "restart_sec",
        "timeout_start_sec",
        "timeout_stop_sec",
        "start_limit_interval_sec",
        "start_limit_burst",
        "limit_nofile",
    }
)


@functools.lru_cache(maxsize=1)
def service_directives() -> frozenset[str]:
    """The [Service] directives systemd knows (templates/systemd-service-directives.txt, recorded from
    systemd 252's own list)."""
    text = resources.path("templates", "systemd-service-directives.txt").read_text(encoding="utf-8")
    return frozenset(line.strip() for line in text.splitlines() if line.strip() and not line.startswith("#"))


def _directive_value(name: str, value) -> list[str]:
    """`Name=value` lines: a list is one line per item (Environment-like directives), a bool yes/no."""
    items = value if isinstance(value, list) else [value]
    out = []
    for v in items:
        if isinstance(v, bool):
            v = "yes" if v else "no"
        if not isinstance(v, (str, int, float)) or v == "":
            raise UserError(f"unit_settings: {name}: expected a word, number, yes/no or a list of them, got {v!r}")
        out.append(f"{name}={unit_value(v)}")
    return out


def unit_settings(raw: Mapping) -> dict:
    """The inventory's `unit_settings` as render_unit's context: any systemd [Service] directive in
    systemd's spelling (`CPUAffinity: "0-7"`, `User: sglang`, `MemoryMax: 900G`), plus the template's
    own settings by their lowercase names (`restart_sec: 1`). An unknown key is a one-line error
    naming it; the host's `systemd-analyze verify` then checks the values."""
    out: dict = {}
    extra: list[str] = []
    for key, value in raw.items():
        key = str(key)
        if key in UNIT_DEFAULTS and key not in ("release_id", "env_file"):
            name = key
        elif key in SETTING_ALIASES:
            name = SETTING_ALIASES[key]
        elif key in OWNED_DIRECTIVES:
            raise UserError(f"unit_settings: {key}: set by {OWNED_DIRECTIVES[key]}, not by unit_settings")
        elif key in service_directives():
            extra.extend(_directive_value(key, value))
            continue
        else:
            near = difflib.get_close_matches(key, sorted(service_directives() | set(SETTING_ALIASES)), n=1)
            raise UserError(
                f"unit_settings: {key}: not a systemd [Service] directive"
                + (
                    f"; did you mean {near[0]}?"
                    if near
                    else " (systemd.exec(5), systemd.service(5), systemd.resource-control(5) name them)"
                )
            )
        if name in _INT_SETTINGS and (isinstance(value, bool) or not isinstance(value, int) or value < 0):
            raise UserError(
                f"unit_settings: {key}: expected a non-negative number of "
                f"{'seconds' if name.endswith('_sec') else 'units'}, got {value!r}"
            )
        out[name] = value
    if extra:
        out["service_extra"] = extra
    return out


def render_unit(ctx: Mapping, templates_dir: Path | None = None) -> str:
    """The unit file text. ctx: `argv` (or `profile`, turned into argv by
    engine_argv) plus any of UNIT_DEFAULTS' keys."""
    full = {**UNIT_DEFAULTS, **ctx}
    if "argv" not in full and "profile" in full:
        full["argv"] = engine_argv(full["profile"])
    text = render(UNIT_TEMPLATE, full, templates_dir)
    if not text.startswith(UNIT_MARKER):  # the next deploy would take the unit for someone else's
        raise UserError(f"template {UNIT_TEMPLATE} must start with the line '{UNIT_MARKER}...'")
    return text


def render_env(ctx: Mapping, templates_dir: Path | None = None) -> str:
    """The env file text. ctx: `env`, a mapping of variable -> value (secrets included)."""
    return render(ENV_TEMPLATE, ctx, templates_dir)


# ---------------------------------------------------------------- secrets

_SECRET_WORDS = ("TOKEN", "KEY", "SECRET", "PASSWORD", "PASSWD", "CREDENTIAL", "CREDENTIALS")
# Extra names the inventory marks secret (`secret_vars`, `secret_patterns`), set per run.
EXTRA_SECRET_NAMES: set[str] = set()
EXTRA_SECRET_PATTERNS: list[str] = []


def is_secret_key(name: str) -> bool:
    """A name that holds a secret, by its words (split at - _ . and case):
    HF_TOKEN, OPENAI_APIKEY, --api-key, AWS_SECRET_ACCESS_KEY, DB_PASSWORD,
    GCP_CREDENTIALS, K26OPS_SECRET_*; not --max-total-tokens (TOKENS counts
    things) nor --tokenizer-path. Plus the inventory's secret_vars / secret_patterns."""
    up = str(name).upper()
    if up.lstrip("-") in EXTRA_SECRET_NAMES or any(
        fnmatch.fnmatchcase(up.lstrip("-"), p.upper()) for p in EXTRA_SECRET_PATTERNS
    ):
        return True
    words = [w for w in re.split(r"[^A-Z0-9]+", up) if w]
    if words and words[-1] in ("FILE", "PATH", "DIR", "FILENAME", "FILES"):
        return False  # where a secret is (ansible_ssh_private_key_file), not the secret
    for word in words:
        if (
            word in _SECRET_WORDS
            or word.endswith(("KEY", "TOKEN", "SECRET", "PASSWORD", "PASSWD"))
            or word.startswith(("SECRET", "PASSWORD", "CREDENTIAL"))
            or _near_secret_word(word)
        ):
            return True
    return False


# Words one typo from a secret word that are not secrets (TOKENS counts things).
_NOT_SECRET_WORDS = frozenset({"TOKENS", "TAKEN", "WOKEN"})


@functools.lru_cache(maxsize=4096)
def _near_secret_word(word: str) -> bool:
    """A typo'd secret word (hf_tokn, DB_PASWORD, MY_SECRT): one letter off.
    Cached: difflib per word was most of listing a 200,000-host inventory (the
    same few variable names on every host)."""
    return (
        len(word) >= 4
        and word not in _NOT_SECRET_WORDS
        and any(
            abs(len(word) - len(w)) <= 1 and difflib.SequenceMatcher(None, word, w).ratio() >= 0.8
            for w in ("TOKEN", "SECRET", "PASSWORD", "PASSWD", "CREDENTIAL", "APIKEY")
        )
    )


# scheme://user:password@host, scheme://KEY@host (a Sentry DSN); user and password end at / ? # @ or space
_URL_USERINFO = re.compile(r"[A-Za-z][A-Za-z0-9+.-]*://(?P<user>[^\s/?#@:]*)(?::(?P<pw>[^\s/?#@]*))?@")
# Tokens whose shape says what they are, whatever the key is called.
_TOKEN_SHAPES = re.compile(
    r"(?:hf_|sk-|sk_live_|ghp_|gho_|ghs_|github_pat_|glpat-|xox[abpr]-)[A-Za-z0-9_-]{16,}"
    r"|AKIA[0-9A-Z]{16}"
)


def credentials_in(value) -> list[str]:
    """Secrets inside a value whatever its key is called: the password of a URL's
    `user:password@`, a URL user long enough to be a key (`https://KEY@o1.ingest.sentry.io/1`;
    not `git@`), and tokens of a known shape (hf_..., sk-..., ghp_..., AKIA...)."""
    if not isinstance(value, str):
        return []
    out = []
    for m in _URL_USERINFO.finditer(value):
        if m.group("pw"):
            out.append(m.group("pw"))
        elif len(m.group("user")) >= 16:
            out.append(m.group("user"))
    return out + _TOKEN_SHAPES.findall(value)


def mask_credentials(value: str) -> str:
    """`value` with each credential inside it (credentials_in) replaced by <redacted>."""
    for cred in sorted(set(credentials_in(value)), key=len, reverse=True):
        value = value.replace(cred, REDACTED)
    return value


def set_secret_policy(names=(), patterns=()) -> None:
    """The inventory's own secret names and glob patterns (see is_secret_key)."""
    EXTRA_SECRET_NAMES.clear()
    EXTRA_SECRET_NAMES.update(str(n).upper().lstrip("-") for n in names)
    EXTRA_SECRET_PATTERNS[:] = [str(p) for p in patterns]


def secrets_of(env: Mapping) -> list[str]:
    """The values of an env mapping's secret keys and the credentials inside any
    of its values (a DATABASE_URL's password), for redact."""
    return [str(v) for k, v in env.items() if is_secret_key(k) and v not in (None, "")] + [
        c for v in env.values() for c in credentials_in(v)
    ]


def is_secret_item(key: str, value) -> bool:
    """An env entry to keep out of baselines whole: a secret name, or a credential in its value."""
    return is_secret_key(key) or bool(credentials_in(value))


def secret_flag_values(words: list[str]) -> dict[int, tuple[str, str, bool]]:
    """Where the secret flags' values are in a flag list: {index of the word that
    holds the value: (flag, value, inline)} for `--api-key=X` (inline, its own
    word) and `--api-key X` (the next word, when it is not a flag)."""
    hits: dict[int, tuple[str, str, bool]] = {}
    for i, w in enumerate(words):
        flag, eq, val = w.partition("=")
        if flag.startswith("--") and is_secret_key(flag):
            if eq:
                hits[i] = (flag, val, True)
            elif i + 1 < len(words) and not words[i + 1].startswith("--"):
                hits[i + 1] = (flag, words[i + 1], False)
    return hits


def secret_values(value, name: str = "", depth: int = 0) -> list[str]:
    """Every secret value inside inventory vars: values of secret-named keys at any
    depth (engine_env, extra_flags mappings), values after secret flags in flag
    lists (`[--api-key, X]`, `--api-key=X`), and every !vault value's text."""
    out: list[str] = []
    if depth > 20:
        return out
    if type(value).__name__ == "Vault":
        return [str(getattr(value, "ciphertext", ""))]
    if isinstance(value, str):
        return credentials_in(value)
    if isinstance(value, Mapping):
        for k, v in value.items():
            if is_secret_key(str(k)) and isinstance(v, (str, int)) and not isinstance(v, bool):
                out.append(str(v))
            out += secret_values(v, str(k), depth + 1)
    elif isinstance(value, (list, tuple)):
        out += [v for _flag, v, _inline in secret_flag_values([str(w) for w in value]).values()]
        for item in value:
            out += secret_values(item, name, depth + 1) if isinstance(item, (Mapping, list, str)) else []
    return [v for v in out if v]


def redact_vars(value, _active: set | None = None, _memo: dict | None = None):
    """Inventory vars for display: values of secret-named keys (typo'd ones too:
    hf_tokn) and of secret flags in flag lists become <redacted>, and so do
    credentials inside any text (credentials_in); !vault values stay <vault>. What has
    nothing to redact is returned as it is (the same objects: recursive vars
    stay recursive for the printer). A container reached again (a YAML alias) is
    redacted once: an alias bomb just under the limit has 2 million copies of a few
    lists (only a result whose walk met no recursion is reused: that one depends
    on where the walk came from)."""
    active = set() if _active is None else _active
    memo = {"cycles": 0} if _memo is None else _memo
    if id(value) in active:
        memo["cycles"] += 1
        return value
    if not isinstance(value, (Mapping, list, tuple)):
        return mask_credentials(value) if isinstance(value, str) and credentials_in(value) else value
    seen = memo.get(id(value))
    if seen is not None and seen[0] is value:
        return seen[1]
    cycles = memo["cycles"]
    active.add(id(value))
    if isinstance(value, Mapping):
        new = {
            k: (
                REDACTED
                if is_secret_key(str(k))
                and not isinstance(v, (Mapping, list, tuple))
                and type(v).__name__ != "Vault"
                and v not in (None, "")
                else redact_vars(v, active, memo)
            )
            for k, v in value.items()
        }
        result = value if all(new[k] is value[k] for k in value) else new
    else:
        hits = secret_flag_values([str(w) for w in value])
        out = []
        for i, v in enumerate(value):
            if isinstance(v, str) and i in hits:
                flag, _val, inline = hits[i]
                out.append(f"{flag}={REDACTED}" if inline else REDACTED)
            else:
                out.append(redact_vars(v, active, memo))
        result = value if all(a is b for a, b in zip(out, value)) else out
    active.discard(id(value))
    if memo["cycles"] == cycles:
        memo[id(value)] = (value, result)
    return result


def secret_ref_name(flag: str) -> str:
    """The env variable an older k26ops kept a secret flag's value in (a baseline's env file may name it)."""
    return "K26OPS_SECRET_" + re.sub(r"[^A-Z0-9]+", "_", flag.lstrip("-").upper()).strip("_")


def split_secret_flags(argv: list[str]) -> tuple[list[str], dict[str, str]]:
    """Engine flags whose name is secret (`--api-key X`, `--api-key=X`) taken out
    of a command line: (the words without them, {flag: value}). Their values go
    to the root-only --config file (render_secret_config), never into the unit,
    the manifest or the engine's argv."""
    hits = {
        i: h
        for i, h in secret_flag_values(argv).items()  # a list flag (`--x-token-map A B`) holds no secret
        if h[2] or i + 1 >= len(argv) or argv[i + 1].startswith("--")
    }
    drop = {i - 1 for i, (_f, _v, inline) in hits.items() if not inline}
    out = [w for i, w in enumerate(argv) if i not in hits and i not in drop]
    return out, {flag: val for _i, (flag, val, _inline) in sorted(hits.items())}


def redact(text: str, secrets: Iterable[str] | Mapping) -> str:
    """`text` with every secret value (also in its quoted/escaped spellings)
    replaced by <redacted>. A Mapping is read as an env: its secret keys' values."""
    values = secrets_of(secrets) if isinstance(secrets, Mapping) else [str(s) for s in secrets if s]
    forms: set[str] = set()
    for s in values:
        forms |= {s, json.dumps(s)[1:-1], shlex.quote(s)}
        try:
            forms |= {env_quote(s)[1:-1], systemd_quote(s).strip('"')}
        except UserError:
            pass
    for form in sorted((f for f in forms if f), key=len, reverse=True):
        text = text.replace(form, REDACTED)
    return text


def parse_env(text: str) -> list[tuple[str, str, int, int]]:
    """(key, value, value_start, value_end) for each assignment, read the way
    systemd reads an EnvironmentFile= (comments, quotes, escapes, continuations)."""
    out = []
    i, n = 0, len(text)
    while i < n:
        while i < n and text[i] in " \t\r\n":
            i += 1
        if i >= n:
            break
        if text[i] in "#;":
            i = text.find("\n", i)
            i = n if i < 0 else i
            continue
        m = _ENV_ASSIGN.match(text, i)
        if not m:
            i = text.find("\n", i)
            i = n if i < 0 else i
            continue
        key, start = m.group(1), m.end()
        value, j = _env_value(text, start)
        out.append((key, value, start, j))
        i = j
    return out


def _env_value(text: str, i: int) -> tuple[str, int]:
    """systemd's value state machine: quotes open only where a value (or a
    quoted part) starts; trailing unquoted whitespace is dropped."""
    n, buf, keep, state = len(text), [], 0, "pre"
    while i < n:
        c = text[i]
        if state in ("pre", "value") and c in "\n\r":
            break
        if state == "pre" and c in "'\"":
            state = "single" if c == "'" else "double"
        elif state in ("pre", "value") and c == "\\":
            if i + 1 < n and text[i + 1] != "\n":
                buf.append(text[i + 1])
                keep = len(buf)
            i += 1
            state = "value"
        elif state == "pre" and c in " \t":
            pass
        elif state in ("pre", "value"):
            state = "value"
            buf.append(c)
            if c not in " \t":
                keep = len(buf)
        elif state == "single":
            if c == "'":
                state = "pre"
            else:
                buf.append(c)
                keep = len(buf)
        else:  # double
            if c == '"':
                state = "pre"
            elif c == "\\" and i + 1 < n:
                nxt = text[i + 1]
                buf += [] if nxt == "\n" else [nxt] if nxt in '"\\`$' else ["\\", nxt]
                keep = len(buf)
                i += 1
            else:
                buf.append(c)
                keep = len(buf)
        i += 1
    return "".join(buf[:keep]), i


def env_for_baseline(env_text: str, marker: str = REDACTED) -> str:
    """The env file text with each secret key's value replaced by `marker`
    (the baselines repository keeps the file's shape, never the secret)."""
    for key, value, start, end in reversed(parse_env(env_text)):
        if is_secret_item(key, value):
            env_text = env_text[:start] + marker + env_text[end:]
    return env_text
