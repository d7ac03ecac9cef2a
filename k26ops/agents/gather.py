"""Host agent of the facts (k26ops/facts/): runs fact commands, answers their raw outputs.

Run through agents.run like every agent, so facts cost one round trip
whatever their number; parsing stays on the control node.

op "gather" {"commands": [{"name": str, "command": str, "timeout": float (optional),
                             "own": str (optional), "args": list (optional)}]}
answer: {name: {"rc": int, "stdout": str, "stderr": str}}
A command that outlives its timeout is killed with its process group and
reported with rc 124. Commands run in parallel (one thread each, at most
MAX_PARALLEL at once), with /bin/sh, LC_ALL=C and stdin closed (nothing can
wait for input). An item with "own" is answered from this interpreter (OWN[own](*args)),
byte for byte what its command prints, without starting it, or None: the command
runs (issue 31: each sh and its cat/ls/head/readlink was 2-7 ms of a host's CPU).
The control node marks items so only when this agent runs as `python3`, the
interpreter python_version's command names.
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


def ok(out):
    """A command's answer that printed `out` (bytes, decoded as run_one decodes) and exited 0."""
    return {"rc": 0, "stdout": out.decode("utf-8", "replace"), "stderr": ""}


def head(path, limit=1000000):
    """`head -c LIMIT PATH`'s bytes, or None (not a regular file, unreadable: run the command)."""
    if not os.path.isfile(path):
        return None
    try:
        with open(path, "rb") as f:
            return f.read(limit)
    except OSError:
        return None


def os_release():
    """`cat /etc/os-release 2>/dev/null || cat /usr/lib/os-release 2>&1` where the first reads."""
    data = head("/etc/os-release", -1)
    return None if data is None else ok(data)


PROBE_DIRS = ("probe-state", "rehearse-probe-state")  # steps/release.py's


def release_current(root, release):
    """`cd ROOT 2>/dev/null && { readlink current; echo ===; test -f RELEASE/manifest.json &&
    tail -c 1 RELEASE/manifest.json | grep -q '}' && echo complete; echo ===; for f in current/probe-state/state.json ...; do test -f "$f" &&
    echo "$f"; done; }; true` (facts: steps/release.py's current_fact)."""
    if not os.path.isdir(root):
        return None if os.path.lexists(root) else ok(b"")
    try:
        link = os.readlink(os.path.join(root, "current").encode()) + b"\n"
    except OSError:  # readlink prints nothing on any error (no -v)
        link = b""
    done = False
    try:  # `tail -c 1 | grep -q }`: a whole JSON object (a truncated manifest is not complete)
        with open(os.path.join(root, release, "manifest.json"), "rb") as fh:
            fh.seek(0, 2)
            if fh.tell():
                fh.seek(-1, 2)
                done = fh.read(1) == b"}"
    except OSError:
        pass
    probes = b"".join(
        b"current/%s/state.json\n" % d.encode()
        for d in PROBE_DIRS
        if os.path.isfile(os.path.join(root, "current", d, "state.json"))
    )
    return ok(link + b"===\n" + (b"complete\n" if done else b"") + b"===\n" + probes)


def toolchains_verified(tc, marker):
    """`for f in TC/*/MARKER; do [ -f "$f" ] && printf '%s\\t%s\\n' "${f%/*}" "$(tr '\\n' ' ' < "$f")";
    done; true` (steps/toolchain.py's verified_fact): the glob's names in byte order, dot names left out."""
    base = tc.encode()
    try:
        names = sorted(n for n in os.listdir(base) if not n.startswith(b"."))
    except (FileNotFoundError, NotADirectoryError):
        return ok(b"")
    except OSError:
        return None
    out = b""
    for n in names:
        f = os.path.join(base, n, marker.encode())
        if not os.path.isfile(f):
            continue
        data = head(f, -1)
        if data is None or b"\0" in data:
            return None  # tr's error, or NULs the shell drops: as the command says it
        out += os.path.join(base, n) + b"\t" + data.replace(b"\n", b" ") + b"\n"
    return ok(out)


def drafter(path, mark):
    """facts/drafter.py's drafter_command where its config reads or it is not there."""
    cfg = os.path.join(path, "config.json")
    if os.access(cfg, os.R_OK):
        data = head(cfg)
        return None if data is None else ok(mark.encode() + b"config\n" + data)
    if os.path.isdir(path):
        return None  # the listing of a drafter dir without config.json: the command's
    return ok(mark.encode() + (b"notdir\n" if os.path.exists(path) else b"missing\n"))


def model(path, mark, max_files):
    """facts/model.py's model_command: `ls -1 | grep -E '\\.safetensors(\\.index\\.json)?$' | head`
    is the dir's names in byte order (LC_ALL=C), dot names left out."""
    m = mark.encode()
    if not os.path.isdir(path):
        return ok(m + (b"notdir\n" if os.path.exists(path) else b"missing\n"))
    out = m + b"dir\n"
    cfg = os.path.join(path, "config.json")
    if os.access(cfg, os.R_OK):
        data = head(cfg)
        if data is None:
            return None
        out += m + b"config\n" + data + b"\n"
    try:
        names = sorted(os.listdir(path.encode()))
    except OSError:
        return None
    if any(b"\n" in n for n in names):
        return None
    files = [n for n in names if not n.startswith(b".") and n.endswith((b".safetensors", b".safetensors.index.json"))]
    return ok(out + m + b"files\n" + b"".join(n + b"\n" for n in files[:max_files]))


# Answers given here, byte for byte the command's, without starting it (OWN[name](*args));
# None: the command runs after all (its rarer branches and error texts stay the command's own).
# `python3 --version` prints "Python " and sys.version's first word (3.12.3, 3.13.0rc1, 3.12.0+)
OWN = {
    "python_version": lambda: {"rc": 0, "stdout": "Python %s\n" % sys.version.split()[0], "stderr": ""},
    "os_release": os_release,
    "release_current": release_current,
    "toolchains_verified": toolchains_verified,
    "drafter": drafter,
    "model": model,
}


def run_one(item):
    timeout = float(item.get("timeout") or DEFAULT_TIMEOUT)
    env = dict(os.environ, LC_ALL="C", LANG="C")
    try:
        p = subprocess.Popen(
            item["command"],
            shell=True,
            executable="/bin/sh",
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            start_new_session=True,
        )
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
    results = [OWN[it["own"]](*it.get("args", ())) if it.get("own") in OWN else None for it in items]
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
