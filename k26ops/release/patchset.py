#!/usr/bin/env python3
"""Quilt-like patch series over a directory tree (an installed site-packages).

Why this shape: the same pure code runs in tests on the control node and on a
host (shipped as one stdlib-only script, `python3 patchset.py apply ...`, JSON
out), and hosts may lack `patch`. Every hunk of every patch is dry-run in
memory first; files are written (temp file + rename) only when all of them
succeeded; pristine copies and a JSON state file make revert exact and drift
visible. Line offsets are searched like `patch` does; context is never fuzzed.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import re
import sys
import sysconfig
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

try:  # inside the k26ops package: a one-line user error (exit 2)
    from k26ops.errors import UserError as _ErrorBase
except Exception:  # standalone on a host
    _ErrorBase = Exception

STATE_FILE = "state.json"
PRISTINE_DIR = "pristine"
_HUNK_RE = re.compile(r"^@@ -(\d+)(?:,(\d+))? \+(\d+)(?:,(\d+))? @@")
# `Base: sglang==0.5.23 (PyPI)` or `Base: sglang@<40-hex commit> (where it comes from)`;
# a patch verified against several bases lists one Base: line each.
_BASE_RE = re.compile(r"^[#\s]*Base:\s*([A-Za-z0-9_.\-]+)\s*(==\s*[^\s()]+|@\s*[0-9a-f]{40})\s*(?:\((.*?)\))?", re.I)
_GUARD_RE = re.compile(r"#\s*when:\s*([\w,\- ]+)\s*$")
_TAG_RE = re.compile(r"\[([\w,\- ]+)\]")


class PatchError(_ErrorBase):
    """A patch series problem; the message is one line and nothing was written."""

    def __init__(self, message: str):
        super().__init__(message)


# ---------------------------------------------------------------- parsing


@dataclass
class Hunk:
    old_start: int
    new_start: int
    old: list[str]  # lines with their endings, as in the file before
    new: list[str]  # lines with their endings, as in the file after


@dataclass
class FilePatch:
    path: str  # relative to the root, after stripping
    old_missing: bool  # --- /dev/null: the patch creates the file
    new_missing: bool  # +++ /dev/null: the patch deletes the file
    hunks: list[Hunk]


@dataclass
class Patch:
    name: str
    sha256: str
    header: str
    base: tuple[str, str, str] | None  # (package, "==ver" or "@commit", source): the first `Base:`
    files: list[FilePatch]
    bases: tuple = ()  # every `Base:` line, as (package, spec, source)


@dataclass
class SeriesEntry:
    path: str
    guards: tuple[str, ...]
    strip: int
    lineno: int


def sha256_bytes(data: bytes | None) -> str | None:
    return None if data is None else hashlib.sha256(data).hexdigest()


def _strip_path(raw: str, strip: int) -> str | None:
    raw = raw.split("\t")[0].strip()
    if raw == "/dev/null":
        return None
    parts = PurePosixPath(raw).parts[strip:]
    rel = PurePosixPath(*parts) if parts else None
    if rel is None or rel.is_absolute() or ".." in rel.parts:
        raise PatchError(f"unsafe or empty path in patch: {raw!r}")
    return str(rel)


def parse_patch(text: str, name: str = "<patch>", strip: int = 1) -> Patch:
    """Parse a unified diff (optionally with a free-text header) into hunks."""
    lines = text.splitlines(keepends=True)
    sha = hashlib.sha256(text.encode()).hexdigest()
    i, header, files = 0, [], []
    while i < len(lines) and not (
        lines[i].startswith("--- ") and i + 1 < len(lines) and lines[i + 1].startswith("+++ ")
    ):
        header.append(lines[i])
        i += 1
    while i < len(lines):
        line = lines[i]
        if not (line.startswith("--- ") and i + 1 < len(lines) and lines[i + 1].startswith("+++ ")):
            i += 1  # diff --git / index / other noise between files
            continue
        old_p = _strip_path(line[4:], strip)
        new_p = _strip_path(lines[i + 1][4:], strip)
        fp = FilePatch(path=new_p or old_p or "", old_missing=old_p is None, new_missing=new_p is None, hunks=[])
        i += 2
        while i < len(lines) and lines[i].startswith("@@"):
            m = _HUNK_RE.match(lines[i])
            if not m:
                raise PatchError(f"{name}: bad hunk header at line {i + 1}: {lines[i].strip()}")
            old_len = int(m.group(2)) if m.group(2) is not None else 1
            new_len = int(m.group(4)) if m.group(4) is not None else 1
            hunk = Hunk(int(m.group(1)), int(m.group(3)), [], [])
            i += 1
            last: list[list[str]] = []
            while len(hunk.old) < old_len or len(hunk.new) < new_len or (i < len(lines) and lines[i].startswith("\\")):
                if i >= len(lines):
                    raise PatchError(f"{name}: {fp.path}: hunk {len(fp.hunks) + 1} is truncated")
                raw = lines[i]
                i += 1
                if raw.startswith("\\"):  # "\ No newline at end of file"
                    for side in last:
                        side[-1] = side[-1].rstrip("\r\n")
                    continue
                tag, body = (raw[0], raw[1:]) if raw not in ("\n", "\r\n") else (" ", raw)
                if tag == " ":
                    hunk.old.append(body), hunk.new.append(body)
                    last = [hunk.old, hunk.new]
                elif tag == "-":
                    hunk.old.append(body)
                    last = [hunk.old]
                elif tag == "+":
                    hunk.new.append(body)
                    last = [hunk.new]
                else:
                    raise PatchError(f"{name}: {fp.path}: bad line {i} in hunk {len(fp.hunks) + 1}")
            if len(hunk.old) != old_len or len(hunk.new) != new_len:
                raise PatchError(f"{name}: {fp.path}: hunk {len(fp.hunks) + 1} line counts do not match its header")
            fp.hunks.append(hunk)
        files.append(fp)
    if not files:
        raise PatchError(f"{name}: no file changes found (not a unified diff?)")
    head = "".join(header)
    bases = []
    for h in header:
        m = _BASE_RE.match(h)
        if m:
            bases.append((m.group(1), m.group(2).replace(" ", ""), (m.group(3) or "").strip()))
    return Patch(name=name, sha256=sha, header=head, base=bases[0] if bases else None, files=files, bases=tuple(bases))


def parse_series(text: str, source: str = "series") -> list[SeriesEntry]:
    """`path [-pN] [[tag,...]] [# when: tag]` per line; `#` starts a comment."""
    out = []
    for n, raw in enumerate(text.splitlines(), 1):
        guards: list[str] = []
        m = _GUARD_RE.search(raw)
        if m:
            guards += [g.strip() for g in m.group(1).replace(",", " ").split() if g.strip()]
            raw = raw[: m.start()]
        raw = raw.split("#", 1)[0].strip()
        if not raw:
            continue
        for t in _TAG_RE.findall(raw):
            guards += [g.strip() for g in t.replace(",", " ").split() if g.strip()]
        raw = _TAG_RE.sub(" ", raw)
        words = raw.split()
        strip = 1
        for w in words[1:]:
            if re.fullmatch(r"-p\d+", w):
                strip = int(w[2:])
            else:
                raise PatchError(f"{source}:{n}: unexpected {w!r} (expected `path [-pN] [tag]`)")
        out.append(SeriesEntry(words[0], tuple(guards), strip, n))
    return out


def series_base(text: str) -> tuple[int, str] | None:
    """The base a series is written for, from its `# Base: sglang@<commit>` comment: (line, base)."""
    for n, raw in enumerate(text.splitlines(), 1):
        m = re.match(r"^#\s*Base:\s*(\S+)\s*$", raw)
        if m:
            return n, m.group(1)
    return None


def load_series(series: str | os.PathLike, tags=()) -> list[Patch]:
    """The active patches of a series file, in order (guarded ones only with a matching tag)."""
    series = Path(series)
    try:
        entries = parse_series(series.read_text(), str(series))
    except OSError as exc:
        raise PatchError(f"cannot read series {series}: {exc.strerror}") from None
    tags = set(tags)
    patches = []
    for e in entries:
        if e.guards and not tags.intersection(e.guards):
            continue
        p = series.parent / e.path
        try:
            text = p.read_text()
        except OSError as exc:
            raise PatchError(f"{series}:{e.lineno}: patch {e.path}: {exc.strerror}") from None
        patches.append(parse_patch(text, e.path, e.strip))
    return patches


# ---------------------------------------------------------------- applying


class _HunkFailed(Exception):
    def __init__(self, index: int):
        self.index = index


def _find(lines: list[str], want: list[str], expected: int, lo: int) -> int | None:
    """Nearest position >= lo where `want` matches exactly (offset search, no fuzz)."""
    hi = len(lines) - len(want)
    if hi < lo:
        return None
    expected = min(max(expected, lo), hi)
    for d in range(0, max(expected - lo, hi - expected) + 1):
        for pos in (expected + d, expected - d) if d else (expected,):
            if lo <= pos <= hi and lines[pos : pos + len(want)] == want:
                return pos
    return None


def _apply_hunks(lines: list[str], hunks: list[Hunk], reverse: bool) -> tuple[list[str], int]:
    """New lines and the total absolute offset used; raises _HunkFailed(n)."""
    out: list[str] = []
    src, offset, total = 0, 0, 0
    for n, h in enumerate(hunks, 1):
        old, new = (h.new, h.old) if reverse else (h.old, h.new)
        start = h.new_start if reverse else h.old_start
        nominal = start - 1 if old else start
        pos = _find(lines, old, nominal + offset, src)
        if pos is None:
            raise _HunkFailed(n)
        offset = pos - nominal
        total += abs(offset)
        out += lines[src:pos] + new
        src = pos + len(old)
    return out + lines[src:], total


def _patch_file(content: bytes | None, fp: FilePatch, reverse: bool) -> tuple[bytes | None, int]:
    missing_before = fp.new_missing if reverse else fp.old_missing
    missing_after = fp.old_missing if reverse else fp.new_missing
    if missing_before and content is not None:
        raise _HunkFailed(-2)  # would create a file that exists
    if not missing_before and content is None:
        raise _HunkFailed(-1)
    lines = [] if content is None else content.decode("utf-8", "surrogateescape").splitlines(keepends=True)
    new, total = _apply_hunks(lines, fp.hunks, reverse)
    if missing_after:
        if new:
            raise _HunkFailed(len(fp.hunks))
        return None, total
    return "".join(new).encode("utf-8", "surrogateescape"), total


def _read(root: Path, rel: str) -> bytes | None:
    try:
        return (root / rel).read_bytes()
    except FileNotFoundError:
        return None


def _try(patch: Patch, view, reverse: bool):
    """Dry-run one patch against the in-memory view: ({rel: bytes}, offset) or failure info."""
    results, total = {}, 0
    for fp in patch.files:
        cur = results[fp.path] if fp.path in results else view(fp.path)
        try:
            results[fp.path], off = _patch_file(cur, fp, reverse)
            total += off
        except _HunkFailed as exc:
            return None, (fp.path, exc.index, cur is None)
    return results, total


def _fmt_base(base) -> str:
    return f"{base[0]}{base[1]}" if base else "no Base: header"


def _spec(value: str) -> str:
    """An installed base as a spec: "0.5.23" -> "==0.5.23"; "@<sha>" and "==x" as they are."""
    return value if value.startswith(("==", "@")) else "==" + value


def parse_base(text: str) -> tuple[str, str]:
    """`sglang==0.5.23` or `sglang@<sha>` -> (package, spec)."""
    m = re.fullmatch(r"([A-Za-z0-9_.\-]+)(==\S+|@[0-9a-f]{40})", text.strip())
    if not m:
        raise PatchError(f"not a base: {text!r} (expected PKG==VERSION or PKG@COMMIT)")
    return m.group(1), m.group(2)


def plan(root, patches: list[Patch], installed: dict | None = None, state: dict | None = None) -> dict:
    """Dry-run the whole series in memory. Returns {"patches": [...], "files": {rel: bytes|None},
    "original": {rel: bytes|None}, "warnings": [...]}; raises PatchError naming the first failure."""
    root = Path(root)
    installed = dict(installed or {})
    applied_before = {p["name"]: p for p in (state or {}).get("patches", [])}
    original: dict[str, bytes | None] = {}
    files: dict[str, bytes | None] = {}

    def view(rel):
        if rel not in files:
            original[rel] = files[rel] = _read(root, rel)
        return files[rel]

    out, warnings = [], []
    for p in patches:
        prev = applied_before.get(p.name)
        if prev and prev["sha256"] != p.sha256:
            raise PatchError(
                f"patch {p.name} changed since it was applied (state sha256 {prev['sha256'][:12]}, "
                f"now {p.sha256[:12]}): revert the series first"
            )
        pkgs = {b[0] for b in p.bases}
        for pkg in sorted(pkgs & set(installed)):
            have = _spec(installed[pkg])
            if not any(b[0] == pkg and b[1] == have for b in p.bases):
                raise PatchError(
                    f"patch {p.name} is written for {', '.join(_fmt_base(b) for b in p.bases)}, "
                    f"the deployed base is {pkg}{have}: nothing was applied"
                )
        if installed and not p.bases:
            raise PatchError(
                f"patch {p.name} has no Base: header (which engine it was written for): nothing was applied"
            )
        mismatch = None
        fwd, finfo = _try(p, view, reverse=False)
        rev, _rinfo = _try(p, view, reverse=True)
        if fwd is not None and rev is not None:  # ambiguous: trust the state, then exactness
            status = "applied" if prev or _rinfo < finfo else "apply"
        elif fwd is not None:
            status = "apply"
        elif rev is not None:
            status = "applied"
        else:
            path, hunk, _missing = finfo
            what = {-1: "file is missing", -2: "file already exists"}.get(hunk, f"hunk {hunk} does not apply")
            inst = f"{p.base[0]}{_spec(installed[p.base[0]])}" if p.base and p.base[0] in installed else "unknown"
            raise PatchError(f"patch {p.name}: {path}: {what} (base expected {_fmt_base(p.base)}, installed {inst})")
        if mismatch:
            warnings.append(f"patch {p.name} {mismatch} but {'applies' if status == 'apply' else 'is applied'}")
        before = {rel: sha256_bytes(files[rel]) for rel in {f.path for f in p.files}}
        reversed_original = rev if status == "applied" else None
        if status == "apply":
            files.update(fwd)
        out.append(
            {
                "name": p.name,
                "sha256": p.sha256,
                "status": status,
                "base": _fmt_base(p.base) if p.base else None,
                "files": {rel: {"before": before[rel], "after": sha256_bytes(files[rel])} for rel in before},
                "_pristine": reversed_original,
            }
        )
    return {"patches": out, "files": files, "original": original, "warnings": warnings}


def _atomic_write(path: Path, data: bytes | None, mode: int | None = None) -> None:
    if data is None:
        if path.exists():
            path.unlink()
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.k26ops-tmp-{os.getpid()}")
    with open(tmp, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    if mode is not None:
        os.chmod(tmp, mode)
    os.replace(tmp, path)


def _state_paths(state) -> tuple[Path, Path]:
    """(state dir, state file) from a dir or a `.json` file path."""
    state = Path(state)
    if state.suffix == ".json":
        return state.parent, state
    return state, state / STATE_FILE


def load_state(state) -> dict | None:
    _d, f = _state_paths(state)
    try:
        return json.loads(f.read_text())
    except FileNotFoundError:
        return None


def apply(root, patches: list[Patch], state, installed: dict | None = None, check: bool = False) -> dict:
    """Apply the series (or, with check=True, only report what would change).

    Writes nothing unless every hunk of every patch dry-ran cleanly."""
    root = Path(root)
    sdir, sfile = _state_paths(state)
    old_state = load_state(state)
    pl = plan(root, patches, installed, old_state)
    changed = sorted(rel for rel in pl["files"] if pl["files"][rel] != pl["original"][rel])
    pristine = dict((old_state or {}).get("pristine", {}))
    new_pristine: dict[str, bytes | None] = {}
    for p in pl["patches"]:
        for rel in p["files"]:
            if rel in pristine or rel in new_pristine:
                continue
            if p["status"] == "applied":  # found applied without our record: undo it in memory
                new_pristine[rel] = p["_pristine"].get(rel, pl["original"][rel])
            else:
                new_pristine[rel] = pl["original"][rel]
    result = {
        "changed": bool(changed),
        "files": changed,
        "warnings": pl["warnings"],
        "patches": [{k: v for k, v in p.items() if k != "_pristine"} for p in pl["patches"]],
    }
    if check:
        return result
    for rel, data in new_pristine.items():
        if data is not None:
            _atomic_write(sdir / PRISTINE_DIR / rel, data)
        pristine[rel] = sha256_bytes(data)
    temps = []
    try:
        for rel in changed:  # all temp files first, then the renames: a short window
            dst = root / rel
            data = pl["files"][rel]
            if data is None:
                temps.append((None, dst))
                continue
            dst.parent.mkdir(parents=True, exist_ok=True)
            tmp = dst.with_name(f".{dst.name}.k26ops-tmp-{os.getpid()}")
            tmp.write_bytes(data)
            if dst.exists():
                os.chmod(tmp, dst.stat().st_mode & 0o7777)
            temps.append((tmp, dst))
    except OSError as exc:
        for tmp, _ in temps:
            if tmp is not None:
                tmp.unlink(missing_ok=True)
        raise PatchError(f"cannot write under {root}: {exc}") from None
    for tmp, dst in temps:
        if tmp is None:
            dst.unlink(missing_ok=True)
        else:
            os.replace(tmp, dst)
    st = {
        "version": 1,
        "root": str(root),
        "installed": dict(installed or {}),
        "patches": result["patches"],
        "pristine": pristine,
    }
    data = json.dumps(st, indent=1, sort_keys=True).encode() + b"\n"
    if _read(sfile.parent, sfile.name) != data:
        _atomic_write(sfile, data)
    return result


def expected_hashes(state: dict) -> dict[str, str | None]:
    """Each touched file's sha256 after the whole series, per the state."""
    exp: dict[str, str | None] = {}
    for p in state.get("patches", []):
        for rel, h in p["files"].items():
            exp[rel] = h["after"]
    return exp


def verify(root, state) -> list[dict]:
    """Files whose current hash differs from what the state recorded (drift)."""
    st = state if isinstance(state, dict) else load_state(state)
    if st is None:
        return []
    root = Path(root)
    drift = []
    for rel, want in sorted(expected_hashes(st).items()):
        got = sha256_bytes(_read(root, rel))
        if got != want:
            drift.append({"path": rel, "expected": want, "actual": got})
    return drift


def revert(root, state) -> dict:
    """Restore every touched file from its pristine copy, exactly; drop the state."""
    root = Path(root)
    sdir, sfile = _state_paths(state)
    st = load_state(state)
    if st is None:
        return {"changed": False, "files": [], "drift": []}
    drift = verify(root, st)
    restored = []
    for rel, h in sorted(st.get("pristine", {}).items()):
        data = None if h is None else (sdir / PRISTINE_DIR / rel).read_bytes()
        if sha256_bytes(data) != h:
            raise PatchError(f"pristine copy of {rel} under {sdir} is damaged (sha256 mismatch): not reverting")
        if _read(root, rel) != data:
            mode = (root / rel).stat().st_mode & 0o7777 if (root / rel).exists() else None
            _atomic_write(root / rel, data, mode)
            restored.append(rel)
    for rel in st.get("pristine", {}):
        (sdir / PRISTINE_DIR / rel).unlink(missing_ok=True)
    sfile.unlink(missing_ok=True)
    return {"changed": bool(restored), "files": restored, "drift": drift}


# ---------------------------------------------------------------- script


def _main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="patchset.py", description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    sub.add_parser("site", help="print this interpreter's site-packages (run it with the release venv's python)")
    for name in ("apply", "check", "revert", "verify"):
        s = sub.add_parser(name)
        s.add_argument("--root", required=True)
        s.add_argument("--state", required=True, help="state dir (or its state.json)")
        if name in ("apply", "check"):
            s.add_argument("--series", required=True)
            s.add_argument("--tag", action="append", default=[], help="enable guarded patches")
            s.add_argument(
                "--installed",
                "--base",
                action="append",
                default=[],
                metavar="PKG==VER|PKG@COMMIT",
                help="the deployed base; every patch must name it in a Base: line",
            )
    a = ap.parse_args(argv)
    if a.cmd == "site":
        print(sysconfig.get_paths()["purelib"])
        return 0
    try:
        if a.cmd in ("apply", "check"):
            inst = dict(parse_base(x) for x in a.installed)
            res = apply(a.root, load_series(a.series, a.tag), a.state, inst, check=a.cmd == "check")
        elif a.cmd == "revert":
            res = revert(a.root, a.state)
        else:
            d = verify(a.root, a.state)
            res = {"ok": not d, "drift": d}
    except PatchError as exc:
        print(json.dumps({"ok": False, "error": str(exc)}))
        return 2
    res.setdefault("ok", True)
    print(json.dumps(res, sort_keys=True))
    return 0


if __name__ == "__main__":
    sys.exit(_main())
