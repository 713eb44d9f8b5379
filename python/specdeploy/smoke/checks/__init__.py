"""The smoke's checks, one module each, in the order they run: each is `check(smoke) -> Stage`.

| check | asks | fails when |
|---|---|---|
| readiness | /health, /v1/models | (error) not serving the profile's model in time |
| identity | /version, /metrics, /v1/models, the startup log | engine, version, method, k, context, sampling defaults |
| coherence | the known-answer and free-form prompts, greedy | an answer's text is degenerate (the detectors) |
| accuracy | (coherence's answers) | fewer known answers right than the profile's floor |
| concurrency | the same prompts with `smoke.concurrency` in flight | answers wrong or degenerate under load |
| lossless | a fresh prefill of each prompt + answer (token ids) | a generated token is not the target's greedy choice |
| prefix_cache | prompts from a proven cache hit, and fresh | a cache hit answers other than a fresh prefill |
| golden | (coherence's answers) | greedy outputs drifted from the served identity's transcript |
| acceptance | raw completion prompts, in waves | mean acceptance length outside the band (collapse or loop) |
| long_context | one request past a position | acceptance collapses after the position |
| throughput | one streamed completion | decode tok/s under the profile's floor |

After readiness or identity fails, or any check could not test, nothing more is asked.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from specdeploy.core.verdicts import Stage
from specdeploy.smoke.checks import (
    acceptance,
    accuracy,
    coherence,
    concurrency,
    golden,
    identity,
    long_context,
    lossless,
    prefix_cache,
    readiness,
    throughput,
)

if TYPE_CHECKING:
    from specdeploy.smoke.state import Smoke

ORDER: tuple[tuple[str, Callable[[Smoke], Stage]], ...] = tuple(
    (module.NAME, module.check)
    for module in (
        readiness, identity, coherence, accuracy, concurrency, lossless, prefix_cache, golden, acceptance,
        long_context, throughput,
    )
)  # fmt: skip
# A failure of these ends the run: nothing after them would be about the profile's stack.
GATEKEEPERS = (readiness.NAME, identity.NAME)
