"""Benchmark: where the suite's time goes (issue 37, item 5: `.ci/run` in at most 40 min warm).

Clones the checkout's commit into a temporary directory (a clean clone, as CI runs it), runs the
README's test command there (`CI=true bash scripts/test.sh`, with `-v --durations=0` added so each test
says which worker ran it and how long it took) and keeps the time of every line it prints
(specdeploy.core.progress.timed_run), while it samples the machine's CPU use every 5 s (/proc/stat).
Prints:

- the wall time of the whole command and of pytest, and the tests passed and failed;
- per pytest-xdist worker: when it finished its last test, its tests, and the work groups it ran
  (tests/support/workers.py: the test network's ordered chain, the engines' modules, single tests);
- per work group: the summed time of its tests (setup, call and teardown), the floor a group sets;
- the CPU's mean use during pytest and the share of samples at 90% or more (how much a third worker
  or a split chain could gain: none on a saturated machine);
- the slowest 20 tests.

    python benchmarks/suite_time.py [--ref HEAD] [--json out.json] [--log out.log]

The cache ($SPECDEPLOY_CACHE, default ~/.cache/specdeploy) is the caller's: warm when it is. Not a test:
the figures vary with the machine; nothing else should run meanwhile. Results in docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from specdeploy.core import progress

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from tests.support import workers  # noqa: E402 - the suite's own grouping, read from the checkout

# a test's ID may hold spaces (parametrized cases)
RESULT = re.compile(r"^\[(gw\d+)\] \[\s*\d+%\] (PASSED|FAILED|ERROR|SKIPPED|XFAIL|XPASS) (.+?)\s*$")
DURATION = re.compile(r"^([\d.]+)s (setup|call|teardown)\s+(.+?)\s*$")
SUMMARY = re.compile(r"^=+ (.*\b(?:passed|failed)\b.*) in ([\d.]+)s")
SAMPLE_S = 5.0


class CpuSampler(threading.Thread):
    """The share of the machine's CPU time spent busy (not idle, not waiting on I/O), every SAMPLE_S."""

    def __init__(self) -> None:
        super().__init__(daemon=True, name="cpu sampler")
        self.samples: list[tuple[float, float]] = []  # (monotonic time, busy share 0..1)
        self._done = threading.Event()  # not `_stop`: a method of threading.Thread

    @staticmethod
    def _read() -> tuple[int, int]:
        fields = [int(x) for x in Path("/proc/stat").read_text().splitlines()[0].split()[1:]]
        idle = fields[3] + fields[4]  # idle, iowait
        return sum(fields) - idle, sum(fields)

    def run(self) -> None:
        busy, total = self._read()
        while not self._done.wait(SAMPLE_S):
            now_busy, now_total = self._read()
            if now_total > total:
                self.samples.append((time.monotonic(), (now_busy - busy) / (now_total - total)))
            busy, total = now_busy, now_total

    def stop(self) -> None:
        self._done.set()
        self.join(timeout=SAMPLE_S * 2)


def analyse(lines: list[tuple[float, str]], cpu: list[tuple[float, float]]) -> dict[str, object]:
    """The figures from a run's timed lines and CPU samples (each in seconds from the command's start)."""
    pytest_at = next((t for t, text in lines if text.startswith("== pytest")), 0.0)
    finished: dict[str, float] = {}
    ran: dict[str, list[str]] = collections.defaultdict(list)
    outcomes: collections.Counter[str] = collections.Counter()
    spent: dict[str, float] = collections.defaultdict(float)
    summary, pytest_s = "", None
    for i, (at, text) in enumerate(lines):
        if result := RESULT.match(text):
            worker, outcome, nodeid = result.groups()
            # pytest writes a result without its newline, which comes with the next event (of either
            # worker): the result's moment is when the line before it ended
            finished[worker] = (lines[i - 1][0] if i else at) - pytest_at
            ran[worker].append(nodeid)
            outcomes[outcome] += 1
        elif duration := DURATION.match(text):
            spent[duration.group(3)] += float(duration.group(1))
        elif end := SUMMARY.match(text):
            summary, pytest_s = end.group(1), float(end.group(2))
    group_of = {nodeid: workers.group(nodeid) for nodes in ran.values() for nodeid in nodes}

    def kind(group: str) -> str:
        return group if "::" not in group else "single tests (unit, bad input)"

    per_group: dict[str, float] = collections.defaultdict(float)
    for nodeid, seconds in spent.items():
        per_group[kind(group_of.get(nodeid, workers.group(nodeid)))] += seconds
    per_worker = {
        worker: {
            "finished_s": round(finished[worker], 1),
            "tests": len(nodes),
            "groups": sorted({kind(group_of[n]) for n in nodes}),
        }
        for worker, nodes in sorted(ran.items())
    }
    during = [share for t, share in cpu if t >= pytest_at]
    slowest = sorted(spent.items(), key=lambda item: -item[1])[:20]
    return {
        "pytest_s": pytest_s,
        "summary": summary,
        "outcomes": dict(outcomes),
        "workers": per_worker,
        "groups_s": {group: round(seconds, 1) for group, seconds in sorted(per_group.items(), key=lambda g: -g[1])},
        "cpu_mean": round(statistics.mean(during), 3) if during else None,
        "cpu_at_90_or_more": round(sum(1 for s in during if s >= 0.9) / len(during), 3) if during else None,
        "slowest_20": [{"test": nodeid, "seconds": round(seconds, 1)} for nodeid, seconds in slowest],
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--ref", default="HEAD", help="the commit to clone and test (default: HEAD)")
    parser.add_argument("--json", type=Path, help="the figures as JSON")
    parser.add_argument("--log", type=Path, help="the run's whole output (default: $TMPDIR/suite-time-COMMIT.log)")
    parser.add_argument("--from-times", type=Path, help="analyse a run's LOG.times.json again instead of running")
    args = parser.parse_args()
    if args.from_times:
        kept = json.loads(args.from_times.read_text())
        figures = {k: kept[k] for k in ("commit", "exit", "wall_s")}
        figures |= analyse([(t, text) for t, text in kept["lines"]], [(t, share) for t, share in kept["cpu"]])
        return show(figures)
    commit = subprocess.run(["git", "rev-parse", args.ref], cwd=ROOT, capture_output=True, text=True, check=True)
    commit_id = commit.stdout.strip()
    with tempfile.TemporaryDirectory(prefix="suite-time-") as scratch:
        clone = Path(scratch) / "main"
        subprocess.run(["git", "clone", "--quiet", "--no-hardlinks", str(ROOT), str(clone)], check=True)
        subprocess.run(["git", "checkout", "--quiet", commit_id], cwd=clone, check=True)
        log_path = args.log or Path(tempfile.gettempdir()) / f"suite-time-{commit_id[:12]}.log"
        # (no PY_COLORS: any value of it, "0" too, makes typer colour its errors, which tests read)
        env = {**os.environ, "CI": "true"}
        env.pop("VIRTUAL_ENV", None)
        sampler = CpuSampler()
        sampler.start()
        started = time.monotonic()
        with log_path.open("w") as log:
            done = progress.timed_run(
                ["bash", "scripts/test.sh", "-v", "--durations=0"], cwd=clone, env=env, echo=log, timeout=3 * 3600
            )
        sampler.stop()
    lines = done.lines or []
    cpu = [(round(t - started, 1), round(share, 3)) for t, share in sampler.samples]
    figures: dict[str, Any] = {"commit": commit_id, "exit": done.returncode, "wall_s": round(done.ended, 1)}
    # every line's time and the CPU samples, for `--from-times` (the analysis again, without the run)
    times = log_path.with_name(log_path.name + ".times.json")
    times.write_text(json.dumps(figures | {"lines": [[round(t, 2), text] for t, text in lines], "cpu": cpu}))
    figures |= analyse(lines, cpu)
    if args.json:
        args.json.write_text(json.dumps(figures, indent=2) + "\n")
    return show(figures)


def show(figures: dict[str, Any]) -> int:
    """The figures as tables, then as JSON; the suite's exit code."""
    console = Console(width=160)
    console.print(
        f"commit {figures['commit'][:12]}: exit {figures['exit']}, wall {progress.duration(figures['wall_s'])} "
        f"(pytest {figures['pytest_s']} s: {figures['summary']}); CPU busy {figures['cpu_mean']} on average during "
        f"pytest, at 90% or more in {figures['cpu_at_90_or_more']} of the samples"
    )
    table = Table("worker", "finished (s after pytest began)", "tests", "work groups", title="workers")
    for worker, row in figures["workers"].items():  # type: ignore[union-attr]
        table.add_row(worker, str(row["finished_s"]), str(row["tests"]), ", ".join(row["groups"]))
    console.print(table)
    table = Table("work group", "its tests' time (s)", title="work groups (a group runs on one worker, in order)")
    for group, seconds in figures["groups_s"].items():  # type: ignore[union-attr]
        table.add_row(group, str(seconds))
    console.print(table)
    table = Table("seconds", "test", title="slowest 20 (setup + call + teardown)")
    for row in figures["slowest_20"]:  # type: ignore[union-attr]
        table.add_row(str(row["seconds"]), row["test"])
    console.print(table)
    print(json.dumps(figures, indent=2))
    return int(figures["exit"])


if __name__ == "__main__":
    sys.exit(main())
