"""Wait until an engine has no request in flight, by its own gauges, before it is stopped for good.

Failure prevented: a host taken out of service (`decommission.yml`, so `migrate finish`) cut the
requests still running on its engine. The front's drain covers only the requests that came through
the front; an internal client's request goes to the engine directly, and vLLM aborts whatever is in
flight on SIGTERM unless `--shutdown-timeout` is set (opt-in: `engine.args.shutdown_timeout_s`).
The engine's own gauges count every request, whichever way it came: the stop waits for them.

| engine | running | waiting | source |
|---|---|---|---|
| vllm | `vllm:num_requests_running` | `vllm:num_requests_waiting` | vLLM's `/metrics` (docs/sources.md) |
| sglang | `sglang:num_running_reqs` | `sglang:num_queue_reqs` | SGLang's production metrics (`--enable-metrics`) |

An engine that does not answer has nothing in flight to wait for (stopped already, or never
started); an answer that is not Prometheus text, or lacks the gauges, cannot be judged and is an
error, never read as idle.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from specdeploy.core.errors import SpecdeployError
from specdeploy.smoke import metrics
from specdeploy.smoke.responses import EngineUnavailable

GAUGES = {
    "vllm": ("vllm:num_requests_running", "vllm:num_requests_waiting"),
    "sglang": ("sglang:num_running_reqs", "sglang:num_queue_reqs"),
}


class IdleError(SpecdeployError):
    exit_code = 1


@dataclass
class Idle:
    endpoint: str
    timeout_s: float
    in_flight_at_start: int | None = None  # None: the engine did not answer
    in_flight: int | None = None
    waited_s: float = 0.0

    @property
    def idle(self) -> bool:
        return not self.in_flight

    def to_json(self) -> dict[str, Any]:
        return {
            "endpoint": self.endpoint,
            "idle": self.idle,
            "answered": self.in_flight_at_start is not None,
            "in_flight_at_start": self.in_flight_at_start,
            "in_flight": self.in_flight,
            "waited_s": round(self.waited_s, 1),
            "timeout_s": self.timeout_s,
        }


def in_flight(endpoint: str, kind: str) -> int | None:
    """Requests running or waiting on the engine now; None when it does not answer."""
    try:
        samples = metrics.scrape(endpoint)
    except EngineUnavailable:
        return None
    missing = [name for name in GAUGES[kind] if name not in samples]
    if missing:
        raise IdleError(
            f"GET {endpoint}/metrics: no {', '.join(missing)}: the {kind} engine's requests in flight cannot be "
            "counted, so stopping it could cut them",
            hint="sglang needs --enable-metrics in the profile's extra_args; or stop it by hand once idle",
        )
    return int(sum(metrics.total(samples, name) for name in GAUGES[kind]))


def wait_idle(
    endpoint: str,
    kind: str,
    timeout_s: float,
    *,
    poll_s: float = 1.0,
    progress: Callable[[int, float], None] = lambda count, waited: None,
) -> Idle:
    """Poll the engine's gauges until nothing is in flight (or it stops answering), at most `timeout_s`."""
    result = Idle(endpoint, timeout_s)
    start = time.monotonic()
    result.in_flight_at_start = result.in_flight = in_flight(endpoint, kind)
    while result.in_flight:
        result.waited_s = time.monotonic() - start
        if result.waited_s >= timeout_s:
            break
        progress(result.in_flight, result.waited_s)
        time.sleep(poll_s)
        result.in_flight = in_flight(endpoint, kind)
    result.waited_s = time.monotonic() - start
    return result
