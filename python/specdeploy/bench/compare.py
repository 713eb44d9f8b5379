"""Merge bench reports taken at different times or on different hosts into one, and the table
that shows their runs side by side.

Failure prevented: stacks compared on different work (the field's DFlash and MTP figures came
from different tools, prompts and days). Reports merge only when their workloads are the same
(`workload.Workload.identity`); otherwise the error names each field that differs and both values.
"""

from __future__ import annotations

from specdeploy.bench.report import NOT_EXPOSED, Report, Run, make
from specdeploy.core.errors import SpecdeployError, UsageError


class WorkloadMismatch(UsageError):
    """Two reports measured different workloads: their figures are not comparable."""


def differences(a: Report, b: Report) -> list[str]:
    """The identity fields where two reports' workloads differ, each with both values."""
    left, right = a.workload.identity(), b.workload.identity()
    return [f"{key}: {left[key]!r} vs {right[key]!r}" for key in left if left[key] != right[key]]


SAME_WORKLOAD = "run `specdeploy bench run` on both stacks with the same workload file and profile bench settings"


def require_same(
    first_name: str, first: Report, name: str, report: Report, hint: str, error: type[SpecdeployError] | None = None
) -> None:
    """Refuse `report` unless it measured `first`'s workload: the error names both keys and each
    identity field that differs (`error`: WorkloadMismatch unless the caller's own kind is given)."""
    if report.workload_key == first.workload_key:
        return
    fields = differences(first, report) or ["the prompt sets differ"]
    raise (error or WorkloadMismatch)(
        f"{name} measured another workload than {first_name} (workload {report.workload_key} vs "
        f"{first.workload_key}): " + "; ".join(fields),
        hint=hint,
    )


def merge(reports: list[tuple[str, Report]]) -> Report:
    """One report of every run, in the order given; (name, report) pairs, the name for messages."""
    if not reports:
        raise UsageError("no report to compare", hint="give two or more report.json files of `specdeploy bench run`")
    first_name, first = reports[0]
    runs: list[Run] = []
    labels: set[str] = set()
    for name, report in reports:
        require_same(first_name, first, name, report, SAME_WORKLOAD)
        for run in report.runs:
            label = run.label if run.label not in labels else f"{run.label}@{run.taken_at}"
            labels.add(label)
            runs.append(run.model_copy(update={"label": label}))
    return make(first.workload, runs)


def rows(report: Report) -> list[dict[str, object]]:
    """One row per run and level: what the table and the plots show."""
    out: list[dict[str, object]] = []
    for run in report.runs:
        for lv in run.levels:
            if lv.per_position:
                positions = " ".join(f"{r:.2f}" for r in lv.per_position)
            else:
                positions = lv.per_position_note or ("-" if run.k == 0 else "no draft")
            out.append(
                {
                    "run": run.label,
                    "method": run.method or "none",
                    "k": run.k,
                    "concurrency": lv.concurrency,
                    "output_tok_s": round(lv.output_tokens_per_s, 2),
                    "ttft_ms_p50": lv.ttft_ms_p50,
                    "ttft_ms_p99": lv.ttft_ms_p99,
                    "itl_ms_p50": lv.itl_ms_p50,
                    "itl_ms_p99": lv.itl_ms_p99,
                    "acceptance_length": lv.mean_acceptance_length,
                    "per_position": positions,
                    "failed": lv.failed,
                    "note": lv.counter_note,
                }
            )
    return out


__all__ = ["NOT_EXPOSED", "WorkloadMismatch", "differences", "merge", "rows"]
