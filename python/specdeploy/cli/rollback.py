"""`specdeploy rollback restore|recover`: put back what a deploy run replaced, and prove it serves.
`recover` is a deploy's first step: it restores a run that was interrupted before its gate."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer
from rich.table import Table

from specdeploy.cli import base, output
from specdeploy.cli.smoke import smoke_table
from specdeploy.core import atomic, layout

rollback_app = base.group("Put back what a failed deploy replaced, and prove it serves.")


def _report(outcome: Any, json_path: Path | None) -> None:
    """One table (or JSON) for a restore's outcome, optionally also written as JSON."""
    data = outcome.to_json()

    def table() -> None:
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
            t.add_row(key, output.text(data[key]))
        output.out.print(t)
        if outcome.smoke:
            output.out.print(smoke_table(outcome.smoke))

    output.emit(data, False, table)
    if json_path is not None:
        atomic.write_json(json_path, data)


JsonFileOpt = Annotated[Path | None, typer.Option("--json", help="also write the outcome as JSON here")]


@rollback_app.command("restore")
def rollback_restore(
    run_id: base.RunIdOpt,
    state_dir: base.StateDirOpt = None,
    unit: base.UnitOpt = layout.UNIT_NAME,
    json_path: JsonFileOpt = None,
) -> None:
    """Restore the unit and serving directory run RUN_ID replaced, restart the engine, and
    run the smoke gate against it with the profile it was deployed with.

    Exit 0 when the previous stack serves again (its smoke gate passes) or the run replaced
    nothing (already restored, or failed before replacing anything), 1 otherwise.
    """
    from specdeploy.rollback import restore  # proving runs the smoke: imported only here

    outcome = restore.restore_and_prove(base.host_layout(state_dir=state_dir), run_id, unit=unit)
    _report(outcome, json_path)
    raise typer.Exit(0 if outcome.serves or not outcome.restored.anything else 1)


@rollback_app.command("recover")
def rollback_recover(
    run_id: base.RunIdOpt,
    state_dir: base.StateDirOpt = None,
    unit: base.UnitOpt = layout.UNIT_NAME,
    json_path: JsonFileOpt = None,
) -> None:
    """A deploy's first step: when an earlier run was interrupted after replacing something
    (no passing gate, no restore), restore its copies and prove the previous stack serves
    before run RUN_ID replaces anything.

    Exit 0 when there was nothing to recover or the previous stack serves again, 1 when it
    was restored but does not serve (fix the host before deploying again).
    """
    from specdeploy.rollback import restore

    outcome = restore.recover(base.host_layout(state_dir=state_dir), run_id, unit=unit)
    if outcome is None:
        output.out.print("rollback recover: no interrupted run to recover")
        raise typer.Exit(0)
    output.out.print(f"rollback recover: run {outcome.restored.run_id} was interrupted; restored its copies")
    _report(outcome, json_path)
    raise typer.Exit(0 if outcome.serves or not outcome.restored.anything else 1)


def register(app: typer.Typer) -> None:
    app.add_typer(rollback_app, name="rollback")
