"""`specdeploy lock update|show|diff|check|merge`: the site's lock, kept on the controller.

`update` is the deliberate pin-bump flow; `check` and `merge` are what the play runs on the
controller before the stages and after the gate (profile.site_lock says why and how). Every
write is atomic; a lock that is not one is a LockFileError (exit 2) before anything changes.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.table import Table

from specdeploy.cli import base, output
from specdeploy.core.errors import UsageError
from specdeploy.profile import load_profile, resolve_profile_path
from specdeploy.profile import site_lock as sl
from specdeploy.profile.lock import Lock

lock_app = base.group("The site's lock on the controller: update pins, show, diff, and the deploy's check and merge.")

SiteLockOpt = Annotated[
    Path,
    typer.Option("--lock", help="the site's lock (beside the inventory: the play's specdeploy_site_lock)"),
]
HostOpt = Annotated[str, typer.Option("--host", help="the host's name, for messages (inventory_hostname)")]
HostLockOpt = Annotated[
    Path | None, typer.Option("--host-lock", help="the host's lock, copied to a file (by hand)", dir_okay=False)
]
HostStdinOpt = Annotated[
    bool, typer.Option("--host-stdin", help="read the host's lock as base64 on standard input (the play's slurp)")
]


def _host_lock(host: str, host_lock: Path | None, host_stdin: bool) -> Lock | None:
    if host_lock is not None and host_stdin:
        raise UsageError("--host-lock and --host-stdin both name the host's lock", hint="pass one of them")
    return sl.read_host_lock(path=host_lock, stdin_base64=sys.stdin.read() if host_stdin else None, host=host)


def _site(path: Path) -> Lock:
    return Lock(path)


@lock_app.command("check")
def lock_check(
    lock: SiteLockOpt,
    profile: base.ProfileOpt,
    host: HostOpt = "the host",
    host_lock: HostLockOpt = None,
    host_stdin: HostStdinOpt = False,
    check: base.CheckOpt = False,
    as_json: base.JsonOpt = False,
) -> None:
    """Before a deploy: refuse pins bumped without `lock update`, and a host whose lock
    diverges from the site's (naming the entry and both values). Exit 1 on a refusal."""
    site = _site(lock)
    p = load_profile(resolve_profile_path(profile))
    result = sl.check_host(site, _host_lock(host, host_lock, host_stdin), p, host=host, write=not check)

    def table() -> Table:
        t = Table("host entries", "count", "what the deploy does", title=f"host {host} against {lock}")
        t.add_row(*output.cells("lacking", len(result.lacks), "receives the site's values"))
        t.add_row(*output.cells("superseded", len(result.superseded), "replaced by the values after `lock update`"))
        t.add_row(*output.cells("host only", len(result.dropped), "resolved again; recorded after the gate"))
        return t

    output.emit(result.to_json(), as_json, table)


@lock_app.command("merge")
def lock_merge(
    lock: SiteLockOpt,
    host: HostOpt = "the host",
    host_lock: HostLockOpt = None,
    host_stdin: HostStdinOpt = False,
    as_json: base.JsonOpt = False,
) -> None:
    """After a host's gate passed: add the entries it resolved to the site's lock (new entries
    only; a conflicting value is refused, naming it, and nothing is merged)."""
    theirs = _host_lock(host, host_lock, host_stdin)
    if theirs is None:
        raise UsageError(
            "lock merge needs the host's lock: --host-lock FILE or --host-stdin", hint="pass the host's lock"
        )
    site = _site(lock)
    added = sl.merge_back(site, theirs, host=host)
    data = {"site_lock": str(lock), "host": host, "added": added, "changed": bool(added)}

    def table() -> Table:
        t = Table("entry added", title=f"{len(added)} new entr{'y' if len(added) == 1 else 'ies'} from {host}")
        for name in added:
            t.add_row(*output.cells(name))
        return t

    output.emit(data, as_json, table)


@lock_app.command("update")
def lock_update(
    profile: base.ProfileOpt,
    lock: SiteLockOpt,
    keys: Annotated[list[str] | None, typer.Option("--key", help="also resolve this entry again (repeatable)")] = None,
    dry_run: Annotated[bool, typer.Option("--dry-run", help="show what would change; write nothing")] = False,
    as_json: base.JsonOpt = False,
) -> None:
    """The deliberate pin bump: show which pins changed since the lock was last updated and the
    entries they make stale, then write the lock (stale values kept as superseded, the new pins'
    snapshot taken). The next deploy resolves the new values through the gate."""
    site = _site(lock)
    p = load_profile(resolve_profile_path(profile))
    plan = sl.plan_update(site, p, keys=tuple(keys or ()))
    written = not dry_run and not plan.empty
    if written:
        sl.apply_update(site, p, plan)
    data = plan.to_json() | {"written": written}

    def table() -> None:
        if plan.empty:
            output.out.print(output.line("profile ", p.name, ": its pins are those the lock ", str(lock), " holds"))
            return
        pins = Table("pin", "locked for", "profile now", title=f"pins of {p.name} changed" + (
            " (the lock had no snapshot: every pin)" if plan.first else ""))  # fmt: skip
        for c in plan.changed:
            pins.add_row(*output.cells(c.pin, _cell(c.locked), _cell(c.profile)))
        output.out.print(pins)
        stale = Table(
            "entry", "recorded value", "stale because", title="entries made stale (resolved by the next deploy)"
        )
        for s in plan.stale:
            stale.add_row(*output.cells(s.key, _cell(s.value), ", ".join(s.because)))
        output.out.print(stale)
        if plan.kept:
            output.out.print(output.line("kept: ", ", ".join(plan.kept)))
        verdict = "written to " + str(lock) if written else "dry run: nothing written"
        output.out.print(output.line(verdict, "; then deploy: the gate proves the new pins"))

    output.emit(data, as_json, table)


def _cell(value: Any) -> str:
    text = "unresolved / none" if value is None else output.as_text(value)
    return text if len(text) <= 70 else text[:66] + "..."


@lock_app.command("show")
def lock_show(lock: SiteLockOpt, as_json: base.JsonOpt = False) -> None:
    """Every entry of a lock, per profile, and the pins each profile's entries were made for."""
    site = _site(lock)

    def table() -> Table:
        t = Table("profile", "entry", "value", "recorded by", "at", title=str(lock))
        for name, section in sorted(site.data["profiles"].items()):
            for key, entry in sorted(section.items()):
                t.add_row(*output.cells(name, key, _cell(entry["value"]), entry["recorded_by"], entry["recorded_at"]))
        return t

    output.emit(site.data, as_json, table)


@lock_app.command("diff")
def lock_diff(
    a: Annotated[Path, typer.Argument(help="a lock file")],
    b: Annotated[Path, typer.Argument(help="another lock file")],
    as_json: base.JsonOpt = False,
) -> None:
    """The entries whose values differ between two locks (a host's and the site's, say).
    Exit 1 when they differ."""
    found = sl.diff(Lock(a), Lock(b))
    rows = [d.__dict__ for d in found]

    def table() -> Table:
        t = Table("profile", "entry", str(a), str(b), title=f"{len(found)} difference(s)")
        for d in found:
            t.add_row(*output.cells(d.profile, d.key, _cell(d.a), _cell(d.b)))
        return t

    output.emit(rows, as_json, table)
    if found:
        raise typer.Exit(1)


def register(app: typer.Typer) -> None:
    app.add_typer(lock_app, name="lock")
