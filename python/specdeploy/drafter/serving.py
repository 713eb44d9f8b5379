"""Build the drafter's serving directory from a verified download: `write-config`.

In the field a corrected config.json "did not take effect": it never landed where the engine
read. The engine reads a serving directory — never the download cache — that holds the
verified config.json and links to the verified weights; it is written atomically, read back
and verified again, and what it replaced is kept for a rollback.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import Path

from specdeploy.core import atomic
from specdeploy.core.errors import SpecdeployError, UnresolvedPinError, WriteError
from specdeploy.core.keeper import Keeper
from specdeploy.drafter.verify import CONFIG_NAME, LOCK_KEY, Report, VerificationFailed, read_config, verify
from specdeploy.profile import Profile
from specdeploy.profile.lock import Lock


@dataclass
class WriteResult:
    serving_dir: str
    config_changed: bool
    links_changed: list[str]
    links_removed: list[str]
    canonical_sha256: str
    lock_recorded: bool
    report: Report


def _refuse_unresolved(profile: Profile) -> None:
    assert profile.drafter is not None and profile.drafter.config is not None
    missing = [f"drafter.config.expected.{n}" for n, p in profile.drafter.config.expected.items() if not p.resolved]
    if missing:
        raise UnresolvedPinError(
            f"profile {profile.name}: refusing to write a config whose content is unresolved: " + ", ".join(missing),
            hint="pin each field's value (with its provenance) in the profile; specdeploy never guesses",
        )


def _sync_links(serving: Path, source: Path) -> tuple[list[str], list[str]]:
    """Point one symlink per source file (weights, tokenizer, ...) into the serving dir."""
    changed, removed = [], []
    wanted = {
        p.name: p.resolve()
        for p in source.iterdir()
        if p.is_file() and p.name != CONFIG_NAME and not p.name.startswith(".")
    }
    for name, target in sorted(wanted.items()):
        link = serving / name
        if link.is_symlink() and Path(link.readlink()) == target:
            continue
        if link.exists() and not link.is_symlink():
            raise WriteError(
                f"{link} is a regular file, not a link to the verified download",
                hint="the serving directory holds only config.json and links; move the file away",
            )
        atomic.symlink(link, target)
        changed.append(name)
    for entry in serving.iterdir():
        if entry.is_symlink() and entry.name not in wanted:
            entry.unlink()
            removed.append(entry.name)
    return changed, removed


def _read_back(serving: Path, raw: bytes) -> None:
    """Prove the write landed: re-read from disk and compare bytes, then check every link."""
    on_disk = (serving / CONFIG_NAME).read_bytes()
    if on_disk != raw:
        raise WriteError(
            f"{serving / CONFIG_NAME} does not hold what was just written "
            f"(sha256 {hashlib.sha256(on_disk).hexdigest()[:12]} != {hashlib.sha256(raw).hexdigest()[:12]})",
            hint="something else writes this path or the mount is not what it seems; "
            "check `findmnt` and other writers before serving",
        )
    for link in serving.iterdir():
        if link.is_symlink() and not link.exists():
            raise WriteError(f"{link} points at {link.readlink()}, which does not exist")


def write_serving_dir(
    serving_dir: Path,
    profile: Profile,
    *,
    source_dir: Path,
    lock: Lock,
    target_dir: Path | None = None,
    keeper: Keeper | None = None,
) -> WriteResult:
    """Create or repair the serving directory from a verified download.

    Order matters: verify first (nothing is written for a bad config), then record the
    hash on first use, then write atomically, then read back. A failure at any point
    leaves the previous config.json untouched.
    """
    if profile.drafter is None or profile.drafter.config is None:
        raise SpecdeployError(f"profile {profile.name} has no drafter config to write")
    _refuse_unresolved(profile)
    source_dir, serving_dir = Path(source_dir), Path(serving_dir)
    if source_dir.resolve() == serving_dir.resolve():
        raise WriteError(
            f"serving directory {serving_dir} is the download itself",
            hint="serve from a separate directory; downloads are never edited in place",
        )
    raw, config = read_config(source_dir)
    report = verify(source_dir / CONFIG_NAME, profile, target_dir=target_dir, lock=lock)
    if not report.ok:
        raise VerificationFailed(report)
    digest = report.canonical_sha256
    recorded = False
    if not profile.drafter.config.canonical_sha256.resolved:
        recorded = lock.record(profile.name, LOCK_KEY, digest, by="write-config", detail={"content": config})

    staged = keeper.stage(serving_dir) if keeper else None  # the running engine's copy, for a rollback
    atomic.ensure_dir(serving_dir)
    current = serving_dir / CONFIG_NAME
    changed = not (current.is_file() and not current.is_symlink() and current.read_bytes() == raw)
    if changed:
        if current.is_symlink():
            current.unlink()
        atomic.write_bytes(current, raw)
    links_changed, links_removed = _sync_links(serving_dir, source_dir)
    if staged and (changed or links_changed or links_removed):
        staged.commit()
    elif staged:
        staged.discard()
    _read_back(serving_dir, raw)
    final = verify(current, profile, target_dir=target_dir, lock=lock)
    if not final.ok:
        raise VerificationFailed(final)
    return WriteResult(str(serving_dir), changed, links_changed, links_removed, digest, recorded, final)
