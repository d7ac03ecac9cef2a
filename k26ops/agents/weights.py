"""Host agent of the model weights (k26ops/weights/): verify, fetch one shard, and the
one-run SSH keys of a host-to-host sync.

op "verify" {"path", "entries": [[rel, size, sha256]], "record", "manifest", "force",
             "workers", "read_sample"}:
  hash every manifest file the record does not vouch for (its size, mtime, ctime and
  inode changed since its last hash, or it was never hashed; `force`: all), in parallel
  on the host's cores, and time a plain read of the same files first (page cache dropped
  before each pass where the kernel allows, so both come from the disk). Writes the
  record. {"bad": [[rel, why]], "hashed": n, "hashed_bytes", "hash_s", "read_bytes",
  "read_s", "workers", "last_full"}.
op "prepare" {"path", "entries", "record"}: make the model dir and its partial dir, say what
  is there: {"free", "partial": {rel: bytes}, "have": [verified rels], "foreign": [[rel, size]]
  (a manifest file the record does not vouch for that k26ops did not write), "rsync": bool}.
op "manifest" {"path", "workers"}: every file under path with its size and sha256 (a
  reference copy on a host): {"entries": [[rel, size, sha256]]}.
op "fetch" {"path", "rel", "size", "sha256", "record", "manifest", "source", "bwlimit_kbps",
            "key", "known_hosts"}:
  one shard into PATH/.k26ops-partial/REL with rsync (from a peer over SSH, restricted
  to a read-only rrsync of the peer's model dir, or a local path) or curl (an HTTP(S)
  mirror or the Hub; the token, if any, comes on stdin and goes to curl in a 0600 header
  file), resumed where a cut left it; then its sha256, then an atomic rename, then the
  record. {"ok", "bytes" (fetched now), "seconds", "resumed"} or {"ok": false, "why"}.
op "keygen" {"dir"}: a fresh ed25519 key for this run (its private half never leaves
  the host): {"pub"}.  op "forget" {"dir"}: remove it.
op "authorize" {"keys": [pub], "dir": the model dir served, "marker", "ttl_s"}: add the
  keys to this login's authorized_keys as restrict + command="rrsync -ro DIR" +
  expiry-time; op "deauthorize" {"marker"}: remove the lines with the marker.
"""

import fcntl
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time

CHUNK = 8 << 20
PARTIAL = ".k26ops-partial"


def stat_key(p):
    s = os.stat(p)
    return [s.st_size, "%d.%09d" % divmod(s.st_mtime_ns, 10**9), "%d.%09d" % divmod(s.st_ctime_ns, 10**9), s.st_ino]


def drop_cache(p):
    try:
        fd = os.open(p, os.O_RDONLY)
        try:
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)
    except (OSError, AttributeError):
        pass


def read_file(p, limit=None, hash_it=True):
    h = hashlib.sha256() if hash_it else None
    buf = bytearray(CHUNK)
    view = memoryview(buf)
    n = 0
    with open(p, "rb", buffering=0) as f:
        while limit is None or n < limit:
            got = f.readinto(buf)
            if not got:
                break
            if h is not None:
                h.update(view[:got])
            n += got
    return n, (h.hexdigest() if h is not None else None)


def parallel(fn, items, workers):
    out, lock, it = [None] * len(items), threading.Lock(), iter(range(len(items)))

    def run():
        while True:
            with lock:
                i = next(it, None)
            if i is None:
                return
            out[i] = fn(items[i])

    threads = [threading.Thread(target=run) for _ in range(max(1, min(workers, len(items))))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return out


class Record:
    """The verify record, read-modify-written under a lock (fetches of one host run at once)."""

    def __init__(self, path):
        self.path = path
        os.makedirs(os.path.dirname(path), exist_ok=True)
        self.fd = os.open(path + ".lock", os.O_RDWR | os.O_CREAT, 0o644)
        fcntl.flock(self.fd, fcntl.LOCK_EX)
        try:
            with open(path) as f:
                self.data = json.load(f)
            if not isinstance(self.data.get("files"), dict):
                raise ValueError
        except (OSError, ValueError, AttributeError):
            self.data = {"files": {}}

    def close(self):
        tmp = self.path + ".tmp"
        with open(tmp, "w") as f:
            json.dump(self.data, f, sort_keys=True)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, self.path)
        fcntl.flock(self.fd, fcntl.LOCK_UN)
        os.close(self.fd)


def now():
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


def vouched(rec, rel, full, sha):
    r = rec.get(rel)
    try:
        return bool(r) and r.get("sha256") == sha and r.get("stat") == stat_key(full)
    except OSError:
        return False


def op_verify(r):
    root, entries = r["path"], r["entries"]
    workers = int(r.get("workers") or os.cpu_count() or 1)
    rec = Record(r["record"])
    try:
        files = rec.data["files"]
        todo, bad = [], []
        for rel, size, sha in entries:
            full = os.path.join(root, rel)
            try:
                st = os.stat(full)
            except OSError:
                bad.append([rel, "missing (expected %d bytes)" % size])
                continue
            if st.st_size != size:
                bad.append([rel, "expected %d bytes, found %d" % (size, st.st_size)])
            elif r.get("force") or not vouched(files, rel, full, sha):
                todo.append((rel, size, sha, full))
        # a plain read of (a sample of) the same files, then the hash: both from the disk
        budget, sample = int(r.get("read_sample") or 0), []
        for t in todo:
            if budget <= 0:
                break
            sample.append((t[3], min(t[1], budget)))
            budget -= t[1]
        for full, _n in sample:
            drop_cache(full)
        t0 = time.monotonic()
        read = parallel(lambda s: read_file(s[0], s[1], hash_it=False)[0], sample, workers)
        read_s = time.monotonic() - t0
        for t in todo:
            drop_cache(t[3])
        t0 = time.monotonic()
        got = parallel(lambda t: (stat_key(t[3]), read_file(t[3])), todo, workers)
        hash_s = time.monotonic() - t0
        for (rel, size, sha, full), (key, (n, h)) in zip(todo, got):
            if h != sha:
                bad.append([rel, "sha256 %s, expected %s" % (h, sha)])
                files[rel] = {"written": bool((files.get(rel) or {}).get("written"))}  # vouches for nothing now
                continue
            old = files.get(rel) or {}
            files[rel] = {
                "stat": key,
                "sha256": h,
                "verified_at": now(),
                "written": bool(old.get("written")) and (old.get("stat") or [0])[-1] == key[-1],
            }
        if not bad:
            rec.data["last_full"] = {"at": now(), "manifest": r.get("manifest")}
        return {
            "bad": bad,
            "hashed": len(todo),
            "hashed_bytes": sum(t[1] for t in todo),
            "hash_s": hash_s,
            "read_bytes": sum(read),
            "read_s": read_s,
            "workers": workers,
            "last_full": rec.data.get("last_full"),
        }
    finally:
        rec.close()


def op_manifest(r):
    """Every regular file under `path` (the partial dir left out) with its size and sha256."""
    root, rels = r["path"], []
    if not os.path.isdir(root):
        return {"error": "%s is not a directory" % root}
    for dirpath, dirs, names in os.walk(root):
        rel_dir = os.path.relpath(dirpath, root)
        dirs[:] = sorted(d for d in dirs if not (rel_dir == "." and d in (PARTIAL, ".git", ".cache")))
        for n in names:
            full = os.path.join(dirpath, n)
            if os.path.isfile(full) and not os.path.islink(full):
                rels.append(os.path.normpath(os.path.join(rel_dir, n)))
    rels.sort()
    got = parallel(lambda rel: read_file(os.path.join(root, rel)), rels, int(r.get("workers") or os.cpu_count() or 1))
    return {"entries": [[rel, n, h] for rel, (n, h) in zip(rels, got)]}


def free_bytes(path):
    p = path
    while not os.path.exists(p):
        p = os.path.dirname(p) or "/"
    s = os.statvfs(p)
    return s.f_bavail * s.f_frsize


def op_prepare(r):
    root = r["path"]
    out = {
        "free": free_bytes(root),
        "partial": {},
        "have": [],
        "foreign": [],
        "rsync": shutil.which("rsync") is not None,
        "curl": shutil.which("curl") is not None,
    }
    os.makedirs(os.path.join(root, PARTIAL), exist_ok=True)
    rec = Record(r["record"])
    try:
        files = rec.data["files"]
        for rel, size, sha in r["entries"]:
            full, part = os.path.join(root, rel), os.path.join(root, PARTIAL, rel)
            if os.path.isfile(part):
                out["partial"][rel] = os.path.getsize(part)
            if not os.path.lexists(full):
                continue
            if vouched(files, rel, full, sha):
                out["have"].append(rel)
            elif not (files.get(rel) or {}).get("written"):  # wrong bytes k26ops did not write: not replaced
                out["foreign"].append([rel, os.path.getsize(full)])
    finally:
        rec.close()
    return out


def ssh_command(src, key, known_hosts):
    return (
        "ssh -p %d -i %s -o IdentitiesOnly=yes -o BatchMode=yes -o StrictHostKeyChecking=yes "
        "-o UserKnownHostsFile=%s -o GlobalKnownHostsFile=/dev/null -o ConnectTimeout=15 "
        "-o ServerAliveInterval=15 -o ForwardAgent=no -o ClearAllForwardings=yes"
        % (int(src["port"]), quote(key), quote(known_hosts))
    )


def quote(s):
    return "'" + str(s).replace("'", "'\"'\"'") + "'"


def transfer(r, part, stdin_token):
    """The command that brings the shard to `part` (resuming it), and what goes on its stdin."""
    src, bw = r["source"], int(r.get("bwlimit_kbps") or 0)
    if src["kind"] in ("peer", "local"):
        cmd = ["rsync", "--append-verify", "--inplace", "--no-perms", "--chmod=F644"]
        if bw:
            cmd.append("--bwlimit=%d" % bw)
        if src["kind"] == "peer":
            with open(r["known_hosts"], "w") as f:
                f.write("".join(line + "\n" for line in src["host_keys"]))
            cmd += [
                "-e",
                ssh_command(src, r["key"], r["known_hosts"]),
                "%s@%s:%s" % (src["user"], src["address"], r["rel"]),
            ]
        else:
            cmd.append(os.path.join(src["path"], r["rel"]))
        return cmd + [part], None
    cmd = ["curl", "-fsSL", "--retry", "3", "-C", "-", "-o", part]
    if bw:
        cmd += ["--limit-rate", "%dk" % bw]
    if stdin_token:
        cmd += ["-H", "@-"]  # the Authorization header from stdin: never in argv
    return cmd + [src["url"]], ("Authorization: Bearer %s\n" % stdin_token) if stdin_token else None


def op_fetch(r):
    root, rel, size, sha = r["path"], r["rel"], int(r["size"]), r["sha256"]
    full, part = os.path.join(root, rel), os.path.join(root, PARTIAL, rel)
    os.makedirs(os.path.dirname(part), exist_ok=True)
    os.makedirs(os.path.dirname(full), exist_ok=True)
    before = os.path.getsize(part) if os.path.isfile(part) else 0
    if before > size:
        os.unlink(part)  # ours (the partial dir is k26ops'): longer than the shard, cannot be it
        before = 0
    t0 = time.monotonic()
    if before < size:
        cmd, stdin = transfer(r, part, r.get("token"))
        p = subprocess.run(cmd, input=stdin, text=True, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        if p.returncode != 0:
            why = (p.stderr.strip().splitlines() or ["exit %d" % p.returncode])[-1]
            return {"ok": False, "why": "%s exited %d: %s" % (cmd[0], p.returncode, why[:300])}
    seconds = time.monotonic() - t0
    n, got = read_file(part)
    if n != size or got != sha:
        os.unlink(part)  # a wrong copy is dropped: the next try starts afresh
        return {
            "ok": False,
            "why": "%s: %d bytes with sha256 %s, expected %d bytes with %s (the copy was dropped)"
            % (rel, n, got, size, sha),
        }
    rec = Record(r["record"])
    try:
        os.replace(part, full)
        rec.data["files"][rel] = {"stat": stat_key(full), "sha256": sha, "verified_at": now(), "written": True}
    finally:
        rec.close()
    return {"ok": True, "bytes": n - before, "seconds": seconds, "resumed": before}


def op_keygen(r):
    d = r["dir"]
    os.makedirs(d, mode=0o700, exist_ok=True)
    key = os.path.join(d, "id_ed25519")
    for p in (key, key + ".pub"):
        if os.path.exists(p):
            os.unlink(p)
    subprocess.run(
        ["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "k26ops-model-sync", "-f", key],
        check=True,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    with open(key + ".pub") as f:
        return {"pub": f.read().strip(), "key": key}


def op_forget(r):
    shutil.rmtree(r["dir"], ignore_errors=True)
    return {"ok": True}


def authorized_keys():
    return os.path.join(os.path.expanduser("~"), ".ssh", "authorized_keys")


def rewrite(path, lines):
    fd, tmp = tempfile.mkstemp(dir=os.path.dirname(path), prefix=".k26ops-")
    with os.fdopen(fd, "w") as f:
        f.writelines(lines)
    os.chmod(tmp, 0o600)
    os.replace(tmp, path)


def op_authorize(r):
    rrsync = shutil.which("rrsync") or next(
        (p for p in ("/usr/bin/rrsync", "/usr/share/rsync/scripts/rrsync") if os.access(p, os.X_OK)), None
    )
    if not rrsync or not shutil.which("rsync"):
        return {"ok": False, "why": "rsync (with its rrsync) is not installed: apt-get install rsync"}
    path = authorized_keys()
    os.makedirs(os.path.dirname(path), mode=0o700, exist_ok=True)
    try:
        with open(path) as f:
            lines = f.readlines()
    except FileNotFoundError:
        lines = []
    if lines and not lines[-1].endswith("\n"):
        lines[-1] += "\n"
    expiry = time.strftime("%Y%m%d%H%M%S", time.localtime(time.time() + int(r["ttl_s"])))  # sshd reads local time
    opts = 'restrict,expiry-time="%s",command="%s -ro %s"' % (expiry, rrsync, r["dir"].replace('"', ""))
    lines += ["%s %s %s\n" % (opts, " ".join(k.split()[:2]), r["marker"]) for k in r["keys"]]
    rewrite(path, lines)
    return {"ok": True}


def op_deauthorize(r):
    path = authorized_keys()
    try:
        with open(path) as f:
            lines = f.readlines()
    except FileNotFoundError:
        return {"ok": True, "removed": 0}
    keep = [ln for ln in lines if not ln.rstrip("\n").endswith(" " + r["marker"])]
    if len(keep) != len(lines):
        rewrite(path, keep)
    return {"ok": True, "removed": len(lines) - len(keep)}


if __name__ == "__main__":
    req = json.loads(sys.stdin.read())
    res = globals()["op_" + req.pop("op")](req)
    sys.stdout.write("\n" + json.dumps(res) + "\n")
