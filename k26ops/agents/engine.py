"""Host agent of the engine steps (k26ops/steps/engine.py): the unit, its env
file and secret-flags file (both 0600), health, smoke and logs. Run through agents.run (stdlib only); each
`op_*` is one remote round trip.
"""

import hashlib  # shutil and http.client where used: a read skips them
import json
import os
import subprocess
import sys
import time

PROPS = (
    "ActiveState,SubState,MainPID,NRestarts,UnitFileState,LoadState,InvocationID,"
    "ExecMainStatus,Result,ExecMainStartTimestamp,ExecMainStartTimestampMonotonic,ActiveEnterTimestampMonotonic,"
    "FragmentPath"
)


def sh(argv, timeout=60):
    p = subprocess.run(argv, capture_output=True, text=True, timeout=timeout)
    return p.returncode, p.stdout, p.stderr


LIMIT_LINE = "Start request repeated too quickly"


def show(unit):
    _, out, _ = sh(["systemctl", "show", unit, "-p", PROPS])
    d = dict(l.split("=", 1) for l in out.splitlines() if "=" in l)
    for k in (
        "MainPID",
        "NRestarts",
        "ExecMainStatus",
        "ExecMainStartTimestampMonotonic",
        "ActiveEnterTimestampMonotonic",
    ):
        try:
            d[k] = int(d.get(k) or 0)
        except ValueError:
            d[k] = 0
    if d.get("ActiveState") == "failed":  # systemd 252 keeps Result=exit-code at its start limit: its last lines say
        _, tail, _ = sh(["journalctl", "-u", unit, "-n", "8", "-o", "cat", "--no-pager"])
        d["StartLimitHit"] = LIMIT_LINE in tail
    return d


def run_id(s):
    """The engine run being watched: another MainPID, NRestarts or InvocationID later means
    it died or restarted (k26ops.engine.state.run_identity on the control node's side)."""
    return {k: s.get(k) for k in ("MainPID", "NRestarts", "InvocationID")}


def read(path):
    try:
        with open(path, encoding="utf-8", errors="replace") as fh:
            return fh.read()
    except FileNotFoundError:
        return None


def mode(path):
    try:
        return os.stat(path).st_mode & 0o7777
    except FileNotFoundError:
        return None


def write(path, text, perm):
    """Temp file + rename; the same text already there is left alone (a rollback
    onto a full disk must not need room), and a failed write leaves no temp file."""
    d = os.path.dirname(path)
    os.makedirs(d, exist_ok=True)
    if read(path) == text and mode(path) == perm:
        return
    tmp = os.path.join(d, "." + os.path.basename(path) + ".k26ops-tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, perm)
    try:
        try:
            os.fchmod(fd, perm)
            os.write(fd, text.encode())
            os.fsync(fd)
        finally:
            os.close(fd)
    except OSError:
        os.unlink(tmp)
        raise
    os.replace(tmp, path)


# The engine's --api-key, when it has one (the request's "api_key"; never in an answer).
# SGLang asks for it on every path but /health*, /ready* and /metrics*.
API_KEY = []
# The engine's unit (the request's "unit"): every request to the port goes only to a listener of its
# process tree (MainPID, its descendants, its cgroup), never to a stand-in another user bound there.
UNIT = []


class Foreign(Exception):
    """The port's listener is not the engine's: `holder` names it (pid, user, command)."""

    def __init__(self, holder):
        super().__init__(holder.get("pid"))
        self.holder = holder


def port_sockets(port):
    """Inodes of the TCP sockets listening on `port` (any address, IPv4 and IPv6)."""
    found = set()
    for name in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            with open(name) as fh:
                rows = fh.read().splitlines()[1:]
        except OSError:
            continue
        for row in rows:
            f = row.split()
            if len(f) > 9 and f[3] == "0A" and int(f[1].rsplit(":", 1)[1], 16) == port:
                found.add(f[9])
    found.discard("0")
    return found


def pid_sockets(pid):
    out = set()
    try:
        fds = os.listdir("/proc/%d/fd" % pid)
    except OSError:
        return out
    for fd in fds:
        try:
            link = os.readlink("/proc/%d/fd/%s" % (pid, fd))
        except OSError:
            continue
        if link.startswith("socket:["):
            out.add(link[8:-1])
    return out


def proc_line(pid, name):
    try:
        with open("/proc/%d/%s" % (pid, name), "rb") as fh:
            return fh.read()
    except OSError:
        return b""


def holder(pid):
    """pid, user and command of a process (what a refusal names)."""
    import pwd

    uid = None
    for line in proc_line(pid, "status").decode(errors="replace").splitlines():
        if line.startswith("Uid:"):
            uid = int(line.split()[1])
    try:
        user = pwd.getpwuid(uid).pw_name if uid is not None else "?"
    except KeyError:
        user = str(uid)
    cmd = proc_line(pid, "cmdline").replace(b"\0", b" ").decode(errors="replace").strip()
    return {"pid": pid, "user": user, "command": cmd[:120] or "?"}


def pids():
    return [int(d) for d in os.listdir("/proc") if d.isdigit()]


def in_tree(pid, main):
    """Is `pid` the engine's MainPID, a descendant of it, or in the same cgroup (the unit's)?"""
    seen, p = 0, pid
    while p > 1 and seen < 64:
        if p == main:
            return True
        stat = proc_line(p, "stat").decode(errors="replace")
        try:
            p = int(stat[stat.rindex(")") + 2 :].split()[1])
        except (ValueError, IndexError):
            break
        seen += 1
    cg = proc_line(main, "cgroup").strip()
    unit = (UNIT[0] if UNIT and UNIT[0] else "").encode()
    return bool(unit) and cg.endswith(b"/" + unit) and cg == proc_line(pid, "cgroup").strip()


def check_listener(port, main):
    """Raise Foreign unless every listener on `port` belongs to the engine (`main`: its MainPID).
    Nothing listening passes (a request then finds no one). A socket no process here holds
    (another network namespace's) is foreign too."""
    socks = port_sockets(port)
    if not socks:
        return
    if main:
        socks -= pid_sockets(main)  # the fast case: the engine's own process listens
    if not socks:
        return
    everyone = pids()
    for pid in everyone:
        mine = pid_sockets(pid) & socks
        if not mine:
            continue
        if main and in_tree(pid, main):
            socks -= mine
            continue
        raise Foreign(holder(pid))
    if socks:
        raise Foreign(
            {
                "pid": None,
                "user": "?",
                "command": "a socket no process of this host holds (another network namespace's)",
            }
        )


def main_pid(unit):
    _, out, _ = sh(["systemctl", "show", unit, "-p", "MainPID", "--value"])
    try:
        return int(out.strip() or 0)
    except ValueError:
        return 0


def auth_headers(path):
    if API_KEY and API_KEY[0] and not path.startswith(("/health", "/ready", "/metrics")):
        return {"Authorization": "Bearer " + API_KEY[0]}
    return {}


def http(port, path, body=None, timeout=5.0, host="127.0.0.1", pid=None):
    """(status, body) of one GET (POST with `body`); a status outside 2xx keeps 300 chars of
    its body; no answer is (0, "Error: why"). http.client, imported here: ops without HTTP
    (read, apply) skip its ~17 ms of host CPU, and urllib.request's ~5 ms more buy nothing
    for one plain request to the engine on this host (no redirects, proxies or cookies).
    With a unit (UNIT), the listener is checked first (`pid`: its MainPID, when the caller
    just read it): Foreign, and nothing is sent, when another process holds the port."""
    if UNIT and UNIT[0]:
        check_listener(port, main_pid(UNIT[0]) if pid is None else pid)
    elif auth_headers(path):
        raise Foreign({"pid": None, "user": "?", "command": "no engine unit to match the listener against"})
    from http.client import HTTPConnection

    # Marked as k26ops' own (health, smoke), so `k26ops logs` can hide them; engines ignore the query.
    url = "%s%sfrom=k26ops" % (path, "&" if "?" in path else "?")
    data = json.dumps(body).encode() if body is not None else None
    headers = dict(auth_headers(path), **({"Content-Type": "application/json"} if data else {}))
    conn = HTTPConnection(host, port, timeout=timeout)
    try:
        conn.request("GET" if data is None else "POST", url, body=data, headers=headers)
        r = conn.getresponse()
        text = r.read().decode(errors="replace")
    except Exception as e:
        return 0, "%s: %s" % (e.__class__.__name__, e)
    finally:
        conn.close()
    return r.status, text if 200 <= r.status < 300 else text[:300]


def journal(unit, lines, invocation=None):
    argv = ["journalctl", "--no-pager", "-o", "cat", "-n", str(lines)]
    argv += ["_SYSTEMD_INVOCATION_ID=" + invocation] if invocation else ["-u", unit]
    _, out, _ = sh(argv)
    return out


MEANINGFUL = (
    "Loading safetensors",
    "Load weight",
    "Capture cuda graph",
    "CUDA graph",
    "KV Cache",
    "Init torch",
    "fired up",
    "Uvicorn running",
    "ERROR",
    "Error",
    "Traceback",
    "Starting",
    "server_args",
)


def last_meaningful(text):
    for line in reversed(text.splitlines()):
        if any(m in line for m in MEANINGFUL):
            return line.strip()[:200]
    lines = [l for l in text.splitlines() if l.strip()]
    return lines[-1].strip()[:200] if lines else ""


def crashed(s, base):
    if s.get("ActiveState") in ("failed", "inactive", "deactivating"):
        return "unit is %s (%s)" % (s.get("ActiveState"), s.get("Result"))
    if s.get("SubState") in ("auto-restart", "failed", "dead", "exited", "stop-sigterm", "final-sigterm"):
        return "unit is %s/%s" % (s.get("ActiveState"), s.get("SubState"))
    if base.get("MainPID") and s.get("MainPID") != base["MainPID"]:
        return "engine process %s exited (now %s)" % (base["MainPID"], s.get("MainPID") or "none")
    if s.get("NRestarts", 0) > base.get("NRestarts", 0):
        return "systemd restarted the engine"
    return None


EXIT_LINES = ("Main process exited", "Failed with result", "Deactivated successfully", "Succeeded.")


def exit_line(invocation, wait):
    """Wait (at most `wait` s) for systemd's own line about this run's end: it
    carries INVOCATION_ID, and once it is in the journal the engine's last words
    are too (they come on the stdout stream that closed before it). Returns the line."""
    end = time.monotonic() + wait
    while invocation:
        _, out, _ = sh(["journalctl", "--no-pager", "-o", "cat", "INVOCATION_ID=" + invocation])
        hit = [l for l in out.splitlines() if any(m in l for m in EXIT_LINES)]
        if hit or time.monotonic() >= end:
            return hit[0].strip() if hit else None
        time.sleep(0.05)
    time.sleep(min(wait, 0.4))
    return None


def kernel_nvrm(s, limit=50):
    """The kernel's NVRM lines from shortly before this run of the unit started (an Xid there is
    what the crash may be the symptom of), and nvidia-smi's bus ids when there are any."""
    start = s.get("ExecMainStartTimestampMonotonic") or 0
    since = time.time() - (time.monotonic() - start / 1e6) - 300 if start else time.time() - 3600
    try:
        _, o, _ = sh(
            ["journalctl", "-k", "-b", "-o", "short-iso", "--no-pager", "--since", "@%d" % int(since)], timeout=20
        )
        lines = [l for l in o.splitlines() if "NVRM" in l][-limit:]
        if not lines:
            return {}
        rc, bus, _ = sh(["nvidia-smi", "--query-gpu=index,pci.bus_id", "--format=csv,noheader"], timeout=20)
    except (OSError, subprocess.SubprocessError):
        return {}
    return {"kernel": "\n".join(lines), "bus_ids": bus if rc == 0 else ""}


def crash_report(unit, base, why, lines, wait=3.0):
    """The crash as the control node reports it: why, the unit's state and the
    journal of the run that died (its own invocation only)."""
    inv = base.get("InvocationID")
    line = exit_line(inv, wait)
    s = show(unit)
    return {"why": why, "exit_line": line, "show": s, "journal": journal(unit, lines, inv), **kernel_nvrm(s)}


def died(unit, base, wait):
    """After a failed request: did the engine die of it? Polls the unit (a dying
    engine takes a moment to exit) until it shows the death or `wait` runs out."""
    end = time.monotonic() + wait
    while True:
        s = show(unit)
        why = crashed(s, base)
        if why or time.monotonic() >= end:
            return why, s
        time.sleep(0.1)


def cache_stat(c):
    """What the engine's cache dir holds ({"files", "kernels", "bytes"}; None when absent).
    `c`: the request's "cache" ({"dir", "suffixes": what a compiled kernel's file name ends with})."""
    if not c or not os.path.isdir(c["dir"]):
        return None
    files = kernels = size = 0
    ends = tuple(c.get("suffixes") or ())
    for root, _dirs, names in os.walk(c["dir"]):
        for n in names:
            try:
                size += os.lstat(os.path.join(root, n)).st_size
            except OSError:
                continue
            files += 1
            kernels += n.endswith(ends)
    return {"files": files, "kernels": kernels, "bytes": size}


def make_cache(c):
    """The cache dir, root-only: its top (`c["top"]`, k26ops_root/engine-cache) and every
    directory down to it mode 0700 (cached objects are loaded into the engine); owned by
    the unit's User= where it has one (`c["owner"]`), else root."""
    top, d = c["top"], c["dir"]
    rel = os.path.relpath(d, top)
    if rel.startswith(".."):
        raise ValueError("engine cache %s is not under %s" % (d, top))
    uid = gid = None
    if c.get("owner"):
        import pwd

        pw = pwd.getpwnam(c["owner"])
        uid, gid = pw.pw_uid, pw.pw_gid
    path = top
    for part in [""] + rel.split(os.sep):
        path = os.path.join(path, part) if part else path
        os.makedirs(path, mode=0o700, exist_ok=True)
        if mode(path) != 0o700:
            os.chmod(path, 0o700)
        if uid is not None and path != top:
            os.chown(path, uid, gid)
    if uid is not None:
        os.chmod(top, 0o711)  # the user passes through to its own dir only


def started_at(s):
    """The wall time the unit's main process started (systemd's monotonic stamp, on this host's clock)."""
    mono = s.get("ExecMainStartTimestampMonotonic") or 0
    return time.time() - (time.monotonic() - mono / 1e6) if mono else None


def op_cache(r):
    if r.get("make"):
        make_cache(r["cache"])
    return {"cache": cache_stat(r["cache"]), "at": time.time()}


def op_read(r):
    cur = None
    try:
        cur = os.readlink(r["current"])
    except OSError:
        pass
    lab = r.get("lab_module")
    sha = None
    if lab and os.path.exists(lab):
        with open(lab, "rb") as fh:
            sha = hashlib.sha256(fh.read()).hexdigest()
    spath = r.get("secrets_path")
    return {
        "prev_unsettled": unsettled(r.get("state_dir")),
        "unit": read(r["unit_path"]),
        "env": read(r["env_path"]),
        "env_mode": mode(r["env_path"]),
        "secrets": read(spath) if spath else None,
        "secrets_mode": mode(spath) if spath else None,
        "current": cur,
        "lab_module_sha": sha,
        "show": show(r["unit"]),
    }


def prev_manifest(state_dir):
    try:
        with open(os.path.join(state_dir, "service", "prev", "manifest.json")) as fh:
            return json.load(fh)
    except (OSError, ValueError, TypeError):
        return None


def unsettled(state_dir):
    """An install whose engine was never seen healthy (its run killed mid-install): prev/ still
    holds what ran before it, which a failed run restores (op_settle marks it seen)."""
    m = prev_manifest(state_dir) if state_dir else None
    return isinstance(m, dict) and m.get("settled") is False


def op_settle(r):
    """The engine of the last install answered healthy: prev/ is its own run's to restore no more."""
    m = prev_manifest(r["state_dir"])
    if isinstance(m, dict) and m.get("settled") is False:
        m["settled"] = True
        write(os.path.join(r["state_dir"], "service", "prev", "manifest.json"), json.dumps(m), 0o600)
    return {"ok": True}


def op_apply(r):
    import shutil

    unit, upath, epath = r["unit"], r["unit_path"], r["env_path"]
    sdir = os.path.join(r["state_dir"], "service")
    new, prev = os.path.join(sdir, "new"), os.path.join(sdir, "prev")
    if r.get("port") and (r.get("restart") or r.get("start")):
        try:
            check_listener(r["port"], main_pid(unit))  # before anything changes: the engine could not bind
        except Foreign as e:
            return {"ok": False, "error": "port", "holder": e.holder}
    for d in (new, prev):
        os.makedirs(d, mode=0o700, exist_ok=True)
    if r.get("unit_text") is not None:
        staged = os.path.join(new, unit)
        write(staged, r["unit_text"], 0o644)
        if shutil.which("systemd-analyze"):
            rc, out, err = sh(["systemd-analyze", "verify", staged], timeout=120)
            # exit 0 on a setting it ignores ("Unknown key 'Bogus'", "Failed to parse nice priority"):
            # systemd would start the unit without it, so it is refused like an error
            ignored = [l for l in (err + out).splitlines() if l.startswith(staged + ":") and ", ignoring" in l]
            if rc != 0 or ignored:
                return {"ok": False, "error": "verify", "output": "\n".join(ignored) or (err + out).strip()[-3000:]}
    # Keep the files in place now, for a rollback (manifest says which existed).
    # Not when an install killed before its engine was seen healthy left them: prev/ holds what ran before it
    spath = r.get("secrets_path")
    manifest = prev_manifest(r["state_dir"]) if unsettled(r["state_dir"]) else None
    if manifest is None:
        manifest = {
            "unit_existed": os.path.exists(upath),
            "env_existed": os.path.exists(epath),
            "was_enabled": show(unit).get("UnitFileState") == "enabled",
            "time": time.time(),
            "settled": False,
        }
        if spath:
            manifest["secrets_existed"] = os.path.exists(spath)
        for src, name in ((upath, "unit"), (epath, "env"), (spath, "secrets")):
            dst = os.path.join(prev, name)
            if src and os.path.exists(src):
                shutil.copy2(src, dst)
            elif os.path.exists(dst):
                os.unlink(dst)
        write(os.path.join(prev, "manifest.json"), json.dumps(manifest), 0o600)
    if r.get("env_text") is not None:
        write(epath, r["env_text"], 0o600)
    elif os.path.exists(epath) and mode(epath) != 0o600:
        os.chmod(epath, 0o600)
    if r.get("secrets_text") is not None:
        write(spath, r["secrets_text"], 0o600)
    elif spath and os.path.exists(spath) and mode(spath) != 0o600:
        os.chmod(spath, 0o600)
    if r.get("lab_module_text") is not None:
        write(r["lab_module"], r["lab_module_text"], 0o644)
    if r.get("unit_text") is not None:
        write(upath, r["unit_text"], 0o644)
        rc, out, err = sh(["systemctl", "daemon-reload"])
        if rc:
            return {"ok": False, "error": "daemon-reload", "output": err.strip()[-500:]}
    if r.get("secrets_remove") and os.path.exists(spath):
        os.unlink(spath)  # after the unit stopped naming it
    if r.get("enable"):
        rc, out, err = sh(["systemctl", "enable", unit])
        if rc:
            return {"ok": False, "error": "enable", "output": err.strip()[-500:]}
    warm = {}
    if r.get("cache"):  # the release's engine cache: made root-only, and what it holds before the start
        make_cache(r["cache"])
        warm["cache_before"] = cache_stat(r["cache"])
    if r.get("restart") or r.get("start"):
        sh(["systemctl", "reset-failed", unit])
        warm["stop_at"] = time.time()  # the old engine stops serving here (time to first good token from here)
        rc, out, err = sh(["systemctl", "restart" if r.get("restart") else "start", unit], timeout=600)
        if rc:
            return {"ok": False, "error": "restart", "output": err.strip()[-500:], "show": show(unit)}
    return {"ok": True, "show": show(unit), "manifest": manifest, **warm}


def op_rollback(r):
    unit, upath, epath = r["unit"], r["unit_path"], r["env_path"]
    prev = os.path.join(r["state_dir"], "service", "prev")
    try:
        with open(os.path.join(prev, "manifest.json")) as fh:
            m = json.load(fh)
    except (OSError, ValueError):
        return {"ok": False, "error": "no backup of the previous unit and env file"}
    done = []
    files = [("unit", upath, m["unit_existed"], 0o644), ("env", epath, m["env_existed"], 0o600)]
    if r.get("secrets_path") and "secrets_existed" in m:
        files.append(("secrets", r["secrets_path"], m["secrets_existed"], 0o600))
    for name, path, existed, perm in files:
        if existed:
            with open(os.path.join(prev, name), encoding="utf-8") as fh:
                write(path, fh.read(), perm)
            done.append("restored " + path)
        elif os.path.exists(path):
            os.unlink(path)
            done.append("removed " + path)
    if r.get("previous_release"):
        cur = r["current"]
        tmp = cur + ".k26ops-tmp"
        if os.path.lexists(tmp):
            os.unlink(tmp)
        os.symlink(r["previous_release"], tmp)
        os.replace(tmp, cur)
        done.append("current -> " + r["previous_release"])
    sh(["systemctl", "daemon-reload"])
    sh(["systemctl", "reset-failed", unit])
    if m["unit_existed"]:
        if not m.get("was_enabled"):
            sh(["systemctl", "disable", unit])
        rc, _, err = sh(["systemctl", "restart", unit], timeout=600)
        done.append("restarted" if rc == 0 else "restart failed: " + err.strip()[-200:])
    else:
        sh(["systemctl", "disable", "--now", unit])
        done.append("stopped (no previous unit)")
    return {"ok": True, "done": done, "show": show(unit), "had_unit": m["unit_existed"]}


def op_poll(r):
    unit, port, host = r["unit"], r["port"], r.get("host", "127.0.0.1")
    base = r.get("base") or {}
    end = time.monotonic() + r.get("window", 2.0)
    first = True
    while True:
        s = r["show"] if first and r.get("show") else show(unit)  # a converge's read just before gives the first
        if first and not base:
            base = run_id(s)
        first = False
        why = crashed(s, base)
        if why:
            return dict(crash_report(unit, base, why, r.get("journal_lines", 400)), state="crashed", base=base)
        try:
            code, _ = http(port, "/health", timeout=2.0, host=host, pid=s.get("MainPID") or 0)
            if code == 200:
                code2, body2 = http(
                    port,
                    "/health_generate",
                    timeout=r.get("generate_timeout", 30.0),
                    host=host,
                    pid=s.get("MainPID") or 0,
                )
                if code2 == 200:
                    check_listener(port, s.get("MainPID") or 0)  # still the engine's after the answers
                    return {
                        "state": "healthy",
                        "show": s,
                        "base": base,
                        "at": time.time(),
                        **({"cache": cache_stat(r["cache"])} if r.get("cache") else {}),
                    }
        except Foreign as e:
            return {"state": "foreign", "holder": e.holder, "show": s, "base": base}
        if time.monotonic() >= end:
            j = journal(unit, 30, base.get("InvocationID"))
            return {
                "state": "loading" if code in (0, 503) else "unhealthy",
                "health": code,
                "last_line": last_meaningful(j),
                "show": s,
                "base": base,
            }
        time.sleep(r.get("interval", 0.25))


def inflight_now(port, host):
    """(status, running, queued) from the engine's /metrics: sglang:num_running_reqs and
    sglang:num_queue_reqs summed over their samples (one per scheduler); None where not served."""
    code, text = http(port, "/metrics", timeout=5.0, host=host)
    if code != 200:
        return code, None, None
    got = {"sglang:num_running_reqs": None, "sglang:num_queue_reqs": None}
    for line in text.splitlines():
        name = line.split("{", 1)[0].split(" ", 1)[0]
        if name in got:
            try:
                got[name] = (got[name] or 0) + float(line.rsplit(" ", 1)[1])
            except (IndexError, ValueError):
                pass
    return code, got["sglang:num_running_reqs"], got["sglang:num_queue_reqs"]


def op_inflight(r):
    """Long-poll (r["window"] s) until the engine has no request running or queued; answers
    {"status", "running", "queued", "metrics": False where /metrics does not count them}."""
    end = time.monotonic() + r.get("window", 2.0)
    while True:
        code, running, queued = inflight_now(r["port"], r.get("host", "127.0.0.1"))
        if running is None:
            return {"status": code, "metrics": False, "running": None, "queued": None}
        n = int(running + (queued or 0))
        if n == 0 or time.monotonic() >= end:
            return {"status": code, "metrics": True, "running": int(running), "queued": int(queued or 0)}
        time.sleep(r.get("interval", 0.25))


def generate(r, name, sampling):
    body = {"text": r["prompt"], "sampling_params": dict(sampling, max_new_tokens=r["max_new_tokens"])}
    pid = main_pid(UNIT[0]) if UNIT and UNIT[0] else None  # read before the clock starts
    t0 = time.monotonic()
    code, text = http(
        r["port"], "/generate", body, timeout=r.get("timeout_s", 120.0), host=r.get("host", "127.0.0.1"), pid=pid
    )
    latency = time.monotonic() - t0
    try:
        data = json.loads(text)
    except ValueError:
        data = None
    return {
        "name": name,
        "sampling": sampling,
        "status": code,
        "latency_s": round(latency, 4),
        "body": data if isinstance(data, dict) else text[:300],
        "at": time.time(),
    }


def answered(res):
    body = res["body"]
    return (
        res["status"] == 200
        and isinstance(body, dict)
        and isinstance(body.get("text"), str)
        and bool(body["text"].strip())
    )


def op_smoke(r):
    """The smoke requests in order (default: one greedy); the first that fails
    ends it, and then: did the engine die of it (its journal), or is it alive?"""
    unit = r.get("unit")
    base = r.get("base")
    if not base:  # a converge or health poll just before gives it: no second systemctl show
        s0 = show(unit) if unit else {}
        base = run_id(s0)
    results = []
    for req in r.get("requests") or [{"name": "greedy", "sampling": {"temperature": 0}}]:
        try:
            res = generate(r, req["name"], req["sampling"])
        except Foreign as e:  # nothing was sent to it, the api key least of all
            return {"results": results, "failed": req["name"], "crash": None, "foreign": e.holder}
        if r.get("cache"):
            res["cache"] = cache_stat(r["cache"])
        results.append(res)
        if answered(res):
            continue
        out = {"results": results, "failed": req["name"], "crash": None}
        if unit:
            # an engine that answered (an HTTP error) rarely dies of it; no answer often means it is dying
            why, s = died(unit, base, r.get("crash_wait", 3.0) if res["status"] == 0 else 1.0)
            if why:
                out["crash"] = crash_report(unit, base, why, r.get("journal_lines", 400))
            else:
                out["alive"] = {"MainPID": s.get("MainPID"), "state": s.get("ActiveState")}
                out["journal"] = journal(unit, 40, base.get("InvocationID"))
        return out
    out = {"results": results, "failed": None, "crash": None}
    if r.get("startup"):  # this run's start-up, for its time to first good token
        out["startup"] = startup(unit, base, r["startup"], r)
    return out


def startup(unit, base, want, r):
    """The engine's start-up as it told it: the unit's start time, its log lines that
    mark a phase (`want["lines"]`: what they contain) and its start-up metrics."""
    s = show(unit) if unit else {}
    text = journal(unit, want.get("max_lines", 20000), base.get("InvocationID")) if unit else ""
    lines = [l for l in text.splitlines() if any(k in l for k in want["lines"])]
    code, metrics = http(r["port"], "/metrics", timeout=10.0, host=r.get("host", "127.0.0.1"))
    keep = (
        [l for l in metrics.splitlines() if not l.startswith("#") and any(k in l for k in want["metrics"])]
        if code == 200
        else []
    )
    return {
        "started_at": started_at(s),
        "log": "\n".join(lines[-400:]),
        "metrics": "\n".join(keep),
        "tz_offset": time.localtime().tm_gmtoff,
    }


def sha256(text):
    return hashlib.sha256(text.encode()).hexdigest() if text is not None else None


def op_converge(r):
    """`read`, and when the host already is as planned (the unit's and env
    file's texts hash as `want` says, env file 0600, lab module as wanted,
    unit enabled and active), `poll` and `smoke` too, with `r["poll"]` and
    `r["smoke"]` as their requests: a converged deploy's whole look at the
    engine is this one start of python3. (The control node asks for the
    poll and smoke only when the release did not change either.)"""
    out = op_read(r)
    want = r.get("want")
    s = out["show"]
    out["converged"] = bool(want) and (
        sha256(out["unit"]) == want.get("unit_sha")
        and sha256(out["env"]) == want.get("env_sha")
        and out["env_mode"] == 0o600
        and sha256(out["secrets"]) == want.get("secrets_sha")
        and out["secrets_mode"] in (None, 0o600)
        and out["lab_module_sha"] == want.get("lab_module_sha")
        and s.get("UnitFileState") == "enabled"
        and s.get("ActiveState") == "active"
    )
    if not out["converged"] or not r.get("poll"):
        return out
    t0 = time.monotonic()
    p = op_poll(dict(r["poll"], unit=r["unit"], show=s))
    out["poll"], out["poll_s"] = p, round(time.monotonic() - t0, 3)
    if p["state"] == "healthy" and r.get("smoke"):
        out["smoke"] = op_smoke(dict(r["smoke"], unit=r["unit"], base=p["base"]))
    return out


def op_tail(r):
    return {"journal": journal(r["unit"], r.get("lines", 400), r.get("invocation"))}


def engine_releases(pid, current):
    """The releases the engine process runs from. A real engine keeps its venv's
    compiled extensions (torch, sglang kernels) mapped, and /proc/PID/maps names
    them by their resolved path: <releases root>/<release id>/venv/... even when
    it was started through `current`. None: not running or not readable."""
    if not pid:
        return None
    root = os.path.realpath(os.path.dirname(current)) + "/"
    found = set()
    try:
        with open("/proc/%d/maps" % pid, encoding="utf-8", errors="replace") as fh:
            for line in fh:
                i = line.find(root)
                if i >= 0:
                    rid = line[i + len(root) :].split("/", 1)[0].strip()
                    if rid and rid not in ("current", ".current.tmp"):
                        found.add(rid)
    except OSError:
        return None
    return sorted(found)


def op_status(r):
    unit = r["unit"]
    s = show(unit)
    cur = None
    try:
        cur = os.readlink(r["current"])
    except OSError:
        pass
    out = {
        "show": s,
        "current": cur,
        "now_monotonic_us": int(time.monotonic() * 1e6),
        "now": time.time(),
        "engine_releases": engine_releases(s.get("MainPID"), r["current"]),
    }
    if r.get("kernel") and s.get("ActiveEnterTimestampMonotonic"):  # the kernel's Xid lines, and the GPUs' bus ids
        try:
            rc, o, e = sh(["sh", "-c", r["kernel"]], timeout=20)
            out["kernel"] = {"rc": rc, "stdout": o + e}
            if "NVRM" in o:
                rc, o, _ = sh(["nvidia-smi", "--query-gpu=index,pci.bus_id", "--format=csv,noheader"], timeout=20)
                out["bus_ids"] = o if rc == 0 else ""
        except (OSError, subprocess.SubprocessError) as exc:
            out["kernel"] = {"rc": 127, "stdout": str(exc)}
    if r.get("weights_record"):  # the model manifest the release was built for, the host's last full verify
        out["weights"] = weights_status(r["weights_record"], cur and os.path.join(os.path.dirname(r["current"]), cur))
    if r.get("rehearsal_record"):  # a killed rehearsal's handle (agents/rehearse.py op_leftovers removes it)
        try:
            with open(r["rehearsal_record"]) as fh:
                h = json.load(fh)
            out["rehearsal_left"] = (
                [h["unit"]]
                if h.get("unit") and show(h["unit"]).get("ActiveState") not in ("inactive", "failed", "", None)
                else []
            ) + ([h["tmp"]] if os.path.isdir(h.get("tmp") or "") else [])
        except (OSError, ValueError, TypeError, AttributeError):
            pass
    if s.get("ActiveState") == "active":
        try:
            out["health"] = http(
                r["port"], "/health", timeout=2.0, host=r.get("host", "127.0.0.1"), pid=s.get("MainPID") or 0
            )[0]
            code, body = http(
                r["port"], "/v1/models", timeout=2.0, host=r.get("host", "127.0.0.1"), pid=s.get("MainPID") or 0
            )
        except Foreign as e:
            out["health"], out["foreign"], code, body = None, e.holder, 0, ""
        try:
            out["model"] = json.loads(body)["data"][0]["id"] if code == 200 else None
        except Exception:
            out["model"] = None
    return out


def weights_status(record_path, release):
    """{"release_manifest": the release's model manifest sha256, "last_full": {"at", "manifest"}}."""
    out = {"release_manifest": None, "last_full": None}
    for path, key in (
        (release and os.path.join(release, "manifest.json"), "release_manifest"),
        (record_path, "last_full"),
    ):
        try:
            with open(path) as f:
                doc = json.load(f)
            out[key] = (
                (doc.get("model") or {}).get("manifest_sha256") if key == "release_manifest" else doc.get("last_full")
            )
        except (OSError, TypeError, ValueError, AttributeError):
            pass
    return out


def op_logs(r):
    argv = ["journalctl", "--no-pager", "-u", r["unit"], "-o", "short-iso", "--show-cursor"]
    if r.get("cursor"):
        argv += ["--after-cursor", r["cursor"]]
    else:
        argv += ["--since", r["since"]] if r.get("since") else ["-n", str(r["lines"])]
    rc, out, err = sh(argv)
    if rc != 0 and not out.strip():
        return {"error": "journalctl: " + (err.strip().splitlines() or ["exit %d" % rc])[-1]}
    cursor = r.get("cursor")
    lines = out.splitlines()
    if lines and lines[-1].startswith("-- cursor: "):
        cursor = lines.pop()[len("-- cursor: ") :]
    lines = [l for l in lines if l != "-- No entries --"]
    return {"lines": lines, "cursor": cursor, "env": read(r["env_path"]) if r.get("with_env") else None}


def handle(req):
    """One request (agents.run's, or agents/hub.py's): its api_key kept for http(), then its op."""
    API_KEY[:] = [req.pop("api_key", None)]
    UNIT[:] = [req.get("unit")]
    return globals()["op_" + req.pop("op")](req)


if __name__ == "__main__":
    res = handle(json.loads(sys.stdin.read()))
    sys.stdout.write("\n" + json.dumps(res) + "\n")
