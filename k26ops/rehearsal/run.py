"""One host's rehearsal: the release's own engine, the unit's command line,
dummy weights; then ready-wait, smoke, short bench, stop, and a report.

The engine is started by the `rehearse` host agent in a private temp dir
(transient systemd unit, or its own process group where there is no
systemd) with a deadline on the host, and is ALWAYS stopped (finally:
failure, timeout, Ctrl-C) with its temp dir removed; the report says what,
if anything, was left. The serving engine is never touched unless the
caller asked (`serving="stop"`: stopped for the rehearsal, started again and
waited for afterwards).
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass

from k26ops import facts
from k26ops.engine import launch, secret_policy
from k26ops.engine.host import LAB_MODULE, EngineHost, lab_standin_text, wait_ready
from k26ops.engine.profile import effective_recipe
from k26ops.enginebench.run import BenchSpec, run_host
from k26ops.errors import UserError
from k26ops.facts import engine_cache
from k26ops.rehearsal import plan
from k26ops.runstate import HostState
from k26ops.shell import q
from k26ops.steps import HostContext, StepFailed, warmstart
from k26ops.steps.engine import SmokeStep, smoke_requests
from k26ops.traffic import drain as drain_mod
from k26ops.traffic.gateway import GatewayError
from k26ops.transport import agents

PROBE_STATE = "rehearse-probe-state"


class RehearsalFailed(StepFailed):
    """The rehearsal ran and the engine failed it (or could not start): one line,
    plus the report, the named crash and the log tail for the host's result."""

    def __init__(self, message: str, report: dict):
        super().__init__(message)
        self.report = report
        self.details = {
            "rehearsal": report,
            "diagnosis": report.get("diagnosis") or {},
            "journal_tail": report.get("log_tail") or "",
        }


def agent(session, op: str, timeout: float = 120.0, **req) -> dict:
    return agents.run(session, "rehearse", op, timeout, what="rehearse agent", **req)


def options_for(ctx: HostContext, opts: plan.Options) -> tuple[plan.Options, object]:
    """The caller's options over the recipe's `rehearsal:` defaults; (options, recipe)."""
    r = effective_recipe(ctx)
    rh = r.rehearsal
    o = plan.Options(**opts.to_json())
    if rh:
        o.layers = o.layers if o.layers is not None else rh.layers
        o.tp_size = o.tp_size or rh.tp_size
        o.mem_fraction = (
            rh.mem_fraction if (rh.mem_fraction and opts.mem_fraction == plan.Options.mem_fraction) else o.mem_fraction
        )
        o.expected_load_s = o.expected_load_s if o.expected_load_s is not None else rh.expected_load_s
        o.draft_dummy_flag = rh.draft_dummy_flag and o.draft_dummy_flag
    return o, r


def _configs(ctx, eh_profile: dict, recipe, opts: plan.Options, report: dict) -> tuple[dict, dict | None]:
    """The model and drafter specs for the agent: the host's own config.json
    (and small files) where it has one, else the recipe's, fitted to the layers."""
    model_path = str(eh_profile.get("model_path") or "")
    draft_path = eh_profile.get("draft_model_path")
    have = agent(ctx.session, "configs", model_path=model_path, draft_path=draft_path)
    rh = recipe.rehearsal
    specs = {}
    for key, path, host_cfg, file in (
        ("model", model_path, have.get("model"), rh and rh.model_config),
        ("draft", draft_path, have.get("draft"), rh and rh.draft_config),
    ):
        if key == "draft" and not path:
            continue
        if isinstance(host_cfg, dict):
            specs[key] = {"config": host_cfg, "copy_from": path}
            report["notes"].append(f"{key} config: {path}/config.json on the host")
        elif file:
            try:
                specs[key] = {"config": json.loads(file.read_text())}
            except OSError as exc:
                raise UserError(f"{recipe.source}: rehearsal.{key}_config {file}: {exc.strerror}") from None
            except ValueError as exc:
                raise UserError(f"{file}: not a JSON config: {exc}") from None
            report["notes"].append(f"{key} config: {file.name} from the recipe (the host has no {path}/config.json)")
        else:
            raise StepFailed(
                f"rehearsal: no config.json at {path} on the host and the recipe "
                f"{recipe.name} has no rehearsal.{key}_config: nothing to build dummy weights from"
            )
    specs["model"]["config"], notes = plan.fit_model(specs["model"]["config"], opts.layers)
    report["notes"] += notes
    n = plan.layer_count(specs["model"]["config"])
    report["layers"] = n
    if "draft" in specs:
        specs["draft"]["config"], notes = plan.fit_draft(specs["draft"]["config"], n)
        report["notes"] += notes
    return specs["model"], specs.get("draft")


def vocab_size(config: dict) -> int:
    """The model's vocabulary size (a multimodal model's text_config too); 1000 when unknown."""
    return int(config.get("vocab_size") or (config.get("text_config") or {}).get("vocab_size") or 1000)


def token_ids(config: dict, n: int = 16) -> list[int]:
    """A fixed prompt of token ids inside the model's vocabulary (no tokenizer)."""
    hi = max(2, min(vocab_size(config), 32000))
    return [(i * 7919 + 11) % (hi - 1) + 1 for i in range(n)]


def _release_site(ctx, release_dir: str) -> dict:
    r = agent(ctx.session, "release", release=release_dir)
    if not r.get("ok"):
        raise StepFailed(f"rehearsal --probe: {r.get('error')}")
    return r


def rehearse(
    ctx: HostContext,
    opts: plan.Options,
    *,
    release_dir: str | None = None,
    env: dict | None = None,
    progress=lambda m: None,
) -> dict:
    """Rehearse on one host; the report (dict). Raises RehearsalFailed when the
    engine crashed or did not serve, StepFailed/UserError when it could not run."""
    # lazy: the crash signatures and their tables (about 20-50 ms) only when a log is classified
    from k26ops.diagnose.classify import classify

    opts, recipe = options_for(ctx, opts)
    eh = EngineHost(ctx)
    profile = eh.profile()
    layout = eh.layout
    if opts.release:
        release_dir = f"{layout.releases_root}/{opts.release}"
    release_dir = release_dir or layout.current
    profile["release_dir"] = release_dir
    unit_argv = launch.engine_argv(profile)
    serving_port = eh.target()[1]
    port = opts.port or serving_port + 100
    t0 = time.monotonic()
    report: dict = {"release": release_dir, "notes": [], "options": opts.to_json(), "state": "starting"}
    secrets = eh.secrets()
    record = plan.record_path(layout.state_dir)
    # a killed rehearsal's engine, temp dir and secrets' env file (callers hold the host lock: it is dead)
    old = agent(ctx.session, "leftovers", record=record, remove=True, timeout=300)
    if old.get("alive"):
        report["notes"].append("removed what a killed rehearsal left: " + ", ".join(old["alive"]))

    chk = agent(ctx.session, "check", port=port, unit=eh.unit, python=unit_argv[0], release=release_dir)
    if not chk.get("python_exists"):
        raise StepFailed(f"rehearsal: no engine python at {unit_argv[0]} (release {release_dir} not built?)")
    # the refusals in the order a user acts on them: which engine holds the GPUs decides the
    # options (--alongside, --stop-serving) before the port matters
    serving = chk.get("serving") in ("active", "activating", "reloading")
    report["serving_engine"] = chk.get("serving")
    if serving and opts.serving == "refuse":
        raise StepFailed(
            f"rehearsal refused: the serving engine {eh.unit} is {chk.get('serving')} and holds "
            "the GPUs; nothing changed. Pass --alongside to rehearse beside it in the GPUs' free "
            "memory, or --stop-serving to stop it for the rehearsal (it is started again after)"
        )
    if not chk.get("port_free"):
        raise StepFailed(
            f"rehearsal: port {port} on the host is taken (the rehearsal engine listens on the "
            f"serving port + 100 unless told); nothing changed. Pick a free one with --rehearse-port"
        )
    model, draft = _configs(ctx, profile, recipe, opts, report)
    argv, changes = plan.rehearsal_argv(unit_argv, opts, port=port, has_draft=draft is not None)
    report["changes"] = changes
    report["argv"] = secret_policy.redact(" ".join(argv), secrets)
    report["cuda_graphs"] = plan.graphs_on(argv)
    env = dict(eh.env() if env is None else env)
    cache, env = _cache(ctx, chk.get("release_id"), argv, env, report, unit_argv)
    files = {}
    if eh.is_lab:  # the lab stand-in, in the temp dir: a release being rehearsed has no unit yet
        files["lab/" + LAB_MODULE + ".py"] = lab_standin_text()
        env["PYTHONPATH"] = plan.TMP + "/lab"
    probe = None
    if opts.probe:
        probe = _apply_probe(ctx, release_dir, report, progress)
    stopped_serving = False
    handle = drain = None
    try:
        if serving and opts.serving == "stop":
            drain = drain_mod.for_session(ctx.session, progress, ctx.vars)
            if drain:  # out of rotation and drained before the stop; back once it serves again
                drain.take_out()
            progress(f"stopping the serving engine {eh.unit} for the rehearsal")
            stopped_serving = True  # before: an interrupt during the stop still starts it again
            ctx.run(f"systemctl stop {q(eh.unit)}", check=True, timeout=drain_stop_timeout(drain))
        progress(f"starting the engine on dummy weights (port {port})")
        st = agent(
            ctx.session,
            "start",
            argv=argv,
            env=env,
            model=model,
            draft=draft,
            files=files,
            deadline_s=opts.deadline_s,
            record=record,
        )
        if not st.get("ok"):
            raise StepFailed(
                f"rehearsal: the engine could not be started: {secret_policy.redact(st.get('error') or '', secrets)}"
            )
        handle = st["handle"]
        report["started_at"], report["tz_offset"] = st.get("at"), st.get("tz_offset") or 0
        report["runner"] = (
            "transient unit " + handle["unit"]
            if handle["kind"] == "unit"
            else f"process group {handle['pgid']} (no systemd)"
        )
        report["notes"] += st.get("notes") or []
        _serve(ctx, opts, report, handle, port, model, secrets, progress, smoke_requests(_smoke_params(ctx)), t0)
    finally:
        if handle:
            progress("stopping the rehearsal engine and removing its temp dir")
            stop = agent(ctx.session, "stop", timeout=300, handle=handle, with_log=True, record=record)
            log = secret_policy.redact(stop.get("log") or "", secrets)
            report["cleanup"] = {"done": stop.get("done"), "left": stop.get("left")}
            report["capture"] = plan.capture_times(log, report.get("metrics"))
            report["engine_lines"] = plan.engine_lines(log)
            report["log_tail"] = "\n".join(log.splitlines()[-40:])
            if report["state"] != "served":
                d = classify(log, recipe.base)
                report["diagnosis"] = d.to_json()
            report["_log"] = log
            _filled(ctx, cache, report, log)
        if probe is not None:
            _revert_probe(ctx, probe, report, report.get("_log") or "")
        if stopped_serving:
            _restart_serving(ctx, eh, secrets, report, progress, drain)
    report["elapsed_s"] = round(time.monotonic() - t0, 1)
    if report["state"] != "served":
        d = report.get("diagnosis") or {}
        saved = (
            f"; caught before the real model load (the recipe expects {opts.expected_load_s:.0f} s of it)"
            if opts.expected_load_s and d.get("signature") not in (None, "unclassified")
            else ""
        )
        report["saved_s"] = opts.expected_load_s if saved else None
        raise RehearsalFailed(
            f"rehearsal: {report['why']}"
            + (f": {d['signature']}: {d.get('evidence', '')[:200]}" if d.get("signature") else "")
            + saved,
            report,
        )
    left = (report.get("cleanup") or {}).get("left")
    if left:
        raise RehearsalFailed("rehearsal: the engine was stopped but left " + ", ".join(left), report)
    return report


def _smoke_params(ctx) -> dict:
    """The deploy's own smoke step's settings (its sampled request), so that the rehearsal
    compiles what the real start's first requests need; {} outside a deploy."""
    smoke = next((s for s in getattr(ctx, "steps", None) or () if isinstance(s, SmokeStep)), None)
    return dict(smoke.params) if smoke else {}


def _cache(ctx, release_id, argv, env, report, unit_argv) -> tuple:
    """The release's engine cache for the rehearsal's command line (the dir the unit's start
    will read, unless the rehearsal's TP size differs: a note says so), made root-only;
    (its plan, env with its variables)."""
    if not release_id:
        return None, env
    gpus = warmstart.gpus_of(ctx.facts) or warmstart.gpus_of(facts.gather(ctx.session, ["gpus"]))
    cache, env = warmstart.cache_for(ctx.vars, warmstart.engine_version_for(ctx), release_id, argv, gpus, env)
    got = agents.run(ctx.session, "engine", "cache", what="host agent", cache=cache.request(), make=True)
    report["engine_cache"] = {**cache.to_json(), "before": got.get("cache")}
    if cache.kept:
        report["notes"].append(engine_cache.kept_note(cache.kept))
    other = engine_cache.other_key_note(argv, unit_argv, gpus)
    if other:
        report["notes"].append(other)
    return cache, env


def _filled(ctx, cache, report, log: str) -> None:
    """After the rehearsal: what it left in the release's cache for the real start, and its
    own time to first good token (from its start: there was no stop)."""
    smoke = report.get("smoke") or {}
    report["ttfgt"] = warmstart.timeline(
        stop_at=None,
        started_at=report.pop("started_at", None),
        ready_at=report.pop("ready_at", None),
        greedy_at=(smoke.get("greedy") or {}).get("at"),
        sampled_at=(smoke.get("sampled") or {}).get("at"),
        log=log,
        tz_offset=report.pop("tz_offset", 0),
        metrics=report.get("metrics"),
        started_source="k26ops",
    )
    if cache is None:
        return
    try:
        after = agents.run(ctx.session, "engine", "cache", what="host agent", cache=cache.request()).get("cache")
    except StepFailed:
        after = None
    c = report["engine_cache"]
    c["after"] = after
    c["filled"] = engine_cache.grew(c.get("before"), after)


def _serve(ctx, opts, report, handle, port, model, secrets, progress, requests, t0) -> None:
    """Ready-wait, smoke, bench: fills the report; sets state 'served' only when all answered."""

    def poll(window, req):
        return agent(ctx.session, "poll", timeout=window + 200, handle=handle, port=port, window=window, **req)

    w = wait_ready(
        ctx.session,
        "",
        "127.0.0.1",
        port,
        base=None,
        timeout=opts.ready_timeout,
        secrets=secrets,
        interruptible=True,
        poll=poll,
        on_wait=lambda r: progress(
            f"waiting for the engine: {r.poll.get('state')} {r.elapsed:.0f}s"
            + (f": {r.last_line}" if r.last_line else "")
        ),
    )
    report["ready_s"] = round(w.elapsed, 1)
    report["ready_at"] = w.poll.get("at")
    if w.state != "healthy":
        report["state"] = "crashed" if w.state == "crashed" else w.state
        report["why"] = (
            f"the engine crashed while starting ({w.poll.get('why')}) after {w.elapsed:.0f}s"
            if w.state == "crashed"
            else f"the engine was not ready after {w.elapsed:.0f}s ({w.state})"
        )
        return
    progress(f"ready after {w.elapsed:.0f}s; smoke requests (token ids)")
    ids = token_ids(model["config"])
    s = agent(
        ctx.session,
        "smoke",
        timeout=opts.request_timeout * len(requests) + 60,
        handle=handle,
        port=port,
        requests=requests,
        input_ids=ids,
        max_new_tokens=32,
        timeout_s=opts.request_timeout,
    )
    report["smoke"] = {r["name"]: _smoke_record(r) for r in s["results"]}
    if s.get("failed"):
        last = s["results"][-1]
        if s.get("crash"):
            report["state"], report["why"] = (
                "crashed",
                (
                    f"the engine crashed on the {s['failed']} request "
                    f"(temperature {last['sampling'].get('temperature')})"
                ),
            )
        else:
            report["state"] = "failed"
            report["why"] = (
                f"the {s['failed']} request failed (HTTP {last['status']}: "
                f"{secret_policy.redact(str(last['body'])[:200], secrets)}); the engine did not die"
            )
        return
    greedy = report["smoke"].get("greedy") or {}
    report["accept_length"] = greedy.get("spec_accept_length")
    if opts.bench:
        _bench(ctx, opts, report, port, model, progress)
    m = agent(ctx.session, "metrics", port=port)
    report["metrics"] = _metrics(m.get("text") or "")
    report["state"] = "served"


def _smoke_record(r: dict) -> dict:
    body = r["body"] if isinstance(r["body"], dict) else {}
    meta = body.get("meta_info") or {}
    keep = (
        "spec_accept_length",
        "spec_verify_ct",
        "completion_tokens",
        "prompt_tokens",
        "spec_accept_rate",
        "spec_num_correct_drafts",
        "spec_num_proposed_drafts",
        "finish_reason",
    )
    return {
        "status": r["status"],
        "latency_s": r["latency_s"],
        "sampling": r["sampling"],
        "at": r.get("at"),
        **{k: meta.get(k) for k in keep if k in meta},
        "output_ids": (body.get("output_ids") or [])[:16],
    }


def _bench(ctx, opts, report, port, model, progress) -> None:
    """A short bench through k26ops' own load generator (token ids: no tokenizer)."""
    spec = BenchSpec(
        concurrency=opts.concurrency,
        temperatures=opts.temperatures,
        input_len=opts.input_len,
        output_len=opts.output_len,
        runs=1,
        num_prompts=opts.num_prompts,
        generator="k26ops",
    )
    t = {"host": "127.0.0.1", "port": port, "model": "rehearsal", "tokenizer": "", "python": "", "api_key": None}
    b = run_host(ctx, spec, progress, target_override=t, extra={"token_ids": {"vocab": vocab_size(model["config"])}})
    report["bench"] = b
    first = b["cells"][0]["figures"] if b.get("cells") else {}
    report["tok_s"] = (first.get("tok/s") or {}).get("median")
    if report.get("accept_length") is None:
        report["accept_length"] = (first.get("accept") or {}).get("median")


def _metrics(text: str) -> dict:
    """The few Prometheus lines a rehearsal reports (spec accept, graph capture time)."""
    return warmstart.parse_metrics(
        text, ("spec_accept_length", "spec_verify_calls_total", "cuda_graph_passes") + warmstart.METRIC_NAMES
    )


# ---------------------------------------------------------------- --probe


def _apply_probe(ctx, release_dir: str, report: dict, progress) -> dict:
    # lazy: the crash signatures and their tables (about 20-50 ms) only when a log is classified
    from k26ops.diagnose.probe import probe_patch_for

    info = _release_site(ctx, release_dir)
    patch = probe_patch_for(info.get("base"))
    progress(f"applying the None-field probe ({patch.name}) to {release_dir}")
    before = agent(ctx.session, "hashes", root=info["site"], under="sglang")
    res = agents.run(
        ctx.session,
        "probe",
        "apply_probe",
        300,
        what="probe agent",
        release=info["release"],
        site=info["site"],
        patch_text=patch.read_text(),
        probe_state=PROBE_STATE,
        base=info.get("base"),
    )
    if not res.get("ok"):
        raise StepFailed(f"rehearsal --probe: the probe patch does not apply to {release_dir}: {res.get('error')}")
    report["probe"] = {"patch": patch.name, "files": res.get("files") or []}
    return {"info": info, "before": before["hashes"]}


def _revert_probe(ctx, probe: dict, report: dict, log: str) -> None:
    # lazy: the crash signatures and their tables (about 20-50 ms) only when a log is classified
    from k26ops.diagnose.probe import GRAPH_PATHS, watched_counts, watched_text

    w = watched_counts(log)
    seen = sorted(g for g in GRAPH_PATHS if (w or {}).get("fill_from", {}).get(g))
    report["probe"].update(
        watched=watched_text(w), watched_counts=w, unwatched=[g for g in GRAPH_PATHS if g not in seen]
    )
    if report.get("state") == "served" and not seen:
        report["notes"].append(
            "the probe watched no draft/verify graph copy: the speculative graph path was NOT "
            "checked for None fields (" + watched_text(w) + ")"
        )
    info = probe["info"]
    r = agents.run(
        ctx.session,
        "probe",
        "revert",
        300,
        what="probe agent",
        release=info["release"],
        site=info["site"],
        probe_state=PROBE_STATE,
    )
    after = agent(ctx.session, "hashes", root=info["site"], under="sglang")["hashes"]
    differ = sorted(k for k in set(probe["before"]) | set(after) if probe["before"].get(k) != after.get(k))
    report["probe"].update(
        reverted=r.get("done"), byte_exact=not differ and not r.get("error"), differ=differ[:10], error=r.get("error")
    )


def drain_stop_timeout(drain) -> float:
    """`systemctl stop`'s wait: longer than the unit's TimeoutStopSec where the host drains."""
    return 300.0 if drain is None else max(300.0, float(drain.cfg.timeout_stop_sec() or 0) + 30)


def _restart_serving(ctx, eh, secrets, report, progress, drain=None) -> None:
    progress(f"starting the serving engine {eh.unit} again")
    # the session's own run: ctx.run refuses once interrupted, and this is the restore (an interrupt
    # must not leave the host without its engine)
    ctx.session.run(f"systemctl start {q(eh.unit)}", timeout=600)
    host, port = eh.target()
    w = wait_ready(
        ctx.session,
        eh.unit,
        host,
        port,
        base=None,
        timeout=1800,
        secrets=secrets,
        on_wait=lambda r: progress(f"waiting for the serving engine: {r.poll['state']} {r.elapsed:.0f}s"),
    )
    report["serving_after"] = w.state
    if w.state != "healthy":
        report.setdefault("notes", []).append(
            f"the serving engine {eh.unit} is {w.state} after the rehearsal"
            + ("; left out of rotation" if drain else "")
        )
    elif drain is not None:
        try:
            drain_mod.smoke_before_put_back(drain, ctx.session, eh.unit)
            if drain.cfg.mode in ("gateway", "hook"):
                drain.put_back()
            else:
                drain.serving_again()
        except (StepFailed, GatewayError) as exc:
            report.setdefault("notes", []).append(f"not put back in rotation: {exc}")
        report["traffic"] = drain.record


# ---------------------------------------------------------------- deploy --rehearse


class Gate:
    """`deploy --rehearse`, as the release and service steps see it: called before
    `current` moves or the engine restarts. The deploy puts it in the run's options
    (steps.RunOptions.rehearse), so the steps never import the rehearsal (which is
    built on them)."""

    def __init__(self, options: plan.Options):
        self.options = options

    def __call__(self, ctx: HostContext, *, release_dir: str | None = None, env: dict | None = None) -> None:
        before_restart(ctx, self.options, release_dir=release_dir, env=env)


@dataclass
class Rehearsed(HostState):
    """This host's deploy rehearsed its new engine already (once per run: the release
    step asks before `current` moves, the service step again before the restart)."""

    done: bool = False


def before_restart(
    ctx: HostContext, opts: plan.Options, *, release_dir: str | None = None, env: dict | None = None
) -> None:
    """Rehearse what the deploy is about to run (a new release before `current`
    moves to it, or a new unit/env file before the restart), once per run, beside
    the serving engine. A failed rehearsal raises RehearsalFailed; the serving
    engine was not touched."""
    if Rehearsed.of(ctx).done or ctx.check:
        return
    o = plan.Options(**{**opts.to_json(), "serving": "alongside"})
    ctx.progress("rehearsal: the new engine on dummy weights, before the serving one is touched")
    try:
        rep = rehearse(ctx, o, release_dir=release_dir, env=env, progress=lambda m: ctx.progress("rehearsal: " + m))
    except RehearsalFailed as exc:
        exc.report.pop("_log", None)
        ctx.report.update(rehearsal=exc.report, engine_restarted=False)
        saved = exc.report.get("saved_s")
        failed = RehearsalFailed(
            f"{exc}; the serving engine was not touched (no restart, `current` not moved)"
            + (f"; about {saved:.0f} s of model load not wasted" if saved else ""),
            exc.report,
        )
        failed.details["engine_restarted"] = False
        raise failed from None
    rep.pop("_log", None)
    Rehearsed.of(ctx).done = True
    ctx.report["rehearsal"] = rep
