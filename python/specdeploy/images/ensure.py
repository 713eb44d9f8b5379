"""The images stage on a host (the images role): make the profile's image present and prove it.

`ensure` builds it from the Containerfile, pulls it by the pinned registry digest, or loads a
`podman save` archive (air-gapped sites); then `check` compares its OCI labels with the
profile and runs the build guard's `inspect` inside the image (the engine version installed,
torch's CUDA): labels say what the image was built from, the inspection what it contains. Only
an image that passes has its ID recorded and its reference by digest handed to the engine
unit — an image built from another commit or version never serves.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from specdeploy.core import atomic, files
from specdeploy.core.errors import ProgramError, UsageError
from specdeploy.core.layout import GUARDS_IN_IMAGE
from specdeploy.core.references import in_registry
from specdeploy.host import cuda
from specdeploy.images import build
from specdeploy.images import lock as image_lock
from specdeploy.images import podman as podman_exe
from specdeploy.images.build import LABEL_ARGS, ImageError, image_tag, label_args, podman_run, require_image
from specdeploy.images.guards import IMAGE_LOCK as IMAGE_LOCK_IN_IMAGE
from specdeploy.images.guards import same_release
from specdeploy.profile import Profile
from specdeploy.profile.lock import Lock, require

# The base digest an image's label is checked against when neither the profile nor this host's
# lock knows it yet (an image built elsewhere, loaded or pulled here first)
UNRECORDED_BASE = "(unrecorded: taken from the image)"
DIGEST = re.compile(r"sha256:[0-9a-f]{64}")
SOURCES = ("build", "pull", "archive")


@dataclass
class LabelCheck:
    label: str  # an OCI label, or `inside: ...` for what the image's own Python reports
    expected: str
    found: str | None
    ok: bool


def inspect_inside(image: str, podman: str) -> dict[str, str | None]:
    """Run the build guard's `inspect` in the image (no GPU needed: torch is not imported)."""
    done = podman_run(podman, "run", "--rm", "--entrypoint", "python3", image, GUARDS_IN_IMAGE, "inspect")
    if done.returncode != 0:
        raise ImageError(
            f"cannot inspect {image}: `python3 {GUARDS_IN_IMAGE} inspect` failed: {done.stderr.strip()[-300:]}",
            hint="images built from this repository's Containerfiles carry the guard: specdeploy image build",
        )
    lines = done.stdout.strip().splitlines() or [""]
    try:
        found = files.loads(lines[-1])
    except files.JSONTextError as exc:
        raise ImageError(
            f"{image}: the guard's inspect printed no usable JSON ({exc.detail}): {done.stdout.strip()[-200:]!r}",
            hint="images built from this repository's Containerfiles carry the guard: specdeploy image build",
        ) from None
    if not isinstance(found, dict):
        raise ImageError(
            f"{image}: the guard's inspect printed JSON {type(found).__name__}, expected an object: "
            f"{done.stdout.strip()[-200:]!r}"
        )
    return {str(k): None if v is None else str(v) for k, v in found.items()}


def inside_rows(image: str, profile: Profile, podman: str) -> list[LabelCheck]:
    """The engine version installed in the image and torch's CUDA, against the profile."""
    try:
        found = inspect_inside(image, podman)
    except ImageError as exc:
        return [LabelCheck("inside: build_guards.py inspect", "runs", exc.message, False)]
    engine, expected = profile.engine.kind, str(profile.engine.source.version.value)
    version = found.get(engine)
    rows = [
        LabelCheck(f"inside: {engine} version", expected, version, bool(version) and same_release(version, expected))
    ]
    assert profile.engine.image is not None
    if wanted := cuda.cuda_version(profile.engine.image.base.name):
        rows.append(
            LabelCheck("inside: torch CUDA", wanted, found.get("torch_cuda"), found.get("torch_cuda") == wanted)
        )
    lock = profile.engine.image.lock
    if lock is not None or profile.engine.image.engine_wheels:  # the lock it was installed from, hashed inside it
        inside = found.get("image_lock_sha256")
        inside = image_lock.normalized(inside) if inside else None
        wanted = image_lock.expected_sha256(profile)
        expected = wanted or f"(unresolved: {lock.file if lock else '?'})"
        rows.append(LabelCheck(f"inside: {IMAGE_LOCK_IN_IMAGE} sha256", expected, inside, inside == expected))
    return rows


REFERENCE_ONLY = (
    "# REFERENCE ONLY: `pip freeze` inside {image} ({digest}), recorded by `specdeploy image freeze`.\n"
    "# The image is locked by its digest; nothing is installed from this list. Diff it between two\n"
    "# digests to see what an upstream image changed.\n"
)


def freeze(image: str, out: Path, *, podman: str = "podman") -> Path:
    """Write `pip freeze --all` from inside `image` to `out` under a reference-only header."""
    done = podman_run(podman, "run", "--rm", "--entrypoint", "python3", image, "-m", "pip", "freeze", "--all")
    if done.returncode != 0:
        raise ImageError(
            f"cannot record pip freeze in {image}: `python3 -m pip freeze` failed: {done.stderr.strip()[-300:]}",
            hint="the image needs python3 with pip; pass an image reference podman can run",
        )
    digest = build.local_digest(image, podman) or "digest unknown"
    atomic.ensure_dir(Path(out).parent if str(Path(out).parent) else Path("."))
    atomic.write_bytes(Path(out), (REFERENCE_ONLY.format(image=image, digest=digest) + done.stdout).encode("utf-8"))
    return Path(out)


def check(image: str, profile: Profile, *, lock: Lock, podman: str = "podman") -> list[LabelCheck]:
    """Compare a built image's labels with what the profile (and lock) say it must contain,
    then what it does contain (`inside_rows`)."""
    require_image(profile)
    done = podman_run(podman, "image", "inspect", "--format", "{{json .Labels}}", image)
    if done.returncode != 0:
        raise ImageError(f"no image {image}: {done.stderr.strip()[-200:]}", hint="build it with specdeploy image build")
    labels = _labels(done.stdout, podman, image)
    base_digest = lock.value(profile.name, "engine.image.base.digest")
    if profile.engine.image and profile.engine.image.base.digest.resolved:
        base_digest = profile.engine.image.base.digest.value
    expected = label_args(profile, str(base_digest) if base_digest else UNRECORDED_BASE)
    rows = []
    for label, arg in LABEL_ARGS.items():
        if arg == "IMAGE_CREATED":
            continue
        found = labels.get(label)
        if arg == "BASE_DIGEST" and not base_digest:  # nothing to compare yet: the image says
            rows.append(LabelCheck(label, UNRECORDED_BASE, found, bool(found and DIGEST.fullmatch(found))))
            continue
        rows.append(LabelCheck(label, expected[arg], found, found == expected[arg]))
    return rows + cuda_lock_rows(profile, labels) + inside_rows(image, profile, podman)


def cuda_lock_rows(profile: Profile, labels: dict[str, str]) -> list[LabelCheck]:
    """A GPU image's CUDA label against the profile's variant, and an image built from a lock: its
    lock label against the sha256 the profile pins (an unlocked image never passes)."""
    image = profile.engine.image
    assert image is not None
    rows = []
    if profile.uses_gpus and image.cuda:
        found = labels.get(build.CUDA_LABEL)
        rows.append(LabelCheck(build.CUDA_LABEL, image.cuda, found, found == image.cuda))
    if image.lock is not None or image.engine_wheels:
        found = labels.get(build.LOCK_LABEL)
        wanted = image_lock.expected_sha256(profile)
        expected = wanted or f"(unresolved in the profile: {image.lock.file if image.lock else '?'})"
        rows.append(LabelCheck(build.LOCK_LABEL, expected, found, wanted is not None and found == wanted))
    return rows


def _labels(printed: str, podman: str, image: str) -> dict[str, str]:
    """The labels `podman image inspect --format '{{json .Labels}}'` printed (null: none), or a
    ProgramError naming what it printed instead: a podman that is not podman, never a traceback."""
    why = ""
    try:
        labels = files.loads(printed or "null")
    except files.JSONTextError as exc:  # not JSON, or JSON Python will not hold: refused below like a non-object
        labels, why = printed, "" if exc.kind == "syntax" else f" ({exc.message})"
    if labels is None:
        return {}
    if not isinstance(labels, dict):
        raise ProgramError(
            f"--podman {podman}: `image inspect --format '{{{{json .Labels}}}}' {image}` printed "
            f"{printed.strip()[:200]!r}{why}, expected a JSON object of labels: "
            "this is not a podman specdeploy can use",
            hint=podman_exe.INSTALL_HINT,
        )
    return {str(k): str(v) for k, v in labels.items() if v is not None}


def record_base_digest(profile: Profile, labels: list[LabelCheck], lock: Lock, *, by: str) -> None:
    """An image loaded or pulled onto a host whose lock has no base digest yet (the profile's is
    unresolved, the build happened elsewhere): its label is the first sighting, recorded like any
    value first fetched — from then on every image on this host is compared with it."""
    row = next((r for r in labels if r.expected == UNRECORDED_BASE), None)
    if row is not None and row.ok and row.found:
        assert profile.engine.image is not None
        detail = {"name": profile.engine.image.base.name}
        lock.record(profile.name, "engine.image.base.digest", row.found, by=by, detail=detail)


# --------------------------------------------------------------------------- ensure (the images role)


def load_base(profile: Profile, archive: Path, podman: str) -> None:
    """Load the base image from an archive when the host lacks it (no registry to pull from:
    air-gapped sites, the CPU rehearsal's local base); the build then pins it by its digest."""
    assert profile.engine.image is not None
    name = profile.engine.image.base.name
    if build.local_digest(name, podman) is not None:
        return
    if not Path(archive).is_file():
        raise ImageError(f"no base image archive at {archive}", hint=f"export it where {name} exists: podman save")
    loaded = podman_run(podman, "load", "--input", str(archive))
    if loaded.returncode != 0:
        raise ImageError(f"podman load {archive} failed: {loaded.stderr.strip()[-300:]}")
    if build.local_digest(name, podman) is None:
        raise ImageError(f"{archive} does not hold {name}", hint=f"podman save -o FILE {name}")


def require_inputs(
    profile: Profile,
    *,
    source: str,
    context: Path | None,
    archive: Path | None,
    base_archive: Path | None,
    podman: str,
    driver_version: str | None,
    only_report: bool,
) -> None:
    """Every cheap refusal before podman runs or the lock is touched (exit 2, naming the option):
    the profile runs no image, an unknown --source, a --driver that is no driver version, a podman
    that is missing or not executable, and — unless only reporting (`--check`: the images role
    copies nothing then) — the input the source reads: the build context, the archive."""
    require_image(profile)
    assert profile.engine.image is not None
    if source not in SOURCES:
        raise UsageError(
            f"--source {source!r}: expected one of {', '.join(SOURCES)}; nothing was done",
            hint="--source build (from the Containerfiles, with --context), pull (by the profile's digest) "
            "or archive (a `podman save` file, with --archive)",
        )
    if driver_version:
        build.require_driver_version(driver_version)
    podman_exe.require(podman)
    if only_report:
        return
    tag = image_tag(profile)
    if source == "build":
        if context is None:
            raise UsageError(
                "--source build needs --context: the build context holding the profile's Containerfile",
                hint="pass --context DIR (the images role passes the context it copies)",
            )
        build.require_context(profile, context)
        if base_archive is not None:
            files.regular_file(
                base_archive,
                option="--base-archive",
                what=f"an archive of the base image {profile.engine.image.base.name}",
                hint=f"export it where the base exists: podman save -o FILE {profile.engine.image.base.name}",
            )
    elif source == "archive":
        hint = f"export it where the image was built: podman save -o FILE {tag}"
        if archive is None:
            raise UsageError("--source archive needs --archive: the image archive to load", hint=hint)
        files.regular_file(archive, option="--archive", what=f"an image archive holding {tag}", hint=hint)


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
    base_archive: Path | None = None,
    podman: str = "podman",
    driver_version: str | None = None,
    only_report: bool = False,
    cert_dir: Path | None = None,
    registry: str | None = None,
) -> Ensured:
    """Make the profile's image present on this host — built from the Containerfile, pulled by
    the pinned digest, or loaded from an archive (air-gapped sites) — then prove its labels
    match the profile and return the reference by digest the engine unit must run."""
    require_inputs(
        profile,
        source=source,
        context=context,
        archive=archive,
        base_archive=base_archive,
        podman=podman,
        driver_version=driver_version,
        only_report=only_report,
    )
    assert profile.engine.image is not None
    tag = image_tag(profile)
    action = "present"
    # pull: present means present at the pinned digest (a new push under the same tag is pulled)
    wanted = require(profile, "engine.image.digest", lock) if source == "pull" else None
    present = build.local_digest(tag, podman) is not None and (
        wanted is None or _at_digest(tag, profile, wanted, podman)
    )
    if only_report:  # `ansible-playbook --check`: say what would happen, change nothing (no lock record)
        if not present:
            return Ensured(tag, f"{profile.engine.image.name}@(not yet {source})", f"would {source}", "", [])
        digest = build.local_digest(tag, podman)
        return Ensured(
            tag, f"{profile.engine.image.name}@{digest}", action, "", check(tag, profile, lock=lock, podman=podman)
        )

    def acquire() -> str:
        assert profile.engine.image is not None
        if source == "build":
            assert context is not None
            if base_archive is not None:
                load_base(profile, base_archive, podman)
            build.build(profile, lock=lock, context=context, podman=podman, driver_version=driver_version)
            return "built"
        if source == "pull":
            remote = f"{in_registry(profile.engine.image.name, registry)}@{wanted}"
            cert = ["--cert-dir", str(cert_dir)] if cert_dir is not None else []
            pulled = podman_run(podman, "pull", "--quiet", *cert, remote)
            if pulled.returncode != 0:
                raise ImageError(
                    f"cannot pull {remote}: {pulled.stderr.strip()[-300:]}",
                    hint="push it from the builder first (specdeploy image push --registry ...), check the digest "
                    "the lock holds, and that this host trusts the registry (images_registry_ca_src)",
                )
            podman_run(podman, "tag", remote, tag)  # the profile's name: the engine unit runs NAME@DIGEST
            return "pulled"
        assert archive is not None
        loaded = podman_run(podman, "load", "--input", str(archive))
        if loaded.returncode != 0:
            raise ImageError(f"podman load {archive} failed: {loaded.stderr.strip()[-300:]}")
        return "loaded"

    if not present:
        action = acquire()
    elif source != "pull" and not all(row.ok for row in check(tag, profile, lock=lock, podman=podman)):
        # an image of other inputs under the same tag (a lock bump, a new build arg): replaced by one
        # of this profile's, which must then pass the check
        action = acquire()
    digest = build.local_digest(tag, podman)
    if digest is None:
        raise ImageError(
            f"{tag} is not on this host after {action}",
            hint="an archive must contain the image under this tag (the profile's engine version)",
        )
    labels = check(tag, profile, lock=lock, podman=podman)
    image_id = f"sha256:{build.local_id(tag, podman)}"
    keep_name(tag, image_id, podman)
    if all(label.ok for label in labels):  # never record the ID of an image that failed its check
        build.record_image_id(lock, profile, image_id, by=f"image ensure ({action})")
        record_base_digest(profile, labels, lock, by=f"image ensure ({action}): the image's base label")
    return Ensured(tag, f"{profile.engine.image.name}@{digest}", action, image_id, labels)


def _at_digest(tag: str, profile: Profile, digest: str, podman: str) -> bool:
    """Whether the local image `tag` is the one at `digest` (pulled earlier under the profile's name)."""
    assert profile.engine.image is not None
    pinned = podman_run(podman, "image", "inspect", "--format", "{{.Id}}", f"{profile.engine.image.name}@{digest}")
    return pinned.returncode == 0 and pinned.stdout.strip() == build.local_id(tag, podman)


ID_TAG = "id-"  # NAME:id-<12 hex of the image ID>: the tag that keeps an image's NAME@DIGEST resolvable


def keep_name(tag: str, image_id: str, podman: str) -> None:
    """Tag the image `NAME:id-<its ID>` as well. The engine unit runs `NAME@DIGEST`, which podman
    resolves only while the image has a name in NAME's repository; the version tag moves to the next
    image a deploy builds or pulls, and without a name of its own the previous image — the one the
    rollback puts back — would no longer start ("pinging container registry localhost")."""
    name = tag.rsplit(":", 1)[0]
    done = podman_run(
        podman, "tag", image_id.removeprefix("sha256:"), f"{name}:{ID_TAG}{image_id.removeprefix('sha256:')[:12]}"
    )
    if done.returncode != 0:
        raise ImageError(f"podman tag {image_id} failed: {done.stderr.strip()[-300:]}")
