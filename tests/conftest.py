"""Fixtures every test may use: an isolated lock, the CLI runner, the common profiles; and the
bad-input suite's figures, summed from the cases' reports (here, because only this conftest is
loaded where reports arrive when the suite runs on several workers: scripts/test.sh).
Helpers (plain functions) live in tests/support; nothing is imported from here."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from tests.support import BADINPUT_FIGURES, workers
from typer.testing import CliRunner

from specdeploy.cli import app
from specdeploy.profile import Profile, load_profile


@pytest.fixture(autouse=True)
def _isolated_lock(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Never let a test touch ./specdeploy.lock of the checkout."""
    monkeypatch.setenv("SPECDEPLOY_LOCK", str(tmp_path / "default.lock"))


@pytest.fixture
def cli() -> Callable[..., Any]:
    runner = CliRunner()

    def invoke(*args: str) -> Any:
        return runner.invoke(app, [str(a) for a in args], catch_exceptions=False)

    return invoke


@pytest.fixture
def dflash_profile() -> Profile:
    """cpu-rehearsal's DFlash variant: 4-layer target, drafter tapping layers [0, 2]."""
    from specdeploy.rehearsal import variants  # the rig: not imported where only the host package is

    return variants.dflash()


@pytest.fixture
def a6000() -> Profile:
    return load_profile("a6000-dflash")


# The bad-input figures per command, summed from each case's report: docs/commands.md "Bad input".
FIGURES: dict[str, dict[str, int]] = {}


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    if report.when != "teardown":
        return
    for name, value in report.user_properties:
        if name == BADINPUT_FIGURES:
            for command, figures in value.items():
                total = FIGURES.setdefault(command, {"tried": 0, "clear": 0, "unchanged": 0})
                for key, count in figures.items():
                    total[key] += count


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    """The figures, per command, after a run of the suite (docs/commands.md "Bad input")."""
    if not FIGURES:
        return
    terminalreporter.section("bad-input figures: cases tried / answered clearly / nothing changed where checked")
    for command, figures in sorted(FIGURES.items()):
        terminalreporter.write_line(f"{command:24} {figures['tried']:4} {figures['clear']:4} {figures['unchanged']:4}")
    total = {key: sum(f[key] for f in FIGURES.values()) for key in ("tried", "clear", "unchanged")}
    terminalreporter.write_line(f"{'all commands':24} {total['tried']:4} {total['clear']:4} {total['unchanged']:4}")


def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    """`-n 2 --dist loadgroup` (scripts/test.sh): the tests that share a host, a service or a port
    on one worker, in order (tests/support/workers.py says which and why)."""
    if config.getvalue("dist") != "loadgroup":
        return None
    from xdist.scheduler import LoadScopeScheduling

    class ByGroup(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return workers.group(nodeid)

    return ByGroup(config, log)
