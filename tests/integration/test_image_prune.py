"""The engine's old images pruned with real podman (images.prune): three images of one repository
(the one the unit runs, the one the rollback record keeps, an old one also named as pulled from a
site registry) and one of another repository, on the small Debian base; units written by the real
unit install and keeper. Each test's images have names of their own and are removed at its end."""

from __future__ import annotations

import subprocess
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from tests.support.local_images import PODMAN, build_base

from specdeploy.core import layout
from specdeploy.core.keeper import Keeper, close_run
from specdeploy.engine import units
from specdeploy.images import prune
from specdeploy.profile import load_profile

pytestmark = pytest.mark.podman


def _podman(*args: str) -> str:
    return subprocess.run([*PODMAN.split(), *args], check=True, capture_output=True, text=True).stdout.strip()


def _exists(reference: str) -> bool:
    return subprocess.run([*PODMAN.split(), "image", "exists", reference]).returncode == 0


@pytest.fixture
def images(tmp_path: Path) -> Iterator[dict[str, str]]:
    """Role -> name: current, previous, old (also tagged as pulled from a registry), other; and
    each role's ID under "<role>_id"."""
    suffix = uuid.uuid4().hex[:8]
    repo, other = f"localhost/specdeploy-test/prune-{suffix}", f"localhost/specdeploy-test/prune-other-{suffix}"
    names = {"current": f"{repo}:3", "previous": f"{repo}:2", "old": f"{repo}:1", "other": f"{other}:1"}
    names |= {"repo": repo, "pulled": f"registry.test:5000/specdeploy-test/prune-{suffix}:1"}
    context = tmp_path / "context"
    context.mkdir()
    (context / "Containerfile").write_text(f"FROM {build_base()}\n")
    try:
        for role in ("current", "previous", "old", "other"):  # a label of its own: four distinct image IDs
            label = f"specdeploy.test.prune={role}-{suffix}"
            _podman("build", "--quiet", "--label", label, "-t", names[role], str(context))
            names[f"{role}_id"] = _podman("image", "inspect", "--format", "{{.Id}}", names[role])
        _podman("tag", names["old"], names["pulled"])
        yield names
    finally:
        tags = [names[role] for role in ("current", "previous", "old", "other", "pulled")]
        subprocess.run([*PODMAN.split(), "rmi", "--ignore", *tags], capture_output=True)


def _deployed(tmp_path: Path, images: dict[str, str]) -> tuple[Path, Path]:
    """The unit file and rollback directory after two deploys: the first ran `previous`, the second
    (its gate passed) runs `current` and the keeper kept the first one's unit."""
    profile = load_profile("cpu-rehearsal-container")
    host = layout.local_layout(tmp_path / "state")
    unit_dir = tmp_path / "systemd"

    def unit(role: str) -> units.RenderedUnit:
        digest = _podman("image", "inspect", "--format", "{{.Digest}}", images[role])
        return units.render_quadlet(profile, image=f"{images['repo']}@{digest}", host=host)

    units.install(unit("previous"), unit_dir)
    units.install(unit("current"), unit_dir, Keeper(host.rollback, "run-2"))
    close_run(host.rollback, "run-2", "verified")
    return unit_dir / layout.UNIT_FILES["container"].name, host.rollback


def test_only_the_image_neither_the_unit_nor_the_rollback_names_is_removed_and_other_repositories_stay(
    tmp_path: Path, images: dict[str, str]
) -> None:
    unit_file, rollback = _deployed(tmp_path, images)

    done = prune.prune(images["repo"], unit_file=unit_file, rollback=rollback, podman=PODMAN)

    assert done.problems == []
    assert done.removed == [f"{images['old']}, {images['pulled']} ({images['old_id'][:12]})"]
    assert not _exists(images["old_id"])
    assert all(_exists(images[f"{role}_id"]) for role in ("current", "previous", "other"))
    assert _exists(build_base())
    # a second prune finds nothing more to remove
    assert prune.prune(images["repo"], unit_file=unit_file, rollback=rollback, podman=PODMAN).lines() == []


def test_an_old_image_a_container_uses_stays_and_the_prune_says_why(tmp_path: Path, images: dict[str, str]) -> None:
    unit_file, rollback = _deployed(tmp_path, images)
    container = f"specdeploy-test-prune-{uuid.uuid4().hex[:8]}"
    _podman("create", "--name", container, images["old"], "true")
    try:
        done = prune.prune(images["repo"], unit_file=unit_file, rollback=rollback, podman=PODMAN)
    finally:
        subprocess.run([*PODMAN.split(), "rm", container], capture_output=True)

    assert done.removed == [] and len(done.problems) == 1
    assert done.problems[0].startswith(f"{images['old']}, {images['pulled']} ({images['old_id'][:12]}) stays: ")
    assert "in use by a container" in done.problems[0]
    assert _exists(images["old_id"])
