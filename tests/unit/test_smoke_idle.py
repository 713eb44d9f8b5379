"""`smoke.idle`: the wait before an engine is stopped for good, read from the engine's gauges.

The engine here is the front tests' stand-in (tests/support/front.py): a real HTTP server whose
`/metrics` serves vLLM's gauge names with the streams it holds open. Against a real vLLM-CPU
engine: tests/integration/test_smoke_vllm.py."""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

import pytest
from tests.support.front import engines, free_port, stream_in_background

from specdeploy.smoke import idle


def test_wait_idle_waits_while_a_stream_is_open_and_returns_once_it_ended() -> None:
    with engines("old") as started:
        engine = started["old"]
        stream = stream_in_background(engine.port)
        assert engine.streaming.wait(10)
        url = f"http://127.0.0.1:{engine.port}"
        assert idle.in_flight(url, "vllm") == 1
        threading.Timer(1.5, engine.release.set).start()
        result = idle.wait_idle(url, "vllm", 20, poll_s=0.2)
        stream.join(10)
    assert result.idle and result.in_flight_at_start == 1 and result.in_flight == 0
    assert 1.0 <= result.waited_s < 20, result.to_json()


def test_wait_idle_gives_up_at_the_timeout_naming_the_requests_still_in_flight() -> None:
    with engines("old") as started:
        engine = started["old"]
        stream_in_background(engine.port)
        assert engine.streaming.wait(10)
        started_at = time.monotonic()
        result = idle.wait_idle(f"http://127.0.0.1:{engine.port}", "vllm", 1.0, poll_s=0.2)
        elapsed = time.monotonic() - started_at
    assert not result.idle and result.in_flight == 1 and result.to_json()["idle"] is False
    assert 1.0 <= elapsed < 10


def test_an_engine_that_does_not_answer_has_nothing_in_flight_to_wait_for() -> None:
    result = idle.wait_idle(f"http://127.0.0.1:{free_port()}", "vllm", 5)
    assert result.idle and result.in_flight_at_start is None and result.to_json()["answered"] is False


def test_metrics_without_the_engine_s_gauges_are_an_error_never_read_as_idle() -> None:
    """An SGLang started without --enable-metrics answers, but with no gauges to count requests by."""
    with engines("old") as started, pytest.raises(idle.IdleError) as caught:
        idle.in_flight(f"http://127.0.0.1:{started['old'].port}", "sglang")
    assert "no sglang:num_running_reqs, sglang:num_queue_reqs" in caught.value.message
    assert "--enable-metrics" in (caught.value.hint or "")


def test_the_cli_exits_1_with_requests_still_in_flight_and_0_once_idle(cli: Any, tmp_path: Path) -> None:
    with engines("old") as started:
        engine = started["old"]
        stream_in_background(engine.port)
        assert engine.streaming.wait(10)
        url = f"http://127.0.0.1:{engine.port}"
        busy = cli("engine", "idle", "--profile", "cpu-rehearsal", "--endpoint", url, "--timeout", "1", "--json")
        engine.release.set()
        done = cli("engine", "idle", "--profile", "cpu-rehearsal", "--endpoint", url, "--timeout", "10", "--json")
    assert busy.exit_code == 1 and "1 request(s) still in flight" in busy.output and "would cut them" in busy.output
    assert done.exit_code == 0, done.output
    assert '"idle": true' in done.output
