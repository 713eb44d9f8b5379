"""Acceptance: the mean acceptance length of the profile's raw completion prompts, measured in waves
from the engine's counters and decided sequentially against the profile's band (smoke.acceptance:
the pooled estimate with a bootstrap over waves). Below the band: a collapse (the field's hand-built
drafter config: 1.1 where 3 was verified). Above it, or every position ~100% with repetitive text: a
token loop. Speculation with nothing drafted, or ~1 token per verify step, is speculation off."""

from __future__ import annotations

from typing import TYPE_CHECKING

from specdeploy.core.verdicts import Stage, Verdict
from specdeploy.smoke import acceptance
from specdeploy.smoke.checks.identity import speculation_mismatch

if TYPE_CHECKING:
    from specdeploy.smoke.state import Smoke

NAME = "acceptance"


def looks_like_loop(smoke: Smoke, est: acceptance.Estimate) -> bool:
    """Every position ~100% together with repetitive text: the signature of a token loop."""
    from specdeploy.smoke.checks.coherence import degeneracy

    saturated = bool(est.per_position) and min(est.per_position) >= 0.95
    texts = smoke.acceptance_texts
    return saturated and sum(1 for t in texts if degeneracy(t)) >= len(texts) / 2


def check(smoke: Smoke) -> Stage:
    spec = smoke.spec
    band, prompts, wave = spec.acceptance_length, spec.prompts.acceptance, spec.wave_size
    samples: list[acceptance.Sample] = []
    other = used = 0
    decision = acceptance.Decision.undecided
    est = acceptance.estimate([])
    with smoke.progress() as progress:
        task = progress.add_task("acceptance (sequential)", total=spec.max_requests)
        while used + wave <= spec.max_requests:
            batch = [prompts[(used + i) % len(prompts)] for i in range(wave)]
            result = smoke.client.acceptance_wave(batch, max_tokens=spec.acceptance_max_tokens)
            used += wave
            other += result.other_requests
            samples.append(result.sample)
            smoke.acceptance_texts += [c.text for c in result.completions]
            progress.update(task, completed=used)
            est = acceptance.estimate(samples)
            if est.drafts == 0 and len(samples) >= spec.min_samples:
                break
            decision = acceptance.decide(est, band.min, band.max, min_samples=spec.min_samples)
            if decision is not acceptance.Decision.undecided:
                break
    smoke.acceptance_estimate = est
    details = {
        "mean_acceptance_length": est.mean_acceptance_length,
        "interval_95": [est.low, est.high],
        "band": [band.min, band.max],
        "draft_acceptance_rate": est.draft_acceptance_rate,
        "per_position": list(est.per_position),
        "drafts": est.drafts,
        "requests": used,
        "waves": len(samples),
        "decision": decision.value,
        "other_traffic_requests": other,
    }
    interval = f"{est.mean_acceptance_length:.2f} [{est.low:.2f}, {est.high:.2f}]"
    where = f"band [{band.min}, {band.max}], {used} requests in {len(samples)} waves"
    if other:
        where += f"; {other} other request(s) seen on the server during the smoke"
    if est.drafts == 0:
        return Stage(NAME, Verdict.failed, f"no drafts at all over {used} requests ({where})", details)
    want_k = smoke.profile.engine.speculative.num_speculative_tokens
    if smoke.served_k is None and est.per_position and len(est.per_position) != want_k:
        # identity could not read k (no position labels before the first request): the waves' own counters tell
        served = {"method": None, "k": len(est.per_position), "sources": ["the acceptance waves' per-position counter"]}
        details["mismatch"] = speculation_mismatch(smoke.profile, served)
        return Stage(NAME, Verdict.failed, str(details["mismatch"]), details)
    if est.mean_acceptance_length <= acceptance.INACTIVE and not est.per_position:
        # SGLang (no per-position counts): one token per verify step is speculation doing nothing. vLLM's
        # per-position rates tell a drafter proposing wrong tokens (the field's config) apart: below.
        return Stage(
            NAME,
            Verdict.failed,
            f"mean acceptance length {interval}: speculation inactive (~1 token per verify step; {where})",
            details,
        )
    loop = looks_like_loop(smoke, est) or decision is acceptance.Decision.above
    details["token_loop"] = loop
    if decision is acceptance.Decision.inside and not loop:
        return Stage(NAME, Verdict.passed, f"mean acceptance length {interval} inside {where}", details)
    if decision is acceptance.Decision.below:
        return Stage(NAME, Verdict.failed, f"mean acceptance length {interval} below {where}", details)
    if loop:
        return Stage(NAME, Verdict.failed, f"mean acceptance length {interval} above {where}: a token loop?", details)
    return Stage(NAME, Verdict.inconclusive, f"mean acceptance length {interval} undecided after {where}", details)
