"""Correlated drafts, simulated, for checking the acceptance interval's coverage."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from specdeploy.smoke.acceptance import Sample


@dataclass
class Simulation:
    """Each request has its own acceptance probability (Beta-distributed), and a draft
    accepts a geometric prefix: drafts within a request are correlated, as on real servers."""

    k: int = 5
    mean_p: float = 0.6
    concentration: float = 6.0
    drafts_per_request: int = 128
    rng: np.random.Generator = field(default_factory=lambda: np.random.default_rng(1))
    last_per_draft: np.ndarray = field(default_factory=lambda: np.zeros(0))

    def true_length(self, n: int = 400_000) -> float:
        """1 + E[sum_i p^i]: the expected accepted prefix of a draft, plus the bonus token."""
        p = np.random.default_rng(99).beta(self.mean_p * self.concentration, (1 - self.mean_p) * self.concentration, n)
        return float(1 + sum(np.mean(p**i) for i in range(1, self.k + 1)))

    def request(self) -> Sample:
        """One request's counter deltas; its per-draft accepted counts go to `last_per_draft`."""
        p = self.rng.beta(self.mean_p * self.concentration, (1 - self.mean_p) * self.concentration)
        u = self.rng.random((self.drafts_per_request, self.k))
        accepted_prefix = np.cumprod(u < p, axis=1)
        self.last_per_draft = accepted_prefix.sum(axis=1)
        per_pos = accepted_prefix.sum(axis=0)
        return Sample(
            drafts=float(self.drafts_per_request),
            draft_tokens=float(self.drafts_per_request * self.k),
            accepted=float(per_pos.sum()),
            accepted_per_pos=tuple(float(x) for x in per_pos),
        )
