"""The hash cache of a revision directory: what the fetch (and `weights serve`) verified, kept in
`<revision>/.specdeploy/verified.json` as {relative path: {size, mtime_ns, sha256, revision}}.

One reader and one writer (`load`, `save`) for every stage that asks what is verified on disk:
the fetch and the store skip files unchanged since they were hashed; preflight counts only
verified bytes of the pinned revisions as weights already there (partial downloads and old
revisions are not: they were once counted, and a host short of disk passed preflight to fail
mid-download).
"""

from __future__ import annotations

import json
import stat
from pathlib import Path
from typing import Any

from specdeploy.core import atomic, files
from specdeploy.core.errors import SpecdeployError, WriteError

STATE_DIR = ".specdeploy"
STATE_FILE = "verified.json"


def load(directory: Path) -> dict[str, Any]:
    """The hash cache of `directory`. It is bookkeeping, not input: one that cannot be read, is not
    JSON or has entries of another shape is ignored entry by entry (those files are hashed again),
    never a traceback."""
    path = Path(directory) / STATE_DIR / STATE_FILE
    try:
        data = files.read_json(path, what="hash cache")
    except SpecdeployError:
        return {}
    if not isinstance(data, dict):
        return {}
    return {
        name: entry
        for name, entry in data.items()
        if isinstance(entry, dict)
        and type(entry.get("size")) is int
        and type(entry.get("mtime_ns")) is int
        and isinstance(entry.get("sha256"), str)
        and isinstance(entry.get("revision", ""), str)
    }


def save(directory: Path, state: dict[str, Any]) -> None:
    """Write the hash cache when it changed (an unchanged re-run leaves the directory as it was);
    a place that is not what the cache needs (a file where its directory goes) is a WriteError
    naming it."""
    directory = Path(directory)
    path = directory / STATE_DIR / STATE_FILE
    if load(directory) == state and path.is_file():
        return
    for place, wanted in ((directory / STATE_DIR, "a directory"), (path, "a file")):
        if place.exists() and place.is_dir() != (wanted == "a directory"):
            found = "a directory" if place.is_dir() else "a file" if place.is_file() else "something else"
            raise WriteError(
                f"{place}: expected {wanted} (specdeploy's hash cache of {directory}), found {found}; "
                "the verified hashes cannot be kept",
                hint=f"remove {place} (the cache is rebuilt by hashing the files again), then run this again",
            )
    atomic.ensure_dir(directory / STATE_DIR)
    atomic.write_bytes(path, json.dumps(state, indent=1, sort_keys=True).encode())


def verified_bytes(directory: Path, revision: str) -> int:
    """Bytes of the files of `directory` verified at `revision` and unchanged since (size and mtime
    as recorded; links and anything else not counted)."""
    total = 0
    for name, entry in load(directory).items():
        if entry.get("revision", revision) != revision:
            continue
        try:  # a name that would leave the directory (the cache is written by the fetch account) is skipped
            info = files.inside(directory, files.relative_name(name, origin="hash cache"), origin="hash cache").lstat()
        except (OSError, ValueError, SpecdeployError):
            continue
        if stat.S_ISREG(info.st_mode) and (info.st_size, info.st_mtime_ns) == (entry["size"], entry["mtime_ns"]):
            total += info.st_size
    return total
