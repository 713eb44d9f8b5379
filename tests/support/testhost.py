"""Disposable systemd test hosts (specdeploy.rehearsal.hosts), booted per test module and
removed afterwards."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from specdeploy.rehearsal.hosts import Host, host_image, rehearsal_host_image, start, stop

__all__ = ["Host", "boot_host", "host_image", "rehearsal_host_image"]


@contextmanager
def boot_host(
    name: str, ssh_port: int, workdir: Path, ports: tuple[int, ...] = (), image: str | None = None
) -> Iterator[Host]:
    host = start(name, ssh_port, workdir, ports, image)
    try:
        yield host
    finally:
        stop(name)
