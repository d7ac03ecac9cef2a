"""Crash diagnosis for SGLang engines: classify logs into stable signatures.

Public API: `classify(text)`, `classify_file(path)`, `Diagnosis`, `SIGNATURES`.
"""

from k26ops.diagnose.classify import Diagnosis, classify, classify_file
from k26ops.diagnose.signatures import PROBE_TAG, SIGNATURES, UNCLASSIFIED

__all__ = ["Diagnosis", "classify", "classify_file", "SIGNATURES", "PROBE_TAG", "UNCLASSIFIED"]
