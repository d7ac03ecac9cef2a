"""The crash classifier's accuracy on every log in tests/data/logs, and the GPU-health parsers'.

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
Second figure, the GPU-health parsers (k26ops/facts: smi_q, gpu, xid) on every recorded output
whose MANIFEST entry has `health` ("fault" or "healthy"), in tests/data/facts and tests/data/logs:
faults named (a fault output where the parser names a fault) and healthy outputs quiet (a healthy
output where it names none). The parser is chosen by the output: `nvidia-smi -q` -> gpu_health,
the nvidia-smi table or a device-handle failure -> nvidia_smi / gpus, kernel lines -> gpu_xid.
Exit 1 if any log is named wrongly, missed or a false alarm, or a health output is misread, else 0.

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
    totals.update(
        {
            "logs": len(rows),
            "known": len(known),
            "named_right": sum(r["verdict"] == "ok" for r in known),
            "wrong_names": totals["WRONG"],
            "unclassified": sum(r["got"] == "unclassified" for r in known),
            "healthy": sum(r["expected"] == "none" for r in rows),
            "false_alarms": totals["FALSE-ALARM"],
            "accuracy": round(totals["ok"] / len(rows), 3) if rows else None,
        }
    )
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
        rows.append(
            {
                "file": name,
                "source": entry["source"],
                "expected": entry["label"],
                "got": got,
                "verdict": verdict(entry["label"], got),
            }
        )
    return rows


FACTS = REPO / "tests" / "data" / "facts"


def health_faults(text: str, command: str) -> list[str]:
    """What the GPU-health parsers name as faults in one recorded output."""
    from k26ops.facts import gpu, smi_q, xid

    if "-q" in command.split():
        h = smi_q.parse_health_fact(text, 0)
        return [f"{g.get('bus_id')}: {f['fault']}" for g in h["gpus"] for f in g["faults"]]
    if "Unable to determine the device handle" in text or command.startswith("nvidia-smi"):
        errs = gpu.parse_smi_header(text, 0).get("gpu_errors") or []
        return errs or (gpu.parse_gpus(text, 0).get("gpu_errors") or [])
    fact = xid.parse_xid_fact(text, 0)
    return [
        f"{xid.label(e)} {e['pci'] or e.get('name')}"
        for e in fact["events"]
        if e["kind"] == "hardware" and e["action"] != "none"
    ]


def health_results() -> list[dict]:
    """One row per recorded output labelled `health` in the facts and logs MANIFESTs."""
    rows = []
    for folder in (FACTS, LOGS):
        manifest = json.loads((folder / "MANIFEST.json").read_text())
        for name, entry in sorted(manifest.items()):
            if "health" not in entry:
                continue
            text = (folder / name).read_text(encoding="utf-8", errors="replace")
            found = health_faults(text, entry.get("command", ""))
            ok = bool(found) == (entry["health"] == "fault")
            rows.append(
                {
                    "file": f"{folder.name}/{name}",
                    "expected": entry["health"],
                    "got": "; ".join(found)[:80] or "quiet",
                    "verdict": "ok" if ok else ("MISSED" if entry["health"] == "fault" else "FALSE-ALARM"),
                }
            )
    return rows


def health_totals(rows: list[dict]) -> dict:
    faults = [r for r in rows if r["expected"] == "fault"]
    healthy = [r for r in rows if r["expected"] == "healthy"]
    return {
        "outputs": len(rows),
        "faults": len(faults),
        "faults_named": sum(r["verdict"] == "ok" for r in faults),
        "healthy": len(healthy),
        "healthy_quiet": sum(r["verdict"] == "ok" for r in healthy),
    }


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--only-new", action="store_true", help="only logs with a known source (real or CONSTRUCTED)")
    ap.add_argument("--json", action="store_true", help="print the rows and totals as JSON")
    args = ap.parse_args(argv)
    rows = results(only_new=args.only_new)
    totals = totals_of(rows)
    hrows = health_results()
    htotals = health_totals(hrows)
    if args.json:
        print(json.dumps({"rows": rows, "totals": totals, "health_rows": hrows, "health_totals": htotals}, indent=1))
    else:
        width = max(len(r["file"]) for r in rows)
        for r in rows:
            print(f"{r['file']:<{width}}  expected {r['expected']:<26} got {r['got']:<26} {r['verdict']}")
        print(
            f"\nnamed right {totals['named_right']}/{totals['known']} known crashes; wrong names "
            f"{totals['wrong_names']}; unclassified {totals['unclassified']}; false alarms "
            f"{totals['false_alarms']}/{totals['healthy']} healthy logs; "
            f"{totals['ok']}/{totals['logs']} as labelled ({totals['accuracy']:.1%})"
        )
        print("\nGPU-health parsers (smi_q, gpu, xid):")
        width = max(len(r["file"]) for r in hrows)
        for r in hrows:
            print(f"{r['file']:<{width}}  expected {r['expected']:<8} got {r['got']:<60} {r['verdict']}")
        print(
            f"\nfaults named {htotals['faults_named']}/{htotals['faults']}; healthy outputs quiet "
            f"{htotals['healthy_quiet']}/{htotals['healthy']}"
        )
    bad_health = any(r["verdict"] != "ok" for r in hrows)
    return 1 if totals["WRONG"] or totals["missed"] or totals["FALSE-ALARM"] or bad_health else 0


if __name__ == "__main__":
    sys.exit(main())
