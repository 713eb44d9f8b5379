"""`specdeploy fetch`: the target and drafter at their pinned commits, every file verified."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Annotated

import typer
from rich.table import Table

from specdeploy.cli import base, output
from specdeploy.profile import load_profile
from specdeploy.weights import fetch as weights


def fetch(
    dest: Annotated[Path, typer.Argument(help="download root; each repo lands in DEST/<org>/<name>")],
    profile: base.ProfileOpt,
    lock: base.LockOpt = None,
    endpoint: Annotated[str | None, typer.Option(help="hub or site mirror (default: $HF_ENDPOINT or the hub)")] = None,
    token_file: Annotated[
        Path | None, typer.Option(help="file holding the HF token (mode 600); else $HF_TOKEN", **base.InputFile)
    ] = None,
    token_stdin: Annotated[
        bool, typer.Option("--token-stdin", help="read the HF token from standard input (how Ansible passes it)")
    ] = False,
    only: Annotated[str | None, typer.Option(help="fetch only 'target' or 'drafter'")] = None,
    as_json: base.JsonOpt = False,
) -> None:
    """Download the target and drafter at their pinned commits and verify every file.

    Every file is checked against the hub's hash for the pinned commit, recorded in the
    lock on first fetch and required to match afterwards; corrupt files are removed.
    """
    p = load_profile(profile)
    results = weights.fetch(
        p,
        dest,
        lock=base.lock_at(lock),
        token=weights.read_token(token_file, from_stdin=token_stdin),
        endpoint=endpoint or os.environ.get("HF_ENDPOINT"),
        only=only,
    )

    def table() -> Table:
        t = Table("repo", "revision", "files", "hashed now", "unchanged", "lock", title=f"fetch {p.name} -> {dest}")
        for r in results:
            lock_state = "recorded" if r.recorded_in_lock else "matches"
            t.add_row(r.repo, r.revision[:12], str(r.files), str(r.verified), str(r.skipped_unchanged), lock_state)
        return t

    output.emit([r.__dict__ for r in results], as_json, table)


def register(app: typer.Typer) -> None:
    app.command("fetch")(fetch)
