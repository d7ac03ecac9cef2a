"""Test helpers around the lab, one module per concern:

- `ports`: free loopback ports, per xdist worker;
- `invoke`: k26ops in a subprocess or in-process, `--json` checked against its shape, ssh to a lab host;
- `labs`: private labs (`private_lab`, `RunningLab`) and the real sglang-router;
- `recipes`: lab recipes, series and patches, tiny git engines;
- `fixtures`: the lab's stand-ins run as programs (kernel log, nvidia-smi, engine);
- `inventories`: inventories built to size (bounds tests and their benchmark);
- `hostile`: path values that would run a command if a shell saw them unquoted;
- `order`: the order xdist hands test files out in;
- `browser`: headless Chromium for the HTML report;
- `source`: k26ops' modules parsed once per run.
"""

from pathlib import Path

REPO = Path(__file__).resolve().parent.parent.parent
