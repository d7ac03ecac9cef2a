"""`k26ops config show`: the effective defaults and where each came from
(flag, environment, ~/.config/k26ops/config.toml, built-in; see k26ops.config)."""

from __future__ import annotations

import click

from k26ops import config
from k26ops.cli import jsonout
from k26ops.cli.context import Settings


@click.group(name="config")
def group():
    """The config file (~/.config/k26ops/config.toml or $K26OPS_CONFIG)."""


def effective(settings: Settings) -> dict:
    """setting -> {"value", "source"}."""
    out = {}
    inv_source = settings.sources.get("inventory", "default")
    if settings.inventory:
        out["inventory"] = {"value": settings.inventory, "source": inv_source}
    else:
        lab_inv = settings.lab_path / "inventory.yml"
        out["inventory"] = {
            "value": str(lab_inv) if lab_inv.exists() else None,
            "source": "the running lab's" if lab_inv.exists() else "none (no lab running)",
        }
    path, source = config.baselines_dir()
    out["baselines"] = {"value": str(path), "source": source}
    path, source = config.recipes_dir()
    out["recipes"] = {"value": str(path), "source": source}
    for name in ("forks", "deadline", "connect_timeout"):
        out[name] = {"value": getattr(settings, name), "source": settings.sources.get(name, "default")}
    pattern = config.load().get("targets")
    out["targets"] = {
        "value": pattern,
        "source": f"config {config.config_path()}"
        if pattern
        else "default (the hosts that set gpus_per_host, else every host)",
    }
    batch = config.load().get("batch")
    out["batch"] = {
        "value": batch,
        "source": f"config {config.config_path()}"
        if batch
        else "default (deploy/rollback: one host at a time where a gateway or drain_hook is set, else all)",
    }
    return out


@group.command("show")
@click.pass_obj
def show_cmd(settings: Settings):
    """Effective settings and where each came from."""
    path = config.config_path()
    rows = effective(settings)
    if settings.as_json:
        jsonout.emit({"config_file": str(path), "config_file_exists": path.exists(), "settings": rows}, indent=2)
        return
    click.echo(f"config file: {path}" + ("" if path.exists() else " (none)"))
    width = max(len(n) for n in rows)
    for name, row in rows.items():
        value = "-" if row["value"] is None else row["value"]
        click.echo(f"{name:<{width}}  {value}  ({row['source']})")
