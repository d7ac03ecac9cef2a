"""The docs: the generated reference pages are what the code makes now
(tools/docgen.py), every page is on the site's shelves (mkdocs.yml), and the
README's links lead somewhere. `mkdocs build --strict` (.ci/run) checks the links
between pages; these run in the inner loop.
"""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path

import click
import pytest
import yaml

from k26ops import errors
from k26ops.cli import cli, pipe

ROOT = Path(__file__).resolve().parent.parents[1]
_spec = importlib.util.spec_from_file_location("docgen", ROOT / "tools" / "docgen.py")
docgen = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(docgen)


@pytest.mark.parametrize("page", sorted(docgen.PAGES))
def test_generated_reference_page_is_what_the_code_makes(page):
    path = ROOT / "docs" / "reference" / page
    assert path.is_file(), f"docs/reference/{page} missing: run python3 tools/docgen.py"
    assert path.read_text() == docgen.PAGES[page](), (
        f"docs/reference/{page} differs from the code: run python3 tools/docgen.py"
    )


def test_a_changed_help_text_shows_in_the_cli_page(monkeypatch):
    status = cli.commands["status"]
    before = docgen.cli_page()
    monkeypatch.setattr(status, "help", "Per host: something else entirely.")
    after = docgen.cli_page()
    assert "something else entirely" in after and "something else entirely" not in before


def test_every_exit_code_has_its_meaning():
    codes = {v for k, v in vars(errors).items() if k.startswith("EXIT_") and isinstance(v, int)}
    codes.add(pipe.EXIT_CLOSED_PIPE)
    assert codes == set(errors.EXIT_MEANINGS), "k26ops.errors.EXIT_MEANINGS: one line per exit code"


def test_every_command_is_on_the_cli_page():
    page = (ROOT / "docs/reference/cli.md").read_text()
    for name, cmd in cli.commands.items():
        if not cmd.hidden:
            assert f"## `k26ops {name}`" in page
            for sub in getattr(cmd, "commands", {}) if isinstance(cmd, click.Group) else {}:
                assert f"## `k26ops {name} {sub}`" in page


def _nav_pages(nav) -> list[str]:
    if isinstance(nav, str):
        return [nav]
    if isinstance(nav, dict):
        return [p for v in nav.values() for p in _nav_pages(v)]
    return [p for item in nav for p in _nav_pages(item)]


def test_every_page_is_on_a_shelf_of_the_site():
    nav = _nav_pages(yaml.safe_load((ROOT / "mkdocs.yml").read_text())["nav"])
    pages = sorted(str(p.relative_to(ROOT / "docs")) for p in (ROOT / "docs").rglob("*.md"))
    assert sorted(nav) == pages, "mkdocs.yml nav and docs/ differ"
    shelves = {p.split("/")[0] for p in pages if "/" in p}
    assert shelves == {"tutorial", "how-to", "reference", "explanation"}


def test_readme_links_lead_to_files():
    text = (ROOT / "README.md").read_text()
    links = re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", text)
    assert len(links) >= 10, "README.md: the table of where to read next"
    missing = [link for link in links if "://" not in link and not (ROOT / link).exists()]
    assert not missing, f"README.md links to files that are not there: {missing}"


def test_readme_is_an_entrance():
    lines = (ROOT / "README.md").read_text().splitlines()
    assert len(lines) <= 250, f"README.md has {len(lines)} lines: it is an entrance; move the detail to docs/"
    first = "\n".join(lines[:60])
    for command in ("    make demo    # ", "    make test    # "):
        assert command in first, f"README.md: {command.strip()} within its first 60 lines"
