"""`specdeploy rollback restore|recover`: put back what a deploy run replaced, and prove it serves.
`recover` is a deploy's first step: it restores a run that was interrupted before its gate.

Both check their inputs before touching anything — the run id, the state directory, the
rollback record (regular, bounded JSON of the keeper's shape) and, for `restore`, that the run
is one this host knows — and write the outcome to the restored run's own directory,
`<state>/runs/<run-id>/restore.json` (and the --json copy), on every exit path (issue 20, D2/D7).
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer
from rich.table import Table

from specdeploy.cli import base, output
from specdeploy.cli.smoke import smoke_table
from specdeploy.core import atomic, deploylock, keeper, layout
from specdeploy.core.errors import EXIT_INTERNAL, EXIT_INTERRUPTED, SpecdeployError, UsageError, WriteError
from specdeploy.smoke.reports import ReportFile, check_writable

rollback_app = base.group("Put back what a failed deploy replaced, and prove it serves.")


def _print(data: dict[str, Any]) -> None:
    """One table for a restore's outcome (its JSON form)."""
    t = Table(title="rollback", show_header=False)
    for key in (
        "message",
        "restored",
        "removed",
        "unit_action",
        "profile_file",
        "previous_stack_serves",
        "downtime_s",
    ):
        t.add_row(*output.cells(key, data[key]))
    output.out.print(t)
    if data.get("smoke"):
        output.out.print(smoke_table(data["smoke"]))


JsonFileOpt = Annotated[Path | None, typer.Option("--json", help="also write the outcome as JSON here")]


def _outcome_files(host: layout.HostLayout, run_id: str, json_path: Path | None) -> list[ReportFile]:
    """The outcome's files, claimed ("running") before anything is restored: the run's own
    `<state>/runs/<run-id>/restore.json`, and the --json copy when given."""
    from specdeploy.rollback import restore

    directory = host.runs / run_id
    try:
        atomic.ensure_dir(directory)
    except WriteError as exc:
        raise UsageError(
            f"--state-dir {host.state}: the run's directory {directory} cannot be made ({exc.message}); "
            "nothing was restored",
            hint="run as a user that can write the state directory (root on a host)",
        ) from None
    targets = [ReportFile(directory / restore.OUTCOME, "--state-dir")]
    if json_path is not None:
        targets.append(ReportFile(json_path, "--json"))
    for target in targets:
        target.claim(restore.running_outcome(run_id))
    return targets


def _restore(host: layout.HostLayout, run_id: str, unit: str, json_path: Path | None, *, recovering: bool) -> int:
    """Restore and prove run `run_id`, writing its outcome on every exit path; the exit code."""
    from specdeploy.core.verdicts import Interrupted, sigterm_interrupts
    from specdeploy.rollback import restore  # proving runs the smoke: imported only here

    targets = _outcome_files(host, run_id, json_path)

    def write(data: dict[str, Any]) -> None:
        for target in targets:
            target.write(data)

    try:
        with sigterm_interrupts():
            outcome = restore.restore_and_prove(host, run_id, unit=unit)
    except (Interrupted, KeyboardInterrupt) as exc:
        write(restore.ended_outcome(run_id, exc, EXIT_INTERRUPTED) | {"status": "interrupted"})
        output.err.print(
            f"interrupted: run `specdeploy rollback restore --run-id {run_id}` again to finish", highlight=False
        )
        raise typer.Exit(EXIT_INTERRUPTED) from None
    except SpecdeployError as exc:
        write(restore.ended_outcome(run_id, exc, exc.exit_code))
        raise
    except Exception as exc:  # a bug: the boundary reports it (exit 70); the outcome says so too
        write(restore.ended_outcome(run_id, exc, EXIT_INTERNAL))
        raise
    code = 0 if outcome.serves or not outcome.restored.anything else 1
    data = outcome.to_json() | {"status": "done", "exit_code": code, "outcome_file": str(targets[0].path)}
    write(data)  # before anything is printed: what is printed is what is on disk
    if recovering:
        output.out.print(f"rollback recover: run {run_id} was interrupted; restored its copies")
    _print(data)
    return code


@rollback_app.command("restore")
def rollback_restore(
    run_id: base.RunIdOpt,
    state_dir: base.StateDirOpt = None,
    unit: base.UnitOpt = layout.UNIT_NAME,
    json_path: JsonFileOpt = None,
) -> None:
    """Restore the unit and serving directory run RUN_ID replaced, restart the engine, and
    run the smoke gate against it with the profile it was deployed with.

    Checks first (exit 2, nothing touched): the run id, the state directory, the rollback record,
    and that RUN_ID is a run this host knows. Writes <state>/runs/RUN_ID/restore.json on every
    exit path. Exit 0 when the previous stack serves again (its smoke gate passes) or the run
    replaced nothing (already restored, or failed before replacing anything), 1 otherwise
    (a restore that stopped part-way names what was put back and what was not), 2 bad input,
    75 while the gate of RUN_ID still runs as its unit (it restores on its own when it fails).
    """
    from specdeploy.gate import unit as gate_unit
    from specdeploy.rollback import restore

    host = base.host_layout(state_dir=state_dir)
    keeper.check_run_id(run_id)
    restore.check_state_dir(host)
    restore.require_known(host, run_id, restore.read_record(host.rollback))
    if json_path is not None:
        check_writable(json_path, "--json")
    gate_unit.refuse_while_running(run_id, f"restore what run {run_id} replaced")
    with deploylock.held(host.state, f"rollback restore of run {run_id}"):
        code = _restore(host, run_id, unit, json_path, recovering=False)
    raise typer.Exit(code)


@rollback_app.command("recover")
def rollback_recover(
    run_id: base.RunIdOpt,
    state_dir: base.StateDirOpt = None,
    unit: base.UnitOpt = layout.UNIT_NAME,
    json_path: JsonFileOpt = None,
) -> None:
    """A deploy's first step: when an earlier run was interrupted after replacing something
    (no passing gate, no restore), restore its copies and prove the previous stack serves
    before run RUN_ID replaces anything. Registers RUN_ID (<state>/runs/RUN_ID/), so a later
    `rollback restore --run-id RUN_ID` knows it.

    Exit 0 when there was nothing to recover or the previous stack serves again, 1 when it
    was restored but does not serve (fix the host before deploying again), 2 bad input (a
    state directory that does not exist, a damaged rollback record: nothing touched).
    """
    from specdeploy.rollback import restore

    host = base.host_layout(state_dir=state_dir)
    keeper.check_run_id(run_id)
    restore.check_state_dir(host)
    with deploylock.held(host.state, f"rollback recover for run {run_id}"):
        code = _recover(host, run_id, unit, json_path)
    raise typer.Exit(code)


def _recover(host: layout.HostLayout, run_id: str, unit: str, json_path: Path | None) -> int:
    """rollback recover, under the deploy lock: the exit code."""
    from specdeploy.gate import unit as gate_unit
    from specdeploy.rollback import restore

    interrupted = restore.open_run(host, run_id)  # reads and checks the record before anything changes
    if interrupted is not None:  # "interrupted" only to this run: its gate may still judge it
        gate_unit.refuse_while_running(interrupted, f"recover run {interrupted} for run {run_id}")
    if json_path is not None:
        check_writable(json_path, "--json")
        if interrupted is None:
            ReportFile(json_path, "--json").claim({"run_id": run_id, "status": "done", "recovered": None})
    try:
        atomic.ensure_dir(host.runs / run_id)  # this run is known from its first step on
    except WriteError as exc:
        raise UsageError(
            f"--state-dir {host.state}: the run's directory {host.runs / run_id} cannot be made ({exc.message})",
            hint="run as a user that can write the state directory (root on a host)",
        ) from None
    if interrupted is None:
        output.out.print("rollback recover: no interrupted run to recover")
        return 0
    return _restore(host, interrupted, unit, json_path, recovering=True)


def register(app: typer.Typer) -> None:
    app.add_typer(rollback_app, name="rollback")
