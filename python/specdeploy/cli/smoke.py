"""`specdeploy smoke`: the smoke checks against an endpoint, by hand (the deploy runs `gate`).

Heavy stage modules are imported inside the commands that use them: every other command
(Ansible calls several per deploy) starts without loading numpy and the HTTP clients."""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.table import Table

from specdeploy.cli import base, output
from specdeploy.core import atomic
from specdeploy.profile import load_profile


def smoke_table(report: dict[str, Any]) -> Table:
    """The smoke report (its JSON form) as a table, with its diagnosis and verdict after it."""
    table = Table("stage", "result", "summary", title=f"smoke {report['profile']} @ {report['endpoint']}")
    for stage in report["stages"]:
        table.add_row(stage["name"], output.status(stage["status"]), output.text(stage["summary"]))
    return table


def print_smoke(report: dict[str, Any]) -> None:
    output.out.print(smoke_table(report))
    for line in report["diagnosis"]:
        output.out.print(f"[bold]diagnosis:[/] {output.text(line)}", highlight=False)
    output.out.print(
        f"verdict: [bold]{report['verdict']}[/] (exit {report['exit_code']}) in {report['elapsed_s']:.1f}s"
    )


def smoke(
    endpoint: Annotated[str, typer.Option("--endpoint", help="base URL, e.g. http://127.0.0.1:8000")],
    profile: base.ProfileOpt,
    json_path: Annotated[Path | None, typer.Option("--json", help="also write the report as JSON here")] = None,
    golden: Annotated[Path | None, typer.Option(help="compare with a golden transcript", **base.InputFile)] = None,
    record_golden: Annotated[
        Path | None, typer.Option(help="record a golden transcript (at a verified deploy)")
    ] = None,
    readiness_timeout: Annotated[float | None, typer.Option(help="seconds to wait for readiness")] = None,
) -> None:
    """The smoke gate: readiness, identity, coherence, golden, acceptance, throughput.

    Exit 0 pass, 1 fail, 2 could not test (unreachable, server error), 3 inconclusive.
    The API key, when the server needs one, is read from $SPECDEPLOY_API_KEY (never argv).
    """
    from specdeploy.smoke import stages  # numpy, httpx: only when a smoke runs

    options = stages.SmokeOptions(
        golden=golden,
        record_golden=record_golden,
        api_key=os.environ.get("SPECDEPLOY_API_KEY") or None,
        show_progress=sys.stderr.isatty(),
        readiness_timeout_s=readiness_timeout,
    )
    report = stages.run(load_profile(profile), endpoint, options).to_json()
    print_smoke(report)
    if json_path is not None:
        atomic.write_json(json_path, report)
    raise typer.Exit(report["exit_code"])


def register(app: typer.Typer) -> None:
    app.command("smoke")(smoke)
