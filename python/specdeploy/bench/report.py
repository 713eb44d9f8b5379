"""A bench report: one workload, one or more runs (a stack each), one result per level.

What is kept is normalised: the benchmark engine's figures (throughput, time to first token,
inter-token latency) as it measured them, and acceptance from the engine's own counters read
around each level with the package's one formula (smoke.acceptance, vLLM's 1 + accepted/drafts),
never the benchmark tool's. A report from a file is validated like any input: a report is how
runs taken on other hosts and days are compared (`compare`) and tuned (`tune --from-report`).
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from specdeploy.bench.workload import Workload
from specdeploy.core import atomic, files
from specdeploy.core.errors import InputFileError, first_invalid

SCHEMA = "specdeploy-bench/1"
NOT_EXPOSED = "not exposed"  # SGLang counts no per-position acceptance


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


def _finite(value: float | None) -> float | None:
    if value is not None and (not math.isfinite(value) or value < 0):
        raise ValueError(f"expected a finite number >= 0, found {value}")
    return value


class Level(_Model):
    """One level of concurrency of one run."""

    concurrency: int = Field(ge=1)
    requests: int = Field(ge=0)
    failed: int = Field(ge=0)
    duration_s: float
    output_tokens: int = Field(ge=0)
    output_tokens_per_s: float
    ttft_ms_p50: float | None = None
    ttft_ms_p99: float | None = None
    itl_ms_p50: float | None = None
    itl_ms_p99: float | None = None
    # acceptance over the level from the engine's counters (deltas); None: no draft (or not exposed)
    drafts: float | None = None
    mean_acceptance_length: float | None = None
    per_position: list[float] | None = None  # share of drafts accepted at each position (cumulative)
    per_position_note: str | None = None  # why there is none (e.g. NOT_EXPOSED)
    counter_note: str | None = None  # a counter reset or other traffic seen during the level

    _check = field_validator(
        "duration_s", "output_tokens_per_s", "ttft_ms_p50", "ttft_ms_p99", "itl_ms_p50", "itl_ms_p99", "drafts"
    )(_finite)

    @field_validator("mean_acceptance_length")
    @classmethod
    def _length(cls, value: float | None) -> float | None:
        if value is not None and (not math.isfinite(value) or value < 1):
            raise ValueError(f"expected a finite number >= 1 (tokens per step), found {value}")
        return value

    @field_validator("per_position")
    @classmethod
    def _positions(cls, value: list[float] | None) -> list[float] | None:
        for i, share in enumerate(value or []):
            if not math.isfinite(share) or not 0 <= share <= 1:
                raise ValueError(f"position {i + 1}: expected a share of drafts in [0, 1], found {share}")
        return value

    @property
    def step_ms(self) -> float | None:
        """Milliseconds one request spends per engine step: it emits `mean_acceptance_length` tokens
        a step (1 without speculation) at `output_tokens_per_s / concurrency`."""
        if self.output_tokens_per_s <= 0:
            return None
        per_step = self.mean_acceptance_length or 1.0
        return 1000.0 * per_step * self.concurrency / self.output_tokens_per_s


class Run(_Model):
    """One stack measured with the workload."""

    label: str = Field(min_length=1, max_length=80)
    profile: str
    engine: Literal["vllm", "sglang"]
    engine_version: str | None = None
    method: str | None  # the speculative method; None: served without speculation
    k: int = Field(ge=0)  # draft tokens per step; 0: no speculation
    endpoint: str
    host: str | None = None
    taken_at: str  # ISO 8601, UTC
    tool: str  # the benchmark engine and its version
    levels: list[Level]

    def level(self, concurrency: int) -> Level | None:
        return next((lv for lv in self.levels if lv.concurrency == concurrency), None)


class Report(_Model):
    schema_: Literal["specdeploy-bench/1"] = Field(SCHEMA, alias="schema")
    workload: Workload
    workload_key: str
    runs: list[Run] = Field(min_length=1)

    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True)

    def to_json(self) -> dict[str, Any]:
        return self.model_dump(mode="json", by_alias=True)


def make(workload: Workload, runs: list[Run]) -> Report:
    return Report(workload=workload, workload_key=workload.key, runs=runs)


def save(report: Report, path: Path) -> Path:
    atomic.write_json(path, report.to_json())
    return path


def load(path: Path) -> Report:
    """A saved report, validated: its workload key must be its workload's (an edited report is refused)."""
    data = files.read_json(path, what="bench report", hint="give a report `specdeploy bench run` wrote (report.json)")
    try:
        report = Report.model_validate(data)
    except ValidationError as exc:
        raise InputFileError(
            f"bench report {path}: field {first_invalid(exc)}",
            hint="give a report `specdeploy bench run` wrote (report.json), unedited",
        ) from None
    if report.workload_key != report.workload.key:
        raise InputFileError(
            f"bench report {path}: field workload_key: expected {report.workload.key} (its workload's hash), "
            f"found {report.workload_key}: the workload was edited after the run",
            hint="compare only reports as `specdeploy bench run` wrote them",
        )
    return report


# --------------------------------------------------------------------------- a gate report as a bench report

GATE_TOOL = "specdeploy gate (its throughput probe: one request at concurrency 1)"


def _stage(stages: Any, name: str) -> dict[str, Any]:
    for stage in stages if isinstance(stages, list) else []:
        if isinstance(stage, dict) and stage.get("name") == name and isinstance(stage.get("details"), dict):
            return stage["details"]
    return {}


def _number(value: Any) -> float | None:
    return float(value) if isinstance(value, int | float) and not isinstance(value, bool) else None


def from_gate(data: dict[str, Any], path: Path) -> Report:
    """A gate report (`gate.json`) or a smoke report as a one-run bench report: the stack's k and
    method from the identity stage, acceptance (mean length, per position) from the acceptance
    stage, throughput from the throughput probe (decode tok/s of one request at concurrency 1).
    A gate report keeps no prompt text: its workload is named by the profile's gate probes, so
    only reports of one profile's gate compare. Every value is checked: a report is input."""
    smoke = data.get("smoke") if isinstance(data.get("smoke"), dict) else data
    stages = smoke.get("stages")
    profile = data.get("profile") if isinstance(data.get("profile"), str) and data.get("profile") else None
    if profile is None:
        raise InputFileError(
            f"gate report {path}: field profile: expected the profile's name, found {data.get('profile')!r}: the "
            "stack it measured is unknown",
            hint="give a gate report `specdeploy gate` wrote (gate.json), unedited",
        )
    throughput = _stage(stages, "throughput")
    rate = _number(throughput.get("decode_tokens_per_s"))
    if rate is None or not math.isfinite(rate) or rate <= 0:
        raise InputFileError(
            f"gate report {path}: field smoke.stages[throughput].details.decode_tokens_per_s: expected a positive "
            f"figure, found {throughput.get('decode_tokens_per_s')!r}: no throughput to tune from",
            hint="give a gate report whose throughput stage ran (`specdeploy gate` on a serving stack), or a bench "
            "report",
        )
    identity = _stage(stages, "identity")
    speculation = identity.get("speculation") if isinstance(identity.get("speculation"), dict) else {}
    acceptance = _stage(stages, "acceptance")
    per_position = acceptance.get("per_position")
    positions = (
        [float(p) for p in per_position]
        if isinstance(per_position, list) and all(_number(p) is not None for p in per_position)
        else None
    )
    k = speculation.get("k") if isinstance(speculation.get("k"), int) else len(positions or [])
    engine = identity.get("engine") if identity.get("engine") in ("vllm", "sglang") else "vllm"
    ttft = _number(throughput.get("ttft_s"))
    tokens = _number(throughput.get("tokens")) or 0.0
    level = {
        "concurrency": 1, "requests": 1, "failed": 0, "duration_s": 0.0, "output_tokens": int(tokens),
        "output_tokens_per_s": rate, "ttft_ms_p50": ttft * 1000 if ttft is not None else None,
        "drafts": _number(acceptance.get("drafts")), "per_position": positions,
        "mean_acceptance_length": _number(acceptance.get("mean_acceptance_length")) if k else None,
    }  # fmt: skip
    run = {
        "label": f"gate {data.get('run_id') or profile}"[:80], "profile": profile, "engine": engine,
        "engine_version": identity.get("version") if isinstance(identity.get("version"), str) else None,
        "method": (speculation.get("method") or "speculative") if k else None, "k": k,
        "endpoint": str(data.get("endpoint") or "(gate)"), "taken_at": str(data.get("started_at") or ""),
        "tool": GATE_TOOL, "levels": [level],
    }  # fmt: skip
    workload = {
        "name": "gate-probes", "prompts": [f"the gate's acceptance and throughput prompts of profile {profile}"],
        "output_tokens": max(8, int(tokens)), "requests_per_level": 1, "concurrency": [1], "temperature": 0.0,
        "served_model": profile,
    }  # fmt: skip
    try:
        built = Workload.model_validate(workload)
        return Report.model_validate({"workload": built.model_dump(), "workload_key": built.key, "runs": [run]})
    except ValidationError as exc:
        raise InputFileError(
            f"gate report {path}: {first_invalid(exc)}",
            hint="give a gate report `specdeploy gate` wrote (gate.json), unedited",
        ) from None


def load_any(path: Path) -> Report:
    """A bench report, or a gate or smoke report read as one (`from_gate`): what `tune --from-report` takes."""
    data = files.read_json(path, what="report", hint="give a bench report (report.json) or a gate report (gate.json)")
    if isinstance(data, dict) and "schema" not in data and ("smoke" in data or "stages" in data):
        return from_gate(data, path)
    return load(path)
