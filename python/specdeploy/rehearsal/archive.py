"""The rehearsal's weights archive: its fixture models laid out as `<org>/<name>/<revision>`.

That is the layout `specdeploy fetch` leaves under `models/` on a host, so the play's
`weights_source=archive` path unpacks it as is. Fixtures have no hub commit: each one's
revision is named by its content (weights.store.content_revision), and the archive carries a
manifest of every file's sha256 (weights.store.write_manifest) that the host checks after
unpacking and records in its lock. Each repository is copied into a sibling
temporary directory and renamed into place: an interrupted export never leaves a
half-copied model where a finished one was. `pack` makes one tar of it with fixed names,
times and owners, rewritten only when a byte changed: the play copies one file (one
checksum a side) instead of a round trip per model file, and a re-run copies nothing.
"""

from __future__ import annotations

import io
import os
import shutil
import tarfile
import tempfile
from pathlib import Path

from specdeploy.core import hashcache
from specdeploy.profile import load_profile
from specdeploy.rehearsal import fixtures, variants
from specdeploy.weights import store

# Bookkeeping of the fixture cache, not part of a model repository.
CACHE_FILES = (".complete", "fixture.json", "training.json")


def build_all() -> dict[str, Path]:
    """Build (or reuse) every fixture model the rehearsal profiles serve."""
    base = load_profile(variants.BASE)
    return {
        "tokenizer": fixtures.tokenizer_dir(),
        "target": fixtures.build_target(base),
        "draft_model": fixtures.build_draft_model(base),
        "dflash_drafter": fixtures.build_dflash_drafter(variants.dflash(base)),
    }


def repositories(built: dict[str, Path]) -> dict[str, Path]:
    """Hub repository name -> fixture directory, for the rehearsal and its DFlash variant."""
    base = load_profile(variants.BASE)
    dflash = variants.dflash(base).drafter
    if base.drafter is None or dflash is None:
        raise ValueError(f"profile {base.name!r} and its DFlash variant must both name a drafter")
    return {
        base.target.repo: built["target"],
        base.drafter.repo: built["draft_model"],
        dflash.repo: built["dflash_drafter"],
    }


def export(dest: Path) -> dict[str, Path]:
    """Copy the rehearsal's models to `dest/<org>/<name>/<revision>` and write the archive's
    manifest; returns repository -> its copy (other revisions of it are removed)."""
    exported: dict[str, Path] = {}
    for repo, source in repositories(build_all()).items():
        (dest / repo).mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=".export-", dir=dest / repo))
        try:
            shutil.copytree(source, tmp, ignore=shutil.ignore_patterns(*CACHE_FILES), dirs_exist_ok=True)
            final = dest / repo / store.content_revision(tmp)
            shutil.rmtree(tmp / hashcache.STATE_DIR, ignore_errors=True)  # the hash cache is not part of it
            _replace(tmp, final)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
        for other in (dest / repo).iterdir():
            if other != final and not other.name.startswith("."):
                shutil.rmtree(other, ignore_errors=True)
        exported[repo] = final
    store.write_manifest(dest)
    for rev_dir in exported.values():  # write_manifest's hash cache stays out of the archive
        shutil.rmtree(rev_dir / hashcache.STATE_DIR, ignore_errors=True)
    return exported


def _replace(new: Path, final: Path) -> None:
    """Swap `new` in for `final` with renames (the old copy is removed only afterwards)."""
    old = None
    if final.exists():
        old = final.with_name(f".{final.name}.old")
        shutil.rmtree(old, ignore_errors=True)
        os.rename(final, old)
    os.rename(new, final)
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)


def pack(directory: Path, tar: Path) -> Path:
    """`directory` as a reproducible tar at `tar` (sorted, mtime 0, root-owned); rewritten
    atomically, and only when its bytes would differ."""
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w", format=tarfile.PAX_FORMAT) as archive:
        for path in sorted(directory.rglob("*")):
            if path.name.startswith("."):
                continue
            info = archive.gettarinfo(str(path), arcname=str(path.relative_to(directory)))
            info.mtime, info.uid, info.gid, info.uname, info.gname = 0, 0, 0, "root", "root"
            info.mode = 0o755 if path.is_dir() else 0o644
            if path.is_file():
                with path.open("rb") as fh:
                    archive.addfile(info, fh)
            else:
                archive.addfile(info)
    data = buffer.getvalue()
    if not (tar.is_file() and tar.read_bytes() == data):
        tmp = tar.with_name(f".{tar.name}.partial")
        tmp.write_bytes(data)
        os.replace(tmp, tar)
    return tar
