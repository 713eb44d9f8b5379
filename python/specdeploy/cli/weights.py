"""`specdeploy fetch`: the target and drafter at their pinned commits, every file verified;
`specdeploy weights serve|prune`: verified revisions linked into the serving directory, old ones pruned."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Annotated

import typer
from rich.table import Table

from specdeploy.cli import base, output
from specdeploy.core.errors import UsageError
from specdeploy.core.keeper import Keeper
from specdeploy.profile import load_profile
from specdeploy.weights import fetch as weights

weights_app = base.group("Verified revisions: link them for serving, prune old ones.")


TokenFileOpt = Annotated[
    Path | None, typer.Option(help="file holding the HF token (one line, mode 600); else $HF_TOKEN")
]
TokenStdinOpt = Annotated[
    bool, typer.Option("--token-stdin", help="read the HF token from standard input (how Ansible passes it)")
]


def fetch(
    dest: Annotated[Path, typer.Argument(help="download root; each repo lands in DEST/<org>/<name>/<revision>")],
    profile: base.ProfileOpt,
    lock: base.LockOpt = None,
    endpoint: Annotated[str | None, typer.Option(help="hub or site mirror (default: $HF_ENDPOINT or the hub)")] = None,
    token_file: TokenFileOpt = None,
    token_stdin: TokenStdinOpt = False,
    only: Annotated[str | None, typer.Option(help="fetch only 'target' or 'drafter'")] = None,
    timeout: Annotated[
        float,
        typer.Option(
            envvar="SPECDEPLOY_FETCH_TIMEOUT",
            help="seconds each request to the endpoint may take (connect, and each read)",
        ),
    ] = weights.DEFAULT_TIMEOUT_S,
    retries: Annotated[
        int,
        typer.Option(
            envvar="SPECDEPLOY_FETCH_RETRIES",
            help="further tries of the endpoint's first answer after a refused connection, a timeout or a 5xx, "
            "before the fetch gives up (an interrupted download resumes on the next fetch)",
        ),
    ] = weights.DEFAULT_RETRIES,
    ca_file: Annotated[
        Path | None,
        typer.Option(
            "--ca-file",
            help="PEM file of the CA that signed the mirror's TLS certificate (the site CA); default: the "
            "system's trust store",
        ),
    ] = None,
    as_user: Annotated[
        str | None,
        typer.Option(
            "--as-user",
            help="run the download and its verification as this unprivileged account (root only; it must own "
            "DEST); the lock is kept by the calling process",
        ),
    ] = None,
    as_json: base.JsonOpt = False,
) -> None:
    """Download the target and drafter at their pinned commits and verify every file.

    Every file is checked against the hub's hash for the pinned commit, recorded in the
    lock on first fetch and required to match afterwards; corrupt files are removed. The
    endpoint is https:// only (its certificate checked against --ca-file or the system's trust
    store), and every file name it lists must stay inside the revision directory. An
    endpoint that is unreachable, hangs or fails is reported after --timeout seconds and
    --retries further tries.
    """
    p = load_profile(profile)
    if endpoint is not None:
        base_url = weights.endpoint_url(endpoint, origin="--endpoint")
    else:
        base_url = weights.endpoint_url(os.environ.get("HF_ENDPOINT"), origin="$HF_ENDPOINT")
    with base.writing(f"weights fetch of {p.name}"):
        results = weights.fetch(
            p,
            dest,
            lock=base.lock_at(lock),
            token=weights.read_token(token_file, from_stdin=token_stdin),
            endpoint=base_url,
            only=only,
            timeout=timeout,
            retries=retries,
            ca_file=ca_file,
            as_user=as_user,
        )

    def table() -> Table:
        t = Table("repo", "revision", "files", "hashed now", "unchanged", "lock", title=f"fetch {p.name} -> {dest}")
        for r in results:
            lock_state = "recorded" if r.recorded_in_lock else "matches"
            t.add_row(*output.cells(r.repo, r.revision[:12], r.files, r.verified, r.skipped_unchanged, lock_state))
        return t

    output.emit([r.__dict__ for r in results], as_json, table)


@weights_app.command("serve")
def weights_serve(
    profile: base.ProfileOpt,
    lock: base.LockOpt = None,
    models_dir: base.ModelsDirOpt = None,
    serving_dir: base.ServingDirOpt = None,
    rollback_dir: base.RollbackDirOpt = None,
    run_id: base.RunIdOpt = "",
    check: base.CheckOpt = False,
) -> None:
    """Verify the profile's revisions (<models>/<repo>/<revision>/) against the archive's
    manifest and the lock (recorded at first use), then point <serving>/target and
    <serving>/drafter-source at them, keeping the old links for a rollback. Prints JSON."""
    from specdeploy.weights import store

    host = base.host_layout(models_dir, serving_dir)
    keeper = Keeper(rollback_dir, run_id) if rollback_dir is not None and not check else None
    with base.writing(f"weights serve for run {run_id or '-'}", check=check):
        served = store.serve(load_profile(profile), host, base.lock_at(lock), keeper=keeper, check=check)
    output.emit(served.to_json(), True, lambda: None)


@weights_app.command("access")
def weights_access(
    gid: Annotated[int, typer.Option("--gid", help="the engine's group id (`specdeploy facts`: unit.uid)")],
    models_dir: base.ModelsDirOpt = None,
    serving_dir: base.ServingDirOpt = None,
    models_owner: Annotated[
        int,
        typer.Option(
            "--models-owner", help="uid owning the models tree: the fetch account's (`specdeploy facts`: fetch.uid)"
        ),
    ] = 0,
    check: base.CheckOpt = False,
) -> None:
    """Make the models and serving directories readable by the engine's group only (750/640; gated
    weights are not for every user of the host): the serving tree root's, the models tree the fetch
    account's (--models-owner), which writes into it. Prints JSON {"changed": N}."""
    from specdeploy.weights import store

    if not 0 <= models_owner <= store.MAX_GID:
        raise UsageError(
            f"--models-owner {models_owner}: expected a uid, 0 to {store.MAX_GID}; nothing was changed",
            hint="pass the fetch account's uid (`specdeploy facts`: fetch.uid)",
        )
    host = base.host_layout(models_dir, serving_dir)
    with base.writing("weights access", check=check):
        changed = store.restrict_to_engine(
            [host.models, host.serving], gid, check=check, owners={host.models: models_owner}
        )
    output.emit({"changed": len(changed), "paths": changed[:20]}, True, lambda: None)


@weights_app.command("prune")
def weights_prune(
    profile: base.ProfileOpt,
    models_dir: base.ModelsDirOpt = None,
    serving_dir: base.ServingDirOpt = None,
    state_dir: base.StateDirOpt = None,
    check: base.CheckOpt = False,
    as_json: base.JsonOpt = False,
) -> None:
    """Delete verified revisions that neither the serving links nor the profile's last
    `weights.keep_revisions` passing deploys use (the gate does this after a pass)."""
    from specdeploy.weights import store

    p = load_profile(profile)
    with base.writing("weights prune", state_dir=state_dir, check=check):
        removed = store.prune(
            base.host_layout(models_dir, serving_dir, state_dir), p.weights.keep_revisions, check=check
        )
    output.emit(
        {"removed": removed, "check": check},
        as_json,
        lambda: output.out.print(output.line("would remove: " if check else "removed: ", removed or "nothing")),
    )


def register(app: typer.Typer) -> None:
    app.command("fetch")(fetch)
    app.add_typer(weights_app, name="weights")
