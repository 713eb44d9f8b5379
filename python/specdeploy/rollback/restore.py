"""The rollback step: put back what a failed deploy run replaced, then prove it serves.

The keeper (core.keeper) kept the pre-deploy version of everything the run replaced — the
engine unit and, through it, the image it names; the drafter's serving directory. `restore`
puts exactly those back (what the failed run wrote goes to `failed/` for diagnosis) and
restarts the previous engine, or stops the engine when there was none before. `restore_and_prove`
then runs the smoke gate against the restored stack with the profile it was deployed with
(its unit names the copy), because a rollback that was not proven to serve is a host without
a working stack that nobody knows about.

Failures prevented (issue 20, D2/D7): an unknown state directory or run id was answered
"replaced nothing" (exit 0); a truncated run record ended in a traceback; a copy-back that
failed (a full disk, a kept copy gone) had already moved the failed run's version aside, so the
path was left absent. Now the state directory, the run id and the record are checked before
anything is touched (`check_state_dir`, `check_run_id` of core.keeper, `read_record` — through
the record's one reader, core.keeper.load_run — and `require_known`); each kept copy is copied beside its path
first and swapped in only when complete, and a restore that stops part-way raises
`RestoreIncomplete` naming what was put back and what was not (never "restored"). The command's
outcome goes to the run's own directory, `<state>/runs/<run-id>/` (`OUTCOME`), on every exit path.
"""

from __future__ import annotations

import shutil
import signal
import subprocess
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from specdeploy.core import atomic, files, layout
from specdeploy.core.errors import SpecdeployError, UsageError
from specdeploy.core.keeper import (
    RUN_FILE,
    Entry,
    RunRecord,
    RunRecordError,
    close_run,
    copy_path,
    load_run,
    remove_path,
)
from specdeploy.engine import secret
from specdeploy.profile import load_profile
from specdeploy.smoke import run as smoke

OUTCOME = "restore.json"  # <state>/runs/<run-id>/restore.json: what `rollback restore|recover` did
SYSTEMCTL_TIMEOUT_S = 300  # a stop or restart that takes longer is reported, not waited on forever


class RollbackError(SpecdeployError):
    """The previous stack could not be put back (the host may be without a working engine)."""


class RestoreIncomplete(RollbackError):
    """A restore stopped part-way: `restored` were put back, `not_restored` are as the failed run
    left them (never reported as restored)."""

    def __init__(self, message: str, *, hint: str | None, restored: list[str], not_restored: list[str]) -> None:
        super().__init__(message, hint=hint)
        self.restored = restored
        self.not_restored = not_restored


Systemctl = Callable[[list[str]], None]


def systemctl(args: list[str]) -> None:
    try:
        done = subprocess.run(["systemctl", *args], capture_output=True, text=True, timeout=SYSTEMCTL_TIMEOUT_S)
    except (OSError, subprocess.TimeoutExpired) as exc:
        if isinstance(exc, subprocess.TimeoutExpired):
            cause = f"did not finish in {SYSTEMCTL_TIMEOUT_S} s"
        else:
            cause = f"cannot run: {exc.strerror or exc}"
        raise RollbackError(
            f"systemctl {' '.join(args)} {cause}",
            hint="run the rollback on the host whose systemd runs the engine (as root)",
        ) from None
    if done.returncode != 0:
        raise RollbackError(
            f"systemctl {' '.join(args)} failed (exit {done.returncode}): {done.stderr.strip()}",
            hint=f"inspect with `journalctl -u {layout.UNIT_NAME} -n 100` and restore by hand",
        )


# --------------------------------------------------------------------------- the inputs

STATE_HINT = "pass the host's state directory as --state-dir (`specdeploy facts` shows it as paths.state)"


def check_state_dir(host: layout.HostLayout) -> None:
    """The state directory exists (the deploy's specdeploy role creates it) and is a directory."""
    state = host.state
    if not state.exists():
        raise UsageError(
            f"--state-dir {state} does not exist: no deploy ran on this host with this state directory, "
            "so there is nothing of any run to restore",
            hint=STATE_HINT,
        )
    if not state.is_dir():
        raise UsageError(f"--state-dir {state}: expected a directory, found a file", hint=STATE_HINT)


def read_record(directory: Path) -> RunRecord | None:
    """The rollback directory's run record (core.keeper.load_run, its one reader: each field
    checked), or None when there is none. A damaged record is a RunRecordError (exit 2) naming
    the field — raised before anything is touched, and saying so."""
    try:
        return load_run(directory)
    except RunRecordError as exc:
        raise RunRecordError(f"{exc.message}; nothing was restored", hint=exc.hint) from None


def require_known(host: layout.HostLayout, run_id: str, record: RunRecord | None) -> None:
    """Run `run_id` is one this host knows: the rollback record is its, or it has a directory
    under <state>/runs (the deploy's first step and its gate make one). Else a usage error (exit
    2) saying what the host does know, instead of "replaced nothing"."""
    if (record is not None and record.run_id == run_id) or (host.runs / run_id).is_dir():
        return
    known = [record.run_id] if record is not None else []
    if host.runs.is_dir():
        runs = sorted((d for d in host.runs.iterdir() if d.is_dir()), key=lambda d: d.stat().st_mtime, reverse=True)
        known += [d.name for d in runs if d.name not in known][:5]
    where = (
        f"the rollback record there is run {record.run_id}'s"
        if record is not None
        else f"there is no rollback record ({host.rollback / RUN_FILE})"
    )
    raise UsageError(
        f"run {run_id} is unknown in --state-dir {host.state}: {where}, and {host.runs / run_id} does not exist; "
        "nothing was restored",
        hint=f"pass --run-id of a deploy run on this host (known here: {', '.join(known) or 'none'})",
    )


# --------------------------------------------------------------------------- restore


@dataclass
class Restored:
    run_id: str
    restored: list[str]
    removed: list[str]
    unit_action: str  # "restarted", "stopped" or "none"
    changed_since: float | None  # wall-clock time of the run's first replacement (downtime start)
    # why nothing was restored (the run replaced nothing, or it ended): for the message
    why_nothing: str = field(default="")

    @property
    def anything(self) -> bool:
        return bool(self.restored or self.removed)


def _put_back(directory: Path, n: int, entry: Entry) -> None:
    """Put one kept version back: the copy is made beside the path first and swapped in only
    when complete, so a failed copy leaves the path as the failed run left it (never absent);
    SIGTERM and SIGINT wait until the swap is done."""
    held = {signal.SIGTERM, signal.SIGINT}
    previous = signal.pthread_sigmask(signal.SIG_BLOCK, held)
    try:
        _swap_in(directory, n, entry)
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, previous)


def _swap_in(directory: Path, n: int, entry: Entry) -> None:
    path = Path(entry.path)
    tmp = path.parent / f".{path.name}.restore"
    if entry.kind != "absent":
        assert entry.copy is not None  # read_record checked it
        remove_path(tmp)
        try:
            copy_path(Path(entry.copy), tmp)
        except BaseException:
            remove_path(tmp)
            raise
    try:
        if path.exists() or path.is_symlink():
            atomic.ensure_dir(directory / "failed")
            failed = directory / "failed" / str(n)
            remove_path(failed)
            if path.is_symlink():  # a relative link would dangle in failed/: keep where it pointed
                failed.symlink_to(path.resolve())
                path.unlink()
            else:
                shutil.move(path, failed)  # keep what failed, for diagnosis (may cross filesystems)
    except BaseException:
        if entry.kind != "absent":
            remove_path(tmp)
        raise
    if entry.kind != "absent":
        tmp.rename(path)
        atomic.fsync_dir(path.parent)


def restore(
    directory: Path,
    run_id: str,
    *,
    unit: str,
    run: Systemctl = systemctl,
    unit_files: tuple[Path, ...] = tuple(layout.UNIT_FILES.values()),
    secrets: Path | None = None,
    podman: str = "podman",
) -> Restored:
    """Put back everything run `run_id` replaced, then restart (or stop) the engine unit. A key
    file put back under `secrets` gets its podman secret made again from it before the restart."""
    directory = Path(directory)
    record = read_record(directory)
    # a run that ended (its gate passed, or it was restored) is never restored (again): the play's
    # rescue calls this after any failure, including one after a passing gate
    if record is None or record.run_id != run_id or not record.entries or record.closed is not None:
        if record is None or record.run_id != run_id:
            why = "it replaced nothing (the rollback record holds no copies of its)"
        elif record.closed is not None:
            why = f"it ended already ({record.closed}): nothing is put back twice"
        else:
            why = "it replaced nothing"
        return Restored(run_id, [], [], "none", None, why)
    restored: list[str] = []
    removed: list[str] = []
    for n, entry in enumerate(record.entries):
        try:
            _put_back(directory, n, entry)
        except (OSError, SpecdeployError) as exc:
            cause = exc.message if isinstance(exc, SpecdeployError) else f"{type(exc).__name__}: {exc}"
            left = [e.path for e in record.entries[n:]]
            raise RestoreIncomplete(
                f"could not put back {entry.path} from its kept copy {entry.copy} ({cause}); it is left as the "
                f"failed run wrote it. Restored: {restored + removed or 'nothing'}; not restored: {left}; "
                "the engine was not restarted",
                hint=f"free space or fix the cause, then run `specdeploy rollback restore --run-id {run_id}` again "
                f"(the record stays open); the kept copies are in {directory / 'copies'}",
                restored=restored + removed,
                not_restored=left,
            ) from None
        (removed if entry.kind == "absent" else restored).append(entry.path)
    unit_entry = next((e for e in record.entries if Path(e.path).stem == unit), None)
    try:
        for entry in record.entries:  # the previous key, as the container engine reads it
            if secrets is not None and entry.kind == "file" and Path(entry.path).parent == Path(secrets):
                secret.renew_podman_secret(Path(entry.path), podman=podman)
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
    except (RollbackError, secret.SecretError) as exc:
        raise RestoreIncomplete(
            f"put back {restored + removed}, but the engine was not restarted: {exc.message}",
            hint=exc.hint,
            restored=restored + removed,
            not_restored=[],
        ) from None
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
            "not_restored": [],
            "unit_action": self.restored.unit_action,
            "unit_file": self.unit_file,
            "profile_file": self.profile_file,
            "previous_stack_serves": self.serves,
            "downtime_s": None if self.downtime_s is None else round(self.downtime_s, 1),
            "smoke": self.smoke,
            "message": self.message,
        }


def running_outcome(run_id: str) -> dict[str, Any]:
    """What the outcome file holds while a restore runs (a process that died leaves this)."""
    return {"run_id": run_id, "status": "running", "message": "the restore is running", "exit_code": None}


def ended_outcome(run_id: str, exc: BaseException, exit_code: int) -> dict[str, Any]:
    """The outcome of a restore that stopped with an error or a signal: what was put back (only
    what was complete) and what was not."""
    incomplete = exc if isinstance(exc, RestoreIncomplete) else None
    message = exc.message if isinstance(exc, SpecdeployError) else f"{type(exc).__name__}: {exc}".rstrip(": ")
    return {
        "run_id": run_id,
        "status": "error",
        "restored": incomplete.restored if incomplete else [],
        "not_restored": incomplete.not_restored if incomplete else None,
        "previous_stack_serves": False,
        "message": message,
        "hint": exc.hint if isinstance(exc, SpecdeployError) else None,
        "exit_code": exit_code,
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
    restored = restore(host.rollback, run_id, unit=unit, run=run, unit_files=unit_files, secrets=host.secrets)
    if not restored.anything:
        message = (
            "nothing to restore: this run replaced nothing, or it ended (passed its gate or was restored already)"
            f"; run {run_id}: {restored.why_nothing}"
        )
        return Outcome(restored, None, None, None, None, message)
    if restored.unit_action in ("stopped", "none"):
        message = "there was no previous engine on this host: nothing of this run's is left running"
        return Outcome(restored, None, None, None, None, message)
    unit_file = next((path for path in unit_files if path.is_file()), None)
    try:
        text = files.read_text(unit_file, what="engine unit", limit=files.LIMITS["json"]) if unit_file else None
        profile_file = layout.unit_profile_file(text) if text is not None else None
        if unit_file is None or profile_file is None:
            message = f"restored {len(restored.restored)} item(s), but the unit names no profile copy to prove it with"
            return Outcome(restored, str(unit_file) if unit_file else None, None, None, None, message)
        profile = load_profile(profile_file)
        endpoint = f"http://127.0.0.1:{profile.engine.serve.port}"
        options = smoke.SmokeOptions(show_progress=False, api_key=secret.read(profile, host))
        report = smoke.run(profile, endpoint, options)
    except SpecdeployError as exc:  # restored and restarted, but the proof could not run
        message = f"restored {len(restored.restored)} item(s) and restarted the engine, but could not prove it serves: "
        return Outcome(restored, str(unit_file), None, None, None, message + exc.message)
    ready = report.stage("readiness")
    ready_at = ready.details.get("ready_at") if ready else None
    downtime = ready_at - restored.changed_since if ready_at and restored.changed_since else None
    verdict = report.verdict.value
    message = f"previous stack ({profile.name}) restored; its smoke gate: {verdict}"
    return Outcome(restored, str(unit_file), profile_file, report.to_json(), downtime, message)


def open_run(host: layout.HostLayout, current_run_id: str) -> str | None:
    """The id of an earlier run that replaced things and never ended (interrupted), or None."""
    record = read_record(host.rollback)
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
