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
"""

from __future__ import annotations

import json
import shutil
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Literal

from specdeploy.core import atomic
from specdeploy.core.errors import SpecdeployError

Kind = Literal["file", "dir", "absent"]
Closed = Literal["verified", "restored"]
RUN_FILE = "run.json"


class OpenRunError(SpecdeployError):
    """An earlier run replaced things and never ended: its copies must not be discarded."""


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


def kind_of(path: Path) -> Kind:
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
        kind = kind_of(path)
        if kind != "absent":
            copy_path(path, staged)
        return Staged(self, path, kind, staged, time.time())

    def _commit(self, staged: Staged) -> None:
        record = self._load()
        if record.entry(staged.path) is not None:  # an earlier step of this run kept the older version
            remove_path(staged.copy_path)
            return
        copy = None
        if staged.kind != "absent":
            atomic.ensure_dir(self.directory / "copies")
            copy = str(self.directory / "copies" / str(len(record.entries)))
            staged.copy_path.rename(copy)
        record.entries.append(Entry(str(staged.path), staged.kind, staged.saved_at, copy))
        atomic.write_json(self.directory / RUN_FILE, _to_json(record))


@dataclass
class Staged:
    keeper: Keeper
    path: Path
    kind: Kind
    copy_path: Path
    saved_at: float

    def commit(self) -> None:
        self.keeper._commit(self)

    def discard(self) -> None:
        remove_path(self.copy_path)


def _to_json(record: RunRecord) -> dict[str, Any]:
    return {"run_id": record.run_id, "closed": record.closed, "entries": [asdict(e) for e in record.entries]}


def load_run(directory: Path) -> RunRecord | None:
    path = Path(directory) / RUN_FILE
    if not path.is_file():
        return None
    data = json.loads(path.read_text())
    return RunRecord(data["run_id"], [Entry(**e) for e in data["entries"]], data.get("closed"))


def close_run(directory: Path, run_id: str, how: Closed) -> bool:
    """Mark run `run_id` as ended (its gate passed, or its copies were put back); False when
    the record belongs to another run or there is none (the run replaced nothing)."""
    record = load_run(directory)
    if record is None or record.run_id != run_id:
        return False
    record.closed = how
    atomic.write_json(Path(directory) / RUN_FILE, _to_json(record))
    return True
