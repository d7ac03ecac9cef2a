"""Host keys: each known_hosts file is parsed once per content for the whole run (paramiko's
parse is quadratic and every connection did it again), and a client is given exactly the keys
paramiko's own rule would check for its host: the user's file decides when it knows the host,
the inventory's file only when it does not. Keys are real ed25519 keys; no host is needed."""

from __future__ import annotations

import paramiko

from k26ops.transport import ssh


def _key() -> paramiko.PKey:
    return paramiko.Ed25519Key.from_private_key(_pem())


def _pem():
    import io

    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import ed25519

    return io.StringIO(
        ed25519.Ed25519PrivateKey.generate()
        .private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.OpenSSH, serialization.NoEncryption())
        .decode()
    )


def _line(name: str, key: paramiko.PKey) -> str:
    return f"{name} {key.get_name()} {key.get_base64()}\n"


def test_a_known_hosts_file_is_parsed_once_per_content(tmp_path, monkeypatch):
    loads = []
    real = paramiko.HostKeys.load
    monkeypatch.setattr(paramiko.HostKeys, "load", lambda self, f: loads.append(f) or real(self, f))
    kh = tmp_path / "known_hosts"
    a, b = _key(), _key()
    kh.write_text(_line("[127.0.0.1]:2201", a))
    for _ in range(8):  # eight hosts' connections
        assert ssh._known_hosts(kh).lookup("[127.0.0.1]:2201")["ssh-ed25519"] == a
    assert len(loads) == 1
    with open(kh, "a") as fh:  # trust-on-first-use appends: the next connection sees it
        fh.write(_line("[127.0.0.1]:2202", b))
    assert ssh._known_hosts(kh).lookup("[127.0.0.1]:2202")["ssh-ed25519"] == b and len(loads) == 2
    kh.write_text(_line("[127.0.0.1]:2201", b))  # same size, other key: parsed again
    assert ssh._known_hosts(kh).lookup("[127.0.0.1]:2201")["ssh-ed25519"] == b and len(loads) == 3
    assert ssh._known_hosts(tmp_path / "missing") is None


def test_a_client_gets_the_keys_paramikos_rule_checks(tmp_path):
    user, inv = tmp_path / "user_known_hosts", tmp_path / "inv_known_hosts"
    k_user, k_inv, k_other, k_hashed = _key(), _key(), _key(), _key()
    hashed = paramiko.HostKeys.hash_host("10.0.0.9")  # HashKnownHosts yes; port 22 has no [..]:22
    user.write_text(_line("[10.0.0.1]:2222", k_user) + _line("[10.0.0.1]:2222", k_other) + _line(hashed, k_hashed))
    inv.write_text(_line("[10.0.0.1]:2222", k_inv) + _line("[10.0.0.2]:2222", k_inv))

    def known(host, port):
        client = paramiko.SSHClient()
        ssh._trust(client, host, port, [user, inv])
        found = client.get_host_keys().lookup(ssh._known_name(host, port))
        return None if found is None else {t: found[t] for t in found.keys()}

    assert known("10.0.0.1", 2222) == {"ssh-ed25519": k_user}  # the user's file decides; its first key
    assert known("10.0.0.2", 2222) == {"ssh-ed25519": k_inv}  # only the inventory's file knows it
    assert known("10.0.0.9", 22) == {"ssh-ed25519": k_hashed}  # a hashed name matches
    assert known("10.0.0.3", 2222) is None  # unknown: the strict policy refuses it
