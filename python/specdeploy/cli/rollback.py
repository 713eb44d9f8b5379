"""`specdeploy rollback restore`: put back what a deploy run replaced, and prove it serves."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from rich.table import Table

from specdeploy.cli import base, output
from specdeploy.cli.smoke import smoke_table
from specdeploy.core import atomic, layout

rollback_app = base.group("Put back what a failed deploy replaced, and prove it serves.")


@rollback_app.command("restore")
def rollback_restore(
    run_id: base.RunIdOpt,
    state_dir: base.StateDirOpt = None,
    unit: base.UnitOpt = layout.UNIT_NAME,
    json_path: Annotated[Path | None, typer.Option("--json", help="also write the outcome as JSON here")] = None,
) -> None:
    """Restore the unit and serving directory run RUN_ID replaced, restart the engine, and
    run the smoke gate against it with the profile it was deployed with.

    Exit 0 when the previous stack serves again (its smoke gate passes), 1 otherwise.
    """
    from specdeploy.rollback import restore  # proving runs the smoke: imported only here

    outcome = restore.restore_and_prove(base.host_layout(state_dir=state_dir), run_id, unit=unit)
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
    raise typer.Exit(0 if outcome.serves else 1)


def register(app: typer.Typer) -> None:
    app.add_typer(rollback_app, name="rollback")
