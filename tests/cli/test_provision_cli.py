"""Bad values for the rolling-reboot options: one line, exit 2, before any host is read."""

from __future__ import annotations

import pytest

from labtools.invoke import cli


@pytest.mark.parametrize("cmd", ["reboot", "provision"])
@pytest.mark.parametrize(
    "args,why",
    [
        (["--reboot-timeout", "nan"], "nan is not a finite number of seconds"),  # would wait forever
        (["--reboot-timeout", "inf"], "inf is not a finite number of seconds"),
        (["--reboot-timeout", "2"], "2.0 is not in the range x>=5"),
        (["--canary", "0"], "0 is not in the range x>=1"),  # never all hosts at once
        (["--batch", "0"], "'0': a batch has at least one host"),
    ],
)
def test_bad_rolling_options_are_one_line_exit_2(cmd, args, why):
    proc = cli("-i", "/nonexistent.yml", cmd, *args, timeout=60)
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("k26ops: error: ") and why in lines[0], proc.stderr
