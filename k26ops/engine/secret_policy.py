"""The secrets policy: which names and values are secret (a name's words, credential shapes,
the inventory's secret_vars / secret_patterns), and their redaction from output, logs and
baselines. Pure: no host access."""

from __future__ import annotations

import difflib
import fnmatch
import functools
import json
import re
import shlex
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from k26ops.engine.systemd import env_quote, parse_env, systemd_quote
from k26ops.errors import UserError

REDACTED = "<redacted>"

# ---------------------------------------------------------------- secrets

_SECRET_WORDS = ("TOKEN", "KEY", "SECRET", "PASSWORD", "PASSWD", "CREDENTIAL", "CREDENTIALS")


@dataclass(frozen=True)
class SecretPolicy:
    """The names an inventory marks secret beyond the built-in words (`secret_vars`) and its
    glob patterns (`secret_patterns`): made by inventory.load, put in force by the command
    that runs on that inventory (`use`)."""

    names: frozenset[str] = frozenset()  # upper case, no leading dashes
    patterns: tuple[str, ...] = ()

    @classmethod
    def of(cls, names: Iterable = (), patterns: Iterable = ()) -> "SecretPolicy":
        return cls(frozenset(str(n).upper().lstrip("-") for n in names), tuple(str(p) for p in patterns))

    def marks(self, name: str) -> bool:
        """`name` is one the inventory declared secret (by name or pattern)."""
        bare = str(name).upper().lstrip("-")
        return bare in self.names or any(fnmatch.fnmatchcase(bare, p.upper()) for p in self.patterns)


# The policy in force for this process's one run. Process-wide on purpose: every
# redaction (output, logs, baselines, the engine's argv) must see the inventory's names,
# and about 25 call sites, many with no inventory at hand, would each have to remember
# a parameter; one forgotten would print a secret. Only `use` changes it.
_IN_FORCE = SecretPolicy()


def use(policy: SecretPolicy) -> None:
    """Put `policy` in force for this run (the CLI, once it has loaded the inventory)."""
    global _IN_FORCE
    _IN_FORCE = policy


def in_force() -> SecretPolicy:
    return _IN_FORCE


def is_secret_key(name: str) -> bool:
    """A name that holds a secret, by its words (split at - _ . and case):
    HF_TOKEN, OPENAI_APIKEY, --api-key, AWS_SECRET_ACCESS_KEY, DB_PASSWORD,
    GCP_CREDENTIALS, K26OPS_SECRET_*; not --max-total-tokens (TOKENS counts
    things) nor --tokenizer-path. Plus the inventory's secret_vars / secret_patterns."""
    up = str(name).upper()
    if _IN_FORCE.marks(up):
        return True
    words = [w for w in re.split(r"[^A-Z0-9]+", up) if w]
    if words and words[-1] in ("FILE", "PATH", "DIR", "FILENAME", "FILES"):
        return False  # where a secret is (ansible_ssh_private_key_file), not the secret
    for word in words:
        if (
            word in _SECRET_WORDS
            or word.endswith(("KEY", "TOKEN", "SECRET", "PASSWORD", "PASSWD"))
            or word.startswith(("SECRET", "PASSWORD", "CREDENTIAL"))
            or _near_secret_word(word)
        ):
            return True
    return False


# Words one typo from a secret word that are not secrets (TOKENS counts things).
_NOT_SECRET_WORDS = frozenset({"TOKENS", "TAKEN", "WOKEN"})


@functools.lru_cache(maxsize=4096)
def _near_secret_word(word: str) -> bool:
    """A typo'd secret word (hf_tokn, DB_PASWORD, MY_SECRT): one letter off.
    Cached: difflib per word was most of listing a 200,000-host inventory (the
    same few variable names on every host)."""
    return (
        len(word) >= 4
        and word not in _NOT_SECRET_WORDS
        and any(
            abs(len(word) - len(w)) <= 1 and difflib.SequenceMatcher(None, word, w).ratio() >= 0.8
            for w in ("TOKEN", "SECRET", "PASSWORD", "PASSWD", "CREDENTIAL", "APIKEY")
        )
    )


# scheme://user:password@host, scheme://KEY@host (a Sentry DSN); user and password end at / ? # @ or space
_URL_USERINFO = re.compile(r"[A-Za-z][A-Za-z0-9+.-]*://(?P<user>[^\s/?#@:]*)(?::(?P<pw>[^\s/?#@]*))?@")
# Tokens whose shape says what they are, whatever the key is called.
_TOKEN_SHAPES = re.compile(
    r"(?:hf_|sk-|sk_live_|ghp_|gho_|ghs_|github_pat_|glpat-|xox[abpr]-)[A-Za-z0-9_-]{16,}"
    r"|AKIA[0-9A-Z]{16}"
)


def credentials_in(value) -> list[str]:
    """Secrets inside a value whatever its key is called: the password of a URL's
    `user:password@`, a URL user long enough to be a key (`https://KEY@o1.ingest.sentry.io/1`;
    not `git@`), and tokens of a known shape (hf_..., sk-..., ghp_..., AKIA...)."""
    if not isinstance(value, str):
        return []
    out = []
    for m in _URL_USERINFO.finditer(value):
        if m.group("pw"):
            out.append(m.group("pw"))
        elif len(m.group("user")) >= 16:
            out.append(m.group("user"))
    return out + _TOKEN_SHAPES.findall(value)


def mask_credentials(value: str) -> str:
    """`value` with each credential inside it (credentials_in) replaced by <redacted>."""
    for cred in sorted(set(credentials_in(value)), key=len, reverse=True):
        value = value.replace(cred, REDACTED)
    return value


def secrets_of(env: Mapping) -> list[str]:
    """The values of an env mapping's secret keys and the credentials inside any
    of its values (a DATABASE_URL's password), for redact."""
    return [str(v) for k, v in env.items() if is_secret_key(k) and v not in (None, "")] + [
        c for v in env.values() for c in credentials_in(v)
    ]


def is_secret_item(key: str, value) -> bool:
    """An env entry to keep out of baselines whole: a secret name, or a credential in its value."""
    return is_secret_key(key) or bool(credentials_in(value))


def secret_flag_values(words: list[str]) -> dict[int, tuple[str, str, bool]]:
    """Where the secret flags' values are in a flag list: {index of the word that
    holds the value: (flag, value, inline)} for `--api-key=X` (inline, its own
    word) and `--api-key X` (the next word, when it is not a flag)."""
    hits: dict[int, tuple[str, str, bool]] = {}
    for i, w in enumerate(words):
        flag, eq, val = w.partition("=")
        if flag.startswith("--") and is_secret_key(flag):
            if eq:
                hits[i] = (flag, val, True)
            elif i + 1 < len(words) and not words[i + 1].startswith("--"):
                hits[i + 1] = (flag, words[i + 1], False)
    return hits


def secret_values(value, name: str = "", depth: int = 0) -> list[str]:
    """Every secret value inside inventory vars: values of secret-named keys at any
    depth (engine_env, extra_flags mappings), values after secret flags in flag
    lists (`[--api-key, X]`, `--api-key=X`), and every !vault value's text."""
    out: list[str] = []
    if depth > 20:
        return out
    if type(value).__name__ == "Vault":
        return [str(getattr(value, "ciphertext", ""))]
    if isinstance(value, str):
        return credentials_in(value)
    if isinstance(value, Mapping):
        for k, v in value.items():
            if is_secret_key(str(k)) and isinstance(v, (str, int)) and not isinstance(v, bool):
                out.append(str(v))
            out += secret_values(v, str(k), depth + 1)
    elif isinstance(value, (list, tuple)):
        out += [v for _flag, v, _inline in secret_flag_values([str(w) for w in value]).values()]
        for item in value:
            out += secret_values(item, name, depth + 1) if isinstance(item, (Mapping, list, str)) else []
    return [v for v in out if v]


def redact_vars(value, _active: set | None = None, _memo: dict | None = None):
    """Inventory vars for display: values of secret-named keys (typo'd ones too:
    hf_tokn) and of secret flags in flag lists become <redacted>, and so do
    credentials inside any text (credentials_in); !vault values stay <vault>. What has
    nothing to redact is returned as it is (the same objects: recursive vars
    stay recursive for the printer). A container reached again (a YAML alias) is
    redacted once: an alias bomb just under the limit has 2 million copies of a few
    lists (only a result whose walk met no recursion is reused: that one depends
    on where the walk came from)."""
    active = set() if _active is None else _active
    memo = {"cycles": 0} if _memo is None else _memo
    if id(value) in active:
        memo["cycles"] += 1
        return value
    if not isinstance(value, (Mapping, list, tuple)):
        return mask_credentials(value) if isinstance(value, str) and credentials_in(value) else value
    seen = memo.get(id(value))
    if seen is not None and seen[0] is value:
        return seen[1]
    cycles = memo["cycles"]
    active.add(id(value))
    if isinstance(value, Mapping):
        new = {
            k: (
                REDACTED
                if is_secret_key(str(k))
                and not isinstance(v, (Mapping, list, tuple))
                and type(v).__name__ != "Vault"
                and v not in (None, "")
                else redact_vars(v, active, memo)
            )
            for k, v in value.items()
        }
        result = value if all(new[k] is value[k] for k in value) else new
    else:
        hits = secret_flag_values([str(w) for w in value])
        out = []
        for i, v in enumerate(value):
            if isinstance(v, str) and i in hits:
                flag, _val, inline = hits[i]
                out.append(f"{flag}={REDACTED}" if inline else REDACTED)
            else:
                out.append(redact_vars(v, active, memo))
        result = value if all(a is b for a, b in zip(out, value)) else out
    active.discard(id(value))
    if memo["cycles"] == cycles:
        memo[id(value)] = (value, result)
    return result


def secret_ref_name(flag: str) -> str:
    """The env variable an older k26ops kept a secret flag's value in (a baseline's env file may name it)."""
    return "K26OPS_SECRET_" + re.sub(r"[^A-Z0-9]+", "_", flag.lstrip("-").upper()).strip("_")


def split_secret_flags(argv: list[str]) -> tuple[list[str], dict[str, str]]:
    """Engine flags whose name is secret (`--api-key X`, `--api-key=X`) taken out
    of a command line: (the words without them, {flag: value}). Their values go
    to the root-only --config file (render_secret_config), never into the unit,
    the manifest or the engine's argv."""
    hits = {
        i: h
        for i, h in secret_flag_values(argv).items()  # a list flag (`--x-token-map A B`) holds no secret
        if h[2] or i + 1 >= len(argv) or argv[i + 1].startswith("--")
    }
    drop = {i - 1 for i, (_f, _v, inline) in hits.items() if not inline}
    out = [w for i, w in enumerate(argv) if i not in hits and i not in drop]
    return out, {flag: val for _i, (flag, val, _inline) in sorted(hits.items())}


def redact(text: str, secrets: Iterable[str] | Mapping) -> str:
    """`text` with every secret value (also in its quoted/escaped spellings)
    replaced by <redacted>. A Mapping is read as an env: its secret keys' values."""
    values = secrets_of(secrets) if isinstance(secrets, Mapping) else [str(s) for s in secrets if s]
    forms: set[str] = set()
    for s in values:
        forms |= {s, json.dumps(s)[1:-1], shlex.quote(s)}
        try:
            forms |= {env_quote(s)[1:-1], systemd_quote(s).strip('"')}
        except UserError:
            pass
    for form in sorted((f for f in forms if f), key=len, reverse=True):
        text = text.replace(form, REDACTED)
    return text


def env_for_baseline(env_text: str, marker: str = REDACTED) -> str:
    """The env file text with each secret key's value replaced by `marker`
    (the baselines repository keeps the file's shape, never the secret)."""
    for key, value, start, end in reversed(parse_env(env_text)):
        if is_secret_item(key, value):
            env_text = env_text[:start] + marker + env_text[end:]
    return env_text
