"""Compute capability from a GPU's name, for nvidia-smi versions that predate the
`compute_cap` query field. Why so small: a wrong capability passes or fails
preflight wrongly, so only names whose capability is certain are listed, and
a truncated name ("NVIDIA A100-SXM...") counts only when the cut falls after
the part that decides. Anything else is unknown (None), never guessed.
"""

from __future__ import annotations

import re

# (pattern on the name as printed, capability); \b after the model number so
# that "H20" does not match "H200". Sources: NVIDIA's CUDA GPUs list.
KNOWN = (
    (r"(NVIDIA )?(Tesla )?V100\b", "7.0"),
    (r"(NVIDIA )?(Tesla )?T4\b", "7.5"),
    (r"(NVIDIA )?A(100|800|30)\b", "8.0"),
    (r"(NVIDIA )?A(40|10)\b", "8.6"),
    (r"NVIDIA L(4|40|40S)\b", "8.9"),
    (r"NVIDIA (H100|H200|H800|H20|GH200)\b", "9.0"),
    (r"NVIDIA (B200|GB200)\b", "10.0"),
    (r"NVIDIA (B300|GB300)\b", "10.3"),
    (r"NVIDIA RTX PRO 6000\b", "12.0"),
)


def from_name(name: str | None) -> str | None:
    """The capability where the name decides it, else None."""
    if not name:
        return None
    truncated = name.endswith("...")
    shown = name[:-3] if truncated else name
    for pat, cc in KNOWN:
        m = re.match(pat, shown)
        if m and not (truncated and m.end() >= len(shown)):  # the cut may hide a suffix
            return cc
    return None
