"""Fixtures every test may use: an isolated lock, the CLI runner, the common profiles.
Helpers (plain functions) live in tests/support; nothing is imported from here."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from specdeploy.cli import app
from specdeploy.profile import Profile, load_profile
from specdeploy.rehearsal import variants


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
    return variants.dflash()


@pytest.fixture
def a6000() -> Profile:
    return load_profile("a6000-dflash")
