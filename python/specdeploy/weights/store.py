"""Weights per revision, verified against the lock, served through links, pruned after a pass.

Three failures this prevents. Archive weights (air-gapped sites, the rehearsal) were copied in
and never hash-checked. The target was served straight from its download directory, and weights
were not kept per revision: a rollback after a revision bump restarted the old unit on the new
weights. And disk is finite (the target alone is 51.75 GiB), so revisions cannot pile up.

    <models>/<org>/<name>/<revision>/     one verified revision (hub commit, or the archive's)
    <serving>/target -> ../models/...     the revision the engine serves (relative link)
    <serving>/drafter-source -> ...       the drafter revision write-config builds from
    <serving>/drafter -> drafter-builds/<sha>-<ns>   its serving directory (drafter.serving)

Every link is relative, so it resolves on the host and inside a container that mounts the
models and serving directories side by side (and, for a site whose models live elsewhere, at
their host path as well: engine.units). A revision switch is one `rename(2)` of a link — a
directory cannot be replaced that way — and the keeper keeps the old link, so a rollback serves
the old revision. `prune` keeps the revisions of the last N passing runs (`weights.keep_revisions`
in the profile) and whatever is linked now, and runs only after a pass.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from specdeploy.core import atomic, layout
from specdeploy.core.errors import SpecdeployError, UnresolvedPinError, WriteError
from specdeploy.core.keeper import Keeper
from specdeploy.profile import ModelRef, Profile
from specdeploy.profile.lock import Lock
from specdeploy.weights.fetch import STATE_DIR, _load_state, _save_state, lock_key, models_of, sha256_file

# At the root of a weights archive: {"models": {"<org>/<name>": {"revision": ..., "files": {path: sha256}}}}
MANIFEST = "specdeploy-archive.json"
IGNORED_DIRS = {STATE_DIR, ".cache"}  # specdeploy's and huggingface_hub's bookkeeping
CONTENT_REVISION_PREFIX = "sha256-"
DIR_MODE, FILE_MODE = 0o750, 0o640  # the engine's group reads, others nothing (restrict_to_engine)


class WeightsError(SpecdeployError):
    """Weights that are missing, do not match their manifest or lock, or cannot be linked."""


def read_manifest(models: Path) -> dict[str, Any]:
    """The last unpacked archive's manifest ({} when weights came from the hub)."""
    path = Path(models) / MANIFEST
    if not path.is_file():
        return {}
    try:
        return json.loads(path.read_text()).get("models", {})
    except (OSError, json.JSONDecodeError) as exc:
        raise WeightsError(f"archive manifest {path} is unreadable: {exc}", hint="copy the archive again") from None


def content_revision(directory: Path) -> str:
    """A revision name for weights that have no hub commit (fixtures, a site's own model):
    derived from every file's name and sha256, so other bytes are another revision."""
    digest = hashlib.sha256(json.dumps(hashes(directory), sort_keys=True).encode()).hexdigest()
    return f"{CONTENT_REVISION_PREFIX}{digest[:12]}"


def write_manifest(root: Path) -> dict[str, Any]:
    """Describe a weights archive laid out as `<root>/<org>/<name>/<revision>/`: one revision
    per repository, every file's sha256; the host checks each file against it after unpacking."""
    root = Path(root)
    models: dict[str, Any] = {}
    for rev_dir in sorted(p for p in root.glob("*/*/*") if p.is_dir()):
        repo = f"{rev_dir.parent.parent.name}/{rev_dir.parent.name}"
        if repo in models:
            raise WeightsError(
                f"{root}/{repo} holds more than one revision ({models[repo]['revision']}, {rev_dir.name})",
                hint="an archive carries exactly one revision of each repository",
            )
        models[repo] = {"revision": rev_dir.name, "files": hashes(rev_dir)}
    atomic.write_json(root / MANIFEST, {"models": models}, sort_keys=True)
    return models


def revision(profile: Profile, role: str, ref: ModelRef, host: layout.HostLayout, lock: Lock | None) -> str:
    """The revision to serve: the profile's pin, else the lock's, else the unpacked archive's."""
    if ref.revision.resolved:
        return str(ref.revision.value)
    recorded = lock.value(profile.name, f"{role}.revision") if lock is not None else None
    if recorded:
        return str(recorded)
    entry = read_manifest(host.models).get(ref.repo)
    if entry and entry.get("revision"):
        return str(entry["revision"])
    raise UnresolvedPinError(
        f"profile {profile.name}: {role}.revision is unresolved in the profile, the lock and any weights archive",
        hint=f"pin the full commit in the profile, or ship an archive with a manifest ({ref.revision.source})",
    )


def revision_dir(host: layout.HostLayout, repo: str, rev: str) -> Path:
    return host.models / repo / rev


def files_of(directory: Path) -> list[str]:
    """Every regular file of a revision directory, relative, bookkeeping excluded."""
    found = []
    for path in sorted(Path(directory).rglob("*")):
        relative = path.relative_to(directory)
        if relative.parts[0] in IGNORED_DIRS or not path.is_file() or path.is_symlink():
            continue
        found.append(relative.as_posix())
    return found


def hashes(directory: Path, *, check: bool = False) -> dict[str, str]:
    """sha256 of every file, reusing the fetch's record when size and mtime are unchanged
    (the record is updated unless `check`: `ansible-playbook --check` writes nothing)."""
    directory = Path(directory)
    state = _load_state(directory)
    result: dict[str, str] = {}
    for relative in files_of(directory):
        st = (directory / relative).stat()
        cached = state.get(relative)
        if cached and cached["size"] == st.st_size and cached["mtime_ns"] == st.st_mtime_ns:
            result[relative] = cached["sha256"]
            continue
        result[relative] = sha256_file(directory / relative)
        state[relative] = {"size": st.st_size, "mtime_ns": st.st_mtime_ns, "sha256": result[relative]}
        state[relative]["revision"] = directory.name
    if not check:
        _save_state(directory, state)
    return result


@dataclass
class Verified:
    role: str
    repo: str
    revision: str
    directory: str
    files: int
    recorded_in_lock: bool
    problems: list[str] = field(default_factory=list)


def _compare(expected: dict[str, str], found: dict[str, str]) -> list[str]:
    return [
        f"{path}: expected {expected.get(path, 'no such file')}, found {found.get(path, 'missing')}"
        for path in sorted(set(expected) | set(found))
        if expected.get(path) != found.get(path)
    ]


def verify(
    profile: Profile, role: str, ref: ModelRef, host: layout.HostLayout, lock: Lock, *, check: bool = False
) -> Verified:
    """Hash a revision directory and compare it with the archive's manifest (when it came in
    one) and with the lock's record for this revision (recorded here at its first use, unless
    `check`: then a revision not fetched yet is reported, not refused)."""
    rev = revision(profile, role, ref, host, lock)
    directory = revision_dir(host, ref.repo, rev)
    if check and not directory.is_dir():
        return Verified(role, ref.repo, rev, str(directory), 0, False, ["not fetched yet"])
    if not directory.is_dir():
        raise WeightsError(
            f"{ref.repo}@{rev}: {directory} does not exist",
            hint="run the weights stage (fetch from the hub, or unpack the archive) before serving",
        )
    found = hashes(directory, check=check)
    entry = read_manifest(host.models).get(ref.repo)
    problems = _compare(entry["files"], found) if entry and entry.get("revision") == rev else []
    if problems:
        raise WeightsError(
            f"{ref.repo}@{rev}: {len(problems)} file(s) differ from the archive's manifest:\n  "
            + "\n  ".join(problems),
            hint="the archive was corrupted in transit or on disk: copy it again; nothing was served from it",
        )
    recorded = lock.value(profile.name, lock_key(role, rev))
    if recorded is not None:
        problems = _compare(recorded, found)
        if problems:
            raise WeightsError(
                f"{ref.repo}@{rev}: files differ from those recorded in the lock {lock.path}:\n  "
                + "\n  ".join(problems[:10]),
                hint="the same revision now has other bytes: do not serve it until explained",
            )
    new = (
        recorded is None
        and not check
        and lock.record(profile.name, lock_key(role, rev), found, by="weights serve", detail={"revision": rev})
    )
    return Verified(role, ref.repo, rev, str(directory), len(found), bool(new))


def relative_link(link: Path, target: Path) -> str:
    """`target` as seen from `link`'s directory: valid wherever both keep their relative places."""
    return os.path.relpath(target, link.parent)


def point(link: Path, target: Path, keeper: Keeper | None, *, check: bool = False) -> bool:
    """Point `link` at `target` by a relative link, keeping the old link for a rollback; True
    when it changed. One rename(2): the engine never sees a half-switched revision."""
    wanted = relative_link(link, target)
    if link.is_symlink() and os.readlink(link) == wanted:
        return False
    if link.exists() and not link.is_symlink():
        raise WriteError(
            f"{link} is a {'directory' if link.is_dir() else 'file'}, not a link to a verified revision",
            hint="specdeploy serves weights through links only; move it away and re-run",
        )
    if check:
        return True
    staged = keeper.stage(link) if keeper else None
    atomic.ensure_dir(link.parent)
    atomic.symlink(link, Path(wanted))
    if staged:
        staged.commit()
    return True


@dataclass
class Served:
    verified: list[Verified]
    changed: list[str]

    def to_json(self) -> dict[str, Any]:
        return {
            "changed": bool(self.changed),
            "links_changed": self.changed,
            "models": [v.__dict__ for v in self.verified],
        }


def serve(
    profile: Profile,
    host: layout.HostLayout,
    lock: Lock,
    *,
    keeper: Keeper | None = None,
    check: bool = False,
) -> Served:
    """Verify the profile's revisions, then point `<serving>/target` (and `drafter-source`) at them."""
    verified = [verify(profile, role, ref, host, lock, check=check) for role, ref in models_of(profile)]
    links = {"target": host.target_serving, "drafter": host.drafter_source}
    changed = [str(links[v.role]) for v in verified if point(links[v.role], Path(v.directory), keeper, check=check)]
    return Served(verified, changed)


# --------------------------------------------------------------------------- pruning


def linked(host: layout.HostLayout) -> set[Path]:
    """What the serving directory points at now (revision dirs and the drafter's serving dir)."""
    found = set()
    for link in (host.target_serving, host.drafter_source, host.drafter_serving):
        if link.is_symlink() and link.exists():
            found.add(link.resolve())
    return found


def served_now(host: layout.HostLayout) -> list[str]:
    """The same, as strings for a gate report (what a passing run served)."""
    return sorted(str(p) for p in linked(host))


def prune(host: layout.HostLayout, keep: int, *, check: bool = False) -> list[str]:
    """Delete revision directories and drafter builds beyond the `keep` most recent distinct
    ones of each model (and of the drafter builds) that passing gate runs served, never what
    the serving links name now. A no-op re-run serves the same revision again, so it does not
    push an older one out; what the last unpacked archive holds stays too. Only directories
    specdeploy verified (they hold its bookkeeping) are candidates; anything else stays."""
    kept = linked(host)
    passing = []
    if host.runs.is_dir():
        for run in host.runs.iterdir():
            report = run / "gate.json"
            try:
                data = json.loads(report.read_text())
            except (OSError, json.JSONDecodeError):
                continue
            if data.get("verdict") == "pass" and data.get("served"):
                passing.append((data.get("finished_at") or "", data["served"]))
    recent: dict[Path, list[Path]] = {}  # a model's directory (or the builds dir) -> its newest distinct entries
    for _, served in sorted(passing, key=lambda run: run[0], reverse=True):
        for path in map(Path, served):
            entries = recent.setdefault(path.parent, [])
            if path not in entries and len(entries) < keep:
                entries.append(path)
    for entries in recent.values():
        kept.update(entries)
    # what the last weights archive delivered stays: the archive is unpacked again only when it
    # changes, so a pruned revision of it would not come back (a hub revision is fetched again)
    kept.update(revision_dir(host, repo, e["revision"]).resolve() for repo, e in read_manifest(host.models).items())
    removed = []
    candidates = [p.parent for p in host.models.glob(f"*/*/*/{STATE_DIR}")]
    builds = host.serving / layout.DRAFTER_BUILDS
    if builds.is_dir():
        candidates += [p for p in builds.iterdir() if p.is_dir() and not p.name.startswith(".")]
    for directory in candidates:
        if directory.resolve() in kept:
            continue
        removed.append(str(directory))
        if not check:
            shutil.rmtree(directory, ignore_errors=True)
    return sorted(removed)


# --------------------------------------------------------------------------- access


def restrict_to_engine(roots: list[Path], gid: int, *, check: bool = False) -> list[str]:
    """Make the models and serving trees readable by the engine's group and nobody else
    (gated weights): root-owned, group `gid`, directories 750, files 640, links left pointing
    where they point. Returns the paths changed (or that would be, with `check`). Ansible's
    file module cannot do this idempotently: under --check it reports every symlink as
    changed (a link has no mode of its own)."""
    changed: list[str] = []

    def fix(path: Path, mode: int | None) -> None:
        st = path.lstat()
        wrong_mode = mode is not None and (st.st_mode & 0o7777) != mode
        if (st.st_uid, st.st_gid) == (0, gid) and not wrong_mode:
            return
        changed.append(str(path))
        if check:
            return
        os.lchown(path, 0, gid)
        if mode is not None:
            os.chmod(path, mode)

    for root in roots:
        if not Path(root).exists():
            continue
        fix(Path(root), DIR_MODE)
        for directory, dirs, files in os.walk(root):
            for name in dirs:
                path = Path(directory) / name
                fix(path, None if path.is_symlink() else DIR_MODE)
            for name in files:
                path = Path(directory) / name
                fix(path, None if path.is_symlink() else FILE_MODE)
    return changed
