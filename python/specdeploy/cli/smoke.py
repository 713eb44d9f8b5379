"""`specdeploy smoke`: the smoke checks against an endpoint, by hand (the deploy runs `gate`).

Every input is checked before the first stage: the profile, a --golden transcript, the
endpoint (a base URL), and where --json and --record-golden will be written. The --json report
is then written on every exit path — a verdict, a stage that could not test, Ctrl-C or SIGTERM
(exit 130), a bug (exit 70) — before the verdict is printed, so what is printed, what is on
disk and the exit code always agree (issue 20, D2/D8/D16).

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
from specdeploy.core.errors import EXIT_INTERNAL, EXIT_INTERRUPTED, SpecdeployError, UsageError
from specdeploy.profile import load_profile
from specdeploy.smoke.reports import ReportFile, check_writable


def smoke_table(report: dict[str, Any]) -> Table:
    """The smoke report (its JSON form) as a table, with its diagnosis and verdict after it."""
    table = Table("stage", "result", "summary", title=f"smoke {report['profile']} @ {report['endpoint']}")
    for stage in report["stages"]:
        table.add_row(*output.cells(stage["name"], output.status(stage["status"]), output.text(stage["summary"])))
    return table


def answers_table(report: dict[str, Any]) -> Table | None:
    """The model's answers to the known-answer prompts (first line of each), right or wrong: what the
    accuracy stage judged, shown so a person sees what the stack said, not only a share."""
    accuracy = next((s for s in report["stages"] if s["name"] == "accuracy"), None)
    found = (accuracy or {}).get("details") or {}
    if not any(isinstance(v, dict) and v.get("answers") for v in found.values()):
        return None
    table = Table("known answer", "right", "the model's answer", title="answers")
    for judged in found.values():
        if not isinstance(judged, dict):
            continue
        for name, text in (judged.get("answers") or {}).items():
            right = name not in (judged.get("wrong") or {})
            first = " ".join(str(text).split())[:100]
            table.add_row(*output.cells(name, output.status("pass" if right else "fail"), first))
    return table


def print_smoke(report: dict[str, Any]) -> None:
    if (answers := answers_table(report)) is not None:
        output.out.print(answers)
    output.out.print(smoke_table(report))
    for line in report["diagnosis"]:
        output.out.print(f"[bold]diagnosis:[/] {output.text(line)}", highlight=False)
    for stage in report["stages"]:  # what could not be tested, in full (a table cell wraps), and what to do
        if stage["status"] == "error":
            output.out.print(f"[bold]{stage['name']}:[/] {output.text(stage['summary'])}", highlight=False)
            if stage.get("hint"):
                output.out.print(f"  [bold]fix:[/] {output.text(stage['hint'])}", highlight=False)
    output.out.print(
        f"verdict: [bold]{report['verdict']}[/] (exit {report['exit_code']}) in {report['elapsed_s']:.1f}s"
    )


def smoke(
    endpoint: Annotated[str, typer.Option("--endpoint", help="base URL, e.g. http://127.0.0.1:8000")],
    profile: base.ProfileOpt,
    json_path: Annotated[Path | None, typer.Option("--json", help="also write the report as JSON here")] = None,
    golden: Annotated[Path | None, typer.Option(help="compare with a golden transcript")] = None,
    record_golden: Annotated[
        Path | None, typer.Option(help="record a golden transcript (at a verified deploy)")
    ] = None,
    readiness_timeout: Annotated[float | None, typer.Option(help="seconds to wait for readiness")] = None,
) -> None:
    """The smoke gate: readiness, identity, coherence, accuracy, concurrency, lossless, prefix cache,
    golden, acceptance, long context, throughput.

    Exit 0 pass, 1 fail, 2 could not test (unreachable, a server error, an answer that is not the
    engine's API) or bad input, 3 inconclusive, 130 interrupted. --json is written on every exit path.
    The API key, when the server needs one, is read from $SPECDEPLOY_API_KEY (never argv).
    """
    from specdeploy.core.verdicts import Interrupted, sigterm_interrupts
    from specdeploy.smoke import run as stages  # numpy, httpx: only when a smoke runs

    options = stages.SmokeOptions(
        golden=golden,
        record_golden=record_golden,
        api_key=os.environ.get("SPECDEPLOY_API_KEY") or None,
        show_progress=sys.stderr.isatty(),
        readiness_timeout_s=readiness_timeout,
    )
    if readiness_timeout is not None and not readiness_timeout > 0:
        raise UsageError(
            f"--readiness-timeout: expected a number of seconds > 0, found {readiness_timeout:g}",
            hint="pass --readiness-timeout a positive number of seconds (the profile's smoke.readiness_timeout_s "
            "when left out)",
        )
    run = stages.Smoke(load_profile(profile), endpoint, options)  # reads and checks --golden: before any stage
    if record_golden is not None:
        check_writable(record_golden, "--record-golden", create_parents=True)
    target = ReportFile(json_path, "--json") if json_path is not None else None
    if target is not None:
        target.claim(stages.running_report(run.profile.name, endpoint))
    try:
        with sigterm_interrupts():
            report = stages.execute(run).to_json()
    except (Interrupted, KeyboardInterrupt) as exc:
        if target is not None:
            target.write(run.report.ended("interrupted", EXIT_INTERRUPTED, f"interrupted ({exc or 'SIGINT'})"))
        output.err.print("interrupted", highlight=False)
        raise typer.Exit(EXIT_INTERRUPTED) from None
    except SpecdeployError as exc:
        if target is not None:
            target.write(run.report.ended("error", exc.exit_code, f"could not test: {exc.message}"))
        raise
    except Exception as exc:  # a bug: the boundary reports it (exit 70); the report says so too
        if target is not None:
            target.write(run.report.ended("error", EXIT_INTERNAL, f"the smoke itself failed: {type(exc).__name__}"))
        raise
    if target is not None:
        target.write(report)  # before the verdict is printed: a failed write is the only answer
    print_smoke(report)
    raise typer.Exit(report["exit_code"])


def register(app: typer.Typer) -> None:
    app.command("smoke")(smoke)
