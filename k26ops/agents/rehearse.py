"""Host agent of `k26ops rehearse` (k26ops/rehearsal/run.py): start the
release's own engine on dummy weights in a private temp dir, poll it, send it
token-id requests, read its log, and stop it leaving nothing behind. Run
through agents.run (stdlib only); each `op_*` is one remote round trip.

The engine runs under a transient systemd unit where systemd is PID 1
(`systemd-run`, RuntimeMaxSec as its deadline), else as a child in its own
session and process group under coreutils `timeout` (a container GPU host,
`connection: local`): either way it dies at its deadline even if the control
node is gone, and `stop` kills the whole group/unit.
"""

import glob
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request

SMALL = (".json", ".py", ".model", ".tiktoken", ".txt", ".jinja")  # copied from a real model dir; never weights
SMALL_MAX = 16 << 20


def sh(argv, timeout=60):
    p = subprocess.run(argv, capture_output=True, text=True, timeout=timeout)
    return p.returncode, p.stdout, p.stderr


def has_systemd():
    return os.path.isdir("/run/systemd/system") and shutil.which("systemd-run") is not None


def unit_state(unit):
    rc, out, _ = sh(["systemctl", "show", unit, "-p", "ActiveState,SubState,MainPID,Result,ExecMainStatus"])
    return dict(l.split("=", 1) for l in out.splitlines() if "=" in l)


def port_free(port, host="127.0.0.1"):
    s = socket.socket()
    try:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        s.bind((host, port))
        return True
    except OSError:
        return False
    finally:
        s.close()


def gpu_apps():
    """[(pid, used MiB)] of the GPU's compute processes; None without nvidia-smi."""
    if not shutil.which("nvidia-smi"):
        return None
    try:
        rc, out, _ = sh(["nvidia-smi", "--query-compute-apps=pid,used_memory", "--format=csv,noheader,nounits"], 30)
    except (OSError, subprocess.TimeoutExpired):
        return None
    if rc != 0:
        return None
    apps = []
    for line in out.splitlines():
        parts = [p.strip() for p in line.split(",")]
        if len(parts) >= 2 and parts[0].isdigit():
            apps.append((int(parts[0]), parts[1]))
    return apps


def op_check(r):
    """What holds the host before a rehearsal: the serving unit's state, the GPUs' processes, the port."""
    out = {"systemd": has_systemd(), "port_free": port_free(r["port"]), "gpu_apps": gpu_apps()}
    if out["systemd"] and r.get("unit"):
        out["serving"] = unit_state(r["unit"]).get("ActiveState")
    py = r.get("python")
    out["python_exists"] = bool(py) and os.path.exists(py)
    if r.get("release"):  # `current` resolved: the release id its engine cache is kept under
        out["release_id"] = os.path.basename(os.path.realpath(r["release"]))
    return out


def copy_model_files(src, dst, notes):
    """A real model dir's small files (config, tokenizer, remote code), never its weights."""
    os.makedirs(dst, exist_ok=True)
    n = 0
    for path in sorted(glob.glob(os.path.join(src, "*"))):
        name = os.path.basename(path)
        if (
            os.path.isfile(path)
            and name.endswith(SMALL)
            and os.path.getsize(path) <= SMALL_MAX
            and not name.endswith(".index.json")
        ):
            shutil.copy2(path, os.path.join(dst, name))
            n += 1
    notes.append("copied %d small file(s) (config, tokenizer, code; no weights) from %s" % (n, src))


def read_json(path):
    try:
        with open(path, encoding="utf-8") as fh:
            return json.load(fh)
    except (OSError, ValueError):
        return None


def op_configs(r):
    """The model and drafter configs the host has (config.json under their paths), or None each."""
    return {
        "model": read_json(os.path.join(r["model_path"], "config.json")),
        "draft": read_json(os.path.join(r["draft_path"], "config.json")) if r.get("draft_path") else None,
    }


def write_env(path, env):
    """An EnvironmentFile (mode 0600) in the format k26ops writes its own (double-quoted, escaped)."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as fh:
        for k, v in sorted(env.items()):
            v = str(v)
            for ch in '\\"$`':
                v = v.replace(ch, "\\" + ch)
            fh.write('%s="%s"\n' % (k, v))


def op_start(r):
    """start, and the running engine's handle kept in `r["record"]` (the state dir's, 0600): a run
    killed before its stop leaves it for the next rehearse (op_leftovers) and status to find."""
    out = start(r)
    if out.get("ok") and r.get("record"):
        os.makedirs(os.path.dirname(r["record"]), mode=0o700, exist_ok=True)
        fd = os.open(r["record"] + ".tmp", os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600)
        with os.fdopen(fd, "w") as fh:
            json.dump(out["handle"], fh)
        os.replace(r["record"] + ".tmp", r["record"])
    return out


def start(r):
    """Make the temp dir (0700), write the configs, start the engine; return its handle."""
    tmp = tempfile.mkdtemp(prefix="k26ops-rehearse-", dir=r.get("tmp_root") or None)
    os.chmod(tmp, 0o700)
    notes = []
    try:
        for key, sub in (("model", "model"), ("draft", "draft")):
            spec = r.get(key)
            if not spec:
                continue
            d = os.path.join(tmp, sub)
            if spec.get("copy_from"):
                copy_model_files(spec["copy_from"], d, notes)
            os.makedirs(d, exist_ok=True)
            with open(os.path.join(d, "config.json"), "w") as fh:
                json.dump(spec["config"], fh, indent=1)
        for rel, text in (r.get("files") or {}).items():
            path = os.path.join(tmp, rel)
            if os.path.relpath(path, tmp).startswith(".."):
                raise ValueError("file outside the temp dir: " + rel)
            os.makedirs(os.path.dirname(path), exist_ok=True)
            with open(path, "w") as fh:
                fh.write(text)
        argv = [a.replace("{TMP}", tmp) for a in r["argv"]]
        log = os.path.join(tmp, "engine.log")
        env = {k: str(v).replace("{TMP}", tmp) for k, v in (r.get("env") or {}).items()}
        env.setdefault("PYTHONUNBUFFERED", "1")
        env.setdefault("PYTHONDONTWRITEBYTECODE", "1")  # the release stays as it was built
        deadline = int(r["deadline_s"])
        started = {"at": time.time(), "tz_offset": time.localtime().tm_gmtoff}  # its start, on this host's clock
        if has_systemd() and not r.get("no_systemd"):
            unit = "k26ops-rehearse-%s.service" % os.path.basename(tmp).split("-")[-1].replace("_", "")
            envfile = os.path.join(tmp, "env")
            write_env(envfile, env)
            rc, out, err = sh(
                [
                    "systemd-run",
                    "--unit",
                    unit,
                    "--collect",
                    "--quiet",
                    "-p",
                    "RuntimeMaxSec=%d" % deadline,
                    "-p",
                    "KillMode=control-group",
                    "-p",
                    "TimeoutStopSec=30",
                    "-p",
                    "EnvironmentFile=" + envfile,
                    "-p",
                    "WorkingDirectory=" + tmp,
                    "-p",
                    "StandardOutput=append:" + log,
                    "-p",
                    "StandardError=append:" + log,
                    "--",
                ]
                + argv,
                60,
            )
            if rc != 0:
                shutil.rmtree(tmp, ignore_errors=True)
                return {"ok": False, "error": "systemd-run: " + (err or out).strip()[-300:]}
            return {
                "ok": True,
                "handle": {"kind": "unit", "unit": unit, "tmp": tmp, "log": log},
                "notes": notes,
                **started,
            }
        full = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV")}
        full.update(env)  # as the unit's: the env file's variables over a clean login environment
        with open(log, "ab") as fh:
            p = subprocess.Popen(
                ["timeout", "-s", "TERM", "-k", "30", str(deadline)] + argv,
                cwd=tmp,
                env=full,
                stdin=subprocess.DEVNULL,
                stdout=fh,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        return {
            "ok": True,
            "handle": {"kind": "pgroup", "pid": p.pid, "pgid": p.pid, "tmp": tmp, "log": log},
            "notes": notes,
            **started,
        }
    except Exception as e:
        shutil.rmtree(tmp, ignore_errors=True)
        return {"ok": False, "error": "%s: %s" % (e.__class__.__name__, e)}


def group_pids(pgid):
    out = []
    for d in os.listdir("/proc"):
        if d.isdigit():
            try:
                with open("/proc/%s/stat" % d) as fh:
                    st = fh.read().rsplit(")", 1)[1].split()
                if int(st[2]) == pgid and st[0] != "Z":
                    out.append(int(d))
            except (OSError, IndexError, ValueError):
                pass
    return out


def unit_pids(unit):
    _, out, _ = sh(["systemctl", "show", unit, "-p", "ControlGroup", "--value"])
    try:
        with open("/sys/fs/cgroup" + out.strip() + "/cgroup.procs") as fh:
            return [int(x) for x in fh.read().split()]
    except (OSError, ValueError):
        return []


def alive(h):
    """None while the engine runs, else why it is gone."""
    if h["kind"] == "unit":
        s = unit_state(h["unit"])
        if s.get("ActiveState") in ("active", "activating", "reloading"):
            return None
        return "unit %s is %s/%s (%s, exit status %s)" % (
            h["unit"],
            s.get("ActiveState"),
            s.get("SubState"),
            s.get("Result"),
            s.get("ExecMainStatus"),
        )
    try:
        pid, status = os.waitpid(h["pid"], os.WNOHANG)
    except ChildProcessError:
        pid, status = 0, None
    if pid == 0 and status is None:  # not our child (another agent call started it)
        if group_pids(h["pgid"]) and os.path.exists("/proc/%d" % h["pid"]):
            try:
                with open("/proc/%d/stat" % h["pid"]) as fh:
                    if fh.read().rsplit(")", 1)[1].split()[0] != "Z":
                        return None
            except OSError:
                pass
        return "engine process %d exited" % h["pid"]
    if pid == 0:
        return None
    return "engine process %d exited with status %d" % (h["pid"], os.waitstatus_to_exitcode(status))


def tail(path, lines=400, max_bytes=1 << 20):
    try:
        with open(path, "rb") as fh:
            fh.seek(0, 2)
            size = fh.tell()
            fh.seek(max(0, size - max_bytes))
            text = fh.read().decode("utf-8", errors="replace")
    except OSError:
        return ""
    return "\n".join(text.splitlines()[-lines:])


def http(port, path, body=None, timeout=5.0, host="127.0.0.1"):
    url = "http://%s:%d%s%sfrom=k26ops" % (host, port, path, "&" if "?" in path else "?")
    data = json.dumps(body).encode() if body is not None else None
    req = urllib.request.Request(url, data=data, headers={"Content-Type": "application/json"} if data else {})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            return resp.status, resp.read().decode(errors="replace")
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode(errors="replace")[:300]
    except Exception as e:
        return 0, "%s: %s" % (e.__class__.__name__, e)


MEANINGFUL = (
    "Load weight",
    "Capture cuda graph",
    "CUDA graph",
    "capture",
    "KV Cache",
    "Init torch",
    "fired up",
    "Uvicorn running",
    "ERROR",
    "Error",
    "Traceback",
    "server_args",
    "Compil",
    "JIT",
)


def last_meaningful(text):
    lines = [l for l in text.splitlines() if l.strip()]
    for line in reversed(lines):
        if any(m in line for m in MEANINGFUL):
            return line.strip()[:200]
    return lines[-1].strip()[:200] if lines else ""


def op_poll(r):
    """One long-poll window of the ready-wait (the engine agent's `poll` contract):
    healthy once /health and /health_generate answer 200; crashed when it is gone."""
    h, port = r["handle"], r["port"]
    end = time.monotonic() + r.get("window", 2.0)
    while True:
        why = alive(h)
        if why:
            time.sleep(0.3)  # its last words
            return {
                "state": "crashed",
                "why": why,
                "journal": tail(h["log"], r.get("journal_lines") or 400),
                "base": {},
            }
        code, _ = http(port, "/health", timeout=5.0)
        if code == 200:
            code2, _ = http(port, "/health_generate", timeout=r.get("generate_timeout", 120.0))
            if code2 == 200:
                return {"state": "healthy", "base": {}, "at": time.time()}
        if time.monotonic() >= end:
            return {
                "state": "loading" if code in (0, 503) else "unhealthy",
                "health": code,
                "last_line": last_meaningful(tail(h["log"], 60)),
                "base": {},
            }
        time.sleep(r.get("interval", 0.5))


def generated(body):
    """Tokens an answer carries: output_ids with --skip-tokenizer-init, else text."""
    if not isinstance(body, dict):
        return 0
    ids = body.get("output_ids")
    if isinstance(ids, list) and ids:
        return len(ids)
    return len(body.get("text") or "") and 1


def op_smoke(r):
    """The smoke requests as token ids (the tokenizer is skipped); the first that
    fails ends it, and then: did the engine die of it (its log)?"""
    h, port = r["handle"], r["port"]
    results = []
    for q in r["requests"]:
        body = {"input_ids": r["input_ids"], "sampling_params": dict(q["sampling"], max_new_tokens=r["max_new_tokens"])}
        t0 = time.monotonic()
        code, text = http(port, "/generate", body, timeout=r.get("timeout_s", 600.0))
        lat = time.monotonic() - t0
        try:
            data = json.loads(text)
        except ValueError:
            data = None
        res = {
            "name": q["name"],
            "sampling": q["sampling"],
            "status": code,
            "latency_s": round(lat, 4),
            "body": data if isinstance(data, dict) else text[:300],
            "at": time.time(),
        }
        results.append(res)
        if code == 200 and generated(data):
            continue
        end = time.monotonic() + (r.get("crash_wait", 5.0) if code == 0 else 1.5)
        why = alive(h)
        while not why and time.monotonic() < end:
            time.sleep(0.2)
            why = alive(h)
        out = {"results": results, "failed": q["name"], "crash": None}
        if why:
            time.sleep(0.3)
            out["crash"] = {"why": why, "journal": tail(h["log"], 400)}
        else:
            out["journal"] = tail(h["log"], 60)
        return out
    return {"results": results, "failed": None, "crash": None}


def op_metrics(r):
    code, text = http(r["port"], "/metrics", timeout=10.0)
    return {"status": code, "text": text if code == 200 else ""}


def op_log(r):
    return {"text": tail(r["handle"]["log"], r.get("lines", 2000), r.get("max_bytes", 4 << 20))}


def op_release(r):
    """A release's site-packages and engine base (its manifest.json), for --probe."""
    m = read_json(os.path.join(r["release"], "manifest.json"))
    if not isinstance(m, dict):
        return {"ok": False, "error": "release %s has no readable manifest.json (not built by k26ops?)" % r["release"]}
    site = m.get("site_packages") or ""
    if not os.path.isdir(site):
        return {"ok": False, "error": "release %s: site-packages %s is missing" % (r["release"], site)}
    return {
        "ok": True,
        "release": os.path.realpath(r["release"]),
        "site": site,
        "base": (m.get("engine") or {}).get("base"),
    }


def op_hashes(r):
    """sha256 of every file under root/under (the probe's byte-exact revert is checked on these)."""
    import hashlib

    out, top = {}, os.path.join(r["root"], r["under"])
    for d, dirs, names in os.walk(top):
        dirs[:] = [x for x in dirs if x != "__pycache__"]
        for n in names:
            p = os.path.join(d, n)
            with open(p, "rb") as fh:
                out[os.path.relpath(p, r["root"])] = hashlib.sha256(fh.read()).hexdigest()
    return {"hashes": out}


def op_stop(r):
    """Stop the engine (TERM, then KILL after `grace` s), remove the temp dir,
    and say what, if anything, is left: processes of the group/unit, GPU memory."""
    h = r["handle"]
    done, left = [], []
    log = tail(h["log"], r.get("lines", 2000), 4 << 20) if r.get("with_log") else None
    if h["kind"] == "unit":
        pids = unit_pids(h["unit"])
        sh(["systemctl", "stop", h["unit"]], 120)
        s = unit_state(h["unit"])
        if s.get("ActiveState") not in ("inactive", "failed", ""):
            sh(["systemctl", "kill", "-s", "KILL", h["unit"]])
            time.sleep(1)
            s = unit_state(h["unit"])
        sh(["systemctl", "reset-failed", h["unit"]])
        done.append("stopped " + h["unit"])
        if s.get("ActiveState") in ("active", "activating", "deactivating"):
            left.append("unit %s is %s" % (h["unit"], s.get("ActiveState")))
        left += ["process %d" % p for p in pids if os.path.exists("/proc/%d" % p)]
    else:
        pids = group_pids(h["pgid"])
        if pids:
            try:
                os.killpg(h["pgid"], signal.SIGTERM)
            except ProcessLookupError:
                pass
            end = time.monotonic() + r.get("grace", 30.0)
            while group_pids(h["pgid"]) and time.monotonic() < end:
                try:
                    os.waitpid(-h["pgid"], os.WNOHANG)
                except ChildProcessError:
                    pass
                time.sleep(0.2)
            if group_pids(h["pgid"]):
                try:
                    os.killpg(h["pgid"], signal.SIGKILL)
                except ProcessLookupError:
                    pass
                time.sleep(1)
                done.append(
                    "killed process group %d (it outlived SIGTERM by %.0f s)" % (h["pgid"], r.get("grace", 30.0))
                )
            else:
                done.append("process group %d ended on SIGTERM" % h["pgid"])
        left += ["process %d" % p for p in group_pids(h["pgid"])]
    apps = gpu_apps()
    if apps and pids:
        left += ["GPU memory of pid %d (%s MiB)" % (p, m) for p, m in apps if p in pids]
    shutil.rmtree(h["tmp"], ignore_errors=True)
    if os.path.exists(h["tmp"]):
        left.append("temp dir " + h["tmp"])
    else:
        done.append("removed " + h["tmp"])
    if r.get("record") and not left:
        try:
            os.unlink(r["record"])
        except OSError:
            pass
    return {"done": done, "left": left, "log": log, "gpu_apps_after": apps}


def op_leftovers(r):
    """What a killed rehearsal left: the handle its start recorded in `record` (the state dir's;
    its stop removes it), whose unit or process group and temp dir may still be there (the
    deadline stops them only later). Called under the host lock, so no rehearsal of ours
    runs: a record is a dead run's. `remove`: stopped, removed, the record too.
    {"handle": {...} | None, "alive": [...], "removed": {"done", "left"} | None}."""
    h = read_json(r["record"])
    if not isinstance(h, dict) or h.get("kind") not in ("unit", "pgroup"):
        return {"handle": None, "alive": [], "removed": None}
    alive = []
    if h["kind"] == "unit" and unit_state(h["unit"]).get("ActiveState") not in ("inactive", "failed", "", None):
        alive.append("unit " + h["unit"])
    if h["kind"] == "pgroup" and group_pids(h["pgid"]):
        alive.append("process group %d" % h["pgid"])
    if os.path.isdir(h.get("tmp") or ""):
        alive.append("temp dir " + h["tmp"])
    removed = None
    if r.get("remove"):
        removed = op_stop({"handle": h, "record": r["record"]})
        removed.pop("gpu_apps_after", None)
        removed.pop("log", None)
    return {"handle": h, "alive": alive, "removed": removed}


if __name__ == "__main__":
    req = json.loads(sys.stdin.read())
    res = globals()["op_" + req.pop("op")](req)
    sys.stdout.write("\n" + json.dumps(res) + "\n")
