"""write-config: atomic, verified, read back; refuses unresolved content; keeps the old file.

Read-only and full filesystems are real tmpfs mounts (root only; skipped elsewhere with the
reason), not patched system calls.
"""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from tests.support.data import make_drafter, rehearsal_dflash_config

from specdeploy.core.errors import UnresolvedPinError, WriteError
from specdeploy.drafter import serving as drafter_config
from specdeploy.profile import Profile
from specdeploy.profile.lock import Lock
from specdeploy.rehearsal import variants


@pytest.fixture
def download(tmp_path: Path, dflash_profile: Profile) -> Path:
    return make_drafter(tmp_path / "download", rehearsal_dflash_config(dflash_profile))


@pytest.fixture
def profile_path(tmp_path: Path, dflash_profile: Profile) -> Path:
    return variants.materialize(dflash_profile, tmp_path / "profiles")


def _write(cli: Any, serving: Path, profile: Path, source: Path, lock: Path, *extra: str) -> Any:
    return cli("write-config", serving, "--profile", profile, "--source", source, "--lock", lock, *extra)


def test_first_write_builds_serving_dir_and_records_hash(
    cli: Any, tmp_path: Path, download: Path, profile_path: Path
) -> None:
    serving, lock = tmp_path / "serving", tmp_path / "specdeploy.lock"
    result = _write(cli, serving, profile_path, download, lock, "--json")
    assert result.exit_code == 0, result.stderr
    summary = json.loads(result.stdout)
    assert summary["config_changed"] and summary["lock_recorded"]
    assert summary["links_changed"] == ["model.safetensors"]

    assert (serving / "config.json").read_bytes() == (download / "config.json").read_bytes()
    assert not (serving / "config.json").is_symlink()
    assert (serving / "model.safetensors").resolve() == (download / "model.safetensors").resolve()
    recorded = Lock(lock).get("cpu-rehearsal-dflash", drafter_config.LOCK_KEY)
    assert recorded["value"] == summary["canonical_sha256"]
    assert recorded["detail"]["content"] == json.loads((download / "config.json").read_text())
    assert oct((serving / "config.json").stat().st_mode & 0o777) == "0o644"
    assert not [p for p in serving.iterdir() if p.name.startswith(".")], "no temporary files left"


def test_second_write_changes_nothing(cli: Any, tmp_path: Path, download: Path, profile_path: Path) -> None:
    serving, lock = tmp_path / "serving", tmp_path / "specdeploy.lock"
    assert _write(cli, serving, profile_path, download, lock).exit_code == 0
    before = (serving / "config.json").stat().st_ino
    again = json.loads(_write(cli, serving, profile_path, download, lock, "--json").stdout)
    assert (again["config_changed"], again["links_changed"], again["lock_recorded"]) == (False, [], False)
    assert (serving / "config.json").stat().st_ino == before


def test_repairs_a_hand_edited_serving_config_and_stale_links(
    cli: Any, tmp_path: Path, download: Path, profile_path: Path
) -> None:
    """The field failure: someone edits the serving config.json by hand. write-config puts
    the verified file back; a link to a file the download no longer has is removed."""
    serving, lock = tmp_path / "serving", tmp_path / "specdeploy.lock"
    assert _write(cli, serving, profile_path, download, lock).exit_code == 0
    edited = json.loads((serving / "config.json").read_text())
    edited["dflash_config"]["mask_token_id"] = 7
    (serving / "config.json").write_text(json.dumps(edited))
    os.symlink(download / "gone.bin", serving / "gone.bin")

    summary = json.loads(_write(cli, serving, profile_path, download, lock, "--json").stdout)
    assert summary["config_changed"] and summary["links_removed"] == ["gone.bin"]
    assert (serving / "config.json").read_bytes() == (download / "config.json").read_bytes()


def test_unverifiable_download_is_refused_and_old_file_kept(
    cli: Any, tmp_path: Path, download: Path, profile_path: Path, dflash_profile: Profile
) -> None:
    serving, lock = tmp_path / "serving", tmp_path / "specdeploy.lock"
    assert _write(cli, serving, profile_path, download, lock).exit_code == 0
    good = (serving / "config.json").read_bytes()

    bad_config = rehearsal_dflash_config(dflash_profile)
    bad_config["dflash_config"]["target_layer_ids"] = [0, 7]
    bad = make_drafter(tmp_path / "bad-download", bad_config)
    result = _write(cli, serving, profile_path, bad, lock)
    assert result.exit_code == 1
    assert "dflash_config.target_layer_ids" in result.stderr
    assert (serving / "config.json").read_bytes() == good


def test_drifted_upstream_file_fails_against_lock(
    cli: Any, tmp_path: Path, download: Path, profile_path: Path, dflash_profile: Profile
) -> None:
    """A later download that still passes every pinned field but differs from the file
    verified at first write (the upstream repo changed) is refused, naming the fields."""
    serving, lock = tmp_path / "serving", tmp_path / "specdeploy.lock"
    assert _write(cli, serving, profile_path, download, lock).exit_code == 0
    drifted = rehearsal_dflash_config(dflash_profile)
    drifted["rms_norm_eps"] = 1e-5
    result = _write(cli, serving, profile_path, make_drafter(tmp_path / "drifted", drifted), lock, "--json")
    assert result.exit_code == 1
    hash_row = next(c for c in json.loads(result.stdout)["checks"] if c["kind"] == "hash")
    assert hash_row["consequence"].endswith("fields that differ: rms_norm_eps")  # (a table folds it by width)


def test_refuses_unresolved_content(tmp_path: Path, download: Path, dflash_profile: Profile) -> None:
    drafter = dflash_profile.model_dump(mode="json")["drafter"]
    drafter["config"]["expected"]["target_layer_ids"] = {"provenance": "unresolved", "source": "ask z-lab"}
    profile = variants.derive(dflash_profile, "cpu-rehearsal-unres", {"drafter": drafter}, replace=("drafter",))
    with pytest.raises(UnresolvedPinError, match=r"drafter\.config\.expected\.target_layer_ids"):
        drafter_config.write_serving_dir(tmp_path / "serving", profile, source_dir=download, lock=Lock(tmp_path / "l"))
    assert not (tmp_path / "serving").exists()


def test_a6000_missing_download_exits_2(cli: Any, tmp_path: Path) -> None:
    """The production profile pins every field it checks, so write-config goes on to read
    the download — and a missing download is reported (exit 2), not papered over."""
    result = cli("write-config", tmp_path / "serving", "--profile", "a6000-dflash", "--source", tmp_path / "nothing")
    assert result.exit_code == 2
    assert "does not exist" in result.stderr


def test_serving_dir_must_not_be_the_download(tmp_path: Path, download: Path, dflash_profile: Profile) -> None:
    with pytest.raises(WriteError, match="is the download itself"):
        drafter_config.write_serving_dir(download, dflash_profile, source_dir=download, lock=Lock(tmp_path / "l"))


# --------------------------------------------------------------------------- real filesystems


@pytest.fixture
def tmpfs(tmp_path: Path) -> Iterator[Path]:
    if os.geteuid() != 0:
        pytest.skip("mounting a tmpfs needs root (CI runs as root)")
    mount = tmp_path / "mnt"
    mount.mkdir()
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=256k", "tmpfs", str(mount)]).returncode:
        pytest.skip("mount(8) is not permitted in this sandbox")
    try:
        yield mount
    finally:
        subprocess.run(["umount", "-l", str(mount)], check=False)


def test_read_only_filesystem_keeps_previous_file(
    cli: Any, tmpfs: Path, tmp_path: Path, download: Path, profile_path: Path, dflash_profile: Profile
) -> None:
    serving, lock = tmpfs / "serving", tmp_path / "specdeploy.lock"
    assert _write(cli, serving, profile_path, download, lock).exit_code == 0
    stale = b'{"stale": true}'
    (serving / "config.json").write_bytes(stale)  # needs repair
    subprocess.run(["mount", "-o", "remount,ro", str(tmpfs)], check=True)

    result = _write(cli, serving, profile_path, download, lock)
    assert result.exit_code == 1
    assert "read-only" in result.stderr and "nothing was changed" in result.stderr
    assert (serving / "config.json").read_bytes() == stale


def test_full_filesystem_keeps_previous_file(
    cli: Any, tmpfs: Path, tmp_path: Path, profile_path: Path, dflash_profile: Profile
) -> None:
    config = rehearsal_dflash_config(dflash_profile)
    serving, lock = tmpfs / "serving", tmp_path / "specdeploy.lock"
    small = make_drafter(tmp_path / "download", config)
    assert _write(cli, serving, profile_path, small, lock).exit_code == 0
    previous = (serving / "config.json").read_bytes()
    (serving / "config.json").write_bytes(b"{}")  # needs repair
    filler = tmpfs / "filler"
    subprocess.run(["dd", "if=/dev/zero", f"of={filler}", "bs=4k", "count=1000"], capture_output=True)

    result = _write(cli, serving, profile_path, small, lock)
    assert result.exit_code == 1
    assert "full" in result.stderr and "nothing was changed" in result.stderr
    assert (serving / "config.json").read_bytes() == b"{}"
    assert not [p for p in serving.iterdir() if p.name.startswith(".")], "temporary file cleaned up"
    filler.unlink()
    assert _write(cli, serving, profile_path, small, lock).exit_code == 0
    assert (serving / "config.json").read_bytes() == previous
