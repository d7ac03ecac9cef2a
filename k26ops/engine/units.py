"""The engine's systemd unit and env file, rendered from templates/ with Jinja: the unit's
settings and their checks, the env file. The command line is k26ops.engine.launch's,
systemd's quoting k26ops.engine.systemd's, redaction k26ops.engine.secret_policy's. Pure: no
host access.
"""

from __future__ import annotations

import difflib
import functools
import os
from collections.abc import Mapping
from pathlib import Path

import jinja2

from k26ops import resources
from k26ops.engine.launch import engine_argv
from k26ops.engine.systemd import env_line, env_quote, int_value, systemd_exec, unit_path, unit_value
from k26ops.errors import UserError

TEMPLATES_DIR = Path(os.environ.get("K26OPS_TEMPLATES") or resources.path("templates"))
UNIT_TEMPLATE = "sglang.service.j2"
ENV_TEMPLATE = "sglang.env.j2"
ENV_FILE = "/etc/k26ops/sglang.env"
# The first line of every unit k26ops renders: a unit without it is not k26ops' to overwrite.
UNIT_MARKER = "# Managed by k26ops"
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
