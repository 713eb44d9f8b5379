"""The images stage on a host (the images role): make the profile's image present and prove it.

`ensure` builds it from the Containerfile, pulls it by the pinned registry digest, or loads a
`podman save` archive (air-gapped sites); then `check` compares its OCI labels with the
profile, and only an image that passes has its ID recorded and its reference by digest
handed to the engine unit — an image built from another commit or version never serves.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from specdeploy.images import build
from specdeploy.images.build import LABEL_ARGS, ImageError, image_tag, label_args, podman_run
from specdeploy.profile import Profile
from specdeploy.profile.lock import Lock, require


@dataclass
class LabelCheck:
    label: str
    expected: str
    found: str | None
    ok: bool


def check(image: str, profile: Profile, *, lock: Lock, podman: str = "podman") -> list[LabelCheck]:
    """Compare a built image's labels with what the profile (and lock) say it must contain."""
    done = podman_run(podman, "image", "inspect", "--format", "{{json .Labels}}", image)
    if done.returncode != 0:
        raise ImageError(f"no image {image}: {done.stderr.strip()[-200:]}", hint="build it with specdeploy image build")
    labels = json.loads(done.stdout or "{}") or {}
    base_digest = lock.value(profile.name, "engine.image.base.digest")
    if profile.engine.image and profile.engine.image.base.digest.resolved:
        base_digest = profile.engine.image.base.digest.value
    expected = label_args(profile, str(base_digest) if base_digest else "(unresolved)")
    rows = []
    for label, arg in LABEL_ARGS.items():
        if arg == "IMAGE_CREATED":
            continue
        found = labels.get(label)
        rows.append(LabelCheck(label, expected[arg], found, found == expected[arg]))
    return rows


# --------------------------------------------------------------------------- ensure (the images role)


@dataclass
class Ensured:
    tag: str
    reference: str  # name@sha256:... — what the engine unit runs
    action: str  # "present", "built", "pulled" or "loaded"
    image_id: str  # sha256:... — the config digest, recorded in the lock when first seen
    labels: list[LabelCheck]

    @property
    def changed(self) -> bool:
        return self.action != "present"


def ensure(
    profile: Profile,
    *,
    source: str,
    lock: Lock,
    context: Path | None = None,
    archive: Path | None = None,
    podman: str = "podman",
    driver_version: str | None = None,
) -> Ensured:
    """Make the profile's image present on this host — built from the Containerfile, pulled by
    the pinned digest, or loaded from an archive (air-gapped sites) — then prove its labels
    match the profile and return the reference by digest the engine unit must run."""
    if profile.engine.image is None:
        raise ImageError(f"profile {profile.name} runs no container image (runtime {profile.engine.runtime})")
    tag = image_tag(profile)
    action = "present"
    if build.local_digest(tag, podman) is None:
        if source == "build":
            if context is None:
                raise ImageError("images source 'build' needs the build context (the Containerfiles)")
            build.build(profile, lock=lock, context=context, podman=podman, driver_version=driver_version)
            action = "built"
        elif source == "pull":
            digest = require(profile, "engine.image.digest", lock)
            pulled = podman_run(podman, "pull", f"{profile.engine.image.name}@{digest}")
            if pulled.returncode != 0:
                raise ImageError(f"cannot pull {profile.engine.image.name}@{digest}: {pulled.stderr.strip()[-300:]}")
            podman_run(podman, "tag", f"{profile.engine.image.name}@{digest}", tag)
            action = "pulled"
        elif source == "archive":
            if archive is None or not Path(archive).is_file():
                raise ImageError(
                    f"images source 'archive': no archive at {archive}",
                    hint="export it where the image was built: podman save -o FILE " + tag,
                )
            loaded = podman_run(podman, "load", "--input", str(archive))
            if loaded.returncode != 0:
                raise ImageError(f"podman load {archive} failed: {loaded.stderr.strip()[-300:]}")
            action = "loaded"
        else:
            raise ImageError(f"images source: expected build, pull or archive, found {source!r}")
    digest = build.local_digest(tag, podman)
    if digest is None:
        raise ImageError(
            f"{tag} is not on this host after {action}",
            hint="an archive must contain the image under this tag (the profile's engine version)",
        )
    labels = check(tag, profile, lock=lock, podman=podman)
    image_id = f"sha256:{build.local_id(tag, podman)}"
    if all(label.ok for label in labels):  # never record the ID of an image that failed its check
        build.record_image_id(lock, profile, image_id, by=f"image ensure ({action})")
    return Ensured(tag, f"{profile.engine.image.name}@{digest}", action, image_id, labels)
