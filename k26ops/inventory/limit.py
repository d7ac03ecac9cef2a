"""--limit: Ansible's host-pattern language, with Ansible's results.

An operator coming from Ansible types `gpu:!b300`, `web:&staging`,
`rtx[0:2]`, `~rtx0[12]`, `*.example.com` and must get the hosts Ansible would
give (tests/cli/test_limit_patterns.py compares with ansible-core itself):

* a limit with a comma is a comma list; without one it is a single pattern if
  it reads as one host address (`rtx[01:03]`, `host:22`, an IPv6 address),
  else a `:` list (bracketed parts stay whole; a stray bracket, which
  Ansible silently drops, makes the whole limit one term, mostly refused);
* `@FILE` reads one pattern per line;
* plain patterns are applied first (a union, in order), then `&` ones
  (intersections), then `!` ones (exclusions); only `&`/`!` means all hosts first;
* a term is an exact host name, else matched (fnmatch glob, or `~` regex matched
  at the start of the name) against group names (a match brings the group's
  hosts and its descendants') and, when no group matched or the term is a
  regex or has one of `.?*[`, against host names;
* `TERM[i]`, `TERM[i:j]` (both inclusive), `TERM[i:]` pick from that list.

One deliberate difference, the safer of Ansible's own settings
(`host_pattern_mismatch = error`): a term that matches nothing is an error,
so a typo in `!b300` never widens a deploy.
"""

from __future__ import annotations

import difflib
import fnmatch
import ipaddress
import re
from pathlib import Path

from k26ops.errors import UserError
from k26ops.inventory.yamlsrc import oneline, show

LOCALHOST = ("127.0.0.1", "localhost", "::1")  # Ansible's implicit localhost names

# A colon list splits at ':' outside brackets; whitespace also separates.
_COLON_TERM = re.compile(r"(?:\[[^\]]*\]|[^\s:\[\]])+")
_SUBSCRIPT = re.compile(r"^(.+)\[(?:(-?\d+)|(\d+)([:-])(\d*))\]$")
# Host address pieces (what decides "one address, not a ':' list").
_RANGE = r"\[(?:[a-z]:[a-z]|\d+:\d+)(?::\d+)?\]"
_LABEL = rf"(?:\w|{_RANGE})(?:[\w-]|{_RANGE})*(?<![_-])"
_HOSTNAME = re.compile(rf"{_LABEL}(?:\.{_LABEL})*", re.I)
_BRACKETED_PORT = re.compile(r"\[(.+)\]:(\d+)")
_TRAILING_PORT = re.compile(r"((?:\[[^\]]*\]|[^:\[\]])*):(\d+)")


def unknown(inv, name: str, what: str = "host or group") -> UserError:
    candidates = list(inv.hosts) + ([g for g in inv.groups] if "group" in what else [])
    near = sorted(set(difflib.get_close_matches(name, candidates, n=3, cutoff=0.5)))
    hint = f" (near: {', '.join(near)})" if near else ""
    return UserError(oneline(f"{inv.path}: no {what} named {show(name)}{hint}"))


def _one_address(text: str) -> bool:
    """Does `text` read as a single host (name, IPv4 or IPv6, ranges, :port)?"""
    for rx in (_BRACKETED_PORT, _TRAILING_PORT):
        m = rx.fullmatch(text)
        if m:
            text = m.group(1)
    if _HOSTNAME.fullmatch(text):
        return True
    try:
        ipaddress.IPv6Address(text)
    except ValueError:
        return False
    return "%" not in text


def split(limit: str) -> list[str]:
    """The limit's terms, as Ansible splits them."""
    if "," in limit:
        parts = limit.split(",")
    elif _one_address(limit):
        parts = [limit]
    else:
        parts = _COLON_TERM.findall(limit)
        if re.sub(r"[\s:]", "", "".join(parts)) != re.sub(r"[\s:]", "", limit):
            parts = [limit]  # a stray bracket: Ansible drops it silently; here the term is refused whole
    return [p.strip() for p in parts if p.strip()]


def _with_files(terms: list[str]) -> list[str]:
    out = []
    for t in terms:
        if not t.startswith("@"):
            out.append(t)
            continue
        path = Path(t[1:])
        if not path.is_file():
            raise UserError(
                oneline(
                    f"--limit {show(t)}: no such file"
                    if not path.exists()
                    else f"--limit {show(t)}: must be a file, not a directory"
                )
            )
        try:
            out.extend(line.strip() for line in path.read_text(encoding="utf-8").split("\n"))
        except (OSError, UnicodeDecodeError) as exc:
            raise UserError(oneline(f"--limit {show(t)}: cannot read: {exc}")) from None
    return out


def group_order(inv, group: str) -> list[str]:
    """A group's hosts as Ansible lists them: its own, then its children's, then
    theirs (breadth first), each host once."""
    levels, seen_groups = [group], {group}
    frontier = [group]
    while frontier:
        nxt = []
        for g in frontier:
            for c in inv.children.get(g, []):
                if c not in seen_groups:
                    seen_groups.add(c)
                    nxt.append(c)
        levels += nxt
        frontier = nxt
    out, seen = [], set()
    for g in levels:
        for h in inv.members.get(g, []):
            if h not in seen:
                seen.add(h)
                out.append(h)
    return out


def _matcher(term: str):
    try:
        return re.compile(term[1:] if term.startswith("~") else fnmatch.translate(term)).match
    except re.error as exc:
        raise UserError(oneline(f"--limit {show(term)}: bad regular expression: {exc}")) from None


def _enumerate(inv, term: str) -> tuple[list[str], bool]:
    """Hosts a term names (duplicates kept, as Ansible), and whether any group matched."""
    match = _matcher(term)
    groups = [g for g in inv.groups if match(g)]
    out: list[str] = []
    for g in groups:
        out += group_order(inv, g)
    if not groups or term.startswith("~") or any(c in term for c in ".?*["):
        out += [h for h in inv.hosts if match(h)]
    return out, bool(groups)


def _subscript(term: str):
    if term.startswith("~"):
        return term, None
    m = _SUBSCRIPT.match(term)
    if not m:
        return term, None
    base, idx, start, _sep, end = m.groups()
    if idx:
        return base, (int(idx), None)
    return base, (int(start), int(end) if end else -1)


def _one(inv, term: str) -> list[str]:
    expr, sub = _subscript(term)
    hosts, any_group = _enumerate(inv, expr)
    if not hosts and not any_group and expr != "all" and expr not in LOCALHOST:
        if expr.startswith("~") or any(c in expr for c in "*?["):
            raise UserError(oneline(f"{inv.path}: --limit pattern {show(expr)} matches no host or group"))
        raise unknown(inv, expr)
    if hosts and sub:
        start, end = sub
        try:
            if end:  # as Ansible: [i:0] is [i]
                hosts = hosts[start : (len(hosts) - 1 if end == -1 else end) + 1]
            else:
                hosts = [hosts[start]]
        except IndexError:
            raise UserError(
                oneline(f"{inv.path}: --limit {show(term)}: no host at that index ({len(hosts)} matched {show(expr)})")
            ) from None
    return hosts


def evaluate(inv, terms: list[str]) -> list[str]:
    """Ansible's pattern evaluation: plain terms, then `&`, then `!`."""
    terms = [t for t in terms if t]
    plain = [t for t in terms if t[0] not in "&!"]
    ordered = (plain or ["all"]) + [t for t in terms if t[0] == "&"] + [t for t in terms if t[0] == "!"]
    chosen: list[str] = []
    for t in ordered:
        if t in inv.hosts:
            chosen.append(t)
            continue
        that = _one(inv, t[1:] if t[0] in "&!" else t)
        if t[0] == "!":
            chosen = [h for h in chosen if h not in set(that)]
        elif t[0] == "&":
            chosen = [h for h in chosen if h in set(that)]
        else:
            have = set(chosen)
            chosen += [h for h in that if h not in have]
    return chosen


def select(inv, limit: str | None) -> list:
    """Hosts of `--limit`, in inventory order."""
    if limit is None or not str(limit).strip():
        return list(inv.hosts.values())
    terms = _with_files(split(str(limit)))
    if any(t in ("&", "!") for t in terms):
        raise UserError(oneline(f"--limit {show(limit)}: '&' and '!' need a pattern after them"))
    chosen = set(evaluate(inv, terms))
    if not chosen:
        raise UserError(oneline(f"{inv.path}: --limit {show(limit)} selects no hosts"))
    return [h for n, h in inv.hosts.items() if n in chosen]
