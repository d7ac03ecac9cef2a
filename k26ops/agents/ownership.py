"""Host agent for k26ops/host/ownership.py: is a directory k26ops's own, which
releases are in it, delete some of them (checked again here, on the host).

Request: {"op": "state" | "releases" | "delete", "dir": path, "kind": "root" |
"releases", "marker": ".k26ops-owned", "release_marker": ".k26ops-release",
"root_entries": [names k26ops makes under k26ops_root], "names": [to delete]}.
The markers come with the request so that ownership.py stays their one source.
"""

import json
import os
import sys  # shutil in op_delete: the hub's reads skip its import


def is_release(d, name, release_marker):
    """`d/name` is a k26ops release: it carries the marker or a manifest naming it."""
    p = os.path.join(d, name)
    if os.path.islink(p) or not os.path.isdir(p):
        return False
    if os.path.exists(os.path.join(p, release_marker)):
        return True
    try:
        with open(os.path.join(p, "manifest.json")) as fh:
            return json.load(fh).get("release_id") == name
    except (OSError, ValueError, AttributeError):
        return False


def op_state(r):
    d = r["dir"]
    if not os.path.exists(d):
        return {"state": "absent"}
    if not os.path.isdir(d):
        return {"state": "notdir"}
    names = sorted(os.listdir(d))
    if r["marker"] in names:
        return {"state": "owned"}
    if r["kind"] == "root":
        foreign = [n for n in names if n not in set(r["root_entries"])]
    else:
        foreign = [
            n for n in names if n not in ("current", ".current.tmp") and not is_release(d, n, r["release_marker"])
        ]
    return {
        "state": "foreign" if foreign else ("empty" if not names else "ours"),
        "foreign": foreign[:5],
        "count": len(foreign),
    }


def op_states(r):
    """`state` of several directories (each [dir, kind]) in one call."""
    return [op_state(dict(r, dir=d, kind=kind)) for d, kind in r["dirs"]]


def op_releases(r):
    d = r["dir"]
    if not os.path.isdir(d):
        return []
    rels = [n for n in os.listdir(d) if not n.startswith(".") and is_release(d, n, r["release_marker"])]
    rels.sort(key=lambda n: os.stat(os.path.join(d, n)).st_mtime, reverse=True)
    return rels


def op_delete(r):
    import shutil

    d, gone = r["dir"], []
    for name in r["names"]:
        if "/" not in name and not name.startswith(".") and is_release(d, name, r["release_marker"]):
            shutil.rmtree(os.path.join(d, name), ignore_errors=True)
            gone.append(name)
    return gone


if __name__ == "__main__":
    req = json.loads(sys.stdin.read())
    res = globals()["op_" + req.pop("op")](req)
    sys.stdout.write("\n" + json.dumps(res) + "\n")
