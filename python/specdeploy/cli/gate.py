"""`specdeploy gate`: the deploy's verdict — startup log, smoke, and on failure the rollback
with its proof — as one table, one JSON report under `<state>/runs/<run-id>/`, one exit code."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.table import Table

from specdeploy.cli import base, output
from specdeploy.cli.smoke import print_smoke
from specdeploy.core import keeper, layout
from specdeploy.core.errors import UsageError
from specdeploy.core.verdicts import EXIT_RUNNING
from specdeploy.profile import load_profile, resolve_profile_path

EXIT_NOT_RESTORED = 4  # docs/commands.md "Exit codes": the gate failed and no stack was proven to serve (gate.run)


def print_gate(report: dict[str, Any]) -> None:
    """A gate report (its JSON form): the smoke table, then one row per step and the verdict."""
    if report.get("smoke"):
        print_smoke(report["smoke"])
    table = Table("step", "result", "summary", title=f"gate {report['profile']} run {report['run_id']}")
    served = report.get("served_config")
    if served is not None:
        result = "skipped" if served.get("skipped") else ("ok" if served["ok"] else "fail")
        table.add_row(*output.cells("served config", output.status(result), served["message"]))
    startup = report.get("startup_log")
    if startup is not None:
        result = "skipped" if startup.get("skipped") else ("ok" if startup["ok"] else "fail")
        table.add_row(*output.cells("startup log", output.status(result), startup["message"]))
    if report.get("smoke"):
        table.add_row(
            *output.cells("smoke", output.status(report["smoke"]["verdict"]), f"exit {report['smoke']['exit_code']}")
        )
    rollback = report.get("rollback")
    if rollback is not None:
        serves = rollback.get("previous_stack_serves")
        summary = rollback.get("message") or rollback.get("error", "")
        if rollback.get("downtime_s") is not None:
            summary += f" (downtime {rollback['downtime_s']} s)"
        table.add_row(*output.cells("rollback", output.status("ok" if serves else "fail"), summary))
    images = report.get("images_pruned")
    if images is not None:  # after a pass (container profiles): what went, and what could not
        failed = [line for line in images if line.startswith("not pruned: ")]
        summary = "; ".join(images) if images else "no old engine image to remove"
        table.add_row(*output.cells("image prune", output.status("warn" if failed else "ok"), summary))
    table.add_row(*output.cells("verdict", output.status(report["verdict"]), report["message"]))
    output.out.print(table)
    output.out.print(f"gate: [bold]{report['verdict']}[/] (exit {report['exit_code']}) in {report['elapsed_s']}s")
    if report["exit_code"] == EXIT_NOT_RESTORED:
        if rollback and (own := rollback.get("hint") or rollback.get("fix")):
            output.fix(own, subject="rollback")
        output.fix(
            "the host is not proven to serve any stack: deal with what the rollback row says, then run "
            f"`specdeploy rollback restore --run-id {report['run_id']}` (it puts back what this run replaced and "
            "proves the previous stack serves)"
        )


def gate(
    profile: base.ProfileOpt,
    run_id: Annotated[
        str | None, typer.Option("--run-id", help="the deploy run being gated (default: a new id)")
    ] = None,
    state_dir: base.StateDirOpt = None,
    models_dir: base.ModelsDirOpt = None,
    serving_dir: base.ServingDirOpt = None,
    endpoint: Annotated[
        str | None, typer.Option(help="base URL (default: http://127.0.0.1:<the profile's port>)")
    ] = None,
    unit: base.UnitOpt = layout.UNIT_NAME,
    startup_log: Annotated[
        Path | None,
        typer.Option("--startup-log", help="read a saved engine log instead of the unit's journal"),
    ] = None,
    rollback: Annotated[bool, typer.Option(help="restore the previous stack when the gate fails")] = True,
    readiness_timeout: Annotated[
        float | None,
        typer.Option(help="seconds to wait for the engine to be ready (default: the profile's readiness_timeout_s)"),
    ] = None,
    podman: base.PodmanOpt = "podman",
    light_if_unchanged: Annotated[
        bool,
        typer.Option(
            "--light-if-unchanged",
            help="a deploy's re-run: when this run replaced nothing and the engine is the run the last verified "
            "gate judged, check readiness and the served identity only (the deploy passes it; by hand: a full gate)",
        ),
    ] = False,
    as_unit: Annotated[
        bool,
        typer.Option(
            "--as-unit",
            help="run the gate as the transient systemd unit specdeploy-gate-<run id> and wait for it: killed, "
            "this command leaves the gate to finish (its report, its rollback); the deploy passes it",
        ),
    ] = False,
    detach: Annotated[
        bool,
        typer.Option(
            "--detach",
            help="with --as-unit: start the gate's unit and return at once (exit 0); `specdeploy gate-wait` waits "
            "for it and says which check it runs (the deploy does this)",
        ),
    ] = False,
    as_json: base.JsonOpt = False,
) -> None:
    """Gate a deployed stack: the DFlash startup-log check, the smoke checks and, on failure,
    the rollback (restore what this run replaced, prove the previous stack serves).

    Checked first (exit 2, nothing changed): the run id, the state directory, the profile;
    then the startup log file and the endpoint (a base URL: readiness ends at once otherwise).

    Writes <state>/runs/<run-id>/gate.json on every exit path; points <state>/verified at the
    run when it passes, then prunes old weight revisions and (container profiles, with --podman)
    the engine images that neither the unit nor the rollback names. Exit 0 pass, 1 fail, 2 could
    not test, 3 inconclusive, 4 failed and the previous stack was not proven to serve, 130
    interrupted. The API key, when the profile
    names one, is read from the host's key file (<state>/secrets/<name>), or $SPECDEPLOY_API_KEY
    for a run by hand (never argv).
    """
    from specdeploy.gate import run as gate_run  # the smoke's clients and statistics: only when gating

    if readiness_timeout is not None and not readiness_timeout > 0:
        raise UsageError(
            f"--readiness-timeout: expected a number of seconds > 0, found {readiness_timeout:g}",
            hint="pass --readiness-timeout a positive number of seconds (the profile's smoke.readiness_timeout_s "
            "when left out)",
        )
    if detach and not as_unit:
        raise UsageError(
            "--detach: expected together with --as-unit, found alone: only a gate running as its own unit can "
            "be left to run",
            hint="pass --as-unit --detach, then `specdeploy gate-wait --run-id ID`; or leave out --detach",
        )
    if as_unit:
        _gate_as_unit(locals(), as_json)
        return
    options = gate_run.GateOptions(
        endpoint=endpoint,
        unit=unit,
        log_file=startup_log,
        rollback=rollback,
        show_progress=sys.stderr.isatty(),
        readiness_timeout_s=readiness_timeout,
        podman=podman,
        light_if_unchanged=light_if_unchanged,
        unit_file=layout.UNIT_FILES["container"].with_name(f"{unit}.container"),
    )
    from specdeploy.core import deploylock

    host = base.host_layout(models_dir, serving_dir, state_dir)
    run_id = run_id or keeper.new_run_id()
    with deploylock.held(host.state, f"gate of run {run_id}"):
        report = gate_run.run_gate(resolve_profile_path(profile), host, run_id, options)
    data = report.to_json() | {"report": str(report.path)}
    output.emit(data, as_json, lambda: print_gate(data))
    raise typer.Exit(report.exit_code)


def _gate_as_unit(given: dict[str, Any], as_json: bool) -> None:
    """`gate --as-unit`: the same gate, as a transient systemd unit (gate.unit); its report printed
    here once it ends, and its exit code this command's."""
    from specdeploy.gate import unit as gate_unit

    run_id = given["run_id"] or keeper.new_run_id()
    host = base.host_layout(given["models_dir"], given["serving_dir"], given["state_dir"])
    profile_file = str(resolve_profile_path(given["profile"]).absolute())
    argv = [sys.executable, "-m", "specdeploy", "gate", "--profile", profile_file,
            "--run-id", run_id, "--state-dir", str(host.state), "--models-dir", str(host.models),
            "--serving-dir", str(host.serving), "--unit", given["unit"], "--podman", given["podman"], "--json",
            "--rollback" if given["rollback"] else "--no-rollback"]  # fmt: skip
    for flag, value in (("--endpoint", given["endpoint"]), ("--startup-log", given["startup_log"]),
                        ("--readiness-timeout", given["readiness_timeout"])):  # fmt: skip
        if value is not None:
            argv += [flag, str(Path(value).absolute()) if flag == "--startup-log" else str(value)]
    if given["light_if_unchanged"]:
        argv.append("--light-if-unchanged")
    report_path = host.gate_report(run_id)
    if given["detach"]:
        name = gate_unit.start(argv, run_id)
        started = {"run_id": run_id, "unit": name, "report": str(report_path), "detached": True}
        output.emit(
            started,
            as_json,
            lambda: output.out.print(
                f"gate: started as {name}; `specdeploy gate-wait --run-id {run_id}` waits for its verdict "
                f"(journalctl -u {name})",
                markup=False,
            ),
        )
        return
    report = gate_unit.run(argv, run_id, report_path, progress=lambda line: output.err.print(line, markup=False))
    _emit_unit_report(report, run_id, report_path, as_json)


def _emit_unit_report(report: dict[str, Any], run_id: str, report_path: Path, as_json: bool) -> None:
    from specdeploy.gate import unit as gate_unit

    data = report | {"report": str(report_path), "unit": gate_unit.unit_name(run_id)}
    output.emit(data, as_json, lambda: print_gate(data))
    raise typer.Exit(int(report.get("exit_code", 2)))


def gate_wait(
    run_id: Annotated[str, typer.Option("--run-id", help="the run whose gate was started with --as-unit")],
    state_dir: base.StateDirOpt = None,
    wait_for: Annotated[
        float | None,
        typer.Option(
            "--for",
            help=f"seconds to wait at most, then exit {EXIT_RUNNING} with one line on what the gate does now "
            "(default: until it ends)",
        ),
    ] = None,
    as_json: base.JsonOpt = False,
) -> None:
    """Wait for the gate of run ID, started as its unit (`gate --as-unit --detach`), and print its report.

    Exit: the gate's own (0 pass, 1 fail, 2 could not test, 3 inconclusive, 4 not restored, 130
    interrupted) once it has ended; 75 when it still runs after --for seconds, with one line naming its
    unit and its last progress line (the check it runs and how far it is); 2 when the unit ended without
    a finished report, or no gate runs for that run id. Killing this command never stops the gate."""
    from specdeploy.gate import unit as gate_unit

    if wait_for is not None and not wait_for >= 0:
        raise UsageError(
            f"--for: expected seconds >= 0, found {wait_for:g}",
            hint="pass --for a number of seconds, or leave it out to wait until the gate ends",
        )
    host = base.host_layout(None, None, state_dir)
    report_path = host.gate_report(run_id)
    report = gate_unit.wait(
        run_id,
        report_path,
        for_s=wait_for,
        progress_path=host.gate_progress(run_id),
        # waiting to the end, a line every gate_unit.PROGRESS_S; a short look says one line, its answer, once
        progress=(lambda line: output.err.print(line, markup=False)) if wait_for is None else None,
    )
    if isinstance(report, gate_unit.Running):
        line = report.line
        output.emit({"run_id": run_id, "running": True, "now": line}, as_json, lambda: print(line, flush=True))
        raise typer.Exit(EXIT_RUNNING)
    _emit_unit_report(report, run_id, report_path, as_json)


def served_identity(
    profile: base.ProfileOpt,
    state_dir: base.StateDirOpt = None,
    unit: base.UnitOpt = layout.UNIT_NAME,
    podman: base.PodmanOpt = "podman",
    record_golden: Annotated[
        bool,
        typer.Option(
            "--record-golden",
            help="when this identity has no golden transcript, record one from the engine (its coherence prompts, "
            "one at a time) and keep it in <state>/golden/",
        ),
    ] = False,
    as_json: base.JsonOpt = False,
) -> None:
    """The identity of the stack this host serves now, and its key: what a golden transcript belongs
    to (engine, pinned version and commit, image ID, the lock's hashes, the serve and speculative
    sections). Read-only unless --record-golden: `migrate plan` compares it with the last verified
    gate's, and records OLD's golden where its verified run predates goldens."""
    from specdeploy.engine import secret
    from specdeploy.gate import golden

    host = base.host_layout(None, None, state_dir)
    unit_file = layout.UNIT_FILES["container"].with_name(f"{unit}.container")
    loaded = load_profile(resolve_profile_path(profile))
    identity = golden.served_identity(loaded, host, unit_file=unit_file, podman=podman)
    data: dict[str, Any] = {"key": golden.key(identity), "identity": identity}
    if record_golden:
        endpoint = f"http://127.0.0.1:{loaded.engine.serve.port}"
        known = golden.path(host, data["key"]).is_file()
        target = golden.record_serving(loaded, host, identity, endpoint=endpoint, api_key=secret.read(loaded, host))
        data["golden"] = {"path": str(target), "recorded": not known}

    def table() -> None:
        t = Table("field", "value", title=f"served identity {data['key']}")
        for name, value in identity.items():
            t.add_row(*output.cells(name, value))
        output.out.print(t)

    output.emit(data, as_json, table)


def register(app: typer.Typer) -> None:
    app.command("gate")(gate)
    app.command("gate-wait")(gate_wait)
    app.command("served-identity")(served_identity)
