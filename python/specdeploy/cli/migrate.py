"""`specdeploy migrate`: move a serving deployment to a new host (docs/migration.md).

`migrate compare OLD NEW --profile P` is verify's comparison of two gate reports (`gate.json`, as
`<state>/runs/<run-id>/` holds them): the table of migrate.compare, every line with both values.
Exit 0 when NEW serves what OLD serves, 1 when a line differs, 2 when a report or the profile
cannot be read.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer
from rich.table import Table

from specdeploy.cli import base, output
from specdeploy.core import files
from specdeploy.core.errors import InputFileError

migrate_app = base.group("Move a serving deployment to a new host: verify's comparison (docs/migration.md).")


def _report(path: Path, which: str) -> dict[str, Any]:
    data = files.read_json(path, what=f"{which}'s gate report")
    if not isinstance(data, dict) or "verdict" not in data or "smoke" not in data:
        raise InputFileError(
            f"{which}'s gate report {path}: expected a gate.json (an object with `verdict` and `smoke`), "
            f"found {type(data).__name__}{' without them' if isinstance(data, dict) else ''}; nothing was compared",
            hint="pass the gate.json of a run: <state>/verified/gate.json on the host names its last verified run",
        )
    return data


@migrate_app.command("compare")
def compare_reports(
    old: Annotated[Path, typer.Argument(metavar="OLD", help="OLD's last verified gate.json")],
    new: Annotated[Path, typer.Argument(metavar="NEW", help="NEW's gate.json")],
    profile: Annotated[str, typer.Option("--profile", help="profile name or file: its migration tolerance")],
    as_json: base.JsonOpt = False,
) -> None:
    """Compare NEW's gate report with OLD's: identity, golden transcript, acceptance, decode rate.

    Exit 0 when NEW serves what OLD serves, 1 when a line differs, 2 when a report cannot be read.
    """
    from specdeploy.migrate import compare
    from specdeploy.profile import load_profile, resolve_profile_path

    tolerance = load_profile(resolve_profile_path(profile)).migration.decode_rate_tolerance
    result = compare.compare(_report(old, "OLD"), _report(new, "NEW"), decode_rate_tolerance=tolerance)

    def table() -> None:
        t = Table("", "what", "OLD", "NEW", "note", title=f"migrate compare {old} {new}")
        for line in result.lines:
            mark = "·" if line.same is None else output.MARKS[line.same]
            t.add_row(*output.cells(mark, line.what, line.old, line.new, line.note))
        output.out.print(t)
        output.out.print(("[green]" if result.same else "[bold red]") + result.summary() + "[/]")

    output.emit(result.to_json(), as_json, table)
    raise typer.Exit(0 if result.same else 1)


def register(app: typer.Typer) -> None:
    app.add_typer(migrate_app, name="migrate")
