"""The crash classifier's accuracy on every log in tests/data/logs.

Labels come from tests/data/logs/MANIFEST.json (`label`: a signature id,
`unclassified` for an error of no known kind, `none` for a log with no error).
Per file it prints expected / got and a verdict:
  ok           the label was named (or unclassified / no error, as labelled);
  missed       a known kind was labelled but the log came out unclassified (or clean);
  WRONG        a known kind was named that is not the label (worse than none);
  FALSE-ALARM  a healthy log (label `none`) came out with an error (a script trusting
               the exit code would call that server crashed).
Totals follow: named right (known kinds named as labelled), wrong names, unclassified
(known kinds left unclassified), false alarms on healthy logs, and all ok.
Exit 1 if any log is named wrongly, missed or a false alarm, else 0.

    python bench/classify_accuracy.py [--only-new] [--json]
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
LOGS = REPO / "tests" / "data" / "logs"
sys.path.insert(0, str(REPO))


def got_label(diagnosis) -> str:
    """The label a Diagnosis earns: its signature, or `none` when no error was found."""
    if diagnosis.signature is None or not diagnosis.error_found:
        return "none"
    return diagnosis.signature


def verdict(expected: str, got: str) -> str:
    if got == expected:
        return "ok"
    if expected == "none":
        return "FALSE-ALARM"
    if got in ("unclassified", "none"):
        return "missed"
    return "WRONG"


def totals_of(rows: list[dict]) -> dict:
    """The counts the report prints (see the module docstring)."""
    known = [r for r in rows if r["expected"] not in ("none", "unclassified")]
    totals = {v: sum(r["verdict"] == v for r in rows) for v in ("ok", "missed", "WRONG", "FALSE-ALARM")}
    totals.update({
        "logs": len(rows),
        "known": len(known),
        "named_right": sum(r["verdict"] == "ok" for r in known),
        "wrong_names": totals["WRONG"],
        "unclassified": sum(r["got"] == "unclassified" for r in known),
        "healthy": sum(r["expected"] == "none" for r in rows),
        "false_alarms": totals["FALSE-ALARM"],
        "accuracy": round(totals["ok"] / len(rows), 3) if rows else None,
    })
    return totals


def results(logs: Path = LOGS, only_new: bool = False) -> list[dict]:
    """One row per log in the manifest: file, source, expected, got, verdict."""
    from k26ops.diagnose.classify import classify_file

    manifest = json.loads((logs / "MANIFEST.json").read_text())
    rows = []
    for name, entry in sorted(manifest.items()):
        if only_new and entry["source"] == "unknown":
            continue
        got = got_label(classify_file(logs / name))
        rows.append({"file": name, "source": entry["source"], "expected": entry["label"],
                     "got": got, "verdict": verdict(entry["label"], got)})
    return rows


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--only-new", action="store_true",
                    help="only logs with a known source (real or CONSTRUCTED)")
    ap.add_argument("--json", action="store_true", help="print the rows and totals as JSON")
    args = ap.parse_args(argv)
    rows = results(only_new=args.only_new)
    totals = totals_of(rows)
    if args.json:
        print(json.dumps({"rows": rows, "totals": totals}, indent=1))
    else:
        width = max(len(r["file"]) for r in rows)
        for r in rows:
            print(f"{r['file']:<{width}}  expected {r['expected']:<26} got {r['got']:<26} {r['verdict']}")
        print(f"\nnamed right {totals['named_right']}/{totals['known']} known crashes; wrong names "
              f"{totals['wrong_names']}; unclassified {totals['unclassified']}; false alarms "
              f"{totals['false_alarms']}/{totals['healthy']} healthy logs; "
              f"{totals['ok']}/{totals['logs']} as labelled ({totals['accuracy']:.1%})")
    return 1 if totals["WRONG"] or totals["missed"] or totals["FALSE-ALARM"] else 0


if __name__ == "__main__":
    sys.exit(main())
