"""The engine on a host (k26ops.engine.host), its pure parts: the layout under
`k26ops_root`, the unit name and its check, the env file, the env variables,
the secrets to redact and the poll target. The ready-wait runs against real
hosts in test_steps_engine.py (health, crash, timeout, rollback) and the probe's tests."""

from __future__ import annotations

import pytest

from k26ops.engine import secret_policy, units
from k26ops.engine.host import DEFAULT_ROOT, EngineHost, Layout, poll_target
from k26ops.errors import UserError
from k26ops.steps import HostContext


def host(vars: dict) -> HostContext:
    return HostContext(session=None, host=None, vars=vars, facts={})


def test_the_default_layout():
    lay = Layout.of({})
    assert lay.root == DEFAULT_ROOT == "/opt/k26ops"
    assert (lay.releases_root, lay.current) == ("/opt/k26ops/releases", "/opt/k26ops/releases/current")
    assert (lay.state_dir, lay.pins_file) == ("/opt/k26ops/state", "/opt/k26ops/state/pinned-releases")
    assert (lay.toolchain_dir, lay.wheelhouse_dir, lay.lab_module_dir) == (
        "/opt/k26ops/toolchain",
        "/opt/k26ops/wheelhouse",
        "/opt/k26ops/lab",
    )


def test_everything_follows_a_custom_root_and_releases_root_its_own():
    lay = Layout.of({"k26ops_root": "/data/k26"})
    assert [
        lay.releases_root,
        lay.current,
        lay.state_dir,
        lay.pins_file,
        lay.toolchain_dir,
        lay.wheelhouse_dir,
        lay.lab_module_dir,
    ] == [
        "/data/k26/releases",
        "/data/k26/releases/current",
        "/data/k26/state",
        "/data/k26/state/pinned-releases",
        "/data/k26/toolchain",
        "/data/k26/wheelhouse",
        "/data/k26/lab",
    ]
    lay = Layout.of({"k26ops_root": "/data/k26", "releases_root": "/fast/rel"})
    assert (lay.releases_root, lay.current, lay.state_dir) == ("/fast/rel", "/fast/rel/current", "/data/k26/state")
    ctx = host({"k26ops_root": "/data/k26"})  # the steps' context asks the same layout
    assert (ctx.root, ctx.releases_root, ctx.state_dir, ctx.pins_file) == (
        "/data/k26",
        "/data/k26/releases",
        "/data/k26/state",
        "/data/k26/state/pinned-releases",
    )


def test_unit_name_from_params_then_inventory_then_default_and_checked():
    assert EngineHost(host({})).unit == "k26-engine.service"
    assert EngineHost(host({"engine_unit": "a.service"})).unit == "a.service"
    eh = EngineHost(host({"engine_unit": "a.service"}), {"unit": "b.service"})
    assert (eh.unit, eh.unit_path) == ("b.service", "/etc/systemd/system/b.service")
    for bad in ("../x.service", "engine", ".service", "a/b.service"):
        with pytest.raises(UserError, match="NAME.service"):
            EngineHost(host({"engine_unit": bad})).unit


def test_env_file_path():
    assert EngineHost(host({})).env_path == units.ENV_FILE == "/etc/k26ops/sglang.env"
    assert EngineHost(host({"engine_env_file": "/etc/x.env"})).env_path == "/etc/x.env"
    assert EngineHost(host({"engine_env_file": "/etc/x.env"}), {"env_file": "/etc/y.env"}).env_path == "/etc/y.env"


def test_env_variables(monkeypatch):
    monkeypatch.delenv("HF_TOKEN", raising=False)
    eh = EngineHost(
        host(
            {
                "engine_env": {"A": "1"},
                "hf_token": "hf_x",
                "lab": True,
                "k26ops_root": "/r",
                "cuda_home": "/r/toolchain/cuda-13.0",
            }
        )
    )
    assert eh.env() == {"A": "1", "HF_TOKEN": "hf_x", "CUDA_HOME": "/r/toolchain/cuda-13.0", "PYTHONPATH": "/r/lab"}
    assert eh.lab_module_path == "/r/lab/k26ops_lab_engine.py"
    # the control node's HF_TOKEN only when the inventory has none
    monkeypatch.setenv("HF_TOKEN", "hf_from_env")
    assert EngineHost(host({})).env() == {"HF_TOKEN": "hf_from_env"}
    assert EngineHost(host({}), {"pass_env": []}).env() == {}
    with pytest.raises(UserError, match="engine_env must be a mapping"):
        EngineHost(host({"engine_env": ["A=1"]})).env()


def test_secrets_are_every_known_value_longest_first(monkeypatch):
    monkeypatch.setenv("HF_TOKEN", "hf_controlnode")
    eh = EngineHost(host({"engine_env": {"MY_TOKEN": "tok-inv", "PLAIN": "not-secret"}}))
    old = "HF_TOKEN=hf_old_one_on_host\nPLAIN=x\n"
    got = eh.secrets(old_env_text=old)
    assert set(got) == {"tok-inv", "hf_controlnode", "hf_old_one_on_host"}
    assert got == sorted(got, key=len, reverse=True)
    assert "not-secret" not in eh.secrets()
    text = secret_policy.redact("a tok-inv b hf_old_one_on_host", got)
    assert "tok-inv" not in text and "hf_old" not in text and secret_policy.REDACTED in text


def test_poll_target_asks_a_wildcard_bind_on_loopback():
    assert poll_target({}) == ("127.0.0.1", 30000)
    assert poll_target({"host": "0.0.0.0", "port": 31000}) == ("127.0.0.1", 31000)
    assert poll_target({"host": "::", "port": "31001"}) == ("127.0.0.1", 31001)
    assert poll_target({"host": "10.0.0.5"}) == ("10.0.0.5", 30000)


def test_nvlink_multicast_off_only_when_the_inventory_says_so(monkeypatch):
    monkeypatch.delenv("HF_TOKEN", raising=False)
    off = {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1", "NVSHMEM_DISABLE_NVLS": "1"}
    assert EngineHost(host({"nvlink_multicast": False})).env() == off
    for hv in ({}, {"nvlink_multicast": True}, {"nvlink_multicast": "false"}):  # never by default
        assert not set(off) & set(EngineHost(host(hv)).env())
    mine = EngineHost(host({"nvlink_multicast": False, "engine_env": {"NCCL_NVLS_ENABLE": "1"}})).env()
    assert mine["NCCL_NVLS_ENABLE"] == "1" and mine["NVSHMEM_DISABLE_NVLS"] == "1"  # engine_env wins
