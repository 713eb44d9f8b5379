"""Shared test helpers: profile variants on disk, drafter directories, the CLI runner."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from specdeploy.cli import app
from specdeploy.profile import Profile, load_profile
from specdeploy.rehearsal import variants

DATA = Path(__file__).parent / "data"


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


def reported_config() -> dict[str, Any]:
    return json.loads((DATA / "zlab-qwen3.6-27b-dflash.reported.json").read_text())


def make_drafter(directory: Path, config: dict[str, Any] | str, weights: bytes = b"weights") -> Path:
    """A drafter download: config.json (a dict, or raw text for malformed cases) + a weight file."""
    directory.mkdir(parents=True, exist_ok=True)
    text = config if isinstance(config, str) else json.dumps(config, indent=2)
    (directory / "config.json").write_text(text)
    (directory / "model.safetensors").write_bytes(weights)
    return directory


def rehearsal_dflash_config(profile: Profile) -> dict[str, Any]:
    from specdeploy.rehearsal.fixtures import dflash_config_for

    return dflash_config_for(profile)
