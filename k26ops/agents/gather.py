"""Host agent of the facts (k26ops/facts/): runs fact commands, answers their raw outputs.

Run through agents.run like every agent, so facts cost one round trip
whatever their number; parsing stays on the control node.

op "gather" {"commands": [{"name": str, "command": str, "timeout": float (optional),
                             "own": str (optional)}]}
answer: {name: {"rc": int, "stdout": str, "stderr": str}}
A command that outlives its timeout is killed with its process group and
reported with rc 124. Commands run in parallel (one thread each, at most
MAX_PARALLEL at once), with /bin/sh, LC_ALL=C and stdin closed (nothing can
wait for input). An item with "own" is answered from this interpreter (OWN),
byte for byte what its command prints, without starting it (or None: the command
runs): the control node marks python_version so only when this agent runs as the
interpreter the command names.
Threads, not concurrent.futures: its import (logging, ...) is a few ms of host CPU per run.
"""
import json
import os
import signal
import subprocess
import sys
import threading

DEFAULT_TIMEOUT = 30.0
MAX_PARALLEL = 8


def os_release():
    """`cat /etc/os-release ...`'s answer when that file reads (the usual case); None (run the
    command: its fallback and its error text) when it does not."""
    try:
        with open("/etc/os-release", "rb") as f:
            return {"rc": 0, "stdout": f.read().decode("utf-8", "replace"), "stderr": ""}
    except OSError:
        return None


# An answer of None: the command runs after all.
# `python3 --version` prints "Python " and sys.version's first word (3.12.3, 3.13.0rc1, 3.12.0+)
OWN = {"python_version": lambda: {"rc": 0, "stdout": "Python %s\n" % sys.version.split()[0], "stderr": ""},
       "os_release": os_release}


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
    results = [OWN[it["own"]]() if it.get("own") in OWN else None for it in items]
    slots = threading.BoundedSemaphore(MAX_PARALLEL)
    errors = []

    def work(i):
        with slots:
            try:
                results[i] = run_one(items[i])
            except Exception as exc:  # raised in the caller, as a pool would: the request was bad
                errors.append(exc)

    threads = [threading.Thread(target=work, args=(i,)) for i, res in enumerate(results) if res is None]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        raise errors[0]
    return {it["name"]: res for it, res in zip(items, results)}


if __name__ == "__main__":
    req = json.loads(sys.stdin.read())
    res = globals()["op_" + req.pop("op")](req)
    sys.stdout.write("\n" + json.dumps(res) + "\n")
