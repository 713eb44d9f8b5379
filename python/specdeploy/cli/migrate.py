"""`specdeploy migrate`: move a serving deployment to a new host (docs/migration.md).

One verb per step, driven from the controller: `migrate plan|prepare|verify|cutover|rollback|finish
--from OLD --to NEW -i INVENTORY [--front HOST]...`. Each step checks its predecessors in the migration
record (`<inventory dir>/migrations/OLD--NEW.json`), records its start and its end however it ends,
prints a table (or `--json`) and exits 0 done, 1 a check failed (named, traffic where the record
says), 2 bad input. Extra arguments after `--` go to `ansible-playbook deploy.yml` (the site's own
`-e ...`, as its deploys pass them).

`migrate compare OLD NEW --profile P` is verify's comparison of two gate reports (`gate.json`, as
`<state>/runs/<run-id>/` holds them): the table of migrate.compare, every line with both values.
Exit 0 when NEW serves what OLD serves, 1 when a line differs, 2 when a report or the profile
cannot be read.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer
from rich.table import Table

from specdeploy.cli import base, output
from specdeploy.core import files, layout, progress
from specdeploy.core.errors import InputFileError, SpecdeployError, UsageError

if TYPE_CHECKING:  # the migrate stage loads when a step runs (the CLI starts fast)
    from specdeploy.migrate.record import MigrationRecord

migrate_app = base.group(
    "Move a serving deployment to a new host: plan, prepare, verify, cutover, rollback, finish (docs/migration.md)."
)
FromOpt = Annotated[str, typer.Option("--from", help="OLD: the inventory name of the host serving now")]
ToOpt = Annotated[str, typer.Option("--to", help="NEW: the inventory name of the host to move to")]
InventoryOpt = Annotated[
    Path, typer.Option("--inventory", "-i", help="the site's inventory (its directory: lock, records)")
]
FrontOpt = Annotated[
    list[str] | None,
    typer.Option(
        "--front",
        help="the inventory name of the front (HAProxy) host; repeated for a site with several (each gets every move)",
    ),
]
SocketOpt = Annotated[
    str | None,
    typer.Option(
        "--socket", help="the front's HAProxy runtime API socket on the front host (default: the front's own)"
    ),
]
HookOpt = Annotated[
    str | None,
    typer.Option(
        "--front-hook",
        help="the site's own balancer instead of HAProxy: its hook's path on the front host (docs/front.md)",
    ),
]
VaultOpt = Annotated[
    Path | None, typer.Option("--vault-password-file", help="the inventory's vault password (its group_vars)")
]


def _report(path: Path, which: str) -> dict[str, Any]:
    data = files.read_json(path, what=f"{which}'s gate report")
    if not isinstance(data, dict) or "verdict" not in data or "smoke" not in data:
        raise InputFileError(
            f"{which}'s gate report {path}: expected a {layout.GATE_REPORT} (an object with `verdict` and `smoke`), "
            f"found {type(data).__name__}{' without them' if isinstance(data, dict) else ''}; nothing was compared",
            hint=f"pass the {layout.GATE_REPORT} of a run: <state>/verified/{layout.GATE_REPORT} on the host names "
            "its last verified run",
        )
    return data


@migrate_app.command("compare")
def compare_reports(
    old: Annotated[Path, typer.Argument(metavar="OLD", help="OLD's last verified gate.json")],
    new: Annotated[Path, typer.Argument(metavar="NEW", help="NEW's gate.json")],
    profile: Annotated[str, typer.Option("--profile", help="profile name or file: its migration tolerance")],
    as_json: base.JsonOpt = False,
) -> None:
    """Compare NEW's gate report with OLD's: identity, golden transcript, acceptance, decode rate.

    Exit 0 when NEW serves what OLD serves, 1 when a line differs, 2 when a report cannot be read.
    """
    from specdeploy.migrate import compare
    from specdeploy.profile import load_profile, resolve_profile_path

    tolerance = load_profile(resolve_profile_path(profile)).migration.decode_rate_tolerance
    result = compare.compare(_report(old, "OLD"), _report(new, "NEW"), decode_rate_tolerance=tolerance)

    def table() -> None:
        t = Table("", "what", "OLD", "NEW", "note", title=f"migrate compare {old} {new}")
        for line in result.lines:
            mark = "·" if line.same is None else output.MARKS[line.same]
            t.add_row(*output.cells(mark, line.what, line.old, line.new, line.note))
        output.out.print(t)
        output.out.print(("[green]" if result.same else "[bold red]") + result.summary() + "[/]")

    output.emit(result.to_json(), as_json, table)
    raise typer.Exit(0 if result.same else 1)


def _say(step: str) -> Any:
    """A step's message: printed, and the running step's (core.progress) last observation."""

    def say(text: str) -> None:
        output.err.print(f"{step}: {text}", highlight=False, markup=False)
        progress.observe(text)

    return say


def _step(
    step: str,
    old: str,
    new: str,
    inventory: Path,
    front: list[str] | None,
    door: tuple[str | None, str | None],
    vault: Path | None,
    deploy_args: list[str],
    as_json: bool,
    **options: Any,
) -> None:
    from specdeploy.migrate import record

    record.check_host_name(old, "--from")
    record.check_host_name(new, "--to")
    if old == new:
        raise UsageError(
            f"--from and --to name the same host ({old}): a migration moves between two",
            hint="--from names the host serving now, --to the one to move to",
        )
    fronts = list(front or [])
    for name in fronts:
        record.check_host_name(name, "--front")
    if len(set(fronts)) != len(fronts) or {old, new} & set(fronts):
        raise UsageError(
            f"--front {' --front '.join(fronts)}: expected distinct front hosts, neither OLD nor NEW",
            hint="name each front (HAProxy) host once; OLD and NEW are engine hosts",
        )
    socket, hook = door
    base.one_balancer(socket, hook, hook_flag="--front-hook")
    if options.get("seed_from") is not None:
        record.check_host_name(options["seed_from"], "--seed-from")
        if options["seed_from"] == new:
            raise UsageError(
                f"--seed-from names NEW itself ({new}): the weights are copied to it, from OLD or a mirror",
                hint="leave --seed-from out to copy from OLD, or name the site mirror's inventory host",
            )
    if not inventory.is_file():
        raise UsageError(f"--inventory {inventory}: expected the site's inventory file, found none",
                         hint="pass the inventory the deploys use (-i)")  # fmt: skip
    site = inventory.resolve().parent
    rec = record.load(site, old, new) or record.MigrationRecord(old=old, new=new)
    if why := rec.may_start(step):
        raise UsageError(why, hint=f"see `specdeploy migrate show --from {old} --to {new} -i {inventory}`")
    # a line at once (the step's own ticker speaks first after a period): the first silence is the CLI's start
    _say(step)(f"from {old} to {new}" + (f" through {', '.join(fronts)}" if fronts else ""))
    # no silent minutes (issue 37): a line at least every 20 s from here to the step's end, naming what it
    # does now (reading the inventory, a host's command, a play's task, a copy); the steps inside report to
    # it. A cutover's drain polls the front with many short commands, none of which lasts a period on its
    # own, and reading a loaded site's inventory and vault for three hosts took 25 s before a step began.
    with progress.step(f"migrate {step}"):
        details = _run_step(step, rec, site, inventory, old, new, fronts, (socket, hook), vault, deploy_args, options)
    summary = _summary(step, details)
    rec.end(step, True, summary, details)  # type: ignore[arg-type]
    where = record.save(site, rec)
    data = {"step": step, "summary": summary, "details": details, "traffic_on": rec.traffic_on, "record": str(where)}

    def table() -> None:
        t = Table("", "", title=f"migrate {step} {old} -> {new}")
        for key, value in details.items():
            t.add_row(*output.cells(key, value))
        output.out.print(t)
        output.out.print(f"[green]{step} done[/]: {output.text(summary)}; traffic on {rec.traffic_on}; record {where}")

    output.emit(data, as_json, table)


def _run_step(
    step: str,
    rec: MigrationRecord,
    site: Path,
    inventory: Path,
    old: str,
    new: str,
    fronts: list[str],
    door: tuple[str | None, str | None],
    vault: Path | None,
    deploy_args: list[str],
    options: dict[str, Any],
) -> dict[str, Any]:
    """The step itself, inside its progress step: each host's connection read from the inventory (each
    read said), the step run, and its start and end (or how it stopped) in the migration's record."""
    from specdeploy.migrate import hosts, record, steps

    def access(name: str) -> Any:
        progress.observe(f"reading {name}'s connection from the inventory")
        return hosts.access(inventory, name, vault_password_file=vault)

    socket, hook = door
    front_accesses = [access(name) for name in fronts]
    front_access = front_accesses[0] if front_accesses else None
    if hook is None and socket is None and front_access is not None:  # the inventory's, as the roles read it
        hook = front_access.variables.get("front_hook") or None
    m = steps.Migration(
        site=site, inventory=inventory.resolve(), old=access(old), new=access(new),
        front=front_access, other_fronts=front_accesses[1:], front_socket=socket, front_hook=hook,
        vault_password_file=vault,
        deploy_args=deploy_args,
        progress=_say(step),
    )  # fmt: skip
    if options.get("seed_from") is not None:
        options["seed_from"] = access(options["seed_from"])
    rec.start(step)  # type: ignore[arg-type]
    record.save(site, rec)
    try:
        return getattr(steps, step)(m, rec, **options)
    except SpecdeployError as exc:
        rec.end(step, False, exc.message, {"hint": exc.hint})  # type: ignore[arg-type]
        record.save(site, rec)
        raise
    except BaseException as exc:  # interrupted, or a bug: recorded, then raised as it was
        rec.end(step, False, f"stopped: {type(exc).__name__}: {exc}")  # type: ignore[arg-type]
        record.save(site, rec)
        raise
    finally:
        m.close()


def _summary(step: str, details: dict[str, Any]) -> str:
    if step == "plan":
        lacks = details.get("bytes_new_lacks", details["bytes_to_copy"])  # a record from before the field
        return (
            f"{details['files']} files, {details['bytes_to_copy']} bytes ({lacks} of them not on NEW yet); "
            "downtime: none expected"
        )
    if step == "prepare":
        seeded = details["seed"]
        copied = f"{seeded['copied']} files copied ({seeded['bytes_copied']} bytes)"
        image = details.get("image")
        moved = f"; OLD's image archive: {image['bytes_copied']} bytes copied" if image else ""
        return f"{copied}, {seeded['already_verified']} already verified{moved}; NEW deployed and gated"
    if step == "verify":
        return details["summary"]
    if step in ("cutover", "rollback") and "duration_s" in details:
        failed = details["failed_requests_at_front"]
        counted = "not counted (the hook's balancer keeps its own)" if failed is None else f"{failed}"
        return f"{details['duration_s']} s, failed requests at the front: {counted}"
    return str(details.get("traffic") or details.get("old_engine") or "done")


DeployArgs = Annotated[list[str] | None, typer.Argument(help="after --: extra arguments for deploy.yml")]


def _command(step: str, doc: str) -> None:
    def command(
        old: FromOpt,
        new: ToOpt,
        inventory: InventoryOpt,
        front: FrontOpt = None,
        socket: SocketOpt = None,
        hook: HookOpt = None,
        vault: VaultOpt = None,
        deploy_args: DeployArgs = None,
        as_json: base.JsonOpt = False,
    ) -> None:
        _step(step, old, new, inventory, front, (socket, hook), vault, list(deploy_args or []), as_json)

    command.__doc__ = doc
    migrate_app.command(step)(command)


_command("plan", "Check both hosts, OLD's verified gate, golden and identity; print what will be copied.")
_command("verify", "Gate NEW and compare it with OLD's last verified gate; any difference stops here.")
_command("cutover", "Through the front: NEW in, OLD drained (in-flight requests finish), OLD out.")
_command("rollback", "Back to OLD from any step: OLD in, NEW drained, NEW out.")


@migrate_app.command("prepare")
def prepare(
    old: FromOpt,
    new: ToOpt,
    inventory: InventoryOpt,
    front: FrontOpt = None,
    socket: SocketOpt = None,
    hook: HookOpt = None,
    vault: VaultOpt = None,
    seed_from: Annotated[
        str | None,
        typer.Option(
            "--seed-from",
            help="an inventory host (a site mirror) to copy the weights from instead of OLD: its models "
            "directory at the same path; every file is verified against the lock either way",
        ),
    ] = None,
    image_from_old: Annotated[
        bool,
        typer.Option(
            "--image-from-old",
            help="give NEW the engine image OLD serves as an archive saved on OLD and seeded to NEW (verified, "
            "resumable), not pulled by digest from the site registry: for a site with no registry",
        ),
    ] = False,
    deploy_args: DeployArgs = None,
    as_json: base.JsonOpt = False,
) -> None:
    """Seed NEW's weights from OLD or --seed-from (verified, resumable), copy OLD's golden, deploy OLD's profile."""
    _step(
        "prepare",
        old,
        new,
        inventory,
        front,
        (socket, hook),
        vault,
        list(deploy_args or []),
        as_json,
        seed_from=seed_from,
        image_from_old=image_from_old,
    )


@migrate_app.command("finish")
def finish(
    old: FromOpt,
    new: ToOpt,
    inventory: InventoryOpt,
    stop_old: Annotated[bool, typer.Option("--stop-old", help="stop OLD's engine (weights and state kept)")] = False,
    front: FrontOpt = None,
    socket: SocketOpt = None,
    hook: HookOpt = None,
    vault: VaultOpt = None,
    as_json: base.JsonOpt = False,
) -> None:
    """After NEW served the profile's soak with its light gate passing: stop OLD's engine (--stop-old)."""
    _step("finish", old, new, inventory, front, (socket, hook), vault, [], as_json, stop_old=stop_old)


@migrate_app.command("show")
def show(old: FromOpt, new: ToOpt, inventory: InventoryOpt, as_json: base.JsonOpt = False) -> None:
    """The migration record: each step's status, summary and times, and where traffic is."""
    from specdeploy.migrate import record

    rec = record.load(inventory.resolve().parent, old, new)
    if rec is None:
        raise UsageError(f"no migration {old} -> {new} recorded beside {inventory}", hint="start with `migrate plan`")

    def table() -> None:
        t = Table(
            "step", "status", "finished", "summary", title=f"migration {old} -> {new} (traffic on {rec.traffic_on})"
        )
        for name in record.STEPS:
            found = rec.steps.get(name)  # type: ignore[call-overload]
            t.add_row(*output.cells(name, found.status if found else "not run", found.finished_at if found else "",
                                    found.summary if found else ""))  # fmt: skip
        output.out.print(t)
        runs = Table("step", "status", "seconds", "bytes copied", "move s", "failed requests", title="every run")
        for event in rec.runs():
            runs.add_row(*output.cells(*(event.get(k, "") for k in record.RUN_FIELDS)))
        output.out.print(runs)

    output.emit(rec.model_dump(mode="json"), as_json, table)


def register(app: typer.Typer) -> None:
    app.add_typer(migrate_app, name="migrate")
