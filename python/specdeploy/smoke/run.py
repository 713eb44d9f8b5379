"""The smoke gate: is this endpoint serving the profile's stack, coherently, losslessly, at the
acceptance the profile expects? Every deploy passes it before traffic.

The checks run in order, one module each (smoke.checks), and each reports a verdict of the one
vocabulary (core.verdicts): readiness, identity, coherence, accuracy, concurrency, lossless,
prefix_cache, golden, acceptance, long_context, throughput. A failure ends with a diagnosis that
names the likely cause and the next step (smoke.diagnosis), because the field failures this catches
were each found only by a person reading logs. An answer with an unexpected body ends its check as
"could not test" naming the endpoint and what was found, never a traceback.
"""

from __future__ import annotations

import time

from specdeploy.core import progress
from specdeploy.core.verdicts import Stage, Verdict
from specdeploy.profile import Profile
from specdeploy.smoke import checks, diagnosis
from specdeploy.smoke.clients import EngineResponseError, EngineUnavailable
from specdeploy.smoke.state import Answer, Smoke, SmokeOptions, SmokeReport, running_report

__all__ = ["Answer", "Smoke", "SmokeOptions", "SmokeReport", "execute", "run", "running_report"]


def execute(smoke: Smoke) -> SmokeReport:
    """Run the checks in order on `smoke`, then its diagnosis; the report."""
    try:
        for name, check in checks.ORDER:
            progress.observe(f"smoke: {name}")
            began = time.monotonic()
            try:
                result = check(smoke)
            except EngineResponseError as exc:  # answered, but not as the engine's API does
                result = Stage(name, Verdict.error, f"could not test: {exc.message}", hint=exc.hint)
            result.elapsed_s = round(time.monotonic() - began, 2)
            smoke.report.stages.append(result)
            if result.status is Verdict.error or (
                result.name in checks.GATEKEEPERS and result.status is Verdict.failed
            ):
                break
    except EngineUnavailable as exc:
        smoke.report.stages.append(
            Stage(
                "server",
                Verdict.error,
                f"the server stopped answering: {exc.message}",
                hint="read the engine log (journalctl -u specdeploy-engine) and run the smoke again",
            )
        )
    finally:
        smoke.close()
    smoke.report.diagnosis = diagnosis.diagnose(smoke)
    smoke.report.elapsed_s = time.monotonic() - smoke.report.started
    return smoke.report


def run(profile: Profile, endpoint: str, options: SmokeOptions | None = None) -> SmokeReport:
    return execute(Smoke(profile, endpoint, options or SmokeOptions()))
