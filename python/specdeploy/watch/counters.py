"""The engine's speculative-decoding counters between two light gates.

vLLM's counters (smoke.metrics) are server-wide and count from the engine's start. Each light
gate keeps what it read (`<state>/watch/counters.json`, core.layout) and the next one judges the
difference: the interval's traffic, the light gate's own known-answer requests included. Mean
acceptance length is vLLM's own formula over that difference, 1 + accepted / drafts.

A counter below its kept value means the engine restarted in between and its counters began
again at 0. That is detected and reported, and the interval is measured from the restart (the
counts since), never as a negative difference: Prometheus's `increase()` treats a counter reset
the same way. vLLM's `process_start_time_seconds`, where its /metrics carries it, also reveals a
restart the counters alone would hide (an engine that restarted and has since counted past the
kept values), and so does the creation time a real vLLM exports beside each counter
(`vllm:spec_decode_num_drafts_created`, recorded on vLLM 0.26.0: tests/data/gpu-vllm-0.26/dfauto.txt).

Without a usable earlier snapshot (the first light gate, or a file that cannot be read) the
interval runs from the engine's start: the counts themselves.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from specdeploy.core import atomic, files
from specdeploy.core.errors import InputFileError
from specdeploy.smoke import acceptance, metrics
from specdeploy.smoke.responses import EngineResponseError

# What a snapshot keeps, by its name in the file, and the vLLM counter it is read from.
COUNTERS = {
    "drafts": metrics.DRAFTS,
    "draft_tokens": metrics.DRAFT_TOKENS,
    "accepted": metrics.ACCEPTED,
    "requests": metrics.REQUESTS_FINISHED,
}
PROCESS_START = "process_start_time_seconds"
# prometheus_client exports each counter's creation time as <name>_created: a new one, a new engine
CREATED = metrics.DRAFTS.removesuffix("_total") + "_created"
SNAPSHOT = "counter snapshot"
SNAPSHOT_HINT = "nothing to do: the light gate keeps this file itself and replaces it on its next run"


@dataclass(frozen=True)
class Snapshot:
    """The counters as one light gate read them (totals since the engine started)."""

    taken_at: float  # unix seconds
    counters: dict[str, float]  # COUNTERS' names
    per_position: tuple[float, ...]  # accepted tokens per draft position
    process_start: float | None = None  # the engine's process_start_time_seconds, where exported
    created: float | None = None  # when the drafts counter was created (vLLM's <counter>_created)

    def to_json(self) -> dict[str, Any]:
        return {
            "taken_at": self.taken_at,
            "counters": dict(self.counters),
            "accepted_per_position": list(self.per_position),
            "process_start_time": self.process_start,
            "counters_created": self.created,
        }


def _count(name: str, value: float, where: str) -> float:
    if not math.isfinite(value) or value < 0:
        raise EngineResponseError(
            f"{where}: counter {name} is {value}: expected a count (a finite number >= 0)",
            hint="read the engine's /metrics by hand; a counter that is not a count is an engine bug",
        )
    return value


def read(samples: metrics.Samples, *, taken_at: float, where: str = "GET /metrics") -> Snapshot:
    """The snapshot of parsed /metrics samples (smoke.metrics.parse): each counter summed over
    its label sets (engines, models), the per-position counter by its `position` label."""
    counters = {key: _count(name, metrics.total(samples, name), where) for key, name in COUNTERS.items()}
    by_position: dict[int, float] = {}
    for labels, value in samples.get(metrics.ACCEPTED_PER_POS, {}).items():
        position = dict(labels).get("position", "")
        if not position.isdigit():
            raise EngineResponseError(
                f"{where}: {metrics.ACCEPTED_PER_POS} with labels {dict(labels)}: expected a label "
                "position=<a whole number>",
                hint="this engine's metrics differ from the vLLM version the profile pins",
            )
        by_position[int(position)] = by_position.get(int(position), 0.0) + _count(
            metrics.ACCEPTED_PER_POS, value, where
        )
    width = max(by_position, default=-1) + 1
    return Snapshot(
        taken_at=taken_at,
        counters=counters,
        per_position=tuple(by_position.get(i, 0.0) for i in range(width)),
        process_start=_time(samples, PROCESS_START),
        created=_time(samples, CREATED),
    )


def _time(samples: metrics.Samples, name: str) -> float | None:
    """A timestamp the engine exports (the earliest over its label sets), or None."""
    values = [v for v in samples.get(name, {}).values() if math.isfinite(v)]
    return min(values) if values else None


@dataclass(frozen=True)
class Interval:
    """What the counters moved by between two light gates (or since the engine started)."""

    since: float | None  # the previous snapshot's time; None: since the engine started
    reset: str | None  # why the counters are known to have restarted in between, else None
    drafts: float
    draft_tokens: float
    accepted: float
    requests: float
    per_position: tuple[float, ...]

    @property
    def mean_acceptance_length(self) -> float | None:
        """vLLM's formula, 1 + accepted / drafts; None without a draft."""
        return acceptance.mean_acceptance_length(self.drafts, self.accepted)

    @property
    def per_position_rates(self) -> list[float]:
        """The share of drafts whose token at each position was accepted."""
        return [n / self.drafts for n in self.per_position] if self.drafts > 0 else []

    def to_json(self) -> dict[str, Any]:
        return {
            "since": self.since,
            "counter_reset": self.reset,
            "drafts": self.drafts,
            "draft_tokens": self.draft_tokens,
            "accepted": self.accepted,
            "requests": self.requests,
            "accepted_per_position": list(self.per_position),
            "mean_acceptance_length": self.mean_acceptance_length,
            "per_position_rates": self.per_position_rates,
        }


def _reset(previous: Snapshot, current: Snapshot) -> str | None:
    """Why the counters must have restarted between two snapshots, or None."""
    before, now = previous.process_start, current.process_start
    if before is not None and now is not None and abs(now - before) > 1.0:
        return (
            f"the engine restarted: its process started at {now:.0f}, not {before:.0f} as at the previous light "
            "gate; measured since its restart"
        )
    # smoke.metrics sums a counter over its engines (data parallel): compared, never shown as a time
    before, now = previous.created, current.created
    if before is not None and now is not None and abs(now - before) > 1.0:
        return (
            "the engine restarted: its counters were created anew since the previous light gate "
            f"({metrics.DRAFTS.removesuffix('_total')}_created changed); measured since its restart"
        )
    width = max(len(previous.per_position), len(current.per_position))
    old = previous.per_position + (0.0,) * (width - len(previous.per_position))
    new = current.per_position + (0.0,) * (width - len(current.per_position))
    pairs = [(key, previous.counters.get(key, 0.0), current.counters[key]) for key in COUNTERS]
    pairs += [(f"accepted at position {i}", old[i], new[i]) for i in range(width)]
    fell = next(((what, was, is_) for what, was, is_ in pairs if is_ < was), None)
    if fell is None:
        return None
    what, was, is_ = fell
    return (
        f"the engine's counters went back ({what}: {was:g} at the previous light gate, {is_:g} now): the engine "
        "restarted in between; measured since its restart"
    )


def interval(previous: Snapshot | None, current: Snapshot) -> Interval:
    """The counts between `previous` and `current`; after a reset (or without `previous`), the
    counts of `current` themselves: what the engine counted since it started."""
    reset = _reset(previous, current) if previous is not None else None
    if previous is None or reset is not None:
        since = None if previous is None else current.process_start
        base = Snapshot(taken_at=0.0, counters=dict.fromkeys(COUNTERS, 0.0), per_position=())
    else:
        since, base = previous.taken_at, previous
    width = len(current.per_position)
    old = base.per_position + (0.0,) * max(0, width - len(base.per_position))
    moved = {key: current.counters[key] - base.counters.get(key, 0.0) for key in COUNTERS}
    return Interval(
        since=since,
        reset=reset,
        drafts=moved["drafts"],
        draft_tokens=moved["draft_tokens"],
        accepted=moved["accepted"],
        requests=moved["requests"],
        per_position=tuple(current.per_position[i] - old[i] for i in range(width)),
    )


# --------------------------------------------------------------------------- the kept snapshot


def _number(record: dict[str, Any], key: str, path: Path, *, optional: bool = False) -> float | None:
    value = record.get(key)
    if value is None and optional:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value) or value < 0:
        found = "no such field" if key not in record else repr(value)
        raise InputFileError(
            f"{SNAPSHOT} {path}: field {key}: expected a number >= 0, found {found}", hint=SNAPSHOT_HINT
        )
    return float(value)


def load(path: Path) -> Snapshot | None:
    """The snapshot the previous light gate kept, or None where there is none yet; an
    InputFileError (naming the file and the field) when it cannot be used."""
    if not path.exists() and not path.is_symlink():
        return None
    # never followed: the light gate's account owns the directory, and root runs the light gate too
    kept = files.read_json(path, what=SNAPSHOT, hint=SNAPSHOT_HINT, follow=False)
    record = files.expect_mapping(kept, str(path), what=SNAPSHOT)
    counters = record.get("counters")
    if not isinstance(counters, dict):
        raise InputFileError(
            f"{SNAPSHOT} {path}: field counters: expected an object of counts, found {type(counters).__name__}",
            hint=SNAPSHOT_HINT,
        )
    positions = record.get("accepted_per_position", [])
    if not isinstance(positions, list):
        raise InputFileError(
            f"{SNAPSHOT} {path}: field accepted_per_position: expected a list of counts, "
            f"found {type(positions).__name__}",
            hint=SNAPSHOT_HINT,
        )
    return Snapshot(
        taken_at=_number(record, "taken_at", path) or 0.0,
        counters={key: _number(counters, key, path) or 0.0 for key in COUNTERS},
        per_position=tuple(
            _number({"accepted_per_position": p}, "accepted_per_position", path) or 0.0 for p in positions
        ),
        process_start=_number(record, "process_start_time", path, optional=True),
        created=_number(record, "counters_created", path, optional=True),
    )


def save(path: Path, snapshot: Snapshot) -> None:
    """Keep `snapshot` for the next light gate (atomically: a reader sees the old or the new)."""
    atomic.ensure_dir(path.parent)
    atomic.write_json(path, snapshot.to_json(), mode=0o640)
