"""The cache directory shared by runs: venvs, wheelhouse, fixture models, test-host images.

Everything here is reproducible from the repository; deleting it only costs time.
`$SPECDEPLOY_CACHE` overrides the default `~/.cache/specdeploy` (empty: the default).

A cache path that cannot be a directory — a regular file, a path under one, a place this user
cannot write — is a `CacheDirError` (bad input, exit 2) naming the path and where it came
from, never a traceback from the `mkdir` of whichever step first needed the cache.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from pathlib import Path

from filelock import FileLock

from specdeploy.core.errors import SpecdeployError
from specdeploy.core.sizes import nearest_existing

ENV = "SPECDEPLOY_CACHE"


class CacheDirError(SpecdeployError):
    """The cache directory cannot be made or used: bad input (the environment), exit 2."""

    exit_code = 2


def cache_dir() -> Path:
    """The cache directory, created when missing; a CacheDirError when it cannot be one."""
    configured = os.environ.get(ENV, "")
    path = Path(configured) if configured else Path.home() / ".cache" / "specdeploy"
    origin = f"${ENV}" if configured else f"the cache directory (${ENV} unset)"
    hint = f"point ${ENV} at a directory (or a path where one can be created), or unset it for ~/.cache/specdeploy"
    try:
        path.mkdir(parents=True, exist_ok=True)
    except (FileExistsError, NotADirectoryError):
        blocking = nearest_existing(path)
        what = "a regular file" if blocking.is_file() else "something that is not a directory"
        where = "" if blocking == path else f" at {blocking}"
        raise CacheDirError(
            f"{origin} {path}: expected a directory (or a path where one can be created), found {what}{where}",
            hint=hint,
        ) from None
    except OSError as exc:
        raise CacheDirError(f"{origin} {path} cannot be created: {exc.strerror or exc}", hint=hint) from None
    if not os.access(path, os.W_OK | os.X_OK):
        raise CacheDirError(f"{origin} {path} is not writable by this user", hint=hint)
    return path


@contextlib.contextmanager
def exclusive(name: str) -> Iterator[None]:
    """Hold the cache's lock `name` while building something every run on the machine shares (a
    wheelhouse, a host image, olah's venv): a second run — the test suite's other worker, a
    rehearsal started beside it — waits for the first and then finds it built, instead of
    building the same thing into the same place at once."""
    locks = cache_dir() / "locks"
    locks.mkdir(exist_ok=True)
    with FileLock(locks / f"{name}.lock"):
        yield
