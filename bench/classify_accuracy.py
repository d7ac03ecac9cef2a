"""The crash classifier's accuracy on every log in tests/data/logs.

Labels come from tests/data/logs/MANIFEST.json (`label`: a signature id,
`unclassified` for an error of no known kind, `none` for a log with no error).
Per file it prints expected / got and a verdict:
  ok      the label was named (or unclassified / no error, as labelled);
  missed  a known kind was labelled but the log came out unclassified;
  WRONG   a known kind was named that is not the label (worse than none).
Totals follow. Exit 1 if any log is named wrongly or missed, else 0.

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
    if diagnosis.signature == "unclassified" and not diagnosis.error_found:
        return "none"
    return diagnosis.signature


def verdict(expected: str, got: str) -> str:
    if got == expected:
        return "ok"
    if got in ("unclassified", "none"):
        return "missed"
    return "WRONG"


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
    totals = {v: sum(r["verdict"] == v for r in rows) for v in ("ok", "missed", "WRONG")}
    totals["logs"] = len(rows)
    totals["accuracy"] = round(totals["ok"] / len(rows), 3) if rows else None
    if args.json:
        print(json.dumps({"rows": rows, "totals": totals}, indent=1))
    else:
        width = max(len(r["file"]) for r in rows)
        for r in rows:
            print(f"{r['file']:<{width}}  expected {r['expected']:<26} got {r['got']:<26} {r['verdict']}")
        print(f"\n{totals['ok']}/{totals['logs']} named as labelled ({totals['accuracy']:.1%}); "
              f"missed {totals['missed']}, named wrongly {totals['WRONG']}")
    return 1 if totals["WRONG"] or totals["missed"] else 0


if __name__ == "__main__":
    sys.exit(main())
