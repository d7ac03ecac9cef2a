"""Host agent of `k26ops diagnose service` (k26ops/diagnose/journal.py): the
newest invocation of the unit that ended in a failure, read from its journal.

op "last_crash" {"unit", "lines", "keep"}: reads the unit's journal (JSON, the
last `lines` entries), groups the engine's output by invocation and picks the
newest invocation that ended in a failure (systemd's "Main process exited,
code=..., status=..." / "Failed with result" for that invocation, not a clean
stop); only that invocation's last `keep` lines come back. A requested stop
(systemd's "Stopping ..." for the invocation) that ends by signal is no crash:
the real engine drains on SIGTERM, then SIGKILLs its own process tree, itself
included (tests/data/drain: systemd says status=9/KILL, result 'signal').
"""

import json
import re
import subprocess
import sys

EXITED = re.compile(r"Main process exited, code=(\w+), status=(\S+)")
RESULT = re.compile(r"Failed with result '([^']+)'")
STOPPING = re.compile(r"^Stopping\b")
KILLED_BY_SIGNAL = re.compile(r"code=(?:killed|dumped), status=|result signal")
FIELDS = "MESSAGE,_SYSTEMD_INVOCATION_ID,INVOCATION_ID,_PID,__REALTIME_TIMESTAMP"


def exit_failure(msg):
    """ "Main process exited" with a failing code/status, or None (a clean stop is none)."""
    m = EXITED.search(msg)
    if (
        m
        and not (m.group(1) == "exited" and m.group(2) in ("0", "0/SUCCESS"))
        and not (m.group(1) == "killed" and m.group(2) in ("TERM", "15/TERM", "INT", "KILL"))
    ):
        return "code=%s, status=%s" % (m.group(1), m.group(2))
    return None


def result_failure(msg):
    """ "Failed with result '...'" other than success, or None."""
    m = RESULT.search(msg)
    return "result %s" % m.group(1) if m and m.group(1) not in ("success",) else None


def invocations(journal_json):
    """journalctl -o json lines -> (order, text, fail, first_ts, last_ts) per invocation."""
    order, text, fail, first_ts, last_ts, stopping = [], {}, {}, {}, {}, set()
    for line in journal_json.splitlines():
        try:
            e = json.loads(line)
        except ValueError:
            continue
        msg = e.get("MESSAGE")
        if isinstance(msg, list):
            msg = bytes(x for x in msg if isinstance(x, int)).decode("utf-8", "replace")
        msg = msg or ""
        own = e.get("_SYSTEMD_INVOCATION_ID")
        inv = own or e.get("INVOCATION_ID")
        if not inv:
            continue
        if inv not in text:
            order.append(inv)
            text[inv] = []
            first_ts[inv] = e.get("__REALTIME_TIMESTAMP")
        last_ts[inv] = e.get("__REALTIME_TIMESTAMP")
        if own:
            text[inv].append(msg)
            continue
        if STOPPING.search(msg):
            stopping.add(inv)
        why = exit_failure(msg)
        if why and not (inv in stopping and KILLED_BY_SIGNAL.search(why)):
            fail[inv] = why
        why = result_failure(msg)
        if why and inv not in fail and not (inv in stopping and KILLED_BY_SIGNAL.search(why)):
            fail[inv] = why  # the exit status says more than the result
    return order, text, fail, first_ts, last_ts


def last_crash(journal_json, show, keep):
    order, text, fail, first_ts, last_ts = invocations(journal_json)
    crashed = [i for i in order if i in fail]
    pick = crashed[-1] if crashed else None
    out = {"show": show, "invocations": len(order), "crashes": len(crashed)}
    if pick:
        lines = text[pick][-keep:]
        out.update(
            invocation=pick,
            why=fail[pick],
            text="\n".join(lines),
            started_us=first_ts.get(pick),
            ended_us=last_ts.get(pick),
            current=pick == show.get("InvocationID"),
        )
    return out


def op_last_crash(r):
    unit = r["unit"]
    p = subprocess.run(
        ["journalctl", "--no-pager", "-u", unit, "-o", "json", "-n", str(r["lines"]), "--output-fields=" + FIELDS],
        capture_output=True,
        text=True,
    )
    s = subprocess.run(
        ["systemctl", "show", unit, "-p", "ActiveState,SubState,InvocationID,NRestarts,LoadState,Result"],
        capture_output=True,
        text=True,
    ).stdout
    show = dict(l.split("=", 1) for l in s.splitlines() if "=" in l)
    if show.get("ActiveState") == "failed":  # as agents/engine.py's show(): systemd's own last lines
        tail = subprocess.run(
            ["journalctl", "-u", unit, "-n", "8", "-o", "cat", "--no-pager"], capture_output=True, text=True
        ).stdout
        show["StartLimitHit"] = "Start request repeated too quickly" in tail
    return last_crash(p.stdout, show, r["keep"])


if __name__ == "__main__":
    req = json.loads(sys.stdin.read())
    res = globals()["op_" + req.pop("op")](req)
    sys.stdout.write("\n" + json.dumps(res) + "\n")
