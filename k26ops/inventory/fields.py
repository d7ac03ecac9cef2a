"""A host's effective connection fields: which inventory value wins, where it
came from, and whether it is usable (k26ops never evaluates Jinja or decrypts
vault values; it keeps them and says so)."""

from __future__ import annotations

import shlex

from k26ops.hostvars import Var, declare
from k26ops.inventory.graph import Graph, Origin
from k26ops.inventory.sshconfig import SSHConfig
from k26ops.inventory.yamlsrc import Vault, is_jinja, show, type_name

STRING_FIELDS = ("address", "user", "identity_file", "gateway", "known_hosts")

# Ansible variable names per field; a later name wins, as in ansible's ssh plugin.
ANSIBLE_VARS = {
    "address": ("ansible_host", "ansible_ssh_host"),
    "port": ("ansible_port", "ansible_ssh_port"),
    "user": ("ansible_user", "ansible_ssh_user"),
    "identity_file": ("ansible_private_key_file", "ansible_ssh_private_key_file"),
    "connection": ("ansible_connection",),
    "become": ("ansible_become",),
}
declare(
    __name__,
    "how k26ops reaches the host (native shape; also in vars at any level)",
    Var("address", "str", None, "address or name ssh connects to", "the host's name"),
    Var("port", "int", None, "sshd port", "22 (or ssh config)"),
    Var("user", "str", None, "login user", "ssh config / login user"),
    Var("identity_file", "path (local)", None, "private key file on this machine", "ssh defaults"),
    Var("gateway", "str", None, "ProxyJump bastion: [user@]host[:port][,...]"),
    Var("known_hosts", "path (local)", None, "an extra known_hosts file", "~/.ssh/known_hosts"),
    Var("connection", "ssh|local", "ssh", "local runs commands on this machine"),
    Var("become", "bool", False, "run every command as root via `sudo -n`"),
)
# Ansible's own variables that k26ops reads (the rest of ansible_* is Ansible's
# business: known, never warned about, never read).
declare(
    __name__,
    "Ansible variables k26ops reads (Ansible shape)",
    *(
        Var(name, kind, None, meaning)
        for name, kind, meaning in (
            ("ansible_host", "str", "address"),
            ("ansible_ssh_host", "str", "address (older name)"),
            ("ansible_port", "int", "port"),
            ("ansible_ssh_port", "int", "port (older name)"),
            ("ansible_user", "str", "user"),
            ("ansible_ssh_user", "str", "user (older name)"),
            ("ansible_private_key_file", "path (local)", "identity_file"),
            ("ansible_ssh_private_key_file", "path (local)", "identity_file"),
            ("ansible_connection", "str", "ssh (and its aliases) or local"),
            ("ansible_become", "bool", "become"),
            ("ansible_become_method", "str", "must be sudo when become is on"),
            ("ansible_become_user", "str", "must be root when become is on"),
            ("ansible_ssh_common_args", "str", "-J/ProxyJump/ProxyCommand -> gateway; UserKnownHostsFile"),
            ("ansible_ssh_extra_args", "str", "as ansible_ssh_common_args"),
            ("ansible_group_priority", "int", "orders groups of equal depth when merging vars"),
        )
    ),
)
# Ansible's boolean words (module_utils convert_bool), for ansible_become.
ANSIBLE_TRUE = ("y", "yes", "on", "1", "true", "t")
ANSIBLE_FALSE = ("n", "no", "off", "0", "false", "f")
# Become means root through sudo, nothing else: these may only say that.
BECOME_METHODS = ("sudo", "ansible.builtin.sudo")
BECOME_PASSWORD_VARS = ("ansible_become_password", "ansible_become_pass", "ansible_sudo_pass")
SSH_ARGS = ("ansible_ssh_common_args", "ansible_ssh_extra_args")
ANSIBLE_SSH_CONNECTIONS = (
    "ssh",
    "paramiko",
    "smart",
    "paramiko_ssh",
    "ansible.builtin.ssh",
    "ansible.builtin.paramiko_ssh",
)


def ssh_args_options(args: str) -> dict:
    """gateway / known_hosts from ssh arguments: `-J x`, `-o ProxyJump=x`,
    `-o ProxyCommand="ssh -W %h:%p x"`, `-o UserKnownHostsFile=x`. First wins, as in ssh."""
    words = shlex.split(args)
    out: dict = {}
    i = 0
    while i < len(words):
        w = words[i]
        opt = None
        if w == "-J" and i + 1 < len(words):
            out.setdefault("gateway", words[i + 1])
            i += 2
            continue
        if w.startswith("-J") and len(w) > 2:
            out.setdefault("gateway", w[2:])
        elif w == "-o" and i + 1 < len(words):
            opt = words[i + 1]
            i += 1
        elif w.startswith("-o") and len(w) > 2:
            opt = w[2:]
        if opt:
            key, _, value = opt.replace("=", " ", 1).partition(" ")
            key, value = key.strip().lower(), value.strip()
            if key == "proxyjump" and value and value.lower() != "none":
                out.setdefault("gateway", value)
            elif key == "proxycommand":
                jump = _proxycommand_host(value)
                if jump:
                    out.setdefault("gateway", jump)
            elif key == "userknownhostsfile" and value:
                out.setdefault("known_hosts", value.split()[0])
        i += 1
    return out


def _proxycommand_host(command: str) -> str | None:
    """`ssh [-p P] [-l U] -W %h:%p [user@]bastion` -> [user@]bastion[:P]."""
    try:
        words = shlex.split(command)
    except ValueError:
        return None
    if not words or words[0].rsplit("/", 1)[-1] != "ssh" or "-W" not in words:
        return None
    port = user = host = None
    i = 1
    while i < len(words):
        w = words[i]
        if w in ("-p", "-l", "-W", "-i", "-o", "-F") and i + 1 < len(words):
            if w == "-p":
                port = words[i + 1]
            elif w == "-l":
                user = words[i + 1]
            i += 2
            continue
        if not w.startswith("-"):
            host = w
        i += 1
    if not host:
        return None
    if user and "@" not in host:
        host = f"{user}@{host}"
    return f"{host}:{port}" if port else host


class Resolved:
    """Effective field values with their origins and notes."""

    def __init__(self):
        self.values: dict = {}
        self.origins: dict[str, Origin] = {}
        self.notes: list[str] = []
        self.unresolved: list[str] = []


def resolve(graph: Graph, host: str, values: dict, origins: dict[str, Origin], shape: str, ssh: SSHConfig) -> Resolved:
    r = Resolved()
    node = graph.hosts[host]
    if shape == "native":
        for f in ("address", "port", "user", "identity_file", "gateway", "known_hosts", "connection", "become"):
            if f in node.fields and node.fields[f][0] is not None:
                r.values[f] = node.fields[f][0]
                r.origins[f] = Origin("host", node.fields[f][1], f)
            elif values.get(f) is not None:
                r.values[f] = values[f]
                r.origins[f] = origins[f]
    else:
        for f, names in ANSIBLE_VARS.items():
            for name in names:
                if values.get(name) is not None:
                    r.values[f] = values[name]
                    r.origins[f] = origins[name]
        for name in SSH_ARGS:
            args = values.get(name)
            if args is None:
                continue
            if not isinstance(args, str) or is_jinja(args):
                r.notes.append(f"{name} is not plain text; gateway not read from it")
                continue
            try:
                found = ssh_args_options(args)
            except ValueError as exc:
                r.notes.append(f"{name} cannot be split like a shell line ({exc}); ignored")
                continue
            for f, v in found.items():
                if f not in r.values:
                    r.values[f] = v
                    r.origins[f] = origins[name]
    _check(graph, host, r)
    if shape != "native":
        _check_become_vars(graph, host, values, origins, r)
    lookup_name = (
        r.values.get("address") if isinstance(r.values.get("address"), str) and "address" not in r.unresolved else host
    )
    for f, v in ssh.lookup(lookup_name).items():
        if f not in r.values and f not in r.unresolved:
            r.values[f] = v
            r.origins[f] = Origin("ssh_config", None, None)
    if "address" not in r.values and "address" not in r.unresolved:
        if shape == "native" and r.values.get("connection") != "local":  # local needs no address
            graph.fail(node.line, f"host {show(host)}: no address (set address:, or a HostName in ssh config)")
        r.values["address"] = host
        r.origins["address"] = Origin("host name")
    return r


def _where(o: Origin) -> str:
    src = o.level + (f", {o.var}" if o.var else "")
    return f"from {src}"


def _check(graph: Graph, host: str, r: Resolved) -> None:
    """Types and ranges; unevaluated values are kept (strings) or dropped (port)."""
    for f in list(r.values):
        v, o = r.values[f], r.origins[f]
        if isinstance(v, Vault) or is_jinja(v):
            kind = "a !vault value, not decrypted" if isinstance(v, Vault) else "a Jinja expression, not evaluated"
            r.notes.append(f"{f} is {kind}: {show(v)} ({_where(o)})")
            r.unresolved.append(f)
            if f in ("port", "connection", "become"):
                del r.values[f]
            else:
                r.values[f] = "<vault>" if isinstance(v, Vault) else v
            continue
        prefix = f"host {show(host)}: {f}"
        if f == "port":
            if isinstance(v, str) and v.strip().isdigit() and o.var != f:  # ansible: "2222"
                v = int(v.strip())
            if isinstance(v, bool) or not isinstance(v, int) or not 1 <= v <= 65535:
                graph.fail(o.line, f"{prefix} must be an integer 1..65535, got {show(v)} ({_where(o)})")
            r.values[f] = v
        elif f == "become":
            r.values[f] = _become(graph, prefix, v, o)
        elif f == "connection":
            if not isinstance(v, str):
                graph.fail(o.line, f"{prefix} must be ssh or local, got {show(v)} ({_where(o)})")
        elif f in STRING_FIELDS:
            if isinstance(v, (int, float)) and not isinstance(v, bool) and o.var != f:
                v = str(v)  # ansible converts e.g. ansible_user: 1000
            if not isinstance(v, str) or not v:
                graph.fail(o.line, f"{prefix} must be a non-empty string, got {type_name(v)} ({_where(o)})")
            spaces = f not in ("identity_file", "known_hosts")  # paths may hold spaces
            if any((spaces and c.isspace()) or not (c.isprintable() or c == " ") for c in v) or v.startswith("-"):
                graph.fail(o.line, f"{prefix} {show(v)} has spaces, control characters or a leading '-' ({_where(o)})")
            r.values[f] = v


def _become(graph: Graph, prefix: str, v, o: Origin) -> bool:
    """`become` (native: a YAML boolean) or `ansible_become` (Ansible's boolean
    words too, e.g. "yes" from an INI-converted inventory)."""
    if isinstance(v, bool):
        return v
    if o.var != "become":
        word = v.strip().lower() if isinstance(v, str) else v
        if word in ANSIBLE_TRUE or (word == 1 and not isinstance(word, bool)):
            return True
        if word in ANSIBLE_FALSE or (word == 0 and not isinstance(word, bool)):
            return False
    graph.fail(o.line, f"{prefix} must be true or false, got {show(v)} ({_where(o)})")


def _check_become_vars(graph: Graph, host: str, values: dict, origins: dict[str, Origin], r: Resolved) -> None:
    """With become on, ansible_become_method/_user may only ask for root via
    sudo (what k26ops does); a sudo password var is noted as never used. Off,
    they are ignored, as ansible ignores them without become."""
    if not r.values.get("become"):
        return
    for var, allowed, want in (
        ("ansible_become_method", BECOME_METHODS, "sudo"),
        ("ansible_become_user", ("root",), "root"),
    ):
        v = values.get(var)
        if v is not None and v not in allowed:
            o = origins[var]
            graph.fail(
                o.line,
                f"host {show(host)}: {var} {show(v)} is not supported: k26ops "
                f"becomes root with sudo, so only {want!r} ({_where(o)})",
            )
    for var in BECOME_PASSWORD_VARS:
        if values.get(var) is not None:
            r.notes.append(
                f"{var} is ignored: k26ops never sends a sudo password (become needs passwordless sudo, `sudo -n`)"
            )
