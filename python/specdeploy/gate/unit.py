"""The gate as a transient systemd unit (`specdeploy gate --as-unit`): a gate that outlives the
controller that started it.

Failure prevented: the controller (Ansible over SSH) dies mid-gate — the machine it runs on
reboots, its network drops, someone presses ^C twice. Run as a child of the SSH session, the gate
gets the session's SIGHUP or is killed with it: its report stays "running", the new stack serves
ungated, and nothing is rolled back. Started by systemd as `specdeploy-gate-<run id>.service`
(`systemd-run`), the gate belongs to no session: it finishes on its own, with its report and, when
the stack fails, the rollback with its proof. The caller only watches: it prints a line at least
every `PROGRESS_S` seconds while the unit runs, then the unit's report, and exits with the report's
exit code; killed, it leaves the unit running to its end.

A deploy starts the unit and returns at once (`gate --as-unit --detach`), then waits for it in short
looks (`gate-wait --run-id ID --for S`, exit `EXIT_RUNNING` while it runs): each look that finds it
running prints the gate's own last progress line (`<run dir>/gate.progress`: the check it runs and
how far it is), which the play shows as the task's retry, so a 20-minute gate says what it is doing
instead of "waiting on HOST" (issue 37).

The unit's output goes to the journal (`journalctl -u specdeploy-gate-<run id>`), never to the
caller's pipe: a gate writing to a pipe whose reader died would itself die of it.
"""

from __future__ import annotations

import json
import os
import re
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from specdeploy.core import deploylock, keeper, layout
from specdeploy.core import progress as steps
from specdeploy.core.errors import EXIT_TEMPFAIL, SpecdeployError, UsageError
from specdeploy.host import command

UNIT_PREFIX = "specdeploy-gate-"
_UNIT_SAFE_RE = re.compile(r"^[A-Za-z0-9_.-]+$")
PROGRESS_S = float(steps.LOOK_S)  # the caller's line while it waits, as a deploy's looks
POLL_S = 1.0
SYSTEMD_RUN = "systemd-run"
SYSTEMCTL = "systemctl"


class GateUnitError(SpecdeployError):
    """The gate's unit could not be started, or ended without a finished report."""

    exit_code = 2


def unit_name(run_id: str) -> str:
    """`specdeploy-gate-<run id>.service` (the run id checked first: it is part of a unit name)."""
    keeper.check_run_id(run_id)
    if not _UNIT_SAFE_RE.match(run_id):
        raise UsageError(
            f"--run-id {run_id!r}: expected letters, digits, '-', '_' or '.' for --as-unit, found other characters: "
            "the run id is part of the gate's unit name",
            hint="use a run id like the deploy's own (e.g. 20250101T120000000000Z)",
        )
    return f"{UNIT_PREFIX}{run_id}.service"


def _play_env() -> list[str]:
    """The play's run id, which the deploy lock knows the gate by (core.deploylock): a unit starts
    with systemd's environment, not the caller's."""
    run = os.environ.get(deploylock.ENV_RUN)
    return [f"--setenv={deploylock.ENV_RUN}={run}"] if run and _UNIT_SAFE_RE.match(run) else []


def _state(name: str, systemctl: str) -> dict[str, str]:
    done = command.run(
        [systemctl, "show", name, "--property=ActiveState,SubState,Result,ExecMainStatus,LoadState"], timeout=30
    )
    return dict(line.split("=", 1) for line in done.stdout.splitlines() if "=" in line)


def unit_state(run_id: str, systemctl: str = SYSTEMCTL) -> dict[str, str]:
    """systemd's state of the gate unit of `run_id` (ActiveState, SubState, Result, ...)."""
    return _state(unit_name(run_id), systemctl)


class GateStillRunning(SpecdeployError):
    """A verb that would change the stack a gate running as its unit is judging."""

    exit_code = EXIT_TEMPFAIL  # try again once the gate has ended


def refuse_while_running(run_id: str, doing: str, *, systemctl: str = SYSTEMCTL) -> None:
    """Refuse `doing` (e.g. "restore what run R replaced") while the gate of `run_id` runs as its unit:
    a deploy's rescue after its wait ran out, or a person, would restore the previous stack beneath a
    gate that is judging the new one and rolls back on its own when it fails. A host where systemd
    cannot be asked runs no gate unit: nothing to refuse."""
    try:
        state = unit_state(run_id, systemctl)
    except (SpecdeployError, OSError):
        return
    if state.get("ActiveState") in ("active", "activating", "deactivating", "reloading"):
        name = unit_name(run_id)
        raise GateStillRunning(
            f"the gate of run {run_id} still runs as {name}: not going to {doing} beneath it",
            hint=f"`specdeploy gate-wait --run-id {run_id}` waits for its verdict (a failing stack is restored by "
            f"the gate itself); `systemctl stop {name}` first if it must not finish",
        )


@dataclass(frozen=True)
class Running:
    """`wait`'s answer on a gate that still runs after `for_s`: one line on what it does now (`now`)."""

    line: str


def _finished(state: dict[str, str]) -> bool:
    return state.get("LoadState") == "not-found" or state.get("ActiveState") in ("inactive", "failed")


def _read_report(path: Path) -> dict[str, Any] | None:
    try:
        report = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return report if isinstance(report, dict) else None


def start(argv: list[str], run_id: str, *, systemd_run: str = SYSTEMD_RUN) -> str:
    """Start `argv` (a `specdeploy gate` without --as-unit) as the transient unit of `run_id` and return
    its name at once; the unit runs on whatever happens to the caller."""
    name = unit_name(run_id)
    try:
        started = command.run(
            [
                systemd_run, "--unit", name, "--collect", "--quiet", "--property=Type=exec",
                f"--description=specdeploy gate of run {run_id}", *_play_env(), "--", *argv,
            ],
            timeout=60,
        )  # fmt: skip
    except command.ProgramRunError as exc:
        raise GateUnitError(
            f"the gate's unit {name} could not be started: {exc.message}",
            hint="--as-unit needs systemd (systemd-run); without it, run the gate without --as-unit",
        ) from None
    if started.returncode != 0:
        raise GateUnitError(
            f"the gate's unit {name} could not be started: {(started.stderr or started.stdout).strip()[-500:]}",
            hint="a unit of that name exists when this run was gated already (start a new run id); "
            "otherwise check that systemd runs on this host (`systemctl is-system-running`)",
        )
    return name


def now(run_id: str, report_path: Path, progress_path: Path, state: dict[str, str]) -> str:
    """One line on a running gate: its unit's state and the gate's own last progress line (the check
    it runs and how far it is), else its report's verdict: `unit active; 12:03:40 gate: 1m00s, last:
    smoke: coherence prompts 7/12` (short: a play shows it after the host and the attempt)."""
    try:
        with progress_path.open("rb") as kept:  # one line, the gate's own; read as untrusted all the same
            said = [steps.clean(text) for text in kept.read(4096).decode(errors="replace").splitlines()]
    except OSError:
        said = []
    said = [text for text in said if text]
    last = said[-1] if said else f"report: {(_read_report(report_path) or {}).get('verdict', 'not yet written')}"
    return f"unit {state.get('ActiveState', '?')}; {last}"


def _finished_report(
    name: str, run_id: str, report_path: Path, state: dict[str, str], *, started: bool
) -> dict[str, Any]:
    report = _read_report(report_path)
    if not started and report is None and state.get("LoadState") == "not-found" and not report_path.parent.exists():
        raise GateUnitError(
            f"no gate runs for run {run_id}: there is no unit {name} and no report at {report_path}",
            hint="pass the run id the gate was started with (`specdeploy gate --as-unit --detach --run-id ID`); "
            f"a gate started with this one ended before writing its report: `journalctl -u {name}` says why",
        )
    if report is None or report.get("verdict") == "running" or report.get("finished_at") is None:
        status = state.get("ExecMainStatus") or "?"
        raise GateUnitError(
            f"the gate's unit {name} ended (exit status {status}) without a finished report at {report_path}",
            hint=f"read `journalctl -u {name}`; then `specdeploy rollback restore --run-id {run_id}` puts back what "
            "this run replaced and proves the previous stack serves",
        )
    return report


def wait(
    run_id: str,
    report_path: Path,
    *,
    for_s: float | None = None,
    progress_path: Path | None = None,
    progress: Callable[[str], None] | None = None,
    systemctl: str = SYSTEMCTL,
    poll_s: float = POLL_S,
    progress_s: float = PROGRESS_S,
    started: bool = False,
) -> dict[str, Any] | Running:
    """Wait for the unit of `run_id` to end and return the report it wrote at `report_path`; with
    `for_s`, `Running` (its `now(...)` line, from the state last read) when it still runs after that
    long. `progress` gets `now(...)` every `progress_s` while it runs. `started`: this caller started
    it (else no unit and no report is "no gate runs for that run id"). A unit that ended without a
    finished report (killed, or a crash before the report) is a GateUnitError naming its journal."""
    name = unit_name(run_id)
    progress_path = progress_path or report_path.with_name(layout.GATE_PROGRESS)
    begun = last = time.monotonic()
    while True:
        state = _state(name, systemctl)
        if _finished(state):
            return _finished_report(name, run_id, report_path, state, started=started)
        now_s = time.monotonic()
        if for_s is not None and now_s - begun >= for_s:
            return Running(now(run_id, report_path, progress_path, state))
        if progress is not None and now_s - last >= progress_s:
            last = now_s
            progress(f"gate: {name} {now(run_id, report_path, progress_path, state)}")
        time.sleep(poll_s)


def run(
    argv: list[str],
    run_id: str,
    report_path: Path,
    *,
    progress: Callable[[str], None] | None = None,
    systemd_run: str = SYSTEMD_RUN,
    systemctl: str = SYSTEMCTL,
    poll_s: float = POLL_S,
    progress_s: float = PROGRESS_S,
) -> dict[str, Any]:
    """Start `argv` as the unit of `run_id` (`start`), wait for it to end (`wait`) and return its report."""
    say = progress or steps.plain  # through progress's one writer: never interleaved with a ticker's line
    name = start(argv, run_id, systemd_run=systemd_run)
    say(f"gate: running as {name} (it finishes even if this command is killed; journalctl -u {name})")
    report = wait(
        run_id, report_path, progress=say, systemctl=systemctl, poll_s=poll_s, progress_s=progress_s, started=True
    )
    assert not isinstance(report, Running)  # no for_s: only an ended unit returns
    return report
