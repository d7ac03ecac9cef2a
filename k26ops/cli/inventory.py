"""`k26ops inventory` commands."""

import click


@click.group(name="inventory")
def group():
    """(being built)"""
