"""Check a --json document against docs/json (the envelope, then the command's schema)."""

from __future__ import annotations

import json
from pathlib import Path

import jsonschema

SCHEMAS = Path(__file__).resolve().parents[1] / "docs" / "json"


def schema(name: str) -> dict:
    return json.loads((SCHEMAS / f"{name}.schema.json").read_text())


def validate(doc: dict) -> None:
    """Every document fits the envelope; a success fits its command's schema too."""
    jsonschema.validate(doc, schema("envelope"))
    if "error" in doc:
        return
    name = doc["command"].replace(" ", "-")
    path = SCHEMAS / f"{name}.schema.json"
    assert path.exists(), f"no schema for command {doc['command']!r}: add {path}"
    jsonschema.validate(doc, schema(name))
