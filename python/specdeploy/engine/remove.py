"""What a decommission removes of the engine on a host (`specdeploy engine remove`, ansible/decommission.yml):
its API key (the root-only file `<state>/secrets/<name>` and, for a container engine, the podman secret of
that name) and its images (every local image all of whose names belong to the profile's engine image
repository, as the gate's prune judges them, plus any image the engine unit names by reference).

Run after the engine's unit was stopped: an image still used by a container stays and is reported (podman
refuses to remove it; nothing is forced). The units, weights and state are the playbook's (plain files
it removes by `specdeploy facts`' paths); this removes only what needs podman or knows the profile.

With `check`, nothing is removed and the result says what would be.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from specdeploy.core import files, layout
from specdeploy.core.errors import SpecdeployError
from specdeploy.core.references import repository_of
from specdeploy.images import prune
from specdeploy.images.podman import run as podman_run
from specdeploy.profile.schema import Profile


@dataclass
class Removed:
    """What was removed (or, with check, would be), and what stays and why."""

    secret_file: str | None = None  # the key file removed, or None (no key, or none there)
    podman_secret: str = "not used"  # removed, absent or not used (a venv engine, no key)
    images: list[str] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)
    check: bool = False

    @property
    def changed(self) -> bool:
        return bool(self.secret_file or self.podman_secret == "removed" or self.images)

    def to_json(self) -> dict[str, Any]:
        return asdict(self) | {"changed": self.changed}


def remove(
    profile: Profile,
    host: layout.HostLayout,
    *,
    unit_file: Path | None = None,
    podman: str = "podman",
    check: bool = False,
) -> Removed:
    """Remove the engine's key and images from this host (idempotent: a second run removes nothing)."""
    done = Removed(check=check)
    container = profile.engine.runtime == "container"
    if profile.engine.serve.api_key is not None:
        name = profile.engine.serve.api_key.secret
        path = host.secret_file(name)
        if path.is_file() or path.is_symlink():
            if not check:
                path.unlink()
            done.secret_file = str(path)
        if container:
            try:
                exists = podman_run(podman, "secret", "inspect", name).returncode == 0
            except SpecdeployError as exc:
                done.problems.append(f"podman secret {name}: {exc.message}")
            else:
                done.podman_secret = "removed" if exists else "absent"
                if exists and not check:
                    gone = podman_run(podman, "secret", "rm", name)
                    if gone.returncode != 0:
                        done.podman_secret = "stays"
                        done.problems.append(
                            f"podman secret rm {name} failed (exit {gone.returncode}): {gone.stderr.strip()[-300:]}"
                        )
    if container and profile.engine.image is not None:
        _remove_images(profile.engine.image.name, unit_file, podman, check, done)
    return done


def _remove_images(image_name: str, unit_file: Path | None, podman: str, check: bool, done: Removed) -> None:
    try:
        images = prune.local_images(podman)
        # every image of the engine's repository: nothing is kept (the engine is gone)
        candidates = prune.removable(repository_of(image_name), images, keep_ids=set())
        named = []
        if unit_file is not None and unit_file.is_file():
            text = files.read_text(unit_file, what="engine unit", limit=files.LIMITS["json"])
            named = [ref for ref in prune.unit_images(text) if prune.local_image_id(podman, ref) is not None]
    except (SpecdeployError, OSError) as exc:
        cause = exc.message if isinstance(exc, SpecdeployError) else str(exc)
        done.problems.append(f"no image of {image_name} was removed: {cause}")
        return
    targets = [(image.shown(), list(image.tags or (image.id,))) for image in candidates]
    ids = {image.id for image in candidates}
    for ref in named:  # the unit's image under another repository's name too: by its reference
        image_id = prune.local_image_id(podman, ref)
        if image_id not in ids:
            ids.add(image_id or ref)
            targets.append((ref, [ref]))
    for shown, names in targets:
        if check:
            done.images.append(shown)
            continue
        # by every tag at once: by ID podman refuses an image with several tags, and nothing is forced
        gone = podman_run(podman, "rmi", *names)
        if gone.returncode == 0:
            done.images.append(shown)
        else:
            done.problems.append(
                f"{shown} stays: podman rmi failed (exit {gone.returncode}): {gone.stderr.strip()[-300:]}"
            )
