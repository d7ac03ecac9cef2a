"""Become: hosts reached as a normal user with passwordless sudo (inventory
`become: true`, Ansible's `ansible_become`). First the inventory field in both
shapes (no hosts), then the real CLI against a scratch lab host on which each
test creates the login user k26 (key login, a sudoers drop-in checked by visudo)."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner

from k26ops.cli import cli
from k26ops.host.lock import HostLock, HostLocked
from k26ops.inventory import load
from k26ops.transport.ssh import connect, q
from labtools.hostile import HOSTILE
from labtools.invoke import k26ops, k26ops_json, lab_ssh

USER = "k26"
NOPASSWD = f"{USER} ALL=(ALL) NOPASSWD:ALL"
UNIT = "k26-engine.service"
MARK = "/var/tmp/k26-become-mark"
SUDO_PASSWORD = f"sudo -n failed for user {USER}: a password is required (become needs passwordless sudo for this user)"


@pytest.fixture(autouse=True)
def _no_ssh_config(monkeypatch):
    monkeypatch.setenv("K26OPS_SSH_CONFIG", "")


def _write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "inv.yml"
    path.write_text(text)
    return path


def _cli(*args):
    return CliRunner().invoke(cli, list(args), catch_exceptions=False)


# ------------------------------------------------------------- inventory field


def test_native_become_from_host_group_and_all_vars(tmp_path):
    inv = load(
        _write(
            tmp_path,
            """\
vars: {become: true}
hosts:
  a: {address: 10.0.0.1}
  b: {address: 10.0.0.2, become: false}
  c: {address: 10.0.0.3}
  d: {address: 10.0.0.4, vars: {become: true}}
groups:
  cpu:
    hosts: [c, d]
    vars: {become: false}
""",
        )
    )
    assert {n: h.become for n, h in inv.hosts.items()} == {"a": True, "b": False, "c": False, "d": True}
    assert inv.hosts["a"].origins["become"] == "all, var become, line 1"
    assert inv.hosts["b"].origins["become"] == "host, var become, line 4"
    assert load(_write(tmp_path, "hosts:\n  a: {address: 10.0.0.1}\n")).hosts["a"].become is False


def test_ansible_become_words_precedence_and_notes():
    inv = load(Path(__file__).parent.parent / "data/inventories/ansible-become.yml")
    assert {n: h.become for n, h in inv.hosts.items()} == {"g1": True, "g2": False, "g3": True, "c1": False, "c2": True}
    assert any(
        n.startswith("ansible_become_password is ignored: k26ops never sends a sudo password")
        for n in inv.hosts["g3"].notes
    )
    assert inv.warnings == []


def test_ansible_become_jinja_is_kept_off_with_a_note(tmp_path):
    inv = load(_write(tmp_path, 'all:\n  hosts:\n    a:\n      ansible_become: "{{ x }}"\n'))
    assert inv.hosts["a"].become is False
    assert any(n.startswith("become is a Jinja expression, not evaluated") for n in inv.hosts["a"].notes)


def test_inventory_list_and_show_say_become(tmp_path):
    path = _write(
        tmp_path,
        "hosts:\n  a: {address: 10.0.0.1, user: ubuntu, become: true}\n  b: {address: 10.0.0.2, user: ubuntu}\n",
    )
    doc = json.loads(_cli("-i", str(path), "--json", "inventory", "list").stdout)
    assert (doc["hosts"]["a"]["become"], doc["hosts"]["b"]["become"]) == (True, False)
    out = CliRunner(env={"COLUMNS": "200"}).invoke(cli, ["-i", str(path), "inventory", "list"]).stdout
    assert "ubuntu (become)" in out and out.count("(become)") == 1
    out = CliRunner(env={"COLUMNS": "200"}).invoke(cli, ["-i", str(path), "inventory", "show", "a"]).stdout
    assert any(
        "become" in line and "True" in line and "host, var become, line 2" in line for line in out.splitlines()
    ), out


BAD = {
    # name: (inventory text, expected message after "k26ops: error: {path}")
    "native string": (
        'hosts:\n  a:\n    address: 10.0.0.1\n    become: "yes"\n',
        ":4: host 'a': become must be true or false, got 'yes' (from host, become)",
    ),
    "native integer": (
        "hosts:\n  a: {address: 10.0.0.1}\ngroups:\n  g:\n    hosts: [a]\n    vars:\n      become: 1\n",
        ":7: host 'a': become must be true or false, got 1 (from group g, become)",
    ),
    "ansible word": (
        "all:\n  hosts:\n    a:\n      ansible_become: maybe\n",
        ":4: host 'a': become must be true or false, got 'maybe' (from host, ansible_become)",
    ),
    "ansible method": (
        "all:\n  vars:\n    ansible_become: true\n    ansible_become_method: su\n  hosts:\n    a:\n",
        ":4: host 'a': ansible_become_method 'su' is not supported: k26ops becomes root "
        "with sudo, so only 'sudo' (from all, ansible_become_method)",
    ),
    "ansible user": (
        "all:\n  hosts:\n    a:\n      ansible_become: yes\n      ansible_become_user: postgres\n",
        ":5: host 'a': ansible_become_user 'postgres' is not supported: k26ops becomes "
        "root with sudo, so only 'root' (from host, ansible_become_user)",
    ),
}


@pytest.mark.parametrize("name", list(BAD))
def test_bad_become_is_one_line_naming_file_line_and_value(name, tmp_path):
    text, expected = BAD[name]
    path = _write(tmp_path, text)
    result = _cli("-i", str(path), "inventory", "list")
    assert (result.exit_code, result.stdout) == (2, "")
    assert result.stderr == f"k26ops: error: {path}{expected}\n"


# ------------------------------------------------------------- on a lab host


def root(lab, command: str) -> str:
    res = lab_ssh(lab.dir, lab.hosts[0].port, command)
    assert res.returncode == 0, (command, res.stdout, res.stderr)
    return res.stdout


def add_user(lab, sudoers: str | None) -> None:
    """User k26 logging in with the lab's key; `sudoers`: its drop-in rule, if any."""
    pub = (lab.dir / "id_ed25519.pub").read_text().strip()
    home = f"/home/{USER}"
    script = (
        f"set -e; useradd -m -s /bin/bash {USER}; install -d -m 700 -o {USER} -g {USER} {home}/.ssh; "
        f"printf '%s\\n' {q(pub)} > {home}/.ssh/authorized_keys; "
        f"chown {USER}:{USER} {home}/.ssh/authorized_keys; chmod 600 {home}/.ssh/authorized_keys"
    )
    if sudoers:  # sudo skips names with a dot: the temp file is never read
        script += (
            f"; printf '%s\\n' {q(sudoers)} > /etc/sudoers.d/.{USER}.tmp; "
            f"visudo -cf /etc/sudoers.d/.{USER}.tmp; chmod 440 /etc/sudoers.d/.{USER}.tmp; "
            f"mv /etc/sudoers.d/.{USER}.tmp /etc/sudoers.d/{USER}"
        )
    root(lab, script)
    login = lab_ssh(lab.dir, lab.hosts[0].port, "id -un", user=USER)
    assert login.stdout.strip() == USER, login.stderr


def mark(lab) -> None:
    root(lab, f"touch {MARK}")


def changed_since_mark(lab) -> list[str]:
    """Every file written since mark(), but the journal and /run (where logging in
    and sudo itself leave their records)."""
    out = root(
        lab, f"find / /tmp /dev/shm -xdev -newer {MARK} ! -path '/var/log/journal*' ! -path /run 2>/dev/null | sort"
    )
    return out.split()


def k26_inventory(lab, tmp_path: Path, name: str, become: bool | None, **host_vars) -> Path:
    """The lab's inventory, logging in as k26 (with `become` if not None)."""
    inv = yaml.safe_load(lab.inventory.read_text())
    host = inv["hosts"]["lab1"]
    host["user"] = USER
    if become is not None:
        host["become"] = become
    host["vars"].update(host_vars)
    path = tmp_path / f"{name}.yml"
    path.write_text(yaml.safe_dump(inv, sort_keys=False))
    return path


def failed_one_line(inv: Path, *args: str) -> str:
    """Run the CLI, expect lab1 failed with a one-line error (JSON and human); return it."""
    rc, doc = k26ops_json("-i", str(inv), *args)
    r = doc["hosts"]["lab1"]
    assert (rc, r["status"]) == (1, "failed"), doc
    assert "\n" not in r["error"]
    human = k26ops("-i", str(inv), *args)
    assert human.returncode == 1 and "Traceback" not in human.stdout + human.stderr
    return r["error"]


def test_deploy_as_a_sudoer_with_become(scratch_lab, tmp_path):
    lab = scratch_lab
    add_user(lab, NOPASSWD)
    inv = k26_inventory(lab, tmp_path, "become", True)
    rc, doc = k26ops_json("-i", str(inv), "deploy", timeout=900)
    assert (rc, doc["hosts"]["lab1"]["status"]) == (0, "changed"), doc
    assert root(lab, f"systemctl is-active {UNIT}").strip() == "active"
    # everything k26ops wrote is root's: commands and uploads ran as root
    assert root(lab, f"find /opt/k26ops /etc/k26ops /etc/systemd/system/{UNIT} ! -user root -o ! -group root") == ""
    assert root(lab, "stat -c '%U %a' /etc/k26ops/sglang.env /opt/k26ops/releases/current/manifest.json").split("\n")[
        :2
    ] == ["root 600", "root 644"]
    # ... through sudo, by k26 (sudo logs every command it runs)
    assert f"{USER} : PWD=" in root(lab, "journalctl --no-pager -q _COMM=sudo | tail -n 50")
    # no upload temp files left (the login user's, nor root's beside the targets); lock released
    assert root(lab, "find / /tmp -xdev \\( -name 'k26ops-put.*' -o -name '*.k26ops-tmp-*' \\) -print") == ""
    assert root(lab, "ls /opt/k26ops/state/lock.owner 2>/dev/null || true") == ""
    # converged: a second run reads everything back through sudo and changes nothing
    rc, doc = k26ops_json("-i", str(inv), "deploy", timeout=600)
    assert (rc, doc["hosts"]["lab1"]["status"]) == (0, "ok"), doc


def test_normal_user_without_become_is_told_to_set_it_and_nothing_changes(scratch_lab, tmp_path):
    lab = scratch_lab
    add_user(lab, NOPASSWD)  # sudo would work: it is become that is missing
    inv = k26_inventory(lab, tmp_path, "plain", None)
    mark(lab)
    err = failed_one_line(inv, "deploy")
    assert err.startswith(f"logged in as {USER}, not root: ") and "set `become: true`" in err, err
    err = failed_one_line(inv, "check")
    assert f"root: commands run as {USER} (uid 1000), not root: set `become: true`" in err, err
    assert changed_since_mark(lab) == []


def test_sudo_that_wants_a_password_fails_up_front_and_nothing_changes(scratch_lab, tmp_path):
    lab = scratch_lab
    add_user(lab, f"{USER} ALL=(ALL) ALL")
    inv = k26_inventory(lab, tmp_path, "become", True)
    mark(lab)
    assert failed_one_line(inv, "deploy") == SUDO_PASSWORD
    assert failed_one_line(inv, "facts") == SUDO_PASSWORD  # even reading needs it: all runs as root
    assert changed_since_mark(lab) == []
    root(lab, f"rm /etc/sudoers.d/{USER}")  # not a sudoer at all: sudo -n says the same
    mark(lab)
    assert failed_one_line(inv, "deploy") == SUDO_PASSWORD
    assert changed_since_mark(lab) == []


def test_hostile_values_survive_quoting_under_sudo(scratch_lab, tmp_path):
    """The hostile inventory values of test_fleet, measured as literal paths
    through sudo; and commands, stdin and uploads of a become session."""
    lab = scratch_lab
    add_user(lab, NOPASSWD)
    for i, value in enumerate(HOSTILE):  # path variables: refused at load, nothing reaches the host
        inv = k26_inventory(lab, tmp_path, f"h{i}", True, model_path=value, releases_root=value)
        proc = k26ops("-i", str(inv), "facts")
        assert proc.returncode == 2 and proc.stderr.count("\n") == 1 and "host 'lab1'" in proc.stderr
    odd = "/srv/m=1,x+y@z/K2.6_b-c"  # every character a path may hold, measured as the literal path
    rc, doc = k26ops_json(
        "-i", str(k26_inventory(lab, tmp_path, "odd", True, model_path=odd, releases_root=odd)), "facts"
    )
    assert rc == 0, doc
    facts = doc["hosts"]["lab1"]["facts"]
    assert facts["user"] == {"uid": 0, "name": "root", "error": None}
    assert odd in facts["disk_free"]

    host = load(k26_inventory(lab, tmp_path, "session", True)).hosts["lab1"]
    session = connect(host)
    try:
        for value in HOSTILE + ['it\'s "quoted" \\ $HOME %s `id` \t end']:
            assert session.run(f"printf '%s' {q(value)}").stdout == value
            assert session.run("cat", stdin=value).stdout == value
        weird = "/root/it's a $(touch PWNED9) `touch PWNED10`; name"
        session.put(b"data\n", weird, 0o640)
        session.put_file(Path(__file__), weird + ".py", 0o600)
        assert session.run("id -un").stdout.strip() == "root"
    finally:
        session.close()
    assert root(lab, f"stat -c '%U %a %s' {q(weird)} {q(weird + '.py')}").split("\n")[:2] == [
        "root 640 5",
        f"root 600 {Path(__file__).stat().st_size}",
    ]
    assert root(lab, "find / /tmp -xdev -name 'PWNED*'") == ""
    assert not list(Path("/tmp").glob("PWNED*"))
    assert root(lab, "find / /tmp -xdev \\( -name 'k26ops-put.*' -o -name '*.k26ops-tmp-*' \\) -print") == ""


def test_host_lock_under_sudo_is_still_tied_to_the_channel(scratch_lab, tmp_path):
    lab = scratch_lab
    add_user(lab, NOPASSWD)
    host = load(k26_inventory(lab, tmp_path, "lock", True)).hosts["lab1"]
    first, second = connect(host), connect(host)
    try:
        HostLock(first, "/opt/k26ops/state", "first").acquire()
        assert root(lab, "stat -c %U /opt/k26ops/state/lock.owner").strip() == "root"
        with pytest.raises(HostLocked, match="locked by another k26ops run: .* \\(first\\)"):
            HostLock(second, "/opt/k26ops/state", "second").acquire()
        first.close()  # the run dies without releasing: its lock must go with its channel
        lock = HostLock(second, "/opt/k26ops/state", "second")
        for _ in range(50):
            try:
                lock.acquire()
                break
            except HostLocked:
                time.sleep(0.1)
        assert lock.chan is not None and lock.stale["purpose"] == "first"
        lock.release()
    finally:
        first.close()
        second.close()
    assert root(lab, "ls /opt/k26ops/state/lock.owner 2>/dev/null || true") == ""
