"""Benchmark: the coherence detectors' rates on issue 22's corpora, and their speed.

For each detectors module given (default: the package's `specdeploy.smoke.coherence`; `--detectors
FILE` loads another copy, e.g. main's, to measure "before"), prints the corpus sizes, the share
of each degenerate half flagged (tuning, held-out) and of the healthy texts flagged by kind,
and the CPU time to judge 4 KB texts (each healthy text repeated to 4096 bytes: median and
worst, after a warm-up that loads the word lists). Only rates and counts are printed, never
which held-out lines are missed (the protocol in tests/data/coherence/README.md); the held-out
half is round 5's (degenerate-heldout-5.jsonl), rounds 1 to 4's held-out halves are tuning data
since the round after theirs. Results go in docs/benchmarks.md. Not a test: nothing asserts a time.

    python benchmarks/coherence_rates.py [--detectors FILE ...] [--no-heldout] [--json out.json]
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import statistics
import sys
import time
from collections import Counter
from pathlib import Path
from types import ModuleType

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "python")]

from tests.support.coherence_corpus import HELDOUT, TUNING, degenerate, healthy_texts  # noqa: E402


def _load(path: Path | None) -> ModuleType:
    if path is None:
        from specdeploy.smoke import coherence

        return coherence
    spec = importlib.util.spec_from_file_location(f"coherence_{abs(hash(str(path)))}", path)
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


def _kind(kind: str) -> str:
    head = kind.split(":")[0]
    return {"answer": "real answers", "code": "real code answers", "recorded": "recorded outputs"}.get(
        head, {"catalog": "message catalogs", "markdown": "package READMEs", "code": "stdlib code"}.get(head, head)
    )


def measure(module: ModuleType, heldout: bool) -> dict[str, object]:
    healthy = healthy_texts()
    # stdlib code is "code" in healthy_corpus; real code answers are "code:LANG"
    kinds = Counter("stdlib code" if k == "code" else _kind(k) for k, _ in healthy)
    flagged = Counter("stdlib code" if k == "code" else _kind(k) for k, t in healthy if module.detect(t))
    # rounds 1 to 4's halves (each held-out half, measured once, is tuning data since the next
    # round), round 5's tuning half, and round 5's held-out half (left out with --no-heldout)
    halves = TUNING + ((HELDOUT,) if heldout else ())
    rates = {}
    for half in halves:
        rows = degenerate(half)
        rates[half] = {"size": len(rows), "flagged": sum(1 for r in rows if module.detect(r["text"]))}
    rates["all tuning data"] = {key: sum(rates[half][key] for half in TUNING) for key in ("size", "flagged")}
    texts = [(t * (4096 // max(1, len(t.encode())) + 1))[:4096] for _, t in healthy]
    for text in texts[:50]:
        module.detect(text)  # warm-up: word lists, caches
    times = []
    for text in texts:
        start = time.process_time()
        module.detect(text)
        times.append((time.process_time() - start) * 1000)
    return {
        "degenerate": rates,
        "healthy": {
            "size": len(healthy),
            "flagged": sum(flagged.values()),
            "by_kind": dict(kinds),
            "flagged_by_kind": dict(flagged),
        },
        "ms_per_4kb": {"median": round(statistics.median(times), 2), "max": round(max(times), 2)},
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--detectors", type=Path, action="append", help="a coherence.py to measure (repeatable)")
    parser.add_argument("--no-heldout", action="store_true", help="leave round 5's held-out half out")
    parser.add_argument("--json", type=Path, help="also write the results here")
    args = parser.parse_args()
    results = {}
    for path in args.detectors or [None]:
        name = str(path) if path else "specdeploy.smoke.coherence"
        results[name] = result = measure(_load(path), heldout=not args.no_heldout)
        print(f"== {name}")
        for half, rate in result["degenerate"].items():
            print(f"  degenerate {half}: {rate['flagged']}/{rate['size']} = {rate['flagged'] / rate['size']:.1%}")
        healthy = result["healthy"]
        print(f"  healthy: {healthy['flagged']}/{healthy['size']} = {healthy['flagged'] / healthy['size']:.2%}")
        for kind, size in sorted(healthy["by_kind"].items()):
            print(f"    {kind}: {healthy['flagged_by_kind'].get(kind, 0)}/{size}")
        print(f"  ms per 4 KB (CPU): median {result['ms_per_4kb']['median']}, max {result['ms_per_4kb']['max']}")
    if args.json:
        args.json.write_text(json.dumps(results, indent=2) + "\n")


if __name__ == "__main__":
    main()
