"""Acceptance statistics: pooled estimate, bootstrap coverage on correlated drafts, decisions."""

from __future__ import annotations

import numpy as np
import pytest
from tests.support.simulation import Simulation

from specdeploy.smoke.acceptance import Decision, Sample, decide, estimate


def test_pooled_estimate_matches_vllm_formulas() -> None:
    samples = [Sample(10, 50, 20, (8, 6, 4, 2, 0)), Sample(30, 150, 30, (15, 10, 5, 0, 0))]
    est = estimate(samples)
    assert est.mean_acceptance_length == pytest.approx(1 + 50 / 40)
    assert est.draft_acceptance_rate == pytest.approx(50 / 200)
    assert est.per_position == pytest.approx((23 / 40, 16 / 40, 9 / 40, 2 / 40, 0.0))
    assert est.low <= est.mean_acceptance_length <= est.high


def test_no_drafts_is_length_one_with_no_positions() -> None:
    est = estimate([Sample(0, 0, 0), Sample(0, 0, 0)])
    assert (est.mean_acceptance_length, est.drafts, est.per_position) == (1.0, 0.0, ())


def test_bootstrap_over_requests_covers_95_percent_on_correlated_drafts() -> None:
    """200 simulated smoke runs of 48 requests x 128 correlated drafts: the bootstrap over
    requests contains the true value ~95% of the time; a naive per-draft interval does not."""
    sim = Simulation(k=5, mean_p=0.6, concentration=6.0, drafts_per_request=128, rng=np.random.default_rng(7))
    truth = sim.true_length()
    covered = naive_covered = 0
    trials = 200
    for trial in range(trials):
        samples, per_draft = [], []
        for _ in range(48):
            samples.append(sim.request())
            per_draft.append(sim.last_per_draft)
        est = estimate(samples, resamples=1000, seed=trial)
        covered += est.low <= truth <= est.high
        # the naive interval treats all 6144 drafts as independent
        drafts = np.concatenate(per_draft)
        half = 1.96 * drafts.std(ddof=1) / np.sqrt(drafts.size)
        naive_covered += abs(1 + drafts.mean() - truth) <= half
    coverage, naive = covered / trials, naive_covered / trials
    assert 0.90 <= coverage <= 0.99, coverage
    assert naive < 0.8, naive


def test_collapse_is_decided_after_a_handful_of_requests() -> None:
    """1.1 against a 2.5 floor is decisive long before the budget (docs/sources.md#judging)."""
    sim = Simulation(k=5, mean_p=0.02, concentration=20.0, drafts_per_request=16, rng=np.random.default_rng(3))
    samples: list[Sample] = []
    while decide(estimate(samples), 2.5, 5.0) is Decision.undecided:
        samples.append(sim.request())
        assert len(samples) <= 10
    assert decide(estimate(samples), 2.5, 5.0) is Decision.below


def test_decisions() -> None:
    healthy = [Sample(100, 500, 200 + i) for i in range(8)]
    assert decide(estimate(healthy), 2.5, 5.0) is Decision.inside
    assert decide(estimate(healthy), 3.5, 5.0) is Decision.below
    assert decide(estimate(healthy), 1.5, 2.5) is Decision.above
    assert decide(estimate(healthy[:2]), 2.5, 5.0) is Decision.undecided  # too few samples
    noisy = [Sample(10, 50, a) for a in (0, 50, 0, 50, 0, 50)]
    assert decide(estimate(noisy), 3.0, 5.0) is Decision.undecided
