"""Bad input and secrets, against a real lab host (nspawn, systemd, sshd):
hostile host names, group vars, engine flags, tag names and file paths never
run anything on the host or the control node and never escape the release or
baselines directories; an HF token given in the inventory never shows in
anything k26ops prints or stores; command-line values fuzzed with hypothesis
always give a clean one-line error."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest
import yaml
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from sglang_release import CACHE as TEST_CACHE

from labtools.invoke import cli, k26ops
from labtools.labs import private_lab
from labtools.ports import free_port_block
from labtools.recipes import harmless_patch, lab_recipe_copy, write_series

TOKEN = "hf_INPUTSECRET_77aa88bb99cc"
TOKEN2 = "hf_OTHERSECRET_1122334455"
UNIT = "k26-engine.service"
ENV_FILE = "/etc/k26ops/sglang.env"
FULL = "name: full\nsteps:\n  - release: {keep: 3}\n  - service: {}\n  - health: {}\n  - smoke: {}\n"
MARK = "K26INJ"


def payloads(tag: str) -> list[str]:
    m = f"/tmp/{MARK}_{tag}"
    return [
        f"$(touch {m}_1)",
        f"`touch {m}_2`",
        f"x; touch {m}_3",
        f"x | touch {m}_4",
        f"x\ntouch {m}_5",
        f"x' ; touch {m}_6 ; '",
        f'x" ; touch {m}_7 ; "',
        f"x && touch {m}_8",
        f"../../../../tmp/{MARK}_{tag}_9",
        f"x\rtouch {m}_10",
        f"${{IFS}}touch${{IFS}}{m}_11",
    ]


def no_markers(lab) -> None:
    on_host = lab.ssh(
        lab.hosts[0].name, f"find / -xdev -name '*{MARK}*' 2>/dev/null | grep -v '^/opt/k26ops/releases/' ; true"
    )
    assert on_host.strip() == "", f"host: {on_host}"
    local = subprocess.run(
        f"find /tmp /root /var/tmp -maxdepth 3 -name '*{MARK}*' 2>/dev/null | grep -v pytest-of",
        shell=True,
        capture_output=True,
        text=True,
    ).stdout
    assert local.strip() == "", f"control node: {local}"


def one_line_error_or_ok(proc, allowed=(0, 1, 2)) -> None:
    text = proc.stdout + proc.stderr
    assert "Traceback" not in text, text
    assert proc.returncode in allowed, (proc.returncode, text)
    if proc.returncode == 2:
        err = [line for line in proc.stderr.splitlines() if line.strip()]
        assert len(err) == 1 and err[0].startswith("k26ops: error: "), proc.stderr


@pytest.fixture(scope="module")
def host():
    with private_lab(1, "faultsin", deployed=True) as running:
        yield running


@pytest.fixture(scope="module")
def base_inv(host, tmp_path_factory):
    d = tmp_path_factory.mktemp("faultsin")
    inv = yaml.safe_load(host.inventory.read_text())
    inv["vars"]["hf_token"] = TOKEN
    inv["hosts"]["lab1"]["vars"]["engine_port"] = free_port_block(1, start=36000, stop=40000)
    return {"dir": d, "inv": inv}


def write_inv(
    base_inv, name: str, host_vars: dict | None = None, all_vars: dict | None = None, hosts: dict | None = None
) -> Path:
    inv = json.loads(json.dumps(base_inv["inv"]))
    inv["hosts"]["lab1"]["vars"].update(host_vars or {})
    inv["vars"].update(all_vars or {})
    if hosts is not None:
        inv["hosts"] = hosts
        inv.pop("groups", None)
    path = base_inv["dir"] / f"{name}.yml"
    path.write_text(yaml.safe_dump(inv, sort_keys=False))
    return path


def playbook(base_inv, text: str = FULL, name: str = "full") -> Path:
    p = base_inv["dir"] / f"{name}.yml"
    p.write_text(text)
    return p


# ------------------------------------------------------------------ 9: injection


def test_hostile_host_names_never_run(host, base_inv):
    spec = base_inv["inv"]["hosts"]["lab1"]
    for p in payloads("hostname"):
        inv = write_inv(base_inv, "hn", hosts={p: spec})
        for args in (["facts"], ["deploy", "--check", "--playbook", str(playbook(base_inv))]):
            one_line_error_or_ok(cli("-i", str(inv), *args))  # in-process: refused at load
    no_markers(host)


def test_hostile_vars_and_engine_flags_never_run_and_are_refused_before_any_change(host, base_inv):
    pb = playbook(base_inv)
    proc = k26ops("-i", str(write_inv(base_inv, "good")), "--json", "deploy", "--playbook", str(pb))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    unit_before = host.ssh(host.hosts[0].name, f"cat /etc/systemd/system/{UNIT}")
    current = host.ssh(host.hosts[0].name, "readlink /opt/k26ops/releases/current")
    shapes = [
        lambda p: {"model_path": "/models/" + p},
        lambda p: {"served_model_name": p},
        lambda p: {"engine_profile": {"served_model_name": p}},
        lambda p: {"engine_profile": {"speculative_ddtree_budget": p}},
        lambda p: {"extra_flags": {"mem-fraction-static": p}},
        lambda p: {"extra_flags": {p: 1}},
        lambda p: {"extra_flags": {f"chunked-prefill-size {p}": 1}},
        lambda p: {"engine_env": {"FOO": p}},
        lambda p: {"engine_env": {p: "1"}},
        lambda p: {"engine_unit": p + ".service"},
        lambda p: {"launch_module": p},
    ]
    ps = payloads("vars")
    for i, shape in enumerate(shapes):  # every shape with two payloads, every payload used
        for p in (ps[i % len(ps)], ps[(i + 5) % len(ps)]):
            inv = write_inv(
                base_inv, f"v{i}", host_vars=shape(p), all_vars={"description": p}
            )  # free text k26ops declares and never reads
            one_line_error_or_ok(k26ops("-i", str(inv), "deploy", "--check", "--diff", "--playbook", str(pb)))
    no_markers(host)
    # --check changed nothing
    assert host.ssh(host.hosts[0].name, f"cat /etc/systemd/system/{UNIT}") == unit_before
    assert host.ssh(host.hosts[0].name, "readlink /opt/k26ops/releases/current") == current


PATH_VARS = ("k26ops_root", "releases_root", "model_path", "draft_model_path", "env_file", "engine_env_file")


def test_hostile_values_in_every_path_variable_are_refused_at_load(host, base_inv):
    """Paths are data: `$(...)`, backticks, `;`, newlines, quotes, relative and
    unnormalised paths in any path variable are one line naming the host, the
    variable and the file line; nothing runs anywhere (before this change,
    k26ops_root "/opt/k26ops$(touch ...)" created the marker on the host)."""
    pb = playbook(base_inv)
    ps = payloads("path")
    values = [f"/opt/k26ops{p}" for p in ps] + [
        "opt/k26ops",
        "/opt//k26ops",
        "/opt/k26ops/",
        "/opt/./x",
        "/opt/x/../y",
        "/",
        "/opt/a b",
    ]
    for i, var in enumerate(PATH_VARS):
        for value in values[i::2]:  # every value in some variable, each variable with several
            inv = write_inv(base_inv, f"p{i}", host_vars={var: value})
            for args in (
                ["inventory", "list"],
                ["deploy", "--check", "--playbook", str(pb)],
                ["deploy", "--playbook", str(pb)],
            ):
                proc = cli("-i", str(inv), *args)  # in-process: refused at load, no host reached (162 calls)
                assert proc.returncode == 2 and proc.stderr.count("\n") == 1, (var, value, proc.stderr)
                line = [n for n, l in enumerate(inv.read_text().splitlines(), 1) if l.strip().startswith(var + ":")][-1]
                assert f"{inv}:{line}: host 'lab1': {var} " in proc.stderr, proc.stderr
    no_markers(host)


def test_shell_and_systemd_specials_reach_the_engine_literally(host, base_inv):
    """$, %, backticks and quotes in engine flag values (not paths: those are
    refused at load): the engine's real argv holds them verbatim (no shell, no
    systemd expansion)."""
    weird = f"a b/$HOME/%h/${{PATH}}/`id`/$(touch /tmp/{MARK}_lit)/'q'\"d\""
    inv = write_inv(
        base_inv,
        "literal",
        host_vars={"served_model_name": "m;$(touch /tmp/K26INJ_name)%n", "extra_flags": {"chat-template": weird}},
    )
    proc = k26ops("-i", str(inv), "--json", "deploy", "--playbook", str(playbook(base_inv)))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    pid = host.ssh(host.hosts[0].name, f"systemctl show -p MainPID --value {UNIT}").strip()
    argv = host.ssh(host.hosts[0].name, f"cat /proc/{pid}/cmdline").split("\0")
    assert argv[argv.index("--chat-template") + 1] == weird
    assert argv[argv.index("--served-model-name") + 1] == "m;$(touch /tmp/K26INJ_name)%n"
    no_markers(host)
    k26ops("-i", str(write_inv(base_inv, "good")), "deploy", "--playbook", str(playbook(base_inv)))


def test_hostile_patch_file_names_and_tags_stay_inside_the_release(host, base_inv, tmp_path):
    """Patch file names with metacharacters and `..`, and hostile patch tags in
    the playbook: shipped flat into <release>/k26ops/patches, never run."""
    text = harmless_patch("hostile name test")
    name = f"x$(touch${{IFS}}{MARK}_pn1);`touch${{IFS}}{MARK}_pn2`'\\n&|.patch"
    sub = tmp_path / "series-dir"
    sub.mkdir()
    (tmp_path / name).write_text(text)  # reached through ../ from the series' directory
    write_series(sub / "series", [f"../{name}"])
    recipe = lab_recipe_copy(tmp_path / "recipe.yml", sub / "series")
    inv = write_inv(base_inv, "patchnames", all_vars={"recipe": str(recipe)})
    pb = playbook(base_inv, "name: r\nsteps:\n  - release: {keep: 5}\n", "release-only")
    proc = k26ops("-i", str(inv), "--json", "deploy", "--playbook", str(pb))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    rid = json.loads(proc.stdout)["hosts"]["lab1"]["release"]
    shipped = host.ssh(host.hosts[0].name, f"ls /opt/k26ops/releases/{rid}/k26ops/patches/")
    assert f"02-{name}" in shipped.splitlines()
    no_markers(host)
    # a series line with a space in its file name: refused before the host changes
    write_series(sub / "series", [f"../{name} ; touch {MARK}_pn3"])
    listing = host.ssh(host.hosts[0].name, "ls -a /opt/k26ops/releases")
    proc = k26ops("-i", str(inv), "--json", "deploy", "--playbook", str(pb))
    assert proc.returncode == 1 and "series:3" in json.loads(proc.stdout)["hosts"]["lab1"]["error"]
    assert host.ssh(host.hosts[0].name, "ls -a /opt/k26ops/releases") == listing
    no_markers(host)
    for tags in ([f"$(touch /tmp/{MARK}_tag1)"], ["../../etc"], ["a\nb"], [f"x; touch /tmp/{MARK}_tag2"]):
        pb = playbook(base_inv, yaml.safe_dump({"name": "t", "steps": [{"release": {"tags": tags}}]}), "tags")
        one_line_error_or_ok(k26ops("-i", str(inv), "deploy", "--check", "--playbook", str(pb)))
    no_markers(host)


def test_hostile_snapshot_tags_stay_inside_the_baselines_repo(host, base_inv, tmp_path):
    proc = k26ops("snapshot", "--help")
    if proc.returncode != 0:
        pytest.skip("`k26ops snapshot` does not exist yet")
    base = tmp_path / "b"
    base.mkdir()
    repo = base / "baselines"
    inv = write_inv(base_inv, "good")
    k26ops("-i", str(inv), "deploy", "--playbook", str(playbook(base_inv)))
    for i, p in enumerate(payloads("snaptag") + ["../escape", "../../escape2", "..", "-x", "a..b", "a/../../c"]):
        proc = k26ops(
            "-i", str(inv), "snapshot", "--tag", p, "--baselines", str(repo), env={"K26OPS_BASELINES": str(repo)}
        )
        one_line_error_or_ok(proc)
    assert sorted(x.name for x in base.iterdir()) in ([], ["baselines"])
    no_markers(host)
    if repo.exists():
        found = subprocess.run(["grep", "-rl", TOKEN, str(repo)], capture_output=True, text=True).stdout
        assert found == "", f"token stored in the baselines repository: {found}"


# ------------------------------------------------------------------ 10: secrets


def test_token_never_shown_nor_stored(host, base_inv):
    pb = playbook(base_inv)
    inv = write_inv(base_inv, "good")
    env = {"K26OPS_INVENTORY": str(inv), "COLUMNS": "200", "HF_TOKEN": ""}
    outputs = []

    def run(*args, inventory=None):
        proc = k26ops(*(["-i", str(inventory)] if inventory else []), *args, env=env)
        outputs.append((args, proc.stdout + proc.stderr))
        return proc

    assert run("-vv", "deploy", "--diff", "--playbook", str(pb)).returncode == 0
    assert run("--json", "deploy", "--playbook", str(pb)).returncode == 0
    # a new token: --check --diff shows the env file change, redacted
    inv2 = write_inv(base_inv, "token2", all_vars={"hf_token": TOKEN2})
    proc = run("--json", "deploy", "--check", "--diff", "--playbook", str(pb), inventory=inv2)
    assert proc.returncode == 0 and "<redacted>" in proc.stdout
    run("deploy", "--check", "--diff", "--playbook", str(pb), inventory=inv2)
    # the engine writes the token to its journal, then crashes: the journal tail
    # and diagnosis k26ops prints, `k26ops logs` and `status` must all redact it
    host.ssh(
        host.hosts[0].name,
        f"printf 'loading with token {TOKEN} and {TOKEN}x\\nRuntimeError: boom {TOKEN}\\n' > /root/crash.txt",
    )
    crash = write_inv(
        base_inv,
        "crash",
        host_vars={"engine_env": {"K26OPS_STANDIN_CRASH": "load", "K26OPS_STANDIN_CRASH_LOG": "/root/crash.txt"}},
    )
    proc = run("-v", "deploy", "--playbook", str(pb), inventory=crash)
    assert proc.returncode == 1
    assert run("--json", "deploy", "--playbook", str(pb), inventory=crash).returncode == 1
    journal = host.ssh(host.hosts[0].name, f"journalctl -u {UNIT} --no-pager -n 500")
    assert TOKEN in journal  # the test's premise: the secret is really in the journal
    assert run("logs", "-n", "500").returncode == 0
    assert run("--json", "logs", "-n", "500").returncode == 0
    assert run("--json", "status").returncode == 0
    assert run("status").returncode == 0
    assert run("--json", "facts").returncode == 0
    for args, text in outputs:
        assert TOKEN not in text and TOKEN2 not in text, (args, text)
    assert any("journal tail" in text for _, text in outputs)
    # on the host: only the 0600 env file holds it
    assert host.ssh(host.hosts[0].name, f"stat -c '%a %U' {ENV_FILE}").strip() == "600 root"
    holders = host.ssh(
        host.hosts[0].name,
        f"grep -rlF {TOKEN} /etc /opt/k26ops /var/tmp /tmp /root 2>/dev/null | grep -v '^/root/crash.txt$'; true",
    )
    # the env file, and the service step's rollback copy of it: both 0600 root
    assert ENV_FILE in holders.split(), holders
    for path in holders.split():
        assert path == ENV_FILE or path.startswith("/opt/k26ops/state/service/"), holders
        assert host.ssh(host.hosts[0].name, f"stat -c '%a %U' {path}").strip() == "600 root", path
    assert host.ssh(host.hosts[0].name, "ls -ld /etc/k26ops | cut -c1-10").strip() in (
        "drwxr-xr-x",
        "drwx------",
        "drwxr-x---",
    )
    # on the control node: nothing k26ops keeps holds it (the test suite's own cache aside, ~/.cache/k26ops/test:
    # the bytecode of this very file, with TOKEN in it, when a run sets PYTHONPYCACHEPREFIX under it)
    cache = Path.home() / ".cache/k26ops"
    kept = [
        p
        for p in (*(cache.iterdir() if cache.is_dir() else ()), Path.home() / ".local/share/k26ops")
        if p.exists() and p != TEST_CACHE
    ]
    found = (
        subprocess.run(
            ["grep", "-rlF", "--exclude-dir=wheelhouse", TOKEN, *map(str, kept)], capture_output=True, text=True
        ).stdout
        if kept
        else ""
    )
    assert found == "", found
    host.ssh(host.hosts[0].name, "rm -f /root/crash.txt")


# ------------------------------------------------------------------ CLI fuzz

ODD = [
    "",
    " ",
    "-1",
    "0",
    "nan",
    "inf",
    "-inf",
    "1e999",
    "0x10",
    "1_000",
    "١٢",
    "\t",
    "$(id)",
    "`id`",
    "../x",
    "a\nb",
    "--json",
    "-",
    "--",
    "all",
    "lab*",
    "!lab1",
    "&lab",
    "~[",
    "1.5",
    "99999999999999999999",
]
value = st.one_of(
    st.sampled_from(ODD),
    st.text(max_size=12).filter(lambda s: "\x00" not in s),
    st.integers(-(10**6), 10**6).map(str),
    st.floats(allow_nan=True).map(str),
)


def fuzz_inventory(tmp: Path) -> Path:
    inv = tmp / "fuzz-inv.yml"
    if not inv.exists():  # one host nobody listens for: every connection is refused at once
        inv.write_text(
            yaml.safe_dump(
                {
                    "vars": {"recipe": "lab"},
                    "hosts": {
                        "gpu1": {"address": "127.0.0.1", "port": 9, "user": "root", "known_hosts": str(tmp / "kh")}
                    },
                }
            )
        )
    return inv


def run_cli(args: list[str], tmp: Path) -> subprocess.CompletedProcess:
    return cli(
        "-i",
        str(fuzz_inventory(tmp)),
        *args,  # in-process: 60 examples, no interpreter starts
        env={"K26OPS_SSH_CONFIG": "", "COLUMNS": "120", "K26OPS_BASELINES": str(tmp / "baselines")},
    )


@settings(
    max_examples=int(os.environ.get("K26OPS_CLI_FUZZ_EXAMPLES", "60")),
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(
    opt=st.sampled_from(
        ["--limit", "--forks", "--deadline", "--connect-timeout", "--playbook", "--canary", "-n", "--tag"]
    ),
    val=value,
)
@example(opt="--playbook", val="a\nb")  # was a two-line error (fixed in playbook.py)
@example(opt="--playbook", val="../../../../etc/passwd")
@example(opt="--limit", val="a\nb")
@example(opt="--forks", val="1e999")
def test_cli_values_fuzz_clean_error(tmp_path_factory, opt, val):
    tmp = tmp_path_factory.getbasetemp()
    if opt in ("--limit", "--forks", "--deadline", "--connect-timeout"):
        args = [
            f"{opt}={val}",
            "--connect-timeout=1" if opt != "--connect-timeout" else "--forks=2",
            "deploy",
            "--check",
            "--playbook",
            "deploy",
        ]
    elif opt in ("--playbook", "--canary"):
        args = ["--connect-timeout=1", "deploy", "--check", f"{opt}={val}"]
    elif opt == "-n":
        args = ["--connect-timeout=1", "logs", f"-n={val}"]
    else:
        args = ["--connect-timeout=1", "snapshot", f"--tag={val}"]
    proc = run_cli(args, tmp)
    text = proc.stdout + proc.stderr
    assert "Traceback" not in text, (args, text)
    assert proc.returncode in (1, 2), (args, proc.returncode, text)
    if proc.returncode == 2:
        err = [line for line in proc.stderr.splitlines() if line.strip()]
        assert len(err) == 1 and err[0].startswith("k26ops: error: "), (args, proc.stderr)


@pytest.mark.parametrize("opt", ["--deadline", "--connect-timeout"])
@pytest.mark.parametrize("value", ["nan", "inf"])
def test_non_finite_seconds_are_refused(opt, value, tmp_path):
    """click.FloatRange accepts 'nan' (every comparison with NaN is false): k26ops refuses it."""
    proc = run_cli([f"{opt}={value}", "deploy", "--check"], tmp_path)
    assert proc.returncode == 2
    assert proc.stderr.strip() == (
        f"k26ops: error: Invalid value for '{opt}': {value} is not a finite number of seconds (see `k26ops --help`)"
    )


def test_secrets_under_ten_names_never_leave_the_env_file(host, base_inv, tmp_path):
    """Ten secrets, named the ways real services name them (plus one the inventory
    marks itself, by name and by pattern), in the engine env and as engine flags:
    none appears in any command's text or JSON output, `inventory list/show`,
    the unit file, the release manifest, `logs`, or the baselines repository.
    (Before: every one but HF_TOKEN leaked, e.g. --api-key into the unit and `ps`.)"""
    secrets = {f"S{i}": f"sek{i}-{'x' * 6}{i}-Q7v{i}" for i in range(10)}
    env_vars = {
        "OPENAI_APIKEY": secrets["S0"],
        "AWS_SECRET_ACCESS_KEY": secrets["S1"],
        "DB_PASSWORD": secrets["S2"],
        "GCP_CREDENTIALS": secrets["S3"],
        "WANDB_API_KEY": secrets["S4"],
        "MY_SERVICE_TOKEN": secrets["S5"],
        "CORP_PIN": secrets["S6"],
        "LICENSE_SIGNATURE": secrets["S7"],
    }
    inv = write_inv(
        base_inv,
        "tensecrets",
        host_vars={
            "engine_env": env_vars,
            "secret_vars": ["CORP_PIN"],
            "secret_patterns": ["*_SIGNATURE"],
            "extra_flags": {"api-key": secrets["S8"], "admin-api-key": secrets["S9"]},
        },
    )
    pb = playbook(base_inv)
    repo = tmp_path / "baselines"
    env = {"K26OPS_INVENTORY": str(inv), "K26OPS_BASELINES": str(repo), "COLUMNS": "200"}
    texts = []

    def run(*args, ok=(0,)):
        proc = k26ops(*args, env=env)
        texts.append((args, proc.stdout + proc.stderr))
        assert proc.returncode in ok, (args, proc.stdout, proc.stderr)

    run("inventory", "list", "-v")
    run("--json", "inventory", "list")
    run("inventory", "show", "lab1")
    run("-vvv", "deploy", "--diff", "--playbook", str(pb))
    run("--json", "deploy", "--check", "--diff", "--playbook", str(pb))
    run("--json", "status")
    run("logs", "-n", "200")
    run("--json", "snapshot", "--tag", "secrets-test")
    run("baselines", "show", "secrets-test")
    for args, text in texts:
        for name, value in secrets.items():
            assert value not in text, (name, args)
    unit = host.ssh(host.hosts[0].name, f"cat /etc/systemd/system/{UNIT}")
    manifest = host.ssh(host.hosts[0].name, "cat /opt/k26ops/releases/current/manifest.json")
    assert "--config /etc/k26ops/sglang-secrets.yaml" in unit and "K26OPS_SECRET" not in unit
    found = subprocess.run(
        ["git", "-C", str(repo), "grep", "-F", "-e", secrets["S0"]]
        + [a for v in list(secrets.values())[1:] for a in ("-e", v)]
        + ["secrets-test"],
        capture_output=True,
        text=True,
    ).stdout
    assert found == "", found
    for value in secrets.values():
        assert value not in unit and value not in manifest
    # the engine gets the flags' values from the root-only file it reads with --config, not from its argv
    pid = host.ssh(host.hosts[0].name, f"systemctl show -p MainPID --value {UNIT}").strip()
    argv = host.ssh(host.hosts[0].name, f"cat /proc/{pid}/cmdline").split("\0")
    assert "--config" in argv and secrets["S8"] not in argv and secrets["S9"] not in argv
    flags = yaml.safe_load(host.ssh(host.hosts[0].name, "cat /etc/k26ops/sglang-secrets.yaml"))
    assert flags == {"api-key": secrets["S8"], "admin-api-key": secrets["S9"]}
    env_text = host.ssh(host.hosts[0].name, f"cat {ENV_FILE}")
    assert all(v in env_text for k, v in secrets.items() if k not in ("S8", "S9"))
    assert host.ssh(host.hosts[0].name, f"stat -c '%a' {ENV_FILE} /etc/k26ops/sglang-secrets.yaml").split() == [
        "600",
        "600",
    ]
    k26ops("-i", str(write_inv(base_inv, "good")), "deploy", "--playbook", str(pb))
