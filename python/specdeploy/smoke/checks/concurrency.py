"""Concurrency: the coherence prompts again (at least 2x `smoke.concurrency` requests), with that many
in flight. Known answers must still be as right as at concurrency 1 and the detectors clean (else
fail); agreement with the concurrency-1 outputs over the first N tokens below the profile's floor
alone is inconclusive (batching changes greedy outputs on GPUs). Failure prevented: the field's
drafter at 15 tokens answered 32/32 right at concurrency 1 and 11/32 at 4."""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING

from specdeploy.core.verdicts import Stage, Verdict
from specdeploy.profile import KnownAnswer
from specdeploy.smoke import answers, transcript
from specdeploy.smoke.checks.coherence import degeneracy
from specdeploy.smoke.clients import Completion

if TYPE_CHECKING:
    from specdeploy.smoke.state import Smoke

NAME = "concurrency"


def check(smoke: Smoke) -> Stage:
    c = smoke.spec.concurrency
    floor = smoke.spec.concurrency_agreement
    if c <= 1 or floor is None:
        return Stage(NAME, Verdict.skipped, "smoke.concurrency is 1: coherence ran one request at a time")
    jobs: list[tuple[str, str, int, KnownAnswer | None]] = [
        (a.name, a.prompt, a.max_tokens, a) for a in smoke.spec.prompts.known_answers
    ] + [(f"free_form[{i}]", p, smoke.spec.max_tokens, None) for i, p in enumerate(smoke.spec.prompts.free_form)]
    # every prompt at least once, and at least 2c requests (each prompt twice where there are few)
    jobs = jobs * max(1, -(-2 * c // len(jobs)))
    in_flight = peak = 0
    lock = threading.Lock()

    def ask(job: tuple[str, str, int, KnownAnswer | None]) -> Completion:
        nonlocal in_flight, peak
        with lock:
            in_flight += 1
            peak = max(peak, in_flight)
        try:
            return smoke.ask(job[0], job[1], job[2], concurrency=c)
        finally:
            with lock:
                in_flight -= 1

    with smoke.progress() as progress:
        task = progress.add_task(f"coherence at concurrency {c}", total=len(jobs))
        done: list[Completion] = []
        with ThreadPoolExecutor(max_workers=c) as pool:
            for completion in pool.map(ask, jobs):
                done.append(completion)
                progress.advance(task)
    wrong: dict[str, str] = {}
    degenerate: dict[str, list[str]] = {}
    differ: list[str] = []
    for (name, prompt, _, answer), completion in zip(jobs, done, strict=True):
        alone = smoke.outputs.get(prompt)
        # a known answer wrong at concurrency that was right alone (a small model's misses stay misses)
        right_alone = answer is not None and alone is not None and answers.check_answer(answer, alone) is None
        if right_alone and (problem := answers.check_answer(answer, completion.text)):
            wrong.setdefault(name, problem)
        if findings := degeneracy(completion.text):
            degenerate.setdefault(name, findings)
        if alone is None or not transcript.agrees(alone, completion.text, floor.prefix_tokens):
            differ.append(name)
    fraction = 1 - len(differ) / len(jobs)
    details = {
        "concurrency": c,
        "max_in_flight": peak,
        "requests": len(jobs),
        "wrong_answers": wrong,
        "degenerate": degenerate,
        "agreement": fraction,
        "agreement_floor": floor.min_fraction,
        "prefix_tokens": floor.prefix_tokens,
        "differing": sorted(set(differ)),
    }
    agreement = (
        f"first {floor.prefix_tokens} tokens agree with concurrency 1 on {fraction:.0%} of {len(jobs)} "
        f"(floor {floor.min_fraction:.0%}, {floor.provenance.value})"
    )
    if wrong or degenerate:
        first = next(iter(wrong.values()), None) or next(iter(degenerate.values()))[0]
        return Stage(
            NAME,
            Verdict.failed,
            f"at concurrency {c}: {len(wrong)} answer(s) right alone but wrong, {len(degenerate)} degenerate "
            f"output(s); e.g. {first}; {agreement}",
            details,
        )
    if fraction < floor.min_fraction:
        return Stage(NAME, Verdict.inconclusive, f"answers right and clean at {c} in flight, but {agreement}", details)
    return Stage(
        NAME, Verdict.passed, f"{len(jobs)} requests, {peak} in flight: answers right, clean; {agreement}", details
    )
