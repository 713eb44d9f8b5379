"""Long context: one request whose prompt crosses `position` tokens, acceptance measured on what it
decodes after it (vllm-project/vllm#52873: acceptance fell to 0% engine-wide past 32768)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from specdeploy.core.verdicts import Stage, Verdict
from specdeploy.smoke import acceptance

if TYPE_CHECKING:
    from specdeploy.smoke.state import Smoke

NAME = "long_context"


def check(smoke: Smoke) -> Stage:
    probe = smoke.spec.long_context
    if probe is None or not probe.enabled:
        return Stage(NAME, Verdict.skipped, "the profile's long-context probe is off")
    result = smoke.client.long_context_wave(probe.position, max_tokens=probe.max_tokens)
    est = acceptance.estimate([result.sample])
    details = {
        "position": probe.position,
        "prompt_tokens": result.prompt_tokens,
        "mean_acceptance_length": est.mean_acceptance_length,
        "drafts": est.drafts,
        "floor": probe.acceptance_length_min,
    }
    if result.prompt_tokens is not None and result.prompt_tokens < probe.position:
        return Stage(
            NAME,
            Verdict.error,
            f"the probe's prompt had {result.prompt_tokens} tokens, short of position {probe.position}",
            details,
            hint="the engine tokenized the probe shorter than expected: report it as a specdeploy bug",
        )
    summary = (
        f"after crossing position {probe.position}: mean acceptance length {est.mean_acceptance_length:.2f} "
        f"over {est.drafts:.0f} drafts (floor {probe.acceptance_length_min})"
    )
    if est.drafts == 0 or est.mean_acceptance_length < probe.acceptance_length_min:
        return Stage(NAME, Verdict.failed, summary, details)
    return Stage(NAME, Verdict.passed, summary, details)
