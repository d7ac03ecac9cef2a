"""The Ansible comparison (bench/converged.py) and the deploy check the same state.

The playbook's release and sglang checks take their values from
`steps.release.expected_state`, the function the deploy takes its release id
from. These tests fail when the playbook stops checking those values, or when
they stop being the ones a host of each lab engine source holds.
"""

import re
from pathlib import Path

from k26ops.release import recipe as recipe_mod
from k26ops.steps import release

REPO = Path(__file__).resolve().parent.parents[1]
PLAYBOOK = REPO / "bench" / "ansible_playbooks" / "converged.yml"


def test_each_lab_source_gives_the_version_its_venv_reports():
    # the versions tests/release/test_steps_release.py reads back from a deployed lab host
    git = release.expected_state(recipe_mod.load("lab"))
    reg = release.expected_state(recipe_mod.load("lab-registry"))
    assert git["sglang_version"] == "0.5.23+lab" and reg["sglang_version"] == "0.5.23"
    assert git["release_id"].startswith("sglang-a7e4c020c4b6-") and reg["release_id"].startswith("sglang0.5.23-")
    assert git["cuda_version"] == reg["cuda_version"] == "13.0"


def test_the_playbook_checks_the_expected_state_exactly():
    text = PLAYBOOK.read_text()
    code = "\n".join(line.split("#", 1)[0] for line in text.splitlines())
    used = set(re.findall(r"[a-z_]+", code))
    assert set(release.expected_state(recipe_mod.load("lab"))) <= used
    # the version line must equal pip's (`Version: 0.5.23+lab`), not merely contain it
    assert "('Version: ' ~ sglang_version) not in sgpkg.stdout_lines" in text
    assert 'src: "{{ release_id }}"' in text and "releases/{{ release_id }}/manifest.json" in text
