"""Preflight: does a host look able to run the K2.6 TP8 engine? Pure, over facts.

Expectations come from the host's merged inventory variables, with the K2.6
TP8 profile as defaults: 8 GPUs, compute capability 12.0 (RTX PRO 6000
Blackwell) or 10.x (B300), driver >= 580 (CUDA 13 needs R580+), free disk for
the model plus a margin where it will live, systemd present, commands running
as root (a normal login needs `become: true`).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from k26ops.engine import launch
from k26ops.engine.profile import DEFAULT_MODEL_PATH, lock_for, profile_for, recipe_for
from k26ops.errors import UserError
from k26ops.facts import smi_q
from k26ops.facts.cuda import cuda_toolkit_fact
from k26ops.facts.disk import disk_free_fact
from k26ops.facts.drafter import drafter_fact
from k26ops.facts.engine_user import engine_user_fact
from k26ops.facts.fabric import verdict
from k26ops.facts.platform import wheel_platform_problem
from k26ops.facts.smi_q import ACTIONS, fault_lines
from k26ops.facts.xid import ACTION_TEXT, distinct, label, who
from k26ops.hostvars import Var, declare
from k26ops.layout import Layout
from k26ops.release import launch_rules
from k26ops.release import recipe as recipe_mod
from k26ops.transport.ssh import BECOME_HINT

EXPECTED = declare(
    __name__,
    "what the host must have (preflight: check, deploy)",
    Var("gpus_per_host", "int", 8, "GPUs the host must have"),
    Var("compute_capability", "str|list", ["12.0", "10.x"], "accepted GPU compute capabilities (10.x: any 10)"),
    Var("min_driver", "int", 580, "lowest NVIDIA driver major version", "580 (the recipe's)"),
    Var("model_size_gb", "int", 590, "disk the model needs at model_path"),
    Var("disk_margin_gb", "int", 50, "free disk kept beyond the model"),
    Var("release_size_gb", "int", 20, "free disk one release needs at releases_root"),
)
DEFAULTS = {
    **{name: v.default for name, v in EXPECTED.items()},
    "model_path": DEFAULT_MODEL_PATH,
    "releases_root": Layout().releases_root,
}


@dataclass
class Check:
    name: str
    ok: bool
    detail: str

    def to_json(self) -> dict:
        return {"check": self.name, "ok": self.ok, "detail": self.detail}


def expectations(host_vars: dict) -> dict:
    e = {k: host_vars.get(k, v) for k, v in DEFAULTS.items()}
    e["releases_root"] = Layout.of(host_vars).releases_root  # where the release step puts them
    return e


def host_facts(host_vars: dict) -> list:
    """The facts that depend on this host's layout: free disk where the model and
    the releases go, the toolchain where the toolchain step installs it."""
    return [disk_free_fact(paths(host_vars)), cuda_toolkit_fact(Layout.of(host_vars).toolchain_dir)]


def engine_wanted(host_vars: dict) -> dict:
    """What this host's engine will start from: the model path (the engine profile's,
    as the unit gets it) and the drafter (`drafter_wanted`). A bad recipe raises UserError."""
    r = recipe_for(host_vars)
    prof = profile_for(host_vars, r)
    model_path = str(prof.get("model_path") or expectations(host_vars)["model_path"])
    weights = None
    if r.model is not None:  # the recipe's model manifest: check and the deploy compare the host's files with it
        from k26ops.weights.manifest import record_path  # lazy: only for a recipe with a model manifest

        weights = {
            "manifest": str(r.model.manifest),
            "name": r.model.name,
            "record": record_path(Layout.of(host_vars).state_dir, model_path),
        }
    return {
        "model_path": model_path,
        "drafter": drafter_wanted(host_vars),
        "weights": weights,
        "user": engine_user(host_vars),
        "releases_root": str(Layout.of(host_vars).releases_root),
    }


def engine_user(host_vars: dict) -> str | None:
    """The unit's User= (unit_settings `User` or `user`), None for root (systemd's default)."""
    settings = host_vars.get("unit_settings")
    if not isinstance(settings, dict):
        return None
    user = settings.get("User", settings.get("user"))
    return None if user in (None, "", "root", 0) else str(user)


def drafter_wanted(host_vars: dict) -> dict | None:
    """The drafter this host's engine will use: path (inventory draft_model_path, else
    the recipe's drafter.path), the profile's block size, and where it came from."""
    r = recipe_for(host_vars)
    prof = profile_for(host_vars, r)
    if not prof.get("speculative_algorithm") or not prof.get("draft_model_path"):
        return None
    d = r.drafter
    block = prof.get("speculative_dflash_block_size") or (d.block_size if d else None)
    return {
        "path": str(prof["draft_model_path"]),
        "block_size": block,
        "repo": d.repo if d else None,
        "revision": d.revision if d else None,
    }


def recipe_lock(host_vars: dict) -> dict:
    """Which recipe this host gets and whether its dependency lock is there and its own:
    {"recipe", "source", "lock", "ok", "problem"} (a deploy without the lock refuses)."""
    try:
        r = recipe_for(host_vars)
    except UserError as exc:
        return {
            "recipe": str(host_vars.get("recipe") or ""),
            "source": None,
            "lock": None,
            "ok": False,
            "problem": str(exc),
        }
    out = {"recipe": r.name, "source": str(r.source), "lock": str(r.lock_path) if r.lock_path else None}
    try:
        lock_for(r)
    except UserError as exc:
        return {**out, "ok": False, "problem": str(exc)}
    return {**out, "ok": True, "problem": None}


# The oldest GPU each CUDA major's runtime runs on (CUDA 13.0 release notes: Maxwell, Pascal
# and Volta, compute capability < 7.5, are no longer supported; CUDA 12: Maxwell 5.0 and newer).
CUDA_MIN_CC = {13: (7, 5), 12: (5, 0)}


def _cuda_major(lock) -> int | None:
    m = re.search(r"\bnvidia-cuda-runtime(?:-cu\d+)? (\d+)\.", lock.meta.get("cuda runtime wheels") or "")
    return int(m.group(1)) if m else None


def lock_check(host_vars: dict, facts: dict) -> Check:
    """What a deploy's release step would refuse on this host, known before it runs: the recipe's
    lock for the host's python (a recipe may list several), the lock's wheel platform (glibc,
    machine) against the host's, and its CUDA runtime against the host's GPUs."""
    try:
        r = recipe_for(host_vars)
    except UserError as exc:
        return Check("engine_lock", False, str(exc))
    ver = (facts.get("python3") or {}).get("version")
    if not ver:
        return Check(
            "engine_lock", False, f"no python3 on the host: {(facts.get('python3') or {}).get('error') or 'absent'}"
        )
    py = ".".join(ver.split(".")[:2])
    try:
        r = recipe_mod.for_python(r, py)
        lock = lock_for(r)
    except UserError as exc:
        return Check("engine_lock", False, str(exc))
    if lock.meta.get("python") != py:
        return Check("engine_lock", False, recipe_mod.python_mismatch(r, lock.meta.get("python"), py))
    plat = lock.meta.get("platform") or ""
    if "platform" in facts:
        why = wheel_platform_problem(facts["platform"], plat)
        if why:
            return Check("engine_lock", False, f"{lock.path.name}: {why}")
    major, gpus = _cuda_major(lock), (facts.get("gpus") or {}).get("gpus") or []
    low = CUDA_MIN_CC.get(major)
    old = sorted(
        {
            g["compute_cap"]
            for g in gpus
            if low and g.get("compute_cap") and tuple(int(x) for x in g["compute_cap"].split(".")[:2]) < low
        }
    )
    if old:
        return Check(
            "engine_lock",
            False,
            f"{lock.path.name}: the CUDA {major} runtime runs on compute capability "
            f"{low[0]}.{low[1]} and newer, this host's GPUs are {', '.join(old)}",
        )
    return Check(
        "engine_lock",
        True,
        f"{lock.path.name}: python {py}, {plat or 'platform not recorded'}"
        + (f", CUDA {major} runtime" if major else ""),
    )


def launch_check(host_vars: dict) -> Check:
    """The engine's own start-up rules on this host's command line (a deploy refuses these
    before any host: k26ops/release/launch_rules.py)."""
    try:
        argv = launch.engine_argv(profile_for(host_vars, recipe_for(host_vars)))
    except UserError as exc:
        return Check("launch_rules", False, str(exc))
    bad = launch_rules.violations(argv)
    if bad:
        return Check("launch_rules", False, f"{bad[0].rule.name}: {bad[0]}")
    return Check("launch_rules", True, f"the engine's {len(launch_rules.RULES)} start-up rules hold")


def recipe_check(info: dict) -> Check:
    if not info["ok"]:
        return Check("recipe", False, info["problem"])
    return Check("recipe", True, f"{info['recipe']} ({info['source']}), lock {info['lock']}")


def engine_facts(want: dict) -> list:
    """The facts `engine_wanted` asks for (model, drafter), gathered in the same call as the others."""
    # lazy: the shard-name patterns (about 3 ms at CLI start) only when a deploy or check gathers facts
    from k26ops.facts.model import model_fact

    out = [model_fact(want["model_path"])]
    if want.get("weights"):
        from k26ops.facts.model_files import model_files_fact  # lazy: as the model fact above

        out.append(model_files_fact(want["model_path"], want["weights"]["record"]))
    if (want.get("drafter") or {}).get("path"):
        out.append(drafter_fact(want["drafter"]["path"]))
    if want.get("user"):
        out.append(engine_user_fact(want["user"], engine_user_paths(want)))
    return out


def engine_user_paths(want: dict) -> list[str]:
    """What a non-root engine must read: the model, the drafter, the releases (its venv)."""
    drafter = (want.get("drafter") or {}).get("path")
    return [want["model_path"], *([drafter] if drafter else []), want.get("releases_root") or Layout().releases_root]


def engine_user_check(fact: dict, user: str) -> Check:
    """The unit's User= exists and can read the model, drafter and releases (else 217/USER or
    203/EXEC at every start, after the unit was replaced)."""
    if fact.get("error"):
        return Check("engine_user", False, f"{user}: {fact['error']}")
    if not fact.get("exists"):
        return Check(
            "engine_user",
            False,
            f"user {user} (unit_settings User) does not exist on the host: the "
            "engine would fail with 217/USER; create it (useradd --system) or drop User",
        )
    if fact.get("denied"):
        return Check(
            "engine_user",
            False,
            f"user {user} cannot read {', '.join(fact['denied'])}: the engine "
            "would fail to start; give it read access (chgrp/chmod, or an ACL: setfacl -R -m u:"
            f"{user}:rX PATH)",
        )
    return Check(
        "engine_user",
        True,
        f"user {user} (uid {fact.get('uid')}) reads " + (", ".join(fact.get("readable") or []) or "nothing checked"),
    )


def paths(host_vars: dict) -> list[str]:
    e = expectations(host_vars)
    return [str(e["model_path"]), str(e["releases_root"])]


def _cc_matches(cc: str | None, wanted) -> bool:
    if cc is None:
        return False
    for w in [wanted] if isinstance(wanted, str) else list(wanted):
        w = str(w)
        if w.endswith(".x") and cc.split(".")[0] == w[:-2]:
            return True
        if cc == w:
            return True
    return False


def _gb(n: int) -> str:
    return f"{n / 1e9:.0f} GB"


def driver_version(facts: dict) -> tuple[str | None, int | None]:
    """The NVIDIA driver version from the GPU query (its own table section where the query
    failed), else the nvidia-smi table's header, else `nvidia-smi -q`'s, and its major.
    A deploy reads the query and -q (gpu_health), not the table: one nvidia-smi start fewer."""
    gpus = (facts.get("gpus") or {}).get("gpus") or []
    drivers = sorted({g.get("driver_version") for g in gpus} - {None})
    driver = (
        drivers[0]
        if drivers
        else next(
            (
                f["driver_version"]
                for f in (facts.get("nvidia_smi"), facts.get("gpu_health"))
                if isinstance(f, dict) and f.get("driver_version")
            ),
            None,
        )
    )
    try:
        return driver, int(str(driver).split(".")[0])
    except ValueError:
        return driver, None


def xid_fault_lines(xid_fact: dict) -> list[str]:
    """One line per GPU and hardware Xid of this boot whose action is a reset or more:
    'GPU 3 (0000:2b:00): Xid 79 GPU has fallen off the bus; action: reboot: ...'."""
    out = []
    for e in distinct((xid_fact or {}).get("events") or []):
        if e.get("kind") not in ("hardware", "echo") or e.get("action") not in ("reset-gpu", "reboot", "drain-and-rma"):
            continue
        what = e.get("meaning") or e.get("message") or ""
        out.append(f"{who(e)}: {label(e)} {what} in the kernel log; action: {e['action']}: {ACTION_TEXT[e['action']]}")
    return out


def gpu_health_check(facts: dict) -> Check:
    """Fails on any GPU in an error state (ERR!, GPU requires reset, Unknown Error)
    in the GPU query or nvidia-smi's table, naming its index and bus id; on an active fault
    in `nvidia-smi -q` (pending row remap, remap failure, volatile uncorrectable ECC, slowdown,
    temperature past slowdown, a recovery action asked for); and on a hardware Xid of this boot
    in the kernel log, each naming GPU, fault and action. A health source that could not be
    read (the kernel log without root) is said in the detail; it fails nothing."""
    gpus = facts.get("gpus") or {}
    bad = list(gpus.get("gpu_errors") or [])
    seen = {g.get("index") for g in gpus.get("gpus") or [] if g.get("error")}
    table = facts.get("nvidia_smi") or {}
    bad += [
        line
        for g, line in zip([g for g in table.get("gpus") or [] if g.get("errors")], table.get("gpu_errors") or [])
        if g["index"] not in seen
    ]
    health, xids = facts.get("gpu_health"), facts.get("gpu_xid")
    bad += fault_lines(health) if isinstance(health, dict) else []
    bad += xid_fault_lines(xids) if isinstance(xids, dict) else []
    unread = []
    if isinstance(health, dict) and health.get("error"):
        unread.append(f"nvidia-smi -q not read ({health['error']})")
    if isinstance(xids, dict) and xids.get("error"):
        unread.append(f"kernel log not read ({xids['error']})")
    if bad:
        return Check("gpu_health", False, "; ".join(bad + unread))
    src = gpus.get("source")
    how = f" (GPU values from {src})" if src and src != "query" else ""
    read = [
        w
        for w, f in (("nvidia-smi -q", health), ("kernel Xid log", xids))
        if isinstance(f, dict) and not f.get("error")
    ]
    more = (f"; no fault in {' or '.join(read)}" if read else "") + "".join(f"; {u}" for u in unread)
    return Check("gpu_health", True, f"no GPU reports an error{how}{more}")


def fabric_manager_check(facts: dict) -> Check | None:
    """The fabric manager on a host it concerns (an NVSwitch host, or one with the unit): fails
    when it is not running, naming the reason from its journal (version mismatch, missing NVLSM,
    invalid config, or systemd's failure line) and the action; None where it does not concern."""
    v = verdict(facts.get("fabric_manager"), facts.get("nvswitch"))
    return None if v is None else Check("fabric_manager", v["ok"], v["line"])


def root_check(user: dict) -> Check:
    """Deploying writes /opt, /etc/systemd: commands must run as root."""
    if user.get("error") or "uid" not in user:
        return Check("root", False, user.get("error") or "not measured")
    if user["uid"] == 0:
        return Check("root", True, "commands run as root")
    return Check("root", False, f"commands run as {user.get('name')} (uid {user['uid']}), not root: {BECOME_HINT}")


def evaluate(facts: dict, host_vars: dict) -> list[Check]:
    e = expectations(host_vars)
    checks: list[Check] = []
    gpus = facts.get("gpus") or {}
    want = int(e["gpus_per_host"])
    if gpus.get("error"):
        checks.append(Check("gpus", False, gpus["error"]))
    else:
        checks.append(Check("gpus", gpus.get("count") == want, f"{gpus.get('count')} GPUs, expected {want}"))
        ccs = sorted({g.get("compute_cap") for g in gpus.get("gpus", [])} - {None})
        ok = bool(ccs) and all(_cc_matches(cc, e["compute_capability"]) for cc in ccs)
        wanted = e["compute_capability"]
        wanted = wanted if isinstance(wanted, str) else " or ".join(map(str, wanted))
        checks.append(Check("compute_capability", ok, f"{', '.join(ccs) or 'none'}, expected {wanted}"))
    checks.append(gpu_health_check(facts))
    if (fm := fabric_manager_check(facts)) is not None:
        checks.append(fm)
    driver, major = driver_version(facts)
    driver_ok = major is not None and major >= int(e["min_driver"])
    checks.append(
        Check(
            "driver",
            driver_ok,
            f"driver {driver or 'unknown'}, CUDA 13 needs >= {e['min_driver']}"
            + ("" if driver_ok else "; `k26ops provision` installs it"),
        )
    )
    if isinstance(facts.get("model"), dict):
        checks.append(model_check(facts["model"], host_vars.get("_model_path") or str(e["model_path"])))
    disk = facts.get("disk_free") or {}
    model_need = (int(e["model_size_gb"]) + int(e["disk_margin_gb"])) * 10**9
    if model_present(facts.get("model")):  # downloaded: only the margin must stay free beside it
        model_need = int(e["disk_margin_gb"]) * 10**9
    for check_name, path, need in (
        ("disk_model", str(e["model_path"]), model_need),
        ("disk_releases", str(e["releases_root"]), int(e["release_size_gb"]) * 10**9),
    ):
        row = disk.get(path) or {}
        if row.get("error") or "available" not in row:
            checks.append(Check(check_name, False, f"{path}: {row.get('error', 'not measured')}"))
        else:
            checks.append(
                Check(check_name, row["available"] >= need, f"{path}: {_gb(row['available'])} free, needs {_gb(need)}")
            )
    if "user" in facts:
        checks.append(root_check(facts["user"] or {}))
    if (facts.get("model_files") or {}).get("state") == "dir" and host_vars.get("_weights"):  # else `model` says it
        checks.append(
            weights_check(
                facts["model_files"], host_vars["_weights"], host_vars.get("_model_path") or str(e["model_path"])
            )
        )
    if "drafter" in facts and host_vars.get("_drafter"):
        checks.append(drafter_check(facts["drafter"] or {}, host_vars["_drafter"]))
    if isinstance(facts.get("engine_user"), dict) and engine_user(host_vars):
        checks.append(engine_user_check(facts["engine_user"], engine_user(host_vars)))
    sd = facts.get("systemd") or {}
    checks.append(
        Check(
            "systemd",
            bool(sd.get("version")),
            f"systemd {sd.get('version')}" if sd.get("version") else (sd.get("error") or "no systemd"),
        )
    )
    return checks


def model_present(fact) -> bool:
    return isinstance(fact, dict) and fact.get("state") == "dir" and not fact.get("error")


def model_check(fact: dict, path: str) -> Check:
    """The model directory exists with a readable config.json and all its weight shards."""
    if fact.get("error"):
        return Check("model", False, f"{path}: {fact['error']}")
    arch = ", ".join(fact.get("architectures") or []) or fact.get("model_type") or "no architectures in config"
    return Check(
        "model",
        True,
        f"{path}: config.json ({arch}), {fact.get('shards')} safetensors file(s)"
        + (", index" if fact.get("index") else ""),
    )


def weights_check(fact: dict, want: dict, path: str) -> Check:
    """The model's files against the recipe's manifest, no byte read (k26ops/weights/manifest.py):
    a missing, truncated or extra file fails, naming it, the expected size and the found one;
    so does a file changed since its last sha256 check (`k26ops model verify --full`)."""
    from k26ops.weights import manifest as mf  # lazy: only for a recipe with a model manifest

    try:
        m = mf.load(want["manifest"])
    except UserError as exc:
        return Check("weights", False, str(exc))
    v = mf.compare(m, fact.get("files") or {}, fact.get("record"))
    rec = fact.get("record") or {}
    if v["problems"]:
        return Check(
            "weights",
            False,
            f"{path}: "
            + "; ".join(v["problems"][:3])
            + (f" and {len(v['problems']) - 3} more" if len(v["problems"]) > 3 else ""),
        )
    stale = [p for p in v["changed"] if p in (rec.get("files") or {})]
    if stale:
        return Check(
            "weights",
            False,
            f"{path}: {stale[0]}"
            + (f" and {len(stale) - 1} more" if len(stale) > 1 else "")
            + " changed since its last sha256 check (size, mtime or inode differ from the record): "
            "run `k26ops model verify --full`",
        )
    last = (rec.get("last_full") or {}).get("at")
    return Check(
        "weights",
        True,
        f"{path}: {len(m.entries)} files, {m.total / 1e9:.1f} GB as manifest "
        f"{m.sha256[:12]} ({want.get('name')}); last full verify "
        + (f"{last}, {v['verified']} of {len(m.entries)} files unchanged since" if last else "never"),
    )


# What a deploy refuses before it changes a host: the checks about what it will start.
# The driver is the cuda_toolkit step's (it plans before anything changes).
DEPLOY_CHECKS = ("model", "weights", "drafter", "disk_model", "disk_releases", "gpu_reset", "engine_user")
# The standard facts those checks read (gpu_reset_check; the others read engine_facts and host_facts).
DEPLOY_FACTS = ("gpus", "gpu_health")


def gpu_reset_check(facts: dict) -> Check:
    """A GPU the driver says needs a reset (or worse): reset status, recovery action, a
    pending remap or retirement (nvidia-smi -q), or an error state in the GPU query or table.
    Slowdowns and this boot's Xid history are `check`'s; they do not stop a deploy."""
    gpus = facts.get("gpus") or {}
    bad = list(gpus.get("gpu_errors") or []) if isinstance(gpus, dict) else []
    health = facts.get("gpu_health")
    for g in (health.get("gpus") or []) if isinstance(health, dict) else []:
        worst = g.get("action") or "none"
        if ACTIONS.index(worst) >= ACTIONS.index("reset-gpu"):
            who = (f"GPU {g['index']}" if g.get("index") is not None else "GPU") + (
                f" ({g['bus_id']})" if g.get("bus_id") else ""
            )
            why = ", ".join(f["evidence"] for f in g.get("faults") or [] if f["action"] != "check-cooling")
            bad.append(f"{who} needs {worst}: {why}; {smi_q.ACTION_TEXT[worst]}")
    if bad:
        return Check("gpu_reset", False, "; ".join(bad))
    return Check("gpu_reset", True, "no GPU needs a reset")


def deploy_refusals(facts: dict, host_vars: dict, want: dict) -> list[Check]:
    """The failed checks a deploy refuses a host on, before any change (DEPLOY_CHECKS)."""
    checks = evaluate(
        facts,
        {
            **host_vars,
            "_drafter": want.get("drafter"),
            "_model_path": want["model_path"],
            "_weights": want.get("weights"),
        },
    )
    checks.append(gpu_reset_check(facts))
    return [c for c in checks if c.name in DEPLOY_CHECKS and not c.ok]


def drafter_check(fact: dict, want: dict) -> Check:
    """The drafter exists with a readable config whose block size matches the profile's."""
    path, block = want.get("path"), want.get("block_size")
    if fact.get("error"):
        return Check("drafter", False, f"{path}: {fact['error']}")
    got = fact.get("block_size")
    if block is not None and got is not None and int(got) != int(block):
        return Check(
            "drafter",
            False,
            f"{path}: config.json block_size {got}, the profile's speculative_dflash_block_size is {block}",
        )
    src = f" ({want['repo']} @ {want['revision'][:12]})" if want.get("repo") and want.get("revision") else ""
    return Check("drafter", True, f"{path}: block size {got if got is not None else 'not in config'}{src}")


def health_summary(facts: dict) -> str:
    """The `facts` table's health column: 'ok', or each faulty GPU with its worst action
    ('GPU 0 reset-gpu (row-remap-pending), GPU 3 reboot (xid-79)'), and a fabric manager that
    does not run where it should ('fabric manager install-matching (version-mismatch)'); ', kernel log unread' or
    '-q unread' when a source could not be read; '?' when neither was."""
    health, xids = facts.get("gpu_health"), facts.get("gpu_xid")
    per: dict = {}
    for g in (health or {}).get("gpus") or [] if isinstance(health, dict) else []:
        for f in g.get("faults") or []:
            per.setdefault(g.get("index") if g.get("index") is not None else g.get("bus_id"), []).append(
                (f["action"], f["fault"])
            )
    for e in (xids or {}).get("events") or [] if isinstance(xids, dict) else []:
        if e.get("kind") in ("hardware", "echo") and e.get("action") in ("reset-gpu", "reboot", "drain-and-rma"):
            per.setdefault(e.get("gpu") if e.get("gpu") is not None else e.get("pci"), []).append(
                (e["action"], label(e).split(" (")[0].lower().replace(" ", "-"))
            )
    parts = []
    for gpu_index, items in per.items():
        worst = max((a for a, _ in items), key=ACTIONS.index)
        names = sorted({n for _, n in items}, key=[n for _, n in items].index)
        parts.append(f"GPU {gpu_index} {worst} ({', '.join(names)})")
    fm = verdict(facts.get("fabric_manager"), facts.get("nvswitch"))
    if fm and not fm["ok"]:
        parts.append(f"fabric manager {fm['action']} ({fm['reason']})")
    unread = [w for w, f in (("-q", health), ("kernel log", xids)) if not isinstance(f, dict) or f.get("error")]
    if len(unread) == 2 and not parts:
        return "?"
    return (", ".join(parts) or "ok") + "".join(f", {u} unread" for u in unread)
