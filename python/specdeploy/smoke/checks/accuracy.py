"""Accuracy: the share of known answers that are right, against the profile's floor.

A small model gets some answers wrong, and a broken stack (another chat template, a perturbed
weight, a tokenizer that is not the model's) gets more wrong while its text may still look fine. The
floor comes from measured healthy runs of the profile's stack, or is unresolved until the first
healthy deploy measures it: then the accuracy is reported (and recorded with the golden transcript
under the served identity) and no floor applies. GPU profiles add a subset of GSM8K's test set with
a floor of its own."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from specdeploy.core.verdicts import Stage, Verdict
from specdeploy.profile.schema import Accuracy, Pin, Provenance
from specdeploy.smoke import answers

if TYPE_CHECKING:
    from specdeploy.smoke.state import Smoke

NAME = "accuracy"
# A profile without an accuracy section (written before the floor existed): every answer right.
EVERY_ANSWER = Accuracy(
    min=Pin(value=1.0, provenance=Provenance.rehearsal, source="no smoke.accuracy in the profile: every answer"),
    source="a profile without smoke.accuracy: every known answer must be right",
)


def judge(floor: Accuracy | None, results: dict[str, str | None]) -> tuple[Verdict, str, dict[str, Any]]:
    """(verdict, summary, details) for `results` (name -> None when right, else what is wrong). No floor
    in the profile (`None`): every known answer must be right."""
    floor = floor or EVERY_ANSWER
    wrong = {name: problem for name, problem in results.items() if problem is not None}
    right = len(results) - len(wrong)
    share = right / len(results) if results else 0.0
    details: dict[str, Any] = {"right": right, "asked": len(results), "accuracy": share, "wrong": wrong}
    measured = f"{right}/{len(results)} right ({share:.0%})"
    if not floor.min.resolved:
        details["floor"] = None
        return Verdict.passed, f"{measured}; no floor yet ({floor.min.source}): recorded", details
    details["floor"] = floor.min.value
    against = f"floor {floor.min.value:.0%}, {floor.min.provenance.value}"
    if share >= floor.min.value:
        return Verdict.passed, f"{measured} >= {against}", details
    example = next(iter(wrong.items()))
    return Verdict.failed, f"{measured} < {against}; e.g. {example[0]}: {example[1]}", details


def check(smoke: Smoke) -> Stage:
    by_label = {a.label: a.completion.text for a in smoke.answers if a.concurrency == 1}
    sets = {"known answers": (smoke.spec.accuracy, smoke.spec.prompts.known_answers)}
    if smoke.spec.gsm8k is not None:
        sets["gsm8k"] = (smoke.spec.gsm8k.accuracy, smoke.gsm8k_answers())
    verdicts, summaries, details = [], [], {}
    for name, (floor, asked) in sets.items():
        results = {a.name: answers.check_answer(a, by_label.get(a.name, "")) for a in asked}
        verdict, summary, found = judge(floor, results)
        # the model's own answers, for the report: what a person reading it would want to see first
        found["answers"] = {a.name: by_label.get(a.name, "")[:200] for a in asked}
        verdicts.append(verdict)
        summaries.append(f"{name}: {summary}")
        details[name] = found
    status = Verdict.failed if Verdict.failed in verdicts else Verdict.passed
    return Stage(NAME, status, "; ".join(summaries), details)
