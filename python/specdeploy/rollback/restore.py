"""The rollback step: put back what a failed deploy run replaced, then prove it serves.

The keeper (core.keeper) kept the pre-deploy version of everything the run replaced — the
engine unit and, through it, the image it names; the drafter's serving directory. `restore`
puts exactly those back (what the failed run wrote goes to `failed/` for diagnosis) and
restarts the previous engine, or stops the engine when there was none before. `restore_and_prove`
then runs the smoke gate against the restored stack with the profile it was deployed with
(its unit names the copy), because a rollback that was not proven to serve is a host without
a working stack that nobody knows about.
"""

from __future__ import annotations

import shutil
import subprocess
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from specdeploy.core import atomic, layout
from specdeploy.core.errors import SpecdeployError
from specdeploy.core.keeper import close_run, copy_path, load_run, remove_path
from specdeploy.engine import secret
from specdeploy.profile import load_profile
from specdeploy.smoke import stages as smoke


class RollbackError(SpecdeployError):
    """The previous stack could not be put back (the host may be without a working engine)."""


Systemctl = Callable[[list[str]], None]


def systemctl(args: list[str]) -> None:
    done = subprocess.run(["systemctl", *args], capture_output=True, text=True)
    if done.returncode != 0:
        raise RollbackError(
            f"systemctl {' '.join(args)} failed (exit {done.returncode}): {done.stderr.strip()}",
            hint=f"inspect with `journalctl -u {layout.UNIT_NAME} -n 100` and restore by hand",
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


def restore(
    directory: Path,
    run_id: str,
    *,
    unit: str,
    run: Systemctl = systemctl,
    unit_files: tuple[Path, ...] = tuple(layout.UNIT_FILES.values()),
) -> Restored:
    """Put back everything run `run_id` replaced, then restart (or stop) the engine unit."""
    directory = Path(directory)
    record = load_run(directory)
    # a run that ended (its gate passed, or it was restored) is never restored (again): the play's
    # rescue calls this after any failure, including one after a passing gate
    if record is None or record.run_id != run_id or not record.entries or record.closed is not None:
        return Restored(run_id, [], [], "none", None)
    restored, removed = [], []
    for n, entry in enumerate(record.entries):
        path = Path(entry.path)
        if path.exists() or path.is_symlink():
            atomic.ensure_dir(directory / "failed")
            failed = directory / "failed" / str(n)
            remove_path(failed)
            if path.is_symlink():  # a relative link would dangle in failed/: keep where it pointed
                failed.symlink_to(path.resolve())
                path.unlink()
            else:
                shutil.move(path, failed)  # keep what failed, for diagnosis (may cross filesystems)
        if entry.kind == "absent":
            removed.append(entry.path)
            continue
        assert entry.copy is not None
        tmp = path.parent / f".{path.name}.restore"
        remove_path(tmp)
        copy_path(Path(entry.copy), tmp)
        tmp.rename(path)
        atomic.fsync_dir(path.parent)
        restored.append(entry.path)
    unit_entry = next((e for e in record.entries if Path(e.path).stem == unit), None)
    run(["daemon-reload"])
    if unit_entry is not None and unit_entry.kind == "absent":
        run(["stop", unit])
        action = "stopped"
    elif unit_entry is None and not any(Path(p).is_file() for p in unit_files):
        action = "none"  # a first deploy that failed before installing any unit: nothing runs
    else:
        # a new engine that crash-looped into its start limit would refuse a plain restart
        # ("start request repeated too quickly"): clear that first
        run(["reset-failed", unit])
        run(["restart", unit])
        action = "restarted"
    close_run(directory, run_id, "restored")
    return Restored(run_id, restored, removed, action, min(e.saved_at for e in record.entries))


# --------------------------------------------------------------------------- prove


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
    host: layout.HostLayout,
    run_id: str,
    *,
    unit: str = layout.UNIT_NAME,
    run: Systemctl = systemctl,
    unit_files: tuple[Path, ...] = tuple(layout.UNIT_FILES.values()),
) -> Outcome:
    """Restore run `run_id`'s replacements, then run the smoke gate against the restored
    stack with the profile it was deployed with (named in its unit). The downtime runs from
    the run's first replacement (the old engine stopped right after) to the restored
    engine's readiness."""
    restored = restore(host.rollback, run_id, unit=unit, run=run, unit_files=unit_files)
    if not restored.anything:
        message = "nothing to restore: this run replaced nothing, or it ended (passed its gate or was restored already)"
        return Outcome(restored, None, None, None, None, message)
    if restored.unit_action in ("stopped", "none"):
        message = "there was no previous engine on this host: nothing of this run's is left running"
        return Outcome(restored, None, None, None, None, message)
    unit_file = next((path for path in unit_files if path.is_file()), None)
    profile_file = layout.unit_profile_file(unit_file.read_text()) if unit_file else None
    if unit_file is None or profile_file is None:
        message = f"restored {len(restored.restored)} item(s), but the unit names no profile copy to prove it with"
        return Outcome(restored, str(unit_file) if unit_file else None, None, None, None, message)
    profile = load_profile(profile_file)
    endpoint = f"http://127.0.0.1:{profile.engine.serve.port}"
    options = smoke.SmokeOptions(show_progress=False, api_key=secret.read(profile, host))
    report = smoke.run(profile, endpoint, options)
    ready = report.stage("readiness")
    ready_at = ready.details.get("ready_at") if ready else None
    downtime = ready_at - restored.changed_since if ready_at and restored.changed_since else None
    verdict = report.verdict.value
    message = f"previous stack ({profile.name}) restored; its smoke gate: {verdict}"
    return Outcome(restored, str(unit_file), profile_file, report.to_json(), downtime, message)


def open_run(host: layout.HostLayout, current_run_id: str) -> str | None:
    """The id of an earlier run that replaced things and never ended (interrupted), or None."""
    record = load_run(host.rollback)
    if record is None or record.run_id == current_run_id or not record.open:
        return None
    return record.run_id


def recover(
    host: layout.HostLayout,
    current_run_id: str,
    *,
    unit: str = layout.UNIT_NAME,
    run: Systemctl = systemctl,
) -> Outcome | None:
    """A deploy's first step: when an earlier run was interrupted after replacing something
    (no passing gate, no restore), put its copies back and prove the stack they make serves,
    before this run replaces anything. None when there is nothing to recover."""
    interrupted = open_run(host, current_run_id)
    if interrupted is None:
        return None
    return restore_and_prove(host, interrupted, unit=unit, run=run)
