"""The light gate's result as a Prometheus textfile, for node_exporter's textfile collector.

vLLM's /metrics stays on the host's loopback (its API key guards only the /v1 routes; docs/host-layout.md
"The engine listens on loopback only"), so a site's Prometheus cannot scrape the engine. Instead each
light gate writes what the site needs into one `*.prom` file that node_exporter — already
scraped — serves with its own metrics: the light gate's verdict and time, the acceptance it
judged, the speculative-decoding counters re-exported from the engine's loopback /metrics
(totals, so Prometheus's `rate()` and `increase()` apply), and the engine unit's automatic
restarts (systemd's NRestarts). `monitoring/alerts.yml` is built on these names only.

The file is rendered by prometheus_client (its text exposition format) from the result JSON the
light gate writes, and replaced atomically (core.atomic: temporary file in the same directory,
fsync, rename), so the collector never reads a torn file: node_exporter's own advice for the
textfile collector (docs/sources.md#watch). The temporary file does not end in `.prom`, so the
collector never reads it either.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from specdeploy.core import atomic
from specdeploy.core.verdicts import Verdict

PREFIX = "specdeploy_"
# the one vocabulary (core.verdicts): every verdict a finished light gate can end in, and those that page
VERDICTS = tuple(v.value for v in Verdict if v is not Verdict.running)
FAILED = tuple(v.value for v in (Verdict.failed, Verdict.error, Verdict.interrupted))
# vLLM counter (its name in the result's `counters`) -> the name it is re-exported under
RE_EXPORTED = {
    "drafts": ("specdeploy_engine_spec_decode_drafts", "drafts the engine proposed (vllm:spec_decode_num_drafts)"),
    "draft_tokens": (
        "specdeploy_engine_spec_decode_draft_tokens",
        "draft tokens proposed (vllm:spec_decode_num_draft_tokens)",
    ),
    "accepted": (
        "specdeploy_engine_spec_decode_accepted_tokens",
        "draft tokens accepted (vllm:spec_decode_num_accepted_tokens)",
    ),
    "requests": ("specdeploy_engine_requests_finished", "requests the engine finished (vllm:request_success)"),
}
PER_POSITION = (
    "specdeploy_engine_spec_decode_accepted_tokens_per_position",
    "draft tokens accepted at each draft position (vllm:spec_decode_num_accepted_tokens_per_pos)",
)


def _gauge(name: str, doc: str, value: float | None, labels: dict[str, str]) -> Iterator[Metric]:
    if value is None or not math.isfinite(value):
        return
    family = GaugeMetricFamily(name, doc, labels=list(labels))
    family.add_metric(list(labels.values()), float(value))
    yield family


def _counter(name: str, doc: str, value: float | None, labels: dict[str, str]) -> Iterator[Metric]:
    if value is None or not math.isfinite(value):
        return
    family = CounterMetricFamily(name, doc, labels=list(labels))
    family.add_metric(list(labels.values()), float(value))
    yield family


class _Result:
    """A prometheus_client collector over one light gate's result (its JSON form)."""

    def __init__(self, result: dict[str, Any]) -> None:
        self.result = result

    def collect(self) -> Iterator[Metric]:
        r = self.result
        base = {"profile": r.get("profile") or ""}
        yield from _gauge(
            "specdeploy_watch_last_run_timestamp_seconds",
            "when the last light gate finished (unix seconds)",
            r.get("finished_unix"),
            base,
        )
        yield from _gauge(
            "specdeploy_watch_duration_seconds", "how long the last light gate ran", r.get("elapsed_s"), base
        )
        verdict = r.get("verdict")
        yield from _gauge(
            "specdeploy_watch_failed",
            "1 when the last light gate failed, could not test or was stopped before a verdict, else 0",
            1.0 if verdict in FAILED else 0.0,
            base,
        )
        family = GaugeMetricFamily(
            "specdeploy_watch_verdict",
            "the last light gate's verdict: 1 for the one it gave",
            labels=["profile", "verdict"],
        )
        for name in VERDICTS:
            family.add_metric([base["profile"], name], 1.0 if verdict == name else 0.0)
        yield family
        yield from _gauge(
            "specdeploy_watch_exit_code",
            "the last light gate's exit code (docs/commands.md 'Exit codes')",
            r.get("exit_code"),
            base,
        )
        checks = r.get("checks") or []
        if checks:
            family = GaugeMetricFamily(
                "specdeploy_watch_check",
                "the last light gate's checks: 1 for each check's status",
                labels=["profile", "check", "status"],
            )
            for check in checks:
                family.add_metric([base["profile"], check["name"], check["status"]], 1.0)
            yield family
        watch = r.get("watch") or {}
        yield from _gauge(
            "specdeploy_watch_interval_seconds",
            "seconds between two light gates (the profile's watch.interval_s)",
            watch.get("interval_s"),
            base,
        )
        yield from _gauge(
            "specdeploy_watch_acceptance_length_min",
            "the mean acceptance length below which the light gate fails (the profile's floor)",
            watch.get("acceptance_length_min"),
            base,
        )
        yield from _gauge(
            "specdeploy_watch_min_drafts",
            "drafts below which the light gate does not judge acceptance (the profile's watch.min_drafts)",
            watch.get("min_drafts"),
            base,
        )
        span = r.get("interval") or {}
        yield from _gauge(
            "specdeploy_watch_acceptance_length",
            "mean acceptance length since the previous light gate (1 + accepted / drafts)",
            span.get("mean_acceptance_length"),
            base,
        )
        yield from _gauge(
            "specdeploy_watch_acceptance_drafts", "drafts since the previous light gate", span.get("drafts"), base
        )
        if span:
            yield from _gauge(
                "specdeploy_watch_counter_reset",
                "1 when the engine's counters restarted since the previous light gate (the engine restarted)",
                1.0 if span.get("counter_reset") else 0.0,
                base,
            )
        counters = r.get("counters") or {}
        totals = counters.get("counters") or {}
        for key, (name, doc) in RE_EXPORTED.items():
            yield from _counter(name, doc + ", re-exported from the engine's loopback /metrics", totals.get(key), base)
        positions = counters.get("accepted_per_position") or []
        if positions:
            family = CounterMetricFamily(
                PER_POSITION[0], PER_POSITION[1] + ", re-exported", labels=["profile", "position"]
            )
            for position, value in enumerate(positions):
                family.add_metric([base["profile"], str(position)], float(value))
            yield family
        yield from _gauge(
            "specdeploy_engine_process_start_time_seconds",
            "when the engine's API server process started (its process_start_time_seconds)",
            counters.get("process_start_time"),
            base,
        )
        unit = r.get("engine_unit") or {}
        labels = base | {"unit": str(unit.get("name", ""))}
        if unit.get("loaded"):
            yield from _counter(
                "specdeploy_engine_unit_restarts",
                "automatic restarts of the engine unit since it was last started by hand (systemd NRestarts)",
                unit.get("n_restarts"),
                labels,
            )
            yield from _gauge(
                "specdeploy_engine_unit_active",
                "1 when the engine unit is active (systemd ActiveState), else 0",
                1.0 if unit.get("active_state") == "active" else 0.0,
                labels,
            )


def render(result: dict[str, Any]) -> bytes:
    """The textfile for one light gate's result (the text exposition format)."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(_Result(result))  # type: ignore[arg-type]  # a collector by its collect()
    return generate_latest(registry)


def write(path: Path, result: dict[str, Any]) -> None:
    """Replace the textfile atomically (a WriteError naming the path when it cannot be written)."""
    atomic.write_bytes(path, render(result), 0o644)
