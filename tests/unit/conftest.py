"""Fixtures the unit tests of the front and of the migration share: a site certificate for the real
HAProxy, and a directory short enough for its runtime socket."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from tests.support import front as support


@pytest.fixture(scope="session")
def pem(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return support.make_certificate(tmp_path_factory.mktemp("cert"))


@pytest.fixture
def short_dir() -> Iterator[Path]:
    """A short directory for the runtime socket (a unix socket path holds at most 107 bytes; pytest's
    tmp_path can be longer)."""
    import tempfile

    with tempfile.TemporaryDirectory(prefix="front-") as tmp:
        yield Path(tmp)
