"""Readiness: the engine answers /health and lists the profile's model, within the timeout.

Reports the last concrete reason it was not ready (refused, timed out, the HTTP status and the first
bytes of the body); an endpoint that is not a base URL ends it at once, naming why (issue 20, D5)."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

from specdeploy.core import progress as steps
from specdeploy.core.verdicts import Stage, Verdict
from specdeploy.smoke.clients import EngineUnavailable

if TYPE_CHECKING:
    from specdeploy.smoke.state import Smoke

NAME = "readiness"


def check(smoke: Smoke) -> Stage:
    if smoke.endpoint_problem:
        return Stage(
            NAME,
            Verdict.error,
            f"--endpoint {smoke.endpoint!r} {smoke.endpoint_problem}; nothing was asked",
            hint=f"pass the engine's base URL, e.g. http://127.0.0.1:{smoke.profile.engine.serve.port}",
        )
    timeout = smoke.options.readiness_timeout_s or smoke.spec.readiness_timeout_s
    model = smoke.profile.engine.serve.served_model_name
    last = "no answer yet"
    hint = "start the engine or correct --endpoint; the engine's log says why it is not serving"
    with smoke.progress() as progress:
        # the client (its TLS setup) and the progress line are built before the clock starts,
        # and the engine is asked at least once: on a loaded host, building them once outlasted
        # a short timeout and the smoke said "not ready" without having asked
        progress.add_task(f"waiting for {smoke.client.base_url} to serve {model}", total=None)
        deadline = time.monotonic() + timeout
        while True:
            left = deadline - time.monotonic()
            if smoke.options.engine_down is not None and (reason := smoke.options.engine_down()):
                return Stage(
                    NAME,
                    Verdict.error,
                    f"the engine stopped before it was ready: {reason}",
                    hint="read the engine log: it exits at start",
                )
            probe = min(5.0, max(0.2, left))  # one probe never outlasts the stage's own deadline
            try:
                smoke.client.check_health(timeout=probe)
                served = smoke.client.served_models(timeout=probe)
            except EngineUnavailable as exc:
                last = exc.message
            else:
                if model in served:
                    summary = f"/health ok, /v1/models lists {model}"
                    return Stage(NAME, Verdict.passed, summary, {"ready_at": time.time()})
                last = f"GET {smoke.client.base_url}/v1/models lists {served}, not {model}"
                hint = f"serve {model} (the profile's engine.serve.served_model_name) or correct --endpoint"
            steps.observe(f"smoke: readiness: {model} not served yet; last: {last}")
            if deadline - time.monotonic() <= 0:
                break
            time.sleep(max(0.0, min(1.0, deadline - time.monotonic())))
    return Stage(NAME, Verdict.error, f"not ready within {timeout:g}s; last: {last}", hint=hint)
