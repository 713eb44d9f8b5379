"""`specdeploy deploy-lock acquire|release|status`: one deploy at a time on a host
(core.deploylock). deploy.yml takes the lock first on each host and gives it back last; a second
play waits (`--wait`) or is refused, naming the run that holds the host."""

from __future__ import annotations

from typing import Annotated, Any

import typer
from rich.table import Table

from specdeploy.cli import base, output
from specdeploy.core import deploylock
from specdeploy.core.errors import UsageError
from specdeploy.core.keeper import check_run_id

lock_app = base.group("One deploy at a time on a host: the lock deploy.yml holds while it deploys.")

RunOpt = Annotated[str, typer.Option("--run-id", help="the deploy run (deploy.yml's specdeploy_run_id)")]


def _state(state_dir: str | None) -> Any:
    state = base.host_layout(state_dir=state_dir).state
    if not state.is_dir():
        raise UsageError(
            f"--state-dir {state}: expected the host's state directory, found nothing there",
            hint="the deploy's specdeploy role creates it (`specdeploy facts` names it paths.state)",
        )
    return state


def _table(title: str, holder: deploylock.Holder | None) -> None:
    table = Table("field", "value", title=title)
    for name, value in (holder.to_json() if holder else {"holder": "nobody"}).items():
        table.add_row(*output.cells(name, value))
    output.out.print(table)


@lock_app.command("acquire")
def acquire(
    run_id: RunOpt,
    what: Annotated[str, typer.Option("--what", help="what the holder does (shown to whoever waits)")] = "deploy",
    origin: Annotated[str | None, typer.Option("--origin", help="where the holder runs from (its controller)")] = None,
    wait: Annotated[float, typer.Option("--wait", help="seconds to wait for another holder (0-86400)")] = 0.0,
    lease: Annotated[
        float, typer.Option("--lease", help="seconds after which a holder that never gave it back loses it (>= 60)")
    ] = deploylock.DEFAULT_LEASE_S,
    state_dir: base.StateDirOpt = None,
    as_json: base.JsonOpt = False,
) -> None:
    """Hold this host for the deploy run RUN-ID (again, when it holds it already). Exit 75 naming the
    holder when another run holds it after --wait seconds."""
    check_run_id(run_id)
    if not 0 <= wait <= 86400:
        raise UsageError(
            f"--wait {wait:g}: expected seconds from 0 to 86400, found {wait:g}",
            hint="pass --wait 0 to be refused at once, or the seconds to wait for the holder (deploy.yml: "
            "specdeploy_lock_wait_s)",
        )
    if not 60 <= lease <= 7 * 86400:
        raise UsageError(
            f"--lease {lease:g}: expected seconds from 60 to 604800, found {lease:g}: a shorter lease would free "
            "the host while its deploy still runs",
            hint="pass a lease longer than the longest play (deploy.yml: specdeploy_lock_lease_s, default 21600)",
        )
    state = _state(state_dir)
    replaced = deploylock.acquire(
        state, run_id, what, origin=origin, lease_s=lease, wait_s=wait,
        progress=lambda line: output.err.print(f"deploy-lock: {line}", markup=False, highlight=False),
    )  # fmt: skip
    holder = deploylock.current(state)
    data = {"holder": holder.to_json() if holder else None, "replaced": replaced.to_json() if replaced else None}

    def show() -> None:
        _table(f"deploy lock of {state}", holder)
        if replaced is not None:
            output.out.print(output.line("replaced a holder that was gone: ", replaced.describe()), highlight=False)

    output.emit(data, as_json, show)


@lock_app.command("release")
def release(run_id: RunOpt, state_dir: base.StateDirOpt = None, as_json: base.JsonOpt = False) -> None:
    """Give the host back from RUN-ID (nothing happens when another run, or nobody, holds it)."""
    check_run_id(run_id)
    state = _state(state_dir)
    released = deploylock.release(state, run_id)
    holder = deploylock.current(state)
    data = {"released": released.to_json() if released else None, "holder": holder.to_json() if holder else None}

    def show() -> None:
        said = f"run {run_id} released the host" if released else f"run {run_id} did not hold the host"
        output.out.print(output.line("deploy-lock: ", said), highlight=False)
        _table(f"deploy lock of {state}", holder)

    output.emit(data, as_json, show)


@lock_app.command("status")
def status(state_dir: base.StateDirOpt = None, as_json: base.JsonOpt = False) -> None:
    """Who holds this host now (a holder that is gone or whose lease ended is shown as such)."""
    import time

    state = _state(state_dir)
    holder = deploylock.current(state)
    alive = holder.alive(time.time()) if holder else False
    data = {"holder": holder.to_json() if holder else None, "alive": alive}
    output.emit(data, as_json, lambda: _table(f"deploy lock of {state} ({'held' if alive else 'free'})", holder))


def register(app: typer.Typer) -> None:
    app.add_typer(lock_app, name="deploy-lock")
