"""The migration record: one JSON file on the controller per move, what every step reads and writes.

Failure prevented: the field's last host move took a week by hand and nobody could say which steps
had been done, on which host, with what result. Each `specdeploy migrate` step records here when it
started, how it ended and what it found, so a step can be re-run (idempotent), an interrupted one
resumed, and `rollback` knows where traffic is.

    <site>/migrations/<old>--<new>.json     (the site directory: the inventory's, beside the lock)

| step | may start when | leaves traffic on |
|---|---|---|
| plan | always (re-plans) | OLD |
| prepare | plan is done | OLD |
| verify | prepare is done | OLD |
| cutover | verify is done (and passed) | NEW |
| rollback | always | OLD |
| finish | cutover is done, NEW has served `migration.soak_s`, and `--stop-old` was given | NEW |

Writes are atomic (core.atomic): a record is never half written, however a step ends.
"""

from __future__ import annotations

import datetime as dt
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from specdeploy.core import atomic, files
from specdeploy.core.errors import SpecdeployError, UsageError, first_invalid
from specdeploy.front.config import NAME_RE

STEPS = ("plan", "prepare", "verify", "cutover", "rollback", "finish")
Step = Literal["plan", "prepare", "verify", "cutover", "rollback", "finish"]
# The steps each depending on the one before: a step's pass counts only while none before it ran again.
CHAIN = ("plan", "prepare", "verify", "cutover")
REQUIRES: dict[str, tuple[str, ...]] = {
    "plan": (),
    "prepare": ("plan",),
    "verify": ("prepare",),
    "cutover": ("verify",),
    "rollback": (),
    "finish": ("cutover",),
}


class RecordError(SpecdeployError):
    exit_code = 2


def now() -> str:
    return dt.datetime.now(dt.UTC).isoformat(timespec="milliseconds")


# A run's fields as `migrate show` and benchmarks/migration.py print them, in their order.
RUN_FIELDS = ("step", "event", "seconds", "bytes_copied", "move_s", "failed_requests")


def figures(step: str, details: dict[str, Any]) -> dict[str, Any]:
    """What a run of `step` measured, kept in the history (docs/benchmarks.md reads them): the bytes
    a prepare copied (the weights, and the image archive from OLD where it seeded one), a cutover's or
    rollback's duration and the requests the front saw fail."""
    found: dict[str, Any] = {}
    copied = [
        part["bytes_copied"]
        for part in (details.get("seed"), details.get("image"))
        if isinstance(part, dict) and "bytes_copied" in part
    ]
    if copied:
        found["bytes_copied"] = sum(copied)
    if step in ("cutover", "rollback") and "duration_s" in details:
        found["move_s"] = details["duration_s"]
        found["failed_requests"] = details.get("failed_requests_at_front")
    return found


def seconds_between(start: str, end: str) -> float:
    return round((dt.datetime.fromisoformat(end) - dt.datetime.fromisoformat(start)).total_seconds(), 1)


class StepRecord(BaseModel):
    model_config = ConfigDict(extra="forbid")

    status: Literal["running", "done", "failed"]
    started_at: str
    finished_at: str | None = None
    summary: str = ""
    details: dict[str, Any] = Field(default_factory=dict)


class MigrationRecord(BaseModel):
    model_config = ConfigDict(extra="forbid")

    schema_version: Literal[1] = 1
    old: str
    new: str
    profile: str | None = None
    created_at: str = Field(default_factory=now)
    traffic_on: Literal["old", "both", "new"] = "old"
    steps: dict[Step, StepRecord] = Field(default_factory=dict)
    history: list[dict[str, Any]] = Field(default_factory=list)

    @property
    def name(self) -> str:
        return f"{self.old}--{self.new}"

    def done(self, step: str) -> bool:
        found = self.steps.get(step)  # type: ignore[call-overload]
        return found is not None and found.status == "done"

    def stale(self, step: str) -> str | None:
        """Which earlier step of CHAIN ran again after `step`'s last run began (None: none did).
        Prevents: a verify that passed, then a prepare re-run that changed NEW, then a cutover that
        sent traffic to a NEW nobody verified since."""
        if step not in CHAIN:
            return None
        began = self.steps[step].started_at  # type: ignore[index]
        for earlier in CHAIN[: CHAIN.index(step)]:
            found = self.steps.get(earlier)  # type: ignore[call-overload]
            if found is not None and found.started_at > began:
                return earlier
        return None

    def may_start(self, step: str) -> str | None:
        """Why `step` may not start now (None: it may)."""
        missing = [s for s in REQUIRES[step] if not self.done(s)]
        if missing:
            return f"`migrate {step}` needs `migrate {missing[0]}` done first (its status: {self._status(missing[0])})"
        for needed in REQUIRES[step]:
            again = self.stale(needed)
            if again is not None:
                return (
                    f"`migrate {step}` needs `migrate {needed}` done after the last `migrate {again}`, which ran again "
                    f"at {self.steps[again].started_at} (after {needed} began at {self.steps[needed].started_at}): "  # type: ignore[index]
                    f"run `migrate {needed}` again"
                )
        if step == "cutover" and self.traffic_on == "new":
            return None  # re-running a finished cutover is a no-op
        if step in ("plan", "prepare") and self.traffic_on != "old":
            return (
                f"traffic is on {self.traffic_on} (traffic_on: {self.traffic_on}): `migrate {step}` would redeploy "
                "or re-check the host serving it; `migrate rollback` first"
            )
        if step in ("prepare", "verify", "cutover") and self.done("finish"):
            return "this migration is finished: OLD's engine is stopped; start a new migration to move again"
        return None

    def _status(self, step: str) -> str:
        found = self.steps.get(step)  # type: ignore[call-overload]
        return found.status if found is not None else "not run"

    def start(self, step: Step) -> None:
        self.steps[step] = StepRecord(status="running", started_at=now())
        self.history.append({"step": step, "event": "started", "at": now()})

    def end(self, step: Step, ok: bool, summary: str, details: dict[str, Any] | None = None) -> None:
        record = self.steps[step]
        record.status = "done" if ok else "failed"
        record.finished_at = now()
        record.summary = summary
        record.details = details or {}
        self.history.append(
            {
                "step": step,
                "event": record.status,
                "at": record.finished_at,
                "summary": summary,
                "seconds": seconds_between(record.started_at, record.finished_at),
                **figures(step, record.details),
            }
        )

    def runs(self) -> list[dict[str, Any]]:
        """Every finished run of a step, in order (a step resumed or repeated shows each time)."""
        return [event for event in self.history if event["event"] in ("done", "failed")]


def check_host_name(name: str, option: str) -> str:
    if not NAME_RE.match(name):  # the front's server names are the inventory's host names
        raise UsageError(
            f"{option}: expected an inventory host name (letters, digits, '.', '_', '-'), found {name!r}",
            hint="pass the names the inventory gives the two hosts (`ansible-inventory -i INVENTORY --list`)",
        )
    return name


def path(site: Path, old: str, new: str) -> Path:
    return site / "migrations" / f"{old}--{new}.json"


def load(site: Path, old: str, new: str) -> MigrationRecord | None:
    """The record of the move OLD -> NEW, or None where none was started."""
    where = path(site, old, new)
    if not where.exists():
        return None
    data = files.read_json(where, what="migration record")
    try:
        record = MigrationRecord.model_validate(data)
    except ValidationError as exc:
        raise RecordError(
            f"migration record {where}: {first_invalid(exc)}; no step can run from a record it cannot read",
            hint="restore the file from a backup, or move it aside and start again with `migrate plan` "
            "(traffic stays where the balancer has it: check `specdeploy front status`)",
        ) from None
    if (record.old, record.new) != (old, new):
        raise RecordError(
            f"migration record {where}: names {record.old} -> {record.new}, expected {old} -> {new}",
            hint="the file was renamed or copied by hand: move it back, or start again with `migrate plan`",
        )
    return record


def save(site: Path, record: MigrationRecord) -> Path:
    where = path(site, record.old, record.new)
    atomic.ensure_dir(where.parent)
    atomic.write_json(where, record.model_dump(mode="json"))
    return where
