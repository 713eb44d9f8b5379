"""Keep what a deploy replaces, and put it back when the smoke gate fails.

A host must never be left without a working stack. Every step of a deploy that replaces
something the running engine depends on — the engine unit (and through it, for container
profiles, the image it names), the drafter's serving directory — first hands the current
version to a `Keeper`, tagged with the deploy's run id. Only what *this* run replaced is
restored: a component the run did not touch is already the previous one.

Layout of the rollback directory (under the state directory):

    run.json          {"run_id": ..., "entries": [{"path", "kind", "existed", "saved_at", "copy"}]}
    copies/<n>        the kept file or directory (symlinks kept as links)
    failed/<n>        after a restore: what the failed deploy had written, for diagnosis

A new run id discards the previous run's copies: that run ended either with a passing gate
(its copies are obsolete) or with a restore (they were used).
"""

from __future__ import annotations

import json
import shutil
import subprocess
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Literal

from specdeploy import atomic
from specdeploy.errors import SpecdeployError

Kind = Literal["file", "dir", "absent"]
RUN_FILE = "run.json"


class RollbackError(SpecdeployError):
    """The previous stack could not be put back (the host may be without a working engine)."""


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

    def entry(self, path: Path) -> Entry | None:
        return next((e for e in self.entries if e.path == str(path)), None)


def _kind(path: Path) -> Kind:
    if path.is_dir() and not path.is_symlink():
        return "dir"
    if path.exists() or path.is_symlink():
        return "file"
    return "absent"


def _copy(src: Path, dst: Path) -> None:
    if src.is_dir() and not src.is_symlink():
        shutil.copytree(src, dst, symlinks=True)
    else:
        shutil.copy2(src, dst, follow_symlinks=False)


def _remove(path: Path) -> None:
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

    def _load(self) -> RunRecord:
        record = load_run(self.directory)
        if record is None or record.run_id != self.run_id:
            for sub in ("copies", "failed"):
                shutil.rmtree(self.directory / sub, ignore_errors=True)
            return RunRecord(self.run_id)
        return record

    def stage(self, path: Path) -> Staged:
        """Copy `path` aside before a step that may change it; commit() if it did change."""
        path = Path(path)
        atomic.ensure_dir(self.directory / "staging")
        staged = self.directory / "staging" / f"{path.name}.{time.monotonic_ns()}"
        kind = _kind(path)
        if kind != "absent":
            _copy(path, staged)
        return Staged(self, path, kind, staged, time.time())

    def _commit(self, staged: Staged) -> None:
        record = self._load()
        if record.entry(staged.path) is not None:  # an earlier step of this run kept the older version
            _remove(staged.copy_path)
            return
        copy = None
        if staged.kind != "absent":
            atomic.ensure_dir(self.directory / "copies")
            copy = str(self.directory / "copies" / str(len(record.entries)))
            staged.copy_path.rename(copy)
        record.entries.append(Entry(str(staged.path), staged.kind, staged.saved_at, copy))
        atomic.write_bytes(self.directory / RUN_FILE, json.dumps(_to_json(record), indent=2).encode())


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
        _remove(self.copy_path)


def _to_json(record: RunRecord) -> dict[str, Any]:
    return {"run_id": record.run_id, "entries": [asdict(e) for e in record.entries]}


def load_run(directory: Path) -> RunRecord | None:
    path = Path(directory) / RUN_FILE
    if not path.is_file():
        return None
    data = json.loads(path.read_text())
    return RunRecord(data["run_id"], [Entry(**e) for e in data["entries"]])


# --------------------------------------------------------------------------- restore


Systemctl = Callable[[list[str]], None]


def systemctl(args: list[str]) -> None:
    done = subprocess.run(["systemctl", *args], capture_output=True, text=True)
    if done.returncode != 0:
        raise RollbackError(
            f"systemctl {' '.join(args)} failed (exit {done.returncode}): {done.stderr.strip()}",
            hint="inspect with `journalctl -u specdeploy-engine -n 100` and restore by hand",
        )


@dataclass
class Restored:
    run_id: str
    restored: list[str]
    removed: list[str]
    unit_action: str  # "restarted", "stopped" or "none"
    changed_since: float | None  # wall-clock time of the run's first replacement (downtime start)

    @property
    def anything(self) -> bool:
        return bool(self.restored or self.removed)


def restore(directory: Path, run_id: str, *, unit: str, run: Systemctl = systemctl) -> Restored:
    """Put back everything run `run_id` replaced, then restart (or stop) the engine unit."""
    directory = Path(directory)
    record = load_run(directory)
    if record is None or record.run_id != run_id or not record.entries:
        return Restored(run_id, [], [], "none", None)
    restored, removed = [], []
    for n, entry in enumerate(record.entries):
        path = Path(entry.path)
        if path.exists() or path.is_symlink():
            atomic.ensure_dir(directory / "failed")
            failed = directory / "failed" / str(n)
            _remove(failed)
            shutil.move(path, failed)  # keep what failed, for diagnosis (may cross filesystems)
        if entry.kind == "absent":
            removed.append(entry.path)
            continue
        assert entry.copy is not None
        tmp = path.parent / f".{path.name}.restore"
        _remove(tmp)
        _copy(Path(entry.copy), tmp)
        tmp.rename(path)
        atomic.fsync_dir(path.parent)
        restored.append(entry.path)
    unit_entry = next((e for e in record.entries if Path(e.path).stem == unit), None)
    run(["daemon-reload"])
    if unit_entry is not None and unit_entry.kind == "absent":
        run(["stop", unit])
        action = "stopped"
    else:
        run(["restart", unit])
        action = "restarted"
    return Restored(run_id, restored, removed, action, min(e.saved_at for e in record.entries))


def profile_file_of(unit_text: str) -> str | None:
    """The profile copy a rendered unit names in its header (see units.PROFILE_LINE)."""
    for line in unit_text.splitlines():
        if line.startswith("# specdeploy-profile-file: "):
            return line.split(": ", 1)[1].strip()
    return None


# --------------------------------------------------------------------------- prove


UNIT_DIRS = (Path("/etc/systemd/system"), Path("/etc/containers/systemd"))


def find_unit_file(unit: str, dirs: tuple[Path, ...] = UNIT_DIRS) -> Path | None:
    for directory in dirs:
        for suffix in (".service", ".container"):
            if (directory / f"{unit}{suffix}").is_file():
                return directory / f"{unit}{suffix}"
    return None


@dataclass
class Outcome:
    """What the gate's rescue reports: what was put back, whether it serves, the downtime."""

    restored: Restored
    unit_file: str | None
    profile_file: str | None
    smoke: dict[str, Any] | None
    downtime_s: float | None
    message: str

    @property
    def serves(self) -> bool:
        return self.smoke is not None and self.smoke["verdict"] == "pass"

    def to_json(self) -> dict[str, Any]:
        return {
            "run_id": self.restored.run_id,
            "restored": self.restored.restored,
            "removed": self.restored.removed,
            "unit_action": self.restored.unit_action,
            "unit_file": self.unit_file,
            "profile_file": self.profile_file,
            "previous_stack_serves": self.serves,
            "downtime_s": None if self.downtime_s is None else round(self.downtime_s, 1),
            "smoke": self.smoke,
            "message": self.message,
        }


def restore_and_prove(
    state_dir: Path, run_id: str, *, unit: str, run: Systemctl = systemctl, unit_dirs: tuple[Path, ...] = UNIT_DIRS
) -> Outcome:
    """Restore run `run_id`'s replacements, then run the smoke gate against the restored
    stack with the profile it was deployed with (named in its unit). The downtime runs from
    the run's first replacement (the old engine stopped right after) to the restored
    engine's readiness."""
    from specdeploy import smoke
    from specdeploy.profile import load_profile

    restored = restore(Path(state_dir) / "rollback", run_id, unit=unit, run=run)
    if not restored.anything:
        message = "this run replaced nothing: the failing stack is the one that was running before"
        return Outcome(restored, None, None, None, None, message)
    if restored.unit_action == "stopped":
        message = "there was no previous engine on this host: the new one is stopped and its unit removed"
        return Outcome(restored, None, None, None, None, message)
    unit_file = find_unit_file(unit, unit_dirs)
    profile_file = profile_file_of(unit_file.read_text()) if unit_file else None
    if unit_file is None or profile_file is None:
        message = f"restored {len(restored.restored)} item(s), but the unit names no profile copy to prove it with"
        return Outcome(restored, str(unit_file) if unit_file else None, None, None, None, message)
    profile = load_profile(profile_file)
    endpoint = f"http://127.0.0.1:{profile.engine.serve.port}"
    report = smoke.run(profile, endpoint, smoke.SmokeOptions(show_progress=False))
    ready = report.stage("readiness")
    ready_at = ready.details.get("ready_at") if ready else None
    downtime = ready_at - restored.changed_since if ready_at and restored.changed_since else None
    verdict = report.verdict.value
    message = f"previous stack ({profile.name}) restored; its smoke gate: {verdict}"
    return Outcome(restored, str(unit_file), profile_file, report.to_json(), downtime, message)
