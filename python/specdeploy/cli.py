"""`specdeploy <command>`: the one entry point for operators, Ansible and CI.

Each command prints a readable table by default and JSON with `--json`; every
user-facing failure is a SpecdeployError whose message says what is wrong and what to do,
mapped to the command's documented exit code.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.table import Table

from specdeploy import drafter_config
from specdeploy import profile as profile_mod
from specdeploy.cli_output import err, out
from specdeploy.errors import SpecdeployError
from specdeploy.lock import Lock, default_lock_path

app = typer.Typer(no_args_is_help=True, add_completion=False, help=__doc__)
profile_app = typer.Typer(no_args_is_help=True, help="List and show deployment profiles.")
app.add_typer(profile_app, name="profile")


ProfileOpt = Annotated[str, typer.Option("--profile", "-p", help="profile name or path to a .yaml file")]
JsonOpt = Annotated[bool, typer.Option("--json", help="print JSON instead of a table")]
LockOpt = Annotated[
    Path | None,
    typer.Option("--lock", help="lock file (default: $SPECDEPLOY_LOCK or ./specdeploy.lock)"),
]
RollbackDirOpt = Annotated[
    Path | None,
    typer.Option("--rollback-dir", help="keep what this step replaces here, for the smoke gate's rollback"),
]
RunIdOpt = Annotated[str, typer.Option("--run-id", help="the deploy run the kept copies belong to")]
TargetOpt = Annotated[
    Path | None,
    typer.Option("--target", help="the target model's directory; its config.json overrides the profile's facts"),
]


def _keeper(rollback_dir: Path | None, run_id: str) -> Any:
    from specdeploy.rollback import Keeper

    return Keeper(rollback_dir, run_id) if rollback_dir is not None else None


def _fail(exc: SpecdeployError) -> typer.Exit:
    err.print(f"[bold red]error:[/] {exc.message}", highlight=False)
    if exc.hint:
        err.print(f"  [bold]fix:[/] {exc.hint}", highlight=False)
    return typer.Exit(exc.exit_code)


def _text(value: Any) -> str:
    return value if isinstance(value, str) else json.dumps(value)


# --------------------------------------------------------------------------- profile


@profile_app.command("list")
def profile_list(as_json: JsonOpt = False) -> None:
    """List the known profiles and how many of their pins are unresolved."""
    rows = []
    for name, path in sorted(profile_mod.list_profiles().items()):
        try:
            p = profile_mod.load_profile(path)
        except SpecdeployError as exc:
            raise _fail(exc) from None
        spec = p.engine.speculative
        rows.append(
            {
                "name": name,
                "engine": f"{p.engine.kind} {p.engine.source.version.value or '?'}",
                "speculative": f"{spec.method} x{spec.num_speculative_tokens}",
                "unresolved_pins": len(profile_mod.unresolved_pins(p)),
                "path": str(path),
            }
        )
    if as_json:
        out.print_json(data=rows)
        return
    table = Table("profile", "engine", "speculative", "unresolved pins", "file")
    for r in rows:
        table.add_row(r["name"], r["engine"], r["speculative"], str(r["unresolved_pins"]), r["path"])
    out.print(table)


@profile_app.command("show")
def profile_show(name: str, as_json: JsonOpt = False) -> None:
    """Show one profile: every pin with its provenance, then the full document."""
    try:
        p = profile_mod.load_profile(name)
    except SpecdeployError as exc:
        raise _fail(exc) from None
    if as_json:
        data = p.model_dump(mode="json")
        data["unresolved_pins"] = [path for path, _ in profile_mod.unresolved_pins(p)]
        out.print_json(data=data)
        return
    out.print(f"[bold]{p.name}[/]: {p.description}")
    table = Table("pin", "value", "provenance", "source", title="pins")
    for path, pin in profile_mod.iter_pins(p):
        style = "red" if not pin.resolved else None
        table.add_row(path, _text(pin.value) if pin.resolved else "-", pin.provenance.value, pin.source, style=style)
    out.print(table)


# --------------------------------------------------------------------------- drafter config


def _print_report(report: drafter_config.Report) -> None:
    table = Table("", "field", "expected", "found", "consequence", title=f"verify-config {report.path}")
    for c in report.checks:
        mark = "[green]ok[/]" if c.ok else "[bold red]FAIL[/]"
        table.add_row(mark, c.field, _text(c.expected), _text(c.found), "" if c.ok else c.consequence)
    out.print(table)
    verdict = "[green]config verified[/]" if report.ok else f"[bold red]{len(report.failures)} check(s) failed[/]"
    out.print(f"{verdict} — canonical sha256 {report.canonical_sha256}")


@app.command("verify-config")
def verify_config(
    drafter_dir: Annotated[Path, typer.Argument(help="directory holding the drafter's config.json (or the file)")],
    profile: ProfileOpt,
    target: TargetOpt = None,
    lock: LockOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Check a drafter config.json against the profile and the target.

    Exit 0 when every check holds, 1 on any mismatch, 2 when the file is missing or not JSON.
    """
    try:
        p = profile_mod.load_profile(profile)
        lock_obj = Lock(lock or default_lock_path())
        path = drafter_dir / drafter_config.CONFIG_NAME if drafter_dir.is_dir() else drafter_dir
        report = drafter_config.verify(path, p, target_dir=target, lock=lock_obj)
    except SpecdeployError as exc:
        raise _fail(exc) from None
    if as_json:
        out.print_json(data=report.to_json())
    else:
        _print_report(report)
    raise typer.Exit(0 if report.ok else 1)


@app.command("write-config")
def write_config(
    serving_dir: Annotated[Path, typer.Argument(help="the directory the engine reads the drafter from")],
    profile: ProfileOpt,
    source: Annotated[
        Path | None,
        typer.Option("--source", help="the verified download (default: <paths.models_dir>/<drafter repo>)"),
    ] = None,
    target: TargetOpt = None,
    lock: LockOpt = None,
    as_json: JsonOpt = False,
    rollback_dir: RollbackDirOpt = None,
    run_id: RunIdOpt = "",
) -> None:
    """Create or repair the serving directory: verified config.json plus links to the weights.

    Writes atomically and reads the result back; refuses when the profile's drafter content
    is unresolved or the download does not verify. The previous file is kept on any failure.
    """
    try:
        p = profile_mod.load_profile(profile)
        if p.drafter is None:
            raise SpecdeployError(f"profile {p.name} has no drafter")
        src = source or Path(p.paths.models_dir) / p.drafter.repo
        result = drafter_config.write_serving_dir(
            serving_dir,
            p,
            source_dir=src,
            lock=Lock(lock or default_lock_path()),
            target_dir=target,
            keeper=_keeper(rollback_dir, run_id),
        )
    except drafter_config.VerificationFailed as exc:
        if as_json:
            out.print_json(data=exc.report.to_json())
        else:
            _print_report(exc.report)
        raise _fail(exc) from None
    except SpecdeployError as exc:
        raise _fail(exc) from None
    summary = {
        "serving_dir": result.serving_dir,
        "config_changed": result.config_changed,
        "links_changed": result.links_changed,
        "links_removed": result.links_removed,
        "canonical_sha256": result.canonical_sha256,
        "lock_recorded": result.lock_recorded,
    }
    if as_json:
        out.print_json(data=summary | {"report": result.report.to_json()})
        return
    state = "written" if result.config_changed else "already up to date"
    out.print(f"[green]config.json {state}[/] in {result.serving_dir} (canonical sha256 {result.canonical_sha256})")
    if result.links_changed or result.links_removed:
        out.print(f"links updated: {result.links_changed}, removed: {result.links_removed}")
    if result.lock_recorded:
        out.print("recorded the canonical sha256 in the lock (first verified write)")


# --------------------------------------------------------------------------- weights


@app.command("fetch")
def fetch_cmd(
    dest: Annotated[Path, typer.Argument(help="download root; each repo lands in DEST/<org>/<name>")],
    profile: ProfileOpt,
    lock: LockOpt = None,
    endpoint: Annotated[str | None, typer.Option(help="hub or site mirror (default: $HF_ENDPOINT or the hub)")] = None,
    token_file: Annotated[
        Path | None, typer.Option(help="file holding the HF token (mode 600); else $HF_TOKEN")
    ] = None,
    only: Annotated[str | None, typer.Option(help="fetch only 'target' or 'drafter'")] = None,
    as_json: JsonOpt = False,
) -> None:
    """Download the target and drafter at their pinned commits and verify every file.

    Every file is checked against the hub's hash for the pinned commit, recorded in the
    lock on first fetch and required to match afterwards; corrupt files are removed.
    """
    import os

    from specdeploy import weights

    try:
        p = profile_mod.load_profile(profile)
        results = weights.fetch(
            p,
            dest,
            lock=Lock(lock or default_lock_path()),
            token=weights.read_token(token_file),
            endpoint=endpoint or os.environ.get("HF_ENDPOINT"),
            only=only,
        )
    except SpecdeployError as exc:
        raise _fail(exc) from None
    if as_json:
        out.print_json(data=[r.__dict__ for r in results])
        return
    table = Table("repo", "revision", "files", "hashed now", "unchanged", "lock", title=f"fetch {p.name} -> {dest}")
    for r in results:
        lock_state = "recorded" if r.recorded_in_lock else "matches"
        table.add_row(r.repo, r.revision[:12], str(r.files), str(r.verified), str(r.skipped_unchanged), lock_state)
    out.print(table)


# --------------------------------------------------------------------------- units

unit_app = typer.Typer(no_args_is_help=True, help="Render and install the engine's systemd unit from the profile.")
app.add_typer(unit_app, name="unit")
ImageOpt = Annotated[str | None, typer.Option(help="image reference, by digest (container profiles)")]
ModelsOpt = Annotated[str | None, typer.Option(help="models directory on the host (default: the profile's)")]
ServingOpt = Annotated[str | None, typer.Option(help="serving directory on the host (default: the profile's)")]


def _render_unit(
    profile: str, image: str | None, models_dir: str | None, serving_dir: str | None, profile_file: str | None = None
) -> Any:
    from specdeploy import units

    p = profile_mod.load_profile(profile)
    try:
        return units.render(p, image=image, models_dir=models_dir, serving_dir=serving_dir, profile_file=profile_file)
    except ValueError as exc:
        raise SpecdeployError(str(exc), hint="pass --image REF@sha256:DIGEST") from None


@unit_app.command("render")
def unit_render(
    profile: ProfileOpt, image: ImageOpt = None, models_dir: ModelsOpt = None, serving_dir: ServingOpt = None
) -> None:
    """Print the unit: a quadlet .container (GPU profiles) or a venv service (rehearsal)."""
    try:
        unit = _render_unit(profile, image, models_dir, serving_dir)
    except SpecdeployError as exc:
        raise _fail(exc) from None
    sys.stdout.write(unit.text)


@unit_app.command("install")
def unit_install(
    dest: Annotated[Path, typer.Argument(help="/etc/containers/systemd or /etc/systemd/system")],
    profile: ProfileOpt,
    image: ImageOpt = None,
    models_dir: ModelsOpt = None,
    serving_dir: ServingOpt = None,
    state_dir: Annotated[
        Path | None, typer.Option(help="keep a copy of the profile here and name it in the unit (for rollbacks)")
    ] = None,
    rollback_dir: RollbackDirOpt = None,
    run_id: RunIdOpt = "",
) -> None:
    """Write the unit atomically; prints JSON {"changed": ..., "path": ...} for Ansible."""
    from specdeploy import units

    try:
        copy = None
        if state_dir is not None:
            copy = str(units.keep_profile_copy(profile_mod.resolve_profile_path(profile), state_dir))
        unit = _render_unit(profile, image, models_dir, serving_dir, copy)
        changed = units.install(unit, dest, _keeper(rollback_dir, run_id))
    except SpecdeployError as exc:
        raise _fail(exc) from None
    out.print_json(data={"changed": changed, "path": str(dest / unit.filename)})


# --------------------------------------------------------------------------- images

image_app = typer.Typer(no_args_is_help=True, help="Build and check engine images from the profile's pins.")
app.add_typer(image_app, name="image")


@image_app.command("build")
def image_build(
    profile: ProfileOpt,
    context: Annotated[Path, typer.Option(help="build context: the specdeploy checkout")] = Path("."),
    lock: LockOpt = None,
    podman: Annotated[str, typer.Option(help="podman executable")] = "podman",
    driver: Annotated[
        str | None, typer.Option(help="host NVIDIA driver version, to refuse a CUDA it cannot run")
    ] = None,
    dry_run: Annotated[bool, typer.Option("--dry-run", help="print the podman command, build nothing")] = False,
) -> None:
    """Build the profile's image with every build arg taken from the profile.

    Refuses a known-bad version or commit with the reason; resolves the base image digest
    and the PR merge-base on first use and records them in the lock.
    """
    import shlex

    from specdeploy import images

    try:
        p = profile_mod.load_profile(profile)
        result = images.build(
            p,
            lock=Lock(lock or default_lock_path()),
            context=context,
            podman=podman,
            dry_run=dry_run,
            driver_version=driver,
        )
    except SpecdeployError as exc:
        raise _fail(exc) from None
    if dry_run:
        out.print(shlex.join(result.argv), highlight=False)
        return
    out.print(f"[green]built {result.tag}[/] (id {result.image_id})")


@image_app.command("ensure")
def image_ensure(
    profile: ProfileOpt,
    source: Annotated[str, typer.Option(help="build (from the Containerfiles), pull (by digest) or archive")],
    context: Annotated[Path | None, typer.Option(help="build context holding the Containerfiles")] = None,
    archive: Annotated[Path | None, typer.Option(help="an image archive (podman save) for air-gapped hosts")] = None,
    lock: LockOpt = None,
    podman: Annotated[str, typer.Option(help="podman executable")] = "podman",
    driver: Annotated[str | None, typer.Option(help="host NVIDIA driver version (build)")] = None,
) -> None:
    """Make the profile's image present (build, pull by digest or load an archive), check its
    labels against the profile, and print JSON {changed, reference, ...} for Ansible.

    Exit 0 when the image is present and its labels match, 1 when they do not.
    """
    from specdeploy import images

    try:
        p = profile_mod.load_profile(profile)
        ensured = images.ensure(
            p,
            source=source,
            lock=Lock(lock or default_lock_path()),
            context=context,
            archive=archive,
            podman=podman,
            driver_version=driver,
        )
    except SpecdeployError as exc:
        raise _fail(exc) from None
    bad = [r.__dict__ for r in ensured.labels if not r.ok]
    out.print_json(
        data={
            "changed": ensured.changed,
            "action": ensured.action,
            "tag": ensured.tag,
            "reference": ensured.reference,
            "image_id": ensured.image_id,
            "label_mismatches": bad,
        }
    )
    if bad:
        names = ", ".join(r["label"] for r in bad)
        raise _fail(SpecdeployError(f"{ensured.tag}: labels differ from profile {p.name}: {names}"))


@image_app.command("check")
def image_check(
    image: Annotated[str, typer.Argument(help="image reference or ID")],
    profile: ProfileOpt,
    lock: LockOpt = None,
    podman: Annotated[str, typer.Option(help="podman executable")] = "podman",
    as_json: JsonOpt = False,
) -> None:
    """Compare a built image's OCI labels with the profile. Exit 0 when all match, 1 otherwise."""
    from specdeploy import images

    try:
        rows = images.check(
            image, profile_mod.load_profile(profile), lock=Lock(lock or default_lock_path()), podman=podman
        )
    except SpecdeployError as exc:
        raise _fail(exc) from None
    ok = all(r.ok for r in rows)
    if as_json:
        out.print_json(data={"image": image, "ok": ok, "labels": [r.__dict__ for r in rows]})
    else:
        table = Table("", "label", "expected", "found", title=f"image check {image}")
        for r in rows:
            table.add_row("[green]ok[/]" if r.ok else "[bold red]FAIL[/]", r.label, r.expected, str(r.found))
        out.print(table)
    raise typer.Exit(0 if ok else 1)


# --------------------------------------------------------------------------- smoke


def print_smoke_report(report: Any) -> None:
    from specdeploy.smoke import Status

    colours = {Status.passed: "green", Status.failed: "bold red", Status.error: "bold magenta"}
    table = Table("stage", "result", "summary", title=f"smoke {report.profile} @ {report.endpoint}")
    for stage in report.stages:
        colour = colours.get(stage.status, "yellow")
        table.add_row(stage.name, f"[{colour}]{stage.status.value}[/]", stage.summary)
    out.print(table)
    for line in report.diagnosis:
        out.print(f"[bold]diagnosis:[/] {line}", highlight=False)
    out.print(f"verdict: [bold]{report.verdict.value}[/] (exit {report.exit_code}) in {report.elapsed_s:.1f}s")


@app.command("smoke")
def smoke_cmd(
    endpoint: Annotated[str, typer.Option("--endpoint", help="base URL, e.g. http://127.0.0.1:8000")],
    profile: ProfileOpt,
    json_path: Annotated[Path | None, typer.Option("--json", help="also write the report as JSON here")] = None,
    golden: Annotated[Path | None, typer.Option(help="compare with a golden transcript")] = None,
    record_golden: Annotated[
        Path | None, typer.Option(help="record a golden transcript (at a verified deploy)")
    ] = None,
    readiness_timeout: Annotated[float | None, typer.Option(help="seconds to wait for readiness")] = None,
) -> None:
    """The smoke gate: readiness, identity, coherence, golden, acceptance, throughput.

    Exit 0 pass, 1 fail, 2 could not test (unreachable, server error), 3 inconclusive.
    The API key, when the server needs one, is read from $SPECDEPLOY_API_KEY (never argv).
    """
    import os

    from specdeploy import atomic, smoke

    try:
        p = profile_mod.load_profile(profile)
    except SpecdeployError as exc:
        raise _fail(exc) from None
    options = smoke.SmokeOptions(
        golden=golden,
        record_golden=record_golden,
        api_key=os.environ.get("SPECDEPLOY_API_KEY"),
        show_progress=sys.stderr.isatty(),
        readiness_timeout_s=readiness_timeout,
    )
    report = smoke.run(p, endpoint, options)
    print_smoke_report(report)
    if json_path is not None:
        atomic.write_bytes(json_path, (json.dumps(report.to_json(), indent=2, ensure_ascii=False) + "\n").encode())
    raise typer.Exit(report.exit_code)


# --------------------------------------------------------------------------- startup log


@app.command("startup-log")
def startup_log_cmd(
    profile: ProfileOpt,
    unit: Annotated[str | None, typer.Option(help="read the unit's journal since its current start")] = None,
    log_file: Annotated[Path | None, typer.Option("--file", help="read a saved engine log instead")] = None,
    timeout: Annotated[float, typer.Option(help="seconds to wait for the line (with --unit)")] = 900,
    as_json: JsonOpt = False,
) -> None:
    """Check the auxiliary-layer line vLLM logs for a DFlash drafter (target_layer_ids + 1).

    Exit 0 when it matches, 1 when it differs or never appears, 2 on bad input.
    """
    import subprocess

    from specdeploy import startup_log

    try:
        p = profile_mod.load_profile(profile)
    except SpecdeployError as exc:
        raise _fail(exc) from None
    if p.engine.speculative.method != "dflash":
        out.print(f"profile {p.name} uses {p.engine.speculative.method}: no auxiliary-layer line to check")
        raise typer.Exit(0)
    if (unit is None) == (log_file is None):
        raise _fail(SpecdeployError("pass exactly one of --unit and --file"))
    if log_file is not None:
        check = startup_log.check_aux_layers(p, log_file.read_text(errors="replace"))
    else:
        assert unit is not None

        def failed() -> bool:
            state = subprocess.run(["systemctl", "is-failed", unit], capture_output=True, text=True)
            return state.stdout.strip() == "failed"

        check = startup_log.wait_for_aux_layers(
            p, lambda: startup_log.journal_of_current_run(unit), timeout_s=timeout, failed=failed
        )
    if as_json:
        out.print_json(
            data={"ok": check.ok, "expected": check.expected, "found": check.found, "message": check.message}
        )
    else:
        colour = "green" if check.ok else "bold red"
        out.print(f"[{colour}]{'ok' if check.ok else 'FAIL'}[/] {check.message}", highlight=False)
    raise typer.Exit(0 if check.ok else 1)


# --------------------------------------------------------------------------- preflight


@app.command("preflight")
def preflight_cmd(
    profile: ProfileOpt,
    as_json: JsonOpt = False,
    nvidia_smi: Annotated[str, typer.Option(help="nvidia-smi executable")] = "nvidia-smi",
    podman: Annotated[str, typer.Option(help="podman executable")] = "podman",
    weights_source: Annotated[str, typer.Option(help="hub or archive (no token needed)")] = "hub",
    models_dir: ModelsOpt = None,
    token_file: Annotated[Path | None, typer.Option(help="a file holding the hub token")] = None,
) -> None:
    """Check the host can run the profile: GPUs, compute capability, driver, NVLink, disk,
    podman, port, hub token. Exit 0 when nothing fails (warnings allowed), 1 otherwise."""
    import os

    from specdeploy import preflight

    try:
        p = profile_mod.load_profile(profile)
    except SpecdeployError as exc:
        raise _fail(exc) from None
    token = bool(os.environ.get("HF_TOKEN")) or bool(
        token_file and token_file.is_file() and token_file.read_text().strip()
    )
    options = preflight.Options(
        nvidia_smi=nvidia_smi,
        podman=podman,
        weights_source=weights_source,
        token_present=token,
        models_dir=Path(models_dir) if models_dir else None,
    )
    report = preflight.run(p, options)
    if as_json:
        out.print_json(data=report.to_json())
    else:
        table = Table(title=f"preflight: {p.name}")
        for column in ("check", "", "found", "needs", "fix"):
            table.add_column(column)
        colours = {"ok": "green", "warn": "yellow", "fail": "red", "skip": "dim"}
        for c in report.checks:
            table.add_row(c.name, f"[{colours[c.level]}]{c.level}[/]", c.found, c.expected, c.fix)
        out.print(table)
    raise typer.Exit(0 if report.ok else 1)


# --------------------------------------------------------------------------- rollback

rollback_app = typer.Typer(no_args_is_help=True, help="Put back what a failed deploy replaced, and prove it serves.")
app.add_typer(rollback_app, name="rollback")


@rollback_app.command("restore")
def rollback_restore(
    state_dir: Annotated[Path, typer.Option(help="the host's state directory (rollback copies live under it)")],
    run_id: RunIdOpt,
    unit: Annotated[str, typer.Option(help="the engine's systemd unit")] = "specdeploy-engine",
    json_path: Annotated[Path | None, typer.Option("--json", help="also write the outcome as JSON here")] = None,
) -> None:
    """Restore the unit and serving directory run RUN_ID replaced, restart the engine, and
    run the smoke gate against it with the profile it was deployed with.

    Exit 0 when the previous stack serves again (its smoke gate passes), 1 otherwise.
    """
    from specdeploy import atomic, rollback

    try:
        outcome = rollback.restore_and_prove(state_dir, run_id, unit=unit)
    except SpecdeployError as exc:
        raise _fail(exc) from None
    data = outcome.to_json()
    table = Table(title="rollback", show_header=False)
    for key in ("message", "restored", "removed", "unit_action", "profile_file", "previous_stack_serves", "downtime_s"):
        table.add_row(key, _text(data[key]))
    out.print(table)
    for stage in (outcome.smoke or {}).get("stages", []):
        out.print(f"  {stage['name']}: {stage['status']} - {stage['summary']}", highlight=False)
    if json_path is not None:
        atomic.write_bytes(json_path, (json.dumps(data, indent=2) + "\n").encode())
    raise typer.Exit(0 if outcome.serves else 1)


def _register_optional() -> None:
    """Commands whose modules need the rehearsal extra import lazily inside themselves."""
    from specdeploy.rehearsal import cli as rehearsal_cli

    app.add_typer(rehearsal_cli.app, name="rehearsal")


_register_optional()


def main() -> None:
    try:
        app()
    except SpecdeployError as exc:  # pragma: no cover - commands convert their own errors
        err.print(f"error: {exc}")
        sys.exit(exc.exit_code)
