"""Inventories built to size, for the bounds tests (tests/inventory/test_inventory_bounds.py) and
their benchmark (bench/inventory_load.py): the alias bomb, 10,000 hosts, and aliases and hosts just
under k26ops' limits."""

from __future__ import annotations

from k26ops.inventory import yamlsrc

# The classic "billion laughs", inside vars where k26ops merges and walks it.
BOMB = "".join(f"  {c}: &{c} [{','.join(['*' + p] * 9)}]\n" for p, c in zip("abcdefgh", "bcdefghi"))
BOMB = (
    'vars:\n  a: &a ["lol","lol","lol","lol","lol","lol","lol","lol","lol"]\n'
    + BOMB
    + "hosts: {x: {address: 127.0.0.1}}\n"
)


def big_inventory(n: int) -> str:
    lines = ["vars: {user: root, gpus_per_host: 8}", "hosts:"]
    lines += [
        f"  gpu{i:05d}: {{address: 127.0.{i // 250}.{i % 250 + 1}, vars: {{engine_port: {30000 + i % 100}}}}}"
        for i in range(n)
    ]
    lines += ["groups:", "  fleet:", "    hosts: [" + ", ".join(f"gpu{i:05d}" for i in range(n)) + "]"]
    return "\n".join(lines) + "\n"


def alias_values(levels: int = 5, width: int = 11, top: int = 10) -> str:
    """Under 450 bytes (the vault value included) that expand to 1,966,446 values, just under MAX_EXPANDED_NODES:
    allowed, so every command must handle them without walking each copy."""
    lines = ["vars:", f"  a0: &a0 [{','.join(['1'] * width)}]"]
    lines += [f"  a{i}: &a{i} [{','.join([f'*a{i - 1}'] * width)}]" for i in range(1, levels)]
    lines += [
        f"  z: [{','.join([f'*a{levels - 1}'] * top)}]",
        "  token: !vault |\n    $ANSIBLE_VAULT;1.1;AES256\n    6162",
        "hosts: {x: {address: 127.0.0.1}, y: {address: 127.0.0.2}}",
    ]
    return "\n".join(lines) + "\n"


def many_hosts(limit: int = yamlsrc.MAX_BYTES) -> str:
    """An Ansible-shape inventory of as many hosts as fit just under the size limit (~215,000)."""
    head = "all:\n  vars: {gpus_per_host: 8}\n  children:\n    gpu:\n      hosts:\n"
    line = "        gpu{:06d}: {{ansible_host: 10.{}.{}.{}}}\n"
    out, size, i = [head], len(head), 0
    while True:
        text = line.format(i, i >> 16 & 255, i >> 8 & 255, i & 255)
        if size + len(text) > limit - 100:
            return "".join(out)
        out.append(text)
        size += len(text)
        i += 1
