"""Errors the user can act on: printed as one line, never as a traceback."""

# Exit codes; what each means to a user is EXIT_MEANINGS below, from which
# docs/reference/exit-codes.md is generated (tools/docgen.py).
EXIT_OK = 0
EXIT_HOST_FAILED = 1  # at least one host failed or was unreachable
EXIT_USAGE = 2  # bad input: inventory, option, file; nothing was changed
EXIT_NO_GPU = 3  # selftest: a host has no GPU
EXIT_INTERRUPTED = 130  # Ctrl-C
EXIT_MEANINGS = {  # 141 is k26ops.cli.pipe.EXIT_CLOSED_PIPE (tests/architecture/test_docs_reference.py holds them together)
    EXIT_OK: "every host ok (or changed); `diagnose log`/`service`: a known crash was named, or the log "
    'holds no error at all ("no crash found")',
    EXIT_HOST_FAILED: "at least one host failed, was unreachable or was skipped; `diagnose log`: the log holds "
    "an error that matched no known crash (`unclassified`); `diagnose service`: a host's "
    "last crash matched none",
    EXIT_USAGE: "bad input (inventory, option, file, tag): one line naming it; nothing changed",
    EXIT_NO_GPU: "`selftest`: a host has no GPU",
    EXIT_INTERRUPTED: "interrupted (Ctrl-C, SIGTERM, a closed terminal); the hosts that did not finish are named",
    141: "the output went away (`k26ops deploy 2>&1 | head -1`): printing stopped, the run was interrupted "
    "as by Ctrl-C (hosts not started untouched, hosts in progress restored or finished), whatever the "
    "hosts' outcome; `k26ops status` shows where each host is",
}


class UserError(Exception):
    """Bad input or an unmet precondition. The message is one line naming the
    file, line, host or value; the run changed nothing."""

    exit_code = EXIT_USAGE

    def __init__(self, message: str, exit_code: int | None = None):
        super().__init__(message)
        if exit_code is not None:
            self.exit_code = exit_code


class StepFailed(Exception):
    """A host could not reach its desired state (a step, an agent, a check); the
    message says why, in one line. The host fails; the others go on."""


class Interrupted(StepFailed):
    """The run was interrupted (Ctrl-C, SIGTERM, SIGHUP): handled like a failure of the step."""


class HostKeyRefused(Exception):
    """The host's key is unknown or differs from the recorded one."""


class Unreachable(Exception):
    """The host could not be connected to (network, timeout, auth)."""


class BecomeFailed(Unreachable):
    """Connected, but `sudo -n` does not work for the login user: no command
    can run as root, so nothing is run. (An Unreachable, so every caller that
    reports a failed connection reports this too; the fleet calls it failed.)"""
