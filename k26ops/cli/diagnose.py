"""`k26ops diagnose` commands."""

import click


@click.group(name="diagnose")
def group():
    """(being built)"""
