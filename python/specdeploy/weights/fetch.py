"""Fetch the target and drafter at their pinned commits, and prove every byte.

huggingface_hub does the downloading (resumable `.incomplete` files, a site mirror through
`endpoint`/`HF_ENDPOINT`); this module decides *whether the result is right*: every file is
checked against the hub's own hash for the pinned commit (LFS sha256, or the git blob id
for small files), the per-file sha256 is recorded in the lock on the first fetch and must
match on every later fetch, mirror and migration, and a corrupted file is deleted — never
kept — with a message naming it. Re-runs skip files whose size and mtime are unchanged
since they were verified. The token is passed in memory only, never in argv or logs.
"""

from __future__ import annotations

import hashlib
import json
import os
import stat
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from specdeploy.core import atomic
from specdeploy.core.errors import SpecdeployError, UnresolvedPinError
from specdeploy.profile import ModelRef, Profile
from specdeploy.profile.lock import Lock, require

STATE_DIR = ".specdeploy"
STATE_FILE = "verified.json"


def models_of(profile: Profile) -> list[tuple[str, ModelRef]]:
    """(role, model) for the profile's target and, when it has one, its drafter."""
    refs: list[tuple[str, ModelRef]] = [("target", profile.target)]
    if profile.drafter is not None:
        refs.append(("drafter", profile.drafter))
    return refs


def lock_key(role: str, revision: str) -> str:
    """The lock entry holding a revision's per-file sha256 (recorded at its first verified use)."""
    return f"{role}.files@{revision}"


class FetchError(SpecdeployError):
    """A download the hub refused, or a file that does not match the pinned commit."""


@dataclass
class RepoResult:
    role: str
    repo: str
    revision: str
    directory: str
    files: int = 0
    verified: int = 0
    skipped_unchanged: int = 0
    recorded_in_lock: bool = False
    removed_corrupt: list[str] = field(default_factory=list)


# --------------------------------------------------------------------------- tokens


def read_token(token_file: Path | None, *, from_stdin: bool = False) -> str | None:
    """The HF token from standard input (how Ansible hands it over: never on a command line,
    in a task's environment or in a file), a file (refused when others can read it), or $HF_TOKEN."""
    if from_stdin:
        return sys.stdin.readline().strip() or None
    if token_file is not None:
        mode = token_file.stat().st_mode
        if mode & (stat.S_IRGRP | stat.S_IROTH | stat.S_IWGRP | stat.S_IWOTH):
            raise FetchError(
                f"token file {token_file} is readable by others (mode {oct(mode & 0o777)})",
                hint=f"chmod 600 {token_file}; a token in a world-readable file is a leaked token",
            )
        return token_file.read_text().strip() or None
    return os.environ.get("HF_TOKEN") or None


# --------------------------------------------------------------------------- hashing


def sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def git_blob_id(path: Path) -> str:
    data = path.read_bytes()
    return hashlib.sha1(b"blob %d\0" % len(data) + data, usedforsecurity=False).hexdigest()


def _load_state(directory: Path) -> dict[str, Any]:
    path = directory / STATE_DIR / STATE_FILE
    try:
        return json.loads(path.read_text())
    except (OSError, json.JSONDecodeError):
        return {}


def _save_state(directory: Path, state: dict[str, Any]) -> None:
    """Write the hash cache when it changed (an unchanged re-run leaves the directory as it was)."""
    if _load_state(directory) == state and (directory / STATE_DIR / STATE_FILE).is_file():
        return
    atomic.ensure_dir(directory / STATE_DIR)
    atomic.write_bytes(directory / STATE_DIR / STATE_FILE, json.dumps(state, indent=1, sort_keys=True).encode())


def _remove_corrupt(directory: Path, relative: str) -> None:
    """Delete a file and huggingface_hub's record of it, so the next fetch downloads it again."""
    for path in (directory / relative, directory / ".cache" / "huggingface" / "download" / f"{relative}.metadata"):
        path.unlink(missing_ok=True)


# --------------------------------------------------------------------------- fetch


def _hub_errors() -> tuple[type[Exception], ...]:
    from huggingface_hub import errors

    return (errors.HfHubHTTPError,)


def _explain(exc: Exception, repo: str, revision: str) -> FetchError:
    from huggingface_hub import errors

    if isinstance(exc, errors.GatedRepoError):
        return FetchError(
            f"{repo} is gated and this token may not download it",
            hint=f"accept the conditions at https://huggingface.co/{repo} with the account whose token you use, "
            "then provide the token through ansible-vault or $HF_TOKEN (never argv)",
        )
    if isinstance(exc, errors.RepositoryNotFoundError):
        return FetchError(f"{repo} not found at this endpoint (or not visible to this token)")
    # RevisionNotFound from the hub; olah answers an unknown commit with 404/500 on the tree.
    status = getattr(getattr(exc, "response", None), "status_code", "?")
    return FetchError(
        f"{repo} has no revision {revision} at this endpoint (HTTP {status})",
        hint="the pin is wrong or the mirror lags: check the commit with huggingface_hub.list_repo_commits",
    )


def fetch_repo(
    role: str,
    ref: ModelRef,
    profile: Profile,
    dest: Path,
    *,
    lock: Lock,
    token: str | None,
    endpoint: str | None,
) -> RepoResult:
    from huggingface_hub import HfApi, snapshot_download

    revision = require(profile, f"{role}.revision", lock)
    directory = dest / ref.repo / revision  # one directory per revision: a rollback serves the old one
    result = RepoResult(role, ref.repo, revision, str(directory))
    api = HfApi(endpoint=endpoint, token=token)
    try:
        tree = [e for e in api.list_repo_tree(ref.repo, revision=revision, recursive=True) if hasattr(e, "blob_id")]
        snapshot_download(ref.repo, revision=revision, local_dir=directory, token=token, endpoint=endpoint)
    except _hub_errors() as exc:
        raise _explain(exc, ref.repo, revision) from None

    state = _load_state(directory)
    key = lock_key(role, revision)
    recorded: dict[str, str] | None = lock.value(profile.name, key)
    hashes: dict[str, str] = {}
    problems: list[str] = []
    for entry in tree:
        path = directory / entry.path
        result.files += 1
        st = path.stat()
        cached = state.get(entry.path)
        if (
            cached
            and cached["size"] == st.st_size
            and cached["mtime_ns"] == st.st_mtime_ns
            and cached["revision"] == revision
        ):
            hashes[entry.path] = cached["sha256"]
            result.skipped_unchanged += 1
            continue
        local_sha256 = sha256_file(path)
        if entry.lfs is not None:
            expected, found = entry.lfs.sha256, local_sha256
        else:
            expected, found = entry.blob_id, git_blob_id(path)
        if expected != found or st.st_size != entry.size:
            problems.append(
                f"{entry.path}: expected {expected} ({entry.size} bytes), found {found} ({st.st_size} bytes)"
            )
            _remove_corrupt(directory, entry.path)
            result.removed_corrupt.append(entry.path)
            continue
        hashes[entry.path] = local_sha256
        state[entry.path] = {
            "size": st.st_size,
            "mtime_ns": st.st_mtime_ns,
            "sha256": local_sha256,
            "revision": revision,
        }
        result.verified += 1
    _save_state(directory, state)
    if problems:
        raise FetchError(
            f"{ref.repo}@{revision}: {len(problems)} file(s) do not match the hub's hashes and were removed:\n  "
            + "\n  ".join(problems),
            hint="run the fetch again to download them anew; if it repeats, the mirror or disk is corrupting data",
        )
    if recorded is None:
        result.recorded_in_lock = lock.record(profile.name, key, hashes, by="fetch", detail={"revision": revision})
    else:
        drift = sorted(p for p in set(recorded) | set(hashes) if recorded.get(p) != hashes.get(p))
        if drift:
            raise FetchError(
                f"{ref.repo}@{revision}: files differ from those recorded in the lock {lock.path} at first fetch: "
                + ", ".join(drift[:10]),
                hint="a mirror or the hub serves other bytes for the same commit; do not deploy until explained",
            )
    return result


def fetch(
    profile: Profile,
    dest: Path,
    *,
    lock: Lock,
    token: str | None = None,
    endpoint: str | None = None,
    only: str | None = None,
) -> list[RepoResult]:
    """Fetch the profile's target and drafter (those that live on a hub) and verify them."""
    refs = models_of(profile)
    if only:
        refs = [(role, ref) for role, ref in refs if role == only]
    missing = [
        f"{role}.revision"
        for role, ref in refs
        if not ref.revision.resolved and lock.value(profile.name, f"{role}.revision") is None
    ]
    if missing:
        raise UnresolvedPinError(
            f"profile {profile.name}: refusing to fetch at an unresolved revision: {', '.join(missing)}",
            hint="pin the full commit SHA in the profile (huggingface_hub.list_repo_commits); a branch would drift",
        )
    return [fetch_repo(role, ref, profile, dest, lock=lock, token=token, endpoint=endpoint) for role, ref in refs]
