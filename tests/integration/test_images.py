"""Image builds with real podman, here, without CUDA bases.

- `specdeploy image build` / `image check` on a small image built from a local busybox base:
  build args come from the profile, the base digest and image ID land in the lock, labels
  match the profile, and a different profile fails the check naming the label.
- The real Containerfile.vllm-pr40898, built up to its `source` stage on a local Debian base
  (git + Python standing in for the CUDA devel image) against a fixture vLLM repository:
  the guard passes the pinned tree and fails the build of a tree with the shift twice.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import pytest
from tests.support.local_images import PODMAN, RUN_FLAGS, build_base, busybox_base
from tests.support.vllm_repo import fixture_vllm_repo, git

from specdeploy.images import build as images
from specdeploy.profile import Profile, load_profile
from specdeploy.profile.lock import Lock
from specdeploy.rehearsal import variants

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.podman


def _small_profile(version: str = "0.5.19") -> Profile:
    base = busybox_base()
    patch = {
        "engine": {
            "source": {"version": {"value": version, "provenance": "rehearsal", "source": "test image"}},
            "image": {
                "name": "localhost/specdeploy-test/small",
                "containerfile": "tests/data/images/Containerfile.small",
                "base": {"name": base, "digest": {"provenance": "unresolved", "source": "the first build"}},
            },
        }
    }
    return variants.derive(load_profile("a6000-mtp"), "a6000-mtp-small", patch)


def test_image_build_then_check(tmp_path: Path, cli: Any) -> None:
    profile = _small_profile()
    lock = Lock(tmp_path / "specdeploy.lock")
    result = images.build(profile, lock=lock, context=ROOT, podman=PODMAN)
    assert result.tag == "localhost/specdeploy-test/small:0.5.19"

    base_digest = lock.value(profile.name, "engine.image.base.digest")
    assert base_digest and base_digest.startswith("sha256:")
    # The build's image ID is recorded as such, never as the (registry) digest a pull needs.
    assert lock.value(profile.name, "engine.image.id") == f"sha256:{result.image_id}"
    assert lock.value(profile.name, "engine.image.digest") is None
    assert f"BASE_IMAGE={busybox_base()}@{base_digest}" in result.argv

    content = subprocess.run(
        [*PODMAN.split(), "run", "--rm", *RUN_FLAGS, result.tag, "cat", "/engine.txt"],
        capture_output=True, text=True, check=True,
    ).stdout  # fmt: skip
    assert content.startswith("engine 0.5.19; refused: <0.5.10 ==0.5.12.*")

    profile_path = variants.materialize(profile, tmp_path / "p")
    checked = cli(
        "image", "check", result.tag, "--profile", profile_path, "--lock", lock.path, "--json", "--podman", PODMAN
    )
    assert checked.exit_code == 0, checked.stdout
    assert json.loads(checked.stdout)["ok"] is True

    other = variants.materialize(
        _small_profile("0.5.18").model_copy(update={"name": "a6000-mtp-small"}), tmp_path / "q"
    )
    mismatch = cli("image", "check", result.tag, "--profile", other, "--lock", lock.path, "--json", "--podman", PODMAN)
    failed = {row["label"] for row in json.loads(mismatch.stdout)["labels"] if not row["ok"]}
    assert mismatch.exit_code == 1
    assert failed == {"org.opencontainers.image.version", "org.opencontainers.image.revision"}


def test_image_ensure_builds_loads_an_archive_and_hands_over_a_digest_reference(tmp_path: Path, cli: Any) -> None:
    """The images role's command: build when missing, present on a re-run, and on an
    air-gapped host load a `podman save` archive; every path ends in a label check and a
    reference by digest for the engine unit."""
    profile = _small_profile("0.5.16")
    path = variants.materialize(profile, tmp_path / "p")
    lock = tmp_path / "specdeploy.lock"
    tag = "localhost/specdeploy-test/small:0.5.16"
    subprocess.run([*PODMAN.split(), "rmi", "-f", tag], capture_output=True)

    def ensure(*extra: Any) -> Any:
        return cli("image", "ensure", "--profile", path, "--lock", lock, "--podman", PODMAN, *extra)

    built = ensure("--source", "build", "--context", ROOT)
    assert built.exit_code == 0, built.stdout + built.stderr
    first = json.loads(built.stdout)
    assert (first["action"], first["changed"], first["label_mismatches"]) == ("built", True, [])
    assert first["reference"].startswith("localhost/specdeploy-test/small@sha256:")
    again = json.loads(ensure("--source", "build", "--context", ROOT).stdout)
    assert (again["action"], again["changed"], again["reference"]) == ("present", False, first["reference"])

    archive = tmp_path / "small.tar"
    subprocess.run([*PODMAN.split(), "save", "--output", str(archive), tag], check=True, capture_output=True)
    subprocess.run([*PODMAN.split(), "rmi", "-f", tag], check=True, capture_output=True)
    loaded = ensure("--source", "archive", "--archive", archive)
    assert loaded.exit_code == 0, loaded.stdout + loaded.stderr
    data = json.loads(loaded.stdout)
    assert data["action"] == "loaded" and data["label_mismatches"] == []
    assert data["reference"].startswith("localhost/specdeploy-test/small@sha256:")
    assert data["image_id"] == first["image_id"] == Lock(lock).value(profile.name, "engine.image.id")

    # The reference by digest handed to the engine unit runs the image.
    ran = subprocess.run(
        [*PODMAN.split(), "run", "--rm", *RUN_FLAGS, data["reference"], "cat", "/engine.txt"],
        capture_output=True, text=True,
    )  # fmt: skip
    assert ran.returncode == 0 and ran.stdout.startswith("engine 0.5.16"), ran.stderr

    subprocess.run([*PODMAN.split(), "rmi", "-f", tag], check=True, capture_output=True)
    missing = ensure("--source", "archive", "--archive", tmp_path / "none.tar")
    assert missing.exit_code == 1 and "no archive at" in missing.stderr and "podman save" in missing.stderr

    # Pull needs the registry's manifest digest; the recorded image ID is not one.
    unpinned = ensure("--source", "pull")
    assert unpinned.exit_code == 1
    assert "engine.image.digest is unresolved" in unpinned.stderr and "podman push --digestfile" in unpinned.stderr


def _source_stage(repo: Path, commit: str, merge_base: str, tmp_path: Path) -> subprocess.CompletedProcess[str]:
    argv = [
        *PODMAN.split(), "build", "--target", "source", "--file", str(ROOT / "Containerfile.vllm-pr40898"),
        "--volume", f"{repo}:/fixture:ro", "--tag", f"localhost/specdeploy-test/guard:{commit[:12]}",
        "--build-arg", f"BASE_IMAGE={build_base()}",
        "--build-arg", "VLLM_REPO=/fixture", "--build-arg", "VLLM_REF=refs/pull/40898/head",
        "--build-arg", f"VLLM_COMMIT={commit}", "--build-arg", f"VLLM_MERGE_BASE_COMMIT={merge_base}",
        "--build-arg", "BUILD_MODE=precompiled", str(ROOT),
    ]  # fmt: skip
    return subprocess.run(argv, capture_output=True, text=True)


@pytest.mark.parametrize(("shifts", "passes"), [(1, True), (2, False)], ids=["pinned-tree", "shift-applied-twice"])
def test_vllm_containerfile_guard_stage(tmp_path: Path, shifts: int, passes: bool) -> None:
    repo, head, base = fixture_vllm_repo(tmp_path, shifts=shifts)
    git(repo, "update-ref", "refs/pull/40898/head", head)
    done = _source_stage(repo, head, base, tmp_path)
    output = done.stdout + done.stderr
    if passes:
        assert done.returncode == 0, output[-3000:]
        assert "specdeploy build guard: vllm checks passed" in output
    else:
        assert done.returncode != 0
        assert "present 2 times (#40727 applied twice)" in output
