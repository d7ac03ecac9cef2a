"""The engine on a host: its profile and argv, the systemd unit, its state, multinode."""
