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

Bad input found by trying (each now a named error, never a traceback, and nothing changed): an
archive manifest that was a list, not UTF-8 or had a number for a revision; a hash cache that
was a list; a serving directory that was a file (reported as "free space or remount"); a gate
report that was a list, truncated or a FIFO (prune deleted the revisions that run served, or
hung); a `--gid` of -1 (ownership never converged) or past 2**32 (a traceback after the first
change); a models "directory" that was a regular file (its mode was changed to 750).
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import stat
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from specdeploy.core import atomic, files, hashcache, layout
from specdeploy.core.errors import InputFileError, SpecdeployError, UnresolvedPinError, UsageError, WriteError
from specdeploy.core.keeper import Keeper
from specdeploy.profile import ModelRef, Profile
from specdeploy.profile.lock import Lock, files_key, recorded_files
from specdeploy.weights.fetch import models_of

# At the root of a weights archive: {"models": {"<org>/<name>": {"revision": ..., "files": {path: sha256}}}}
MANIFEST = "specdeploy-archive.json"
IGNORED_DIRS = {hashcache.STATE_DIR, ".cache"}  # specdeploy's and huggingface_hub's bookkeeping
CONTENT_REVISION_PREFIX = "sha256-"
DIR_MODE, FILE_MODE = 0o750, 0o640  # the engine's group reads, others nothing (restrict_to_engine)
MAX_GID = 2**32 - 2  # 2**32 - 1 is (gid_t)-1: "leave the group as it is"


class WeightsError(SpecdeployError):
    """Weights that are missing, do not match their manifest or lock, or cannot be linked."""


def _read_json(path: Path, *, what: str, hint: str) -> Any:
    """core.files' bounded read, every refusal with this file's own fix."""
    try:
        return files.read_json(path, what=what, hint=hint)
    except InputFileError as exc:
        raise InputFileError(exc.message, hint=hint) from None


_REVISION = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}")  # a commit or a content revision: one path component


def read_manifest(models: Path) -> dict[str, Any]:
    """The last unpacked archive's manifest ({} when weights came from the hub): {repo: {"revision":
    str, "files": {path: sha256}}}. Anything else there — not a regular file, not UTF-8 or JSON,
    another shape — is an InputFileError (exit 2) naming the field, before anything is served."""
    path = Path(models) / MANIFEST
    if not os.path.lexists(path) or not Path(models).is_dir():
        return {}
    hint = "copy the weights archive again (its manifest is written with it), or remove the stray file"
    origin = str(path)
    data = _read_json(path, what="archive manifest", hint=hint)
    if not isinstance(data, dict):
        raise InputFileError(
            f"archive manifest {origin}: expected a JSON object at the top level, found {type(data).__name__}; "
            "nothing was served",
            hint=hint,
        )
    models_field = data.get("models", {})
    if not isinstance(models_field, dict):
        raise InputFileError(
            f"archive manifest {path}: field models: expected an object of repository -> revision and files, "
            f"found {type(models_field).__name__}; nothing was served",
            hint=hint,
        )
    for repo, entry in models_field.items():
        where = f"archive manifest {path}: field models.{repo}"
        if not isinstance(entry, dict):
            raise InputFileError(f"{where}: expected an object, found {type(entry).__name__}", hint=hint)
        rev = entry.get("revision")
        if not isinstance(rev, str) or not _REVISION.fullmatch(rev):
            raise InputFileError(
                f"{where}.revision: expected a revision name (a commit or sha256-...), found {str(rev)[:80]!r}",
                hint=hint,
            )
        listed = entry.get("files", {})
        if not isinstance(listed, dict) or not all(
            isinstance(k, str) and isinstance(v, str) for k, v in listed.items()
        ):
            raise InputFileError(
                f"{where}.files: expected an object of file path -> sha256 (strings), found "
                f"{type(listed).__name__ if not isinstance(listed, dict) else 'other values'}",
                hint=hint,
            )
    return models_field


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
        if not isinstance(recorded, str) or not _REVISION.fullmatch(recorded):
            where = lock.path if lock is not None else "the lock"
            raise InputFileError(
                f"lock {where}: {role}.revision of profile {profile.name}: expected a commit SHA, "
                f"found {str(recorded)[:80]!r}; nothing was served",
                hint="restore the lock from version control, or remove the entry and run the weights stage again",
            )
        return recorded
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
    state = hashcache.load(directory)
    result: dict[str, str] = {}
    for relative in files_of(directory):
        st = (directory / relative).stat()
        cached = state.get(relative)
        if cached and cached["size"] == st.st_size and cached["mtime_ns"] == st.st_mtime_ns:
            result[relative] = cached["sha256"]
            continue
        result[relative] = files.sha256_file(directory / relative)
        state[relative] = {"size": st.st_size, "mtime_ns": st.st_mtime_ns, "sha256": result[relative]}
        state[relative]["revision"] = directory.name
    if not check:
        hashcache.save(directory, state)
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


def _revision_place(
    profile: Profile, role: str, ref: ModelRef, host: layout.HostLayout, lock: Lock | None
) -> tuple[str, Path]:
    """The revision to serve and its directory, refused when something other than a directory is there."""
    rev = revision(profile, role, ref, host, lock)
    directory = revision_dir(host, ref.repo, rev)
    if os.path.lexists(directory) and not directory.is_dir():
        raise WeightsError(
            f"{ref.repo}@{rev}: {directory} is a file, not a revision directory; nothing was served",
            hint=f"move {directory} away, then run the weights stage (fetch, or unpack the archive) again",
        )
    if lock is not None:
        recorded_files(lock, profile.name, role, rev, consequence="nothing was served")
    return rev, directory


def verify(
    profile: Profile, role: str, ref: ModelRef, host: layout.HostLayout, lock: Lock, *, check: bool = False
) -> Verified:
    """Hash a revision directory and compare it with the archive's manifest (when it came in
    one) and with the lock's record for this revision (recorded here at its first use, unless
    `check`: then a revision not fetched yet is reported, not refused)."""
    rev, directory = _revision_place(profile, role, ref, host, lock)
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
    recorded = recorded_files(lock, profile.name, role, rev, consequence="nothing was served")
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
        and lock.record(profile.name, files_key(role, rev), found, by="weights serve", detail={"revision": rev})
    )
    return Verified(role, ref.repo, rev, str(directory), len(found), bool(new))


def relative_link(link: Path, target: Path) -> str:
    """`target` as seen from `link`'s directory: valid wherever both keep their relative places."""
    return os.path.relpath(target, link.parent)


def check_link_place(link: Path) -> None:
    """Refuse, before anything changes, a serving link whose directory is a file (a `--serving-dir`
    naming a file was reported as "free space or remount") or whose place holds a real file or
    directory (specdeploy serves through links only and never replaces data)."""
    parent = link.parent
    while not os.path.lexists(parent) and parent != parent.parent:
        parent = parent.parent
    if not parent.is_dir():
        raise UsageError(
            f"serving directory {link.parent}: {parent} is a file, not a directory; nothing was served",
            hint="move that file away, or pass --serving-dir (specdeploy_serving_dir) a directory",
        )
    if os.path.lexists(link) and not link.is_symlink():
        raise WriteError(
            f"{link} is a {'directory' if link.is_dir() else 'file'}, not a link to a verified revision",
            hint="specdeploy serves weights through links only; move it away and re-run",
        )


def point(link: Path, target: Path, keeper: Keeper | None, *, check: bool = False) -> bool:
    """Point `link` at `target` by a relative link, keeping the old link for a rollback; True
    when it changed. One rename(2): the engine never sees a half-switched revision."""
    wanted = relative_link(link, target)
    check_link_place(link)
    if link.is_symlink() and os.readlink(link) == wanted:
        return False
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
    links = {"target": host.target_serving, "drafter": host.drafter_source}
    for role, ref in models_of(profile):  # checked before anything is hashed or recorded: a refusal changes nothing
        check_link_place(links[role])
        _revision_place(profile, role, ref, host, lock)
    verified = [verify(profile, role, ref, host, lock, check=check) for role, ref in models_of(profile)]
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
    passing = [(finished, served) for finished, served in map(_passing_run, _gate_reports(host)) if served]
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
    failed: list[str] = []
    candidates = [p.parent for p in host.models.glob(f"*/*/*/{hashcache.STATE_DIR}")] if host.models.is_dir() else []
    builds = host.serving / layout.DRAFTER_BUILDS
    if builds.is_dir():
        candidates += [p for p in builds.iterdir() if p.is_dir() and not p.name.startswith(".")]
    for directory in candidates:
        if directory.resolve() in kept or directory.is_symlink():
            continue
        if not check:
            problem = _remove_tree(directory)
            if problem:
                failed.append(f"{directory} ({problem})")
                continue
        removed.append(str(directory))
    if failed:
        raise WeightsError(
            f"could not remove {len(failed)} old revision(s): "
            + "; ".join(failed[:5])
            + (f"; removed {len(removed)}" if removed else ""),
            hint="check ownership and that the filesystem is writable (the deploy runs as root), then run the "
            "prune again",
        )
    return sorted(removed)


def _remove_tree(directory: Path) -> str | None:
    """Delete `directory`; the first thing that could not be deleted, or None."""
    errors: list[str] = []
    shutil.rmtree(directory, onerror=lambda _f, path, exc: errors.append(f"{path}: {exc[1]}"))
    return errors[0] if errors else None


def _gate_reports(host: layout.HostLayout) -> list[Path]:
    """Every run's gate report (a run without one never passed: it is not a report to read)."""
    if not host.runs.is_dir():
        return []
    reports = (host.gate_report(run.name) for run in host.runs.iterdir())
    return sorted(report for report in reports if os.path.lexists(report))


def _passing_run(report: Path) -> tuple[str, list[str]]:
    """(finished_at, served) of a passing run's report, ("", []) for any other verdict. A report
    that cannot be read or has another shape stops the prune: what that run served is unknown,
    and deleting it could delete the revision a rollback needs."""
    hint = (
        f"repair or remove {report.parent} (a run record the gate wrote; `specdeploy rollback` and the prune read "
        "it), then run the prune again"
    )
    data = _read_json(report, what="gate report", hint=hint)
    if not isinstance(data, dict):
        raise InputFileError(
            f"gate report {report}: expected a JSON object at the top level, found {type(data).__name__}; "
            "nothing was pruned",
            hint=hint,
        )
    if data.get("verdict") != "pass":
        return "", []
    served, finished = data.get("served"), data.get("finished_at") or ""
    if not isinstance(served, list) or not all(isinstance(p, str) and p for p in served):
        raise InputFileError(
            f"gate report {report}: field served: expected a list of served paths, found {str(served)[:80]!r}; "
            "nothing was pruned (what that passing run served is unknown)",
            hint=hint,
        )
    if not isinstance(finished, str):
        raise InputFileError(
            f"gate report {report}: field finished_at: expected a time (text), found {str(finished)[:80]!r}; "
            "nothing was pruned",
            hint=hint,
        )
    return finished, served


# --------------------------------------------------------------------------- access


def restrict_to_engine(
    roots: list[Path], gid: int, *, check: bool = False, owners: dict[Path, int] | None = None
) -> list[str]:
    """Make the models and serving trees readable by the engine's group and nobody else
    (gated weights): owned by root (or by `owners[root]`: the fetch account owns the models tree it
    writes into), group `gid`, directories 750, files 640, links left pointing
    where they point. Returns the paths changed (or that would be, with `check`). Ansible's
    file module cannot do this idempotently: under --check it reports every symlink as
    changed (a link has no mode of its own)."""
    changed: list[str] = []
    if isinstance(gid, bool) or not isinstance(gid, int) or not 0 <= gid <= MAX_GID:
        raise UsageError(
            f"--gid {gid}: expected the engine's group id, 0 to {MAX_GID}; nothing was changed",
            hint="pass the engine's gid (`specdeploy facts`: unit.uid, 10001 by default); -1 would leave the group "
            "as it is and never converge",
        )
    for root in roots:  # every root checked before the first change: a refusal changes nothing
        root = Path(root)
        if Path(os.path.abspath(root)) == Path("/"):
            raise UsageError(
                f"{root}: the filesystem root is not a models or serving directory; nothing was changed",
                hint="pass --models-dir and --serving-dir the directories specdeploy keeps weights in",
            )
        if os.path.lexists(root) and not root.is_dir():
            info = root.lstat()
            found = "a regular file" if stat.S_ISREG(info.st_mode) else "not a directory"
            raise UsageError(
                f"{root}: expected a models or serving directory, found {found}; nothing was changed",
                hint="pass --models-dir and --serving-dir the directories specdeploy keeps weights in",
            )

    def fix(path: Path, mode: int | None, uid: int) -> None:
        st = path.lstat()
        wrong_mode = mode is not None and (st.st_mode & 0o7777) != mode
        if (st.st_uid, st.st_gid) == (uid, gid) and not wrong_mode:
            return
        changed.append(str(path))
        if check:
            return
        try:
            os.lchown(path, uid, gid)
            if mode is not None:
                os.chmod(path, mode)
        except OSError as exc:
            raise WeightsError(
                f"cannot give {path} to {uid}:{gid} mode {oct(mode or 0)}: {exc.strerror or exc}; "
                f"{len(changed) - 1} path(s) changed before it",
                hint="run as root (the deploy does), on a filesystem that keeps ownership, then run this again",
            ) from None

    for root in roots:
        if not Path(root).exists():
            continue
        uid = (owners or {}).get(Path(root), 0)
        fix(Path(root), DIR_MODE, uid)
        for directory, dirs, names in os.walk(root):
            for name in dirs:
                path = Path(directory) / name
                fix(path, None if path.is_symlink() else DIR_MODE, uid)
            for name in names:
                path = Path(directory) / name
                fix(path, None if path.is_symlink() else FILE_MODE, uid)
    return changed
