"""The model manifest: one line per file of a pinned model revision, `SHA256 SIZE PATH`.

    # k26ops model manifest v1
    # source: hf://moonshotai/Kimi-K2.6@<40-hex revision>
    3b4c...e1  9909128716  model-00001-of-00064.safetensors

It is committed beside the recipe (like the engine's lock); the recipe's `model.manifest`
names it. Its identity (`Manifest.sha256`) is the hash of the entry lines alone, so a
manifest made from the Hub and one made from a reference copy of the same bytes are the
same weights; the release and the baselines record it.

Made from the Hub (`list_repo_tree(expand=True)`: every LFS/Xet file's `lfs.sha256` and
size; a plain git file's sha256 is not published, so it is hashed from its bytes) or from
a reference copy (a directory here or on a host, hashed). `compare` is the fast check
(sizes and the file set, no byte read) that `check` and a deploy's preflight run.
"""

from __future__ import annotations

import hashlib
import logging
import os
import re
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

from k26ops.errors import UserError

HEADER = "# k26ops model manifest v1"
PARTIAL_DIR = ".k26ops-partial"  # where a sync writes a shard before its sha256 is checked
_SHA = re.compile(r"[0-9a-f]{64}")
_REV = re.compile(r"[0-9a-f]{40}")
_REPO = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*/[A-Za-z0-9][A-Za-z0-9._-]*")
# Extra files a host may not have beside the manifest's: what the engine would read
# (weights in any format, configs, and Python that trust_remote_code imports). Other
# extra files (a README someone left) are named, not refused.
REFUSED_EXTRA = (".safetensors", ".bin", ".pt", ".pth", ".gguf", ".json", ".py", ".tiktoken", ".model")
CHUNK = 8 << 20


@dataclass(frozen=True)
class Entry:
    path: str
    size: int
    sha256: str


@dataclass(frozen=True)
class Manifest:
    entries: tuple[Entry, ...]
    source: str = ""

    @property
    def sha256(self) -> str:
        """The weights' identity: the hash of the entry lines (not the comments)."""
        return hashlib.sha256("".join(_line(e) for e in self.entries).encode()).hexdigest()

    @property
    def total(self) -> int:
        return sum(e.size for e in self.entries)

    def by_path(self) -> dict[str, Entry]:
        return {e.path: e for e in self.entries}

    def text(self) -> str:
        head = HEADER + "\n" + (f"# source: {self.source}\n" if self.source else "")
        return head + "".join(_line(e) for e in self.entries)


def _line(e: Entry) -> str:
    return f"{e.sha256}  {e.size}  {e.path}\n"


def path_problem(rel: str) -> str | None:
    """Why `rel` cannot be a file of a model directory (None: it can)."""
    if not rel or "\n" in rel or "\0" in rel or "\\" in rel:
        return "an empty path or one with a newline, NUL or backslash"
    p = PurePosixPath(rel)
    if p.is_absolute() or ".." in p.parts or "." in p.parts or str(p) != rel:
        return "not a plain relative path inside the model directory"
    if p.parts[0] == PARTIAL_DIR:
        return f"{PARTIAL_DIR}/ is k26ops' own (partial downloads)"
    return None


def make(entries, source: str = "") -> Manifest:
    return Manifest(tuple(sorted(entries, key=lambda e: e.path)), source)


def parse(text: str, where: str = "<manifest>") -> Manifest:
    """A manifest's text; every error is one line naming the file and line."""
    entries, seen, source = [], set(), ""
    for n, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        if line.startswith("#"):
            if line.startswith("# source: "):
                source = line[len("# source: ") :].strip()
            continue
        parts = line.split(None, 2)
        if len(parts) != 3 or not _SHA.fullmatch(parts[0]) or not parts[1].isdigit():
            raise UserError(f"{where}:{n}: not a manifest line (want: SHA256 SIZE PATH): {line[:120]!r}")
        why = path_problem(parts[2])
        if why:
            raise UserError(f"{where}:{n}: {parts[2]!r}: {why}")
        if parts[2] in seen:
            raise UserError(f"{where}:{n}: {parts[2]} is listed twice")
        seen.add(parts[2])
        entries.append(Entry(parts[2], int(parts[1]), parts[0]))
    if not entries:
        raise UserError(f"{where}: the manifest lists no file")
    return make(entries, source)


def load(path: Path) -> Manifest:
    try:
        return parse(Path(path).read_text(), str(path))
    except OSError as exc:
        raise UserError(f"{path}: cannot read the model manifest: {exc.strerror}") from None


# -- from the Hub ------------------------------------------------------------


@dataclass(frozen=True)
class HubSpec:
    repo_id: str
    revision: str

    def __str__(self) -> str:
        return f"hf://{self.repo_id}@{self.revision}"


def hub_spec(text: str) -> HubSpec:
    """`hf://ORG/REPO@REVISION`; the revision must be a full commit (a branch moves)."""
    m = re.fullmatch(r"hf://([^@\s]+)@(\S+)", text or "")
    if not m or not _REPO.fullmatch(m.group(1)):
        raise UserError(f"{text!r}: want hf://ORG/REPO@REVISION (e.g. hf://moonshotai/Kimi-K2.6@<40-hex commit>)")
    if not _REV.fullmatch(m.group(2)):
        raise UserError(
            f"{text!r}: the revision must be the full 40-hex commit, not {m.group(2)!r} "
            "(a branch or tag moves; the Hub's commit list gives it)"
        )
    return HubSpec(m.group(1), m.group(2))


def hub_request(spec: HubSpec, token: str | None) -> dict:
    """The keyword arguments of `HfApi.list_repo_tree` for this manifest."""
    return {
        "repo_id": spec.repo_id,
        "revision": spec.revision,
        "repo_type": "model",
        "recursive": True,
        "expand": True,
        "token": token or False,
    }


def from_hub(spec: HubSpec, token: str | None = None, api=None) -> Manifest:
    """List the revision's files with their LFS sha256 and size (one Hub listing).
    The token is passed to the library, never printed. Offline or unreachable: one line."""
    try:
        from huggingface_hub import HfApi  # optional: the `hub` extra, only for an hf:// manifest
        from huggingface_hub.errors import HfHubHTTPError, OfflineModeIsEnabled  # optional: as above
    except ImportError:
        raise UserError(
            "huggingface_hub is not installed on this control node: "
            "pip install 'k26ops[hub]' (or make the manifest from a reference copy)"
        ) from None
    api = api or HfApi()
    logging.getLogger("huggingface_hub").setLevel(logging.ERROR)  # its retry warnings: the one line below says it
    entries = []
    try:
        for item in api.list_repo_tree(**hub_request(spec, token)):
            if not hasattr(item, "size") or getattr(item, "tree_id", None) is not None:
                continue  # a folder
            lfs = getattr(item, "lfs", None)
            sha = getattr(lfs, "sha256", None) if lfs is not None else None
            if sha is None:
                raise UserError(
                    f"{spec}: {item.path} is a plain git file (no LFS sha256 on the Hub): "
                    "make the manifest from a reference copy of this revision"
                )
            entries.append(Entry(item.path, int(lfs.size if lfs.size is not None else item.size), sha))
    except OfflineModeIsEnabled:
        raise UserError(
            f"{spec}: the Hub is not reachable from here (HF_HUB_OFFLINE is set): make the manifest "
            "on a node that reaches huggingface.co, or from a reference copy"
        ) from None
    except HfHubHTTPError as exc:
        code = getattr(getattr(exc, "response", None), "status_code", None)
        raise UserError(
            f"{spec}: the Hub refused the listing (HTTP {code}): {str(exc).splitlines()[0][:160]}"
        ) from None
    except (OSError, ConnectionError) as exc:
        raise UserError(
            f"{spec}: the Hub is not reachable from here ({type(exc).__name__}: "
            f"{str(exc).splitlines()[0][:160] if str(exc) else 'no answer'})"
        ) from None
    except Exception as exc:  # requests' and httpx's connection errors are not OSError subclasses
        if "connect" in type(exc).__name__.lower() or "timeout" in type(exc).__name__.lower():
            raise UserError(f"{spec}: the Hub is not reachable from here ({type(exc).__name__})") from None
        raise
    for e in entries:
        if path_problem(e.path):
            raise UserError(f"{spec}: the Hub lists {e.path!r}: {path_problem(e.path)}")
    if not entries:
        raise UserError(f"{spec}: the Hub lists no file at this revision")
    return make(entries, str(spec))


# -- from a reference copy ---------------------------------------------------


def hash_file(path: str, buf_size: int = CHUNK) -> tuple[int, str]:
    h, n = hashlib.sha256(), 0
    buf = bytearray(buf_size)
    view = memoryview(buf)
    with open(path, "rb", buffering=0) as f:
        while True:
            got = f.readinto(buf)
            if not got:
                break
            h.update(view[:got])  # hashlib drops the GIL for big updates: threads use every core
            n += got
    return n, h.hexdigest()


def list_dir(root: Path) -> list[str]:
    """Relative paths of the regular files under `root` (k26ops' partial dir and dot-git left out)."""
    out = []
    for dirpath, dirs, files in os.walk(root):
        rel_dir = os.path.relpath(dirpath, root)
        dirs[:] = sorted(d for d in dirs if not (rel_dir == "." and d in (PARTIAL_DIR, ".git", ".cache")))
        for f in files:
            full = os.path.join(dirpath, f)
            if os.path.isfile(full) and not os.path.islink(full):
                out.append(os.path.normpath(os.path.join(rel_dir, f)))
    return sorted(out)


def from_dir(root: Path | str, source: str = "", workers: int | None = None) -> Manifest:
    """Hash every file of a reference copy on this node, in parallel."""
    root = Path(root)
    if not root.is_dir():
        raise UserError(f"{root}: not a directory (a reference copy of the model)")
    rels = list_dir(root)
    if not rels:
        raise UserError(f"{root}: no file to put in a manifest")
    for r in rels:
        if path_problem(r):
            raise UserError(f"{root}/{r}: {path_problem(r)}")
    with ThreadPoolExecutor(workers or os.cpu_count() or 1) as pool:
        hashed = list(pool.map(lambda r: hash_file(str(root / r)), rels))
    return make((Entry(r, n, sha) for r, (n, sha) in zip(rels, hashed)), source or f"dir:{root.resolve()}")


# -- the fast comparison (sizes and the file set) -----------------------------


@dataclass(frozen=True)
class Stat:
    size: int
    mtime: str  # "seconds.nanoseconds" as `stat -c %.9Y` prints it
    ctime: str
    inode: int

    def key(self) -> list:
        return [self.size, self.mtime, self.ctime, self.inode]


def record_path(state_dir: str, model_path: str) -> str:
    """Where a host keeps what its last verify hashed for `model_path` (size, mtime, ctime,
    inode and sha256 per file): under k26ops' state dir, never in the model directory."""
    return f"{state_dir}/model-verify/{hashlib.sha256(model_path.encode()).hexdigest()[:16]}.json"


def compare(manifest: Manifest, files: dict[str, Stat], record: dict | None = None) -> dict:
    """The host's files (path -> Stat) against the manifest, reading no byte.

    {"problems": [one phrase per missing, truncated/grown or refused extra file],
     "ignored": [extra files the engine does not read], "changed": [manifest files whose
     (size, mtime, ctime, inode) differ from the last full verify's record, or never verified],
     "verified": n of files the record vouches for}."""
    want = manifest.by_path()
    rec = (record or {}).get("files") or {}
    problems, changed, verified = [], [], 0
    for e in manifest.entries:
        st = files.get(e.path)
        if st is None:
            problems.append(f"{e.path} is missing (expected {e.size} bytes)")
        elif st.size != e.size:
            how = "truncated" if st.size < e.size else "longer than the manifest's"
            problems.append(f"{e.path} is {how}: expected {e.size} bytes, found {st.size}")
        else:
            r = rec.get(e.path)
            if r and r.get("stat") == st.key() and r.get("sha256") == e.sha256:
                verified += 1
            else:
                changed.append(e.path)
    extra = sorted(p for p in files if p not in want)
    refused = [p for p in extra if p.endswith(REFUSED_EXTRA)]
    problems += [f"{p} is not in the manifest (found {files[p].size} bytes)" for p in refused]
    return {
        "problems": problems,
        "ignored": [p for p in extra if p not in refused],
        "changed": changed,
        "verified": verified,
    }
