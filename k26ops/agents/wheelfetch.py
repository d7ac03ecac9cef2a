"""Host agent of the wheel relay (k26ops/release/wheelsource.py).

op "fetch" {"base": relay URL, "dest": wheelhouse dir, "wheels": [[name, sha256], ...],
            "read_timeout": s, "min_bytes": n}:
  fetch each wheel from the relay, hash it while it streams to a temp file,
  keep it only if its sha256 is the expected one. A stalled relay fails fast:
  no byte within `read_timeout` seconds (connect, headers or any read), or
  fewer than `min_bytes` in any `read_timeout` window (a relay that trickles),
  is "unreachable". Answers {"ok": true}, or
  {"ok": false, "unreachable": why} (the relay could not be read: fall back
  to the push), or {"ok": false, "refused": [name, got, expected]} (the relay's
  bytes are not the release's: the host fails). Stops at the first problem.
op "connect" {"address", "port", "wait"}: does a TCP connection to the
  relay's server open from this host? {"ok": bool, "error": why}.
"""

import hashlib
import json
import os
import socket
import sys
import time
import urllib.parse
import urllib.request


def fetch_one(base, dest, name, read_timeout=15.0, min_bytes=256 << 10):
    """Stream `base/name` into a temp file in `dest`: (temp path, sha256 hex)."""
    tmp = os.path.join(dest, ".k26ops-fetch-" + name)
    h = hashlib.sha256()
    try:
        with (
            urllib.request.urlopen(base + "/" + urllib.parse.quote(name), timeout=read_timeout) as r,
            open(tmp, "wb") as f,
        ):
            window, got = time.monotonic(), 0
            for chunk in iter(lambda: r.read1(1 << 20), b""):
                h.update(chunk)
                f.write(chunk)
                got += len(chunk)
                if time.monotonic() - window > read_timeout:
                    if got < min_bytes:
                        raise TimeoutError(f"the relay sent {got} bytes in {read_timeout:.0f}s: stalled")
                    window, got = time.monotonic(), 0
    except OSError:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise
    return tmp, h.hexdigest()


def op_fetch(r):
    base, dest = r["base"], r["dest"]
    os.makedirs(dest, exist_ok=True)
    for name, sha in r["wheels"]:
        try:
            tmp, got = fetch_one(base, dest, name, r.get("read_timeout") or 15.0, r.get("min_bytes") or 256 << 10)
        except OSError as exc:
            why = str(exc)
            if why in ("timed out", "<urlopen error timed out>"):
                why = "no data from the relay within %ss (%s)" % (r.get("read_timeout") or 15.0, why)
            return {"ok": False, "unreachable": why.replace("\n", " ")[:200]}
        if got != sha:
            os.unlink(tmp)
            return {"ok": False, "refused": [name, got, sha]}
        os.replace(tmp, os.path.join(dest, name))
    return {"ok": True}


def op_connect(r):
    try:
        socket.create_connection((r["address"], int(r["port"])), r.get("wait") or 2).close()
        return {"ok": True, "error": ""}
    except OSError as exc:
        return {"ok": False, "error": str(exc)[:200]}


if __name__ == "__main__":
    req = json.loads(sys.stdin.read())
    res = globals()["op_" + req.pop("op")](req)
    sys.stdout.write("\n" + json.dumps(res) + "\n")
