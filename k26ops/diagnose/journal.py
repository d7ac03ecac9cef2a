"""`k26ops diagnose service`: the engine's last crash on each host, named.

On the host one stdlib-only agent reads the unit's journal (JSON, bounded),
groups the engine's output by invocation and finds the newest invocation that
ended in a failure (systemd's "Main process exited, code=..., status=..." /
"Failed with result" for that invocation, not a clean stop); only that
invocation's text comes back. The control node classifies it (secrets
redacted first).
"""

from __future__ import annotations

import json

from k26ops.ssh import q

AGENT = r'''
import json, re, subprocess, sys
r = json.loads(sys.stdin.read())
unit = r["unit"]
p = subprocess.run(["journalctl", "--no-pager", "-u", unit, "-o", "json", "-n", str(r["lines"]),
                    "--output-fields=MESSAGE,_SYSTEMD_INVOCATION_ID,INVOCATION_ID,_PID,__REALTIME_TIMESTAMP"],
                   capture_output=True, text=True)
order, text, fail, first_ts, last_ts = [], {}, {}, {}, {}
EXITED = re.compile(r"Main process exited, code=(\w+), status=(\S+)")
RESULT = re.compile(r"Failed with result '([^']+)'")
for line in p.stdout.splitlines():
    try: e = json.loads(line)
    except ValueError: continue
    msg = e.get("MESSAGE")
    if isinstance(msg, list):
        msg = bytes(x for x in msg if isinstance(x, int)).decode("utf-8", "replace")
    msg = msg or ""
    own = e.get("_SYSTEMD_INVOCATION_ID")
    inv = own or e.get("INVOCATION_ID")
    if not inv: continue
    if inv not in text:
        order.append(inv); text[inv] = []; first_ts[inv] = e.get("__REALTIME_TIMESTAMP")
    last_ts[inv] = e.get("__REALTIME_TIMESTAMP")
    if own:
        text[inv].append(msg)
        continue
    m = EXITED.search(msg)
    if m and not (m.group(1) == "exited" and m.group(2) in ("0", "0/SUCCESS")) and not (
            m.group(1) == "killed" and m.group(2) in ("TERM", "15/TERM", "INT", "KILL")):
        fail[inv] = "code=%s, status=%s" % (m.group(1), m.group(2))
    m = RESULT.search(msg)
    if m and inv not in fail and m.group(1) not in ("success",):
        fail[inv] = "result %s" % m.group(1)
s = subprocess.run(["systemctl", "show", unit, "-p", "ActiveState,SubState,InvocationID,NRestarts,LoadState"],
                   capture_output=True, text=True).stdout
show = dict(l.split("=", 1) for l in s.splitlines() if "=" in l)
crashed = [i for i in order if i in fail]
pick = crashed[-1] if crashed else None
out = {"show": show, "invocations": len(order), "crashes": len(crashed)}
if pick:
    lines = text[pick][-r["keep"]:]
    out.update(invocation=pick, why=fail[pick], text="\n".join(lines), started_us=first_ts.get(pick),
               ended_us=last_ts.get(pick), current=pick == show.get("InvocationID"))
sys.stdout.write("\n" + json.dumps(out) + "\n")
'''


def last_crash(session, unit: str, lines: int = 20000, keep: int = 5000) -> dict:
    res = session.run(f"python3 -c {q(AGENT)}", stdin=json.dumps({"unit": unit, "lines": lines, "keep": keep}),
                      timeout=180)
    out = res.stdout.strip().splitlines()
    if res.exited != 0 or not out:
        err = (res.stderr.strip().splitlines() or ["no output"])[-1]
        raise RuntimeError(f"reading the journal of {unit} failed: {err[:300]}")
    return json.loads(out[-1])
