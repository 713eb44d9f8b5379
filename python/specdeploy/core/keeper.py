"""The keeper: what a deploy step replaces is kept first, so a failed deploy can put it back.

A host must never be left without a working stack. Every step of a deploy that replaces
something the running engine depends on — the engine unit (and through it, for container
profiles, the image it names), the drafter's serving directory — first hands the current
version to a `Keeper`, tagged with the deploy's run id. Only what *this* run replaced is
kept: a component the run did not touch is already the previous one. Putting the copies
back and proving the previous stack serves is the rollback stage's job (specdeploy.rollback);
this primitive knows nothing of engines or gates, so the stages below them can use it.

Layout of the rollback directory (`<state>/rollback`, core.layout):

    run.json          {"run_id": ..., "entries": [{"path", "kind", "saved_at", "copy"}]}
    copies/<n>        the kept file or directory (symlinks kept as links)
    failed/<n>        after a restore: what the failed deploy had written, for diagnosis

A run is closed when it ends: `verified` when its gate passed (the copies are obsolete),
`restored` when its copies were put back. A new run id discards a closed run's copies. A run
that was never closed was interrupted (the controller died, a task failed before the gate,
someone ran a stage alone): its copies are the last good stack, so a new run refuses to
discard them — `specdeploy rollback recover` (the deploy's first step) restores them first.

The record is read in one place, `load_run`, by everything that reads it (the keeper itself for
write-config, unit install and weights serve; `rollback restore|recover`; the gate when it
closes a passing run): a bounded regular file (core.files), each field checked, a damaged one a
`RunRecordError` (exit 2) naming the file, the field, what was expected and what was found —
never a JSONDecodeError or TypeError traceback (issue 20, D7), and before anything is replaced.

Run ids are made and checked here too, beside the record that holds them (`new_run_id`,
`check_run_id`): every stage that names a run's directory (`<state>/runs/<run-id>/`: the gate,
the rollback, the deploy lock) checks the id with the one rule, from below all of them (issue 37:
the gate called the rollback's check, a stage above it).
"""

from __future__ import annotations

import datetime as dt
import math
import os
import shutil
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Literal

from specdeploy.core import atomic, files
from specdeploy.core.errors import InputFileError, SpecdeployError, UsageError

Kind = Literal["file", "dir", "absent"]
Closed = Literal["verified", "restored"]
RUN_FILE = "run.json"
RECORD = "rollback run record"


def new_run_id() -> str:
    """A fresh run id: the UTC time to the microsecond (sorts as the runs happened)."""
    return dt.datetime.now(dt.UTC).strftime("%Y%m%dT%H%M%S%fZ")


def check_run_id(run_id: str) -> None:
    """A run id names a directory under <state>/runs: a plain name, or a usage error (exit 2)."""
    if not run_id or "/" in run_id or "\0" in run_id or run_id.startswith(".") or len(run_id) > 200:
        raise UsageError(
            f"--run-id {run_id!r} is not a plain name: it names the run's directory under <state>/runs",
            hint="use letters, digits, '-', '_' or '.' (not first), as the deploy's own run ids "
            "(e.g. 20250101T120000000000Z)",
        )


class OpenRunError(SpecdeployError):
    """An earlier run replaced things and never ended: its copies must not be discarded."""


class RunRecordError(InputFileError):
    """The rollback run record (`<rollback>/run.json`) is not the keeper's: not a bounded regular
    file, not UTF-8 JSON, or a field of another shape. Bad input (exit 2); nothing was changed."""


@dataclass
class Entry:
    path: str
    kind: Kind
    saved_at: float
    copy: str | None


@dataclass
class RunRecord:
    run_id: str
    entries: list[Entry] = field(default_factory=list)
    closed: Closed | None = None

    @property
    def open(self) -> bool:
        """The run replaced something and neither passed its gate nor was restored."""
        return bool(self.entries) and self.closed is None

    def entry(self, path: Path) -> Entry | None:
        return next((e for e in self.entries if e.path == str(path)), None)


def _entry_kind(path: Path) -> Kind:
    if path.is_dir() and not path.is_symlink():
        return "dir"
    if path.exists() or path.is_symlink():
        return "file"
    return "absent"


def copy_path(src: Path, dst: Path) -> None:
    if src.is_dir() and not src.is_symlink():
        shutil.copytree(src, dst, symlinks=True)
    else:
        shutil.copy2(src, dst, follow_symlinks=False)


def remove_path(path: Path) -> None:
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path)
    elif path.exists() or path.is_symlink():
        path.unlink()


class Keeper:
    """Keeps the pre-deploy version of each path a run replaces (the first save per path wins)."""

    def __init__(self, directory: Path, run_id: str) -> None:
        if not run_id:
            raise SpecdeployError("a rollback keeper needs a run id", hint="pass --run-id (Ansible sets one per run)")
        self.directory = Path(directory)
        self.run_id = run_id
        # a damaged record is refused now, before the command hashes, records or builds anything
        # (weights serve records revisions in the lock before its first link is staged)
        load_run(self.directory)

    def _refuse_open_run(self, record: RunRecord | None) -> None:
        if record is not None and record.run_id != self.run_id and record.open:
            raise OpenRunError(
                f"run {record.run_id} replaced {len(record.entries)} item(s) and never ended "
                f"(no passing gate, no restore): its copies are the last good stack",
                hint=f"restore them first: `specdeploy rollback recover --run-id {self.run_id}` "
                "(the deploy does this before anything else), then re-run",
            )

    def _load(self) -> RunRecord:
        record = load_run(self.directory)
        self._refuse_open_run(record)
        if record is None or record.run_id != self.run_id:
            for sub in ("copies", "failed"):
                shutil.rmtree(self.directory / sub, ignore_errors=True)
            return RunRecord(self.run_id)
        return record

    def stage(self, path: Path) -> Staged:
        """Copy `path` aside before a step that may change it; commit() if it did change."""
        path = Path(path)
        self._refuse_open_run(load_run(self.directory))  # before anything is replaced
        atomic.ensure_dir(self.directory / "staging")
        staged = self.directory / "staging" / f"{path.name}.{time.monotonic_ns()}"
        kind = _entry_kind(path)
        if kind != "absent":
            copy_path(path, staged)
        return Staged(self, path, kind, staged, time.time())

    def _commit(self, staged: Staged) -> bool:
        """Record what `staged` kept; True when this added an entry (False: an earlier step of
        this run kept the older version). A record that cannot be written leaves the copy staged."""
        record = self._load()
        if record.entry(staged.path) is not None:  # an earlier step of this run kept the older version
            remove_path(staged.copy_path)
            return False
        copy = None
        if staged.kind != "absent":
            atomic.ensure_dir(self.directory / "copies")
            listed, n = {e.copy for e in record.entries}, len(record.entries)
            while str(self.directory / "copies" / str(n)) in listed:  # after a revert, an index may be taken
                n += 1
            copy = self.directory / "copies" / str(n)
            remove_path(copy)  # never a listed copy: one a failed commit left behind
            staged.copy_path.rename(copy)
        record.entries.append(
            Entry(str(staged.path), staged.kind, staged.saved_at, None if copy is None else str(copy))
        )
        try:
            atomic.write_json(self.directory / RUN_FILE, _to_json(record))
        except BaseException:
            if copy is not None:  # back where discard() finds it: no copy the record does not list
                copy.rename(staged.copy_path)
            raise
        return True

    def _revert(self, staged: Staged) -> None:
        """Take back what `_commit` recorded for `staged` (the step it kept a copy for was undone):
        the entry leaves the record, its copy goes back to staging for discard()."""
        record = load_run(self.directory)
        if record is None or record.run_id != self.run_id:
            return
        entry = record.entry(staged.path)
        if entry is None:
            return
        record.entries.remove(entry)
        if entry.copy is not None:
            Path(entry.copy).rename(staged.copy_path)
        try:
            atomic.write_json(self.directory / RUN_FILE, _to_json(record))
        except BaseException:
            if entry.copy is not None:
                staged.copy_path.rename(entry.copy)
            raise


@dataclass
class Staged:
    keeper: Keeper
    path: Path
    kind: Kind
    copy_path: Path
    saved_at: float
    committed: bool = False  # commit() added the record's entry (revert() takes it back)

    def commit(self) -> None:
        self.committed = self.keeper._commit(self)

    def revert(self) -> None:
        """Undo commit(): the record no longer lists this path (its step was undone too) and the
        copy is discarded — for a step whose later part failed (write-config's lock)."""
        if self.committed:
            self.keeper._revert(self)
            self.committed = False
        self.discard()

    def discard(self) -> None:
        remove_path(self.copy_path)


def _to_json(record: RunRecord) -> dict[str, Any]:
    return {"run_id": record.run_id, "closed": record.closed, "entries": [asdict(e) for e in record.entries]}


def record_hint(path: Path) -> str:
    """What to do about a damaged record: its copies may be the last good stack."""
    return (
        f"the record is damaged: put back what it lists by hand from {path.parent / 'copies'}, "
        f"or move {path.name} aside when nothing needs restoring"
    )


def _record_error(path: Path, problem: str) -> RunRecordError:
    return RunRecordError(f"{RECORD} {path}: {problem}", hint=record_hint(path))


def _usable_path(value: object) -> bool:
    """A string the system calls accept as a path (no NUL, no lone surrogate), not empty or `/`."""
    if not isinstance(value, str) or not value.strip("/") or "\0" in value:
        return False
    try:
        os.fsencode(value)
    except UnicodeError:
        return False
    return True


def _shown(value: object) -> str:
    """A found value for a message: its repr, shortened (a record may hold megabytes)."""
    if isinstance(value, int) and value.bit_length() > 128:
        return f"a number of about {int(value.bit_length() * math.log10(2)) + 1} digits"
    text = repr(value)
    return text if len(text) <= 120 else f"{text[:100]}… ({len(text)} characters)"


def _seconds(value: object) -> float | None:
    """A time in seconds: a finite number a float holds (not a boolean), else None."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    try:
        seconds = float(value)
    except OverflowError:  # a JSON integer of hundreds of digits
        return None
    return seconds if math.isfinite(seconds) else None


def _entry(path: Path, n: int, raw: object) -> Entry:
    where = f"entries[{n}]"
    if not isinstance(raw, dict):
        found = "null" if raw is None else type(raw).__name__
        raise _record_error(path, f"{where}: expected an object with path, kind, saved_at and copy, found {found}")
    target = raw.get("path")
    if not _usable_path(target):
        raise _record_error(path, f"{where}.path: expected the path the run replaced, found {_shown(target)}")
    kind = raw.get("kind")
    if kind not in ("file", "dir", "absent"):
        raise _record_error(path, f"{where}.kind: expected file, dir or absent, found {_shown(kind)}")
    saved_at = _seconds(raw.get("saved_at"))
    if saved_at is None:
        raise _record_error(path, f"{where}.saved_at: expected a time (seconds), found {_shown(raw.get('saved_at'))}")
    copy = raw.get("copy")
    if kind == "absent" and copy is not None:
        raise _record_error(path, f"{where}.copy: expected null for a path that was absent, found {_shown(copy)}")
    if kind != "absent" and not _usable_path(copy):
        raise _record_error(path, f"{where}.copy: expected the path of the kept copy, found {_shown(copy)}")
    return Entry(target, kind, saved_at, copy)


def load_run(directory: Path) -> RunRecord | None:
    """The rollback directory's run record, checked field by field; None when there is none.

    The one reader of the record (the keeper, `rollback restore|recover`, the gate): a record that
    is not a regular, bounded, UTF-8 JSON file of the keeper's shape is a RunRecordError (exit 2)
    naming the file, the field, what was expected and what was found — raised before its caller
    changes anything."""
    path = Path(directory) / RUN_FILE
    try:
        path.lstat()
    except (FileNotFoundError, NotADirectoryError):
        return None  # no record yet (or no rollback directory): no run replaced anything here
    except OSError:
        pass  # unreadable: files.read_json says why
    try:
        data = files.read_json(path, what=RECORD)
    except InputFileError as exc:  # a FIFO, a directory, too large, not UTF-8, not JSON
        raise RunRecordError(exc.message, hint=record_hint(path)) from None
    if not isinstance(data, dict):
        found = "null" if data is None else type(data).__name__
        raise _record_error(path, f"expected a JSON object with run_id and entries, found {found}")
    run_id = data.get("run_id")
    if not isinstance(run_id, str) or not run_id or "/" in run_id or run_id.startswith(".") or not _usable_path(run_id):
        raise _record_error(path, f"run_id: expected a run id (a plain name), found {_shown(run_id)}")
    entries = data.get("entries")
    if not isinstance(entries, list):
        raise _record_error(path, f"entries: expected a list, found {type(entries).__name__}")
    closed = data.get("closed")
    if closed not in (None, "verified", "restored"):
        raise _record_error(path, f"closed: expected null, verified or restored, found {_shown(closed)}")
    return RunRecord(run_id, [_entry(path, n, e) for n, e in enumerate(entries)], closed)


def close_run(directory: Path, run_id: str, how: Closed | None) -> bool:
    """Mark run `run_id` as ended (its gate passed, or its copies were put back), or as open
    again (`how` None: what ended it was undone); False when the record belongs to another run
    or there is none (the run replaced nothing). A damaged record is a RunRecordError, unchanged."""
    record = load_run(directory)
    if record is None or record.run_id != run_id:
        return False
    record.closed = how
    atomic.write_json(Path(directory) / RUN_FILE, _to_json(record))
    return True
