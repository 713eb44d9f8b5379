"""The lock file: first verified value recorded, drift refused, unresolved pins refused."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from specdeploy.core.errors import LockMismatchError, SpecdeployError, UnresolvedPinError
from specdeploy.profile import load_profile
from specdeploy.profile.lock import Lock, require

SHA = "0123456789abcdef0123456789abcdef01234567"


def test_record_then_match_then_refuse_drift(tmp_path: Path) -> None:
    lock = Lock(tmp_path / "state" / "specdeploy.lock")
    assert lock.record("a6000-dflash", "drafter.revision", SHA, by="fetch") is True
    assert lock.record("a6000-dflash", "drafter.revision", SHA, by="fetch") is False
    reread = Lock(lock.path)
    assert reread.value("a6000-dflash", "drafter.revision") == SHA
    assert reread.get("a6000-dflash", "drafter.revision")["recorded_by"] == "fetch"
    with pytest.raises(LockMismatchError) as info:
        reread.record("a6000-dflash", "drafter.revision", "f" * 40, by="fetch")
    assert SHA in str(info.value) and "f" * 40 in str(info.value)
    assert Lock(lock.path).value("a6000-dflash", "drafter.revision") == SHA  # unchanged on disk


def test_unreadable_or_foreign_lock(tmp_path: Path) -> None:
    path = tmp_path / "specdeploy.lock"
    path.write_text("{not json")
    with pytest.raises(SpecdeployError, match="is not valid JSON") as bad:
        Lock(path)
    assert bad.value.exit_code == 2  # bad input, like every other file that is not what it should be
    path.write_text(json.dumps({"schema_version": 9, "profiles": {}}))
    with pytest.raises(SpecdeployError, match="expected 1, found 9"):
        Lock(path)


def test_require_prefers_profile_then_lock_then_refuses(tmp_path: Path) -> None:
    profile = load_profile("a6000-dflash")
    lock = Lock(tmp_path / "specdeploy.lock")
    assert require(profile, "engine.source.commit", lock) == "23002d3f368a5a24641301bc71e4ae15dae89a24"
    with pytest.raises(UnresolvedPinError) as info:
        require(profile, "drafter.revision", lock)
    assert "drafter.revision is unresolved" in str(info.value)
    assert "list_repo_commits" in str(info.value.hint)  # says where the value comes from
    lock.record(profile.name, "drafter.revision", SHA, by="fetch")
    assert require(profile, "drafter.revision", lock) == SHA
    with pytest.raises(SpecdeployError, match="no pin 'drafter.revison'"):
        require(profile, "drafter.revison", lock)
