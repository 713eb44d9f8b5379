"""Lossless: greedy speculative decoding must give exactly the target's own greedy tokens.

Every greedy answer the smoke asked for (at concurrency 1 and at the profile's concurrency) is
re-scored by a fresh prefill of its prompt plus its answer, on the token ids the server rendered and
generated (never re-tokenised text): vLLM's `prompt_logprobs`, which skips the prefix cache; SGLang's
/generate logprobs from position 0, which no cache prefix serves (smoke.clients). Each generated token
must be the target's top choice, or within the profile's `smoke.lossless.max_logprob_gap` of it (a
near-tie that batching or kernel numerics can flip). A verifier that accepts a draft the target would
not have chosen fails here, naming the prompt, the first diverging position and both tokens.

The speculative counters must have moved while the answers were generated: a re-score of answers
made without speculation proves nothing (logprob requests once switched speculation off in vLLM,
vllm-project/vllm#34497). With the tolerance unresolved (GPU profiles before their first healthy
deploy) a token that is not the top choice makes the stage inconclusive, with the gaps measured."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING, Any

import numpy as np

from specdeploy.core.verdicts import Stage, Verdict
from specdeploy.smoke.clients import Scored

if TYPE_CHECKING:
    from specdeploy.smoke.state import Answer, Smoke

NAME = "lossless"


def divergence(answer: Answer, scored: list[Scored], tolerance: float | None) -> dict[str, Any] | None:
    """The first generated token that is not the target's top choice beyond `tolerance` (None: any
    token that is not the top choice), or None when every token is."""
    for position, token in enumerate(scored):
        if token.rank == 1 or (tolerance is not None and token.gap <= tolerance):
            continue
        return {
            "answer": answer.label,
            "prompt": answer.prompt,
            "concurrency": answer.concurrency,
            "position": position,
            "generated": {"id": token.token_id, "text": token.text, "logprob": token.logprob},
            "top_choice": {"id": token.top_id, "text": token.top_text, "logprob": token.top_logprob},
            "gap": token.gap,
        }
    return None


def describe(found: dict[str, Any]) -> str:
    where = "alone" if found["concurrency"] == 1 else f"at concurrency {found['concurrency']}"
    gen, top = found["generated"], found["top_choice"]
    return (
        f"answer {found['answer']!r} ({where}, prompt {found['prompt'][:50]!r}): generated token {found['position']} "
        f"is {gen['text']!r} (id {gen['id']}, logprob {gen['logprob']:.3f}) where the target's greedy choice is "
        f"{top['text']!r} (id {top['id']}, logprob {top['logprob']:.3f}): {found['gap']:.3f} nats below it"
    )


def _distribution(scored: list[list[Scored]]) -> dict[str, Any]:
    """What calibrates the tolerance: the gaps of tokens that were not the top choice, and how close
    the chosen tokens came to a tie with the runner-up (the margin)."""
    flat = [t for answer in scored for t in answer]
    gaps = np.array([t.gap for t in flat if t.rank != 1], dtype=float)
    margins = np.array([t.margin for t in flat if t.rank == 1 and t.margin is not None], dtype=float)

    def q(values: np.ndarray) -> dict[str, float] | None:
        if not values.size:
            return None
        quantiles = np.quantile(values, [0.0, 0.01, 0.5]).round(6).tolist()
        return dict(zip(("min", "p01", "median"), quantiles, strict=True)) | {"max": round(float(values.max()), 6)}

    return {
        "tokens": len(flat),
        "not_top_choice": int(gaps.size),
        "gaps_nats": q(gaps),
        "top_choice_margin_nats": q(margins),
        "near_ties_below_0.1_nats": int((margins < 0.1).sum()),
    }


def check(smoke: Smoke) -> Stage:
    spec = smoke.spec.lossless
    if not spec.enabled:
        return Stage(NAME, Verdict.skipped, "smoke.lossless.enabled is off")
    asked = [a for a in smoke.answers if a.completion.token_ids and a.completion.prompt_ids]
    if not asked:
        return Stage(
            NAME,
            Verdict.error,
            "could not test: the engine returned no token ids with its answers",
            hint="the engine must return prompt and answer token ids (vLLM: return_token_ids, 0.10.2 and later): "
            "check the identity stage's version",
        )
    with smoke.progress() as progress:
        task = progress.add_task("lossless: fresh prefills of each answer", total=len(asked))

        def rescore(answer: Answer) -> list[Scored]:
            done = smoke.client.rescore(list(answer.completion.prompt_ids), list(answer.completion.token_ids))
            progress.advance(task)
            return done

        with ThreadPoolExecutor(max_workers=max(1, smoke.spec.concurrency)) as pool:
            scored = list(pool.map(rescore, asked))
    tolerance = spec.max_logprob_gap.value if spec.max_logprob_gap.resolved else None
    found = [d for a, s in zip(asked, scored, strict=True) if (d := divergence(a, s, tolerance)) is not None]
    counters = smoke.answer_counters
    details: dict[str, Any] = {
        "answers": len(asked),
        "at_concurrency": sorted({a.concurrency for a in asked}),
        "tolerance_nats": tolerance,
        "tolerance_source": spec.max_logprob_gap.source,
        "distribution": _distribution(scored),
        "divergences": found,
        "speculation_during_answers": None
        if counters is None
        else {"drafts": counters.drafts, "accepted": counters.accepted},
    }
    tokens = details["distribution"]["tokens"]
    where = f"{tokens} tokens of {len(asked)} answers (concurrency {', '.join(map(str, details['at_concurrency']))})"
    if found and tolerance is not None:
        return Stage(
            NAME,
            Verdict.failed,
            f"{len(found)} answer(s) not the target's greedy tokens; first: {describe(found[0])}",
            details,
        )
    if found:
        return Stage(
            NAME,
            Verdict.inconclusive,
            f"{len(found)} answer(s) hold a token that is not the top choice, and the profile's tolerance is "
            f"unresolved ({spec.max_logprob_gap.source}); first: {describe(found[0])}",
            details,
            hint="on a healthy stack these are near-ties: set smoke.lossless.max_logprob_gap from the measured gaps "
            "(details.distribution); a lossy verifier gives gaps of nats",
        )
    if counters is not None and counters.drafts <= 0:
        return Stage(
            NAME,
            Verdict.failed,
            f"{where} are the target's greedy choice, but the speculative counters did not move while they were "
            "generated: speculation did not run for them, so this proves nothing about the verifier",
            details,
        )
    moved = (
        "; speculation not confirmed for them: this engine exports no speculative counters (the acceptance "
        "stage measures it per request)"
        if counters is None
        else f"; {counters.drafts:g} drafts, {counters.accepted:g} accepted meanwhile"
    )
    within = "exactly" if not details["distribution"]["not_top_choice"] else f"within {tolerance:g} nats of"
    allowed = f"tolerance {tolerance:g} nats" if tolerance is not None else "tolerance unresolved"
    return Stage(NAME, Verdict.passed, f"{where}: {within} the target's greedy choice ({allowed}){moved}", details)
