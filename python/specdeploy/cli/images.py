"""`specdeploy image build|push|ensure|check|manifest`: engine images from the profile's pins, built
once and pulled by digest, proven by their labels, by what their own Python reports inside
(engine version, torch's CUDA) and, across builders, by a manifest of every file's content."""

from __future__ import annotations

import shlex
from pathlib import Path
from typing import Annotated

import typer
from rich.table import Table

from specdeploy.cli import base, output
from specdeploy.images import build, ensure, manifest, push
from specdeploy.images import lock as image_lock
from specdeploy.profile import load_profile

image_app = base.group("Build and check engine images from the profile's pins.")
RegistryOpt = Annotated[
    str | None,
    typer.Option(help="the site's registry, HOST[:PORT]; the image keeps its repository and tag there"),
]
DriverOpt = Annotated[str | None, typer.Option(help="host NVIDIA driver version, to refuse a CUDA it cannot run")]


@image_app.command("build")
def image_build(
    profile: base.ProfileOpt,
    context: Annotated[Path, typer.Option(help="build context: the specdeploy checkout")] = Path("."),
    lock: base.LockOpt = None,
    podman: base.PodmanOpt = "podman",
    driver: DriverOpt = None,
    dry_run: Annotated[bool, typer.Option("--dry-run", help="print the podman command, build nothing")] = False,
    no_cache: Annotated[bool, typer.Option("--no-cache", help="run every step again, as a fresh builder")] = False,
    unlocked: Annotated[
        bool,
        typer.Option(
            "--unlocked",
            help="build without the image lock (dependencies resolved at build time); the image is labelled "
            "io.specdeploy.lock.sha256=unlocked and `image check` refuses it",
        ),
    ] = False,
) -> None:
    """Build the profile's image with every build arg taken from the profile.

    Refuses a known-bad version or commit with the reason, and (exit 2) an image lock that is
    unresolved, missing or not the file the profile pins; resolves the base image digest and
    the PR merge-base on first use and records them in the lock.
    """
    result = build.build(
        load_profile(profile),
        lock=base.lock_at(lock),
        context=context,
        podman=podman,
        dry_run=dry_run,
        driver_version=driver,
        no_cache=no_cache,
        unlocked=unlocked,
    )
    if dry_run:
        output.out.print(shlex.join(result.argv), highlight=False)
    else:
        output.out.print(f"[green]built {result.tag}[/] (id {result.image_id})")


@image_app.command("ensure")
def image_ensure(
    profile: base.ProfileOpt,
    source: Annotated[str, typer.Option(help="build (from the Containerfiles), pull (by digest) or archive")],
    context: Annotated[Path | None, typer.Option(help="build context holding the Containerfiles")] = None,
    archive: Annotated[Path | None, typer.Option(help="an image archive (podman save) for air-gapped hosts")] = None,
    base_archive: Annotated[
        Path | None, typer.Option(help="build: the base image as an archive, loaded when the host lacks it")
    ] = None,
    lock: base.LockOpt = None,
    podman: base.PodmanOpt = "podman",
    driver: DriverOpt = None,
    check: base.CheckOpt = False,
    cert_dir: Annotated[
        Path | None, typer.Option(help="pull: a directory holding the registry's CA as ca.crt (default: podman's)")
    ] = None,
    registry: RegistryOpt = None,
) -> None:
    """Make the profile's image present (build, pull by digest or load an archive), check its
    labels against the profile, and print JSON {changed, reference, ...} for Ansible.

    Exit 0 when the image is present and its labels match, 1 when they do not.
    """
    p = load_profile(profile)
    with base.writing(f"image ensure of {p.name}", check=check):
        ensured = ensure.ensure(
            p,
            source=source,
            lock=base.lock_at(lock),
            context=context,
            archive=archive,
            base_archive=base_archive,
            podman=podman,
            driver_version=driver,
            only_report=check,
            cert_dir=cert_dir,
            registry=registry,
        )
    bad = [r.__dict__ for r in ensured.labels if not r.ok]
    summary = {
        "changed": ensured.changed,
        "action": ensured.action,
        "tag": ensured.tag,
        "reference": ensured.reference,
        "image_id": ensured.image_id,
        "label_mismatches": bad,
    }
    output.emit(summary, True, lambda: None)
    if bad:
        what = "; ".join(f"{r['label']}: expected {r['expected']}, found {r['found']}" for r in bad)
        raise build.ImageError(
            f"{ensured.tag} is not what profile {p.name} pins ({what}); it will not be run",
            hint="rebuild it with specdeploy image build, or fix the profile's pin",
        )


@image_app.command("check")
def image_check(
    image: Annotated[str, typer.Argument(help="image reference or ID")],
    profile: base.ProfileOpt,
    lock: base.LockOpt = None,
    podman: base.PodmanOpt = "podman",
    as_json: base.JsonOpt = False,
) -> None:
    """Compare a built image's OCI labels and what it contains (engine version, torch's CUDA)
    with the profile. Exit 0 when all match, 1 otherwise."""
    p = load_profile(profile)
    rows = ensure.check(image, p, lock=base.lock_at(lock), podman=podman)
    ok = all(r.ok for r in rows)
    fix = (
        ""
        if ok
        else f"pass the image built for profile {p.name}, or build it from the profile's pins (`specdeploy image "
        f"build --profile {p.name}`); if this image is the intended one, correct the profile's pin instead"
    )

    def table() -> None:
        t = Table("", "label", "expected", "found", title=f"image check {image}")
        for r in rows:
            t.add_row(*output.cells(output.MARKS[r.ok], r.label, r.expected, r.found))
        output.out.print(t)
        if fix:
            output.fix(fix)

    output.emit({"image": image, "ok": ok, "labels": [r.__dict__ for r in rows], "fix": fix}, as_json, table)
    raise typer.Exit(0 if ok else 1)


@image_app.command("push")
def image_push(
    profile: base.ProfileOpt,
    registry: RegistryOpt = None,
    lock: base.LockOpt = None,
    podman: base.PodmanOpt = "podman",
    cert_dir: Annotated[
        Path | None, typer.Option(help="a directory holding the registry's CA as ca.crt (podman push --cert-dir)")
    ] = None,
    tls_verify: Annotated[bool, typer.Option(help="verify the registry's TLS certificate")] = True,
    as_json: base.JsonOpt = False,
) -> None:
    """Push the built image to the site's registry and record the registry's digest (podman push
    --digestfile) in the lock as engine.image.digest: every host then pulls it by that digest."""
    pushed = push.push(
        load_profile(profile),
        lock=base.lock_at(lock),
        registry=registry,
        podman=podman,
        cert_dir=cert_dir,
        tls_verify=tls_verify,
    )

    def table() -> Table:
        t = Table("", "", title=f"image push {pushed.tag}")
        for key in ("destination", "digest", "reference", "image_id"):
            t.add_row(*output.cells(key, getattr(pushed, key)))
        t.add_row(*output.cells("lock", "recorded" if pushed.recorded else "already recorded"))
        return t

    output.emit(pushed.__dict__, as_json, table)


@image_app.command("manifest")
def image_manifest(
    image: Annotated[str, typer.Argument(help="a local image reference or ID")],
    write: Annotated[Path | None, typer.Option("--output", help="write the manifest (JSON) to this file")] = None,
    against: Annotated[
        Path | None, typer.Option(help="a manifest written elsewhere (--output) to compare this image with")
    ] = None,
    podman: base.PodmanOpt = "podman",
    as_json: base.JsonOpt = False,
) -> None:
    """Every file of IMAGE by content (path, type, mode, owner, sha256); with --against, compare it
    with another builder's manifest of the same lock. Exit 0 when equal, 1 when any file differs."""
    other = None
    if against is not None:
        other = manifest.load(against)
    found = manifest.of_image(image, podman)
    if write is not None:
        manifest.write(found, write)
    differences = [] if other is None else manifest.compare(other.files, found.files)

    def table() -> Table:
        title = f"image manifest {image}" + (f" against {against}" if against else "")
        t = Table("path", "there" if against else "", "here", title=title)
        for d in differences[:50]:
            t.add_row(*output.cells(d.path, d.left or "(missing)", d.right or "(missing)"))
        if not differences:
            t.add_row(*output.cells(f"{len(found.files)} entries", "equal" if against else "", found.image_id))
        elif len(differences) > 50:
            t.add_row(*output.cells(f"... {len(differences) - 50} more", "", ""))
        return t

    summary = {
        "image": image,
        "image_id": found.image_id,
        "entries": len(found.files),
        "against": str(against) if against else None,
        "against_image_id": other.image_id if other else None,
        "equal": not differences if against else None,
        "differences": [d.__dict__ for d in differences],
        "excluded": manifest.EXCLUDED,
    }
    output.emit(summary, as_json, table)
    raise typer.Exit(1 if differences else 0)


@image_app.command("lock")
def image_lock_command(
    profile: base.ProfileOpt,
    context: Annotated[Path, typer.Option(help="the checkout the lock is written into (locks/images/)")] = Path("."),
    inputs: Annotated[
        list[Path] | None,
        typer.Option("--input", help="a requirements file locked too, e.g. vLLM's requirements/cuda.txt at the pin"),
    ] = None,
    uv: Annotated[str | None, typer.Option(help="uv executable (default: uv on PATH or beside this Python)")] = None,
    as_json: base.JsonOpt = False,
) -> None:
    """Produce or refresh the profile's image lock with uv: exact versions and sha256 for the image's
    Python and platform, torch from the index serving the profile's CUDA.

    Exit 0 with the lock written (then pin its sha256 in the profile); 2 when an index cannot be
    reached (the lock stays unresolved) or the profile has no image lock.
    """
    p = load_profile(profile)
    produced = image_lock.produce(p, context=context, uv=uv, inputs=list(inputs or []))
    lock = image_lock.spec(p)
    changed = produced.previous != produced.sha256
    data = {
        "profile": p.name,
        "lock": str(produced.path),
        "sha256": produced.sha256,
        "previous": produced.previous,
        "changed": changed,
        "requirements": produced.requirements,
        "pinned": lock.resolved and image_lock.normalized(str(lock.value)) == produced.sha256,
    }

    def show() -> None:
        output.out.print(f"[green]wrote {produced.path}[/] ({produced.requirements} requirements, {produced.sha256})")
        if not data["pinned"]:
            output.fix(
                f"review the lock, commit it and pin it in the profile's engine.image.lock: value: {produced.sha256}, "
                "provenance: verified, source: `specdeploy image lock` and the indexes it names"
            )

    output.emit(data, as_json, show)


@image_app.command("freeze")
def image_freeze(
    image: Annotated[str, typer.Argument(help="image reference or ID (e.g. an upstream base by digest)")],
    out: Annotated[Path, typer.Option("--output", help="where the reference-only pip freeze is written")],
    podman: base.PodmanOpt = "podman",
) -> None:
    """Record `pip freeze` from inside an image, for reference only (upstream images such as the
    stock vLLM and SGLang bases are locked by their digest, not by this list): what changed
    between two upstream digests can be diffed. Nothing installs from it."""
    written = ensure.freeze(image, out, podman=podman)
    output.out.print(f"[green]wrote {written}[/] (reference only: the image is locked by its digest)")


def register(app: typer.Typer) -> None:
    app.add_typer(image_app, name="image")
