"""`specdeploy profile list|show` and `specdeploy facts`: the profile, read by people and by Ansible."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from rich.table import Table

from specdeploy.cli import base, output
from specdeploy.core import layout
from specdeploy.profile import iter_pins, list_profiles, load_profile, resolve_profile_path, unresolved_pins
from specdeploy.profile.facts import deploy_facts

profile_app = base.group("List and show deployment profiles.")


@profile_app.command("list")
def profile_list(as_json: base.JsonOpt = False) -> None:
    """List the known profiles and how many of their pins are unresolved."""
    rows = []
    for name, path in sorted(list_profiles().items()):
        p = load_profile(path)
        spec = p.engine.speculative
        rows.append(
            {
                "name": name,
                "engine": f"{p.engine.kind} {p.engine.source.version.value or '?'}",
                "speculative": f"{spec.method} x{spec.num_speculative_tokens}",
                "unresolved_pins": len(unresolved_pins(p)),
                "path": str(path),
            }
        )

    def table() -> Table:
        t = Table("profile", "engine", "speculative", "unresolved pins", "file")
        for r in rows:
            t.add_row(r["name"], r["engine"], r["speculative"], str(r["unresolved_pins"]), r["path"])
        return t

    output.emit(rows, as_json, table)


@profile_app.command("show")
def profile_show(name: str, as_json: base.JsonOpt = False) -> None:
    """Show one profile: every pin with its provenance, then the full document."""
    p = load_profile(name)
    data = p.model_dump(mode="json") | {"unresolved_pins": [path for path, _ in unresolved_pins(p)]}

    def table() -> Table:
        output.out.print(f"[bold]{p.name}[/]: {p.description}")
        t = Table("pin", "value", "provenance", "source", title="pins")
        for path, pin in iter_pins(p):
            value = output.text(pin.value) if pin.resolved else "-"
            t.add_row(path, value, pin.provenance.value, output.text(pin.source), style=None if pin.resolved else "red")
        return t

    output.emit(data, as_json, table)


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
    p = load_profile(resolve_profile_path(profile))
    host = base.host_layout(models_dir, serving_dir, state_dir, cache_dir)
    install = layout.InstallLayout(Path(install_root)) if install_root else layout.InstallLayout()
    facts = deploy_facts(p, host, install, publish_host=publish_host)
    output.emit(facts, True, lambda: None)


def register(app: typer.Typer) -> None:
    app.add_typer(profile_app, name="profile")
    app.command("facts")(facts)
