"""`specdeploy preflight`: can this host run the profile? Refused before anything is installed.
`specdeploy cdi status|record`: is the CDI spec the GPUs reach containers through generated for
the driver the host runs now? (host.cdi)"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from rich.table import Table

from specdeploy.cli import base, output
from specdeploy.core import atomic
from specdeploy.core.errors import UsageError
from specdeploy.host import cdi, command
from specdeploy.host import preflight as checks
from specdeploy.profile import load_profile
from specdeploy.weights.fetch import read_token

# The weights role's sources (ansible/roles/weights/defaults): preflight refuses any other, before the
# deploy replaces anything. present: seeded by `specdeploy migrate prepare`, only verified.
WEIGHTS_SOURCES = ("hub", "archive", "present")
TimeoutOpt = Annotated[
    float,
    typer.Option(
        "--timeout",
        envvar="SPECDEPLOY_PROGRAM_TIMEOUT",
        help="seconds each host program (nvidia-smi, podman) may run before it is reported as hanging",
    ),
]


def _timeout(value: float) -> float:
    """A program deadline in seconds: more than 0, at most an hour (NaN and infinity refused)."""
    if not 0 < value <= 3600:
        raise UsageError(
            f"--timeout {value:g}: expected seconds, more than 0 and at most 3600",
            hint=f"pass e.g. --timeout {command.DEFAULT_TIMEOUT_S:g} (or set SPECDEPLOY_PROGRAM_TIMEOUT)",
        )
    return value


def preflight(
    profile: base.ProfileOpt,
    as_json: base.JsonOpt = False,
    nvidia_smi: Annotated[str, typer.Option(help="nvidia-smi executable")] = "nvidia-smi",
    podman: base.PodmanOpt = "podman",
    weights_source: Annotated[
        str, typer.Option(help="hub, archive or present (no token needed for the last two)")
    ] = "hub",
    models_dir: base.ModelsDirOpt = None,
    token_file: Annotated[Path | None, typer.Option(help="a file holding the hub token (one line, mode 600)")] = None,
    token_stdin: Annotated[
        bool, typer.Option("--token-stdin", help="read the HF token from standard input (how Ansible passes it)")
    ] = False,
    timeout: TimeoutOpt = command.DEFAULT_TIMEOUT_S,
    image: Annotated[
        str | None,
        typer.Option(
            help="the engine image to run: its io.specdeploy.cuda label is compared with the driver "
            "(default: the profile's CUDA variant)"
        ),
    ] = None,
    report_file: Annotated[
        Path | None,
        typer.Option("--report", help="also write the JSON report to this file (atomically; the role keeps it)"),
    ] = None,
) -> None:
    """Check the host can run the profile: GPUs, compute capability, driver, NVLink, disk,
    podman, port, hub token. Exit 0 when nothing fails (warnings allowed), 1 otherwise; 2 for
    bad input (an unknown --weights-source, a token file that holds no token)."""
    p = load_profile(profile)
    if weights_source not in WEIGHTS_SOURCES:
        raise UsageError(
            f"--weights-source {weights_source!r}: expected one of {', '.join(WEIGHTS_SOURCES)}; nothing was checked",
            hint="pass --weights-source hub (fetched with a token), archive (unpacked from an archive) or present "
            "(already on the host, seeded by `specdeploy migrate prepare`)",
        )
    # the same rules as the fetch: stdin, else a mode-600 file, else $HF_TOKEN
    token = read_token(token_file, from_stdin=token_stdin) is not None
    options = checks.Options(
        nvidia_smi=nvidia_smi,
        podman=podman,
        weights_source=weights_source,
        token_present=token,
        models_dir=base.host_layout(models_dir).models,
        timeout_s=_timeout(timeout),
        image=image,
    )
    report = checks.run(p, options)
    if report_file is not None:
        atomic.write_json(report_file, report.to_json())

    def table() -> None:
        t = Table("check", "", "found", "needs", title=f"preflight: {p.name}")
        for c in report.checks:
            t.add_row(*output.cells(c.name, output.status(c.level), c.found, c.expected))
        output.out.print(t)
        # each failure and warning with its fix, one line each, below the table
        for c in report.checks:
            if c.fix and c.level in (checks.Level.fail, checks.Level.warn):
                output.out.print(output.line(output.status(c.level), " ", c.name, ": ", c.found), highlight=False)
                output.out.print(output.line("  ", output.styled("fix:", "bold"), " ", c.fix), highlight=False)

    output.emit(report.to_json(), as_json, table)
    raise typer.Exit(0 if report.ok else 1)


cdi_app = base.group("The CDI spec the GPUs reach containers through: generated for the running driver?")
SpecOpt = Annotated[Path, typer.Option("--spec", help="the CDI spec nvidia-ctk generates (gpu_runtime_cdi_spec)")]
NvidiaSmiOpt = Annotated[str, typer.Option("--nvidia-smi", help="nvidia-smi executable")]


def _fields_table(title: str, data: dict[str, object], style: str | None = None) -> Table:
    t = Table(title=title, show_header=False)
    for key, value in data.items():
        t.add_row(*output.cells(key, value), style=style if key in ("regenerate", "reason") else None)
    return t


@cdi_app.command("status")
def cdi_status(
    spec: SpecOpt = Path("/etc/cdi/nvidia.yaml"),
    state_dir: base.StateDirOpt = None,
    nvidia_smi: NvidiaSmiOpt = "nvidia-smi",
    as_json: base.JsonOpt = False,
    timeout: TimeoutOpt = command.DEFAULT_TIMEOUT_S,
) -> None:
    """Say whether the CDI spec must be (re)generated for the running driver.

    Yes when the spec is missing, no stamp says which driver it was generated for, the stamp
    names another driver, or the spec changed since it was recorded. Exit 0 either way (read
    `regenerate`); 1 when nvidia-smi cannot tell the one driver the GPUs run (or does not
    answer within --timeout seconds); 2 when the spec or the stamp is not a file.
    """
    state = base.host_layout(state_dir=state_dir).state
    decision = cdi.check(spec, state, nvidia_smi, timeout=_timeout(timeout))
    data = {**decision.to_json(), "stamp": str(cdi.stamp_path(state))}
    style = "bold yellow" if decision.regenerate else "green"
    output.emit(data, as_json, lambda: _fields_table("cdi status", data, style))


@cdi_app.command("record")
def cdi_record(
    spec: SpecOpt = Path("/etc/cdi/nvidia.yaml"),
    state_dir: base.StateDirOpt = None,
    nvidia_smi: NvidiaSmiOpt = "nvidia-smi",
    as_json: base.JsonOpt = False,
    timeout: TimeoutOpt = command.DEFAULT_TIMEOUT_S,
) -> None:
    """Record the driver the CDI spec was just generated for.

    Run right after `nvidia-ctk cdi generate`: the driver version, the spec and its sha256 go
    to <state>/cdi.json (never under /etc/cdi). Exit 2 when the spec does not exist or is not
    a file, or the state directory or stamp is not what specdeploy writes; 1 when nvidia-smi
    cannot tell the driver (or does not answer within --timeout seconds).
    """
    state = base.host_layout(state_dir=state_dir).state
    with base.writing("cdi record", state_dir=state_dir):
        stamp = cdi.record_running(spec, state, nvidia_smi, timeout=_timeout(timeout))
    data = {**stamp.to_json(), "stamp": str(cdi.stamp_path(state))}
    output.emit(data, as_json, lambda: _fields_table("cdi record", data))


@cdi_app.command("keep")
def cdi_keep(
    rollback_dir: Annotated[Path, typer.Option("--rollback-dir", help="the deploy run's rollback directory")],
    run_id: base.RunIdOpt,
    spec: SpecOpt = Path("/etc/cdi/nvidia.yaml"),
    state_dir: base.StateDirOpt = None,
    as_json: base.JsonOpt = False,
) -> None:
    """Keep the CDI spec and its stamp for this run's rollback, before the spec is generated again:
    a failed deploy puts both back with the previous stack (the engine it restarts reaches its GPUs
    through the spec it ran with). Exit 2 when the run id is not a plain name or an earlier run was
    interrupted (recover it first)."""
    from specdeploy.core import deploylock
    from specdeploy.core.keeper import Keeper, check_run_id

    check_run_id(run_id)
    state = base.host_layout(state_dir=state_dir).state
    with deploylock.held(state, f"cdi keep for run {run_id}"):
        kept = cdi.keep_for_rollback(spec, state, Keeper(rollback_dir, run_id))
    data = {"run_id": run_id, "kept": kept, "rollback_dir": str(rollback_dir)}
    output.emit(data, as_json, lambda: _fields_table("cdi keep", data))


def register(app: typer.Typer) -> None:
    app.command("preflight")(preflight)
    app.add_typer(cdi_app, name="cdi")
