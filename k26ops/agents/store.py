"""Host agent of the release store (k26ops/release/installer.py).

op "uv" {"wheel": path, "sha256": hex, "dest": path of the binary}: the uv
  binary from uv's wheel (pushed with the release's wheels), kept only if the
  wheel's sha256 is the pinned one; written to a temp name and renamed, so a
  half-written binary never runs. {"ok": true} or {"ok": false, "error": why}.
op "gc" {"store": uv cache dir}: drop the store's unpacked wheels that no
  release links any more (every file has one link: only the store holds it).
  The index entries naming such a wheel go first, then its files, so an
  interrupted gc never leaves the index pointing at nothing.
  {"removed": n, "freed": bytes}.
op "alone" {"dirs": [...]}: per dir, the bytes deleting it alone frees (its
  directories, and its files nothing else links). {"bytes": {dir: n}}.
"""
import hashlib, json, os, shutil, sys, zipfile


def op_uv(r):
    h = hashlib.sha256()
    try:
        with open(r["wheel"], "rb") as fh:
            for chunk in iter(lambda: fh.read(1 << 20), b""):
                h.update(chunk)
    except OSError as exc:
        return {"ok": False, "error": "cannot read %s: %s" % (r["wheel"], exc.strerror)}
    if h.hexdigest() != r["sha256"]:
        return {"ok": False, "error": "%s: sha256 %s, want %s" % (r["wheel"], h.hexdigest(), r["sha256"])}
    dest = r["dest"]
    os.makedirs(os.path.dirname(dest), exist_ok=True)
    tmp = dest + ".tmp"
    with zipfile.ZipFile(r["wheel"]) as z:
        names = [n for n in z.namelist() if n.endswith(".data/scripts/uv")]
        if len(names) != 1:
            return {"ok": False, "error": "%s holds no uv binary" % r["wheel"]}
        with z.open(names[0]) as src, open(tmp, "wb") as out:
            shutil.copyfileobj(src, out, 1 << 20)
    os.chmod(tmp, 0o755)
    os.replace(tmp, dest)
    return {"ok": True}


def alone(d):
    """Bytes that deleting `d` frees: its directories and its files with one link."""
    total = 0
    for base, _, files in os.walk(d):
        total += os.lstat(base).st_blocks * 512
        for f in files:
            st = os.lstat(os.path.join(base, f))
            if st.st_nlink == 1 and not os.path.islink(os.path.join(base, f)):
                total += st.st_blocks * 512
    return total


def unlinked(d):
    """Every regular file under `d` has one link (nothing outside the store holds it)."""
    for base, _, files in os.walk(d):
        for f in files:
            st = os.lstat(os.path.join(base, f))
            if st.st_nlink > 1:
                return False
    return True


def op_gc(r):
    store = r["store"]
    archives = [d for d in (os.path.join(store, x) for x in _ls(store)) if os.path.basename(d).startswith("archive-v")]
    dead = {}
    for a in archives:
        for name in _ls(a):
            p = os.path.join(a, name)
            if os.path.isdir(p) and not os.path.islink(p) and unlinked(p):
                dead[name.encode()] = p
    if not dead:
        return {"removed": 0, "freed": 0}
    for base, _, files in os.walk(store):  # the index first: its pointers name an archive id
        if os.path.basename(base).startswith("archive-v") or "/archive-v" in base:
            continue
        for f in files:
            p = os.path.join(base, f)
            try:
                with open(p, "rb") as fh:
                    data = fh.read(1 << 16)
            except OSError:
                continue
            if any(k in data for k in dead):
                os.unlink(p)
    freed = 0
    for p in dead.values():
        freed += alone(p)
        shutil.rmtree(p, ignore_errors=True)
    return {"removed": len(dead), "freed": freed}


def op_alone(r):
    return {"bytes": {d: alone(d) if os.path.isdir(d) else 0 for d in r["dirs"]}}


def _ls(d):
    try:
        return sorted(os.listdir(d))
    except OSError:
        return []


if __name__ == "__main__":
    req = json.loads(sys.stdin.read())
    res = globals()["op_" + req.pop("op")](req)
    sys.stdout.write("\n" + json.dumps(res) + "\n")
