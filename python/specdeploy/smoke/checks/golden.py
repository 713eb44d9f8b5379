"""Golden: the greedy outputs of the coherence prompts against the transcript recorded for this
served identity (gate.golden keys it): a changed output under an unchanged stack is drift. With
--record-golden (or the gate on a first deploy of an identity) this run's outputs are recorded,
with the known answers' accuracy, instead."""

from __future__ import annotations

from typing import TYPE_CHECKING

from specdeploy.core import atomic
from specdeploy.core.errors import WriteError
from specdeploy.core.verdicts import Stage, Verdict
from specdeploy.smoke import transcript

if TYPE_CHECKING:
    from specdeploy.smoke.state import Smoke

NAME = "golden"


def check(smoke: Smoke) -> Stage:
    n = smoke.spec.golden_prefix_tokens
    if smoke.options.record_golden:
        accuracy = smoke.report.stage("accuracy")
        record = {
            "profile": smoke.profile.name,
            "engine_version": str(smoke.profile.engine.source.version.value),
            "prefix_tokens": n,
            "outputs": smoke.outputs,
            # the accuracy of the healthy stack whose outputs these are (issue 34): right / asked per set
            "accuracy": {
                name: {"right": found["right"], "asked": found["asked"], "accuracy": found["accuracy"]}
                for name, found in (accuracy.details if accuracy else {}).items()
            },
        }
        path = smoke.options.record_golden
        try:
            atomic.ensure_dir(path.parent)
            atomic.write_json(path, record, mode=0o640)
        except WriteError as exc:
            return Stage(NAME, Verdict.error, f"could not record the golden transcript: {exc.message}", hint=exc.hint)
        return Stage(NAME, Verdict.passed, f"recorded {len(smoke.outputs)} outputs to {path}")
    if smoke.golden_record is None:
        return Stage(NAME, Verdict.skipped, "no --golden transcript given")
    recorded = smoke.golden_record
    fraction, drifted = transcript.compare(recorded, smoke.outputs, n)
    floor = smoke.spec.golden_match_fraction_min
    details = {"match_fraction": fraction, "drifted_prompts": drifted, "floor": floor}
    if "accuracy" in recorded:
        details["recorded_accuracy"] = recorded["accuracy"]
    status = Verdict.passed if fraction >= floor else Verdict.failed
    return Stage(
        NAME,
        status,
        f"first {n} tokens match on {fraction:.0%} of {len(recorded['outputs'])} prompts (floor {floor:.0%})",
        details,
    )
