"""Crash-safe file writes: a reader sees the old file or the new one, never a torn one.

In the field a corrected config.json "did not take effect": the write went somewhere the
engine did not read, or never reached the disk. Every file specdeploy writes goes through
here — temporary file in the same directory, fsync, rename over the target, fsync of the
directory — and a failure leaves the previous file untouched and says why.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import tempfile
from pathlib import Path
from typing import Any

from specdeploy.core.errors import WriteError

# Why a write failed, in words, by errno: the one table (write-config and fetch read it too)
WRITE_CAUSES = {
    errno.EROFS: "the filesystem is mounted read-only",
    errno.ENOSPC: "the filesystem is full",
    errno.EDQUOT: "the disk quota is exhausted",
    errno.EACCES: "permission denied",
    errno.EPERM: "operation not permitted",
}


def write_error(path: Path, exc: OSError) -> WriteError:
    """A failed write as specdeploy reports it: the path, the cause, the previous file untouched."""
    cause = WRITE_CAUSES.get(exc.errno or 0, exc.strerror or str(exc))
    return WriteError(
        f"could not write {path}: {cause} ({errno.errorcode.get(exc.errno or 0, exc.errno)}); "
        "the previous file is untouched",
        hint="free space or remount read-write, check ownership, then run the command again",
    )


def fsync_dir(directory: Path) -> None:
    fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_bytes(path: Path, data: bytes, mode: int = 0o644) -> None:
    """Atomically replace `path` with `data` (created with `mode`)."""
    path = Path(path)
    tmp_name: str | None = None
    try:
        fd, tmp_name = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
        try:
            os.fchmod(fd, mode)
            view = memoryview(data)
            while view:
                written = os.write(fd, view)
                view = view[written:]
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp_name, path)
        tmp_name = None
        fsync_dir(path.parent)
    except OSError as exc:
        raise write_error(path, exc) from None
    finally:
        if tmp_name is not None:
            with contextlib.suppress(OSError):
                os.unlink(tmp_name)


def write_json(path: Path, data: Any, *, sort_keys: bool = False, mode: int = 0o644) -> None:
    """Atomically replace `path` with `data` as indented JSON (UTF-8, trailing newline)."""
    text = json.dumps(data, indent=2, sort_keys=sort_keys, ensure_ascii=False) + "\n"
    write_bytes(path, text.encode("utf-8"), mode)


def symlink(path: Path, target: Path) -> None:
    """Atomically point the symlink `path` at `target` (replacing whatever is there)."""
    path = Path(path)
    tmp = path.parent / f".{path.name}.{os.getpid()}.lnk"
    try:
        if tmp.is_symlink() or tmp.exists():
            tmp.unlink()
        os.symlink(target, tmp)
        os.replace(tmp, path)
    except OSError as exc:
        with contextlib.suppress(OSError):
            tmp.unlink(missing_ok=True)
        raise write_error(path, exc) from None


def ensure_dir(path: Path) -> None:
    try:
        Path(path).mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise write_error(Path(path), exc) from None
