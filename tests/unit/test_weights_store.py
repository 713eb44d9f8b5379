"""Weights per revision on real files: verified against the archive's manifest and the lock,
served through relative links, restored by a rollback, pruned only of what no recent passing
deploy used. GPU-host blocker 10."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from pathlib import Path

import pytest

from specdeploy.core import atomic, hashcache, layout
from specdeploy.core.errors import UnresolvedPinError
from specdeploy.core.keeper import Keeper
from specdeploy.profile import Profile, load_profile
from specdeploy.profile.lock import Lock
from specdeploy.rollback import restore
from specdeploy.weights import store

PROFILE = load_profile("cpu-rehearsal")  # target and drafter revisions unresolved: from the archive


def _revision(root: Path, repo: str, content: bytes) -> Path:
    """A repository revision laid out as an archive carries it, named by its content."""
    staging = root / "staging" / repo
    staging.mkdir(parents=True)
    (staging / "config.json").write_text('{"model_type": "qwen3"}')
    (staging / "model.safetensors").write_bytes(content)
    final = root / repo / store.content_revision(staging)
    final.parent.mkdir(parents=True, exist_ok=True)
    staging.rename(final)
    shutil.rmtree(final / hashcache.STATE_DIR, ignore_errors=True)
    return final


def _archive(models: Path, target: bytes, drafter: bytes = b"drafter") -> dict[str, Path]:
    """What unpacking a weights archive leaves: one revision per repo, and the manifest."""
    assert PROFILE.drafter is not None
    made = {
        "target": _revision(models, PROFILE.target.repo, target),
        "drafter": _revision(models, PROFILE.drafter.repo, drafter),
    }
    store.write_manifest(models)
    for directory in made.values():  # an archive carries no hash cache: the host hashes anew
        shutil.rmtree(directory / hashcache.STATE_DIR, ignore_errors=True)
    return made


def _host(tmp_path: Path) -> layout.HostLayout:
    return layout.HostLayout(
        models=tmp_path / "data" / "models", serving=tmp_path / "serving", state=tmp_path / "state"
    )


def test_serving_links_point_at_the_verified_revisions_by_relative_paths(tmp_path: Path) -> None:
    host = _host(tmp_path)
    made = _archive(host.models, b"target v1")
    lock = Lock(host.lock)
    served = store.serve(PROFILE, host, lock)
    assert sorted(served.changed) == sorted([str(host.target_serving), str(host.drafter_source)])
    assert host.target_serving.resolve() == made["target"] and host.drafter_source.resolve() == made["drafter"]
    assert not os.readlink(host.target_serving).startswith("/")  # resolves in a container too
    rev = made["target"].name
    recorded = lock.value(PROFILE.name, f"target.files@{rev}")
    assert recorded["model.safetensors"] == hashlib.sha256(b"target v1").hexdigest()
    again = store.serve(PROFILE, host, Lock(host.lock))
    assert again.changed == [] and not any(v.recorded_in_lock for v in again.verified)


def test_a_file_corrupted_after_unpacking_is_named_and_nothing_is_linked(tmp_path: Path) -> None:
    """The archive source verified no hashes: a corrupted copy was served. Every file is now
    checked against the archive's manifest before the serving link moves."""
    host = _host(tmp_path)
    made = _archive(host.models, b"target v1")
    (made["target"] / "model.safetensors").write_bytes(b"target v1 but flipped")
    with pytest.raises(store.WeightsError, match="model.safetensors: expected") as info:
        store.serve(PROFILE, host, Lock(host.lock))
    assert "differ from the archive's manifest" in info.value.message and "copy it again" in (info.value.hint or "")
    assert not host.target_serving.is_symlink()


def test_the_same_revision_with_other_bytes_is_refused_against_the_lock(tmp_path: Path) -> None:
    host = _host(tmp_path)
    made = _archive(host.models, b"target v1")
    store.serve(PROFILE, host, Lock(host.lock))
    # the same revision name arrives again with other bytes and a manifest that agrees with them
    (made["target"] / "model.safetensors").write_bytes(b"swapped upstream")
    manifest = json.loads((host.models / store.MANIFEST).read_text())
    manifest["models"][PROFILE.target.repo]["files"]["model.safetensors"] = hashlib.sha256(
        b"swapped upstream"
    ).hexdigest()
    (host.models / store.MANIFEST).write_text(json.dumps(manifest))
    with pytest.raises(store.WeightsError, match="differ from those recorded in the lock"):
        store.serve(PROFILE, host, Lock(host.lock))


def test_an_unresolved_revision_without_an_archive_is_refused_naming_the_pin(tmp_path: Path) -> None:
    with pytest.raises(UnresolvedPinError, match=r"target\.revision is unresolved"):
        store.serve(PROFILE, _host(tmp_path), Lock(tmp_path / "l"))


def test_a_rollback_after_a_revision_bump_serves_the_old_revision(tmp_path: Path) -> None:
    """The field failure this layout prevents: the rollback restarted the old unit on the new
    weights. A bump flips the link (one rename), the keeper keeps the old link, and restoring
    it brings the old revision back — whose directory is still there."""
    host = _host(tmp_path)
    old = _archive(host.models, b"target v1")
    store.serve(PROFILE, host, Lock(host.lock))
    new = _revision(host.models, PROFILE.target.repo, b"target v2")
    manifest = json.loads((host.models / store.MANIFEST).read_text())
    manifest["models"][PROFILE.target.repo] = {"revision": new.name, "files": store.hashes(new)}
    atomic.write_json(host.models / store.MANIFEST, manifest)

    keeper = Keeper(host.rollback, "bump")
    served = store.serve(PROFILE, host, Lock(host.lock), keeper=keeper)
    assert served.changed == [str(host.target_serving)] and host.target_serving.resolve() == new
    done = restore.restore(host.rollback, "bump", unit="specdeploy-engine", run=lambda _: None)
    assert done.restored == [str(host.target_serving)]
    assert host.target_serving.resolve() == old["target"] and (old["target"] / "model.safetensors").read_bytes() == (
        b"target v1"
    )


def _passing_run(host: layout.HostLayout, run_id: str, finished: str) -> None:
    directory = host.runs / run_id
    directory.mkdir(parents=True)
    report = {"verdict": "pass", "finished_at": finished, "served": store.served_now(host)}
    (directory / "gate.json").write_text(json.dumps(report))


def test_pruning_keeps_the_last_passing_revisions_and_what_is_served(tmp_path: Path) -> None:
    """Disk is finite (the target alone is 51.75 GiB): beyond the N most recent distinct revisions
    that passing deploys served, revisions go (after a pass only); the served one, those N (no-op
    re-runs do not count twice), and anything specdeploy did not verify stay. `--check` only reports."""
    host = _host(tmp_path)
    profile: Profile = PROFILE
    revisions = []
    for n in range(1, 5):
        made = _archive(host.models, f"target v{n}".encode()) if n == 1 else None
        if made is None:
            made = {"target": _revision(host.models, profile.target.repo, f"target v{n}".encode())}
            manifest = json.loads((host.models / store.MANIFEST).read_text())
            manifest["models"][profile.target.repo] = {"revision": made["target"].name, "files": {}}
            manifest["models"][profile.target.repo]["files"] = store.hashes(made["target"])
            atomic.write_json(host.models / store.MANIFEST, manifest)
        store.serve(profile, host, Lock(host.lock))
        revisions.append(made["target"])
        if n < 4:  # the fourth is served but has not passed a gate yet
            _passing_run(host, f"run-{n}", f"2026-12-01T00:0{n}:00+00:00")
        if n == 3:  # two no-op re-runs: the same revision again must not push an older one out
            _passing_run(host, "rerun-a", "2026-12-01T00:03:30+00:00")
            _passing_run(host, "rerun-b", "2026-12-01T00:03:40+00:00")
    foreign = host.models / profile.target.repo / "hand-copied"
    foreign.mkdir()

    would = store.prune(host, keep=2, check=True)
    assert would == [str(revisions[0])] and revisions[0].is_dir()
    assert store.prune(host, keep=2) == [str(revisions[0])]
    assert not revisions[0].exists() and all(r.is_dir() for r in revisions[1:]) and foreign.is_dir()
    assert store.prune(host, keep=1) == [str(revisions[1])]


def test_only_the_engines_group_may_read_the_weights_and_links_are_not_followed(tmp_path: Path) -> None:
    """GPU-host blockers 11 and 13: gated weights were world-readable, and the image's uid 10001
    must still read them. Directories become 750, files 640, root-owned with the engine's group;
    a link is re-owned but never followed (its target outside stays as it is); `--check` only
    reports; a second pass changes nothing (Ansible's file module reported links as changed)."""
    host = _host(tmp_path)
    made = _archive(host.models, b"target v1")
    store.serve(PROFILE, host, Lock(host.lock))
    outside = tmp_path / "outside.txt"
    outside.write_text("not ours")
    outside.chmod(0o644)
    (host.serving / "stray").symlink_to(outside)
    gid = layout.ENGINE_UID
    would = store.restrict_to_engine([host.models, host.serving], gid, check=True)
    weights = made["target"] / "model.safetensors"
    assert str(weights) in would and weights.stat().st_mode & 0o777 == 0o644  # nothing changed yet
    changed = store.restrict_to_engine([host.models, host.serving], gid)
    assert sorted(changed) == sorted(would)
    assert (weights.stat().st_mode & 0o777, weights.stat().st_gid) == (0o640, gid)
    assert (made["target"].stat().st_mode & 0o777, host.models.stat().st_mode & 0o777) == (0o750, 0o750)
    assert outside.stat().st_mode & 0o777 == 0o644 and (host.serving / "stray").lstat().st_gid == gid
    assert store.restrict_to_engine([host.models, host.serving], gid) == []


def test_what_the_last_archive_delivered_is_never_pruned(tmp_path: Path) -> None:
    """Found on the rehearsal host: the archive carries a drafter no passing deploy had served
    yet (the DFlash variant's); a pass pruned it, and since the archive is unpacked again only
    when it changes, the next deploy of that variant found its revision gone."""
    host = _host(tmp_path)
    _archive(host.models, b"target v1")
    other = _revision(host.models, "specdeploy-fixtures/other-drafter", b"never served yet")
    store.write_manifest(host.models)  # the archive holds it too
    store.hashes(other)  # verified once, as `weights serve` of a profile that uses it would
    store.serve(PROFILE, host, Lock(host.lock))
    _passing_run(host, "run-1", "2026-12-01T00:01:00+00:00")
    assert store.prune(host, keep=1) == [] and other.is_dir()


def test_git_s_blob_id_of_a_file_of_several_chunks_equals_git_s_own(tmp_path: Path) -> None:
    """Issue 35: a small file's hash on the hub is git's blob id; the fetch computes it streamed (a
    file listed as small may be large on disk: reading it whole would take the host's memory). Checked
    against the real `git hash-object` on a file of several chunks, and on an empty one."""
    import subprocess

    from specdeploy.weights.fetch import git_blob_id

    for name, data in (("big", os.urandom(3 * (1 << 20) + 7)), ("empty", b"")):
        path = tmp_path / name
        path.write_bytes(data)
        git = subprocess.run(["git", "hash-object", str(path)], capture_output=True, text=True, check=True)
        assert git_blob_id(path) == git.stdout.strip(), name


def test_git_s_blob_id_of_a_large_file_holds_no_more_than_a_chunk_in_memory(tmp_path: Path) -> None:
    """Issue 35: the blob id is streamed: over a 256 MiB file (sparse: no disk used) the peak of
    Python's allocations stays near one 1 MiB chunk, where reading it whole would take 256 MiB."""
    import tracemalloc

    from specdeploy.weights.fetch import git_blob_id

    path = tmp_path / "listed-as-small.bin"
    with path.open("wb") as fh:
        fh.truncate(256 << 20)
    tracemalloc.start()
    try:
        git_blob_id(path)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 8 << 20, f"peak {peak / (1 << 20):.1f} MiB"
