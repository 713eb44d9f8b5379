"""One verdict vocabulary for every judgement specdeploy makes: the smoke's stages, the deploy's
gate, the light gate (watch) and the rollback's proof.

Failure prevented (issue 34, item 7): the smoke, the gate and the watch each had their own verdict
enum and `EXIT_CODES` table, and they had begun to differ (the watch's `skipped` and `running`, the
gate's `interrupted`): a report read by a script meant a different thing depending on who wrote it.
Now each verdict has one name and one exit code, here:

| verdict | exit | meaning |
|---|---|---|
| pass | 0 | every check that ran passed |
| fail | 1 | a check found the stack wrong (a decisive failure stays decisive if the server dies after) |
| error | 2 | could not test: unreachable, server errors, an answer that is not the engine's API, bad input |
| inconclusive | 3 | measured, but the evidence decides neither way (e.g. an acceptance interval across a band edge) |
| skipped | 0 | nothing to judge (a check that does not apply; a light gate while a deploy's gate runs) |
| interrupted | 130 | SIGTERM or Ctrl-C before a verdict |
| running | 130 | what a report holds while its run is going: a process that died leaves it |

The gate adds one code of its own, 4: the new stack failed and the previous one was not proven to
serve after the rollback (specdeploy.gate.run.EXIT_NOT_RESTORED).
"""

from __future__ import annotations

import contextlib
import signal
from collections.abc import Iterable, Iterator
from dataclasses import asdict, dataclass, field
from enum import StrEnum
from types import FrameType
from typing import Any

from specdeploy.core.errors import EXIT_INTERRUPTED, EXIT_TEMPFAIL


class Verdict(StrEnum):
    passed = "pass"
    failed = "fail"
    error = "error"
    inconclusive = "inconclusive"
    skipped = "skipped"
    interrupted = "interrupted"
    running = "running"


EXIT_CODES: dict[Verdict, int] = {
    Verdict.passed: 0,
    Verdict.failed: 1,
    Verdict.error: 2,
    Verdict.inconclusive: 3,
    Verdict.skipped: 0,
    Verdict.interrupted: EXIT_INTERRUPTED,
    Verdict.running: EXIT_INTERRUPTED,
}

# `gate-wait --for S` while the gate still runs (EX_TEMPFAIL: look again): a process waiting on a
# running gate, never a report's code; the deploy's wait task retries until it sees another
EXIT_RUNNING = EXIT_TEMPFAIL

# Which verdict of several decides: a failure beats could-not-test beats inconclusive.
_PRECEDENCE = (Verdict.failed, Verdict.error, Verdict.inconclusive)


def worst(verdicts: Iterable[Verdict]) -> Verdict:
    """The verdict of several checks: fail, else error, else inconclusive, else pass (skipped
    checks and none at all are a pass)."""
    found = set(verdicts)
    return next((v for v in _PRECEDENCE if v in found), Verdict.passed)


@dataclass
class Stage:
    """One check's result: a name, its verdict, a one-line summary, the figures behind it, and,
    for a check that could not test, what to do."""

    name: str
    status: Verdict
    summary: str
    details: dict[str, Any] = field(default_factory=dict)
    hint: str | None = None
    elapsed_s: float | None = None  # how long the check ran, where the runner timed it

    def to_json(self) -> dict[str, Any]:
        return asdict(self) | {"status": self.status.value}


class Interrupted(BaseException):
    """SIGTERM (from Ansible, systemd or `timeout`) arrived while a smoke, gate or light gate ran."""


@contextlib.contextmanager
def sigterm_interrupts() -> Iterator[None]:
    """Turn SIGTERM into an exception, so a report is written before the process ends."""

    def handler(signum: int, frame: FrameType | None) -> None:
        raise Interrupted(signal.Signals(signum).name)

    try:
        previous = signal.signal(signal.SIGTERM, handler)
    except ValueError:  # not the main thread: leave signals alone
        yield
        return
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)
