"""Benchmark: the longest stretch without a line of output of the main job and of the migration
rehearsal (issue 37: never 30 s), with the lines around it.

Runs each command as a person would (its output shown as it comes), keeps the time of every line it
prints on either stream (specdeploy.core.progress.timed_run) and prints, per command, its wall time,
its line count, its longest silence and the line after which that silence began. Exit code 1 when any
silence reaches specdeploy.core.progress.MAX_SILENCE_S. Results go in docs/benchmarks.md.

    python benchmarks/silences.py                        # ./scripts/rehearse.sh, then `specdeploy rehearsal migrate`
    python benchmarks/silences.py --only main-job [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from rich.console import Console
from rich.table import Table

from specdeploy.core import progress

ROOT = Path(__file__).resolve().parents[1]
COMMANDS = {
    "main-job": ["bash", str(ROOT / "scripts" / "rehearse.sh")],
    "rehearsal-migrate": [str(Path(sys.executable).parent / "specdeploy"), "rehearsal", "migrate"],
}


def measure(name: str, argv: list[str]) -> dict[str, object]:
    began = time.monotonic()
    done = progress.timed_run(argv, echo=sys.stderr, timeout=7200)
    times = done.times
    marks = [0.0, *times, done.ended]
    gaps = [b - a for a, b in zip(marks, marks[1:], strict=False)]
    longest, before = done.silence_after()
    return {
        "command": name,
        "exit": done.returncode,
        "wall_s": round(time.monotonic() - began, 1),
        "lines": len(times),
        "longest_silence_s": round(longest, 1),
        "after_line": before[:200],
        "silences_over_20_s": sum(1 for gap in gaps if gap >= 20),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--only", choices=sorted(COMMANDS), action="append")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    rows = [measure(name, COMMANDS[name]) for name in (args.only or list(COMMANDS))]
    table = Table(title=f"longest silence of each run (limit {progress.MAX_SILENCE_S:g} s)")
    for column in ("command", "exit", "wall s", "lines", "longest silence s", "after the line"):
        table.add_column(column)
    for row in rows:
        table.add_row(*(str(row[k]) for k in ("command", "exit", "wall_s", "lines", "longest_silence_s", "after_line")))
    Console(width=160).print(table)
    print(json.dumps(rows, indent=2))
    if args.json:
        args.json.write_text(json.dumps(rows, indent=2) + "\n")
    return 1 if any(float(r["longest_silence_s"]) >= progress.MAX_SILENCE_S for r in rows) else 0


if __name__ == "__main__":
    sys.exit(main())
