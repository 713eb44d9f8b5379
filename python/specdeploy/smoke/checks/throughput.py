"""Throughput: time to first token and the decode rate of one streamed completion at concurrency 1,
against the profile's floor where it has one (the field's 15 draft tokens decoded 40-42 tok/s where
5 gave 57-61)."""

from __future__ import annotations

import math
from dataclasses import asdict
from typing import TYPE_CHECKING

from specdeploy.core.verdicts import Stage, Verdict

if TYPE_CHECKING:
    from specdeploy.smoke.state import Smoke

NAME = "throughput"


def check(smoke: Smoke) -> Stage:
    prompt = smoke.spec.prompts.acceptance[0]
    result = smoke.client.stream_completion(
        prompt, max_tokens=smoke.spec.acceptance_max_tokens, min_tokens=smoke.spec.decode_rate_min_tokens
    )
    details = asdict(result)
    rate = result.decode_tokens_per_s
    floor = smoke.spec.decode_tokens_per_s_min
    ttft = f"TTFT {result.ttft_s * 1000:.0f} ms" if math.isfinite(result.ttft_s) else "no first token"
    if rate is None:
        summary = f"{ttft}; decode rate not measurable: {result.note}"
        return Stage(NAME, Verdict.passed if floor is None else Verdict.inconclusive, summary, details)
    summary = f"{ttft}, decode {rate:.1f} tok/s over {result.tokens} tokens ({result.measured_by})"
    if floor is None:
        return Stage(NAME, Verdict.passed, summary + " (no floor in the profile)", details)
    if rate >= floor:
        return Stage(NAME, Verdict.passed, f"{summary} >= floor {floor}", details)
    return Stage(NAME, Verdict.failed, f"{summary} < floor {floor}", details)
