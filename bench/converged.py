"""Case 2, converged re-deploy on one host: k26ops vs the Ansible equivalent.

Boots a 1-host lab, deploys it once, then REPS times each (interleaved):
  - `k26ops --json deploy` (converged): process wall time, remote commands
    (SSH exec channels, from the report's `commands`);
  - `ansible-playbook bench/ansible_playbooks/converged.yml` (same host, same state:
    unit, env file 0600, current -> release, nvcc version, package versions
    via pip, service active + enabled, health, smoke), with Ansible's defaults
    (ssh ControlPersist on, pipelining off) and with pipelining on.
Ansible uses the lab's key and known_hosts with StrictHostKeyChecking=yes.
One extra -vvv run per Ansible mode counts its `SSH: EXEC` lines (each one an
ssh/sftp process, i.e. one exec channel over the ControlPersist master); it is
not timed. The playbook's release id, sglang and CUDA versions come from the
host's recipe and lock through `steps.release.expected_state`, the function the
deploy takes its release id from; the bench stops if the host's `current` is not
that release, if Ansible passes with a wrong sglang version, or if either tool
finds the lab's registry source (lab-registry) unconverged after its deploy. Ratio = Ansible median / k26ops median (target >= 3).

    python bench/converged.py [--reps 5]
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import time

import common
import yaml

# Not bench/ansible/: this script's folder is sys.path[0], and a folder named `ansible` there was
# imported as a namespace package in place of a missing ansible-core (no __version__).
PLAYBOOK = common.REPO / "bench" / "ansible_playbooks" / "converged.yml"


INSTALL_ANSIBLE = (
    "bench/converged.py compares k26ops with ansible-playbook and needs ansible-core: "
    f"{sys.executable} -m pip install 'ansible-core>=2.16' (or: pip install -e '.[test]')"
)


def ensure_ansible() -> tuple[str, str]:
    """ansible-core's version and its ansible-playbook, from this Python's installed distribution
    (not whatever `ansible` name is importable); exits with how to install it when missing."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        found = version("ansible-core")
    except PackageNotFoundError:
        sys.exit(INSTALL_ANSIBLE)
    exe = os.path.join(os.path.dirname(sys.executable), "ansible-playbook")
    if not os.path.exists(exe):
        exe = shutil.which("ansible-playbook")
        if not exe:
            sys.exit(f"ansible-core {found} is installed but ansible-playbook is not on PATH; " + INSTALL_ANSIBLE)
    return found, exe


def ansible_setup(b: common.BenchLab, host: str) -> tuple[dict, dict]:
    """Ansible inventory + vars for `host`, from the deployed host's own files."""
    files = b.dir / "ansible-files"
    files.mkdir(exist_ok=True)
    (files / "k26-engine.service").write_text(b.ssh(host, f"cat /etc/systemd/system/{common.UNIT}"))
    (files / "sglang.env").write_text(b.ssh(host, f"cat {common.ENV_FILE}"))
    want = expected_state(b, host)
    rid = b.ssh(host, "readlink /opt/k26ops/releases/current").strip()
    if rid != want["release_id"]:  # the two tools must check the one state k26ops deployed
        raise RuntimeError(f"{host}: current -> {rid}, but the recipe and lock give {want['release_id']}")
    inv = {
        "all": {
            "hosts": {
                host: {
                    "ansible_host": "127.0.0.1",
                    "ansible_port": b.port(host),
                    "ansible_user": "root",
                    "ansible_ssh_private_key_file": str(b.dir / "id_ed25519"),
                    "ansible_ssh_common_args": f"-o UserKnownHostsFile={b.dir / 'known_hosts'} -o StrictHostKeyChecking=yes",
                    "ansible_python_interpreter": "/usr/bin/python3",
                }
            }
        }
    }
    inv_path = b.dir / "ansible-inventory.yml"
    inv_path.write_text(yaml.safe_dump(inv))
    vars_ = {
        "release_id": rid,
        "engine_port": b.engine_port(host),
        "unit_src": str(files / "k26-engine.service"),
        "env_src": str(files / "sglang.env"),
        "module_src": str(common.REPO / "k26ops/lab/fixtures/engine_standin.py"),
        **want,
    }
    vars_path = b.dir / "ansible-vars.json"
    vars_path.write_text(json.dumps(vars_))
    return {"inventory": inv_path, "vars": vars_path}, vars_


def expected_state(b: common.BenchLab, host: str) -> dict:
    """release_id, sglang_version, cuda_version for the playbook: from the host's
    recipe and lock through the function the deploy takes its own release id from."""
    from k26ops.steps import release

    inv = yaml.safe_load(b.inventory.read_text())
    hvars = {**(inv.get("vars") or {}), **inv["hosts"][host].get("vars", {})}
    return release.expected_state(release.recipe_for(hvars))


def ansible_env(b: common.BenchLab, pipelining: bool) -> dict:
    cfg = b.dir / "ansible.cfg"  # empty: Ansible's defaults, no user/site config
    cfg.write_text("[defaults]\n")
    return {
        **os.environ,
        "ANSIBLE_HOST_KEY_CHECKING": "True",
        "ANSIBLE_PIPELINING": str(pipelining),
        "ANSIBLE_NOCOLOR": "1",
        "ANSIBLE_RETRY_FILES_ENABLED": "False",
        "ANSIBLE_LOCAL_TEMP": str(b.dir / "ansible-tmp"),
        "ANSIBLE_CONFIG": str(cfg),
        "ANSIBLE_CONTROL_PATH_DIR": str(b.dir / "ansible-cp"),
    }


def run_ansible(exe, paths, env, verbose=False) -> tuple[float, str, dict]:
    cmd = [exe, "-i", str(paths["inventory"]), "-e", f"@{paths['vars']}", str(PLAYBOOK)]
    if verbose:
        cmd.append("-vvv")
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=600)
    wall = time.perf_counter() - t0
    m = re.search(r"ok=(\d+)\s+changed=(\d+)\s+unreachable=(\d+)\s+failed=(\d+)", proc.stdout)
    recap = dict(zip(("ok", "changed", "unreachable", "failed"), map(int, m.groups()))) if m else {}
    if proc.returncode != 0 or not recap or recap["changed"] or recap["failed"] or recap["unreachable"]:
        raise RuntimeError(
            f"ansible run not converged/ok (rc {proc.returncode}, {recap}):\n"
            f"{proc.stdout[-3000:]}\n{proc.stderr[-1500:]}"
        )
    return wall, proc.stdout, recap


def registry_and_negative(b: common.BenchLab, host: str, exe: str, envs: dict) -> dict:
    """Not timed. (1) Ansible fails when told another sglang version than the one
    installed (its check is real). (2) The same comparison for the lab's registry
    source (recipe lab-registry): k26ops deploys it, then both tools find it converged."""
    paths, vars_ = ansible_setup(b, host)
    wrong = b.dir / "ansible-vars-wrong.json"
    wrong.write_text(json.dumps({**vars_, "sglang_version": vars_["sglang_version"] + ".1"}))
    try:
        run_ansible(exe, {**paths, "vars": wrong}, envs["default"])
    except RuntimeError:
        pass
    else:
        raise RuntimeError("ansible passed with a wrong sglang version: the playbook no longer checks it")
    out = {"git": {"sglang_version": vars_["sglang_version"], "release_id": vars_["release_id"]}}
    inv = yaml.safe_load(b.inventory.read_text())
    inv["vars"]["recipe"] = "lab-registry"
    b.inventory.write_text(yaml.safe_dump(inv, sort_keys=False))
    common.first_deploy(b)
    rc, data, _ = common.deploy_json(b.inventory)
    r = data["hosts"][host]
    if rc != 0 or r["status"] != "ok" or any(s["changed"] for s in r["steps"]):
        raise RuntimeError(f"k26ops converged deploy (lab-registry) not ok: {r['status']} {r['error']}")
    paths, vars_ = ansible_setup(b, host)
    for env in envs.values():
        run_ansible(exe, paths, env)
    out["registry"] = {"sglang_version": vars_["sglang_version"], "release_id": vars_["release_id"]}
    print(
        f"  checks: wrong version fails ansible; converged for git ({out['git']['sglang_version']}) "
        f"and registry ({out['registry']['sglang_version']}) with both tools"
    )
    return out


def count_exec(out: str) -> dict:
    lines = [l for l in out.splitlines() if "SSH: EXEC" in l]
    sftp = [l for l in lines if re.search(r"EXEC (sftp|scp)\b", l)]
    return {"exec_lines": len(lines), "ssh": len(lines) - len(sftp), "sftp_or_scp": len(sftp)}


def main() -> int:
    reps = common.reps_arg(5)
    version, exe = ensure_ansible()
    k26, ans = [], {"default": [], "pipelining": []}
    execs, recaps = {}, {}
    with common.lab(1, "converged") as b:
        host = b.names[0]
        t0 = time.monotonic()
        common.first_deploy(b)
        print(f"first deploy: {time.monotonic() - t0:.0f}s")
        paths, _ = ansible_setup(b, host)
        envs = {"default": ansible_env(b, False), "pipelining": ansible_env(b, True)}
        # warm-ups (not counted) and the -vvv counts (not timed)
        common.deploy_json(b.inventory)
        for mode, env in envs.items():
            run_ansible(exe, paths, env)
            _, out, recaps[mode] = run_ansible(exe, paths, env, verbose=True)
            execs[mode] = count_exec(out)
        for i in range(reps):
            rc, data, wall = common.deploy_json(b.inventory)
            r = data["hosts"][host]
            if rc != 0 or r["status"] != "ok" or any(s["changed"] for s in r["steps"]):
                raise RuntimeError(f"k26ops converged deploy not ok: {r['status']} {r['error']}")
            k26.append({"wall": wall, "elapsed": r["elapsed"], "commands": r["commands"]})
            line = f"  rep {i + 1}: k26ops {wall:.2f}s ({r['commands']} commands)"
            for mode, env in envs.items():
                w, _, _ = run_ansible(exe, paths, env)
                ans[mode].append(w)
                line += f", ansible[{mode}] {w:.2f}s"
            print(line)
        checks = registry_and_negative(b, host, exe, envs)
    out = {
        "checks": checks,
        "reps": reps,
        "ansible_version": version,
        "host": "lab1",
        "k26ops": {
            "wall": common.stats([x["wall"] for x in k26]),
            "in_run_elapsed": common.stats([x["elapsed"] for x in k26]),
            "commands": sorted({x["commands"] for x in k26}),
        },
        "ansible": {
            mode: {"wall": common.stats(v), "ssh_exec": execs[mode], "recap": recaps[mode]} for mode, v in ans.items()
        },
    }
    kmed = out["k26ops"]["wall"]["median"]
    for mode in ans:
        out["ansible"][mode]["ratio_vs_k26ops"] = out["ansible"][mode]["wall"]["median"] / kmed
    out["target"] = "ansible (default) wall / k26ops wall >= 3"
    out["met"] = out["ansible"]["default"]["ratio_vs_k26ops"] >= 3
    rows = [("k26ops deploy", common.fmt(out["k26ops"]["wall"]), ",".join(map(str, out["k26ops"]["commands"])), "1.00")]
    for mode in ans:
        a = out["ansible"][mode]
        rows.append(
            (
                f"ansible-playbook ({mode})",
                common.fmt(a["wall"]),
                f"{a['ssh_exec']['exec_lines']} ({a['ssh_exec']['sftp_or_scp']} sftp)",
                f"{a['ratio_vs_k26ops']:.2f}",
            )
        )
    common.table(
        f"converged re-deploy, 1 host, {reps} reps",
        rows,
        ("tool", "wall median (min-max)", "remote commands", "x k26ops"),
    )
    print(f"  k26ops in-run (connect to done): {common.fmt(out['k26ops']['in_run_elapsed'])}")
    print(f"  target: Ansible >= 3x slower: {'met' if out['met'] else 'MISSED'}")
    common.write_result("converged", out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
