"""The engine image's lock: a hashed requirements file per profile and CUDA variant.

Failures prevented (issue 21): the PR build's runtime stage resolved every dependency of vLLM
from PyPI at build time (two builds of one profile, two different images), and PyPI's torch
2.11.0 is the CUDA 13.0 build that the A6000 hosts' pre-R580 drivers cannot run. Here the image
installs `locks/images/<profile>-cu<NNN>.txt` with `pip --require-hashes --no-deps`: exact
versions and sha256, torch from the index serving the profile's CUDA. `specdeploy image lock`
produces or refreshes it with uv (`uv pip compile --generate-hashes`, for the image's Python
and platform, the torch index first); where an index cannot be reached it fails saying so, and
the lock stays `unresolved` in the profile — never written from a guess. `image build` refuses a
profile whose lock is unresolved, missing, or not the file the profile's sha256 names.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

from specdeploy.core import atomic, files
from specdeploy.core.errors import ProgramError, SpecdeployError
from specdeploy.profile import Profile
from specdeploy.profile.schema import ImageLock

UNLOCKED = "unlocked"  # the lock label of an image built with `image build --unlocked`
UV_HINT = "uv is in the dev venv (locks/dev.txt, scripts/setup.sh); elsewhere install uv, or pass --uv PATH"
# what uv prints when it cannot reach an index (connection refused, DNS, TLS, timeouts, HTTP errors)
_UNREACHABLE = re.compile(
    r"error sending request|Failed to fetch|tcp connect error|dns error|Connection refused|"
    r"failed to lookup address|Could not connect|operation timed out|certificate|HTTP status (?:client|server) error|"
    r"Network is unreachable|No route to host",
    re.IGNORECASE,
)
_REQUIREMENT = re.compile(r"^([A-Za-z0-9][A-Za-z0-9._-]*)(\[[^\]]*\])?==(\S+)$")


class ImageLockError(SpecdeployError):
    """The image lock is unresolved, missing, not what the profile pins, or cannot be produced
    (bad input or an unreachable index: exit 2 — nothing was built or written)."""

    exit_code = 2


def spec(profile: Profile) -> ImageLock:
    """The profile's image lock section, or an ImageLockError saying the profile has none."""
    image = profile.engine.image
    if image is None or image.lock is None:
        what = "runs no container image" if image is None else f"builds on the upstream image {image.base.name}"
        raise ImageLockError(
            f"profile {profile.name}: field engine.image.lock: expected an image lock section, found none (the "
            f"profile {what}, locked by its digest); there is nothing to lock",
            hint="image locks are for images built from source (e.g. a6000-dflash); an upstream image's own "
            "packages can be recorded for reference with `specdeploy image freeze`",
        )
    return image.lock


def file_sha256(path: Path) -> str:
    return "sha256:" + files.sha256_file(path, follow=True)


def normalized(digest: str) -> str:
    return digest if digest.startswith("sha256:") else f"sha256:{digest}"


@dataclass(frozen=True)
class Locked:
    name: str
    version: str
    hashes: tuple[str, ...]


def parse(text: str, origin: str) -> list[Locked]:
    """Every requirement of a lock: each `name==version` with at least one `--hash=sha256:`;
    anything else (a range, a URL, a requirement without hash) is refused naming its line."""
    logical: list[tuple[int, str]] = []
    pending, start = "", 0
    for number, raw in enumerate(text.splitlines(), 1):
        line = raw.split(" #", 1)[0].strip() if not raw.lstrip().startswith("#") else ""
        if not line:
            continue
        if not pending:
            start = number
        if line.endswith("\\"):
            pending += line[:-1] + " "
            continue
        logical.append((start, pending + line))
        pending = ""
    if pending:
        logical.append((start, pending))
    found = []
    for number, line in logical:
        if line.startswith("-"):  # --index-url / --extra-index-url emitted by uv
            continue
        words = line.split()
        match = _REQUIREMENT.match(words[0])
        hashes = tuple(w.split("=", 1)[1] for w in words[1:] if w.startswith("--hash=sha256:"))
        if match is None or not hashes:
            why = "an exact name==version" if match is None else "at least one --hash=sha256:"
            raise ImageLockError(
                f"{origin}: line {number}: expected {why}, found {line[:120]!r}: a lock installs exact files only",
                hint="regenerate it with `specdeploy image lock --profile NAME` instead of editing it by hand",
            )
        found.append(Locked(match.group(1).lower(), match.group(3), hashes))
    if not found:
        raise ImageLockError(
            f"{origin}: the lock holds no requirement", hint="regenerate it with `specdeploy image lock`"
        )
    return found


def require(profile: Profile, context: Path) -> tuple[str, str]:
    """(the lock's path in the build context, its sha256) for `image build`: refused (exit 2) when
    the profile's lock is unresolved, the file is missing, unreadable, not a hashed lock, or
    another file than the sha256 the profile pins."""
    lock = spec(profile)
    path = Path(context) / lock.file
    if not lock.resolved:
        raise ImageLockError(
            f"profile {profile.name}: field engine.image.lock ({lock.file}) is unresolved: the image would resolve "
            "its dependencies at build time; nothing was built",
            hint=f"produce it with `specdeploy image lock --profile {profile.name}` where {lock.torch_index} is "
            f"reachable and pin its sha256 in the profile ({lock.source}); or build an image labelled unlocked "
            "with `specdeploy image build --unlocked` (never deployed by the images role)",
        )
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        why = "nothing there" if isinstance(exc, FileNotFoundError) else str(getattr(exc, "strerror", None) or exc)
        raise ImageLockError(
            f"profile {profile.name}: field engine.image.lock: expected the lock file {path}, found {why}; "
            "nothing was built",
            hint=f"pass the checkout holding {lock.file} as --context, or regenerate it with "
            f"`specdeploy image lock --profile {profile.name}`",
        ) from None
    parse(text, str(path))
    found, expected = file_sha256(path), normalized(str(lock.value))
    if found != expected:
        raise ImageLockError(
            f"profile {profile.name}: field engine.image.lock: expected {lock.file} with {expected}, found {found}: "
            "the file is not the lock the profile pins; nothing was built",
            hint="a refreshed lock is pinned deliberately: review its diff, then set engine.image.lock.value to the "
            "new sha256 (or restore the file from version control)",
        )
    return lock.file, expected


# --------------------------------------------------------------------------- producing it (uv)


def find_uv(uv: str | None) -> str:
    """The uv to run: --uv, else uv on PATH, else the one beside this Python (the dev venv)."""
    candidates = [uv] if uv else [shutil.which("uv"), str(Path(sys.executable).parent / "uv")]
    for candidate in candidates:
        if candidate and os.path.isfile(candidate) and os.access(candidate, os.X_OK):
            return candidate
        if uv and candidate and os.sep not in candidate and shutil.which(candidate):
            return str(shutil.which(candidate))
    raise ProgramError(
        f"--uv {uv}: expected an executable uv, found none there; nothing was locked"
        if uv
        else "expected uv on PATH or beside this Python, found none; nothing was locked",
        hint=UV_HINT,
    )


def header(profile: Profile, lock: ImageLock, uv_version: str) -> str:
    assert profile.engine.image is not None
    return (
        f"# specdeploy image lock: profile {profile.name}, CUDA {profile.engine.image.cuda} "
        f"(base {profile.engine.image.base.name})\n"
        f"# produced by `specdeploy image lock` with {uv_version} for Python {lock.python} on {lock.platform}\n"
        f"# torch from {lock.torch_index}; everything else from {lock.index}\n"
        "# installed with pip --require-hashes --no-deps: nothing is resolved when the image is built\n"
    )


@dataclass
class Produced:
    path: Path
    sha256: str
    previous: str | None  # the file's sha256 before this run, when it existed
    requirements: int


def uv_argv(uv: str, profile: Profile, requirements_in: Path, output: Path, inputs: list[Path]) -> list[str]:
    lock = spec(profile)
    return [
        uv,
        "pip",
        "compile",
        "--no-config",  # uv ignores pip's configuration; a uv.toml must not add an index either
        "--generate-hashes",
        "--emit-index-url",  # pip installs from the lock's own index lines: torch from the CUDA index
        "--no-header",
        "--quiet",
        "--python-version",
        lock.python,
        "--python-platform",
        lock.platform,
        "--index-url",
        lock.index,
        # uv prefers --extra-index-url over --index-url: torch and the nvidia-* wheels from the CUDA index
        "--extra-index-url",
        lock.torch_index,
        "--output-file",
        str(output),
        str(requirements_in),
        *map(str, inputs),
    ]


def produce(
    profile: Profile,
    *,
    context: Path,
    uv: str | None = None,
    inputs: list[Path] | None = None,
    timeout_s: float = 1800,
) -> Produced:
    """Resolve the profile's image lock with uv and write it atomically to <context>/<lock.file>.
    An unreachable index is an ImageLockError naming it; the file is not touched then."""
    lock = spec(profile)
    for extra in inputs or []:
        if not Path(extra).is_file():
            found = "a directory" if Path(extra).is_dir() else "nothing"
            raise ImageLockError(
                f"--input {extra}: expected a requirements file, found {found}; nothing was locked",
                hint="pass e.g. <vLLM checkout at the pinned commit>/requirements/cuda.txt",
            )
    program = find_uv(uv)
    target = Path(context) / lock.file
    previous = file_sha256(target) if target.is_file() else None
    with tempfile.TemporaryDirectory(prefix="specdeploy-image-lock-") as tmp:
        requirements_in = Path(tmp) / "requirements.in"
        requirements_in.write_text("".join(f"{r}\n" for r in lock.requires), encoding="utf-8")
        output = Path(tmp) / "lock.txt"
        argv = uv_argv(program, profile, requirements_in, output, list(inputs or []))
        try:
            version = subprocess.run([program, "--version"], capture_output=True, text=True, timeout=60).stdout.strip()
            done = subprocess.run(argv, capture_output=True, text=True, timeout=timeout_s)
        except subprocess.TimeoutExpired:
            raise ImageLockError(
                f"uv did not finish resolving within {timeout_s:g} s; {lock.file} stays as it was "
                f"({'unresolved' if not lock.resolved else 'the pinned lock'})",
                hint=f"check that {lock.torch_index} and {lock.index} answer from this machine",
            ) from None
        except OSError as exc:
            raise ProgramError(
                f"{program}: cannot run it: {exc.strerror or exc}; nothing was locked", hint=UV_HINT
            ) from None
        if done.returncode != 0:
            detail = " ".join(done.stderr.split())[-600:]
            if _UNREACHABLE.search(done.stderr):
                raise ImageLockError(
                    f"profile {profile.name}: cannot reach the indexes the image lock comes from ({lock.torch_index} "
                    f"for torch, {lock.index} for the rest): {detail}; the lock stays unresolved "
                    f"(field engine.image.lock, {lock.file} not written)",
                    hint="run `specdeploy image lock` on a machine that reaches both indexes (PyTorch's CUDA indexes "
                    "are not reachable from this project's CI machines), commit the file and pin its sha256",
                )
            raise ImageLockError(
                f"profile {profile.name}: uv could not resolve the image lock: {detail}; {lock.file} not written",
                hint="check engine.image.lock.requires (and the --input files) against the engine's requirements",
            )
        body = output.read_text(encoding="utf-8")
        text = header(profile, lock, version or "uv") + body
        requirements = parse(text, f"uv's output for {lock.file}")
        atomic.ensure_dir(target.parent)
        atomic.write_bytes(target, text.encode("utf-8"))
    return Produced(target, file_sha256(target), previous, len(requirements))


# --------------------------------------------------------------------------- an engine archive's lock


def engine_lock_file(profile: Profile) -> Path | None:
    """The hashed lock an image with `engine_wheels` installs from (the wheelhouse's engine archive
    holds a copy as requirements.lock): `locks/engine-PACKAGE-VERSION.txt`, shipped inside the CLI's
    wheel (`specdeploy/locks`) and found in the checkout; None for an image of another kind."""
    image = profile.engine.image
    if image is None or not image.engine_wheels:
        return None
    name = f"engine-{profile.engine.source.package or profile.engine.kind}-{profile.engine.source.version.value}.txt"
    package = Path(__file__).resolve().parents[1]  # .../specdeploy
    for directory in (package / "locks", package.parents[1] / "locks"):
        if (directory / name).is_file():
            return directory / name
    raise SpecdeployError(
        f"profile {profile.name}: its image installs the engine's wheels from the lock locks/{name}, which this "
        "specdeploy does not ship; nothing was built or checked",
        hint=f"produce it on the controller (scripts/lock.sh {name.removesuffix('.txt')}), commit it and rebuild "
        "the CLI's wheel (scripts/wheelhouse.sh)",
    )


def expected_sha256(profile: Profile) -> str | None:
    """The sha256 the image's lock must have: the profile's pinned image lock, or its engine
    archive's lock file; None when the image installs no lock (an upstream image, by digest)."""
    image = profile.engine.image
    if image is None:
        return None
    if image.lock is not None:
        return normalized(str(image.lock.value)) if image.lock.resolved else None
    engine_lock = engine_lock_file(profile)
    return file_sha256(engine_lock) if engine_lock is not None else None
