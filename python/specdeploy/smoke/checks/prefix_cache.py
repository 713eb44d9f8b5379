"""Prefix cache: a prompt answered from a proven prefix-cache hit must get the answer a fresh
prefill gives.

Failure prevented: prefix caching with MTP/EAGLE on hybrid Gated DeltaNet targets silently corrupts
output (vllm-project/vllm#43559: ~20% accuracy lost; #53912, still in 0.28.0, incl. 2x RTX 3090 at
TP=2; a Qwen3.6-27B report of 1 in 8 answers empty). SGLang's hybrid DFlash test asserts the same
equality (test_dflash_qwen35_hybrid.py, docs/sources.md#judging).

The prompts are the first `smoke.prefix_cache_prompts` known answers, each after one shared context
longer than two cache blocks (vLLM caches whole blocks: 128 tokens on CPU, 16 on GPU), so every
request after the first hits the cached context. Another context of the same length is cached first
too: a cache that mixes up requests can only hand out another request's blocks when there are some.
The engine's own counter proves the hits (vLLM: vllm:prefix_cache_hits_total; SGLang: cached_tokens
of each answer). Each cached answer is compared on token ids with the same request made fresh (vLLM:
a new cache_salt; SGLang: a cache namespace of its own), and where they differ, the cached answer is
re-scored by a fresh prefill: a token beyond the lossless tolerance fails the check, naming it."""

from __future__ import annotations

import secrets
from typing import TYPE_CHECKING, Any

from specdeploy.core.verdicts import Stage, Verdict
from specdeploy.smoke.checks import lossless

if TYPE_CHECKING:
    from specdeploy.smoke.state import Answer, Smoke

NAME = "prefix_cache"
# The shared context before each question: over 256 tokens in any tokenizer (two CPU cache blocks).
CONTEXT = (
    "Background notes for the question at the end. A lighthouse keeper's log from a small island records "
    "the weather every morning: wind direction and strength, the height of the swell, the visibility in "
    "nautical miles, and whether the lamp needed cleaning after the night. The island has a harbour on its "
    "eastern side, a row of cottages along the quay, a chapel, a school with eleven pupils, and a ferry that "
    "calls twice a week when the sea allows. In winter the ferry is often cancelled, and the islanders keep "
    "stores of flour, tinned fish, candles and paraffin for the storms. In summer visitors come to watch the "
    "seabirds nesting on the cliffs to the west: puffins, guillemots, razorbills and kittiwakes. The keeper "
    "also notes the ships that pass: fishing boats from the mainland, a cargo ship every few days, and now "
    "and then a sailing yacht sheltering in the harbour overnight. Each entry ends with the time the lamp was "
    "lit and the time it was put out, the amount of oil used, and any repairs made to the clockwork that "
    "turns the lens. The log has been kept without a gap for more than a hundred years, in the same careful "
    "hand for the last thirty of them, and it is read aloud at the island's meeting every new year.\n\n"
    "Question: "
)
# Cached beside CONTEXT, never asked after: the other request whose blocks a broken cache could hand out.
OTHER_CONTEXT = (
    "Background notes for the question at the end. A baker's day starts before dawn: the ovens are lit at "
    "four, the sourdough starter is fed, and the first loaves are shaped while the town is still asleep. "
    "Rye, spelt and white wheat flour are kept in separate bins, weighed for each recipe, and mixed with "
    "water, salt and the starter in a large wooden trough. The dough rests for hours, is folded every half "
    "hour, divided, shaped into rounds and long loaves, and left to rise in linen-lined baskets. When the "
    "ovens reach their heat the loaves are scored with a razor and baked with steam for a crisp crust. By "
    "seven the shop opens: bread, rolls, pastries with apricot and almond, and on Fridays a braided loaf. "
    "In the afternoon the baker cleans the trough, orders flour from the mill in the valley, writes the "
    "next day's list of orders for the cafe, the school and the hospital kitchen, and sets aside the "
    "broken loaves for the farmer's pigs. On the wall hangs a photograph of the bakery a century ago, "
    "with the same oven door and the same sign above the window, and the recipes are written in a book "
    "that has passed from one baker to the next, each adding notes in the margins.\n\n"
    "Question: "
)


def _fresh_salt() -> str:
    return f"specdeploy-fresh-{secrets.token_hex(8)}"


def check(smoke: Smoke) -> Stage:
    count = smoke.spec.prefix_cache_prompts
    if count == 0:
        return Stage(NAME, Verdict.skipped, "smoke.prefix_cache_prompts is 0: the check is off")
    if (why := smoke.client.prefix_caching_off(smoke.profile)) is not None:
        return Stage(NAME, Verdict.skipped, f"the engine serves without prefix caching ({why}): nothing to check")
    chosen = smoke.spec.prompts.known_answers[:count]
    prompts = [(a.name, CONTEXT + a.prompt, a.max_tokens) for a in chosen]
    kwargs = smoke.spec.chat_template_kwargs
    for context in (OTHER_CONTEXT, CONTEXT):  # both contexts' blocks cached; the questions follow CONTEXT
        smoke.client.chat(context + chosen[0].prompt, max_tokens=1, template_kwargs=kwargs)
    before = smoke.client.prefix_cache_hits()
    cached: list[tuple[str, str, Any]] = []
    with smoke.progress() as progress:
        task = progress.add_task("prefix cache: cached and fresh answers", total=len(prompts))
        for label, prompt, max_tokens in prompts:
            hit = smoke.client.chat(prompt, max_tokens=max_tokens, template_kwargs=kwargs)
            fresh = smoke.client.chat(prompt, max_tokens=max_tokens, template_kwargs=kwargs, cache_salt=_fresh_salt())
            cached.append((label, prompt, (hit, fresh)))
            progress.advance(task)
    after = smoke.client.prefix_cache_hits()
    per_answer = [hit.cached_tokens for _, _, (hit, _) in cached]
    hits = (after - before) if before is not None and after is not None else sum(t or 0 for t in per_answer)
    details: dict[str, Any] = {"prompts": len(prompts), "context_hit_tokens": hits, "answers": {}}
    if not hits:
        return Stage(
            NAME,
            Verdict.inconclusive,
            f"no prefix-cache hit was proven for {len(prompts)} prompts sharing a long context (hit tokens: "
            f"{hits}): the cached path was not exercised",
            details,
            hint="check that the engine serves with prefix caching and reports its hits (vLLM: "
            "vllm:prefix_cache_hits_total on /metrics)",
        )
    tolerance = smoke.spec.lossless.max_logprob_gap
    gap = tolerance.value if tolerance.resolved else None
    wrong: list[dict[str, Any]] = []
    for label, prompt, (hit, fresh) in cached:
        same = hit.token_ids == fresh.token_ids if hit.token_ids and fresh.token_ids else hit.text == fresh.text
        details["answers"][label] = {"cached": hit.text, "fresh": fresh.text, "same": same}
        if same:
            continue
        if not (hit.token_ids and hit.prompt_ids):
            wrong.append({"answer": label, "prompt": prompt, "cached": hit.text, "fresh": fresh.text})
            continue
        from specdeploy.smoke.state import Answer

        answer: Answer = Answer(label, prompt, hit, 1)
        scored = smoke.client.rescore(list(hit.prompt_ids), list(hit.token_ids))
        if (found := lossless.divergence(answer, scored, gap)) is not None:
            wrong.append(found)
    details["divergences"] = wrong
    if wrong and gap is None and all("position" in w for w in wrong):
        return Stage(
            NAME,
            Verdict.inconclusive,
            f"{len(wrong)} of {len(prompts)} cached answers hold a token a fresh prefill does not choose, and the "
            f"profile's lossless tolerance is unresolved; first: {lossless.describe(wrong[0])}",
            details,
            hint="near-ties on a healthy stack: set smoke.lossless.max_logprob_gap from measured healthy runs",
        )
    if wrong:
        first = wrong[0]
        what = (
            lossless.describe(first)
            if "position" in first
            else f"answer {first['answer']!r}: cached {first['cached'][:60]!r}, fresh {first['fresh'][:60]!r}"
        )
        return Stage(
            NAME,
            Verdict.failed,
            f"{len(wrong)} of {len(prompts)} answers served from the prefix cache ({hits:g} hit tokens) differ "
            f"from a fresh prefill; first: {what}",
            details,
        )
    differing = sum(1 for a in details["answers"].values() if not a["same"])
    note = f" ({differing} differ only by near-ties within the lossless tolerance)" if differing else ""
    return Stage(
        NAME,
        Verdict.passed,
        f"{len(prompts)} answers from a proven prefix-cache hit ({hits:g} hit tokens) equal a fresh prefill's{note}",
        details,
    )
