"""Reaching hosts: SSH sessions, the host agents' protocol and hub, the fleet runner."""
