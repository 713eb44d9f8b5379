"""Benchmark: time to a decisive smoke verdict, and requests used, on warm rehearsal servers.

Starts (or reuses, if `specdeploy rehearsal up` already runs them) the `healthy` and
`dflash-random` stacks, warms each with one smoke run, then runs the smoke N times per stack
and prints a table plus JSON. Results go in docs/benchmarks.md. Not a test: figures vary
with the machine; nothing here asserts a time.

    python benchmarks/smoke_verdict.py [--runs 5] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

from rich.console import Console
from rich.table import Table

from specdeploy.profile import Profile
from specdeploy.rehearsal import stacks
from specdeploy.smoke.run import SmokeOptions, run


def _profile_and_url(name: str) -> tuple[Profile, str]:
    state = stacks.status(name)
    if state["state"] != "ready":
        stacks.stop(name)
        engine = stacks.start(name)
        engine.wait_ready(timeout=600)
        return engine.profile, engine.url
    return stacks.STACKS[name].profile(), str(state["url"])


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--json", dest="json_path")
    args = parser.parse_args()
    options = SmokeOptions(show_progress=False)
    results = []
    for name in ("dflash-random", "healthy"):
        profile, url = _profile_and_url(name)
        run(profile, url, options)  # warm-up: compiled graphs, caches
        for i in range(args.runs):
            started = time.monotonic()
            report = run(profile, url, options)
            elapsed = time.monotonic() - started
            acc = report.stage("acceptance")
            results.append(
                {
                    "stack": name,
                    "run": i,
                    "verdict": report.verdict.value,
                    "seconds_total": round(elapsed, 2),
                    "acceptance_requests": acc.details["requests"] if acc else None,
                    "acceptance_waves": acc.details["waves"] if acc else None,
                    "mean_acceptance_length": round(acc.details["mean_acceptance_length"], 3) if acc else None,
                }
            )
    table = Table(
        "stack", "verdict", "runs", "seconds to verdict: median (min-max)", "acceptance requests", "acceptance length"
    )
    for name in ("dflash-random", "healthy"):
        rows = [r for r in results if r["stack"] == name]
        secs = [r["seconds_total"] for r in rows]
        reqs = sorted({r["acceptance_requests"] for r in rows})
        table.add_row(
            name,
            ",".join(sorted({r["verdict"] for r in rows})),
            str(len(rows)),
            f"{statistics.median(secs):.2f} ({min(secs):.2f}-{max(secs):.2f})",
            ",".join(map(str, reqs)),
            ",".join(sorted({f"{r['mean_acceptance_length']:.2f}" for r in rows})),
        )
    Console().print(table)
    if args.json_path:
        with open(args.json_path, "w") as fh:
            json.dump(results, fh, indent=2)


if __name__ == "__main__":
    main()
