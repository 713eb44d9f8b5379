"""Bounded, typed reads of every file a user hands specdeploy.

Failures prevented (tried as a hostile environment would): a 49 MB config.json with a
2.4M-entry `layer_types` took 151 s and 8.8 GB of memory; a FIFO named config.json blocked
the command forever; a config.json that was a directory was reported as
`.../config.json/config.json`; a file that is not UTF-8 or JSON nested thousands deep ended in
a traceback. Every read goes through here: regular files only, a byte ceiling per kind of
file, strict UTF-8, and JSON whose errors name the line and column — each refusal a
`InputFileError` (exit 2, bad input) naming the file, what was expected, what was found and
what to do.

The file primitives every stage uses live here too, once (issue 37: they were in three rooms,
images/podman, drafter/serving and host/cdi, and sha256 helpers in three more): `kind_of` (what is
at a path, in the words of `FILE_KINDS`), `regular_file` and `directory` (stat-only checks of a
path an option names: an archive may be gigabytes, a FIFO must not block) and `sha256_file`.
"""

from __future__ import annotations

import hashlib
import json
import os
import stat
import sys
from pathlib import Path
from typing import Any, Literal

from specdeploy.core.errors import InputFileError, SpecdeployError, UsageError

MIB = 1024 * 1024
# Ceilings by kind of file: generous for every real file of its kind, small enough that a
# hostile one fails in well under a second.
LIMITS = {
    "json": 8 * MIB,  # config.json, lock, reports, manifests (a real drafter config is ~2 KB)
    "yaml": 1 * MIB,  # profiles (~5 KB)
    "text": 64 * MIB,  # logs (a startup log, a golden transcript)
    "key": 64 * 1024,  # tokens and API keys
}

# What a path is, in words, by its stat type: the one table every "expected X, found Y" reads
FILE_KINDS = {
    stat.S_IFREG: "a regular file",
    stat.S_IFDIR: "a directory",
    stat.S_IFIFO: "a FIFO (named pipe)",
    stat.S_IFSOCK: "a socket",
    stat.S_IFCHR: "a character device",
    stat.S_IFBLK: "a block device",
    stat.S_IFLNK: "a symbolic link",
}


def _size(n: int) -> str:
    return f"{n / MIB:.1f} MiB" if n >= MIB else f"{n} bytes"


def read_bytes(
    path: Path | str, *, what: str, limit: int = LIMITS["json"], hint: str | None = None, follow: bool = True
) -> bytes:
    """The bytes of `path`, a regular file of at most `limit` bytes, or an InputFileError
    naming `what` (e.g. "drafter config", "lock file") and the fix (`hint` when the caller
    knows a better one than the generic). `follow=False`: a symbolic link in the path's last place
    is refused, never followed (a file in a directory a less trusted account owns, read by root)."""
    path = Path(path)
    try:
        info = path.stat() if follow else path.lstat()
    except FileNotFoundError:
        raise InputFileError(
            f"{what} {path} does not exist", hint=hint or f"pass the path of an existing {what}"
        ) from None
    except NotADirectoryError:
        raise InputFileError(
            f"{what} {path}: a component of the path is a file, not a directory", hint=hint or "check the path"
        ) from None
    except PermissionError:
        raise InputFileError(
            f"{what} {path} cannot be read: permission denied", hint="run as a user that can read it (root on a host)"
        ) from None
    except OSError as exc:
        raise InputFileError(
            f"{what} {path} cannot be read: {exc.strerror or exc}", hint=hint or "check the path"
        ) from None
    kind = stat.S_IFMT(info.st_mode)
    if kind != stat.S_IFREG:
        found = FILE_KINDS.get(kind, "not a regular file")
        raise InputFileError(
            f"{what} {path}: expected a regular file, found {found}",
            hint=hint or f"pass the path of the {what} file itself",
        )
    if info.st_size > limit:
        raise InputFileError(
            f"{what} {path} is {_size(info.st_size)}, over the {_size(limit)} a {what} may be; not read",
            hint=f"a real {what} is far smaller: check that this is the right file",
        )
    try:
        # O_NONBLOCK: a file swapped for a FIFO after the check above still cannot block the read
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | (0 if follow else os.O_NOFOLLOW))
    except PermissionError:
        raise InputFileError(
            f"{what} {path} cannot be read: permission denied", hint="run as a user that can read it (root on a host)"
        ) from None
    except OSError as exc:
        raise InputFileError(
            f"{what} {path} cannot be read: {exc.strerror or exc}", hint=hint or "check the path"
        ) from None
    with os.fdopen(fd, "rb") as fh:
        data = fh.read(limit + 1)  # a file that grew past the ceiling since the check is refused too
    if len(data) > limit:
        raise InputFileError(
            f"{what} {path} is over the {_size(limit)} a {what} may be; not read",
            hint=f"a real {what} is far smaller: check that this is the right file",
        )
    return data


def decode(data: bytes, path: Path | str, *, what: str) -> str:
    """`data` as UTF-8, or an InputFileError naming the first byte that is not."""
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise InputFileError(
            f"{what} {path} is not UTF-8 text: byte {data[exc.start]:#04x} at offset {exc.start}",
            hint=f"save the {what} as UTF-8 (a binary file or another encoding was given)",
        ) from None


def read_text(
    path: Path | str, *, what: str, limit: int = LIMITS["text"], hint: str | None = None, follow: bool = True
) -> str:
    return decode(read_bytes(path, what=what, limit=limit, hint=hint, follow=follow), path, what=what)


class JSONTextError(SpecdeployError):
    """Text from outside specdeploy (a file, an engine's answer, a program's output) that is not
    usable JSON (`loads`). Each caller turns it into its own error — a file's InputFileError, the
    smoke's "could not test" — naming where the text came from; left alone it is bad input (exit 2)."""

    exit_code = 2

    def __init__(self, kind: Literal["syntax", "nested", "value"], detail: str) -> None:
        self.kind = kind  # syntax: not JSON at all; nested, value: JSON that Python will not hold
        self.detail = detail
        super().__init__(
            f"not {'valid' if kind == 'syntax' else 'usable'} JSON: {detail}",
            hint="check where the text came from",
        )


def loads(text: str | bytes) -> Any:
    """`json.loads(text)` for text from outside specdeploy: the one place such text is decoded.
    Every way decoding can fail — not JSON (the line and column), nesting past Python's recursion
    limit, an integer longer than Python converts (`sys.get_int_max_str_digits()`, 4300 digits: a
    bare ValueError) — is a JSONTextError, never a JSONDecodeError, RecursionError or ValueError."""
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        where = f"line {exc.lineno}, column {exc.colno}"  # "Unterminated string starting at": no second "at"
        raise JSONTextError(
            "syntax", f"{exc.msg} {where}" if exc.msg.endswith(" at") else f"{exc.msg} at {where}"
        ) from None
    except RecursionError:
        raise JSONTextError("nested", "nested too deeply") from None
    except ValueError as exc:
        if "integer string conversion" in str(exc):
            detail = f"it holds a number of more than {sys.get_int_max_str_digits()} digits, more than Python converts"
        else:  # bytes that are not UTF-8/16/32 text, or another value Python will not hold
            detail = str(exc).split(";")[0]
        raise JSONTextError("value", detail) from None


def parse_json(text: str, origin: str, *, what: str) -> Any:
    """`text` as JSON (`loads`), or an InputFileError with the line and column (and for JSON
    Python will not hold — nested past the recursion limit, a number of thousands of digits —
    say so instead of a RecursionError or ValueError)."""
    try:
        return loads(text)
    except JSONTextError as exc:
        if exc.kind == "syntax":
            raise InputFileError(
                f"{what} {origin} is not valid JSON: {exc.detail}",
                hint=f"fix the {what} (or restore it from where it came from)",
            ) from None
        detail = f"nested too deeply to be a {what}" if exc.kind == "nested" else exc.detail
        raise InputFileError(
            f"{what} {origin} is not usable JSON: {detail}", hint="check that this is the right file"
        ) from None


def read_json(
    path: Path | str, *, what: str, limit: int = LIMITS["json"], hint: str | None = None, follow: bool = True
) -> Any:
    return parse_json(read_text(path, what=what, limit=limit, hint=hint, follow=follow), str(path), what=what)


def expect_mapping(data: Any, origin: str, *, what: str) -> dict[str, Any]:
    """`data` when it is a JSON object, else an InputFileError naming what was found."""
    if not isinstance(data, dict):
        raise InputFileError(
            f"{what} {origin}: expected a JSON object at the top level, found {type(data).__name__}",
            hint="check that this is the right file",
        )
    return data


# --------------------------------------------------------------------------- names from the network

UNSAFE_NAME_HINT = (
    "a hub or mirror that lists such a name is not the hub, or is compromised (on an http:// endpoint, anyone "
    "on the path can answer): fetch from https:// only, check the mirror, and report it"
)


class UnsafePathError(SpecdeployError):
    """A file name from the network (a hub's tree listing, a lock entry) or a place under a
    directory that would lead outside it: refused before any file operation, exit 2."""

    exit_code = 2


def relative_name(name: Any, *, origin: str) -> str:
    """`name`, a repository-relative file name from an untrusted source (a hub's listing, a lock
    entry), refused unless it stays inside the directory it is joined to, by its text alone:
    a non-empty POSIX relative path without `..`, `.` or empty components, backslashes, NUL or
    other control characters. No file is touched."""
    shown = repr(name)[:200]
    reason = None
    if not isinstance(name, str) or not name:
        reason = "not a non-empty string"
    elif len(name) > 4096:
        reason = f"{len(name)} characters long"
    elif any(ord(c) < 32 or ord(c) == 127 for c in name):
        reason = "a NUL or other control character"
    elif "\\" in name:
        reason = "a backslash (a Windows separator: another path on some filesystems and tools)"
    elif name.startswith("/"):
        reason = "an absolute path"
    elif {".", ".."} & set(name.split("/")):
        reason = "a '..' or '.' component"
    elif "" in name.split("/"):
        reason = "an empty component (a doubled or trailing '/')"
    if reason is not None:
        raise UnsafePathError(
            f"{origin} names the file {shown}: expected a relative path inside its directory, found {reason}; "
            "refused before any file was opened, created or removed",
            hint=UNSAFE_NAME_HINT,
        )
    return name


def inside(directory: Path | str, name: str, *, origin: str) -> Path:
    """`directory / name` after `relative_name`, refused when any part of it below `directory`
    that exists is a symbolic link (a link would lead the read, the hash or the removal outside)."""
    relative_name(name, origin=origin)
    path = Path(directory)
    for part in name.split("/"):
        path = path / part
        try:
            st = os.lstat(path)
        except FileNotFoundError:
            break  # nothing below a missing part exists
        if stat.S_ISLNK(st.st_mode):
            raise UnsafePathError(
                f"{path} ({origin}: {name!r}) is a symbolic link: expected a file or directory inside {directory}; "
                "refused before it was read or removed",
                hint=f"remove the link ({path}) and run this again; nothing under the models directory is a link",
            )
    return Path(directory, *name.split("/"))


def no_links_below(directory: Path | str, *, origin: str) -> None:
    """Refuse a directory that is, or holds anywhere below it, a symbolic link (nothing specdeploy
    downloads is a link: one found there was planted)."""
    directory = Path(directory)
    if not os.path.lexists(directory):
        return
    if directory.is_symlink():
        raise UnsafePathError(
            f"{directory} ({origin}) is a symbolic link to {os.readlink(directory)!r}: expected a directory; "
            "refused before anything under it was read",
            hint=f"remove the link ({directory}) and run this again",
        )
    for root, dirs, names in os.walk(directory):
        for name in sorted(dirs + names):
            path = Path(root) / name
            if path.is_symlink():
                raise UnsafePathError(
                    f"{path} ({origin}) is a symbolic link to {os.readlink(path)!r}: nothing specdeploy fetches is "
                    "a link; refused before anything under it was read or removed",
                    hint=f"remove the link ({path}) and run this again",
                )


def open_no_follow(path: Path | str) -> Any:
    """`path` opened for reading in binary, refusing a symbolic link at its last component (a link
    planted between the listing and the read) and anything that is not a regular file."""
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0) | getattr(os, "O_NONBLOCK", 0))
    try:
        kind = os.fstat(fd).st_mode
        if not stat.S_ISREG(kind):
            raise UnsafePathError(
                f"{path}: expected a regular file, found {FILE_KINDS.get(stat.S_IFMT(kind), 'something else')}",
                hint=f"remove {path} and run this again",
            )
        return os.fdopen(fd, "rb")
    except BaseException:
        os.close(fd)
        raise


# --------------------------------------------------------------------------- what is at a path


def kind_of(path: Path | str, *, follow: bool = True) -> str | None:
    """What is at `path` in FILE_KINDS' words ("a regular file", "a directory", ...), None for
    nothing there (a path under a file included: nothing can be there). `follow=False` looks at a
    final symbolic link itself ("a symbolic link")."""
    try:
        info = os.stat(path) if follow else os.lstat(path)
    except (FileNotFoundError, NotADirectoryError):
        return None
    except OSError as exc:
        return f"something that cannot be read ({exc.strerror or exc})"
    return FILE_KINDS.get(stat.S_IFMT(info.st_mode), "something else")


def _expect(path: Path | str, want: int, label: str, fallback: str, error: type, *, option: str, what: str,
            hint: str, label_if_missing: str | None = None) -> Path:  # fmt: skip
    """`path` when `stat` says it is of kind `want`, else `error` naming `option`, what was expected
    (`what`, then `label`) and what was found."""
    missing = label if label_if_missing is None else label_if_missing
    path = Path(path)
    try:
        info = path.stat()
    except FileNotFoundError:
        raise error(f"{option} {path}: expected {what}{missing}, found nothing there", hint=hint) from None
    except OSError as exc:
        raise error(f"{option} {path}: {what} cannot be read: {exc.strerror or exc}", hint=hint) from None
    kind = stat.S_IFMT(info.st_mode)
    if kind != want:
        raise error(f"{option} {path}: expected {what}{label}, found {FILE_KINDS.get(kind, fallback)}", hint=hint)
    return path


def regular_file(path: Path | str, *, option: str, what: str, hint: str) -> Path:
    """`path` when it is a regular file (stat only: an archive may be gigabytes, a FIFO must not
    block), else an InputFileError (exit 2) naming `option`, what was expected and found."""
    return _expect(path, stat.S_IFREG, " (a regular file)", "not a regular file", InputFileError,
                   option=option, what=what, hint=hint, label_if_missing="")  # fmt: skip


def directory(path: Path | str, *, option: str, what: str, hint: str) -> Path:
    """`path` when it is a directory, else a UsageError (exit 2) naming `option` and what is there."""
    return _expect(path, stat.S_IFDIR, " (a directory)", "something else", UsageError,
                   option=option, what=what, hint=hint)  # fmt: skip


def sha256_file(path: Path | str, *, follow: bool = False) -> str:
    """The sha256 (hex) of a regular file, streamed. By default a symbolic link at `path` is
    refused, not followed (`open_no_follow`: a link planted in a directory another account
    writes); `follow=True` for a path the caller names itself (a lock, a CDI spec)."""
    digest = hashlib.sha256()
    with open(path, "rb") if follow else open_no_follow(path) as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()
