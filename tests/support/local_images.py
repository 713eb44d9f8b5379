"""Local base images for the image tests, made from Debian packages and cached.

CUDA base images cannot be pulled here; these stand in for them: a busybox base (seconds)
and a debootstrapped Debian with git and Python (about two minutes, then cached as a tar
in the specdeploy cache and imported into podman when missing)."""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

from specdeploy.rehearsal.hosts import PODMAN, RUN_FLAGS, debootstrap_image, image_exists, import_rootfs

__all__ = ["PODMAN", "RUN_FLAGS", "build_base", "busybox_base", "debootstrap_image"]
BUILD_BASE_PACKAGES = ("ca-certificates", "git", "python3-minimal", "python3-pip", "python3-venv")


def busybox_base() -> str:
    image = "localhost/specdeploy-test/busybox:1"
    if not image_exists(image):
        with tempfile.TemporaryDirectory() as tmp:
            bindir = Path(tmp, "bin")
            bindir.mkdir()
            shutil.copy("/bin/busybox", bindir / "busybox")
            for applet in ("sh", "echo", "cat", "ls", "test"):
                os.symlink("busybox", bindir / applet)
            import_rootfs(Path(tmp), image)
    return image


def build_base() -> str:
    """Debian bookworm minbase with git and Python: what the vLLM Containerfile's source
    stage expects of its (CUDA devel) base, minus CUDA."""
    return debootstrap_image("bookworm", BUILD_BASE_PACKAGES, "localhost/specdeploy-test/buildbase")
