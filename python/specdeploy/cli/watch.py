"""`specdeploy watch run|show|check|units`: the light gate the host's timer runs after the deploy
(known answers, served identity, acceptance since the last run), its last result, its host
settings, and the systemd service and timer the deploy installs for it."""

from __future__ import annotations

import math
import os
import sys
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.table import Table

from specdeploy.cli import base, output
from specdeploy.core import layout
from specdeploy.core.errors import UsageError

watch_app = base.group(
    "The light gate after the deploy: known answers, served identity, acceptance since the last run."
)

ConfigOpt = Annotated[
    Path | None,
    typer.Option(
        "--config",
        help="the light gate's host settings (textfile, hook; default: <state>/watch-config.json, written by the "
        "watch role; no file: Debian's textfile directory and no hook)",
    ),
]


def _config(config: Path | None, host: layout.HostLayout) -> Any:
    from specdeploy.watch import hook

    return hook.load_config(config or host.watch_config)


def print_result(result: dict[str, Any]) -> None:
    """A light gate's result (its JSON form): one row per check, then the verdict, the textfile
    and what the hook did."""
    title = f"light gate {result.get('profile') or '?'} @ {result.get('endpoint') or '?'}"
    table = Table("check", "result", "summary", title=title)
    for check in result.get("checks") or []:
        table.add_row(*output.cells(check["name"], output.status(check["status"]), output.text(check["summary"])))
    table.add_row(*output.cells("verdict", output.status(result["verdict"]), output.text(result["message"])))
    output.out.print(table)
    hinted = [c for c in result.get("checks") or [] if c["status"] in ("fail", "error") and c.get("hint")]
    for check in hinted:
        output.fix(check["hint"], subject=check["name"])
    if result["verdict"] == "fail" and not hinted:
        output.fix(
            f"`specdeploy smoke --profile {result.get('profile_file')} --endpoint {result.get('endpoint')}` gives the "
            "smoke's full diagnosis; the light gate changed nothing: put a good stack back with the deploy"
        )
    if result.get("hint"):
        output.fix(result["hint"])
    if result.get("snapshot_problem"):
        output.out.print(output.line("note: ", result["snapshot_problem"]), highlight=False)
    textfile = result.get("textfile") or {}
    if textfile.get("path"):
        written = "written" if textfile.get("written") else f"NOT written: {textfile.get('error')}"
        output.out.print(output.line("textfile: ", textfile["path"], f" ({written})"), highlight=False)
    hooked = result.get("hook")
    if hooked:
        how = "ok" if hooked.get("ok") else (hooked.get("error") or f"exit {hooked.get('exit_code')}")
        output.out.print(output.line("hook: ", " ".join(hooked["argv"]), f" ({how})"), highlight=False)
    output.out.print(
        f"light gate: [bold]{output.text(result['verdict'])}[/] (exit {result['exit_code']}) "
        f"in {result.get('elapsed_s', 0)}s; result: {output.text(result.get('result_file', ''))}",
        highlight=False,
    )


@watch_app.command("run")
def watch_run(
    profile: Annotated[
        str | None,
        typer.Option(
            "--profile", "-p", help="profile name or file (default: the profile copy the installed engine unit names)"
        ),
    ] = None,
    state_dir: base.StateDirOpt = None,
    endpoint: Annotated[
        str | None, typer.Option(help="base URL (default: http://127.0.0.1:<the profile's port>)")
    ] = None,
    unit: base.UnitOpt = layout.UNIT_NAME,
    config: ConfigOpt = None,
    textfile: Annotated[
        Path | None, typer.Option(help="write the textfile here instead of where the host settings say")
    ] = None,
    hook: Annotated[bool, typer.Option("--hook/--no-hook", help="call the host's hook when it fails")] = True,
    readiness_timeout: Annotated[
        float | None,
        typer.Option(help="seconds to wait for the engine (default: the profile's watch.readiness_timeout_s)"),
    ] = None,
    as_json: base.JsonOpt = False,
) -> None:
    """One light gate: readiness, the served identity, the profile's known answers, and the
    acceptance the engine's counters show since the previous light gate (a counter reset, an
    engine restart, is reported and measured from the restart).

    Writes <state>/watch/result.json and the textfile for node_exporter's textfile collector;
    calls the host's hook (settings: <state>/watch-config.json) with the result file's path when
    it fails or cannot test. Never restarts or rolls back anything. Exit 0 pass (or skipped: a
    deploy is under way), 1 fail, 2 could not test or bad input, 130 interrupted. The API key,
    when the profile names one, is read from the host's key file (<state>/secrets/<name>), or
    $SPECDEPLOY_API_KEY for a run by hand (never argv)."""
    from specdeploy.profile import resolve_profile_path
    from specdeploy.watch import hook as watch_hook
    from specdeploy.watch import run as watch

    if readiness_timeout is not None and not (math.isfinite(readiness_timeout) and readiness_timeout > 0):
        raise UsageError(
            f"--readiness-timeout: expected a number of seconds > 0, found {readiness_timeout:g}",
            hint="pass a positive number of seconds (the profile's watch.readiness_timeout_s when left out)",
        )
    host = base.host_layout(state_dir=state_dir)
    settings = _config(config, host)  # checked before anything is judged: exit 2 naming the field
    if textfile is not None:
        import dataclasses

        path = watch_hook.check_textfile(str(textfile.absolute()), "--textfile")
        settings = dataclasses.replace(settings, textfile=path)
    options = watch.WatchOptions(
        profile_file=resolve_profile_path(profile) if profile else None,
        endpoint=endpoint,
        unit=unit,
        config=settings,
        run_hook=hook,
        readiness_timeout_s=readiness_timeout,
        api_key=os.environ.get("SPECDEPLOY_API_KEY") or None,
    )
    result = watch.run_watch(host, options)
    data = result.to_json() | {"result_file": str(host.watch_result)}
    output.emit(data, as_json, lambda: print_result(data))
    raise typer.Exit(result.exit_code)


@watch_app.command("show")
def watch_show(state_dir: base.StateDirOpt = None, as_json: base.JsonOpt = False) -> None:
    """The last light gate's result on this host (<state>/watch/result.json); exits with its code."""
    from specdeploy.watch import run as watch

    host = base.host_layout(state_dir=state_dir)
    data = watch.load_result(host) | {"result_file": str(host.watch_result)}
    output.emit(data, as_json, lambda: print_result(data))
    code = data.get("exit_code")
    raise typer.Exit(code if isinstance(code, int) and not isinstance(code, bool) else 2)


@watch_app.command("check")
def watch_check(state_dir: base.StateDirOpt = None, config: ConfigOpt = None, as_json: base.JsonOpt = False) -> None:
    """Check the light gate's host settings (the watch role runs it after writing them): the hook
    is an executable file given by its absolute path, the textfile ends in .prom in a directory
    that exists. Exit 0 usable, 2 not (naming the field, what was expected and found)."""
    host = base.host_layout(state_dir=state_dir)
    settings = _config(config, host)
    data = settings.to_json()
    output.emit(
        data,
        as_json,
        lambda: output.out.print(
            output.line(
                "light gate settings ",
                data["source"],
                ": textfile ",
                data["textfile"] or "none",
                "; hook ",
                " ".join(data["hook"]) or "none",
                f" (timeout {data['hook_timeout_s']:g} s)",
            ),  # fmt: skip
            highlight=False,
        ),
    )


@watch_app.command("units")
def watch_units(
    dest: Annotated[Path, typer.Argument(help="the systemd unit directory (`specdeploy facts`: watch.unit_dir)")],
    profile: base.ProfileOpt,
    state_dir: base.StateDirOpt = None,
    cli: Annotated[
        str | None, typer.Option(help="the host's specdeploy (default: the one the specdeploy role installs)")
    ] = None,
    check: base.CheckOpt = False,
    print_only: Annotated[bool, typer.Option("--print", help="print the units instead of writing them")] = False,
) -> None:
    """Write the light gate's service and timer (the timer's interval: the profile's
    watch.interval_s); prints JSON {"changed": [...], "files": [...]} for Ansible."""
    from specdeploy.profile import load_profile
    from specdeploy.watch import units

    host = base.host_layout(state_dir=state_dir)
    rendered = units.render(load_profile(profile), cli=cli or layout.InstallLayout().to_json()["cli"], host=host)
    if print_only:
        sys.stdout.write("".join(f"# {unit.filename}\n{unit.text}\n" for unit in rendered))
        return
    with base.writing("watch units", state_dir=state_dir, check=check):
        changed = units.install_units(rendered, dest, check=check)
    files = [str(dest / unit.filename) for unit in rendered]
    output.emit({"changed": changed, "files": files}, True, lambda: None)


def register(app: typer.Typer) -> None:
    app.add_typer(watch_app, name="watch")
