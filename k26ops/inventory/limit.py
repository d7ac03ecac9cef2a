"""--limit: host and group names, comma separated, plus ansible-style patterns:
`gpu*` (glob), `~regex`, `!name` (exclude), `&group` (intersect), `all`/`*`.
A plain name that matches nothing is an error listing near matches."""

from __future__ import annotations

import difflib
import fnmatch
import re

from k26ops.errors import UserError
from k26ops.inventory.yamlsrc import oneline, show

_GLOB = re.compile(r"[*?\[]")


def unknown(inv, name: str, what: str = "host or group") -> UserError:
    candidates = list(inv.hosts) + ([g for g in inv.groups] if "group" in what else [])
    near = sorted(set(difflib.get_close_matches(name, candidates, n=3, cutoff=0.5)))
    hint = f" (near: {', '.join(near)})" if near else ""
    return UserError(oneline(f"{inv.path}: no {what} named {show(name)}{hint}"))


def _match(inv, term: str) -> set[str]:
    if term in ("all", "*"):
        return set(inv.hosts)
    if term.startswith("~"):
        try:
            rx = re.compile(term[1:])
        except re.error as exc:
            raise UserError(oneline(f"--limit {show(term)}: bad regular expression: {exc}")) \
                from None
        test = rx.search
    elif _GLOB.search(term):
        test = lambda name: fnmatch.fnmatchcase(name, term)  # noqa: E731
    else:
        found = set(inv.groups.get(term, ()))
        if term in inv.hosts:
            found.add(term)
        if not found and term not in inv.groups:
            raise unknown(inv, term)
        return found
    found = {h for h in inv.hosts if test(h)}
    for g, members in inv.groups.items():
        if test(g):
            found.update(members)
    if not found:
        raise UserError(oneline(f"{inv.path}: --limit pattern {show(term)} matches no host "
                                f"or group"))
    return found


def select(inv, limit: str | None) -> list:
    if limit is None or not str(limit).strip():
        return list(inv.hosts.values())
    union: set[str] = set()
    inter: list[set[str]] = []
    minus: set[str] = set()
    plain = False
    for term in (t.strip() for t in str(limit).split(",")):
        if not term:
            continue
        if term.startswith("!"):
            minus |= _match(inv, term[1:].strip())
        elif term.startswith("&"):
            inter.append(_match(inv, term[1:].strip()))
        else:
            union |= _match(inv, term)
            plain = True
    chosen = union if plain else set(inv.hosts)
    for s in inter:
        chosen &= s
    chosen -= minus
    if not chosen:
        raise UserError(oneline(f"{inv.path}: --limit {show(limit)} selects no hosts"))
    return [h for n, h in inv.hosts.items() if n in chosen]
