"""Coherence: the known-answer and free-form prompts, greedy, one at a time, and every answer's
text read by the degeneracy detectors (smoke.coherence: loops, salad, mojibake, runs of "!").

The answers (with their token ids) are kept for the checks after it: accuracy judges the known
ones, lossless re-scores them, golden compares them. The speculative counters are read before and
after, so lossless can say speculation really ran while they were generated."""

from __future__ import annotations

from typing import TYPE_CHECKING

from specdeploy.core.verdicts import Stage, Verdict
from specdeploy.smoke import coherence as detectors

if TYPE_CHECKING:
    from specdeploy.smoke.state import Smoke

NAME = "coherence"


def degeneracy(text: str) -> list[str]:
    """What the detectors find in one answer, as `detector: detail` lines (none for a clean one)."""
    return [f"{f.detector}: {f.detail}" for f in detectors.detect(text)]


def check(smoke: Smoke) -> Stage:
    prompts = smoke.spec.prompts
    degenerate: dict[str, list[str]] = {}
    known = [(a.name, a.prompt, a.max_tokens) for a in smoke.known_answers()]
    free = [(f"free_form[{i}]", p, smoke.spec.max_tokens) for i, p in enumerate(prompts.free_form)]
    before = smoke.client.speculation_counters()
    with smoke.progress() as progress:
        task = progress.add_task("coherence prompts", total=len(known) + len(free))
        for label, prompt, max_tokens in known + free:
            done = smoke.ask(label, prompt, max_tokens)
            if findings := degeneracy(done.text):
                degenerate[label] = findings
            progress.advance(task)
    after = smoke.client.speculation_counters()
    if before is not None and after is not None:
        smoke.answer_counters = after.minus(before)
    total = len(known) + len(free)
    details = {"degenerate": degenerate, "outputs": smoke.outputs}
    if not degenerate:
        return Stage(NAME, Verdict.passed, f"{total} answers, no degeneracy", details)
    first = next(iter(degenerate.values()))[0]
    return Stage(
        NAME,
        Verdict.failed,
        f"{len(degenerate)} degenerate output(s) of {total}; e.g. {next(iter(degenerate))}: {first}",
        details,
    )
