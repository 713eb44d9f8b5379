"""`specdeploy verify-config` and `write-config`: the drafter config, verified and written safely."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from rich.table import Table

from specdeploy.cli import base, output
from specdeploy.core.errors import UsageError
from specdeploy.core.keeper import Keeper
from specdeploy.drafter import serving, verify
from specdeploy.profile import load_profile

TargetOpt = Annotated[
    Path | None,
    typer.Option("--target", help="the target model's directory; its config.json overrides the profile's facts"),
]


def _report_table(report: verify.Report) -> Table:
    table = Table("", "field", "expected", "found", "consequence", title=f"verify-config {report.path}")
    for c in report.checks:
        table.add_row(
            *output.cells(
                output.MARKS[c.ok],
                c.field,
                c.expected,
                c.found,
                "" if c.ok else c.consequence,
            )
        )
    return table


def _print_report(report: verify.Report, as_json: bool) -> None:
    def table() -> None:
        output.out.print(_report_table(report))
        verdict = "[green]config verified[/]" if report.ok else f"[bold red]{len(report.failures)} check(s) failed[/]"
        output.out.print(f"{verdict} — canonical sha256 {report.canonical_sha256}")
        fields_by_fix: dict[str, list[str]] = {}
        for c in report.failures:
            fields_by_fix.setdefault(c.fix, []).append(c.field)
        for fix, fields in fields_by_fix.items():
            if fix:
                output.fix(fix, subject=", ".join(fields))

    output.emit(report.to_json(), as_json, table)


def verify_config(
    drafter_dir: Annotated[Path, typer.Argument(help="directory holding the drafter's config.json (or the file)")],
    profile: base.ProfileOpt,
    target: TargetOpt = None,
    lock: base.LockOpt = None,
    as_json: base.JsonOpt = False,
) -> None:
    """Check a drafter config.json against the profile and the target.

    Exit 0 when every check holds, 1 on any mismatch, 2 when the file is missing or not JSON.
    """
    p = load_profile(profile)
    path = verify.config_file(drafter_dir)  # resolved once: a directory named config.json is reported as such
    report = verify.verify(path, p, target_dir=target, lock=base.lock_at(lock))
    _print_report(report, as_json)
    raise typer.Exit(0 if report.ok else 1)


def write_config(
    serving_dir: Annotated[Path, typer.Argument(help="the directory the engine reads the drafter from")],
    profile: base.ProfileOpt,
    source: Annotated[
        Path | None,
        typer.Option("--source", help="the verified download (default: <models dir>/<drafter repo>)"),
    ] = None,
    target: TargetOpt = None,
    lock: base.LockOpt = None,
    as_json: base.JsonOpt = False,
    rollback_dir: base.RollbackDirOpt = None,
    run_id: base.RunIdOpt = "",
    models_dir: base.ModelsDirOpt = None,
) -> None:
    """Create or repair the serving directory: verified config.json plus links to the weights.

    Builds the new state aside and switches it in by one link flip, reads it back and verifies
    it; refuses when the profile's drafter content is unresolved or the download does not
    verify. On any failure nothing changes: the serving path, the lock and the rollback record.
    """
    p = load_profile(profile)
    if p.drafter is None:
        raise UsageError(
            f"profile {p.name} has no drafter (speculative method {p.engine.speculative.method!r})",
            hint="pass the profile of a deployment with a drafter (one with a drafter section)",
        )
    if rollback_dir is not None and not run_id:
        raise UsageError(
            "--rollback-dir needs --run-id: the kept copy belongs to a deploy run",
            hint="pass --run-id RUN_ID (Ansible passes one per run), or leave --rollback-dir out",
        )
    src = source or base.host_layout(models_dir).download(p.drafter.repo)
    try:
        with base.writing(f"drafter write-config for run {run_id or '-'}"):
            result = serving.write_serving_dir(
                serving_dir,
                p,
                source_dir=src,
                lock=base.lock_at(lock),
                target_dir=target,
                keeper=Keeper(rollback_dir, run_id) if rollback_dir is not None else None,
            )
    except verify.VerificationFailed as exc:
        _print_report(exc.report, as_json)  # the table says which fields, the error what to do
        raise
    summary = {
        "serving_dir": result.serving_dir,
        "config_changed": result.config_changed,
        "links_changed": result.links_changed,
        "links_removed": result.links_removed,
        "canonical_sha256": result.canonical_sha256,
        "lock_recorded": result.lock_recorded,
        "report": result.report.to_json(),
    }

    def table() -> None:
        state = "written" if result.config_changed else "already up to date"
        output.out.print(
            f"[green]config.json {state}[/] in {result.serving_dir} (canonical sha256 {result.canonical_sha256})"
        )
        if result.links_changed or result.links_removed:
            output.out.print(f"links updated: {result.links_changed}, removed: {result.links_removed}")
        if result.lock_recorded:
            output.out.print("recorded the canonical sha256 in the lock (first verified write)")

    output.emit(summary, as_json, table)


def register(app: typer.Typer) -> None:
    app.command("verify-config")(verify_config)
    app.command("write-config")(write_config)
