"""`specdeploy unit render|install`, `specdeploy engine venv` and `specdeploy startup-log`: the
engine service, the engine's own venv (venv runtime) and the proof, in its startup log, that
the drafter is wired as the profile says."""

from __future__ import annotations

import math
import sys
from pathlib import Path
from typing import Annotated

import typer
from rich.table import Table

from specdeploy.cli import base, output
from specdeploy.core import deploylock
from specdeploy.core.errors import UsageError
from specdeploy.core.keeper import Keeper
from specdeploy.engine import startup_log, units
from specdeploy.profile import load_profile, resolve_profile_path

unit_app = base.group("Render and install the engine's systemd unit from the profile.")
engine_app = base.group("The engine's own venv (venv runtime) and its API key.")
ImageOpt = Annotated[str | None, typer.Option(help="image reference, by digest (container profiles)")]
PythonOpt = Annotated[
    str | None,
    typer.Option(help="the engine venv's python (venv profiles; `specdeploy engine venv` prints it)"),
]


def _render(
    profile: str,
    image: str | None,
    host: base.layout.HostLayout,
    profile_file: str | None = None,
    python: str | None = None,
    placeholder_ok: bool = False,
) -> units.RenderedUnit:
    """The unit, or an exit-2 refusal naming the flag or the profile's field (units.render)."""
    return units.render(
        load_profile(profile),
        host=host,
        image=image,
        profile_file=profile_file,
        python=python,
        placeholder_ok=placeholder_ok,
    )


@unit_app.command("render")
def unit_render(
    profile: base.ProfileOpt,
    image: ImageOpt = None,
    models_dir: base.ModelsDirOpt = None,
    serving_dir: base.ServingDirOpt = None,
    cache_dir: base.CacheDirOpt = None,
    python: PythonOpt = None,
) -> None:
    """Print the unit: a quadlet .container (GPU profiles) or a venv service (rehearsal)."""
    host = base.host_layout(models_dir, serving_dir, cache_dir=cache_dir)
    unit = _render(profile, image, host, python=python)
    sys.stdout.write(unit.text)


@unit_app.command("install")
def unit_install(
    dest: Annotated[Path, typer.Argument(help="the unit directory (`specdeploy facts`: unit.dir)")],
    profile: base.ProfileOpt,
    image: ImageOpt = None,
    models_dir: base.ModelsDirOpt = None,
    serving_dir: base.ServingDirOpt = None,
    cache_dir: base.CacheDirOpt = None,
    state_dir: Annotated[
        str | None, typer.Option(help="keep a copy of the profile here and name it in the unit (for rollbacks)")
    ] = None,
    rollback_dir: base.RollbackDirOpt = None,
    run_id: base.RunIdOpt = "",
    python: PythonOpt = None,
    check: base.CheckOpt = False,
) -> None:
    """Write the unit atomically; prints JSON {"changed": ..., "path": ...} for Ansible.

    Everything is checked before anything is written: a refused input (exit 2) or a unit
    directory nothing can be written to (exit 1) leaves no unit, no profile copy and no
    rollback copy behind."""
    host = base.host_layout(models_dir, serving_dir, state_dir, cache_dir)
    keep = rollback_dir is not None and not check
    if keep and not run_id:
        raise UsageError(
            "--rollback-dir needs --run-id: the kept copy of the unit belongs to a deploy run; nothing was written",
            hint="pass --run-id ID (Ansible passes the run's id), or leave --rollback-dir out",
        )
    if keep:
        assert rollback_dir is not None
        units.require_dir_or_creatable(rollback_dir, option="--rollback-dir")
    copy = source = None
    if state_dir:
        units.require_dir_or_creatable(host.state, option="--state-dir")
        source = resolve_profile_path(profile)
        copy = units.profile_copy_path(source, host)
    # `--check` (ansible-playbook --check) may name the image `image ensure --check` would still provide
    unit = _render(profile, image, host, str(copy) if copy else None, python, placeholder_ok=check)
    units.require_unit_dir(dest, unit.filename, check=check)
    with base.writing(f"unit install for run {run_id or '-'}", state_dir=state_dir, check=check):
        if source is not None and not check:
            units.keep_profile_copy(source, host)
        keeper = Keeper(rollback_dir, run_id) if keep and rollback_dir is not None else None
        changed = units.install(unit, dest, keeper, check=check)
    output.emit({"changed": changed, "path": str(dest / unit.filename)}, True, lambda: None)


def startup_log_check(
    profile: base.ProfileOpt,
    unit: Annotated[str | None, typer.Option(help="read the unit's journal since its current start")] = None,
    log_file: Annotated[Path | None, typer.Option("--file", help="read a saved engine log instead")] = None,
    timeout: Annotated[
        float | None, typer.Option(help="seconds to wait for the line (with --unit); default: the profile's readiness")
    ] = None,
    as_json: base.JsonOpt = False,
) -> None:
    """Check the auxiliary-layer line vLLM logs for a DFlash drafter (target_layer_ids + 1).

    Exit 0 when it matches, 1 when it differs or never appears, 2 on bad input.
    """
    p = load_profile(profile)
    if (unit is None) == (log_file is None):
        raise UsageError(
            "pass exactly one of --unit and --file",
            hint="--unit specdeploy-engine reads the running engine's journal; --file reads a saved log",
        )
    if timeout is not None and not (math.isfinite(timeout) and timeout >= 0):
        raise UsageError(
            f"--timeout {timeout}: expected a number of seconds >= 0, found {timeout}",
            hint="pass --timeout SECONDS (e.g. 600), or leave it out for the profile's readiness timeout",
        )
    # a bad --file is refused whatever the profile (regular files only, a size ceiling: a FIFO must not block)
    log_text = startup_log.read_log_file(log_file) if log_file is not None else None
    if p.engine.speculative.method != "dflash":
        output.out.print(f"profile {p.name} uses {p.engine.speculative.method}: no auxiliary-layer line to check")
        raise typer.Exit(0)
    if log_text is not None:
        check = startup_log.check_aux_layers(p, log_text)
    else:
        assert unit is not None
        endpoint = f"http://127.0.0.1:{p.engine.serve.port}"
        wait = timeout if timeout is not None else p.smoke.readiness_timeout_s
        check = startup_log.check_unit(p, unit, timeout_s=wait, ready=startup_log.health_answers(endpoint))
    data = {
        "ok": check.ok,
        "expected": check.expected,
        "found": check.found,
        "runner": check.runner,
        "message": check.message,
        "fix": check.fix,
    }

    def table() -> None:
        output.out.print(f"{output.MARKS[check.ok]} {output.text(check.message)}", highlight=False)
        if not check.ok and check.fix:
            output.fix(check.fix)

    output.emit(data, as_json, table)
    raise typer.Exit(0 if check.ok else 1)


@engine_app.command("venv")
def engine_venv_install(
    archive: Annotated[Path, typer.Option(help="the engine's wheels + requirements.lock, one tar")],
    root: Annotated[Path, typer.Option(help="where engine venvs live (`specdeploy facts`: engine.root)")],
    name: Annotated[str, typer.Option(help="<package>-<version> (`specdeploy facts`: engine.name)")],
    check: base.CheckOpt = False,
) -> None:
    """Make the archive's engine venv complete (built once per archive, never in place of a
    running one); prints JSON {"changed", "venv", "python", "archive_sha256"} for Ansible."""
    from specdeploy.engine import venv

    with base.writing(f"engine venv {name}", check=check):
        installed = venv.install(archive, root, name, check=check)
    output.emit(installed.to_json(), True, lambda: None)


@engine_app.command("api-key")
def engine_api_key(
    profile: base.ProfileOpt,
    state_dir: base.StateDirOpt = None,
    podman: base.PodmanOpt = "podman",
    rollback_dir: base.RollbackDirOpt = None,
    run_id: base.RunIdOpt = "",
) -> None:
    """Install the engine's API key, read from standard input (how Ansible passes it from
    the vault; never argv): <state>/secrets/<name> (mode 0600) and, for a container engine,
    the podman secret of that name. With --rollback-dir and --run-id, a key it replaces is kept
    for the run's rollback (which puts it back, podman secret included). Prints JSON {"changed",
    "file", "podman"} for Ansible."""
    from specdeploy.engine import secret

    p = load_profile(profile)
    secret.secret_name(p)  # a profile without a key is refused before standard input is read
    if rollback_dir is not None and not run_id:
        raise UsageError(
            "--rollback-dir needs --run-id: the kept key belongs to a deploy run; nothing was written",
            hint="pass --run-id ID (Ansible passes the run's id), or leave --rollback-dir out",
        )
    key = secret.read_key(sys.stdin)
    host = base.host_layout(state_dir=state_dir)
    keeper = Keeper(rollback_dir, run_id) if rollback_dir is not None else None
    with deploylock.held(host.state, f"engine api-key for run {run_id or '-'}"):
        installed = secret.install(p, host, key, podman=podman, keeper=keeper)
    data = {"name": installed.name, "file": installed.file, "changed": installed.changed, "podman": installed.podman}
    output.emit(data, True, lambda: None)


@engine_app.command("remove")
def engine_remove(
    profile: base.ProfileOpt,
    state_dir: base.StateDirOpt = None,
    unit_file: Annotated[
        Path | None, typer.Option("--unit-file", help="the engine unit whose Image= references go too (if it is there)")
    ] = None,
    podman: base.PodmanOpt = "podman",
    check: base.CheckOpt = False,
) -> None:
    """Decommission: remove the engine's API key (<state>/secrets/<name> and, for a container engine, the
    podman secret) and its images (every local image of the profile's engine repository, and those the
    unit names). Run after the engine's unit was stopped; weights, state and units are left to the caller
    (ansible/decommission.yml). Prints JSON {"changed", "secret_file", "podman_secret", "images", "problems"};
    exit 1 when something stays (an image still in use, a podman that fails)."""
    from specdeploy.engine import remove

    host = base.host_layout(state_dir=state_dir)
    with base.writing("engine remove (decommission)", state_dir=state_dir, check=check):
        done = remove.remove(load_profile(profile), host, unit_file=unit_file, podman=podman, check=check)
    output.emit(done.to_json(), True, lambda: None)
    if done.problems:
        raise typer.Exit(1)


@engine_app.command("idle")
def engine_idle(
    profile: base.ProfileOpt,
    endpoint: Annotated[
        str | None, typer.Option(help="the engine's base URL (default http://127.0.0.1:<the profile's port>)")
    ] = None,
    timeout: Annotated[
        float | None,
        typer.Option(help="seconds to wait at most (default: the profile's migration.drain_timeout_s)", min=0),
    ] = None,
    as_json: base.JsonOpt = False,
) -> None:
    """Wait until the engine has no request running or waiting, by its own gauges (every request,
    through the front or not), before it is stopped for good (ansible/decommission.yml). Exit 0 when
    idle (or not answering: nothing in flight), 1 when requests are still in flight at the timeout."""
    from specdeploy.smoke import idle

    p = load_profile(profile)
    url = (endpoint or f"http://127.0.0.1:{p.engine.serve.port}").rstrip("/")
    limit = p.migration.drain_timeout_s if timeout is None else timeout

    def progress(count: int, waited: float) -> None:
        output.err.print(f"engine idle: {count} request(s) in flight on {url}, {waited:.0f} s of {limit:g}")

    result = idle.wait_idle(url, p.engine.kind, limit, progress=progress)

    def table() -> Table:
        shown = Table("", "", title=f"engine idle: {url}")
        for key, value in result.to_json().items():
            shown.add_row(*output.cells(key, value))
        return shown

    output.emit(result.to_json(), as_json, table)
    if not result.idle:
        raise idle.IdleError(
            f"{result.in_flight} request(s) still in flight on {url} after {limit:g} s: stopping the engine now "
            "would cut them",
            hint="run it again (it waits again), or raise --timeout; nothing was stopped",
        )


def register(app: typer.Typer) -> None:
    app.add_typer(unit_app, name="unit")
    app.add_typer(engine_app, name="engine")
    app.command("startup-log")(startup_log_check)
