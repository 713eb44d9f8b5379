"""Local base images for the image tests, made from Debian packages and cached.

CUDA base images cannot be pulled here; a debootstrapped Debian with git and Python stands in
for them (about two minutes, then cached as a tar in the specdeploy cache and imported into
podman when missing). Engine images are then built on it from stand-in Containerfiles in
tests/data/images/."""

from __future__ import annotations

from pathlib import Path

from specdeploy.rehearsal.hosts import PODMAN, RUN_FLAGS, debootstrap_image
from specdeploy.rehearsal.hub import BASE_NAME, BASE_PACKAGES

__all__ = ["PODMAN", "RUN_FLAGS", "build_base", "debootstrap_image", "run_limits_conf"]


def build_base() -> str:
    """Debian bookworm minbase with git and Python: what the vLLM Containerfile's source
    stage expects of its (CUDA devel) base, minus CUDA."""
    # the hub's image base (git + Python): one debootstrapped tar serves both
    return debootstrap_image("bookworm", BASE_PACKAGES, BASE_NAME)


def run_limits_conf(directory: Path) -> Path:
    """A containers.conf that gives every `podman run` the limits RUN_FLAGS gives, for commands
    that run containers themselves (`image check` inspects inside the image): podman's default
    limits exceed what this sandbox permits. Point CONTAINERS_CONF at it."""
    limits = [value for flag, value in zip(RUN_FLAGS, RUN_FLAGS[1:], strict=False) if flag == "--ulimit"]
    path = directory / "containers.conf"
    path.write_text("[containers]\ndefault_ulimits = [" + ", ".join(f'"{v}"' for v in limits) + "]\n")
    return path
