"""`specdeploy smoke` against real vLLM-CPU stacks: the right verdict and diagnosis for the
healthy rehearsal and for each real failure (collapsed drafter, degenerate target, token
loop, speculative decoding off, server down, server killed mid-run, version mismatch,
golden drift); and the idle wait a decommission makes, on vLLM's own gauges.

On the tiny fixtures (the cpu-rehearsal stacks): plumbing and speed, for they answer only the corpus they
memorised; the gate's content checks are proven on a model that speaks in
tests/integration/test_real_model.py and the migration chain's last test (the main job's model).
"""

from __future__ import annotations

import json
import os
import signal
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import pytest
from tests.support.variants import engine_version

from specdeploy.core.verdicts import Verdict
from specdeploy.profile import Profile, load_profile
from specdeploy.rehearsal import launcher, proof, variants
from specdeploy.smoke import clients as engines
from specdeploy.smoke import metrics
from specdeploy.smoke.run import SmokeOptions, SmokeReport, run

pytestmark = pytest.mark.vllm

Stack = Callable[[str], launcher.EngineProcess]
QUIET = SmokeOptions(show_progress=False)


def _smoke(profile: Profile, engine: launcher.EngineProcess, options: SmokeOptions = QUIET) -> SmokeReport:
    return run(profile, engine.url, options)


def _statuses(report: SmokeReport) -> dict[str, Verdict]:
    return {s.name: s.status for s in report.stages}


def _diagnosis(report: SmokeReport) -> str:
    return "\n".join(report.diagnosis)


def test_healthy_rehearsal_passes(stack: Stack, tmp_path: Path) -> None:
    profile = load_profile("cpu-rehearsal")
    report = _smoke(profile, stack("healthy"), SmokeOptions(show_progress=False, record_golden=tmp_path / "g.json"))
    assert report.exit_code == 0, report.to_json()
    statuses = _statuses(report)
    assert statuses.pop("long_context") is Verdict.skipped  # off in the profile (a test turns it on)
    assert statuses.pop("prefix_cache") is Verdict.skipped  # off for the fixtures' 512 positions
    assert set(statuses.values()) == {Verdict.passed}
    lossless = report.stage("lossless")
    assert lossless is not None and lossless.details["divergences"] == []
    assert lossless.details["distribution"]["tokens"] > 0
    assert lossless.details["speculation_during_answers"]["drafts"] > 0
    acc = report.stage("acceptance")
    assert acc is not None
    band = profile.smoke.acceptance_length
    assert band.min <= acc.details["interval_95"][0] <= acc.details["interval_95"][1] <= band.max
    assert acc.details["drafts"] > 0 and acc.details["requests"] <= profile.smoke.max_requests
    assert report.diagnosis == []


def test_collapsed_dflash_drafter_is_diagnosed(dflash_run: proof.ProofResult) -> None:
    assert dflash_run.engine is not None
    report = _smoke(dflash_run.engine.profile, dflash_run.engine)
    statuses = _statuses(report)
    assert report.exit_code == 1
    assert statuses["coherence"] is Verdict.passed  # the target is fine ...
    assert statuses["acceptance"] is Verdict.failed  # ... the drafter is not
    acc = report.stage("acceptance")
    assert acc is not None and acc.details["decision"] == "below" and acc.details["per_position"][0] < 0.3
    assert "drafter config" in _diagnosis(report) and "verify-config" in _diagnosis(report)


def test_untrained_target_is_degenerate(stack: Stack) -> None:
    engine = stack("untrained-target")
    report = _smoke(engine.profile, engine)
    assert report.exit_code == 1
    assert _statuses(report)["coherence"] is Verdict.failed
    coherence, accuracy = report.stage("coherence"), report.stage("accuracy")
    assert coherence is not None and coherence.details["degenerate"]
    assert accuracy is not None and accuracy.status is Verdict.failed
    assert accuracy.details["known answers"]["wrong"]
    assert "output incoherent" in _diagnosis(report)
    assert "drafter config" not in _diagnosis(report)  # a broken target is not blamed on the drafter


def test_self_drafting_untrained_target_is_a_token_loop(stack: Stack) -> None:
    engine = stack("self-draft-loop")
    report = _smoke(engine.profile, engine)
    acc = report.stage("acceptance")
    assert report.exit_code == 1 and acc is not None
    assert acc.status is Verdict.failed and acc.details["token_loop"]
    assert min(acc.details["per_position"]) >= 0.95
    assert _statuses(report)["coherence"] is Verdict.failed
    assert "token loop" in _diagnosis(report)


def test_other_traffic_is_reported(stack: Stack, monkeypatch: pytest.MonkeyPatch) -> None:
    """Counters are server-wide: requests that are not the smoke's are counted and reported.

    Another client's request is sent (and finished) right after each of the smoke's own
    acceptance requests, so it always lands between the wave's two metric scrapes; a free-
    running background loop did not (CI saw 0 other requests across a 3-wave run)."""
    engine = stack("healthy")
    own_complete = engines.VLLMClient._complete

    def complete_then_other_client(self: engines.VLLMClient, prompt: str, max_tokens: int) -> engines.Completion:
        completion = own_complete(self, prompt, max_tokens)
        httpx.post(
            f"{engine.url}/v1/completions",
            json={"model": "tiny-qwen3", "prompt": "The quick brown fox", "max_tokens": 8, "temperature": 0},
            timeout=60,
        ).raise_for_status()
        return completion

    monkeypatch.setattr(engines.VLLMClient, "_complete", complete_then_other_client)
    report = _smoke(load_profile("cpu-rehearsal"), engine)
    acc = report.stage("acceptance")
    assert acc is not None
    # One other request per own request; at most the wave's last one may not be counted yet
    # when the wave's closing scrape is answered (it is then in the next wave's baseline).
    sent, seen = acc.details["requests"], acc.details["other_traffic_requests"]
    assert sent - acc.details["waves"] <= seen <= sent and seen > 0
    assert f"{seen} other request(s) seen on the server" in acc.summary


STREAMS = 24  # streams the idle-wait test opens at once


def test_the_idle_wait_counts_real_streams_by_vllm_s_own_gauges_and_returns_once_they_ended(stack: Stack) -> None:
    """What decommission.yml waits on before it stops an engine for good (smoke.idle): real vLLM's
    `vllm:num_requests_running` / `waiting` count streams in flight, and the wait returns once they
    ended. STREAMS at once, so the engine is still busy when the wait starts: one 400-token stream
    alone decodes in under a second on an idle machine, and a wait that started after it ended
    (it did, in a suite run) counts nothing."""
    import threading

    from specdeploy.smoke import idle

    engine = stack("healthy")
    body = {"model": "tiny-qwen3", "prompt": "Count:", "max_tokens": 400, "temperature": 0, "ignore_eos": True,
            "stream": True}  # fmt: skip
    streaming, ended = threading.Event(), threading.Semaphore(0)

    def stream() -> None:
        with httpx.stream("POST", f"{engine.url}/v1/completions", json=body, timeout=300) as response:
            for line in response.iter_lines():
                if line.startswith("data: {"):
                    streaming.set()
        ended.release()

    for _ in range(STREAMS):
        threading.Thread(target=stream, daemon=True).start()
    assert streaming.wait(120)
    result = idle.wait_idle(engine.url, "vllm", 300, poll_s=0.2)
    assert (result.in_flight_at_start or 0) >= 1 and result.idle and result.waited_s > 0, result.to_json()
    assert all(ended.acquire(timeout=60) for _ in range(STREAMS))  # and the streams themselves ended
    assert idle.in_flight(engine.url, "vllm") == 0


def test_version_mismatch_names_both_versions(stack: Stack) -> None:
    profile = engine_version(load_profile("cpu-rehearsal"), "0.31.0")
    report = _smoke(profile, stack("healthy"))
    identity = report.stage("identity")
    assert report.exit_code == 1 and identity is not None and identity.status is Verdict.failed
    assert "0.32.0" in identity.summary and "0.31.0" in identity.summary
    assert "engine identity" in _diagnosis(report)
    assert [s.name for s in report.stages] == ["readiness", "identity"]  # nothing else is trusted


def test_golden_transcript_holds_then_drifts(stack: Stack, tmp_path: Path) -> None:
    healthy, golden = load_profile("cpu-rehearsal"), tmp_path / "golden.json"
    recorded = _smoke(healthy, stack("healthy"), SmokeOptions(show_progress=False, record_golden=golden))
    assert recorded.exit_code == 0 and json.loads(golden.read_text())["outputs"]

    again = _smoke(healthy, stack("healthy"), SmokeOptions(show_progress=False, golden=golden))
    gold = again.stage("golden")
    assert gold is not None and gold.status is Verdict.passed and gold.details["match_fraction"] == 1.0

    other = stack("untrained-target")  # a different target behind the same name
    drifted = _smoke(other.profile, other, SmokeOptions(show_progress=False, golden=golden))
    gold = drifted.stage("golden")
    assert gold is not None and gold.status is Verdict.failed and gold.details["match_fraction"] < 0.8
    assert "golden drift" in _diagnosis(drifted)


def test_server_down_cannot_test() -> None:
    profile = variants.on_port(load_profile("cpu-rehearsal"), "cpu-rehearsal-nothing", 8199)
    report = run(profile, "http://127.0.0.1:8199", SmokeOptions(show_progress=False, readiness_timeout_s=3))
    assert report.exit_code == 2
    assert _statuses(report) == {"readiness": Verdict.error}
    assert "unreachable" in _diagnosis(report)


def test_cli_smoke_writes_json_report(cli: Any, stack: Stack, tmp_path: Path) -> None:
    engine = stack("healthy")
    result = cli("smoke", "--endpoint", engine.url, "--profile", "cpu-rehearsal", "--json", tmp_path / "r.json")
    assert result.exit_code == 0, result.stdout
    data = json.loads((tmp_path / "r.json").read_text())
    assert data["verdict"] == "pass" and data["exit_code"] == 0
    assert "acceptance" in result.stdout and "verdict: pass" in result.stdout


# These two share the no-spec server; the second kills it, so it runs last.


def test_speculative_decoding_off(stack: Stack) -> None:
    """A server started without --speculative-config has no vllm:spec_decode_* series: the served
    identity says so before any other stage is trusted."""
    engine = stack("no-spec")
    report = _smoke(engine.profile, engine)
    assert report.exit_code == 1
    identity = report.stage("identity")
    assert identity is not None and identity.status is Verdict.failed
    assert "speculative decoding is off" in identity.summary and "'draft_model'" in identity.summary
    assert identity.details["speculation"]["k"] == 0
    assert "speculative setup:" in _diagnosis(report)


def test_server_killed_mid_run(stack: Stack, monkeypatch: pytest.MonkeyPatch) -> None:
    """The real server is killed (SIGKILL to its process group) right after it has answered the
    smoke's first chat request, so the rest of the run meets a dead server. The kill hooks the
    client's first answer instead of a watcher polling metrics: a watcher lost the race to a
    smoke that finished in 0.9 s on a loaded CI machine."""
    engine = stack("double-k")  # served as its own profile says (identity passes); nothing uses it after this
    answered = engines.EngineClient.chat

    def chat_then_kill(self: engines.EngineClient, *args: Any, **kwargs: Any) -> engines.Completion:
        completion = answered(self, *args, **kwargs)
        if engine.process.poll() is None:
            os.killpg(engine.process.pid, signal.SIGKILL)
            engine.process.wait(timeout=30)
        return completion

    monkeypatch.setattr(engines.EngineClient, "chat", chat_then_kill)
    report = _smoke(engine.profile, engine)
    assert report.exit_code == 2, report.to_json()
    assert _statuses(report)["server"] is Verdict.error
    assert "failed mid-run" in _diagnosis(report)


def test_hybrid_gated_deltanet_target_with_mtp(stack: Stack) -> None:
    """The production family on CPU: a tiny Qwen3-Next (Gated DeltaNet + attention, MoE)
    drafting with its own MTP layer. Its weights are random, so the smoke must fail it on
    coherence — but the MTP drafts are real: vLLM's spec-decode counters move."""
    engine = stack("hybrid-mtp")
    assert "Qwen3NextForCausalLM" in engine.log()
    before = metrics.total(metrics.scrape(engine.url), metrics.DRAFTS)
    response = httpx.post(
        f"{engine.url}/v1/completions",
        json={"model": "tiny-qwen3-next", "prompt": "The quick brown fox", "max_tokens": 16, "temperature": 0},
        timeout=120,
    )
    assert response.status_code == 200
    assert metrics.total(metrics.scrape(engine.url), metrics.DRAFTS) > before
    report = _smoke(engine.profile, engine)
    assert report.exit_code == 1 and _statuses(report)["coherence"] is Verdict.failed
    acc = report.stage("acceptance")
    assert acc is not None and acc.details["drafts"] > 0
