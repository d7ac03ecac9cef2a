"""Where the top-level `playbooks/`, `templates/` and `patches/` are.

Why: they sit at the top of the repository, outside the package, so code that
looked next to the package found them only in a checkout. A wheel ships copies
inside the package, as `k26ops/_data/` (see pyproject.toml). In a checkout
(editable install, tests) the checkout's own files are used, so an edit takes
effect without reinstalling. Every module finds these files through `path()`.
"""

from __future__ import annotations

from pathlib import Path

_PACKAGE = Path(__file__).resolve().parent
_CHECKOUT = _PACKAGE.parent
_SHIPPED = _PACKAGE / "_data"


def root() -> Path:
    """The checkout when running from one, otherwise the copy shipped in the package."""
    if (_CHECKOUT / "pyproject.toml").is_file() and (_CHECKOUT / "playbooks").is_dir():
        return _CHECKOUT
    return _SHIPPED


def installed() -> bool:
    """Running from an installed wheel (the files are the package's read-only copies)."""
    return root() == _SHIPPED


def path(*parts: str) -> Path:
    """`path("playbooks", "deploy.yml")`: a file under root()."""
    return root().joinpath(*parts)
