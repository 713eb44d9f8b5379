"""`specdeploy <command>`: the one entry point for operators, Ansible and CI.

Each command prints a readable table by default and JSON with `--json`; every user-facing
failure is a SpecdeployError whose message says what is wrong and what to do, mapped to its
documented exit code (docs/commands.md "Exit codes") by the one error boundary (cli.base.Boundary).
The verb groups live one module each, in pipeline order.
"""

from __future__ import annotations

import importlib.util
from typing import Annotated

import typer

from specdeploy.cli import (
    base,
    bench,
    coherence,
    deploylock,
    drafter,
    engine,
    gate,
    host,
    images,
    profile,
    rollback,
    smoke,
    weights,
)
from specdeploy.cli import front as front_cli
from specdeploy.cli import lock as lock_cli
from specdeploy.cli import migrate as migrate_cli
from specdeploy.cli import watch as watch_cli

app = typer.Typer(
    cls=base.Boundary,
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    help=__doc__,
)


@app.callback()
def root(
    ctx: typer.Context,
    debug: Annotated[
        bool, typer.Option("--debug", envvar="SPECDEPLOY_DEBUG", help="show the traceback of an internal error")
    ] = False,
) -> None:
    """Reproducible LLM serving with speculative decoding: profile, host, images, weights,
    drafter config, engine, smoke, gate, rollback."""
    ctx.obj = {"debug": debug}


for module in (
    profile,
    deploylock,
    host,
    images,
    weights,
    drafter,
    engine,
    smoke,
    coherence,
    rollback,
    gate,
    lock_cli,
):
    module.register(app)
# `specdeploy rehearsal ...` where the rehearsal rig is installed (this checkout, or the
# specdeploy-rehearsal distribution): the host package holds neither it nor this verb group
if importlib.util.find_spec("specdeploy.rehearsal") is not None:
    from specdeploy.cli import rehearsal

    rehearsal.register(app)
watch_cli.register(app)  # after the deploy: the light gate the host's timer runs
front_cli.register(app)  # the site's front door: HAProxy in front of the engine hosts (issue 23)
migrate_cli.register(app)  # the host migration runbook (issue 23)
bench.register(app)  # stacks compared with one workload, and a draft length tuned from the figures


def main() -> None:
    app(prog_name="specdeploy")
