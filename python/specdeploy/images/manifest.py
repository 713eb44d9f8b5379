"""Every file of an image by its content: the proof that two builds of one lock are one image.

A host that builds its own engine image and a builder that pushes one must serve the same
thing; "the same version" is what the field trusted before an incompatible image went live.
Bit-for-bit identity holds only for one builder (the layer tarballs carry the builder's tar
headers and buildah's version label), so across builders the proof is the files: every path
with its type, mode, owner and the sha256 of its content (or a link's target), read from
`podman export` of a container created from the image (never started: nothing runs).

What is left out, and why, is one table (`EXCLUDED`); modification times are not compared
(`podman build --timestamp` fixes them per builder, but they are tar metadata, not content).
"""

from __future__ import annotations

import fnmatch
import hashlib
import subprocess
import tarfile
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

from specdeploy.core import atomic, files
from specdeploy.core.errors import InputFileError
from specdeploy.images import podman as podman_exe
from specdeploy.images.build import ImageError

MANIFEST_SCHEMA = 1

# path pattern (fnmatch, relative, no leading /) -> why it differs between two correct builds
EXCLUDED: dict[str, str] = {
    # measured: empty in both builds, mode 0700 from podman 5.4 (buildah 1.39), 0755 from podman 4.3
    "etc/hosts": "an empty placeholder the builder leaves for bind-mounting /etc/hosts into RUN steps "
    "(its mode is the builder version's); podman mounts the host's file over it when the engine runs",
}

_TYPES = {
    tarfile.REGTYPE: "file",
    tarfile.AREGTYPE: "file",
    tarfile.DIRTYPE: "dir",
    tarfile.SYMTYPE: "symlink",
    tarfile.LNKTYPE: "hardlink",
    tarfile.CHRTYPE: "char",
    tarfile.BLKTYPE: "block",
    tarfile.FIFOTYPE: "fifo",
}


def excluded(path: str) -> str | None:
    """The reason `path` is left out of a manifest, or None."""
    return next((why for pattern, why in EXCLUDED.items() if fnmatch.fnmatchcase(path, pattern)), None)


def from_tar(stream: IO[bytes]) -> dict[str, str]:
    """path -> "TYPE MODE UID:GID CONTENT" for every member of a tar stream (read once, in order)."""
    entries: dict[str, str] = {}
    with tarfile.open(fileobj=stream, mode="r|") as tar:
        for member in tar:
            path = member.name.lstrip("./").rstrip("/") if member.name not in (".", "./") else ""
            if not path or excluded(path):
                continue
            kind = _TYPES.get(member.type, f"type-{member.type!r}")
            if member.isfile():
                digest = hashlib.sha256()
                handle = tar.extractfile(member)
                assert handle is not None
                while chunk := handle.read(1 << 20):
                    digest.update(chunk)
                content = f"sha256:{digest.hexdigest()}"
            elif member.issym() or member.islnk():
                content = f"-> {member.linkname}"
            elif member.ischr() or member.isblk():
                content = f"{member.devmajor}:{member.devminor}"
            else:
                content = "-"
            entries[path] = f"{kind} {member.mode & 0o7777:04o} {member.uid}:{member.gid} {content}"
    return entries


@dataclass
class Manifest:
    image: str
    image_id: str
    files: dict[str, str]

    def as_json(self) -> dict[str, Any]:
        return {
            "schema_version": MANIFEST_SCHEMA,
            "image": self.image,
            "image_id": self.image_id,
            "excluded": EXCLUDED,
            "files": self.files,
        }


def of_image(image: str, podman: str = "podman") -> Manifest:
    """The manifest of a local image: a container is created (not started), exported and removed."""
    image_id = podman_exe.run(podman, "image", "inspect", "--format", "{{.Id}}", image)
    if image_id.returncode != 0:
        raise ImageError(
            f"image {image} is not on this machine: {image_id.stderr.strip()[-300:]}",
            hint="pull, load or build it first (specdeploy image ensure)",
        )
    created = podman_exe.run(podman, "create", "--entrypoint", "/manifest-never-runs", image)
    if created.returncode != 0:
        raise ImageError(f"cannot create a container of {image}: {created.stderr.strip()[-300:]}")
    container = created.stdout.strip().splitlines()[-1]
    try:
        with subprocess.Popen(
            [*podman_exe.command(podman), "export", container], stdout=subprocess.PIPE, stderr=subprocess.PIPE
        ) as export:
            assert export.stdout is not None
            try:
                entries = from_tar(export.stdout)
            except tarfile.TarError as exc:
                export.kill()
                raise ImageError(f"podman export of {image} gave no readable tar: {exc}") from None
            stderr = export.stderr.read().decode(errors="replace") if export.stderr else ""
        if export.returncode != 0:
            raise ImageError(f"podman export of {image} failed (exit {export.returncode}): {stderr.strip()[-300:]}")
    finally:
        podman_exe.run(podman, "rm", "--force", container)
    return Manifest(image, f"sha256:{image_id.stdout.strip()}", entries)


@dataclass
class Difference:
    path: str
    left: str | None  # None: the path is missing on that side
    right: str | None


def compare(left: dict[str, str], right: dict[str, str]) -> list[Difference]:
    """Every path whose entry differs or exists on one side only, sorted by path."""
    return [
        Difference(path, left.get(path), right.get(path))
        for path in sorted(set(left) | set(right))
        if left.get(path) != right.get(path)
    ]


def write(found: Manifest, path: Path) -> None:
    atomic.write_json(path, found.as_json(), sort_keys=True)


def load(path: Path) -> Manifest:
    """A manifest written by `write` (another builder's), checked field by field."""
    data = files.read_json(path, what="image manifest", limit=files.LIMITS["text"])  # ~100 bytes per file
    hint = "pass a file written by `specdeploy image manifest IMAGE --output FILE`"
    if not isinstance(data, dict) or data.get("schema_version") != MANIFEST_SCHEMA:
        raise InputFileError(
            f"image manifest {path}: expected an object with schema_version {MANIFEST_SCHEMA}, found "
            f"{type(data).__name__ if not isinstance(data, dict) else repr(data.get('schema_version'))}; "
            "nothing was compared",
            hint=hint,
        )
    entries = data.get("files")
    if not isinstance(entries, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in entries.items()):
        raise InputFileError(
            f"image manifest {path}: field files: expected an object of path -> entry strings; nothing was compared",
            hint=hint,
        )
    if data.get("excluded") != EXCLUDED:
        raise InputFileError(
            f"image manifest {path} was written with another exclusion list ({data.get('excluded')!r}, this "
            f"specdeploy leaves out {EXCLUDED!r}): the two would not compare the same files; nothing was compared",
            hint="write both manifests with the same specdeploy version",
        )
    return Manifest(str(data.get("image", "")), str(data.get("image_id", "")), entries)
