"""The cache's stale entries are pruned and a short disk refuses the run at once (rehearsal/housekeeping):
CI's disk once filled an hour into the suite with old locks' venvs and wheelhouses."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from specdeploy.rehearsal import housekeeping

ROOT = Path(__file__).resolve().parents[2]


def _entry(cache: Path, name: str, *, size: int, age_s: float, complete: bool = True) -> Path:
    entry = cache / name
    (entry / "lib").mkdir(parents=True)
    (entry / "lib" / "blob").write_bytes(b"x" * size)
    if complete:
        (entry / ".complete").touch()
    then = time.time() - age_s
    for path in (entry / ".complete", entry):
        if path.exists():
            os.utime(path, (then, then))
    return entry


def test_prune_keeps_the_current_entry_and_the_most_recently_used_other_and_removes_the_rest(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    current = _entry(tmp_path, "venv-cur", size=10, age_s=9 * 86400)  # old but current: kept
    recent = _entry(tmp_path, "venv-recent", size=10, age_s=3600)
    stale = _entry(tmp_path, "venv-stale", size=5 * 1024**2, age_s=2 * 86400)
    older = _entry(tmp_path, "venv-older", size=10, age_s=5 * 86400)
    other_kind = _entry(tmp_path, "wheelhouse-old", size=10, age_s=30 * 86400)
    removed = housekeeping.prune(tmp_path, "venv", current.name)
    assert {r.path for r in removed} == {stale, older}
    assert current.is_dir() and recent.is_dir() and other_kind.is_dir()
    assert not stale.exists() and not older.exists()
    assert next(r for r in removed if r.path == stale).bytes == 5 * 1024**2
    err = capsys.readouterr().err
    assert "cache: removed venv-stale (5 MiB, last used 2.0 days ago; this run takes venv-cur)" in err


def test_an_entry_used_today_counts_as_recent_however_old_its_build(tmp_path: Path) -> None:
    """`.used`, stamped each time a run takes an entry, outranks when it was built."""
    current = _entry(tmp_path, "wheelhouse-cur", size=1, age_s=0)
    built_long_ago = _entry(tmp_path, "wheelhouse-a", size=1, age_s=40 * 86400)
    built_lately = _entry(tmp_path, "wheelhouse-b", size=1, age_s=86400)
    housekeeping.mark_used(built_long_ago)
    housekeeping.prune(tmp_path, "wheelhouse", current.name)
    assert built_long_ago.is_dir() and not built_lately.exists()


def test_prune_keeps_none_of_the_others_when_asked_and_leaves_a_symlink_alone(tmp_path: Path) -> None:
    current = _entry(tmp_path, "venv-cur", size=1, age_s=0)
    other = _entry(tmp_path, "venv-other", size=1, age_s=0)
    elsewhere = _entry(tmp_path / "elsewhere", "venv-x", size=1, age_s=99 * 86400)
    (tmp_path / "venv-link").symlink_to(elsewhere)
    housekeeping.prune(tmp_path, "venv", current.name, keep=0)
    assert not other.exists() and elsewhere.is_dir() and (tmp_path / "venv-link").is_symlink()


def _space(cache: Path, *args: str) -> subprocess.CompletedProcess[str]:
    argv = [sys.executable, "-m", "specdeploy.rehearsal.housekeeping", "space", "--cache", str(cache), *args]
    env = {**os.environ, "PYTHONPATH": str(ROOT / "python")}
    return subprocess.run(argv, capture_output=True, text=True, env=env, cwd=ROOT)


def test_too_little_disk_refuses_the_run_at_once_naming_the_filesystem_the_space_and_the_cache(
    tmp_path: Path,
) -> None:
    """The disk's real free space, and a need above it: refused before anything starts."""
    cache = tmp_path / "cache"
    _entry(cache, "venv-cur", size=2048, age_s=0)
    free_gib = housekeeping.shutil.disk_usage(tmp_path).free / housekeeping.GIB
    done = _space(cache, "--warm-gib", f"{free_gib + 50:.0f}", "--cold-gib", "1", "--what", "the test suite")
    assert done.returncode == 1, done.stderr
    assert done.stderr.startswith("error: not enough disk space for the test suite: ")
    assert str(cache) in done.stderr and "GiB free" in done.stderr and f"{free_gib + 50:.0f} GiB needed" in done.stderr
    assert "(the cache is warm)" in done.stderr and "nothing was started" in done.stderr
    assert "venv-cur" in done.stderr and "fix: free space" in done.stderr
    assert "Traceback" not in done.stderr


def test_an_empty_cache_needs_the_cold_figure_and_enough_disk_passes_silently(tmp_path: Path) -> None:
    free_gib = housekeeping.shutil.disk_usage(tmp_path).free / housekeeping.GIB
    cold = _space(tmp_path / "new-cache", "--warm-gib", "0.001", "--cold-gib", f"{free_gib + 50:.0f}", str(tmp_path))
    assert cold.returncode == 1 and "(the cache is empty: everything is built first)" in cold.stderr
    fine = _space(tmp_path / "new-cache", "--warm-gib", "0.001", "--cold-gib", "0.001", str(tmp_path))
    assert fine.returncode == 0 and fine.stderr == ""


def test_the_prune_command_stamps_the_current_entry_used(tmp_path: Path) -> None:
    current = _entry(tmp_path, "venv-cur", size=1, age_s=5 * 86400)
    argv = [
        sys.executable,
        "-m",
        "specdeploy.rehearsal.housekeeping",
        "prune",
        "venv",
        current.name,
        "--cache",
        str(tmp_path),
    ]
    done = subprocess.run(argv, capture_output=True, text=True, env={**os.environ, "PYTHONPATH": str(ROOT / "python")})
    assert done.returncode == 0, done.stderr
    assert time.time() - housekeeping.last_used(current) < 60
