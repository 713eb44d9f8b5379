"""Local base images for the image tests, made from Debian packages and cached.

CUDA base images cannot be pulled here; these stand in for them: a busybox base (seconds)
and a debootstrapped Debian with git and Python (about two minutes, then cached as a tar
in the specdeploy cache and imported into podman when missing)."""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import tempfile
from pathlib import Path

from specdeploy.cache import cache_dir

# Debian's podman here needs runc and cgroupfs (crun refuses the hybrid cgroup layout).
PODMAN = "podman --runtime runc --cgroup-manager=cgroupfs"
# ... and explicit limits for `podman run` (the defaults exceed what the sandbox permits).
RUN_FLAGS = ("--ulimit", "nofile=20000:20000", "--ulimit", "nproc=4096:4096")
BUILD_BASE_PACKAGES = ("ca-certificates", "git", "python3-minimal", "python3-pip", "python3-venv")


def _exists(image: str) -> bool:
    return subprocess.run(["podman", "image", "exists", image]).returncode == 0


def _import(rootfs: Path, image: str) -> None:
    tar = subprocess.Popen(["tar", "-C", str(rootfs), "-c", "."], stdout=subprocess.PIPE)
    subprocess.run(["podman", "import", "-", image], stdin=tar.stdout, check=True, capture_output=True)
    tar.wait()


def busybox_base() -> str:
    image = "localhost/specdeploy-test/busybox:1"
    if not _exists(image):
        with tempfile.TemporaryDirectory() as tmp:
            bindir = Path(tmp, "bin")
            bindir.mkdir()
            shutil.copy("/bin/busybox", bindir / "busybox")
            for applet in ("sh", "echo", "cat", "ls", "test"):
                os.symlink("busybox", bindir / applet)
            _import(Path(tmp), image)
    return image


def debootstrap_image(suite: str, packages: tuple[str, ...], name: str) -> str:
    """A Debian `suite` minbase with `packages`, as podman image `name:<key>`: debootstrapped
    once into a tar in the cache (keyed by suite and packages), imported when missing."""
    key = hashlib.sha256(" ".join((suite, *packages)).encode()).hexdigest()[:10]
    image = f"{name}:{key}"
    if _exists(image):
        return image
    archive = cache_dir() / "images" / f"{name.rsplit('/', 1)[-1]}-{suite}-{key}.tar"
    if not archive.exists():
        archive.parent.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory(dir=archive.parent) as tmp:
            rootfs = Path(tmp) / "rootfs"
            subprocess.run(
                ["debootstrap", "--variant=minbase", f"--include={','.join(packages)}", suite, str(rootfs),
                 "http://deb.debian.org/debian"],
                check=True, capture_output=True,
            )  # fmt: skip
            partial = archive.with_suffix(".partial")
            subprocess.run(["tar", "-C", str(rootfs), "-cf", str(partial), "."], check=True)
            partial.rename(archive)
    subprocess.run(["podman", "import", str(archive), image], check=True, capture_output=True)
    return image


def build_base() -> str:
    """Debian bookworm minbase with git and Python: what the vLLM Containerfile's source
    stage expects of its (CUDA devel) base, minus CUDA."""
    return debootstrap_image("bookworm", BUILD_BASE_PACKAGES, "localhost/specdeploy-test/buildbase")
