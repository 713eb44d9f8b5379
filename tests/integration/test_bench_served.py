"""`specdeploy bench` and `tune` against real vLLM-CPU stacks: the healthy rehearsal stack (draft
model, k=3), the same served with k=6 (`double-k`) and without speculation (`no-spec`), each
measured by real `vllm bench serve` run from the engine's own environment. The tiny fixtures
serve here (plumbing and speed: the real model's sweep is benchmarks/tune_sweep.py's)."""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from specdeploy.profile import load_profile
from specdeploy.rehearsal import fixtures, launcher, variants

Stack = Callable[[str], launcher.EngineProcess]
PNG = b"\x89PNG\r\n\x1a\n"


@pytest.fixture(scope="module")
def workload_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("workload") / "small.yaml"
    path.write_text(
        "name: small\n"
        "prompts:\n"
        "  - The quick brown fox jumps over the lazy dog. Tell me a story about it.\n"
        "  - Once upon a time, in a small village by the sea, there lived an old fisherman.\n"
        "output_tokens: 48\nrequests_per_level: 4\nconcurrency: [1, 2]\n"
    )
    return path


def _bench(cli: Any, out: Path, workload: Path, *targets: tuple[str, str]) -> dict[str, Any]:
    args: list[Any] = ["bench", "run", "--workload", workload, "--out", out, "--python", sys.executable]
    args += ["--tokenizer", fixtures.build_target(load_profile("cpu-rehearsal"))]
    for profile, url in targets:
        args += ["--profile", profile, "--endpoint", url]
    result = cli(*args, "--json")
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)


@pytest.fixture(scope="module")
def two_k(stack: Stack, workload_file: Path, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, Any]]:
    """One `bench run` of the healthy stack (k=3) and the same with k=6, in one report."""
    from typer.testing import CliRunner

    from specdeploy.cli import app

    def cli(*args: Any) -> Any:
        return CliRunner().invoke(app, [str(a) for a in args], catch_exceptions=False)

    tmp = tmp_path_factory.mktemp("bench")
    double = variants.materialize(variants.double_k(), tmp / "profiles")
    healthy, doubled = stack("healthy").url, stack("double-k").url
    return tmp / "out", _bench(cli, tmp / "out", workload_file, ("cpu-rehearsal", healthy), (str(double), doubled))


def test_bench_measures_two_stacks_side_by_side_with_acceptance_from_the_engine_s_counters(
    two_k: tuple[Path, dict[str, Any]],
) -> None:
    """Two draft lengths of one stack in one report: k read from each engine, per-position acceptance
    from its counters (3 and 6 positions), the same acceptance length as the tool's own figure (no
    other traffic), a table row per level, and the two PNG plots."""
    out, data = two_k
    runs = {run["profile"]: run for run in data["runs"]}
    assert runs["cpu-rehearsal"]["k"] == 3 and runs["cpu-rehearsal-double-k"]["k"] == 6
    for run in data["runs"]:
        assert [lv["concurrency"] for lv in run["levels"]] == [1, 2] and run["tool"] == "vllm bench serve"
        for lv in run["levels"]:
            assert lv["requests"] == 4 and lv["failed"] == 0 and lv["output_tokens"] == 4 * 48
            assert lv["output_tokens_per_s"] > 0 and lv["ttft_ms_p50"] > 0 and lv["itl_ms_p99"] >= lv["itl_ms_p50"]
            assert len(lv["per_position"]) == run["k"] and lv["counter_note"] is None
            raw = json.loads((out / "raw" / run["label"] / f"c{lv['concurrency']}.json").read_text())
            assert lv["mean_acceptance_length"] == pytest.approx(raw["spec_decode_acceptance_length"], rel=1e-6)
    assert len(data["rows"]) == 4
    for name in ("throughput.png", "acceptance.png"):
        assert (out / name).read_bytes().startswith(PNG)


def test_a_run_without_speculation_compares_with_them_and_tune_recommends_from_the_merged_report(
    stack: Stack, cli: Any, tmp_path: Path, workload_file: Path, two_k: tuple[Path, dict[str, Any]]
) -> None:
    """A report taken separately (another time) merges with the first when the workload is the same;
    the tuner then has k = 0, 3 and 6 measured and labels every other k."""
    out, first = two_k
    nospec = variants.materialize(variants.on_port(load_profile("cpu-rehearsal"), "cpu-rehearsal-nospec", 8105),
                                  tmp_path / "profiles")  # fmt: skip
    plain = _bench(cli, tmp_path / "b", workload_file, (str(nospec), stack("no-spec").url))
    (run,) = plain["runs"]
    assert run["k"] == 0 and run["method"] is None and all(lv["per_position"] is None for lv in run["levels"])
    assert plain["workload_key"] == first["workload_key"]
    merged = cli("bench", "compare", out / "report.json", tmp_path / "b" / "report.json",
                 "--out", tmp_path / "merged", "--json")  # fmt: skip
    assert merged.exit_code == 0, merged.output
    assert [r["k"] for r in json.loads(merged.stdout)["runs"]] == [3, 6, 0]
    tuned = cli("tune", "--from-report", tmp_path / "merged" / "report.json", "--json")
    assert tuned.exit_code == 0, tuned.output
    measured_runs = json.loads((tmp_path / "merged" / "report.json").read_text())["runs"]
    for rec in json.loads(tuned.stdout)["recommendations"]:
        bases = {p["k"]: p["basis"] for p in rec["predictions"]}
        assert bases[0] == bases[3] == bases[6] == "measured" and bases[4] == "interpolated", bases
        # a measured k is compared at what the merged report measured, not at the model's figure
        for run in measured_runs:
            (level,) = [lv for lv in run["levels"] if lv["concurrency"] == rec["concurrency"]]
            predicted = next(p for p in rec["predictions"] if p["k"] == run["k"])
            assert predicted["tok_s"] == pytest.approx(level["output_tokens_per_s"]), (run["k"], predicted)
