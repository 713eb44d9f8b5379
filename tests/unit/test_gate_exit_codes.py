"""The gate's report and exit code when the stack cannot be tested and the rollback's outcome
differs: the endpoint is a closed local port (a real refusal, answered in milliseconds); the
rollback step is replaced by the outcomes it can have, so each exit code is reached."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from specdeploy.core import layout
from specdeploy.gate import run as gate
from specdeploy.profile import load_profile
from specdeploy.rehearsal import variants
from specdeploy.rollback import restore
from specdeploy.rollback.restore import RollbackError

CLOSED = "http://127.0.0.1:9"


def _profile(tmp_path: Path) -> Path:
    quick = variants.derive(load_profile("cpu-rehearsal"), "cpu-rehearsal-quick", {"smoke": {"readiness_timeout_s": 1}})
    return variants.materialize(quick, tmp_path / "profiles")


def _outcome(action: str, serves: bool) -> restore.Outcome:
    restored = restore.Restored("r", ["/etc/systemd/system/x.service"], [], action, 0.0)
    smoke = {"verdict": "pass" if serves else "fail"}
    return restore.Outcome(restored, None, None, smoke, 12.0, f"previous stack restored; serves: {serves}")


def test_a_stack_that_cannot_be_tested_is_rolled_back_and_reported(tmp_path: Path) -> None:
    host = layout.HostLayout(state=tmp_path / "state")
    proved: list[str] = []

    def prove(h: layout.HostLayout, run_id: str) -> restore.Outcome:
        proved.append(run_id)
        return _outcome("restarted", True)

    report = gate.run_gate(_profile(tmp_path), host, "r1", gate.GateOptions(endpoint=CLOSED), prove=prove)
    assert proved == ["r1"] and report.exit_code == 2
    on_disk = json.loads((host.runs / "r1" / "gate.json").read_text())
    assert on_disk["verdict"] == "error" and on_disk["rollback"]["previous_stack_serves"] is True
    assert "smoke verdict error; rollback: previous stack restored" in on_disk["message"]
    assert not host.verified.exists()


def test_a_rollback_that_does_not_prove_the_previous_stack_exits_4(tmp_path: Path) -> None:
    host = layout.HostLayout(state=tmp_path / "state")
    report = gate.run_gate(
        _profile(tmp_path),
        host,
        "r2",
        gate.GateOptions(endpoint=CLOSED),
        prove=lambda h, r: _outcome("restarted", False),
    )
    assert report.exit_code == gate.EXIT_NOT_RESTORED == 4


def test_a_rollback_that_fails_is_recorded_and_exits_4(tmp_path: Path) -> None:
    host = layout.HostLayout(state=tmp_path / "state")

    def prove(h: layout.HostLayout, run_id: str) -> restore.Outcome:
        raise RollbackError("systemctl restart specdeploy-engine failed (exit 1): unit not found")

    report = gate.run_gate(_profile(tmp_path), host, "r3", gate.GateOptions(endpoint=CLOSED), prove=prove)
    assert report.exit_code == 4
    on_disk = json.loads((host.runs / "r3" / "gate.json").read_text())
    assert "unit not found" in on_disk["rollback"]["error"] and "the rollback failed" in on_disk["message"]


def test_a_first_deploy_that_fails_is_stopped_not_restored(tmp_path: Path) -> None:
    """No previous stack: the rollback stops the new engine; that is a failure, not exit 4."""
    host = layout.HostLayout(state=tmp_path / "state")
    stopped = restore.Outcome(restore.Restored("r4", [], ["/u"], "stopped", 0.0), None, None, None, None, "stopped")
    report = gate.run_gate(
        _profile(tmp_path), host, "r4", gate.GateOptions(endpoint=CLOSED), prove=lambda h, r: stopped
    )
    assert report.exit_code == 2


def test_no_rollback_leaves_the_stack_and_says_so(tmp_path: Path) -> None:
    host = layout.HostLayout(state=tmp_path / "state")

    def prove(h: layout.HostLayout, run_id: str) -> restore.Outcome:
        raise AssertionError("must not roll back")

    options = gate.GateOptions(endpoint=CLOSED, rollback=False)
    report = gate.run_gate(_profile(tmp_path), host, "r5", options, prove=prove)
    assert report.exit_code == 2 and report.rollback is None and "--no-rollback" in report.message


def test_old_runs_are_pruned_but_the_verified_one_is_kept(tmp_path: Path) -> None:
    host = layout.HostLayout(state=tmp_path / "state")
    for n in range(gate.KEEP_RUNS + 5):
        (host.runs / f"old-{n:02d}").mkdir(parents=True)
    host.verified.symlink_to("runs/old-00")
    gate.run_gate(_profile(tmp_path), host, "new", gate.GateOptions(endpoint=CLOSED, rollback=False))
    left = sorted(p.name for p in host.runs.iterdir())
    assert "new" in left and "old-00" in left and len(left) == gate.KEEP_RUNS + 1


def test_a_restore_that_breaks_midway_is_a_failed_rollback_not_a_crash(tmp_path: Path) -> None:
    host = layout.HostLayout(state=tmp_path / "state")

    def prove(h: layout.HostLayout, run_id: str) -> restore.Outcome:
        raise OSError(28, "No space left on device")

    report = gate.run_gate(_profile(tmp_path), host, "r6", gate.GateOptions(endpoint=CLOSED), prove=prove)
    assert report.exit_code == 4 and "OSError" in report.rollback["error"]
    assert json.loads((host.runs / "r6" / "gate.json").read_text())["smoke"]["verdict"] == "error"


def test_an_invalid_profile_still_leaves_this_runs_report(tmp_path: Path, cli: Any) -> None:
    bad = tmp_path / "cpu-rehearsal.yaml"
    bad.write_text("schema_version: 1\nname: cpu-rehearsal\n")
    state = tmp_path / "state"
    result = cli("gate", "--profile", bad, "--state-dir", state, "--run-id", "r7")
    assert result.exit_code == 2 and "invalid profile" in result.stderr
    on_disk = json.loads((state / "runs" / "r7" / "gate.json").read_text())
    assert on_disk["verdict"] == "error" and on_disk["exit_code"] == 2 and "could not gate" in on_disk["message"]
