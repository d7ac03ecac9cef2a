"""k26ops remote fact gatherer: runs fact commands on a host, prints raw outputs.

Shipped to the host over SSH on each gather (`python3 -c <this source>`,
the command list on stdin), so facts cost one round trip whatever their
number. Stdlib only, python 3.6+; parsing stays on the control node.

stdin:  JSON list of {"name": str, "command": str, "timeout": float (optional)}
stdout: JSON object {name: {"rc": int, "stdout": str, "stderr": str}}
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


def main():
    items = json.loads(sys.stdin.read())
    with ThreadPoolExecutor(max_workers=min(8, max(1, len(items)))) as pool:
        results = list(pool.map(run_one, items))
    json.dump({it["name"]: res for it, res in zip(items, results)}, sys.stdout)
    sys.stdout.write("\n")


if __name__ == "__main__":
    main()
