"""PNG plots of a bench report: output throughput against concurrency (one line per run), and
acceptance by draft position (one line per run at each level). Drawn with matplotlib (pinned in
the controller's extra) without a display (the Agg backend)."""

from __future__ import annotations

from pathlib import Path

from specdeploy.bench.report import Report
from specdeploy.core import atomic
from specdeploy.core.errors import UsageError


def _pyplot():  # noqa: ANN202 - matplotlib's module
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise UsageError(
            "the plots need matplotlib, which this install lacks",
            hint="draw them on the controller (its venv, scripts/setup.sh, has matplotlib), or pass --no-plots",
        ) from None
    return plt


def available() -> None:
    """Raise the UsageError `_pyplot` would, before any work is done."""
    _pyplot()


def _save(fig: object, path: Path) -> Path:
    import io

    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=110, bbox_inches="tight", metadata={"Software": None})  # type: ignore[attr-defined]
    atomic.write_bytes(path, buffer.getvalue())
    return path


def _finish(plt: object, fig: object, ax: object, path: Path) -> Path:
    """Grid, legend, the PNG written atomically, the figure closed (one place for both plots)."""
    ax.grid(alpha=0.3)  # type: ignore[attr-defined]
    ax.legend()  # type: ignore[attr-defined]
    try:
        return _save(fig, path)
    finally:
        plt.close(fig)  # type: ignore[attr-defined]


def throughput(report: Report, path: Path) -> Path:
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(6.4, 4.2))
    for run in report.runs:
        xs = [lv.concurrency for lv in run.levels]
        ax.plot(xs, [lv.output_tokens_per_s for lv in run.levels], marker="o", label=f"{run.label} (k={run.k})")
    ax.set_xlabel("requests in flight")
    ax.set_ylabel("output tokens/s")
    ax.set_title(f"throughput: {report.workload.name}")
    ax.set_xticks(sorted({lv.concurrency for run in report.runs for lv in run.levels}))
    return _finish(plt, fig, ax, path)


def acceptance(report: Report, path: Path) -> Path | None:
    """None when no run has per-position figures (no speculation, or SGLang)."""
    plt = _pyplot()
    series = [(run, lv) for run in report.runs for lv in run.levels if lv.per_position]
    if not series:
        return None
    fig, ax = plt.subplots(figsize=(6.4, 4.2))
    for run, lv in series:
        xs = list(range(1, len(lv.per_position or []) + 1))
        ax.plot(xs, lv.per_position, marker="o", label=f"{run.label} at {lv.concurrency}")
    ax.set_xlabel("draft position")
    ax.set_ylabel("share of drafts accepted up to it")
    ax.set_ylim(0, 1.02)
    ax.set_title(f"acceptance by position: {report.workload.name}")
    return _finish(plt, fig, ax, path)
