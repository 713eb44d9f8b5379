"""The cache's stale entries and the disk's free space, before a run needs either.

Failure prevented: CI's disk filled in the middle of the suite. Every lock refresh had left its
shared venv (about 4 GB) and its wheelhouse (about 1.3 GB) in the cache, keyed by the old lock's
hash and never used again; with the leftovers of earlier runs the machine had about 1 GB free when
the engines' venvs were built on the test hosts, and 13 tests failed with errors that named a
failed build, a hung command and a preflight disk refusal — never the disk.

- `prune(cache, kind, current)`: of the cache's `KIND-KEY` directories other than `current`,
  keep the `keep` most recently used (a checkout of another branch with another lock finds its
  venv, switching back and forth) and remove the rest, printing each with its size. `mark_used`
  stamps an entry each time a run takes it, so "recently used" means used, not built.
- `space_problem(need_gib, paths)`: refuse to start, naming the free and the needed space, the
  filesystem and what takes room in the cache, instead of failing an hour later (more is needed
  where the cache is empty and everything is built first).

Part of the rehearsal rig (CI's and the main job's cache), not of the host package. Standard library
only: scripts/setup.sh runs it with the system Python, before any venv exists
(`python -m specdeploy.rehearsal.housekeeping prune venv venv-KEY --cache C`, `space --cache C --warm-gib W
--cold-gib N PATH...`).
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from specdeploy.core.sizes import GIB, human, nearest_existing

USED = ".used"  # touched each time a run takes the entry


@dataclass(frozen=True)
class Removed:
    path: Path
    bytes: int
    idle_s: float


def size_of(path: Path) -> int:
    """Bytes under `path` (files as allocated on disk are not counted twice through links)."""
    total = 0
    for dirpath, _dirs, files in os.walk(path):
        for name in files:
            try:
                total += os.lstat(os.path.join(dirpath, name)).st_size
            except OSError:
                continue
    return total


def mark_used(entry: Path) -> None:
    """Stamp `entry` as taken by a run now (the age `prune` sorts by)."""
    (entry / USED).touch()


def last_used(entry: Path) -> float:
    """When a run last took `entry`: its stamp, else when it was completed or made."""
    for marker in (entry / USED, entry / ".complete", entry):
        try:
            return marker.stat().st_mtime
        except OSError:
            continue
    return 0.0


def prune(cache: Path, kind: str, current: str, *, keep: int = 1) -> list[Removed]:
    """Remove `cache`'s `KIND-*` directories but `current` and the `keep` most recently used."""
    others = [p for p in cache.glob(f"{kind}-*") if p.is_dir() and not p.is_symlink() and p.name != current]
    others.sort(key=last_used, reverse=True)
    removed: list[Removed] = []
    now = time.time()
    for stale in others[keep:]:
        size, idle = size_of(stale), now - last_used(stale)
        shutil.rmtree(stale, ignore_errors=True)
        if not stale.exists():
            removed.append(Removed(stale, size, idle))
            print(
                f"cache: removed {stale.name} ({human(size)}, last used {idle / 86400:.1f} days ago; "
                f"this run takes {current})",
                file=sys.stderr,
            )
    return removed


def space_problem(need_gib: float, paths: list[Path]) -> str | None:
    """None when every filesystem holding one of `paths` has `need_gib` free, else the message."""
    short = []
    seen: set[int] = set()
    for path in paths:
        where = nearest_existing(path)
        device = where.stat().st_dev
        if device in seen:
            continue
        seen.add(device)
        free = shutil.disk_usage(where).free
        if free < need_gib * GIB:
            short.append(f"{where} has {human(free)} free, {need_gib:g} GiB needed")
    if not short:
        return None
    return "; ".join(short)


def _largest(cache: Path, count: int = 6) -> list[tuple[int, Path]]:
    if not cache.is_dir():
        return []
    sizes = [(size_of(p), p) for p in cache.iterdir() if p.is_dir() and not p.is_symlink()]
    return sorted(sizes, reverse=True)[:count]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m specdeploy.rehearsal.housekeeping", description=__doc__.split("\n")[0]
    )
    commands = parser.add_subparsers(dest="command", required=True)
    pruning = commands.add_parser("prune", help="remove a kind's stale cache entries, keeping CURRENT")
    pruning.add_argument("kind", help="venv or wheelhouse (the KIND of KIND-KEY)")
    pruning.add_argument("current", help="the entry this run takes (its directory name)")
    pruning.add_argument("--cache", type=Path, required=True)
    pruning.add_argument("--keep", type=int, default=1, help="other entries kept, most recently used first")
    space = commands.add_parser("space", help="refuse unless the filesystems of the cache and PATHs have the space")
    space.add_argument("paths", nargs="*", type=Path)
    space.add_argument("--cache", type=Path, required=True, help="the cache (its largest entries are listed)")
    space.add_argument("--warm-gib", type=float, required=True, help="needed where the cache holds a built venv")
    space.add_argument("--cold-gib", type=float, required=True, help="needed where it does not (a first run)")
    space.add_argument("--what", default="this run", help="what needs the space (for the message)")
    args = parser.parse_args(argv)

    if args.command == "prune":
        current = args.cache / args.current
        if current.is_dir():
            mark_used(current)
        prune(args.cache, args.kind, args.current, keep=args.keep)
        return 0

    warm = any((venv / ".complete").is_file() for venv in args.cache.glob("venv-*"))
    need = args.warm_gib if warm else args.cold_gib
    problem = space_problem(need, [args.cache, *args.paths])
    if problem is None:
        return 0
    state = "warm" if warm else "empty: everything is built first"
    print(
        f"error: not enough disk space for {args.what}: {problem} (the cache is {state}); nothing was started",
        file=sys.stderr,
    )
    largest = _largest(args.cache)
    if largest:
        listed = ", ".join(f"{p.name} {human(s)}" for s, p in largest)
        print(f"  the cache's largest entries ({args.cache}): {listed}", file=sys.stderr)
    print(
        "  fix: free space on that filesystem (old clones and caches in /tmp, unused podman images: "
        "`podman image prune`), or point SPECDEPLOY_CACHE and TMPDIR at a larger one; every cache entry "
        "is rebuilt on demand, so deleting one costs only time",
        file=sys.stderr,
    )
    return 1


if __name__ == "__main__":
    raise SystemExit(main())
