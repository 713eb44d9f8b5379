"""`cache.exclusive`: two runs on one machine (the test suite's two workers, a rehearsal started
beside them) build a shared cache entry one after the other, never into the same place at once.
Real processes and a real lock file in a temporary cache."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from specdeploy.core.cache import exclusive

# Holds the lock for argv[1] seconds, then writes argv[2] (the end of its build) before letting go.
HOLDER = """
import pathlib, sys, time
from specdeploy.core.cache import exclusive
with exclusive("wheelhouse-test"):
    print("held", flush=True)
    time.sleep(float(sys.argv[1]))
    pathlib.Path(sys.argv[2]).write_text("built")
"""


def test_a_second_builder_waits_until_the_first_has_finished(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SPECDEPLOY_CACHE", str(tmp_path / "cache"))
    built = tmp_path / "built"
    holder = subprocess.Popen([sys.executable, "-c", HOLDER, "1.5", str(built)], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "held"
        with exclusive("wheelhouse-test"):
            assert built.read_text() == "built", "the lock was taken while the other process was still building"
    finally:
        holder.wait(timeout=30)
    assert (tmp_path / "cache" / "locks" / "wheelhouse-test.lock").exists()


def test_different_entries_do_not_wait_for_each_other(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SPECDEPLOY_CACHE", str(tmp_path / "cache"))
    holder = subprocess.Popen(
        [sys.executable, "-c", HOLDER, "30", str(tmp_path / "built")], stdout=subprocess.PIPE, text=True
    )
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "held"
        with exclusive("image-other"):
            assert holder.poll() is None  # taken while the other entry's lock is still held
    finally:
        holder.kill()
        holder.wait(timeout=30)
