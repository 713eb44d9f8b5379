"""The cache directory shared by runs: venvs, wheelhouse, fixture models, test-host images.

Everything here is reproducible from the repository; deleting it only costs time.
`$SPECDEPLOY_CACHE` overrides the default `~/.cache/specdeploy`.
"""

from __future__ import annotations

import os
from pathlib import Path


def cache_dir() -> Path:
    path = Path(os.environ.get("SPECDEPLOY_CACHE", Path.home() / ".cache" / "specdeploy"))
    path.mkdir(parents=True, exist_ok=True)
    return path
