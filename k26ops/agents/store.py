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
op "evict" {"store": dir, "inodes": [...], "dists": [...]}: drop the archives
  holding those inodes or dist-info dirs (files a verify found damaged or
  missing), so uv unpacks their wheels again from the wheelhouse.
op "alone" {"dirs": [...]}: per dir, the bytes deleting it alone frees (its
  directories, and its files nothing else links). {"bytes": {dir: n}}.
op "prepare" {"store": dir}: before uv runs: the store made (or kept) mode 0700,
  so no other user reaches its lock files (flock needs only a read open); a lock
  someone holds (nothing of k26ops runs uv while the host lock is held) named
  with its pid, user and command; and whether the store's filesystem clones
  (reflinks, FICLONE). {"held": [{path, pid, user, command}], "link_mode": "clone"|"hardlink"}.
op "seal" {"store": dir, "locks": [path]}: after uv ran: its lock files 0600
  (uv makes them 0666), every other file read-only (a release's links share the
  inode: a tool that honours modes will not edit one release's file and change
  them all), no directory writable by others; `locks` (uv's lock in the venv it
  installed into): 0600 where they exist. {"fixed": n}.
"""

import fcntl
import hashlib
import json
import os
import pwd
import shutil
import sys
import zipfile


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
    return drop(store, dead)


def drop(store, dead):
    """Remove the store's archives `dead` ({id bytes: dir}): the index entries naming them first."""
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


def op_evict(r):
    """The store's archives holding any of `inodes` (files found damaged in a release that links
    them): dropped, so the next install unpacks those wheels again from the wheelhouse."""
    want, dists, dead = set(r.get("inodes") or []), set(r.get("dists") or []), {}
    for a in (os.path.join(r["store"], x) for x in _ls(r["store"]) if x.startswith("archive-v")):
        for name in _ls(a):
            if dists & set(_ls(os.path.join(a, name))):  # an archive of a wheel whose files went missing
                dead[name.encode()] = os.path.join(a, name)
                continue
            for base, _, files in os.walk(os.path.join(a, name)) if want else ():
                if any(os.lstat(os.path.join(base, f)).st_ino in want for f in files):
                    dead[name.encode()] = os.path.join(a, name)
                    break
    return drop(r["store"], dead)


def op_alone(r):
    return {"bytes": {d: alone(d) if os.path.isdir(d) else 0 for d in r["dirs"]}}


def _holder(pid):
    def read(name):
        try:
            with open("/proc/%d/%s" % (pid, name), "rb") as fh:
                return fh.read()
        except OSError:
            return b""

    uid = None
    for line in read("status").decode(errors="replace").splitlines():
        if line.startswith("Uid:"):
            uid = int(line.split()[1])
    try:
        user = pwd.getpwuid(uid).pw_name if uid is not None else "?"
    except KeyError:
        user = str(uid)
    return {
        "pid": pid,
        "user": user,
        "command": read("cmdline").replace(b"\0", b" ").decode(errors="replace").strip()[:120] or "?",
    }


def held_locks(store):
    """The store's lock files that a process holds now: /proc/locks by device and inode."""
    try:
        dev = os.stat(store).st_dev
        with open("/proc/locks") as fh:
            rows = fh.read().splitlines()
    except OSError:
        return []
    held = {}
    for row in rows:
        f = row.split()
        if "->" in f:
            f.remove("->")  # a waiter
        try:
            pid, (maj, mnr, ino) = int(f[4]), f[5].split(":")
        except (IndexError, ValueError):
            continue
        if os.makedev(int(maj, 16), int(mnr, 16)) == dev:
            held.setdefault(int(ino), pid)
    out = []
    if not held:
        return out
    for base, _, files in os.walk(store):
        for name in files:
            if name.endswith(".lock"):
                p = os.path.join(base, name)
                try:
                    ino = os.lstat(p).st_ino
                except OSError:
                    continue
                if ino in held:
                    out.append(dict(_holder(held[ino]), path=p))
    return out


def clones(d):
    """Does the filesystem of `d` clone a file (FICLONE: reflinks, copy-on-write)?"""
    a, b = os.path.join(d, ".k26ops-clone-a"), os.path.join(d, ".k26ops-clone-b")
    try:
        with open(a, "wb") as fa:
            fa.write(b"k26ops")
        with open(a, "rb") as fa, open(b, "wb") as fb:
            fcntl.ioctl(fb.fileno(), 0x40049409, fa.fileno())
        return True
    except OSError:
        return False
    finally:
        for p in (a, b):
            try:
                os.unlink(p)
            except OSError:
                pass


def op_prepare(r):
    store = r["store"]
    os.makedirs(store, mode=0o700, exist_ok=True)
    os.chmod(store, 0o700)
    return {"held": held_locks(store), "link_mode": "clone" if clones(store) else "hardlink"}


def op_seal(r):
    fixed = 0
    for base, dirs, files in os.walk(r["store"]):
        for name in dirs:
            p = os.path.join(base, name)
            st = os.lstat(p)
            if st.st_mode & 0o002 and not os.path.islink(p):
                os.chmod(p, st.st_mode & 0o7755)
                fixed += 1
        for name in files:
            p = os.path.join(base, name)
            st = os.lstat(p)
            if os.path.islink(p):
                continue
            want = 0o600 if name.endswith(".lock") else st.st_mode & 0o7555
            if st.st_mode & 0o7777 != want:
                os.chmod(p, want)
                fixed += 1
    for p in r.get("locks") or []:
        try:
            st = os.lstat(p)
        except OSError:
            continue
        if not os.path.islink(p) and st.st_mode & 0o7777 != 0o600:
            os.chmod(p, 0o600)
            fixed += 1
    return {"fixed": fixed}


def _ls(d):
    try:
        return sorted(os.listdir(d))
    except OSError:
        return []


if __name__ == "__main__":
    req = json.loads(sys.stdin.read())
    res = globals()["op_" + req.pop("op")](req)
    sys.stdout.write("\n" + json.dumps(res) + "\n")
