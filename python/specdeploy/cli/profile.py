"""`specdeploy profile list|show` and `specdeploy facts`: the profile, read by people and by Ansible."""

from __future__ import annotations

import ipaddress
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.table import Table

from specdeploy.cli import base, output
from specdeploy.core import layout
from specdeploy.core.errors import ProfileError, SpecdeployError, UsageError
from specdeploy.profile import iter_pins, list_profiles, load_profile, resolve_profile_path, unresolved_pins
from specdeploy.profile.facts import deploy_facts
from specdeploy.profile.load import profile_dirs

profile_app = base.group("List and show deployment profiles.")


@profile_app.command("list")
def profile_list(as_json: base.JsonOpt = False) -> None:
    """List the known profiles and how many of their pins are unresolved.

    A profile that cannot be loaded is listed with its error, after the others; the command
    then exits 2 naming each such file."""
    rows: list[dict[str, Any]] = []
    broken: list[tuple[Path, SpecdeployError]] = []
    for name, path in sorted(list_profiles().items()):
        try:
            p = load_profile(path)
        except SpecdeployError as exc:
            broken.append((path, exc))
            rows.append(
                {"name": name, "engine": None, "speculative": None, "unresolved_pins": None, "path": str(path)}
                | {"error": exc.message}
            )
            continue
        spec = p.engine.speculative
        version = p.engine.source.version
        rows.append(
            {
                "name": name,
                "engine": f"{p.engine.kind} {output.as_text(version.value) if version.resolved else '?'}",
                "speculative": f"{spec.method} x{spec.num_speculative_tokens}",
                "unresolved_pins": len(unresolved_pins(p)),
                "path": str(path),
            }
        )

    def table() -> Table:
        t = Table("profile", "engine", "speculative", "unresolved pins", "file")
        for r in rows:
            if "error" in r:
                t.add_row(
                    *output.cells(r["name"], output.styled("cannot be loaded (below)", "bold red"), "", "", r["path"])
                )
            else:
                t.add_row(*output.cells(r["name"], r["engine"], r["speculative"], r["unresolved_pins"], r["path"]))
        return t

    output.emit(rows, as_json, table)
    if broken:
        details = "\n".join(_broken(path, exc) for path, exc in broken)
        raise ProfileError(
            f"{len(broken)} of {len(rows)} profile file(s) cannot be loaded (the others are listed above):\n{details}",
            hint="fix or remove each file named above (profiles are looked up in "
            f"{', '.join(str(d) for d in profile_dirs())}; $SPECDEPLOY_PROFILES adds directories)",
        )


def _broken(path: Path, exc: SpecdeployError) -> str:
    """One unloadable profile in the list's error: its message (naming the file) and its fix."""
    lines = exc.message.splitlines() or [""]
    if str(path) not in lines[0]:
        lines[0] = f"{path}: {lines[0]}"
    shown = lines[:8] + ([f"... ({len(lines) - 8} more lines)"] if len(lines) > 8 else [])
    if exc.hint:
        shown.append(f"  fix: {exc.hint}")
    return "  " + "\n    ".join(shown)


@profile_app.command("show")
def profile_show(name: str, as_json: base.JsonOpt = False) -> None:
    """Show one profile: every pin with its provenance, then the full document."""
    p = load_profile(name)
    data = p.model_dump(mode="json") | {"unresolved_pins": [path for path, _ in unresolved_pins(p)]}

    def table() -> Table:
        output.out.print(output.line(output.styled(p.name, "bold"), ": ", p.description))
        t = Table("pin", "value", "provenance", "source", title="pins")
        for path, pin in iter_pins(p):
            value = pin.value if pin.resolved else "-"
            t.add_row(
                *output.cells(path, value, pin.provenance.value, pin.source), style=None if pin.resolved else "red"
            )
        return t

    output.emit(data, as_json, table)


def _absolute(option: str, value: str | None) -> str | None:
    """A host path from the inventory: empty means the layout's default; otherwise absolute."""
    if value and not Path(value).is_absolute():
        raise UsageError(
            f"{option}: expected an absolute path on the host, found {value!r}; a relative path would be "
            "resolved against whatever directory each role runs in",
            hint=f"pass {option} /absolute/path (or leave it empty for the host layout's default)",
        )
    return value


def _publish_host(value: str | None) -> str | None:
    if not value:
        return value
    try:
        ipaddress.ip_address(value.removeprefix("[").removesuffix("]"))
    except ValueError:
        raise UsageError(
            f"--publish-host: expected an IP address of the host (podman publishes a port on an address), "
            f"found {value!r}; the engine unit could not be written with it",
            hint=f"pass an IPv4 or IPv6 address such as 10.0.0.5, or leave it empty for {layout.DEFAULT_PUBLISH_HOST}",
        ) from None
    return value


def facts(
    profile: base.ProfileOpt,
    models_dir: base.ModelsDirOpt = None,
    serving_dir: base.ServingDirOpt = None,
    state_dir: base.StateDirOpt = None,
    cache_dir: base.CacheDirOpt = None,
    install_root: Annotated[str | None, typer.Option(help="where the CLI is installed on the host")] = None,
    publish_host: base.PublishHostOpt = None,
) -> None:
    """Print, as JSON, what the Ansible roles need: profile values, host paths (with the
    inventory's overrides), the engine unit. The play reads it once, on the controller."""
    for option, value in (
        ("--models-dir", models_dir),
        ("--serving-dir", serving_dir),
        ("--state-dir", state_dir),
        ("--cache-dir", cache_dir),
        ("--install-root", install_root),
    ):
        _absolute(option, value)
    publish_host = _publish_host(publish_host)
    p = load_profile(resolve_profile_path(profile))
    host = base.host_layout(models_dir, serving_dir, state_dir, cache_dir)
    install = layout.InstallLayout(Path(install_root)) if install_root else layout.InstallLayout()
    facts = deploy_facts(p, host, install, publish_host=publish_host)
    output.emit(facts, True, lambda: None)


def register(app: typer.Typer) -> None:
    app.add_typer(profile_app, name="profile")
    app.command("facts")(facts)
