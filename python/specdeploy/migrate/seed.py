"""`migrate prepare`'s weights: NEW's models directory seeded host to host from OLD, file by file.

Failure prevented: the field's host move fetched the gated weights again by hand (a new token, a
day of downloads, and a revision nobody checked). NEW gets exactly the revisions OLD serves: every
file the site's lock lists for the profile (`<role>.files@<revision>`: file -> sha256) is streamed
from OLD to NEW through the controller, verified against the lock on NEW, and only then renamed
into place. An interrupted seed resumes: a file NEW already holds with the lock's hash is not
copied again, a partial one (`<file>.seed-part`) continues from its size. The weights role then
only verifies (the files are where the hub fetch would put them).

| NEW holds | seed does |
|---|---|
| the file, with the lock's sha256 | nothing (counted as verified) |
| `<file>.seed-part` of n bytes | copies from byte n on, verifies the whole file (no prefix: again from 0) |
| nothing | copies it, then verifies |
| a file with another hash | replaces it (copy, verify, rename) |
| a copy whose hash still differs from the lock | stops: OLD's file differs from the lock; nothing renamed |

The transport is a `Side` (a host's files): `FabricSide` over SSH/SFTP for real hosts, `LocalSide`
for a directory on the controller (a site mirror on a mounted disk; the unit tests).
"""

from __future__ import annotations

import posixpath
import shlex
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any, Protocol

from specdeploy.core import files
from specdeploy.core.errors import SpecdeployError
from specdeploy.core.progress import observe
from specdeploy.profile import Profile
from specdeploy.profile.lock import Lock, files_key, recorded_files
from specdeploy.weights.fetch import models_of

CHUNK = 4 << 20
PART = ".seed-part"


class SeedError(SpecdeployError):
    exit_code = 1


class Side(Protocol):
    """One host's files, by absolute POSIX path."""

    name: str

    def size(self, path: str) -> int | None: ...
    def sha256(self, path: str) -> str | None: ...
    def reader(self, path: str, offset: int) -> IO[bytes]: ...
    def appender(self, path: str) -> IO[bytes]: ...
    def makedirs(self, path: str) -> None: ...
    def rename(self, source: str, target: str) -> None: ...


@dataclass
class LocalSide:
    """A directory tree on this machine standing for a host's root (`root` + the absolute path)."""

    root: Path
    name: str = "local"

    def _p(self, path: str) -> Path:
        return self.root / path.lstrip("/")

    def size(self, path: str) -> int | None:
        p = self._p(path)
        return p.stat().st_size if p.is_file() else None

    def sha256(self, path: str) -> str | None:
        p = self._p(path)
        if not p.is_file():
            return None
        return files.sha256_file(p, follow=True)

    def reader(self, path: str, offset: int) -> IO[bytes]:
        f = self._p(path).open("rb")
        f.seek(offset)
        return f

    def appender(self, path: str) -> IO[bytes]:
        return self._p(path).open("ab")

    def makedirs(self, path: str) -> None:
        self._p(path).mkdir(parents=True, exist_ok=True)

    def rename(self, source: str, target: str) -> None:
        self._p(source).replace(self._p(target))


class FabricSide:
    """A host reached with Fabric: SFTP for the bytes, `sha256sum` on the host for the hashes (the
    file never travels back to be hashed)."""

    def __init__(self, connection: Any, name: str) -> None:
        self.connection = connection
        self.name = name
        self._sftp = None

    @property
    def sftp(self) -> Any:
        if self._sftp is None:
            self._sftp = self.connection.sftp()
        return self._sftp

    def size(self, path: str) -> int | None:
        try:
            return int(self.sftp.stat(path).st_size)
        except FileNotFoundError:
            return None

    def sha256(self, path: str) -> str | None:
        done = self.connection.run(f"sha256sum -- {shlex.quote(path)}", hide=True, warn=True, in_stream=False)
        if not done.ok:
            return None
        return done.stdout.split()[0]

    def reader(self, path: str, offset: int) -> IO[bytes]:
        f = self.sftp.open(path, "rb")
        f.seek(offset)
        f.prefetch()
        return f

    def appender(self, path: str) -> IO[bytes]:
        f = self.sftp.open(path, "ab")
        f.set_pipelined(True)  # writes do not wait one round trip each (GBs of an image); errors come at close
        return f

    def makedirs(self, path: str) -> None:
        self.connection.run(f"mkdir -p -- {shlex.quote(path)}", hide=True, in_stream=False)

    def rename(self, source: str, target: str) -> None:
        self.sftp.posix_rename(source, target)


@dataclass(frozen=True)
class SeedFile:
    role: str
    revision: str
    path: str  # absolute on NEW; the same on OLD for weights (the host layout's models root)
    sha256: str
    source: str | None = None  # the path on OLD when it differs (an image archive saved there)

    @property
    def source_path(self) -> str:
        return self.source or self.path


@dataclass
class SeedResult:
    files: list[dict[str, Any]] = field(default_factory=list)

    @property
    def bytes_copied(self) -> int:
        return sum(f["bytes_copied"] for f in self.files)

    @property
    def copied(self) -> int:
        return sum(1 for f in self.files if f["action"] != "already verified")

    def to_json(self) -> dict[str, Any]:
        return {
            "files": self.files,
            "bytes_copied": self.bytes_copied,
            "copied": self.copied,
            "already_verified": len(self.files) - self.copied,
        }


def planned_files(profile: Profile, lock: Lock, models: str, revisions: dict[str, str]) -> list[SeedFile]:
    """Every file the lock lists for the revisions OLD serves (`revisions`: role -> revision)."""
    found = []
    for role, ref in models_of(profile):
        revision = revisions.get(role)
        if revision is None:
            raise SeedError(
                f"profile {profile.name}: OLD serves no {role} revision that can be named; nothing was copied",
                hint="run `migrate plan` again: it reads the revisions from OLD's serving links",
            )
        listed = recorded_files(lock, profile.name, role, revision, consequence="nothing was copied")
        if not listed:
            raise SeedError(
                f"the site's lock has no {files_key(role, revision)} entry for profile {profile.name}: the files of "
                f"{ref.repo}@{revision} cannot be verified on NEW; nothing was copied",
                hint="deploy OLD once more with this lock (its gate records the entry), then `specdeploy lock merge`",
            )
        base = posixpath.join(models, ref.repo, revision)
        origin = f"the site's lock, entry {files_key(role, revision)} of profile {profile.name}"
        found += [
            SeedFile(role, revision, posixpath.join(base, files.relative_name(name, origin=origin)), str(sha))
            for name, sha in sorted(listed.items())
        ]
    return found


def _copy(old: Side, new: Side, item: SeedFile, progress: Callable[[int], None]) -> int:
    part = item.path + PART
    start = new.size(part) or 0
    total = old.size(item.source_path)
    if total is None:
        raise SeedError(
            f"{old.name}: {item.source_path} is missing; OLD serves a revision whose file is gone",
            hint=f"check OLD's weights (`specdeploy weights verify` on {old.name}); traffic stays on OLD",
        )
    if start > total:  # a part longer than the file: not a prefix of it
        start = 0
        with new.appender(part) as f:
            f.truncate(0)
    copied = 0
    with old.reader(item.source_path, start) as src, new.appender(part) as dst:
        for block in iter(lambda: src.read(CHUNK), b""):
            dst.write(block)
            copied += len(block)
            progress(len(block))
    return copied


def seed(
    old: Side,
    new: Side,
    items: list[SeedFile],
    *,
    progress: Callable[[int], None] = lambda n: None,
) -> SeedResult:
    """Copy what NEW lacks, verify every file against the lock on NEW, rename into place."""
    result = SeedResult()
    for item in items:
        try:
            _one(old, new, item, result, progress)
        except OSError as exc:  # SFTP and local I/O: a disk full, a permission, a path taken by a directory
            raise SeedError(
                f"{item.path}: copying from {old.name} to {new.name} failed: {exc.strerror or exc}; "
                f"{len(result.files)} of {len(items)} files are in place and verified",
                hint="fix what the error names on the host, then run `migrate prepare` again: verified files "
                "are not copied again and a partial file resumes",
            ) from None
    return result


def _one(old: Side, new: Side, item: SeedFile, result: SeedResult, progress: Callable[[int], None]) -> None:
    observe(f"verifying {item.path} on {new.name} (sha256 of what is there)")
    if new.sha256(item.path) == item.sha256:
        result.files.append({"path": item.path, "action": "already verified", "bytes_copied": 0})
        return
    new.makedirs(posixpath.dirname(item.path))
    resumed = new.size(item.path + PART) or 0
    copied = _copy(old, new, item, progress)
    observe(f"verifying the copy of {item.path} on {new.name}")
    found = new.sha256(item.path + PART)
    if found != item.sha256 and resumed:  # the part was no prefix of OLD's file: once more from byte 0
        with new.appender(item.path + PART) as f:
            f.truncate(0)
        copied += _copy(old, new, item, progress)
        found = new.sha256(item.path + PART)
    if found != item.sha256:
        raise SeedError(
            f"{item.path}: copied from {old.name}, its sha256 on {new.name} is {found}, the lock says "
            f"{item.sha256}: {old.name}'s file differs from the lock; it was not put in place",
            hint=f"{old.name}'s weights are damaged: verify them there (`specdeploy weights verify`) before "
            "anything else; traffic stays on OLD. Or seed from another copy: `migrate prepare --seed-from HOST` "
            "(docs/migration.md)",
        )
    new.rename(item.path + PART, item.path)
    action = f"resumed at byte {resumed}" if resumed else "copied"
    result.files.append({"path": item.path, "action": action, "bytes_copied": copied})


def iter_sizes(side: Side, items: list[SeedFile]) -> Iterator[int]:
    for item in items:
        yield side.size(item.path) or 0
