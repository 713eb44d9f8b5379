"""The speculative setup a server runs, as one source reports it (its API, its startup log).

A server speculating with another method or another number of draft tokens than the profile's got
"drafter config: run verify-config" or "inconclusive" from the smoke; the field's mistake (15 draft
tokens where 5 were verified) must be named for what it is. The smoke's identity stage compares this
with the profile (smoke.checks.identity.speculation_mismatch).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class ServedSpeculation:
    """The speculative setup a server runs, as far as one source tells: `method` None where the
    source does not say it, `k` 0 where speculation is off and None where the source does not say."""

    method: str | None
    k: int | None
    source: str
    draft_model_path: str | None = None
