"""Playbooks, rollouts (canary, batches), provisioning."""
