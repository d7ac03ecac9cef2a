"""Host agent of the managed gateway's steps (k26ops/steps/gateway.py): wait for the
router's /health with its unit watched, and read its state for `k26ops gateway status`.
The unit's files are installed and rolled back by the engine agent's `apply` and
`rollback` (the same code, the gateway's own paths and state dir).
"""

import json
import subprocess
import sys
import time

PROPS = "ActiveState,SubState,MainPID,NRestarts,UnitFileState,LoadState,InvocationID,Result,ExecMainStartTimestamp"


def show(unit):
    p = subprocess.run(["systemctl", "show", unit, "-p", PROPS], capture_output=True, text=True, timeout=60)
    d = dict(l.split("=", 1) for l in p.stdout.splitlines() if "=" in l)
    for k in ("MainPID", "NRestarts"):
        try:
            d[k] = int(d.get(k) or 0)
        except ValueError:
            d[k] = 0
    return d


def http(host, port, path, timeout=3.0):
    """(status, body text up to 2000 chars); (0, why) when nothing answers."""
    from http.client import HTTPConnection

    conn = HTTPConnection(host, port, timeout=timeout)
    try:
        conn.request("GET", path)
        r = conn.getresponse()
        return r.status, r.read().decode(errors="replace")[:2000]
    except Exception as e:
        return 0, "%s: %s" % (e.__class__.__name__, e)
    finally:
        conn.close()


def journal(unit, lines, invocation=None):
    argv = ["journalctl", "--no-pager", "-o", "cat", "-n", str(lines)]
    argv += ["_SYSTEMD_INVOCATION_ID=" + invocation] if invocation else ["-u", unit]
    return subprocess.run(argv, capture_output=True, text=True, timeout=60).stdout


def crashed(s, base):
    if s.get("ActiveState") in ("failed", "inactive", "deactivating"):
        return "unit is %s (%s)" % (s.get("ActiveState"), s.get("Result"))
    if s.get("SubState") in ("auto-restart", "failed", "dead"):
        return "unit is %s/%s" % (s.get("ActiveState"), s.get("SubState"))
    if base.get("MainPID") and s.get("MainPID") != base["MainPID"]:
        return "router process %s exited" % base["MainPID"]
    if s.get("NRestarts", 0) > base.get("NRestarts", 0):
        return "systemd restarted the router"
    return None


def op_poll(r):
    """/health until 200, at most `timeout` s; a dead or restarted unit ends the wait at once."""
    unit, host, port = r["unit"], r["host"], r["port"]
    end = time.monotonic() + r.get("wait", 60.0)
    s = show(unit)
    base = {k: s.get(k) for k in ("MainPID", "NRestarts", "InvocationID")}
    t0 = time.monotonic()
    while True:
        s = show(unit)
        why = crashed(s, base)
        if why:
            time.sleep(0.3)  # its last words reach the journal
            return {"state": "crashed", "why": why, "show": s, "journal": journal(unit, 40, base.get("InvocationID"))}
        code, _ = http(host, port, "/health", timeout=2.0)
        if code == 200:
            return {"state": "healthy", "show": s, "wait_s": round(time.monotonic() - t0, 2)}
        if time.monotonic() >= end:
            return {
                "state": "timeout",
                "health": code,
                "show": s,
                "journal": journal(unit, 40, base.get("InvocationID")),
            }
        time.sleep(r.get("interval", 0.2))


def op_status(r):
    import os

    s = show(r["unit"])
    try:
        cur = os.readlink(r["current"])
    except OSError:
        cur = None
    out = {"show": s, "current": cur, "health": None, "readiness": None}
    if s.get("ActiveState") == "active":
        out["health"] = http(r["host"], r["port"], "/health")[0]
        code, body = http(r["host"], r["port"], "/readiness")
        try:
            detail = json.loads(body)
        except ValueError:
            detail = None
        out["readiness"] = {"status": code, "detail": detail if isinstance(detail, dict) else None}
    return out


def handle(req):
    return globals()["op_" + req["op"]](req)


if __name__ == "__main__":
    print(json.dumps(handle(json.loads(sys.stdin.read()))))
