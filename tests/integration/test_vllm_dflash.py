"""Real-engine proof on vLLM-CPU: the verified DFlash config is wired as the profile says,
and an out-of-range config — which vLLM itself accepts at start-up — is stopped before launch.

These start real vLLM servers (about a minute each on 2 cores); the healthy one is shared by
every test of the run through a session-scoped fixture.

On the tiny fixtures (the tiny target and a random DFlash drafter): plumbing and speed, for they
answer only the corpus they memorised; the gate's content checks are proven on a model that speaks
in tests/integration/test_real_model.py and the migration chain's last test (the main job's model).
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import httpx
import pytest

from specdeploy.engine import startup_log
from specdeploy.rehearsal import fixtures, launcher, proof, variants

pytestmark = pytest.mark.vllm


def test_proof_passes_every_step(dflash_run: proof.ProofResult) -> None:
    steps = {s.name: s for s in dflash_run.steps}
    assert list(steps) == [
        "fixtures",
        "verify-config",
        "write-config",
        "vLLM ready",
        "auxiliary layers",
        "request",
    ]
    assert dflash_run.ok, [s for s in dflash_run.steps if not s.ok]


def test_vllm_logs_target_layer_ids_plus_one(dflash_run: proof.ProofResult) -> None:
    """target_layer_ids [0, 2] -> vLLM reads auxiliary layers (1, 3) (docs/sources.md#vllm)."""
    assert dflash_run.engine is not None
    log = dflash_run.engine.log()
    assert startup_log.find_aux_layers(log) == (1, 3)
    assert "Using auxiliary layers from speculative config: (1, 3)" in log


def test_engine_reads_the_serving_dir_not_the_download(dflash_run: proof.ProofResult) -> None:
    assert dflash_run.engine is not None
    spec = json.loads(dflash_run.engine.argv[dflash_run.engine.argv.index("--speculative-config") + 1])
    assert spec["method"] == "dflash" and spec["num_speculative_tokens"] == 3
    assert spec["model"].endswith("serving/drafter")
    assert fixtures.cache_dir().as_posix() not in spec["model"]


def test_drafter_is_really_drafting(dflash_run: proof.ProofResult) -> None:
    """Counter deltas around our own request: the random drafter proposes and is rejected."""
    assert dflash_run.engine is not None
    _, drafts = proof.one_request(dflash_run.engine.url, "tiny-qwen3-dflash")
    assert drafts > 0


def test_out_of_range_target_layer_ids(cli: Any, tmp_path: Path) -> None:
    """target_layer_ids [0, 7] for a 4-layer target: what real vLLM does, and verify-config.

    Recorded behaviour of vllm-cpu 0.32.0 (seen): the server starts and /health answers 200,
    it logs auxiliary layers (1, 8) without complaint, and the *first request* fails with
    HTTP 500 while the engine core dies with "DFlash drafter expects 256 concatenated aux
    hidden features but received 128". Nothing at start-up says the config is wrong — so
    verify-config must reject it before launch, and the aux-layer check flags it too.
    """
    profile = variants.dflash(port=8102)
    download = tmp_path / "hand-built"
    shutil.copytree(fixtures.build_dflash_drafter(profile), download)
    config = json.loads((download / "config.json").read_text())
    config["dflash_config"]["target_layer_ids"] = [0, 7]
    (download / "config.json").write_text(json.dumps(config))

    profile_path = variants.materialize(profile, tmp_path / "profiles")
    rejected = cli("verify-config", download, "--profile", profile_path, "--json")
    assert rejected.exit_code == 1
    failed = {c["field"] for c in json.loads(rejected.stdout)["checks"] if not c["ok"]}
    assert "dflash_config.target_layer_ids" in failed

    engine = launcher.start(
        profile, model=fixtures.build_target(profile), drafter=download, log_path=tmp_path / "vllm.log"
    )
    try:
        engine.wait_ready(timeout=600, show_progress=False)  # vLLM itself does not object
        aux = startup_log.check_aux_layers(profile, engine.log())
        assert aux.found == (1, 8) and not aux.ok
        assert "differ from the profile's" in aux.message
        response = httpx.post(
            f"{engine.url}/v1/completions",
            json={"model": "tiny-qwen3-dflash", "prompt": "The quick", "max_tokens": 8, "temperature": 0},
            timeout=120,
        )
        assert response.status_code == 500
        assert "expects 256 concatenated aux hidden features but received 128" in engine.log()
    finally:
        engine.stop()


@pytest.mark.parametrize(
    ("runner", "error"),
    [
        ("1", "Model Runner V2 requires Triton"),
        ("0", "Model Runner V1 does not support: mixed sliding/full dflash drafts"),
    ],
    ids=["v2-runner", "v1-runner"],
)
def test_mixed_sliding_full_dflash_does_not_run_on_vllm_cpu(tmp_path: Path, runner: str, error: str) -> None:
    """Why the rehearsal's DFlash drafter is all-full-attention (recorded, vllm-cpu 0.32.0):
    the production drafter's mixed sliding/full layers need vLLM's V2 model runner, which
    needs Triton — absent from the CPU build — and V1 refuses mixed drafters outright. Both
    fail at start-up, in seconds. verify-config still covers mixed configs (unit tests); if a
    later vllm-cpu runs them, this test fails and the rehearsal should switch to mixed."""
    from specdeploy.profile import parse_profile

    profile = variants.dflash(port=8107, layer_types=["sliding_attention", "full_attention"], sliding_window=64)
    data = profile.model_dump(mode="json")
    data["engine"]["env"]["VLLM_USE_V2_MODEL_RUNNER"] = runner
    profile = parse_profile(data, "mixed-layer variant")
    engine = launcher.start(
        profile, model=fixtures.build_target(profile), drafter=fixtures.build_dflash_drafter(profile),
        log_path=tmp_path / "vllm.log",
    )  # fmt: skip
    try:
        with pytest.raises(launcher.EngineExited):
            engine.wait_ready(timeout=300, show_progress=False)
        assert error in engine.log()
    finally:
        engine.stop()
