"""Hypothesis fuzzing: malformed inventories and --limit values never give a
traceback. The CLI exits 0 (warnings are single lines) or 2 with exactly one
`k26ops: error:` line on stderr."""

from __future__ import annotations

import json
import os

import pytest
import yaml
from click.testing import CliRunner
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from k26ops.cli import cli

HOSTILE = [
    "$(reboot)",
    "`id`",
    "a;rm -rf /",
    "x'y",
    'x"y',
    "..",
    "../../etc",
    "a\nb",
    "-oX=y",
    "\t",
    "{{ x }}",
    "{% if %}",
    "*",
    "!",
    "&",
    "~[",
    "a,b",
    "gpu[1:3]",
    "g[a:c:0]",
    "h[0:99999999]",
    "::1",
    "[::1]:22",
    "h:99999",
    "",
    " ",
    "\x00",
    "\u2028",
    "é",
    "all",
    "ungrouped",
    "hosts",
    "vars",
    "children",
    "groups",
    "address",
    "port",
    "user",
]
KEYS = [
    "all",
    "hosts",
    "children",
    "vars",
    "groups",
    "host",
    "address",
    "port",
    "user",
    "identity_file",
    "gateway",
    "known_hosts",
    "connection",
    "ansible_host",
    "ansible_port",
    "ansible_user",
    "ansible_ssh_common_args",
    "ansible_connection",
    "ansible_group_priority",
    "plugin",
    "gpu1",
    "gpu[01:03]",
    "g1",
    "lab",
]

text = st.one_of(st.sampled_from(HOSTILE), st.text(max_size=12))
scalar = st.one_of(st.none(), st.booleans(), st.integers(-70000, 70000), st.floats(), text)
key = st.one_of(st.sampled_from(KEYS), st.sampled_from(HOSTILE), st.integers(0, 9))
tree = st.recursive(
    scalar, lambda inner: st.one_of(st.lists(inner, max_size=4), st.dictionaries(key, inner, max_size=5)), max_leaves=25
)

host_value = st.one_of(st.none(), st.dictionaries(st.sampled_from(KEYS[5:]), scalar, max_size=4), scalar)
names = st.one_of(st.sampled_from(["gpu1", "gpu2", "g1", "lab", "all"]), text)
ansible_group = st.deferred(
    lambda: st.one_of(
        st.none(),
        scalar,
        st.fixed_dictionaries(
            {},
            optional={
                "hosts": st.one_of(st.dictionaries(names, host_value, max_size=4), scalar, st.lists(names, max_size=3)),
                "vars": st.one_of(st.dictionaries(key, scalar, max_size=4), scalar),
                "children": st.one_of(st.dictionaries(names, ansible_group, max_size=3), scalar),
                "host": scalar,
            },
        ),
    )
)
ansible_inv = st.dictionaries(names, ansible_group, min_size=1, max_size=3)
native_host = st.one_of(
    st.none(),
    scalar,
    st.fixed_dictionaries(
        {},
        optional={
            k: st.one_of(scalar, st.lists(names, max_size=3), st.dictionaries(key, scalar, max_size=3))
            for k in [
                "address",
                "port",
                "user",
                "identity_file",
                "gateway",
                "known_hosts",
                "connection",
                "groups",
                "vars",
                "adress",
            ]
        },
    ),
)
native_inv = st.fixed_dictionaries(
    {"hosts": st.dictionaries(names, native_host, max_size=4)},
    optional={
        "groups": st.dictionaries(
            names,
            st.one_of(
                st.none(),
                scalar,
                st.fixed_dictionaries(
                    {},
                    optional={
                        "hosts": st.one_of(st.lists(names, max_size=3), scalar),
                        "children": st.one_of(st.lists(names, max_size=3), scalar),
                        "vars": st.dictionaries(key, scalar, max_size=3),
                    },
                ),
            ),
            max_size=3,
        ),
        "vars": st.one_of(st.dictionaries(key, scalar, max_size=3), scalar),
        "hsots": scalar,
    },
)
yaml_tokens = st.lists(
    st.sampled_from(
        [
            "all:",
            "hosts:",
            "children:",
            "vars:",
            "  ",
            "    ",
            "\n",
            "- ",
            "{",
            "}",
            "[",
            "]",
            ",",
            ": ",
            "gpu[01:04]",
            "!vault |",
            "!vault",
            "$ANSIBLE_VAULT;1.1;AES256",
            "!foo",
            "&a ",
            "*a",
            "<<: *a",
            "'",
            '"',
            "#",
            "\t",
            "---",
            "ansible_port: ",
            "70000",
            "port: x",
            "~",
            "null",
            "{{ j }}",
            "%",
            "@",
            "`",
            "|",
            ">",
            "?",
            "\ufeff",
        ]
    ),
    max_size=40,
).map("".join)

LIMITS = st.one_of(
    st.none(),
    st.lists(
        st.one_of(names, st.sampled_from(["gpu*", "!gpu1", "&lab", "~gpu[", "~^g", "*", "", " ", "all,!all"])),
        max_size=4,
    ).map(",".join),
    st.text(max_size=20),
)

EXAMPLES = int(os.environ.get("K26OPS_FUZZ_EXAMPLES", "150"))
SETTINGS = settings(
    max_examples=EXAMPLES,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)


def check(tmp_path, monkeypatch, content, limit=None, command=("list",)):
    monkeypatch.setenv("K26OPS_SSH_CONFIG", "")
    path = tmp_path / "fuzz.yml"
    data = content if isinstance(content, bytes) else content.encode("utf-8", "surrogatepass")
    if not path.exists() or path.read_bytes() != data:
        # a new file, not the last example's truncated: ext4 flushes a file truncated and
        # rewritten at its close (auto_da_alloc), ~2 ms each, thousands of examples a run
        path.unlink(missing_ok=True)
        path.write_bytes(data)
    args = ["--inventory", str(path)]
    if limit is not None:
        args.append(f"--limit={limit}")
    for as_json in (False, True):
        result = CliRunner().invoke(
            cli, args + (["--json"] if as_json else []) + ["inventory", *command], catch_exceptions=False
        )
        out = result.stdout + result.stderr
        assert "Traceback" not in out
        assert result.exit_code in (0, 2), out
        lines = result.stderr.split("\n")
        assert lines[-1] == ""
        warnings = lines[:-2] if result.exit_code == 2 else lines[:-1]
        if result.exit_code == 2:  # warnings (if the file loaded) then one error line
            assert lines[-2].startswith("k26ops: error: "), result.stderr
            assert len(lines[-2].splitlines()) == 1
            if as_json:  # the error as JSON on stdout too (k26ops.cli.jsonout)
                doc = json.loads(result.stdout)
                assert (doc["ok"], doc["exit_code"]) == (False, 2)
                assert "k26ops: error: " + doc["error"] == lines[-2], (doc, lines[-2])
            else:
                assert result.stdout == ""
        for line in warnings:
            assert line.startswith("k26ops: warning: ") and len(line.splitlines()) == 1
        if result.exit_code == 0:
            if as_json:
                json.loads(result.stdout)


def dump(data) -> str:
    try:
        return yaml.safe_dump(data, allow_unicode=True)
    except yaml.YAMLError:
        return yaml.safe_dump(repr(data))


@SETTINGS
@given(data=tree)
def test_random_yaml_structures(tmp_path, monkeypatch, data):
    check(tmp_path, monkeypatch, dump(data))


@SETTINGS
@given(data=ansible_inv, limit=LIMITS)
def test_ansible_shaped(tmp_path, monkeypatch, data, limit):
    check(tmp_path, monkeypatch, dump(data), limit)


@SETTINGS
@given(data=native_inv, limit=LIMITS)
def test_native_shaped(tmp_path, monkeypatch, data, limit):
    check(tmp_path, monkeypatch, dump(data), limit)


@SETTINGS
@given(raw=st.one_of(yaml_tokens, st.binary(max_size=60)))
def test_raw_text(tmp_path, monkeypatch, raw):
    check(tmp_path, monkeypatch, raw)


LIMIT_INV = "all:\n  children:\n    lab:\n      hosts:\n        gpu[1:3]:\n    g1:\n      hosts:\n        gpu1:\n"
# The pattern words and hostile values the random draws below pick from, each tried every run.
EDGE_LIMITS = ["gpu*", "!gpu1", "&lab", "~gpu[", "~^g", "*", "", " ", "all,!all", "gpu1,&lab,!g1", *HOSTILE]


@pytest.mark.parametrize("value", EDGE_LIMITS)
def test_limit_and_show_edge_values(tmp_path, monkeypatch, value):
    check(tmp_path, monkeypatch, LIMIT_INV, value)
    check(tmp_path, monkeypatch, LIMIT_INV, None, ("show", "--", value))


@settings(
    max_examples=max(EXAMPLES // 3, 1), deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(limit=LIMITS, host=text)
def test_limit_and_show_values(tmp_path, monkeypatch, limit, host):
    """Random combinations (50 draws by default: the edge values are tried above)."""
    check(tmp_path, monkeypatch, LIMIT_INV, limit)
    check(tmp_path, monkeypatch, LIMIT_INV, None, ("show", "--", host))
