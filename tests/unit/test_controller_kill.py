"""The container chain's "controller killed mid-gate" kills the whole play (tests/support/container_rig
`kill_controller`): Ansible's workers leave the play's process group (ansible-core's WorkerProcess
calls os.setsid()), so a SIGKILL to the group alone left a worker asleep for good beside the next run.
A real parent and a real child that leaves its session stand in for the play and its worker."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

from tests.support import container_rig

WORKER = "import os, sys, time; os.setsid(); time.sleep(600)"
PLAY = (
    "import subprocess, sys, time; subprocess.Popen([sys.executable, '-c', sys.argv[1], sys.argv[2]]); time.sleep(600)"
)


def _play(run_id: str) -> subprocess.Popen[bytes]:
    play = subprocess.Popen([sys.executable, "-c", PLAY, WORKER, f"specdeploy_run_id={run_id}"], start_new_session=True)
    deadline = time.monotonic() + 30
    while len(container_rig.controller_processes(run_id)) < 2:  # the play and its worker
        assert time.monotonic() < deadline, "the stand-in play did not start its worker"
        time.sleep(0.1)
    return play


def _gone(run_id: str) -> bool:
    deadline = time.monotonic() + 10
    while container_rig.controller_processes(run_id) and time.monotonic() < deadline:
        time.sleep(0.1)
    return not container_rig.controller_processes(run_id)


def test_killing_the_controller_kills_the_worker_that_left_its_process_group() -> None:
    run_id = f"test-{os.getpid()}-killed"
    container_rig.kill_controller(_play(run_id), run_id)
    assert _gone(run_id)


def test_a_kill_of_the_process_group_alone_leaves_the_worker_running() -> None:
    """What the chain did before: the fault the helper mends."""
    run_id = f"test-{os.getpid()}-group"
    play = _play(run_id)
    os.killpg(play.pid, signal.SIGKILL)
    play.wait(30)
    try:
        assert not _gone(run_id)
    finally:
        for pid in container_rig.controller_processes(run_id):
            os.kill(pid, signal.SIGKILL)
