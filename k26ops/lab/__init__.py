"""The local lab: real Debian hosts (systemd as PID 1, real sshd) booted with
systemd-nspawn, for rehearsing and testing k26ops.

Fenced off: nothing outside `k26ops.lab`, its CLI and the tests imports it.
Lab fixtures (the nvidia-smi and engine stand-ins) live in `fixtures/` and are
installed only on lab hosts.
"""
