"""Host agent of `k26ops diagnose probe` (k26ops/diagnose/probe.py): put a
probe patch into the deployed release and a runtime drop-in on the unit, and
take both out again, leaving the host as it was.

op "prepare": clean a dead run's leftovers, read the engine's state and check
  the release against its manifest and patch state (`dry`: change nothing);
op "apply_probe": apply the probe patch with the release's own patchset.py;
op "restart": install the drop-in, remember the journal cursor, restart;
op "journal": the unit's journal since a cursor or time;
op "restore": drop-in out, probe reverted, the engine as it was.
An op that raises answers {"ok": false, "error": ...}.
"""

import hashlib
import json
import os
import re
import shutil
import subprocess
import sys


def sh(argv, timeout=120):
    p = subprocess.run(argv, capture_output=True, text=True, timeout=timeout)
    return p.returncode, p.stdout, p.stderr


def sha(path):
    try:
        with open(path, "rb") as fh:
            return hashlib.sha256(fh.read()).hexdigest()
    except (FileNotFoundError, IsADirectoryError):
        return None


def read(path):
    try:
        with open(path, encoding="utf-8", errors="replace") as fh:
            return fh.read()
    except FileNotFoundError:
        return None


def show(unit):
    props = (
        "ActiveState,SubState,MainPID,NRestarts,UnitFileState,LoadState,InvocationID,FragmentPath,DropInPaths,Result"
    )
    _, out, _ = sh(["systemctl", "show", unit, "-p", props])
    d = dict(l.split("=", 1) for l in out.splitlines() if "=" in l)
    for k in ("MainPID", "NRestarts"):
        try:
            d[k] = int(d.get(k) or 0)
        except ValueError:
            d[k] = 0
    return d


def runtime_dropin(unit, name):
    return os.path.join("/run/systemd/system", unit + ".d", name)


def dropins(unit):
    out = {}
    for base in ("/etc/systemd/system", "/run/systemd/system", "/usr/lib/systemd/system", "/lib/systemd/system"):
        d = os.path.join(base, unit + ".d")
        if os.path.isdir(d):
            for f in sorted(os.listdir(d)):
                out[os.path.join(d, f)] = sha(os.path.join(d, f))
    return out


def probe_revert(release, site, sdir):
    """Revert a probe (ours) exactly and restore the files' mtimes; drop its state dir."""
    done = {"reverted": [], "had_probe": False}
    if not os.path.isdir(sdir):
        return done
    done["had_probe"] = os.path.exists(os.path.join(sdir, "state.json"))
    if done["had_probe"]:
        rc, out, err = sh(
            [sys.executable, os.path.join(release, "k26ops", "patchset.py"), "revert", "--root", site, "--state", sdir]
        )
        try:
            res = json.loads(out.strip().splitlines()[-1])
        except (ValueError, IndexError):
            res = {"ok": False, "error": (err or out).strip()[-300:]}
        if not res.get("ok"):
            raise RuntimeError("reverting the probe failed: %s" % res.get("error"))
        done["reverted"] = res.get("files", [])
    try:
        with open(os.path.join(sdir, "mtimes.json")) as fh:
            mt = json.load(fh)
    except (OSError, ValueError):
        mt = {}
    for rel, ns in mt.items():
        p = os.path.join(site, rel)
        if os.path.exists(p):
            os.utime(p, ns=(ns, ns))
    shutil.rmtree(sdir)
    return done


def op_prepare(r):
    """Leftovers of a run that died are removed; then the engine's state and the
    release's canonical check."""
    unit, rels = r["unit"], r["releases"]
    notes = []
    dry = r.get("dry")  # --check / before asking: change nothing, say what would be cleaned
    dp = runtime_dropin(unit, r["dropin"])
    if os.path.exists(dp) and dry:
        notes.append("would remove a probe drop-in left by an earlier run: " + dp)
    elif os.path.exists(dp):
        os.unlink(dp)
        sh(["systemctl", "daemon-reload"])
        notes.append("removed a probe drop-in left by an earlier run: " + dp)
    try:
        rid = os.readlink(os.path.join(rels, "current"))
    except OSError:
        return {"ok": False, "error": "no current release under %s (deploy first)" % rels}
    release = rid if rid.startswith("/") else os.path.join(rels, rid)
    try:
        with open(os.path.join(release, "manifest.json")) as fh:
            man = json.load(fh)
    except (OSError, ValueError):
        return {"ok": False, "error": "release %s has no readable manifest.json (not built by k26ops?)" % release}
    site = man.get("site_packages") or ""
    if not os.path.isdir(site):
        return {"ok": False, "error": "release %s: site-packages %s is missing" % (release, site)}
    sdir = os.path.join(release, r["probe_state"])
    try:
        left = {"had_probe": False} if dry else probe_revert(release, site, sdir)
        if dry and os.path.exists(os.path.join(sdir, "state.json")):
            notes.append("would revert a probe left by an earlier run")
    except RuntimeError as e:
        return {"ok": False, "error": "a probe left by an earlier run: " + str(e)}
    if left["had_probe"]:
        notes.append("reverted a probe left by an earlier run (%d file(s))" % len(left["reverted"]))
    drift = []
    for rel, want in sorted((man.get("patched_files") or {}).items()):
        got = sha(os.path.join(site, rel))
        if got != want:
            text = read(os.path.join(site, rel)) or ""
            drift.append(
                {"path": rel, "expected": want, "actual": got, "source": "manifest", "probe": "K26OPS-PROBE" in text}
            )
    pstate = os.path.join(release, "patch-state")
    script = os.path.join(release, "k26ops", "patchset.py")
    if os.path.exists(os.path.join(pstate, "state.json")) and os.path.exists(script):
        rc, out, err = sh([sys.executable, script, "verify", "--root", site, "--state", pstate])
        try:
            res = json.loads(out.strip().splitlines()[-1])
        except (ValueError, IndexError):
            res = {"ok": False, "drift": [], "error": (err or out).strip()[-300:]}
        seen = {d["path"] for d in drift}
        for d in res.get("drift", []):
            if d["path"] not in seen:
                drift.append({**d, "source": "patch-state", "probe": False})
        if res.get("error"):
            notes.append("patchset verify: " + res["error"])
    else:
        notes.append("release has no patch state to verify (%s)" % pstate)
    s = show(unit)
    unit_path = s.get("FragmentPath") or ""
    unit_text = read(unit_path) if unit_path else None
    env_path = r.get("env_path")
    return {
        "ok": True,
        "notes": notes,
        "release": release,
        "release_id": os.path.basename(release),
        "site": site,
        "drift": drift,
        "show": s,
        "base": (man.get("engine") or {}).get("base"),
        "unit_path": unit_path,
        "unit_text": unit_text,
        "unit_sha": sha(unit_path) if unit_path else None,
        "dropins": dropins(unit),
        "env": read(env_path) if env_path else None,
        "env_sha": sha(env_path) if env_path else None,
    }


def op_apply_probe(r):
    release, site = r["release"], r["site"]
    sdir = os.path.join(release, r["probe_state"])
    os.makedirs(os.path.join(sdir, "patches"), mode=0o700, exist_ok=True)
    with open(os.path.join(sdir, "patches", "probe.patch"), "w") as fh:
        fh.write(r["patch_text"])
    with open(os.path.join(sdir, "patches", "series"), "w") as fh:
        fh.write("probe.patch\n")
    base = ["--base", r["base"]] if r.get("base") else []
    rc, out, err = sh(
        [
            sys.executable,
            os.path.join(release, "k26ops", "patchset.py"),
            "check",
            "--root",
            site,
            "--series",
            os.path.join(sdir, "patches", "series"),
            "--state",
            sdir,
        ]
        + base
    )
    try:
        res = json.loads(out.strip().splitlines()[-1])
    except (ValueError, IndexError):
        res = {"ok": False, "error": (err or out).strip()[-300:]}
    if not res.get("ok"):
        shutil.rmtree(sdir, ignore_errors=True)
        return {"ok": False, "error": res.get("error")}
    mt = {}
    for p in res.get("patches", []):
        for rel in p.get("files", {}):
            path = os.path.join(site, rel)
            if os.path.exists(path):
                mt[rel] = os.stat(path).st_mtime_ns
    with open(os.path.join(sdir, "mtimes.json"), "w") as fh:
        json.dump(mt, fh)
    rc, out, err = sh(
        [
            sys.executable,
            os.path.join(release, "k26ops", "patchset.py"),
            "apply",
            "--root",
            site,
            "--series",
            os.path.join(sdir, "patches", "series"),
            "--state",
            sdir,
        ]
        + base
    )
    try:
        res = json.loads(out.strip().splitlines()[-1])
    except (ValueError, IndexError):
        res = {"ok": False, "error": (err or out).strip()[-300:]}
    return {"ok": bool(res.get("ok")), "error": res.get("error"), "files": res.get("files", [])}


def op_revert(r):
    """The probe out of a release, nothing else (a rehearsal's probe: no unit involved)."""
    res = probe_revert(r["release"], r["site"], os.path.join(r["release"], r["probe_state"]))
    return {"ok": True, "done": ["reverted the probe (%d file(s))" % len(res["reverted"])] if res["had_probe"] else []}


def op_restart(r):
    """Install the runtime drop-in, remember the journal position, restart."""
    unit = r["unit"]
    dp = runtime_dropin(unit, r["dropin"])
    os.makedirs(os.path.dirname(dp), exist_ok=True)
    with open(dp + ".tmp", "w") as fh:
        fh.write(r["dropin_text"])
    os.replace(dp + ".tmp", dp)
    sh(["systemctl", "daemon-reload"])
    _, out, _ = sh(["journalctl", "--no-pager", "-u", unit, "-n", "0", "--show-cursor"])
    m = re.search(r"-- cursor: (\S+)", out)
    sh(["systemctl", "reset-failed", unit])
    rc, out2, err = sh(["systemctl", "restart", unit], timeout=600)
    s = show(unit)
    return {"ok": rc == 0, "error": err.strip()[-300:], "cursor": m.group(1) if m else None, "show": s}


def op_journal(r):
    argv = ["journalctl", "--no-pager", "-u", r["unit"], "-o", "cat", "-n", str(r.get("lines", 20000))]
    if r.get("cursor"):
        argv += ["--after-cursor", r["cursor"]]
    if r.get("since"):
        argv += ["--since", r["since"]]
    _, out, _ = sh(argv)
    return {"text": out, "show": show(r["unit"])}


def op_restore(r):
    """Drop-in out, probe reverted, engine as before. Each part is tried even if another failed."""
    unit, done, errors = r["unit"], [], []
    dp = runtime_dropin(unit, r["dropin"])
    try:
        if os.path.exists(dp):
            os.unlink(dp)
            done.append("removed drop-in " + dp)
        try:
            os.rmdir(os.path.dirname(dp))
        except OSError:
            pass
        sh(["systemctl", "daemon-reload"])
    except Exception as e:
        errors.append("drop-in: %s" % e)
    if r.get("release"):
        try:
            res = probe_revert(r["release"], r["site"], os.path.join(r["release"], r["probe_state"]))
            if res["had_probe"]:
                done.append("reverted the probe (%d file(s))" % len(res["reverted"]))
        except Exception as e:
            errors.append(str(e))
    sh(["systemctl", "reset-failed", unit])
    if r.get("was_active"):
        rc, _, err = sh(["systemctl", "restart", unit], timeout=600)
        done.append("restarted the engine" if rc == 0 else "restart failed")
        if rc:
            errors.append("systemctl restart: " + err.strip()[-200:])
    elif r.get("stop"):
        sh(["systemctl", "stop", unit], timeout=600)
        sh(["systemctl", "reset-failed", unit])
        done.append("stopped the engine (it was not running before)")
    return {"ok": not errors, "done": done, "errors": errors, "show": show(unit), "dropins": dropins(unit)}


if __name__ == "__main__":
    req = json.loads(sys.stdin.read())
    try:
        res = globals()["op_" + req.pop("op")](req)
    except Exception as e:
        res = {"ok": False, "error": "%s: %s" % (e.__class__.__name__, e)}
    sys.stdout.write("\n" + json.dumps(res) + "\n")
