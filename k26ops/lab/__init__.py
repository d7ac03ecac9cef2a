"""The local lab: real Debian hosts (systemd as PID 1, real sshd) booted with
systemd-nspawn, for rehearsing and testing k26ops.

Fenced off: nothing outside `k26ops.lab`, its CLI and the tests imports it.
Lab fixtures (the nvidia-smi and engine stand-ins) live in `fixtures/` and are
installed only on lab hosts.
"""

DEFAULT_BASE_PORT = 2221  # sshd port of the first lab host (the CLI's default without importing the lab)
