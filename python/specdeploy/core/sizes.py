"""Sizes as a person reads them, and where a path would land on disk: what the product's checks
(preflight's disk space, `migrate`'s space check and progress) share with the rehearsal's cache
housekeeping (specdeploy.rehearsal.housekeeping), kept here so the host package needs nothing of the
rehearsal (issue 37: the host wheel holds no rehearsal module). Standard library only."""

from __future__ import annotations

import os
from pathlib import Path

GIB = 1024**3


def human(size: float) -> str:
    """`3.2 GiB`, `512 MiB`."""
    return f"{size / GIB:.1f} GiB" if size >= GIB / 10 else f"{size / 1024**2:.0f} MiB"


def nearest_existing(path: Path) -> Path:
    """The nearest existing path at or above `path` (what stands where a directory would go)."""
    found = path
    while not os.path.lexists(found) and found != found.parent:
        found = found.parent
    return found
