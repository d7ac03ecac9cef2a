"""One host: preflight, ownership, the host lock, reboot."""
