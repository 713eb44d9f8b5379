"""Acceptance statistics that respect how drafts are correlated.

Drafts within one request share its context, so they are not independent: an interval
computed over individual drafts is 3-4x too narrow (docs/sources.md#judging). The unit here is a
*sample* — one request, or one wave of concurrent requests measured by counter deltas —
and the interval is a bootstrap over samples of the pooled estimate
1 + sum(accepted) / sum(drafts), which is vLLM's own formula for mean acceptance length.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from typing import Any

import numpy as np


@dataclass(frozen=True)
class Sample:
    """Spec-decode counter deltas for one request or one wave of requests."""

    drafts: float
    draft_tokens: float
    accepted: float
    accepted_per_pos: tuple[float, ...] = ()
    requests: int = 1

    def minus(self, earlier: Sample) -> Sample:
        """What the counters moved by since `earlier` (totals read before and after)."""
        width = max(len(self.accepted_per_pos), len(earlier.accepted_per_pos))
        now = self.accepted_per_pos + (0.0,) * (width - len(self.accepted_per_pos))
        then = earlier.accepted_per_pos + (0.0,) * (width - len(earlier.accepted_per_pos))
        return Sample(
            self.drafts - earlier.drafts,
            self.draft_tokens - earlier.draft_tokens,
            self.accepted - earlier.accepted,
            tuple(a - b for a, b in zip(now, then, strict=True)),
            self.requests - earlier.requests,
        )


@dataclass(frozen=True)
class Estimate:
    mean_acceptance_length: float
    low: float
    high: float
    draft_acceptance_rate: float
    per_position: tuple[float, ...]
    drafts: float
    samples: int


# At or below this acceptance length speculation does nothing (1.0: one token per verify step).
INACTIVE = 1.05


def acceptance_length(drafts: Any, accepted: Any) -> Any:
    """vLLM's formula (v1/spec_decode/metrics.py), the one place this package computes it: every verify
    step emits its accepted drafts plus one token of the target's own. Numbers or numpy arrays (of
    drafts > 0)."""
    return 1.0 + accepted / drafts


def mean_acceptance_length(drafts: float, accepted: float) -> float | None:
    """The mean acceptance length of counter totals or deltas; None without a draft."""
    return float(acceptance_length(drafts, accepted)) if drafts > 0 else None


class Decision(StrEnum):
    inside = "inside"  # the interval lies within the band: pass
    below = "below"  # the interval lies under the band: collapse
    above = "above"  # the interval lies over the band: a loop (read with coherence)
    undecided = "undecided"


def estimate(samples: list[Sample], *, resamples: int = 2000, seed: int = 0) -> Estimate:
    """Pooled acceptance length with a 95% percentile bootstrap over samples."""
    drafts = np.array([s.drafts for s in samples], dtype=float)
    accepted = np.array([s.accepted for s in samples], dtype=float)
    total_drafts = drafts.sum()
    if total_drafts <= 0:
        return Estimate(1.0, 1.0, 1.0, 0.0, (), 0.0, len(samples))
    point = float(mean_acceptance_length(total_drafts, accepted.sum()))
    rng = np.random.default_rng(seed)
    idx = rng.integers(0, len(samples), size=(resamples, len(samples)))
    d = drafts[idx].sum(axis=1)
    a = accepted[idx].sum(axis=1)
    boot = acceptance_length(d[d > 0], a[d > 0])
    low, high = np.percentile(boot, [2.5, 97.5]) if boot.size else (point, point)
    width = max((len(s.accepted_per_pos) for s in samples), default=0)
    per_pos = np.zeros(width)
    for s in samples:
        per_pos[: len(s.accepted_per_pos)] += s.accepted_per_pos
    draft_tokens = sum(s.draft_tokens for s in samples)
    return Estimate(
        mean_acceptance_length=float(point),
        low=float(low),
        high=float(high),
        draft_acceptance_rate=float(accepted.sum() / draft_tokens) if draft_tokens else 0.0,
        per_position=tuple(float(x) for x in per_pos / total_drafts),
        drafts=float(total_drafts),
        samples=len(samples),
    )


def decide(est: Estimate, low: float, high: float, *, min_samples: int = 3) -> Decision:
    """Sequential decision against the band [low, high]; undecided until it is clear."""
    if est.samples < min_samples:
        return Decision.undecided
    if est.high < low:
        return Decision.below
    if est.low > high:
        return Decision.above
    if low <= est.low and est.high <= high:
        return Decision.inside
    return Decision.undecided
