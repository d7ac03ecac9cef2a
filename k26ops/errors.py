"""Errors the user can act on: printed as one line, never as a traceback."""

# Exit codes (documented in README.md).
EXIT_OK = 0
EXIT_HOST_FAILED = 1  # at least one host failed or was unreachable
EXIT_USAGE = 2  # bad input: inventory, option, file; nothing was changed
EXIT_NO_GPU = 3  # selftest: a host has no GPU
EXIT_INTERRUPTED = 130  # Ctrl-C


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
