"""The engine unit and env file: argv, strict rendering, systemd escaping
(checked against real systemd where it runs), secrets.

Real systemd checks: `systemd-analyze verify` works without systemd as PID 1.
For the ExecStart round trip the test runs systemd itself in `--test` mode
(a user manager that loads the unit, dumps each parsed command line and
exits; it refuses to run as root, so as root it drops to `nobody` with
setpriv). Where either is missing those tests skip and the test-side parser
(systemd.service(5) rules) still checks every case.
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from k26ops.engine import launch, secret_policy, systemd, units
from k26ops.errors import UserError

HOSTILE = [
    "plain",
    "two words",
    "50%",
    "%n",
    "%%",
    "100%% sure",
    'say "hi"',
    "it's",
    "'single'",
    "$(rm -rf /)",
    "`id`",
    "${HOME}",
    "$HOME",
    "$$",
    "$",
    "a;b",
    ";",
    "\\;",
    "back\\slash",
    "trailing\\",
    "\\\\",
    "tab\there",
    "  lead and trail  ",
    "",
    "#not-a-comment",
    "a=b c",
    "{braces}",
    "*?[x]",
    "ünïcödé ✓",
    "\\x41",
    "\\n",
    "&& echo pwned",
    "|",
    "> /etc/passwd",
]

PROFILE = {
    "model_path": "/models/Kimi-K2.6",
    "draft_model_path": "/models/Kimi-K2.6-DFlash",
    "speculative_ddtree_budget": 64,
    "speculative_dflash_block_size": 8,
    "cuda_graph_max_bs_decode": 32,
    "host": "0.0.0.0",
    "port": 30000,
}


# ---------------------------------------------------------------- test-side systemd parser

_CESC = {
    "a": "\a",
    "b": "\b",
    "f": "\f",
    "n": "\n",
    "r": "\r",
    "t": "\t",
    "v": "\v",
    "\\": "\\",
    '"': '"',
    "'": "'",
    "s": " ",
}


def systemd_split(line: str) -> list[str]:
    """ExecStart= value -> argv as systemd builds it (systemd.service(5)
    "Command lines"): words split on whitespace with quotes and C escapes
    removed (extract_first_word, UNQUOTE|CUNESCAPE|CUNESCAPE_RELAX), then `%%` -> `%` per
    word (specifiers), then at exec time `$$` -> `$` (environment)."""
    words, i, n = [], 0, len(line)
    while True:
        while i < n and line[i] in " \t":
            i += 1
        if i >= n:
            break
        if line[i] == ";" and (i + 1 == n or line[i + 1] in " \t"):
            raise ValueError("unquoted lone ';' separates commands")
        word, quote, started = [], None, False
        while i < n:
            c = line[i]
            if c == "\\":
                if i + 1 >= n:
                    raise ValueError("trailing backslash")
                nxt = line[i + 1]
                if nxt == "x":
                    word.append(chr(int(line[i + 2 : i + 4], 16)))
                    i += 4
                    continue
                word.append(_CESC.get(nxt, "\\" + nxt))  # unknown: kept (CUNESCAPE_RELAX)
                i += 2
                continue
            if quote:
                if c == quote:
                    quote = None
                else:
                    word.append(c)
            elif c in "\"'":
                quote, started = c, True
            elif c in " \t":
                break
            else:
                word.append(c)
            i += 1
        if quote:
            raise ValueError("unbalanced quoting")
        if word or started:
            words.append("".join(word))
    return [_env_expand(_specifiers(w)) for w in words]


def _specifiers(word: str) -> str:
    out, i = [], 0
    while i < len(word):
        if word[i] == "%":
            if word[i + 1 : i + 2] != "%":
                raise ValueError(f"specifier %{word[i + 1 : i + 2]} would be expanded in {word!r}")
            i += 1
        out.append(word[i])
        i += 1
    return "".join(out)


def _env_expand(word: str) -> str:
    out, i = [], 0
    while i < len(word):
        if word[i] == "$":
            nxt = word[i + 1 : i + 2]
            if nxt == "$":
                out.append("$")
                i += 2
                continue
            if nxt == "{" or re.match(r"[A-Za-z_]", nxt):
                raise ValueError(f"environment reference would be expanded in {word!r}")
        out.append(word[i])
        i += 1
    return "".join(out)


def test_test_parser_follows_systemd_rules():
    assert systemd_split('/bin/x "a b" \'c d\' e\\ f a\\sb "" x""y 100%% $$HOME "\\"q\\""') == [
        "/bin/x",
        "a b",
        "c d",
        "e\\ f",
        "a b",
        "",
        "xy",
        "100%",
        "$HOME",
        '"q"',
    ]
    for bad in ['/bin/x "a', "/bin/x %n", "/bin/x $HOME", "/bin/x ;"]:
        with pytest.raises(ValueError):
            systemd_split(bad)


# ---------------------------------------------------------------- real systemd helpers


def _verify(unit: Path) -> subprocess.CompletedProcess:
    return subprocess.run(
        ["systemd-analyze", "verify", "--man=no", str(unit)], capture_output=True, text=True, timeout=60
    )


def _can_verify() -> bool:
    if not shutil.which("systemd-analyze"):
        return False
    with tempfile.TemporaryDirectory() as d:
        u = Path(d) / "probe.service"
        u.write_text(f"[Service]\nExecStart={sys.executable} -V\n")
        return _verify(u).returncode == 0


SYSTEMD = shutil.which("systemd") or next(
    (p for p in ("/lib/systemd/systemd", "/usr/lib/systemd/systemd") if os.path.exists(p)), None
)
needs_verify = pytest.mark.skipif(
    not _can_verify() and not os.environ.get("CI"), reason="systemd-analyze verify unavailable here"
)


def systemd_dump_commands(unit_text: str, name: str = "k26ops-roundtrip.service") -> list[list[str]]:
    """Real systemd parses `unit_text` (systemd --test --user dumps each
    command line it built, re-quoted for a POSIX shell, before `$` expansion)."""
    d = Path(tempfile.mkdtemp(prefix="k26ops-units-"))
    try:
        d.chmod(0o755)
        (d / "run").mkdir(mode=0o700)
        (d / name).write_text(unit_text)
        (d / name).chmod(0o644)
        cmd = [SYSTEMD, "--test", "--user", f"--unit={name}", "--log-target=console", "--log-level=err"]
        if os.geteuid() == 0:  # "Don't run test mode as root."
            os.chown(d / "run", 65534, 65534)
            cmd = ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", *cmd]
        env = {"PATH": "/usr/bin:/bin", "HOME": str(d), "XDG_RUNTIME_DIR": str(d / "run"), "SYSTEMD_UNIT_PATH": f"{d}:"}
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=60, env=env).stdout
    finally:
        shutil.rmtree(d, ignore_errors=True)
    block = out.split(f"-> Unit {name}:", 1)[1].split("\n\t-> Unit ", 1)[0]
    return [_dump_words(m) for m in re.findall(r"^\t+Command Line: (.*)$", block, flags=re.M)]


def _dump_words(line: str) -> list[str]:
    """The dump's quoting (systemd's quote_command_line/shell_maybe_quote):
    words needing it are double-quoted with `"`, `\\`, `` ` ``, `$` backslashed
    and a tab written `\\t` (the only control character units.py lets through)."""
    words, i, n = [], 0, len(line)
    while i < n:
        if line[i] == " ":
            i += 1
            continue
        word, quoted = [], False
        while i < n and (quoted or line[i] != " "):
            c = line[i]
            if c == '"':
                quoted = not quoted
            elif quoted and c == "\\" and line[i + 1 : i + 2] in ('"', "\\", "`", "$", "t"):
                word.append("\t" if line[i + 1] == "t" else line[i + 1])
                i += 1
            else:
                word.append(c)
            i += 1
        words.append("".join(word))
    return words


def _can_dump() -> bool:
    if not SYSTEMD or (os.geteuid() == 0 and not shutil.which("setpriv")):
        return False
    try:
        return systemd_dump_commands("[Service]\nExecStart=/bin/true 'a b'\n") == [["/bin/true", "a b"]]
    except Exception:
        return False


needs_dump = pytest.mark.skipif(not _can_dump() and not os.environ.get("CI"), reason="systemd --test cannot run here")


# ---------------------------------------------------------------- quoting


@pytest.mark.parametrize("arg", HOSTILE)
def test_systemd_quote_round_trips_in_test_parser(arg):
    assert systemd_split(f"/bin/x {systemd.systemd_quote(arg)}") == ["/bin/x", arg]


def test_systemd_quote_plain_words_stay_readable():
    assert systemd.systemd_quote("--tp-size") == "--tp-size"
    assert systemd.systemd_quote("/models/Kimi-K2.6") == "/models/Kimi-K2.6"
    assert systemd.systemd_quote("50%") == "50%%"
    assert systemd.systemd_quote("a b") == '"a b"'
    assert systemd.systemd_quote("") == '""'


@pytest.mark.parametrize("arg", ["a\nb", "a\rb", "nul\x00", "bell\x07", "\x7f"])
def test_systemd_quote_refuses_control_characters(arg):
    with pytest.raises(UserError):
        systemd.systemd_quote(arg)


@given(st.lists(st.text(st.characters(blacklist_categories=("Cs", "Cc"))), max_size=6))
@settings(max_examples=300, deadline=None)
def test_any_printable_argv_round_trips(args):
    line = systemd.systemd_exec(["/bin/x", *args])
    assert systemd_split(line) == ["/bin/x", *args]


@needs_dump
def test_real_systemd_parses_hostile_argv_back_exactly():
    """Hostile args into a real rendered unit; systemd's own parse gives them back."""
    profile = {
        **PROFILE,
        "model_path": "/models/my model %i $(reboot)",
        "extra_args": [a for pair in zip(["--x"] * len(HOSTILE), HOSTILE) for a in pair],
    }
    argv = launch.engine_argv(profile)
    argv[0] = "/usr/bin/python3"
    unit = units.render_unit({"argv": argv})
    (parsed,) = systemd_dump_commands(unit)
    assert parsed == [a.replace("$", "$$") for a in argv]  # dump is before `$$` -> `$`
    exec_line = next(l for l in unit.splitlines() if l.startswith("ExecStart="))
    assert systemd_split(exec_line[len("ExecStart=") :]) == argv


@needs_dump
@given(
    st.lists(
        st.lists(st.text(st.characters(blacklist_categories=("Cs", "Cc")), max_size=12), max_size=4),
        min_size=1,
        max_size=8,
    )
)
@settings(max_examples=15, deadline=None)
def test_real_systemd_agrees_on_generated_argvs(argvs):
    """Many generated command lines at once (ExecStartPre= may repeat)."""
    lines = "".join(f"ExecStartPre={systemd.systemd_exec(['/bin/echo', *a])}\n" for a in argvs)
    dumped = systemd_dump_commands(f"[Service]\n{lines}ExecStart=/bin/true\n")
    assert dumped[:-1] == [["/bin/echo", *[w.replace("$", "$$") for w in a]] for a in argvs]


# ---------------------------------------------------------------- engine argv


def test_engine_argv_profile():
    argv = launch.engine_argv(
        {**PROFILE, "extra_args": {"mem-fraction-static": 0.85, "--enable-metrics": True, "--off": False}}
    )
    assert argv[:3] == ["/opt/k26ops/releases/current/venv/bin/python", "-m", "sglang.launch_server"]
    joined = " ".join(argv)
    for part in [
        "--model-path /models/Kimi-K2.6",
        "--tp-size 8",
        "--speculative-algorithm DDTREE",
        "--speculative-draft-model-path /models/Kimi-K2.6-DFlash",
        "--speculative-ddtree-budget 64",
        "--speculative-dflash-block-size 8",
        "--cuda-graph-max-bs-decode 32",
        "--host 0.0.0.0",
        "--port 30000",
        "--mem-fraction-static 0.85",
        "--enable-metrics",
    ]:
        assert part in joined
    assert "--off" not in argv and "--nnodes" not in argv and "--disable-cuda-graph" not in argv


def test_engine_argv_lab_module_disable_graph_and_multinode():
    argv = launch.engine_argv(
        {
            **PROFILE,
            "launch_module": "k26ops_engine_standin",
            "python": "/usr/bin/python3",
            "disable_cuda_graph": True,
            "nnodes": 2,
            "node_rank": 1,
            "dist_init_addr": "10.0.0.1:5000",
        }
    )
    assert argv[:3] == ["/usr/bin/python3", "-m", "k26ops_engine_standin"]
    assert "--disable-cuda-graph" in argv and "--cuda-graph-max-bs-decode" not in argv
    assert argv[argv.index("--nnodes") :][:6] == [
        "--nnodes",
        "2",
        "--node-rank",
        "1",
        "--dist-init-addr",
        "10.0.0.1:5000",
    ]


@pytest.mark.parametrize(
    "bad, needle",
    [
        ({"model_path": None}, "model_path"),
        ({"tp_size": "8"}, "tp_size"),
        ({"port": True}, "port"),
        ({"launch_module": "x; rm -rf /"}, "launch_module"),
        ({"nnodes": 2}, "node_rank"),
        ({"nnodes": 2, "node_rank": 2, "dist_init_addr": "h:1"}, "node_rank"),
        ({"nnodes": 2, "node_rank": 0}, "dist_init_addr"),
        ({"extra_args": ["--tp-size", "4"]}, "--tp-size"),
        ({"extra_args": "--foo"}, "extra_args"),
        ({"extra_args": ["--x", "line\nbreak"]}, "control character"),
    ],
)
def test_engine_argv_bad_profiles_are_user_errors(bad, needle):
    with pytest.raises(UserError, match=re.escape(needle)):
        launch.engine_argv({**PROFILE, **bad})


# ---------------------------------------------------------------- rendering


def test_render_unit_contents():
    text = units.render_unit({"profile": PROFILE, "release_id": "r-abc", "user": "sglang"})
    for line in [
        "Type=exec",
        "Restart=on-failure",
        "StartLimitBurst=5",
        "StartLimitIntervalSec=300",
        "TimeoutStartSec=3600",
        "LimitNOFILE=1048576",
        "User=sglang",
        "EnvironmentFile=/etc/k26ops/sglang.env",
        "WantedBy=multi-user.target",
    ]:
        assert line in text.splitlines()
    assert text == units.render_unit({"profile": PROFILE, "release_id": "r-abc", "user": "sglang"})


def test_undefined_variable_names_it_and_the_template(tmp_path):
    (tmp_path / "t.j2").write_text("X={{ nope }}\n")
    with pytest.raises(UserError, match=r"t\.j2.*nope"):
        units.render("t.j2", {}, tmp_path)
    with pytest.raises(UserError, match=r"sglang\.service\.j2.*argv"):
        units.render_unit({})
    with pytest.raises(UserError, match=r"sglang\.env\.j2.*env"):
        units.render_env({})


def test_unit_settings_are_escaped_or_refused():
    text = units.render_unit({"argv": ["/bin/true"], "description": "100% K2.6"})
    assert "Description=100%% K2.6" in text
    with pytest.raises(UserError):
        units.render_unit({"argv": ["/bin/true"], "description": "x\n[Service]\nExecStartPre=/bin/sh"})
    with pytest.raises(UserError):
        units.render_unit({"argv": ["/bin/true"], "env_file": "relative/env"})
    with pytest.raises(UserError):
        units.render_unit({"argv": ["bin/true"]})


def test_secrets_never_in_unit():
    env = {"HF_TOKEN": "hf_SuperSecret123"}
    unit = units.render_unit({"profile": PROFILE})
    assert "hf_" not in unit and "HF_TOKEN=" not in unit
    assert "HF_TOKEN=" in units.render_env({"env": env})


@pytest.mark.parametrize(
    "extra",
    [
        {"api-key": "sk-UNIT-Secret-91"},
        ["--api-key", "sk-UNIT-Secret-91"],
        ["--api-key=sk-UNIT-Secret-91"],
        {"admin-api-key": "sk-UNIT-Secret-91"},
    ],
)
def test_secret_flag_kept_out_of_the_unit_and_the_engines_argv(extra):
    """The secret flag's value is neither in the unit file nor in any word of the
    engine's command line, not even as a ${VAR} systemd would expand from the env
    file (that put it in the process's argv: `ps`, `systemctl status`)."""
    profile = {**PROFILE, "extra_args": extra}
    argv = launch.engine_argv(profile)
    unit = units.render_unit({"profile": profile})
    assert "sk-UNIT-Secret-91" not in unit and "sk-UNIT-Secret-91" not in " ".join(argv)
    assert not [w for w in argv if "$" in w], argv  # nothing for systemd to expand into the argv
    assert "--api-key" not in argv and "--admin-api-key" not in argv
    exec_line = next(l for l in unit.splitlines() if l.startswith("ExecStart="))
    assert "$" not in exec_line, exec_line


@needs_verify
@pytest.mark.parametrize(
    "extra",
    [
        {},
        {"disable_cuda_graph": True},
        {"nnodes": 2, "node_rank": 1, "dist_init_addr": "10.0.0.1:5000"},
        {"extra_args": [a for x in HOSTILE for a in ("--x", x)]},
    ],
)
def test_rendered_units_pass_systemd_analyze_verify(tmp_path, extra):
    env_file = tmp_path / "sglang.env"
    env_file.write_text(units.render_env({"env": {"HF_TOKEN": "hf_x", "CUDA_HOME": "/usr/local/cuda"}}))
    env_file.chmod(0o600)
    unit = tmp_path / "k26ops-sglang.service"
    unit.write_text(
        units.render_unit(
            {
                "profile": {**PROFILE, **extra, "python": sys.executable},
                "env_file": str(env_file),
                "working_directory": str(tmp_path),
            }
        )
    )
    res = _verify(unit)
    assert res.returncode == 0, res.stderr
    assert res.stderr.strip() == "", res.stderr  # no warnings (unknown keys etc.) either


@needs_verify
def test_systemd_analyze_verify_catches_a_broken_unit(tmp_path):
    unit = tmp_path / "broken.service"
    unit.write_text(f'[Service]\nExecStart={sys.executable} "unbalanced\n')
    assert _verify(unit).returncode != 0


# ---------------------------------------------------------------- env file

ENV_VALUES = [
    "plain",
    "two words",
    'quo"te',
    "it's",
    "$HOME",
    "${X}",
    "`id`",
    "back\\slash",
    "trailing\\",
    "#hash",
    "; semi",
    "  spaced  ",
    "",
    "ünï",
    "tab\tx",
    "a=b",
]


def test_env_file_round_trips_through_posix_shell_and_systemd_rules(tmp_path):
    env = {f"V{i}": v for i, v in enumerate(ENV_VALUES)}
    text = units.render_env({"env": env})
    assert {k: v for k, v, _s, _e in systemd.parse_env(text)} == env
    f = tmp_path / "env"
    f.write_text(text)
    for key, value in env.items():
        out = subprocess.run(
            ["/bin/sh", "-c", f'. "$1"; printf %s "${key}"', "sh", str(f)],
            capture_output=True,
            text=True,
            timeout=10,
            check=True,
        ).stdout
        assert out == value, key


def test_parse_env_systemd_shapes():
    text = '# c\n; c\nA=1 \nB=\'x y\' "z"\nC=a\\\nb\nD="multi\\\nline"\nE = spaced\n'
    assert {k: v for k, v, *_ in systemd.parse_env(text)} == {
        "A": "1",
        "B": "x yz",
        "C": "ab",
        "D": "multiline",
        "E": "spaced",
    }


@pytest.mark.parametrize("env", [{"BAD-KEY": "x"}, {"1X": "x"}, {"X": "a\nb"}, {"X": None}])
def test_env_file_refuses_bad_entries(env):
    with pytest.raises(UserError):
        units.render_env({"env": env})


# ---------------------------------------------------------------- secrets


def test_redact_all_spellings():
    secret = 'hf_"ab$c\\d'
    text = (
        f"token={secret} env={systemd.env_quote(secret)} arg={systemd.systemd_quote(secret)} "
        f'sh={shlex.quote(secret)} json="hf_\\"ab$c\\\\d"'
    )
    out = secret_policy.redact(text, [secret])
    assert "ab$c" not in out and out.count("<redacted>") == 5
    assert (
        secret_policy.redact("HF_TOKEN=hf_1 other", {"HF_TOKEN": "hf_1", "MODEL": "other"})
        == "HF_TOKEN=<redacted> other"
    )
    assert secret_policy.redact("nothing", []) == "nothing"


def test_env_for_baseline_masks_secret_keys_only():
    env = {
        "HF_TOKEN": "hf_abc",
        "GITHUB_TOKEN": "ghp_x",
        "S3_ACCESS_KEY": "k",
        "MY_SECRET_X": "s",
        "DB_PASSWORD": "p",
        "CUDA_HOME": "/usr/local/cuda",
        "PATH": "/bin",
    }
    text = units.render_env({"env": env}) + "hf_token='multi\nline'\n"
    out = secret_policy.env_for_baseline(text)
    for value in ["hf_abc", "ghp_x", 'S3_ACCESS_KEY="k"', '"s"', '"p"', "multi", "line"]:
        assert value not in out
    assert 'CUDA_HOME="/usr/local/cuda"' in out and 'PATH="/bin"' in out
    assert out.count("<redacted>") == 6
    assert secret_policy.env_for_baseline(out) == out  # stable: a second pass changes nothing


def test_a_template_is_compiled_once_per_process_and_again_when_edited(tmp_path, monkeypatch):
    """A converged deploy renders the unit and the env file for every host (8 hosts: 16
    renders): jinja compiles each template once; an edited template file is read again."""
    import jinja2

    compiled = []
    real = jinja2.Environment.compile
    monkeypatch.setattr(
        jinja2.Environment,
        "compile",
        lambda self, source, name=None, *a, **k: compiled.append(name) or real(self, source, name, *a, **k),
    )
    first = units.render_unit({"argv": ["/bin/true"]})
    assert units.render_unit({"argv": ["/bin/true"]}) == first
    units.render_env({"env": {"A": "1"}})
    units.render_env({"env": {"A": "2"}})
    assert compiled.count(units.UNIT_TEMPLATE) <= 1 and compiled.count(units.ENV_TEMPLATE) <= 1, compiled
    tpl = tmp_path / units.ENV_TEMPLATE
    tpl.write_text("A={{ env.A }}\n")
    assert units.render_env({"env": {"A": "1"}}, templates_dir=tmp_path) == "A=1\n"
    tpl.write_text("B={{ env.A }}\n")
    os.utime(tpl, (tpl.stat().st_atime + 5, tpl.stat().st_mtime + 5))
    assert units.render_env({"env": {"A": "1"}}, templates_dir=tmp_path) == "B=1\n"
