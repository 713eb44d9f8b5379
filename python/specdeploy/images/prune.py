"""Old engine images go after a verified deploy; the image the engine runs and every image a
rollback could bring back stay.

Failure prevented: each deploy of a new engine version leaves its predecessor's image on the host
(GB each: a CUDA vLLM image is 10-20 GB), until the disk fills and a deploy fails pulling or
building the next one — or the engine's cache cannot be written. The opposite failure is as bad:
pruning the image the previous unit names, so that a failed gate restores a unit whose image is
gone and the rollback cannot start the previous stack.

What is kept, compared by image ID (podman resolves each reference): the image the current unit
runs (`Image=` of the quadlet), and the image of every unit copy the rollback record lists
(core.keeper: what the last run replaced, which `rollback restore` puts back). What may go: a
local image all of whose names (tags, and digests it was pulled by, under any registry:
core.references.repository_of) belong to the profile's engine image repository. An image that
also carries another repository's name, an untagged image (it names no repository) and every
image of another repository (the base image, other software) are never touched.

Pruning runs only after a pass (gate.run) and never turns it into a failure: a podman that fails,
a unit that names no image, a damaged record — each is reported, and nothing is removed when
what must be kept is not known.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from specdeploy.core import files, keeper
from specdeploy.core.errors import SpecdeployError
from specdeploy.core.references import repository_of
from specdeploy.images.podman import run as podman_run


@dataclass(frozen=True)
class LocalImage:
    id: str  # podman's image ID (the config digest), without "sha256:"
    tags: tuple[str, ...]  # NAME:TAG names (podman's Names)
    digests: tuple[str, ...] = ()  # NAME@sha256:... names (podman's RepoDigests)

    @property
    def names(self) -> tuple[str, ...]:
        return self.tags + self.digests

    def shown(self) -> str:
        return f"{', '.join(self.tags or self.digests)} ({self.id[:12]})"


def name_repository(name: str) -> str:
    """The repository an image name names: no registry, no tag, no digest."""
    name = name.partition("@")[0]
    last = name.rsplit("/", 1)[-1]
    if ":" in last:  # a tag (a colon before the last `/` is a registry's port)
        name = name[: len(name) - len(last) + last.index(":")]
    return repository_of(name)


def removable(repository: str, images: Iterable[LocalImage], keep_ids: set[str]) -> list[LocalImage]:
    """The images that may go: every name of theirs is of `repository`, and their ID is not kept."""
    keep = {_bare(i) for i in keep_ids}
    return [
        image
        for image in images
        if image.names and all(name_repository(n) == repository for n in image.names) and _bare(image.id) not in keep
    ]


def unit_images(text: str) -> list[str]:
    """The images a quadlet unit runs (its `Image=` lines)."""
    images = []
    for line in text.splitlines():
        key, sep, value = line.partition("=")
        if sep and key.strip() == "Image" and value.strip():
            images.append(value.strip())
    return images


def rollback_images(rollback: Path) -> list[str]:
    """The images named by the unit copies the rollback record lists (what `rollback restore` could
    put back). A damaged record is a keeper.RunRecordError."""
    record = keeper.load_run(rollback)
    found: list[str] = []
    for entry in record.entries if record is not None else []:
        if entry.kind == "file" and entry.copy and Path(entry.path).suffix == ".container":
            copy = Path(entry.copy)
            if copy.is_file():
                found += unit_images(files.read_text(copy, what="kept engine unit", limit=files.LIMITS["json"]))
    return found


@dataclass
class Pruned:
    removed: list[str]
    problems: list[str]

    def lines(self) -> list[str]:
        """The gate report's form: what was removed, then what was not and why."""
        return self.removed + [f"not pruned: {p}" for p in self.problems]


class PruneError(SpecdeployError):
    """What must be kept is not known (or podman cannot list images): nothing was removed."""


def _bare(image_id: str) -> str:
    return image_id.removeprefix("sha256:")


def _podman(podman: str, *args: str) -> str:
    done = podman_run(podman, *args)
    if done.returncode != 0:
        raise PruneError(f"`podman {' '.join(args)}` failed (exit {done.returncode}): {done.stderr.strip()[-300:]}")
    return done.stdout


def local_image_id(podman: str, reference: str) -> str | None:
    """The ID of `reference` on this host; None when it is not here (podman image exists: 1)."""
    exists = podman_run(podman, "image", "exists", reference)
    if exists.returncode == 1:
        return None
    return _bare(_podman(podman, "image", "inspect", "--format", "{{.Id}}", reference).strip())


def local_images(podman: str) -> list[LocalImage]:
    """Every named local image, once per ID (podman lists an image once per name)."""
    listed = files.parse_json(_podman(podman, "images", "--format", "json") or "[]", "podman images", what="list")
    if not isinstance(listed, list):
        raise PruneError(f"`podman images --format json`: expected a list of images, found {type(listed).__name__}")
    images: dict[str, LocalImage] = {}
    for raw in listed:
        if not isinstance(raw, dict):
            continue
        image_id = _bare(raw.get("Id", ""))
        tags = tuple(n for n in raw.get("Names") or () if "@" not in n)
        digests = tuple(raw.get("RepoDigests") or ()) + tuple(n for n in raw.get("Names") or () if "@" in n)
        if image_id and image_id not in images:
            images[image_id] = LocalImage(image_id, tags, tuple(dict.fromkeys(digests)))
    return list(images.values())


def prune(image_name: str, *, unit_file: Path, rollback: Path, podman: str = "podman") -> Pruned:
    """Remove local images of `image_name`'s repository that neither `unit_file` nor the rollback
    record's unit copies name. Never raises for podman or the files it reads: a problem is in
    `Pruned.problems`, and when what must be kept is not known nothing is removed."""
    try:
        kept = _kept_ids(unit_file, rollback, podman)
        candidates = removable(repository_of(image_name), local_images(podman), kept)
    except (SpecdeployError, OSError) as exc:
        cause = exc.message if isinstance(exc, SpecdeployError) else str(exc)
        return Pruned([], [f"no image of {image_name} was removed: {cause}"])
    removed, problems = [], []
    for image in candidates:
        # by every tag at once: by ID podman refuses an image with several tags, and --force would
        # remove the containers that use it
        try:
            _podman(podman, "rmi", *(image.tags or (image.id,)))
        except SpecdeployError as exc:  # in use by a container, say: it stays, the others still go
            problems.append(f"{image.shown()} stays: {exc.message}")
        else:
            removed.append(image.shown())
    return Pruned(removed, problems)


def _kept_ids(unit_file: Path, rollback: Path, podman: str) -> set[str]:
    text = files.read_text(unit_file, what="engine unit", limit=files.LIMITS["json"]) if unit_file.is_file() else ""
    current = unit_images(text)
    if not current:
        raise PruneError(
            f"expected the engine unit {unit_file} to name the image it runs (Image=), found "
            f"{'no Image= line' if text else 'no unit'}: which image the engine runs is unknown"
        )
    kept = set()
    for reference in current:
        image_id = local_image_id(podman, reference)
        if image_id is None:
            raise PruneError(f"the engine unit {unit_file} runs {reference}, but it is not on this host")
        kept.add(image_id)
    for reference in rollback_images(rollback):
        image_id = local_image_id(podman, reference)
        if image_id is not None:  # gone already: nothing of it to keep
            kept.add(image_id)
    return kept
