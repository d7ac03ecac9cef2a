"""Host agent of the facts (k26ops/facts/): runs fact commands, answers their raw outputs.

Run through agents.run like every agent, so facts cost one round trip
whatever their number; parsing stays on the control node.

op "gather" {"commands": [{"name": str, "command": str, "timeout": float (optional)}]}
answer: {name: {"rc": int, "stdout": str, "stderr": str}}
A command that outlives its timeout is killed with its process group and
reported with rc 124. Commands run in parallel, with /bin/sh, LC_ALL=C and
stdin closed (nothing can wait for input).
"""
import json
import os
import signal
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor

DEFAULT_TIMEOUT = 30.0


def run_one(item):
    timeout = float(item.get("timeout") or DEFAULT_TIMEOUT)
    env = dict(os.environ, LC_ALL="C", LANG="C")
    try:
        p = subprocess.Popen(item["command"], shell=True, executable="/bin/sh", env=env,
                             stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, start_new_session=True)
    except OSError as e:
        return {"rc": 127, "stdout": "", "stderr": str(e)}
    try:
        out, err = p.communicate(timeout=timeout)
        rc = p.returncode
    except subprocess.TimeoutExpired:
        try:
            os.killpg(p.pid, signal.SIGKILL)
        except OSError:
            pass
        out, err = p.communicate()
        rc = 124
        err = err + ("\nk26ops: timed out after %g s" % timeout).encode()
    return {"rc": rc, "stdout": out.decode("utf-8", "replace"), "stderr": err.decode("utf-8", "replace")}


def op_gather(r):
    items = r["commands"]
    with ThreadPoolExecutor(max_workers=min(8, max(1, len(items)))) as pool:
        results = list(pool.map(run_one, items))
    return {it["name"]: res for it, res in zip(items, results)}


if __name__ == "__main__":
    req = json.loads(sys.stdin.read())
    res = globals()["op_" + req.pop("op")](req)
    sys.stdout.write("\n" + json.dumps(res) + "\n")
