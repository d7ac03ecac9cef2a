"""The engine under systemd: steps `service`, `health` and `smoke`.

- `service` renders the unit and env file (units.py templates) from the
  recipe's engine profile overlaid with the inventory, compares them with the
  host's files (one remote read) and installs only what differs: the new unit
  is checked with `systemd-analyze verify` on the host before it replaces the
  old one, files are replaced by atomic rename, and the engine restarts only
  when the unit, the env file or the `current` release changed. The previous
  unit and env file are kept (state dir) for a rollback.
- `health` polls readiness from the host itself (/health, then
  /health_generate) in long-poll windows (one remote command per window); a
  crash (unit failed, process exited, restarted) ends the wait at once, the
  journal tail is classified with the diagnose classifier, and a change made
  by this run is rolled back (previous unit, env file and `current`).
- `smoke` sends one short /generate; it must return text. Latency and
  meta_info.spec_accept_length go into the host's report.

Every host-side action runs through one stdlib-only Python agent (`AGENT`)
sent with the command; requests and answers are JSON over stdin/stdout.
Secrets (HF_TOKEN, *_TOKEN, ...) reach only the env file (mode 0600); diffs,
journal lines and messages are redacted before anyone sees them.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

from k26ops import units
from k26ops.errors import UserError
from k26ops.ssh import q
from k26ops.steps import Change, HostContext, Step, StepFailed, register, text_diff

DEFAULT_UNIT = "k26-engine.service"
UNIT_DIR = "/etc/systemd/system"
LAB_MODULE_DIR = "/opt/k26ops/lab"
LAB_MODULE = "k26ops_lab_engine"
# Lab fixture, read as a file (nothing outside `lab` imports it); installed only on `lab: true` hosts.
STANDIN = Path(__file__).resolve().parent.parent / "lab" / "fixtures" / "engine_standin.py"
DEFAULT_HEALTH_TIMEOUT = 1800.0
PASS_ENV = ("HF_TOKEN",)


class EngineFailed(StepFailed):
    """The engine did not become healthy: one-line message plus the journal tail
    (redacted) and the classifier's diagnosis for the report."""

    def __init__(self, message: str, journal_tail: str = "", diagnosis: dict | None = None):
        super().__init__(message)
        self.details = {"journal_tail": journal_tail, "diagnosis": diagnosis or {}}


# ---------------------------------------------------------------- host agent

AGENT = r'''
import json, os, shutil, subprocess, sys, time, hashlib, urllib.request, urllib.error

PROPS = ("ActiveState,SubState,MainPID,NRestarts,UnitFileState,LoadState,InvocationID,"
         "ExecMainStatus,Result,ExecMainStartTimestamp,ExecMainStartTimestampMonotonic")

def sh(argv, timeout=60):
    p = subprocess.run(argv, capture_output=True, text=True, timeout=timeout)
    return p.returncode, p.stdout, p.stderr

def show(unit):
    _, out, _ = sh(["systemctl", "show", unit, "-p", PROPS])
    d = dict(l.split("=", 1) for l in out.splitlines() if "=" in l)
    for k in ("MainPID", "NRestarts", "ExecMainStatus", "ExecMainStartTimestampMonotonic"):
        try: d[k] = int(d.get(k) or 0)
        except ValueError: d[k] = 0
    return d

def read(path):
    try:
        with open(path, encoding="utf-8", errors="replace") as fh: return fh.read()
    except FileNotFoundError: return None

def mode(path):
    try: return os.stat(path).st_mode & 0o7777
    except FileNotFoundError: return None

def write(path, text, perm):
    d = os.path.dirname(path)
    os.makedirs(d, exist_ok=True)
    tmp = os.path.join(d, "." + os.path.basename(path) + ".k26ops-tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, perm)
    try:
        os.fchmod(fd, perm)
        os.write(fd, text.encode())
        os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(tmp, path)

def http(port, path, body=None, timeout=5.0, host="127.0.0.1"):
    url = "http://%s:%d%s" % (host, port, path)
    data = json.dumps(body).encode() if body is not None else None
    req = urllib.request.Request(url, data=data, headers={"Content-Type": "application/json"} if data else {})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r: return r.status, r.read().decode(errors="replace")
    except urllib.error.HTTPError as e: return e.code, e.read().decode(errors="replace")[:300]
    except Exception as e: return 0, "%s: %s" % (e.__class__.__name__, e)

def journal(unit, lines, invocation=None):
    argv = ["journalctl", "--no-pager", "-o", "cat", "-n", str(lines)]
    argv += ["_SYSTEMD_INVOCATION_ID=" + invocation] if invocation else ["-u", unit]
    _, out, _ = sh(argv)
    return out

MEANINGFUL = ("Loading safetensors", "Load weight", "Capture cuda graph", "KV Cache", "Init torch",
              "fired up", "Uvicorn running", "ERROR", "Error", "Traceback", "Starting", "server_args")

def last_meaningful(text):
    for line in reversed(text.splitlines()):
        if any(m in line for m in MEANINGFUL):
            return line.strip()[:200]
    lines = [l for l in text.splitlines() if l.strip()]
    return lines[-1].strip()[:200] if lines else ""

def crashed(s, base):
    if s.get("ActiveState") in ("failed", "inactive", "deactivating"):
        return "unit is %s (%s)" % (s.get("ActiveState"), s.get("Result"))
    if s.get("SubState") in ("auto-restart", "failed", "dead", "exited", "stop-sigterm", "final-sigterm"):
        return "unit is %s/%s" % (s.get("ActiveState"), s.get("SubState"))
    if base.get("MainPID") and s.get("MainPID") != base["MainPID"]:
        return "engine process %s exited (now %s)" % (base["MainPID"], s.get("MainPID") or "none")
    if s.get("NRestarts", 0) > base.get("NRestarts", 0):
        return "systemd restarted the engine"
    return None

def op_read(r):
    cur = None
    try: cur = os.readlink(r["current"])
    except OSError: pass
    lab = r.get("lab_module")
    sha = None
    if lab and os.path.exists(lab):
        with open(lab, "rb") as fh: sha = hashlib.sha256(fh.read()).hexdigest()
    return {"unit": read(r["unit_path"]), "env": read(r["env_path"]), "env_mode": mode(r["env_path"]),
            "current": cur, "lab_module_sha": sha, "show": show(r["unit"])}

def op_apply(r):
    unit, upath, epath = r["unit"], r["unit_path"], r["env_path"]
    sdir = os.path.join(r["state_dir"], "service")
    new, prev = os.path.join(sdir, "new"), os.path.join(sdir, "prev")
    for d in (new, prev): os.makedirs(d, mode=0o700, exist_ok=True)
    if r.get("unit_text") is not None:
        staged = os.path.join(new, unit)
        write(staged, r["unit_text"], 0o644)
        if shutil.which("systemd-analyze"):
            rc, out, err = sh(["systemd-analyze", "verify", staged], timeout=120)
            if rc != 0:
                return {"ok": False, "error": "verify", "output": (err + out).strip()[-3000:]}
    # Keep the files in place now, for a rollback (manifest says which existed).
    manifest = {"unit_existed": os.path.exists(upath), "env_existed": os.path.exists(epath),
                "was_enabled": show(unit).get("UnitFileState") == "enabled", "time": time.time()}
    for src, name in ((upath, "unit"), (epath, "env")):
        dst = os.path.join(prev, name)
        if os.path.exists(src): shutil.copy2(src, dst)
        elif os.path.exists(dst): os.unlink(dst)
    write(os.path.join(prev, "manifest.json"), json.dumps(manifest), 0o600)
    if r.get("env_text") is not None: write(epath, r["env_text"], 0o600)
    elif os.path.exists(epath) and mode(epath) != 0o600: os.chmod(epath, 0o600)
    if r.get("lab_module_text") is not None: write(r["lab_module"], r["lab_module_text"], 0o644)
    if r.get("unit_text") is not None:
        write(upath, r["unit_text"], 0o644)
        rc, out, err = sh(["systemctl", "daemon-reload"])
        if rc: return {"ok": False, "error": "daemon-reload", "output": err.strip()[-500:]}
    if r.get("enable"):
        rc, out, err = sh(["systemctl", "enable", unit])
        if rc: return {"ok": False, "error": "enable", "output": err.strip()[-500:]}
    if r.get("restart") or r.get("start"):
        sh(["systemctl", "reset-failed", unit])
        rc, out, err = sh(["systemctl", "restart" if r.get("restart") else "start", unit], timeout=600)
        if rc: return {"ok": False, "error": "restart", "output": err.strip()[-500:], "show": show(unit)}
    return {"ok": True, "show": show(unit), "manifest": manifest}

def op_rollback(r):
    unit, upath, epath = r["unit"], r["unit_path"], r["env_path"]
    prev = os.path.join(r["state_dir"], "service", "prev")
    try:
        with open(os.path.join(prev, "manifest.json")) as fh: m = json.load(fh)
    except (OSError, ValueError):
        return {"ok": False, "error": "no backup of the previous unit and env file"}
    done = []
    for name, path, existed, perm in (("unit", upath, m["unit_existed"], 0o644), ("env", epath, m["env_existed"], 0o600)):
        if existed:
            with open(os.path.join(prev, name), encoding="utf-8") as fh: write(path, fh.read(), perm)
            done.append("restored " + path)
        elif os.path.exists(path):
            os.unlink(path); done.append("removed " + path)
    if r.get("previous_release"):
        cur = r["current"]
        tmp = cur + ".k26ops-tmp"
        if os.path.lexists(tmp): os.unlink(tmp)
        os.symlink(r["previous_release"], tmp)
        os.replace(tmp, cur)
        done.append("current -> " + r["previous_release"])
    sh(["systemctl", "daemon-reload"])
    sh(["systemctl", "reset-failed", unit])
    if m["unit_existed"]:
        if not m.get("was_enabled"): sh(["systemctl", "disable", unit])
        rc, _, err = sh(["systemctl", "restart", unit], timeout=600)
        done.append("restarted" if rc == 0 else "restart failed: " + err.strip()[-200:])
    else:
        sh(["systemctl", "disable", "--now", unit])
        done.append("stopped (no previous unit)")
    return {"ok": True, "done": done, "show": show(unit), "had_unit": m["unit_existed"]}

def op_poll(r):
    unit, port, host = r["unit"], r["port"], r.get("host", "127.0.0.1")
    base = r.get("base") or {}
    end = time.monotonic() + r.get("window", 2.0)
    first = True
    while True:
        s = show(unit)
        if first and not base:
            base = {k: s.get(k) for k in ("MainPID", "NRestarts", "InvocationID")}
        first = False
        why = crashed(s, base)
        if why:
            time.sleep(0.4)  # let journald take the last lines
            return {"state": "crashed", "why": why, "show": show(unit), "base": base,
                    "journal": journal(unit, r.get("journal_lines", 150), base.get("InvocationID"))}
        code, _ = http(port, "/health", timeout=2.0, host=host)
        if code == 200:
            code2, body2 = http(port, "/health_generate", timeout=r.get("generate_timeout", 30.0), host=host)
            if code2 == 200:
                return {"state": "healthy", "show": s, "base": base}
        if time.monotonic() >= end:
            j = journal(unit, 30, base.get("InvocationID"))
            return {"state": "loading" if code in (0, 503) else "unhealthy", "health": code,
                    "last_line": last_meaningful(j), "show": s, "base": base}
        time.sleep(r.get("interval", 0.25))

def op_smoke(r):
    body = {"text": r["prompt"], "sampling_params": {"max_new_tokens": r["max_new_tokens"], "temperature": 0}}
    t0 = time.monotonic()
    code, text = http(r["port"], "/generate", body, timeout=r.get("timeout_s", 120.0), host=r.get("host", "127.0.0.1"))
    latency = time.monotonic() - t0
    try: data = json.loads(text)
    except ValueError: data = None
    return {"status": code, "latency_s": round(latency, 4), "body": data if isinstance(data, dict) else text[:300]}

def op_status(r):
    unit = r["unit"]
    s = show(unit)
    cur = None
    try: cur = os.readlink(r["current"])
    except OSError: pass
    out = {"show": s, "current": cur, "now_monotonic_us": int(time.monotonic() * 1e6)}
    if s.get("ActiveState") == "active":
        out["health"] = http(r["port"], "/health", timeout=2.0, host=r.get("host", "127.0.0.1"))[0]
        code, body = http(r["port"], "/v1/models", timeout=2.0, host=r.get("host", "127.0.0.1"))
        try: out["model"] = json.loads(body)["data"][0]["id"] if code == 200 else None
        except Exception: out["model"] = None
    return out

def op_logs(r):
    argv = ["journalctl", "--no-pager", "-u", r["unit"], "-o", "short-iso", "--show-cursor"]
    argv += ["--after-cursor", r["cursor"]] if r.get("cursor") else ["-n", str(r["lines"])]
    rc, out, err = sh(argv)
    cursor = r.get("cursor")
    lines = out.splitlines()
    if lines and lines[-1].startswith("-- cursor: "):
        cursor = lines.pop()[len("-- cursor: "):]
    lines = [l for l in lines if l != "-- No entries --"]
    return {"lines": lines, "cursor": cursor, "env": read(r["env_path"]) if r.get("with_env") else None}

req = json.loads(sys.stdin.read())
res = globals()["op_" + req.pop("op")](req)
sys.stdout.write("\n" + json.dumps(res) + "\n")
'''


def agent(session, op: str, timeout: float = 120.0, **req) -> dict:
    """Run one agent operation on the host: one remote command."""
    python = "python3"
    res = session.run(f"{python} -c {q(AGENT)}", stdin=json.dumps({"op": op, **req}), timeout=timeout)
    lines = res.stdout.strip().splitlines()
    if res.exited != 0 or not lines:
        why = (res.stderr or res.stdout or "").strip().splitlines()
        raise StepFailed(f"host agent ({op}) exited {res.exited}: {why[-1][:300] if why else 'no output'}")
    try:
        return json.loads(lines[-1])
    except ValueError:
        raise StepFailed(f"host agent ({op}) printed no JSON: {lines[-1][:200]!r}") from None


# ---------------------------------------------------------------- desired state

def unit_name(params: dict, hvars: dict) -> str:
    name = str(params.get("unit") or hvars.get("engine_unit") or DEFAULT_UNIT)
    if "/" in name or not name.endswith(".service") or len(name) < 9:
        raise UserError(f"engine unit name must be NAME.service, got {name!r}")
    return name


def env_path(params: dict, hvars: dict) -> str:
    return str(params.get("env_file") or hvars.get("engine_env_file") or units.ENV_FILE)


def _mapping(value, what: str) -> dict:
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise UserError(f"inventory var {what} must be a mapping, got {type(value).__name__}")
    return dict(value)


def engine_profile(ctx: HostContext) -> dict:
    """The release step's profile (recipe profile, then inventory `engine_profile`,
    model_path, draft_model_path, served_model_name, engine_port, launch_module,
    extra_flags), so the unit runs exactly the flags it validated; plus the
    release dir under this host's releases root."""
    try:
        from k26ops.steps.release import engine_profile as release_profile
    except ImportError:  # pragma: no cover - the release step ships with this module
        release_profile = None
    if release_profile is not None:
        profile = dict(release_profile(ctx))
    else:
        from k26ops import recipe as recipe_mod

        hv = ctx.vars
        profile = dict(recipe_mod.load(hv.get("recipe")).profile)
        profile.update(_mapping(hv.get("engine_profile"), "engine_profile"))
        for var, key in (("model_path", "model_path"), ("draft_model_path", "draft_model_path"),
                         ("served_model_name", "served_model_name"), ("engine_port", "port"),
                         ("launch_module", "launch_module"), ("extra_flags", "extra_args")):
            if hv.get(var) not in (None, ""):
                profile[key] = hv[var]
    if is_lab(ctx):
        profile.setdefault("launch_module", LAB_MODULE)
    profile["release_dir"] = f"{ctx.releases_root}/current"
    return profile


def is_lab(ctx: HostContext) -> bool:
    return ctx.vars.get("lab") is True


def engine_env(ctx: HostContext, params: dict) -> dict:
    """The env file's variables: inventory `engine_env`, HF_TOKEN from the
    inventory (hf_token/HF_TOKEN) or this control node's environment, CUDA_HOME
    from the toolchain step, and PYTHONPATH for the lab stand-in."""
    hv = ctx.vars
    env = {str(k): v for k, v in _mapping(hv.get("engine_env"), "engine_env").items()}
    for var in ("hf_token", "HF_TOKEN"):
        if hv.get(var) not in (None, "") and "HF_TOKEN" not in env:
            env["HF_TOKEN"] = hv[var]
    for name in params.get("pass_env", PASS_ENV):
        if name not in env and os.environ.get(name):
            env[name] = os.environ[name]
    cuda = ctx.shared.get("cuda_home") or hv.get("cuda_home")
    if cuda and "CUDA_HOME" not in env:
        env["CUDA_HOME"] = cuda
    if is_lab(ctx):
        env["PYTHONPATH"] = LAB_MODULE_DIR
    return env


def poll_target(profile: dict) -> tuple[str, int]:
    host = str(profile.get("host") or "127.0.0.1")
    if host in ("0.0.0.0", "::", ""):
        host = "127.0.0.1"
    return host, int(profile.get("port") or 30000)


def _secrets(ctx: HostContext, env: dict, old_env_text: str | None = None) -> list[str]:
    out = units.secrets_of(env)
    if old_env_text:
        out += [v for k, v, _s, _e in units.parse_env(old_env_text) if units.is_secret_key(k) and v]
    for k, v in ctx.vars.items():
        if isinstance(v, str) and v and units.is_secret_key(k):
            out.append(v)
    for name in PASS_ENV:
        if os.environ.get(name):
            out.append(os.environ[name])
    return sorted(set(out), key=len, reverse=True)


def outcome(ctx: HostContext) -> dict:
    """The host's report data (the caller passes shared={"outcome": {}} and reads it back)."""
    return ctx.shared.setdefault("outcome", {})


def _svc(ctx: HostContext, params: dict) -> dict:
    """What the service step learned (unit, port, poll base), or defaults when it did not run."""
    svc = ctx.shared.get("service")
    if svc is None:
        profile = engine_profile(ctx)
        host, port = poll_target(profile)
        svc = {"unit": unit_name(params, ctx.vars), "port": port, "host": host, "changed": False,
               "env_path": env_path(params, ctx.vars), "secrets": _secrets(ctx, engine_env(ctx, params))}
        ctx.shared["service"] = svc
    return svc


# ---------------------------------------------------------------- service step

@register
class ServiceStep(Step):
    """Install the engine's unit + env file; restart only on a change."""

    name = "service"

    def plan(self, ctx: HostContext) -> list[Change]:
        p = self.params
        unit = unit_name(p, ctx.vars)
        upath = f"{UNIT_DIR}/{unit}"
        epath = env_path(p, ctx.vars)
        profile = engine_profile(ctx)
        env = engine_env(ctx, p)
        units.engine_argv(profile)  # profile errors before any host access
        lab_path = f"{LAB_MODULE_DIR}/{LAB_MODULE}.py" if is_lab(ctx) else None
        cur = agent(ctx.session, "read", unit=unit, unit_path=upath, env_path=epath,
                    current=f"{ctx.releases_root}/current", lab_module=lab_path)
        release_id = ctx.shared.get("release_id") or (os.path.basename(cur["current"]) if cur["current"] else None)
        settings = {k: v for k, v in _mapping(ctx.vars.get("unit_settings"), "unit_settings").items()
                    if k in units.UNIT_DEFAULTS}
        unit_text = units.render_unit({**settings, "profile": profile, "release_id": release_id,
                                       "env_file": epath})
        env_text = units.render_env({"env": env})
        secrets = _secrets(ctx, env, cur["env"])
        show = cur["show"]
        host, port = poll_target(profile)
        svc = {"unit": unit, "unit_path": upath, "env_path": epath, "port": port, "host": host,
               "secrets": secrets, "changed": False, "base": None, "show": show}
        ctx.shared["service"] = svc

        changes: list[Change] = []
        todo: dict = {}
        reasons = []
        if cur["unit"] != unit_text:
            verb = "install" if cur["unit"] is None else "update"
            changes.append(Change(f"{verb} {upath} (checked with systemd-analyze verify first)",
                                  units.redact(text_diff(upath, cur["unit"], unit_text), secrets)))
            todo["unit_text"] = unit_text
            reasons.append("unit")
        if cur["env"] != env_text:
            verb = "install" if cur["env"] is None else "update"
            changes.append(Change(f"{verb} {epath} (mode 0600)",
                                  units.redact(text_diff(epath, cur["env"], env_text), secrets)))
            todo["env_text"] = env_text
            reasons.append("env file")
        elif cur["env_mode"] not in (None, 0o600):
            changes.append(Change(f"chmod 0600 {epath} (was {cur['env_mode']:04o})"))
            todo["env_mode"] = True
        if lab_path:
            data = STANDIN.read_text()
            import hashlib
            if cur["lab_module_sha"] != hashlib.sha256(data.encode()).hexdigest():
                changes.append(Change(f"install lab engine stand-in as {lab_path}"))
                todo["lab_module_text"] = data
                reasons.append("lab engine module")
        if ctx.shared.get("release_changed"):
            reasons.append("release")
        if show.get("UnitFileState") != "enabled":
            changes.append(Change(f"enable {unit}"))
            todo["enable"] = True
        active = show.get("ActiveState") in ("active", "activating", "reloading")
        if reasons and active:
            changes.append(Change(f"restart {unit} ({', '.join(reasons)} changed)"))
            todo["restart"] = True
        elif not active:
            changes.append(Change(f"start {unit} (was {show.get('ActiveState') or 'not installed'})"))
            todo["start"] = True
        svc["todo"] = todo
        svc["restart_reasons"] = reasons
        return changes

    def apply(self, ctx: HostContext, changes: list[Change]) -> None:
        svc = ctx.shared["service"]
        todo = svc["todo"]
        ctx.progress(f"service: installing {svc['unit']}")
        res = agent(ctx.session, "apply", timeout=700, unit=svc["unit"], unit_path=svc["unit_path"],
                    env_path=svc["env_path"], state_dir=ctx.state_dir,
                    lab_module=f"{LAB_MODULE_DIR}/{LAB_MODULE}.py", **todo)
        if not res.get("ok"):
            out = units.redact(res.get("output") or "", svc["secrets"])
            if res.get("error") == "verify":
                lines = [l for l in out.splitlines() if l.strip()]
                raise StepFailed(f"systemd-analyze verify rejected the new {svc['unit']}; the installed unit "
                                 f"was left in place: {' | '.join(lines[-3:])[:400]}")
            svc["changed"] = True  # files may have been replaced: a later failure rolls back
            raise StepFailed(f"systemctl {res.get('error')} {svc['unit']} failed: "
                             f"{' '.join(out.split())[-300:]}")
        svc["changed"] = True
        svc["restarted"] = bool(todo.get("restart") or todo.get("start"))
        show = res["show"]
        if svc["restarted"]:
            svc["base"] = {k: show.get(k) for k in ("MainPID", "NRestarts", "InvocationID")}
        outcome(ctx)["engine_restarted"] = svc["restarted"]


# ---------------------------------------------------------------- rollback

def rollback(ctx: HostContext, svc: dict) -> str:
    """Put back the previous unit, env file and `current`, restart; a short phrase for the report."""
    if not (svc.get("changed") or ctx.shared.get("release_changed")):
        return "nothing to roll back (this run changed neither unit, env file nor release)"
    prev = ctx.shared.get("previous_release") if ctx.shared.get("release_changed") else None
    ctx.progress("rolling back to the previous unit, env file and release")
    try:
        res = agent(ctx.session, "rollback", timeout=700, unit=svc["unit"],
                    unit_path=svc.get("unit_path") or f"{UNIT_DIR}/{svc['unit']}",
                    env_path=svc["env_path"], state_dir=ctx.state_dir,
                    current=f"{ctx.releases_root}/current", previous_release=prev)
    except StepFailed as exc:
        return f"rollback failed: {exc}"
    if not res.get("ok"):
        return f"rollback failed: {res.get('error')}"
    if not res.get("had_unit"):
        return "no previous engine: the new unit was stopped and removed"
    # The previous engine is back; say whether it answers again.
    show = res["show"]
    base = {k: show.get(k) for k in ("MainPID", "NRestarts", "InvocationID")}
    timeout = float(ctx.vars.get("rollback_health_timeout") or ctx.vars.get("health_timeout") or DEFAULT_HEALTH_TIMEOUT)
    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout:
        r = agent(ctx.session, "poll", timeout=120, unit=svc["unit"], port=svc["port"], host=svc["host"],
                  base=base, window=5.0)
        if r["state"] == "healthy":
            what = "unit, env file" + (" and release" if prev else "")
            return f"rolled back the {what}; the previous engine is healthy again"
        if r["state"] == "crashed":
            return "rolled back, but the previous engine crashed too"
    return "rolled back, but the previous engine is not healthy yet"


# ---------------------------------------------------------------- health

def _fail(ctx: HostContext, svc: dict, message: str, journal: str = "", diag=None) -> None:
    ctx.progress(f"failed: {message}")
    back = rollback(ctx, svc)
    outcome(ctx)["rollback"] = back
    raise EngineFailed(f"{message}; {back}", journal, diag)


@register
class HealthStep(Step):
    """Wait until the engine answers /health and /health_generate; fail at once on a crash."""

    name = "health"

    def plan(self, ctx: HostContext) -> list[Change]:
        if ctx.check:
            return []
        from k26ops.diagnose.classify import classify

        svc = _svc(ctx, self.params)
        timeout = float(self.params.get("timeout") or ctx.vars.get("health_timeout") or DEFAULT_HEALTH_TIMEOUT)
        base = svc.get("base")
        t0 = time.monotonic()
        last = ""
        while True:
            el = time.monotonic() - t0
            window = max(0.5, min(float(self.params.get("window", 2.0)), timeout - el))
            r = agent(ctx.session, "poll", timeout=window + 90, unit=svc["unit"], port=svc["port"],
                      host=svc["host"], base=base, window=window)
            base = r.get("base") or base
            el = time.monotonic() - t0
            if r["state"] == "healthy":
                ctx.progress(f"health: healthy after {el:.0f}s")
                outcome(ctx)["health"] = {"state": "healthy", "wait_s": round(el, 2)}
                return []
            if r["state"] == "crashed":
                text = units.redact(r.get("journal") or "", svc["secrets"])
                d = classify(text)
                show = r.get("show") or {}
                status = show.get("ExecMainStatus")
                msg = (f"{svc['unit']} crashed {el:.1f}s into the health wait ({r['why']}"
                       + (f", exit status {status}" if status else "") + f"): {d.signature}"
                       + (f": {d.evidence[:240]}" if d.evidence else ""))
                outcome(ctx)["health"] = {"state": "crashed", "wait_s": round(el, 2), "signature": d.signature}
                tail = "\n".join(text.splitlines()[-40:])
                _fail(ctx, svc, msg, tail, d.to_json())
            if r.get("last_line"):
                last = units.redact(r["last_line"], svc["secrets"])
            ctx.progress(f"health: {r['state']} {el:.0f}s" + (f": {last}" if last else ""))
            if el >= timeout:
                outcome(ctx)["health"] = {"state": "timeout", "wait_s": round(el, 2)}
                _fail(ctx, svc, f"{svc['unit']} not healthy after {timeout:.0f}s ({r['state']}, "
                                f"/health {r.get('health')})" + (f"; last log line: {last}" if last else ""))

    def apply(self, ctx, changes):  # pragma: no cover - plan never returns changes
        pass


# ---------------------------------------------------------------- smoke

@register
class SmokeStep(Step):
    """One short /generate must return text; record latency and spec_accept_length."""

    name = "smoke"

    def plan(self, ctx: HostContext) -> list[Change]:
        if ctx.check:
            return []
        svc = _svc(ctx, self.params)
        prompt = str(self.params.get("prompt") or "Say hello in one short sentence.")
        n = int(self.params.get("max_new_tokens") or 16)
        r = agent(ctx.session, "smoke", timeout=float(self.params.get("timeout") or 120) + 30, port=svc["port"],
                  host=svc["host"], prompt=prompt, max_new_tokens=n, timeout_s=float(self.params.get("timeout") or 120))
        body = r.get("body")
        text = body.get("text") if isinstance(body, dict) else None
        if r["status"] != 200 or not isinstance(text, str) or not text.strip():
            why = f"HTTP {r['status']}" if r["status"] else "no answer"
            detail = units.redact(json.dumps(body)[:200] if isinstance(body, dict) else str(body)[:200], svc["secrets"])
            outcome(ctx)["smoke"] = {"ok": False, "status": r["status"]}
            _fail(ctx, svc, f"smoke request to /generate failed ({why}): {detail}")
        meta = body.get("meta_info") or {}
        acc = meta.get("spec_accept_length")
        rec = {"ok": True, "latency_s": r["latency_s"], "spec_accept_length": acc,
               "completion_tokens": meta.get("completion_tokens"), "text": text[:80]}
        ctx.shared["smoke"] = rec
        outcome(ctx)["smoke"] = rec
        ctx.progress(f"smoke: answered in {r['latency_s'] * 1000:.0f} ms, spec_accept_length {acc}")
        return []

    def apply(self, ctx, changes):  # pragma: no cover
        pass
