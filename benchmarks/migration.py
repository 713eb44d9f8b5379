"""Benchmark: a host migration's steps on the CPU rehearsal, read from its migration record.

Every run of a step is kept in the record (`<inventory dir>/migrations/OLD--NEW.json`, written by
`specdeploy migrate`): its seconds, the bytes a prepare copied, a cutover's or rollback's move
time (NEW in, OLD drained, OLD out) and the requests the front counted as failed meanwhile. The
record comes from tests/integration/test_migration.py (the whole chain: an interrupted prepare and
its resume, a verify that stops, cutover, rollback and cutover under load, finish) or from
`specdeploy rehearsal migrate` (the main job's move, plan to cutover).

Prints a table plus JSON; results go in docs/benchmarks.md. Not a test: nothing asserts a time.

    python benchmarks/migration.py RECORD.json [--json out.json]
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from rich.console import Console
from rich.table import Table

from specdeploy.migrate.record import RUN_FIELDS, MigrationRecord


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("record", type=Path, help="a migration record (migrations/OLD--NEW.json)")
    parser.add_argument("--json", type=Path, help="also write the figures here")
    args = parser.parse_args()
    rec = MigrationRecord.model_validate_json(args.record.read_text())
    runs = rec.runs()
    table = Table(*RUN_FIELDS, title=f"migration {rec.old} -> {rec.new} ({rec.profile})")
    for run in runs:
        table.add_row(*(str(run.get(field, "")) for field in RUN_FIELDS))
    moves = [r for r in runs if "move_s" in r]
    totals = {
        "steps_run": len(runs),
        "seconds_all_steps": round(sum(r.get("seconds", 0) for r in runs), 1),
        "bytes_copied": sum(r.get("bytes_copied", 0) for r in runs),
        "moves": len(moves),
        "move_s_max": max((r["move_s"] for r in moves), default=None),
        "failed_requests": sum(r.get("failed_requests") or 0 for r in moves),
    }
    console = Console()
    console.print(table)
    console.print_json(json.dumps({"runs": runs, "totals": totals}))
    if args.json:
        args.json.write_text(json.dumps({"runs": runs, "totals": totals}, indent=2) + "\n")


if __name__ == "__main__":
    main()
