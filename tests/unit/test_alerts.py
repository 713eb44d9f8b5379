"""The Prometheus alert rules shipped with the bundle (monitoring/alerts.yml), checked and
unit-tested with the real promtool (Debian's `prometheus` package, installed by
scripts/system-deps.sh), and held to the metrics a host really exports: the light gate's
textfile as python/specdeploy/watch/textfile.py renders it (parsed back with prometheus_client's
parser). What is not real: the series in monitoring/alerts.test.yml are written by hand in the
shape the textfile has; no Prometheus server scrapes a host here."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import yaml
from prometheus_client.parser import text_string_to_metric_families

from specdeploy.watch import textfile

ROOT = Path(__file__).resolve().parents[2]
RULES = ROOT / "monitoring" / "alerts.yml"
RULE_TESTS = ROOT / "monitoring" / "alerts.test.yml"


def _promtool(*args: str) -> subprocess.CompletedProcess[str]:
    assert shutil.which("promtool"), "promtool is missing: run scripts/system-deps.sh (Debian's prometheus package)"
    return subprocess.run(["promtool", *args], cwd=RULES.parent, capture_output=True, text=True, timeout=120)


def test_the_alert_rules_pass_promtool_check_rules() -> None:
    done = _promtool("check", "rules", RULES.name)
    assert done.returncode == 0 and "SUCCESS" in done.stdout, done.stdout + done.stderr


def test_the_rules_unit_tests_pass_a_collapse_fires_and_a_healthy_stack_does_not() -> None:
    """monitoring/alerts.test.yml: a collapse series fires and a healthy one (with an engine restart,
    every counter back to 0) does not; requests without a draft, automatic engine restarts (not a
    restart by hand), a failed, stale or long-skipped light gate fire, their healthy twins do not."""
    done = _promtool("test", "rules", RULE_TESTS.name)
    assert done.returncode == 0 and "SUCCESS" in done.stdout, done.stdout + done.stderr


def _alerts() -> list[dict]:
    return [rule for group in yaml.safe_load(RULES.read_text())["groups"] for rule in group["rules"]]


def test_every_alert_is_tested_firing_and_silent() -> None:
    cases = [case for test in yaml.safe_load(RULE_TESTS.read_text())["tests"] for case in test["alert_rule_test"]]
    for alert in _alerts():
        mine = [case for case in cases if case["alertname"] == alert["alert"]]
        assert any(case.get("exp_alerts") for case in mine), f"{alert['alert']}: no case where it fires"
        assert any(not case.get("exp_alerts") for case in mine), f"{alert['alert']}: no case where it stays silent"


def _exported_names() -> set[str]:
    """Every sample name the light gate's textfile can hold: a result with everything measured."""
    result = {
        "profile": "cpu-rehearsal",
        "verdict": "fail",
        "exit_code": 1,
        "finished_unix": 1.0,
        "elapsed_s": 1.0,
        "checks": [{"name": "acceptance", "status": "fail"}],
        "watch": {"interval_s": 900, "acceptance_length_min": 1.5, "min_drafts": 20},
        "interval": {"mean_acceptance_length": 1.1, "drafts": 100.0, "counter_reset": None},
        "counters": {
            "counters": {"drafts": 1.0, "draft_tokens": 3.0, "accepted": 1.0, "requests": 1.0},
            "accepted_per_position": [1.0, 0.0, 0.0],
            "process_start_time": 1.0,
        },
        "engine_unit": {"name": "specdeploy-engine", "loaded": True, "active_state": "active", "n_restarts": 0},
    }
    text = textfile.render(result).decode()
    return {sample.name for family in text_string_to_metric_families(text) for sample in family.samples}


def test_the_rules_are_built_only_on_metrics_the_host_exports() -> None:
    """vLLM's /metrics is loopback-only: a rule on a vllm:* series would never fire at a site. Every
    series the rules read is one the light gate's textfile writes, or the front's HAProxy exporter's
    server state (scraped from the real HAProxy in tests/unit/test_front.py)."""
    from specdeploy.front.haproxy import SERVER_STATE_SERIES

    exported = _exported_names() | {SERVER_STATE_SERIES}
    used = {name for alert in _alerts() for name in re.findall(r"\b[a-z_:]+(?=[\[{)\s]|$)", alert["expr"])}
    series = {name for name in used if name.startswith(("specdeploy_", "vllm:", "node_", "haproxy_"))}
    assert series and series <= exported, sorted(series - exported)
    test_series = {
        re.match(r"[a-z_:]+", s["series"]).group()  # type: ignore[union-attr]
        for test in yaml.safe_load(RULE_TESTS.read_text())["tests"]
        for s in test["input_series"]
    }
    assert test_series <= exported, sorted(test_series - exported)
