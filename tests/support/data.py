"""Test data on disk (tests/data, sources in tests/data/README.md) and drafter downloads made from it."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from specdeploy.profile import Profile

DATA = Path(__file__).resolve().parents[1] / "data"


def reported_config() -> dict[str, Any]:
    """z-lab/Qwen3.6-27B-DFlash's config.json as reported (the real file is gated)."""
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
