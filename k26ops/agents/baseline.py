"""Host agent of snapshot, rollback and drift (k26ops/baselines/).

op "snapshot" reads, in one round trip, everything a baseline records about a
host: the current release (manifest, shipped patches, patch state, package
versions from the venv's dist-info, the patched files' bytes), the unit and
env file, the running engine's command line, the facts' raw outputs, and the
engine's health. op "probe" is the cheap part (release, hashes of its patched
files, unit and env text) for rollback and drift.
"""

import base64
import glob
import hashlib
import json
import os
import subprocess
import sys
import urllib.error
import urllib.request


def rd(path):
    try:
        with open(path, "rb") as fh:
            return fh.read()
    except (OSError, IOError):
        return None


def txt(path):
    b = rd(path)
    return None if b is None else b.decode("utf-8", "replace")


def sha(b):
    return None if b is None else hashlib.sha256(b).hexdigest()


PROBE_DIRS = ("probe-state", "rehearse-probe-state")  # diagnose/probe.py's, rehearsal/run.py's PROBE_STATE

RECORD_SKIP = (
    ".dist-info/RECORD",
    ".dist-info/INSTALLER",
    ".dist-info/REQUESTED",
    ".dist-info/direct_url.json",
    ".dist-info/uv_cache.json",
)


def record_check(site, skip, since, full, limit=50):
    """A release's files against its wheels' RECORD (path, sha256, size), the files a patch
    changed (`skip`: the manifest's, checked against it) aside. Cheap (not `full`): each
    file is there, of its size, and not modified after `since` (the manifest's mtime: the
    build's last write); full: its sha256 too. [{path, why, ino}], at most `limit`; and the
    number of files checked."""
    import base64 as b64

    bad, n = [], 0
    for rec in sorted(glob.glob(os.path.join(site, "*.dist-info", "RECORD"))):
        for line in (txt(rec) or "").splitlines():
            parts = line.rsplit(",", 2)
            if len(parts) != 3 or not parts[1].startswith("sha256=") or parts[0].startswith(".."):
                continue
            path, h, size = parts[0].strip('"'), parts[1][7:], parts[2]
            if path in skip or path.endswith(RECORD_SKIP):
                continue
            n += 1
            full_path = os.path.join(site, path)
            try:
                st = os.lstat(full_path)
            except OSError:
                bad.append(
                    {"path": path, "why": "missing", "ino": None, "dist": os.path.basename(os.path.dirname(rec))}
                )
            else:
                why = None
                if size.isdigit() and st.st_size != int(size):
                    why = "size %d, RECORD %s" % (st.st_size, size)
                elif since and st.st_mtime > since + 1:
                    why = "modified after the release was built"
                elif full:
                    got = b64.urlsafe_b64encode(hashlib.sha256(rd(full_path) or b"").digest()).rstrip(b"=").decode()
                    if got != h:
                        why = "sha256 differs from RECORD"
                if why:
                    bad.append(
                        {"path": path, "why": why, "ino": st.st_ino, "dist": os.path.basename(os.path.dirname(rec))}
                    )
            if len(bad) >= limit:
                return bad, n
    return bad, n


def release(root, rid=None, content=False, verify=None):
    cur = None
    try:
        cur = os.readlink(os.path.join(root, "current"))
    except OSError:
        pass
    rid = rid or cur
    out = {"current": cur, "release": rid, "exists": False, "manifest": None, "hashes": {}}
    if not rid:
        return out
    d = os.path.join(root, rid)
    out["exists"] = os.path.isdir(d)
    try:
        m = json.loads(txt(os.path.join(d, "manifest.json")) or "null")
    except ValueError:
        m = None
    out["manifest"] = m
    if not isinstance(m, dict):
        return out
    site = m.get("site_packages") or ""
    # a probe left applied (diagnose cuda-graph's or rehearse --probe's state dir is in the
    # release): the files it patched differ from what the release shipped, even those the
    # manifest does not list; deploy and rollback revert it (PROBE_DIRS there)
    out["probe_files"], out["probe_dirs"] = [], []
    for sdir in PROBE_DIRS:
        try:
            pst = json.loads(txt(os.path.join(d, sdir, "state.json")) or "null")
        except ValueError:
            pst = None
        if isinstance(pst, dict):
            out["probe_dirs"].append(sdir)
        for p in (pst or {}).get("patches", []) if isinstance(pst, dict) else []:
            for rel, h in (p.get("files") or {}).items():
                if sha(rd(os.path.join(site, rel))) != h.get("before") and rel not in out["probe_files"]:
                    out["probe_files"].append(rel)
    if verify and site:  # a probe's files aside: they are the probe's (reverted, not rebuilt)
        try:
            since = os.stat(os.path.join(d, "manifest.json")).st_mtime
        except OSError:
            since = None
        out["record_bad"], out["record_files"] = record_check(
            site, set(m.get("patched_files") or {}) | set(out["probe_files"]), since, verify == "full"
        )
    files = {}
    for rel in sorted(m.get("patched_files") or {}):
        b = rd(os.path.join(site, rel))
        out["hashes"][rel] = sha(b)
        if content and b is not None:
            files[rel] = base64.b64encode(b).decode()
    if content:
        out["files"] = files
        pdir = os.path.join(d, "k26ops", "patches")
        out["patches"] = (
            {n: txt(os.path.join(pdir, n)) for n in sorted(os.listdir(pdir))} if os.path.isdir(pdir) else {}
        )
        out["patch_state"] = txt(os.path.join(d, "patch-state", "state.json"))
        pk = {}
        for meta in glob.glob(os.path.join(site, "*.dist-info", "METADATA")):
            name = ver = None
            for line in (txt(meta) or "").splitlines():
                if line.startswith("Name:") and name is None:
                    name = line[5:].strip()
                elif line.startswith("Version:") and ver is None:
                    ver = line[8:].strip()
                elif not line.strip():
                    break
            if name:
                pk[name] = ver
        out["packages"] = dict(sorted(pk.items(), key=lambda kv: kv[0].lower()))
    return out


def show(unit):
    p = subprocess.run(
        ["systemctl", "show", unit, "-p", "ActiveState,SubState,MainPID,UnitFileState"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        universal_newlines=True,
    )
    return dict(l.split("=", 1) for l in p.stdout.splitlines() if "=" in l)


def http(host, port, path, body=None, timeout=5.0):
    data = json.dumps(body).encode() if body is not None else None
    req = urllib.request.Request(
        "http://%s:%d%s" % (host, port, path), data=data, headers={"Content-Type": "application/json"} if data else {}
    )
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return r.status, r.read().decode("utf-8", "replace")
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode("utf-8", "replace")[:300]
    except Exception as e:
        return 0, "%s: %s" % (e.__class__.__name__, e)


def fact(item):
    try:
        p = subprocess.run(
            item["command"],
            shell=True,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            stdin=subprocess.DEVNULL,
            timeout=item.get("timeout") or 30,
            env=dict(os.environ, LC_ALL="C", LANG="C"),
        )
        return {
            "rc": p.returncode,
            "stdout": p.stdout.decode("utf-8", "replace"),
            "stderr": p.stderr.decode("utf-8", "replace"),
        }
    except subprocess.TimeoutExpired:
        return {"rc": 124, "stdout": "", "stderr": "k26ops: timed out"}


def op_snapshot(r):
    out = {"release": release(r["releases_root"], None, True), "unit": txt(r["unit_path"]), "env": txt(r["env_path"])}
    s = show(r["unit"])
    out["show"] = s
    pid = int(s.get("MainPID") or 0)
    raw = rd("/proc/%d/cmdline" % pid) if pid else None
    out["cmdline"] = [a.decode("utf-8", "replace") for a in raw.split(b"\0")[:-1]] if raw else None
    out["facts"] = {i["name"]: fact(i) for i in r["facts"]}
    h = {"state": "inactive", "health": None, "health_generate": None}
    if s.get("ActiveState") == "active":
        h["health"] = http(r["host"], r["port"], "/health", timeout=3.0)[0]
        if h["health"] == 200:
            h["health_generate"] = http(r["host"], r["port"], "/health_generate", timeout=30.0)[0]
        h["state"] = "healthy" if h["health"] == 200 and h["health_generate"] == 200 else "unhealthy"
    out["health"] = h  # the smoke requests follow as the service agent's own (one implementation)
    return out


def op_verify(r):
    """A just-built release's files against their wheels' RECORD (cheap: there, of their size)."""
    bad, n = record_check(r["site"], set(r.get("skip") or []), None, bool(r.get("full")))
    return {"bad": bad, "files": n}


def op_probe(r):
    out = {
        "release": release(r["releases_root"], r.get("release"), verify=r.get("verify")),
        "unit": txt(r["unit_path"]),
        "env": txt(r["env_path"]),
    }
    if r.get("tag_file"):  # the tag a rollback brought the host to (written by it, read by status)
        if r.get("record_tag") is not None:
            os.makedirs(os.path.dirname(r["tag_file"]), exist_ok=True)
            with open(r["tag_file"] + ".tmp", "w") as fh:
                fh.write(r["record_tag"] + "\n")
            os.replace(r["tag_file"] + ".tmp", r["tag_file"])
        out["recorded_tag"] = (txt(r["tag_file"]) or "").strip() or None
    if r.get("release") and out["release"]["current"] != r.get("release"):
        out["current"] = release(r["releases_root"])
    return out


if __name__ == "__main__":
    req = json.loads(sys.stdin.read())
    res = globals()["op_" + req.pop("op")](req)
    sys.stdout.write("\n" + json.dumps(res) + "\n")
