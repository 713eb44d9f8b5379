"""Build the drafter's serving directory from a verified download: `write-config`.

In the field a corrected config.json "did not take effect": it never landed where the engine
read. The engine reads a serving directory — never the download cache — that holds the
verified config.json and links to the verified weights; it is written atomically, read back
and verified again, and what it replaced is kept for a rollback.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import time
from dataclasses import dataclass
from pathlib import Path

from specdeploy.core import atomic, layout
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


def _follow(path: Path) -> Path:
    """Where a link (such as <serving>/drafter-source) points, followed lexically: a models root
    reached through a symlink keeps the path the container mounts, which resolve() would lose."""
    seen = 0
    while path.is_symlink() and seen < 40:
        path = Path(os.path.normpath(path.parent / os.readlink(path)))
        seen += 1
    return path.absolute()


def _wanted_links(build: Path, source: Path) -> dict[str, str]:
    """One relative link per source file (weights, tokenizer, ...), as seen from a build directory:
    valid on the host and in a container mounting the models and serving dirs (weights.store)."""
    return {
        p.name: os.path.relpath(p, build)  # lexical: the paths the container mounts, not physical ones
        for p in sorted(source.iterdir())
        if p.is_file() and p.name != CONFIG_NAME and not p.name.startswith(".")
    }


def _current(serving: Path) -> tuple[bytes | None, dict[str, str]]:
    """What the serving link shows now: config.json's bytes and the links by name."""
    if not serving.is_dir():
        return None, {}
    config = serving / CONFIG_NAME
    raw = config.read_bytes() if config.is_file() and not config.is_symlink() else None
    links = {e.name: os.readlink(e) for e in serving.iterdir() if e.is_symlink()}
    return raw, links


def _build(builds: Path, raw: bytes, links: dict[str, str]) -> Path:
    """A new build directory holding config.json and the links, complete before it is named."""
    atomic.ensure_dir(builds)
    digest = hashlib.sha256(raw + json.dumps(links, sort_keys=True).encode()).hexdigest()[:12]
    final = builds / f"{digest}-{time.time_ns()}"
    tmp = builds / f".{final.name}.tmp"
    try:
        tmp.mkdir()
        atomic.write_bytes(tmp / CONFIG_NAME, raw)
        for name, target in links.items():
            os.symlink(target, tmp / name)
        tmp.rename(final)
        atomic.fsync_dir(builds)
    except OSError as exc:
        shutil.rmtree(tmp, ignore_errors=True)
        raise atomic.write_error(tmp, exc) from None
    except WriteError:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return final


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
    source_dir, serving_dir = _follow(Path(source_dir)), Path(serving_dir)
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

    # The serving path is a link to a complete build directory: a new version is built beside
    # it and the link flipped (one rename), so the engine never reads a half-written directory
    # and the keeper keeps the old link — and with it the old version — for a rollback.
    builds = serving_dir.parent / layout.DRAFTER_BUILDS
    current_raw, current_links = _current(serving_dir)
    probe = builds / "x"  # links are relative to a build directory, all of which share a parent
    wanted = _wanted_links(probe, source_dir)
    changed = current_raw != raw
    links_changed = sorted(n for n, t in wanted.items() if current_links.get(n) != t)
    links_removed = sorted(n for n in current_links if n not in wanted)
    if changed or links_changed or links_removed or not serving_dir.is_symlink():
        if serving_dir.exists() and not serving_dir.is_symlink() and not serving_dir.is_dir():
            raise WriteError(f"{serving_dir} is a file, not the drafter's serving link", hint="move it away")
        build = _build(builds, raw, wanted)
        staged = keeper.stage(serving_dir) if keeper else None
        if serving_dir.is_dir() and not serving_dir.is_symlink():  # a directory from before builds
            shutil.rmtree(serving_dir)
        atomic.symlink(serving_dir, Path(os.path.relpath(build, serving_dir.parent)))
        if staged:
            staged.commit()
    _read_back(serving_dir, raw)
    final = verify(serving_dir / CONFIG_NAME, profile, target_dir=target_dir, lock=lock)
    if not final.ok:
        raise VerificationFailed(final)
    return WriteResult(str(serving_dir), changed, links_changed, links_removed, digest, recorded, final)
