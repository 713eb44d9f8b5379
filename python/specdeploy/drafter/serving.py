"""Build the drafter's serving directory from a verified download: `write-config`.

In the field a corrected config.json "did not take effect": it never landed where the engine
read. The engine reads a serving directory — never the download cache — that holds the
verified config.json and links to the verified weights; it is written atomically, read back
and verified again, and what it replaced is kept for a rollback.

The write is one transaction. The new state — config.json and every weight link together — is
built aside in `drafter-builds/`, then switched in by one symlink flip of the serving path,
read back and verified there; only then is the keeper's copy recorded and the lock's hash
written. A failure at any step (a regular file where the serving link goes, a full disk, a
read-only directory, a read-back that differs) switches back and removes what was built, so
nothing visible changes, and the message says exactly that; a failed write never records a
hash in the lock, so it cannot make a later, correct source look like drift.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import json
import os
import shutil
import stat
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from specdeploy.core import atomic, files, layout
from specdeploy.core.errors import SpecdeployError, UnresolvedPinError, UsageError, WriteError
from specdeploy.core.keeper import Keeper, Staged
from specdeploy.drafter.verify import (
    CONFIG_NAME,
    LOCK_KEY,
    Report,
    VerificationFailed,
    config_file,
    read_config,
    verify,
)
from specdeploy.profile import Profile
from specdeploy.profile.lock import Lock


class ServingPathError(SpecdeployError):
    """The serving path, its parent or the builds directory is not what write-config writes
    (a regular file where the link or a directory goes): bad input, exit 2, nothing written."""

    exit_code = 2


_CAUSES = {
    errno.EROFS: ("the filesystem is mounted read-only", "remount it read-write"),
    errno.ENOSPC: ("the filesystem is full", "free space on it"),
    errno.EDQUOT: ("the disk quota is exhausted", "free space or raise the quota"),
    errno.EACCES: ("permission denied", "run as a user that may write there (root on a host) or fix its ownership"),
    errno.EPERM: (
        "operation not permitted",
        "run as a user that may write there (root on a host) or fix its ownership",
    ),
}


def _failed(serving_dir: Path, where: Path, exc: OSError) -> WriteError:
    """A write that failed at the OS, as write-config reports it: true to what is left."""
    cause, fix = _CAUSES.get(exc.errno or 0, (exc.strerror or str(exc), "check the path and its filesystem"))
    code = errno.errorcode.get(exc.errno or 0, exc.errno)
    return WriteError(
        f"could not write the drafter's serving state: {where}: {cause} ({code}); nothing was changed: "
        f"{serving_dir} still serves what it served before and the lock records nothing new",
        hint=f"{fix}, then run write-config again",
    )


@dataclass
class WriteResult:
    serving_dir: str
    config_changed: bool
    links_changed: list[str]
    links_removed: list[str]
    canonical_sha256: str
    lock_recorded: bool
    report: Report


def _refuse_unresolved(profile: Profile) -> None:
    assert profile.drafter is not None and profile.drafter.config is not None
    missing = [f"drafter.config.expected.{n}" for n, p in profile.drafter.config.expected.items() if not p.resolved]
    if missing:
        raise UnresolvedPinError(
            f"profile {profile.name}: refusing to write a config whose content is unresolved: " + ", ".join(missing),
            hint="pin each field's value (with its provenance) in the profile; specdeploy never guesses",
        )


def _follow(path: Path) -> Path:
    """Where a link (such as <serving>/drafter-source) points, followed lexically: a models root
    reached through a symlink keeps the path the container mounts, which resolve() would lose."""
    seen = 0
    while path.is_symlink() and seen < 40:
        path = Path(os.path.normpath(path.parent / os.readlink(path)))
        seen += 1
    return path.absolute()


def _wanted_links(build: Path, source: Path) -> dict[str, str]:
    """One relative link per source file (weights, tokenizer, ...), as seen from a build directory:
    valid on the host and in a container mounting the models and serving dirs (weights.store)."""
    return {
        p.name: os.path.relpath(p, build)  # lexical: the paths the container mounts, not physical ones
        for p in sorted(source.iterdir())
        if p.is_file() and p.name != CONFIG_NAME and not p.name.startswith(".")
    }


def _current(serving: Path, raw: bytes) -> tuple[bool, dict[str, str]]:
    """What the serving link shows now: whether its config.json holds `raw` already (compared
    by size first, so a huge hand-placed file is never read) and its links by name."""
    if not serving.is_dir():
        return False, {}
    config = serving / CONFIG_NAME
    try:
        info = config.lstat()
        same = stat.S_ISREG(info.st_mode) and info.st_size == len(raw) and config.read_bytes() == raw
        links = {e.name: os.readlink(e) for e in serving.iterdir() if e.is_symlink()}
    except OSError:
        return False, {}  # unreadable: rebuilt from the source
    return same, links


def _build(builds: Path, raw: bytes, links: dict[str, str]) -> Path:
    """A new build directory holding config.json and the links, complete before it is named.
    Raises OSError (the caller reports it); removes its temporary directory on any failure."""
    builds.mkdir(parents=True, exist_ok=True)
    digest = hashlib.sha256(raw + json.dumps(links, sort_keys=True).encode()).hexdigest()[:12]
    final = builds / f"{digest}-{time.time_ns()}"
    tmp = builds / f".{final.name}.tmp"
    try:
        tmp.mkdir()
        fd = os.open(tmp / CONFIG_NAME, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        try:
            os.fchmod(fd, 0o644)
            view = memoryview(raw)
            while view:
                view = view[os.write(fd, view) :]
            os.fsync(fd)
        finally:
            os.close(fd)
        for name, target in links.items():
            os.symlink(target, tmp / name)
        atomic.fsync_dir(tmp)
        tmp.rename(final)
        atomic.fsync_dir(builds)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return final


def _read_back(serving: Path, raw: bytes) -> None:
    """Prove the write landed: re-read from disk and compare bytes, then check every link."""
    on_disk = (serving / CONFIG_NAME).read_bytes()
    if on_disk != raw:
        raise WriteError(
            f"{serving / CONFIG_NAME} does not hold what was just written "
            f"(sha256 {hashlib.sha256(on_disk).hexdigest()[:12]} != {hashlib.sha256(raw).hexdigest()[:12]})",
            hint="something else writes this path or the mount is not what it seems; "
            "check `findmnt` and other writers before serving",
        )
    for link in serving.iterdir():
        if link.is_symlink() and not link.exists():
            raise WriteError(f"{link} points at {link.readlink()}, which does not exist")


def _kind(path: Path) -> str | None:
    """What is at `path` when it is neither a directory nor a symlink (None otherwise or absent)."""
    found = files.kind_of(path, follow=False)
    return None if found in (None, "a directory", "a symbolic link") else found


def _check_paths(serving_dir: Path, builds: Path) -> None:
    """Refuse, before anything is written, a path that is not what write-config writes."""
    found = _kind(serving_dir)
    if found is not None:
        raise ServingPathError(
            f"serving path {serving_dir}: expected the drafter's serving link (or nothing yet), found {found}; "
            "nothing was written",
            hint=f"move {serving_dir} away (write-config never deletes what it did not write), or pass the "
            f"drafter's serving link (<serving>/{layout.DRAFTER_SERVING})",
        )
    if serving_dir.is_dir() and not serving_dir.is_symlink():
        # a serving directory from before drafter-builds: write-config wrote config.json and links
        # into it, and replaces it whole; anything else in it was put there by someone else
        for entry in sorted(serving_dir.iterdir()):
            if entry.is_symlink() or (entry.name == CONFIG_NAME and _kind(entry) == "a regular file"):
                continue
            found = "a directory" if entry.is_dir() else _kind(entry) or "something"
            raise ServingPathError(
                f"serving directory {serving_dir}: found {found} {entry.name} where a link to the download goes "
                "(write-config writes only config.json and links there, and replaces the directory whole); "
                "nothing was written",
                hint=f"move {entry} away (or to the download, if it belongs there), then run write-config again",
            )
    for ancestor in serving_dir.absolute().parents:
        if os.path.lexists(ancestor):
            if not ancestor.is_dir():
                raise ServingPathError(
                    f"serving path {serving_dir}: {ancestor} is {_kind(ancestor) or 'not a directory'}, "
                    "not a directory; nothing was written",
                    hint=f"pass a serving path inside a directory, or move {ancestor} away",
                )
            break
    if os.path.lexists(builds) and not builds.is_dir():
        raise ServingPathError(
            f"{builds} (where write-config builds each version of {serving_dir}) is "
            f"{_kind(builds) or 'a link to no directory'}, not a directory; nothing was written",
            hint=f"move {builds} away; write-config creates it",
        )


def _first_missing(path: Path) -> Path | None:
    """The outermost ancestor of `path` (or `path`) that does not exist: what a mkdir -p creates."""
    missing = None
    for p in [path, *path.parents]:
        if os.path.lexists(p):
            break
        missing = p
    return missing


def _switch(serving_dir: Path, build: Path) -> tuple[Callable[[], None], Path | None]:
    """Point the serving path at `build` in one rename; return how to undo it, and a directory
    from before builds that was moved aside (removed once everything else succeeded)."""
    target = os.path.relpath(build, serving_dir.parent)
    tmp = serving_dir.parent / f".{serving_dir.name}.{os.getpid()}.lnk"
    with contextlib.suppress(FileNotFoundError):
        tmp.unlink()
    os.symlink(target, tmp)
    try:
        if serving_dir.is_symlink():
            before = os.readlink(serving_dir)
            os.replace(tmp, serving_dir)

            def undo_link() -> None:
                os.symlink(before, tmp)
                os.replace(tmp, serving_dir)

            return undo_link, None
        if serving_dir.is_dir():  # a directory from before builds: moved aside, put back on failure
            aside = serving_dir.parent / f".{serving_dir.name}.replaced-{time.time_ns()}"
            os.rename(serving_dir, aside)
            try:
                os.replace(tmp, serving_dir)
            except BaseException:
                os.rename(aside, serving_dir)
                raise

            def undo_dir() -> None:
                serving_dir.unlink()
                os.rename(aside, serving_dir)

            return undo_dir, aside
        os.replace(tmp, serving_dir)
        return serving_dir.unlink, None
    finally:
        with contextlib.suppress(OSError):
            tmp.unlink()


def write_serving_dir(
    serving_dir: Path,
    profile: Profile,
    *,
    source_dir: Path,
    lock: Lock,
    target_dir: Path | None = None,
    keeper: Keeper | None = None,
) -> WriteResult:
    """Create or repair the serving directory from a verified download, as one transaction.

    Order matters: verify first (nothing is written for a bad config); build the new state
    aside; keep the old one (keeper); flip the link; read back and verify again; record what
    the run replaced, then the hash in the lock. A failure at any step undoes the steps before
    it: the previous serving state, the rollback record and the lock stay as they were.
    """
    if profile.drafter is None or profile.drafter.config is None:
        raise UsageError(
            f"profile {profile.name} has no drafter config to write",
            hint="pass the profile of a deployment with a drafter (one with a drafter.config section)",
        )
    _refuse_unresolved(profile)
    source_dir, serving_dir = _follow(Path(source_dir)), Path(serving_dir)
    if os.path.lexists(source_dir) and not source_dir.is_dir():
        raise UsageError(
            f"--source {source_dir}: expected the drafter's download directory, "
            f"found {_kind(source_dir) or 'no directory'}",
            hint="pass the directory the drafter was fetched to (it holds config.json and the weights)",
        )
    if source_dir.resolve() == serving_dir.resolve():
        raise WriteError(
            f"serving directory {serving_dir} is the download itself",
            hint="serve from a separate directory; downloads are never edited in place",
        )
    raw, config = read_config(source_dir)
    report = verify(config_file(source_dir), profile, target_dir=target_dir, lock=lock)
    if not report.ok:
        raise VerificationFailed(report)
    digest = report.canonical_sha256
    record = not profile.drafter.config.canonical_sha256.resolved

    # The serving path is a link to a complete build directory: a new version is built beside
    # it and the link flipped (one rename), so the engine never reads a half-written directory
    # and the keeper keeps the old link — and with it the old version — for a rollback.
    builds = serving_dir.parent / layout.DRAFTER_BUILDS
    _check_paths(serving_dir, builds)
    same, current_links = _current(serving_dir, raw)
    wanted = _wanted_links(builds / "x", source_dir)  # links are relative to a build directory
    changed = not same
    links_changed = sorted(n for n, t in wanted.items() if current_links.get(n) != t)
    links_removed = sorted(n for n in current_links if n not in wanted)
    recorded = False
    if not (changed or links_changed or links_removed or not serving_dir.is_symlink()):
        if record:
            recorded = lock.record(profile.name, LOCK_KEY, digest, by="write-config", detail={"content": config})
        return WriteResult(str(serving_dir), False, [], [], digest, recorded, report)

    created = _first_missing(builds)
    build: Path | None = None
    staged: Staged | None = None
    undo: Callable[[], None] | None = None
    aside: Path | None = None
    where = builds
    try:
        build = _build(builds, raw, wanted)
        where = serving_dir
        staged = keeper.stage(serving_dir) if keeper else None
        undo, aside = _switch(serving_dir, build)
        _read_back(serving_dir, raw)
        final = verify(serving_dir / CONFIG_NAME, profile, target_dir=target_dir, lock=lock)
        if not final.ok:
            raise VerificationFailed(final)
        if staged is not None:
            staged.commit()  # rollback restore now sees what this run replaced (taken back below on failure)
        if record:  # only now: a failed write must not make a later, correct source look like drift
            recorded = lock.record(profile.name, LOCK_KEY, digest, by="write-config", detail={"content": config})
    except BaseException as exc:
        _undo(undo, build, staged, created)
        if isinstance(exc, OSError):
            raise _failed(serving_dir, Path(exc.filename) if exc.filename else where, exc) from None
        if isinstance(exc, SpecdeployError) and undo is not None:
            exc.message += f"; switched back: {serving_dir} serves what it served before"
        raise
    if aside is not None:
        shutil.rmtree(aside, ignore_errors=True)  # the keeper holds its copy when one was asked for
    return WriteResult(str(serving_dir), changed, links_changed, links_removed, digest, recorded, final)


def _undo(undo: Callable[[], None] | None, build: Path | None, staged: Staged | None, created: Path | None) -> None:
    """Put everything back after a failed write: the old link (or directory), no new build, no
    kept copy and no rollback-record entry for a replacement that was undone (a lock write that
    failed after the record was committed takes the entry back too), no directory this run created."""
    if undo is not None:
        with contextlib.suppress(OSError):
            undo()
    if build is not None:
        shutil.rmtree(build, ignore_errors=True)
    if staged is not None:
        # the record and the lock agree: neither lists this write. Should taking the entry back
        # fail, it lists the old link, which is what serves again: a restore puts back the same.
        with contextlib.suppress(OSError, SpecdeployError):
            staged.revert()
        with contextlib.suppress(OSError):
            staged.copy_path.parent.rmdir()  # the keeper's staging directory, when this left it empty
    if created is not None:
        shutil.rmtree(created, ignore_errors=True)
