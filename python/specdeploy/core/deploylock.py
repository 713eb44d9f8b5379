"""One deploy at a time on a host: the deploy lock (`<state>/deploy.lock`).

Failure prevented: two plays against one host at once (two operators, a CI job and a person, a
re-run started while the first still gates). The second play's first act is to recover an
"interrupted" run — the first one's live run, under its gate: it restores the previous stack
beneath a gate that is judging the new one, and both report nonsense. A `specdeploy` verb that
writes the host (`rollback restore`, `gate`, `unit install`, `weights fetch|serve|prune|access`,
`drafter write-config`, `image ensure`, `engine api-key|remove|venv`, `watch units`, `cdi record|keep`),
run by hand in the middle of a
play, does the same.

The lock is a record (JSON: who holds it, since when, until when), written under an flock of
the state directory so that taking and releasing it are atomic. Two kinds of holder:

| holder | takes it | gives it back | if it dies |
|---|---|---|---|
| a play | its first task after the CLI's install | its last task, or its rescue | held until the lease ends |
| a verb run by hand | `held(...)` around the verb | when the verb ends | free (its process is gone) |

A play's lock left by a dead controller is freed by hand (`specdeploy deploy-lock release
--run-id R`) once nothing of that run runs, or by its lease's end (default 6 h).

A verb run by a play carries the play's run id in `SPECDEPLOY_DEPLOY_RUN` (deploy.yml sets it
for every task) and runs under the play's lock. Anyone else waits up to `wait_s`, then is
refused with the holder named: its run id, what it does, where it came from, since when.
"""

from __future__ import annotations

import contextlib
import dataclasses
import datetime as dt
import fcntl
import json
import os
import socket
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from specdeploy.core import atomic
from specdeploy.core.errors import EXIT_TEMPFAIL, SpecdeployError

LOCK_NAME = "deploy.lock"
ENV_RUN = "SPECDEPLOY_DEPLOY_RUN"  # the run id of the play a verb runs under
DEFAULT_LEASE_S = 6 * 3600.0
POLL_S = 2.0
PROGRESS_S = 15.0


class DeployLockHeld(SpecdeployError):
    """Another deploy holds this host."""

    exit_code = EXIT_TEMPFAIL  # try again later


@dataclasses.dataclass(frozen=True)
class Holder:
    run_id: str
    what: str
    origin: str  # the controller (or user@host) it came from, as the holder said
    pid: int | None  # a verb's own process; None for a play (its tasks come and go)
    since_unix: float
    until_unix: float

    def to_json(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    def describe(self) -> str:
        since = dt.datetime.fromtimestamp(self.since_unix, dt.UTC).isoformat(timespec="seconds")
        who = f"pid {self.pid}" if self.pid is not None else "a play"
        return f"run {self.run_id} ({self.what}, {who} from {self.origin}, since {since})"

    def alive(self, now: float) -> bool:
        if now >= self.until_unix:
            return False
        if self.pid is not None:
            try:
                os.kill(self.pid, 0)
            except ProcessLookupError:
                return False
            except PermissionError:
                return True
        return True


def _path(state: Path) -> Path:
    return Path(state) / LOCK_NAME


@contextlib.contextmanager
def _guarded(state: Path) -> Iterator[None]:
    """An flock on the state directory itself: one reader-writer of the record at a time, on this
    host, and no file of its own left behind (a verb by hand that ends leaves the state as it was)."""
    state = Path(state)
    try:
        fd = os.open(state, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except PermissionError:
        raise SpecdeployError(
            f"cannot take this host's deploy lock: {state} is not open to this user (uid {os.getuid()}); "
            "nothing was changed",
            hint="run it as root (`sudo specdeploy ...`), as the deploy does: the lock keeps a deploy and a verb "
            "by hand from writing the host at once",
        ) from None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


def current(state: Path) -> Holder | None:
    """The holder on record (alive or not), or None."""
    try:
        data = json.loads(_path(state).read_text())
        return Holder(**{f.name: data[f.name] for f in dataclasses.fields(Holder)})
    except FileNotFoundError:
        return None
    except (OSError, ValueError, KeyError, TypeError):
        return None  # an unreadable record holds nothing: it is replaced by the next holder


def _try(state: Path, holder: Holder, now: float) -> tuple[bool, Holder | None]:
    """Take the lock for `holder` unless someone else alive holds it: (taken, the one found)."""
    with _guarded(state):
        found = current(state)
        if found is None or found.run_id == holder.run_id or not found.alive(now):
            atomic.write_json(_path(state), holder.to_json(), mode=0o640)
            return True, found
        return False, found


def acquire(
    state: Path,
    run_id: str,
    what: str,
    *,
    origin: str | None = None,
    pid: int | None = None,
    lease_s: float = DEFAULT_LEASE_S,
    wait_s: float = 0.0,
    progress: Callable[[str], None] | None = None,
    poll_s: float = POLL_S,
) -> Holder | None:
    """Hold the host for `run_id` (again, when it holds it already). Waits up to `wait_s` for another
    holder to give it back; then DeployLockHeld naming that holder. Returns the previous holder
    when it replaced one that was gone or whose lease had ended (None otherwise)."""
    begun = time.monotonic()
    last_said = begun
    while True:
        now = time.time()
        holder = Holder(run_id, what, origin or _origin(), pid, now, now + lease_s)
        taken, found = _try(state, holder, now)
        if taken:
            return found if found is not None and found.run_id != run_id else None
        assert found is not None
        waited = time.monotonic() - begun
        if waited >= wait_s:
            raise DeployLockHeld(
                f"this host is being deployed by {found.describe()}: {what} (run {run_id}) did not start"
                + (f" (waited {waited:.0f} s)" if wait_s else ""),
                hint="wait for that deploy to end and run this again (or pass a longer wait: "
                "-e specdeploy_lock_wait_s=SECONDS); if it died and will not come back, free the host with "
                f"`specdeploy deploy-lock release --run-id {found.run_id}` on it, after checking nothing of it runs",
            )
        if progress is not None and time.monotonic() - last_said >= PROGRESS_S:
            last_said = time.monotonic()
            progress(f"waiting {waited:.0f} s for {found.describe()} to finish")
        time.sleep(poll_s)


def release(state: Path, run_id: str) -> Holder | None:
    """Give the lock back if `run_id` holds it; returns the holder removed (None: held by another
    or by nobody, nothing changed)."""
    with _guarded(state):
        found = current(state)
        if found is None or found.run_id != run_id:
            return None
        _path(state).unlink()
        return found


@contextlib.contextmanager
def held(state: Path, what: str, *, run_id: str | None = None, wait_s: float = 0.0) -> Iterator[None]:
    """Around a verb that writes the host: under the play it runs in (its run id in
    SPECDEPLOY_DEPLOY_RUN, holding the lock) nothing is taken; otherwise the lock is this process's
    for the verb's duration, refused while someone else holds it."""
    state = Path(state)
    play = os.environ.get(ENV_RUN)
    holder = current(state) if state.is_dir() else None
    if play and holder is not None and holder.run_id == play:
        yield
        return
    if not state.is_dir():  # nothing deployed here yet: nothing to guard (the verb says what is missing)
        yield
        return
    own = run_id or f"{what.split()[0]}-{os.getpid()}"
    acquire(state, own, what, pid=os.getpid(), wait_s=wait_s)
    try:
        yield
    finally:
        release(state, own)


def _origin() -> str:
    user = os.environ.get("SUDO_USER") or os.environ.get("USER") or str(os.getuid())
    return f"{user}@{socket.gethostname()}"
