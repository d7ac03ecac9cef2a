"""Every inventory variable k26ops reads, in one place.

A setting nothing reads is worse than an error: an operator who writes
`releases_dir:` (the code reads `releases_root`) builds on the wrong disk. So
each key an inventory defines is looked up here; an unknown one is a warning
naming the nearest known name (an error with --strict). docs/inventory.md is
generated from this table (`k26ops inventory vars --markdown`).
"""

from __future__ import annotations

import difflib
from dataclasses import dataclass

from k26ops.layout import DEFAULT_ROOT


@dataclass(frozen=True)
class Var:
    name: str
    type: str
    default: str  # as text, for people ("-" when unset means "not used")
    used: str  # where k26ops reads it
    meaning: str
    informational: bool = False  # declared, read by nothing: for people (or Ansible) only


_CONN = "k26ops.inventory (native shape; also in vars at any level)"

VARIABLES: tuple[Var, ...] = (
    # -- connection (native shape) --------------------------------------------------
    Var("address", "str", "the host's name", _CONN, "address or name ssh connects to"),
    Var("port", "int", "22 (or ssh config)", _CONN, "sshd port"),
    Var("user", "str", "ssh config / login user", _CONN, "login user"),
    Var("identity_file", "path (local)", "ssh defaults", _CONN, "private key file on this machine"),
    Var("gateway", "str", "-", _CONN, "ProxyJump bastion: [user@]host[:port][,...]"),
    Var("known_hosts", "path (local)", "~/.ssh/known_hosts", _CONN, "an extra known_hosts file"),
    Var("connection", "ssh|local", "ssh", _CONN, "local runs commands on this machine"),
    Var("become", "bool", "false", _CONN + ", k26ops.ssh", "run every command as root via `sudo -n`"),
    # -- where things live on the host ----------------------------------------------
    Var("k26ops_root", "path", DEFAULT_ROOT, "steps, playbook, selftest",
        "k26ops' directory on the host (state, toolchain, locks)"),
    Var("releases_root", "path", "{k26ops_root}/releases", "steps.release, preflight, selftest",
        "where releases are built; `current` points at the live one"),
    Var("model_path", "path", "/models/Kimi-K2.6", "preflight, steps.release (engine profile)",
        "the model's weights directory (--model-path)"),
    Var("draft_model_path", "path", "the recipe's drafter path", "steps.release (engine profile)",
        "the DFlash drafter's directory (--speculative-draft-model-path)"),
    Var("engine_env_file", "path", "/etc/k26ops/sglang.env", "steps.engine, diagnose, logs",
        "the engine's environment file (mode 0600)"),
    # -- the engine -----------------------------------------------------------------
    Var("recipe", "str", "the default recipe", "steps.release, steps.toolchain, snapshot",
        "recipe name or path: the engine version, patches and profile to build"),
    Var("engine_unit", "str", "k26-engine.service", "steps.engine, status, logs, diagnose",
        "the engine's systemd unit name (NAME.service)"),
    Var("engine_port", "int", "the recipe's port (30000)", "steps.release, steps.engine",
        "the engine's HTTP port (--port)"),
    Var("engine_profile", "mapping", "{}", "steps.release",
        "engine flags over the recipe's profile (tp_size, page_size, ...)"),
    Var("engine_env", "mapping", "{}", "steps.engine",
        "extra variables for the engine's env file (e.g. CUDA_VISIBLE_DEVICES)"),
    Var("nvlink_multicast", "bool", "true (NCCL's own default)", "k26ops.enginehost (engine env file, rehearse)",
        "false: NVLink multicast (NVLS) off in the engine's environment: NCCL_NVLS_ENABLE=0, "
        "TORCH_SYMM_MEM_DISABLE_MULTICAST=1, NVSHMEM_DISABLE_NVLS=1 (engine_env still wins)"),
    Var("engine_source_mirrors", "mapping", "{}", "steps.release",
        "a recipe's git URL -> mirror URL to fetch the engine source from"),
    Var("extra_flags", "list", "[]", "steps.release", "extra engine command-line flags"),
    Var("wheel_source", "push|peer|index", "push", "k26ops.release.wheelsource (steps.release)",
        "how hosts get a release's wheels: pushed by this node, from a relay host of the batch, or the index"),
    Var("wheel_index_url", "url", "https://pypi.org/simple", "k26ops.release.wheelsource",
        "the package index hosts download from with wheel_source: index"),
    Var("wheel_peer_address", "str", "the host's address", "k26ops.release.wheelsource",
        "address a relay host serves wheels on (wheel_source: peer)"),
    Var("wheel_peer_port", "int", "8873", "k26ops.release.wheelsource",
        "port a relay host serves wheels on (1024-65535)"),
    Var("release_installer", "uv|pip", "uv", "k26ops.release.installer (steps.release)",
        "what installs a release's locked wheels on the host: uv (links from <k26ops_root>/store) or pip"),
    Var("launch_module", "str", "sglang.launch_server", "steps.release", "python -m module that starts the engine"),
    Var("served_model_name", "str", "-", "steps.release", "--served-model-name"),
    Var("unit_settings", "mapping", "{}", "steps.engine", "extra [Service] settings for the engine unit"),
    Var("health_timeout", "number (s)", "1800", "steps.engine", "seconds to wait for the engine's /health"),
    Var("rollback_health_timeout", "number (s)", "health_timeout", "steps.engine",
        "seconds to wait for /health after a rollback"),
    Var("hf_token", "str (secret)", "$HF_TOKEN here", "steps.engine", "HF_TOKEN for the engine (never printed)"),
    Var("HF_TOKEN", "str (secret)", "$HF_TOKEN here", "steps.engine", "same as hf_token"),
    # -- toolchain ------------------------------------------------------------------
    Var("cuda_method", "str", "the recipe's", "steps.toolchain", "how the CUDA toolkit is installed"),
    Var("cuda_home", "path", "the toolchain step's", "steps.engine", "CUDA_HOME for the engine"),
    Var("nvcc", "path", "{k26ops_root}/toolchain/cuda-*/bin/nvcc", "selftest", "nvcc for the self-test"),
    # -- what the host must have (preflight: check, deploy) -------------------------
    Var("gpus_per_host", "int", "8", "preflight, selftest", "GPUs the host must have"),
    # -- the driver layer (k26ops provision) ---------------------------------------------
    Var("nvidia_driver_branch", "int", "580", "steps.driver",
        "NVIDIA driver branch provision installs and holds (>= 580: CUDA 13)"),
    Var("nvidia_driver_source", "distro|nvidia", "distro on Ubuntu; nvidia on Debian", "steps.driver",
        "where the driver packages come from: the distribution or NVIDIA's CUDA apt repository"),
    Var("nvidia_fabricmanager", "auto|bool", "auto (when NVSwitches are found)", "steps.driver",
        "install and run nvidia-fabricmanager of the driver's version"),
    Var("compute_capability", "str|list", "[12.0, 10.x]", "preflight, selftest",
        "accepted GPU compute capabilities (10.x: any 10)"),
    Var("min_driver", "int", "580 (the recipe's)", "preflight, steps.toolchain, selftest",
        "lowest NVIDIA driver major version"),
    Var("model_size_gb", "int", "590", "preflight", "disk the model needs at model_path"),
    Var("disk_margin_gb", "int", "50", "preflight", "free disk kept beyond the model"),
    Var("release_size_gb", "int", "20", "preflight", "free disk one release needs at releases_root"),
    Var("selftest_min_tflops", "number", "-", "selftest", "lowest acceptable matmul TFLOPS"),
    Var("selftest_min_busbw", "number", "-", "selftest", "lowest acceptable NCCL bus bandwidth (GB/s)"),
    # -- multi-node -----------------------------------------------------------------
    Var("tp_group", "str (group)", "-", "multinode",
        "this host is one node of the engine formed by that group's hosts"),
    Var("dist_init_port", "int", "5000", "multinode", "port of --dist-init-addr on the first node"),
    Var("nnodes", "int", "set from tp_group", "steps.release", "--nnodes (normally set by tp_group)"),
    Var("node_rank", "int", "set from tp_group", "steps.release, steps.engine", "--node-rank (normally set by tp_group)"),
    Var("dist_init_addr", "str", "set from tp_group", "steps.release", "--dist-init-addr (normally set by tp_group)"),
    # -- output ---------------------------------------------------------------------
    Var("secret_vars", "list of names", "[]", "k26ops.units", "more variable names whose values are never printed"),
    Var("secret_patterns", "list of globs", "[]", "k26ops.units", "globs of variable names never printed"),
    # -- lab ------------------------------------------------------------------------
    Var("lab", "bool", "false", "steps.engine", "lab fixture: the engine is the stand-in (`k26ops lab up` sets it)"),
    # -- for people only ------------------------------------------------------------
    Var("description", "str", "-", "nothing", "free text for people", informational=True),
)

# Ansible's own variables that k26ops reads (the rest of ansible_* is Ansible's
# business: known, never warned about, never read).
ANSIBLE_READ: tuple[Var, ...] = tuple(
    Var(name, kind, "-", "k26ops.inventory (Ansible shape)", meaning) for name, kind, meaning in (
        ("ansible_host", "str", "address"), ("ansible_ssh_host", "str", "address (older name)"),
        ("ansible_port", "int", "port"), ("ansible_ssh_port", "int", "port (older name)"),
        ("ansible_user", "str", "user"), ("ansible_ssh_user", "str", "user (older name)"),
        ("ansible_private_key_file", "path (local)", "identity_file"),
        ("ansible_ssh_private_key_file", "path (local)", "identity_file"),
        ("ansible_connection", "str", "ssh (and its aliases) or local"),
        ("ansible_become", "bool", "become"),
        ("ansible_become_method", "str", "must be sudo when become is on"),
        ("ansible_become_user", "str", "must be root when become is on"),
        ("ansible_ssh_common_args", "str", "-J/ProxyJump/ProxyCommand -> gateway; UserKnownHostsFile"),
        ("ansible_ssh_extra_args", "str", "as ansible_ssh_common_args"),
        ("ansible_group_priority", "int", "orders groups of equal depth when merging vars"),
    ))

KNOWN: dict[str, Var] = {v.name: v for v in VARIABLES + ANSIBLE_READ}


def is_known(name: str) -> bool:
    return name in KNOWN or name.startswith("ansible_") or name.startswith("_")


# Names people write for a setting k26ops reads under another name (or that
# look like a known name but are not one): checked before spelling distance.
ALIASES = {
    "engine_service": "engine_unit", "service": "engine_unit", "unit": "engine_unit",
    "releases_dir": "releases_root", "release_dir": "releases_root",
    "tp_size": "engine_profile: {tp_size: N}",
    "cuda_visible_devices": "engine_env: {CUDA_VISIBLE_DEVICES: ...}",
    "CUDA_VISIBLE_DEVICES": "engine_env: {CUDA_VISIBLE_DEVICES: ...}",
    "env_file": "engine_env_file",
    "interconnect": None,
}


def nearest(name: str) -> str | None:
    """The known name (or a hint) `name` was probably meant to be."""
    if name in ALIASES:
        return ALIASES[name]
    near = difflib.get_close_matches(name, [v.name for v in VARIABLES], n=1, cutoff=0.8)
    return near[0] if near else None


def unknown_message(name: str) -> str:
    near = nearest(name)
    return f"{name}: unknown" + (f"; did you mean {near}?" if near else "; k26ops does not read it")


def unknown_keys(graph, shape: str) -> list[tuple[int | None, str, str]]:
    """(line, where, message) for each variable an inventory defines that k26ops
    does not know. An Ansible inventory carries vars for other tools, so there
    only names close to a known one (likely typos) are reported."""
    out = []
    nodes = [("vars" if g == "all" else f"group {g}", n) for g, n in graph.groups.items()]
    nodes += [(f"host {h}", n) for h, n in graph.hosts.items()]
    for where, node in nodes:  # once per place it is written, never once per host
        for layer, lines in ((node.vars, node.var_lines), (node.file_vars, node.file_lines)):
            for key in layer:
                if not isinstance(key, str) or is_known(key):
                    continue
                if shape != "native" and nearest(key) is None:
                    continue
                out.append((lines.get(key), where, unknown_message(key)))
    return out


def markdown() -> str:
    """docs/inventory.md, generated from the table above."""
    def row(v: Var) -> str:
        cells = (f"`{v.name}`", v.type, v.default, v.used, v.meaning + (" (informational: nothing reads it)"
                                                                         if v.informational else ""))
        return "| " + " | ".join(c.replace("|", "\\|") for c in cells) + " |"

    head = "| variable | type | default | read by | meaning |\n|---|---|---|---|---|"
    return "\n".join([
        "# Inventory variables",
        "",
        "<!-- Generated by `k26ops inventory vars --markdown` from k26ops/inventory/variables.py;",
        "     do not edit by hand (tests/test_inventory_vars.py keeps them in sync). -->",
        "",
        "Every variable k26ops reads from an inventory, at any level (all `vars`, a group's, a",
        "host's). A key not listed here is reported by `inventory list`, `check` and `deploy`",
        "as `NAME: unknown; did you mean ...?` (a warning; `--strict` makes it an error, exit 2).",
        "In an Ansible-shape inventory only names close to a known one are reported, since such",
        "inventories carry variables for other tools; every `ansible_*` variable is Ansible's.",
        "",
        head,
        *(row(v) for v in VARIABLES),
        "",
        "## Ansible variables k26ops reads",
        "",
        head,
        *(row(v) for v in ANSIBLE_READ),
        "",
    ])
