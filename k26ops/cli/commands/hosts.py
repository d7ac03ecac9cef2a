"""`k26ops facts` and `k26ops check`: read hosts, change nothing."""

from __future__ import annotations

import click
from rich.markup import escape

from k26ops import facts as facts_mod
from k26ops.cli.report import run_and_report, wide_console
from k26ops.facts.platform import platform_fact
from k26ops.host import preflight
from k26ops.release import installer, wheelsource
from k26ops.traffic.drain import TrafficConfig
from k26ops.transport.fleet import Outcome


def _gather(session, want: dict | None = None):
    """Every fact in one call; with `want` (preflight.engine_wanted) the model, drafter and platform too."""
    extra = preflight.host_facts(session.host.vars) + (preflight.engine_facts(want) + [platform_fact()] if want else [])
    return facts_mod.gather(session, extra=extra)


@click.command(name="facts")
@click.pass_obj
def facts_cmd(settings):
    """Show each host's facts (GPUs, GPU health, interconnect, driver and module flavour, NVSwitches, CUDA, OS, python, disk, systemd)."""

    def work(session):
        f = _gather(session)
        g = f["gpus"]
        return Outcome(
            facts=f,
            gpus=g.get("count"),
            gpu=(g["gpus"][0]["name"] if g.get("gpus") else g.get("error")),
            cc=", ".join(sorted({x["compute_cap"] for x in g.get("gpus", []) if x.get("compute_cap")})),
            link=f["gpu_topology"].get("interconnect"),
            driver=f["nvidia_smi"].get("driver_version"),
            health=preflight.health_summary(f),
            modules=(f.get("nvidia_module") or {}).get("flavour") or "-",
            nvswitch=len((f.get("nvswitch") or {}).get("pci_switches") or []),
            cuda=(f["cuda_toolkit"] or {}).get("version"),
            os=" ".join(str((f["os_release"] or {}).get(k) or "") for k in ("id", "version_id")).strip(),
            python=(f["python3"] or {}).get("version"),
        )

    run_and_report(
        settings,
        work,
        title="facts",
        columns=[
            ("GPUs", "gpus"),
            ("GPU", "gpu"),
            ("cc", "cc"),
            ("health", "health"),
            ("link", "link"),
            ("driver", "driver"),
            ("modules", "modules"),
            ("NVSwitch", "nvswitch"),
            ("nvcc", "cuda"),
            ("OS", "os"),
            ("python", "python"),
        ],
    )


@click.command(name="check")
@click.pass_obj
def check_cmd(settings):
    """Preflight: compare each host with what the inventory expects for the TP8 profile."""

    wanted = {h.name: preflight.engine_wanted(h.vars) for h in settings.selected_hosts()}  # bad recipe: exit 2
    recipes = {h.name: preflight.recipe_lock(h.vars) for h in settings.selected_hosts()}
    launch = {h.name: preflight.launch_check(h.vars) for h in settings.selected_hosts()}  # deploy refuses these
    for h in settings.selected_hosts():  # inventory values a deploy refuses before any host: exit 2 here too
        installer.choice(h.vars, h.name)
        wheelsource.settings(h)
    traffic = {h.name: TrafficConfig.of(h) for h in settings.selected_hosts()}  # bad traffic vars: exit 2

    def work(session):
        want = wanted[session.host.name]
        checks = [preflight.recipe_check(recipes[session.host.name])]
        gathered = _gather(session, want)
        if recipes[session.host.name]["ok"]:  # the lock against this host (python, platform, GPUs)
            checks.append(preflight.lock_check(session.host.vars, gathered))
        checks.append(launch[session.host.name])
        checks += preflight.evaluate(
            gathered,
            {
                **session.host.vars,
                "_drafter": want["drafter"],
                "_model_path": want["model_path"],
                "_weights": want.get("weights"),
            },
        )
        if traffic[session.host.name].configured:
            checks.append(preflight.Check("traffic", *traffic[session.host.name].check()))
        failed = [c for c in checks if not c.ok]
        if failed:
            raise PreflightFailed("; ".join(f"{c.name}: {c.detail}" for c in failed))
        return Outcome(checks=[c.to_json() for c in checks], verdict="pass")

    def render(results):
        """A failed check is the host's error (below the table); the passing ones with -v only."""
        con = wide_console()  # piped: never wrapped
        if settings.verbose:
            for r in results:
                for c in r.data.get("checks", []):
                    con.print(f"  {r.host}: [green]ok[/] {c['check']}: {escape(c['detail'])}", highlight=False)
        if not any(t.configured for t in traffic.values()):  # said once, not per host: not ok for traffic
            con.print(
                "  traffic: no host names a model_gateway, drain_hook or drain mode: an engine restart "
                "drops its in-flight requests, as before (docs/how-to/gateway-and-drain.md)",
                highlight=False,
            )

    run_and_report(settings, work, title="preflight", columns=[("verdict", "verdict")], render=render)


class PreflightFailed(Exception):
    pass
