"""`specdeploy preflight`: can this host run the profile? Refused before anything is installed."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from rich.table import Table

from specdeploy.cli import base, output
from specdeploy.host import preflight as checks
from specdeploy.profile import load_profile
from specdeploy.weights.fetch import read_token


def preflight(
    profile: base.ProfileOpt,
    as_json: base.JsonOpt = False,
    nvidia_smi: Annotated[str, typer.Option(help="nvidia-smi executable")] = "nvidia-smi",
    podman: base.PodmanOpt = "podman",
    weights_source: Annotated[str, typer.Option(help="hub or archive (no token needed)")] = "hub",
    models_dir: base.ModelsDirOpt = None,
    token_file: Annotated[
        Path | None, typer.Option(help="a file holding the hub token (mode 600)", **base.InputFile)
    ] = None,
    token_stdin: Annotated[
        bool, typer.Option("--token-stdin", help="read the HF token from standard input (how Ansible passes it)")
    ] = False,
) -> None:
    """Check the host can run the profile: GPUs, compute capability, driver, NVLink, disk,
    podman, port, hub token. Exit 0 when nothing fails (warnings allowed), 1 otherwise."""
    p = load_profile(profile)
    # the same rules as the fetch: stdin, else a mode-600 file, else $HF_TOKEN
    token = read_token(token_file, from_stdin=token_stdin) is not None
    options = checks.Options(
        nvidia_smi=nvidia_smi,
        podman=podman,
        weights_source=weights_source,
        token_present=token,
        models_dir=base.host_layout(models_dir).models,
    )
    report = checks.run(p, options)

    def table() -> Table:
        t = Table("check", "", "found", "needs", "fix", title=f"preflight: {p.name}")
        for c in report.checks:
            t.add_row(c.name, output.status(c.level), *(output.text(v) for v in (c.found, c.expected, c.fix)))
        return t

    output.emit(report.to_json(), as_json, table)
    raise typer.Exit(0 if report.ok else 1)


def register(app: typer.Typer) -> None:
    app.command("preflight")(preflight)
