"""The served speculative setup and the figures the smoke reports: pure functions, on real
recorded inputs where there are some (vLLM 0.26 startup logs recorded on a real H200 host,
tests/data/gpu-vllm-0.26/SOURCES.md)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from tests.support.data import DATA

from specdeploy.core.layout import local_layout
from specdeploy.engine import startup_log
from specdeploy.gate import golden
from specdeploy.profile import load_profile, resolve_profile_path
from specdeploy.profile.lock import Lock
from specdeploy.rehearsal import variants
from specdeploy.smoke.checks.identity import speculation_mismatch
from specdeploy.smoke.clients import stream_rate
from specdeploy.smoke.transcript import agrees

RECORDED = DATA / "gpu-vllm-0.26"


def test_the_startup_log_names_the_served_method_and_k() -> None:
    """Real vLLM 0.26 logs: DFlash on V2, the draft model on V1."""
    dflash = startup_log.served_speculation((RECORDED / "dfv2.log").read_text(errors="replace"))
    draft = startup_log.served_speculation((RECORDED / "dm2.log").read_text(errors="replace"))
    assert dflash is not None and (dflash.method, dflash.k) == ("dflash", 3)
    assert draft is not None and (draft.method, draft.k) == ("draft_model", 3)


def test_a_log_without_speculation_says_off_and_a_log_without_the_line_says_nothing() -> None:
    off = startup_log.served_speculation("INFO ... with config: model='/m', speculative_config=None, tokenizer='/m'")
    assert off is not None and off.k == 0 and off.method is None
    assert startup_log.served_speculation("INFO Starting vLLM API server\n") is None


def _served(method: str | None, k: int | None, path: str | None = None) -> dict[str, object]:
    return {"method": method, "k": k, "draft_model_path": path, "sources": ["test"]}


def test_twice_the_profiles_k_is_named_with_both_values_and_the_field_mistake() -> None:
    profile = load_profile("cpu-rehearsal")
    k = profile.engine.speculative.num_speculative_tokens
    problem = speculation_mismatch(profile, _served("draft_model", 2 * k))
    assert problem is not None and f"served num_speculative_tokens {2 * k}, the profile pins {k}" in problem
    assert "waste compute" in problem and "15 instead of 5" in problem


def test_another_method_is_named_with_both_values() -> None:
    problem = speculation_mismatch(load_profile("cpu-rehearsal"), _served("dflash", 3))
    assert problem is not None and "served speculative method 'dflash', the profile's is 'draft_model'" in problem


def test_the_profiles_own_setup_passes_and_an_unknown_method_is_not_guessed() -> None:
    profile = load_profile("cpu-rehearsal")
    assert speculation_mismatch(profile, _served("draft_model", 3)) is None
    assert speculation_mismatch(profile, _served(None, 3)) is None  # /metrics says k only


def test_sglang_serves_nextn_as_eagle() -> None:
    profile = variants.derive(
        load_profile("a6000-mtp"), "a6000-nextn", {"engine": {"speculative": {"method": "NEXTN"}}}
    )
    assert speculation_mismatch(profile, _served("EAGLE", 3, "/models/target")) is None


@pytest.mark.parametrize(
    ("tokens", "arrivals", "why"),
    [
        (3, [0.0, 0.000010], "3 tokens streamed (< 16)"),
        (64, [1.0, 1.000004, 1.000009], "arrived in 1 read(s)"),
    ],
)
def test_a_rate_from_too_few_tokens_or_one_buffered_read_is_not_measurable(
    tokens: int, arrivals: list[float], why: str
) -> None:
    """The CPU rehearsal once reported 189470 tok/s: two chunks read together, 10 us apart."""
    rate, _, _, note = stream_rate(tokens, arrivals, 16)
    assert rate is None and why in note


def test_a_rate_spread_over_reads_is_tokens_after_the_first_over_the_time() -> None:
    rate, tokens, how, note = stream_rate(33, [0.0, 0.1, 0.2, 0.4], 16)
    assert rate == pytest.approx(32 / 0.4) and tokens == 33 and how == "client stream timing" and note == ""


def test_outputs_agree_on_their_first_tokens_only() -> None:
    assert agrees(
        "The capital of France is Paris, a large city on the Seine.",
        "The capital of France is Paris, a large city of art.",
        10,
    )
    assert not agrees("The capital of France is Paris.", "The capital of Spain is Madrid.", 10)
    assert agrees("42", "42", 10) and not agrees("42", "43", 10)


def test_a_goldens_key_follows_the_served_identity(tmp_path: Path) -> None:
    host = local_layout(tmp_path)
    profile = load_profile("cpu-rehearsal")
    unit = tmp_path / "none.container"
    base = golden.served_identity(profile, host, unit_file=unit, podman="podman")
    assert golden.key(base) == golden.key(golden.served_identity(profile, host, unit_file=unit, podman="podman"))
    longer = variants.derive(profile, "cpu-rehearsal", {"engine": {"serve": {"max_model_len": 384}}})
    assert golden.key(golden.served_identity(longer, host, unit_file=unit, podman="podman")) != golden.key(base)
    host.lock.parent.mkdir(parents=True, exist_ok=True)
    lock = Lock(host.lock)
    lock.record("cpu-rehearsal", "target.files@abc", {"config.json": "sha256:" + "1" * 64}, by="a fetch")
    lock.save()
    assert golden.key(golden.served_identity(profile, host, unit_file=unit, podman="podman")) != golden.key(base)


def test_a_container_profile_s_identity_carries_the_registry_digest_its_lock_records(tmp_path: Path) -> None:
    """Issue 23: verify compares the registry's digest where NEW pulled (the one the site's lock
    recorded at the push), beside the image ID."""
    host = local_layout(tmp_path)
    profile = load_profile("cpu-rehearsal-container")
    unit = tmp_path / "none.container"
    assert golden.served_identity(profile, host, unit_file=unit, podman="podman")["image_digest"] is None
    host.lock.parent.mkdir(parents=True, exist_ok=True)
    lock = Lock(host.lock)
    lock.record(profile.name, "engine.image.digest", "sha256:" + "3" * 64, by="image push")
    lock.save()
    assert (
        golden.served_identity(profile, host, unit_file=unit, podman="podman")["image_digest"] == "sha256:" + "3" * 64
    )


def test_a_golden_is_recorded_from_a_serving_engine_only_when_its_answers_are_right(tmp_path: Path) -> None:
    """`served-identity --record-golden` (migrate plan, for a host whose verified run predates
    goldens), against a vLLM stand-in on a loopback port: a right engine's coherence outputs become
    the identity's golden (with the identity beside them); a wrong answer (below the accuracy floor) records nothing."""
    from tests.support.vllm_stub import engines

    profile = load_profile(resolve_profile_path("cpu-rehearsal"))
    host = local_layout(tmp_path / "state")
    identity = {"engine": "vllm", "version": "0.32.0", "test": "right"}
    with engines() as start:
        stub, url = start(acceptance=2.8)
        kept = golden.record_serving(profile, host, identity, endpoint=url, api_key=None)
        assert kept == golden.path(host, golden.key(identity))
        record = json.loads(kept.read_text())
        assert record["identity"] == identity and record["outputs"] and record["identity_key"] == golden.key(identity)
        stub.answers["6 times 7"] = "6 times 7 is 43."
        wrong = {**identity, "test": "wrong"}
        with pytest.raises(golden.GoldenRecordError, match="accuracy stage did not pass"):
            golden.record_serving(profile, host, wrong, endpoint=url, api_key=None)
    assert not golden.path(host, golden.key(wrong)).exists()
    assert sorted(p.name for p in host.golden.iterdir()) == [kept.name]
