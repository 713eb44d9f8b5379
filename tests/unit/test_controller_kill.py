"""The container chain's "controller killed mid-gate" kills the whole play (tests/support/container_rig
`kill_controller`): Ansible's workers leave the play's process group (ansible-core's WorkerProcess
calls os.setsid()), so a SIGKILL to the group alone left a worker asleep for good beside the next run.
A real parent and a real child that leaves its session stand in for the play and its worker."""

from __future__ import annotations

import contextlib
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
    while not _left(play, run_id):  # the worker has left the play's session (as Ansible's do)
        assert time.monotonic() < deadline, "the stand-in play's worker did not leave its session"
        time.sleep(0.05)
    return play


def _left(play: subprocess.Popen[bytes], run_id: str) -> bool:
    for pid in container_rig.controller_processes(run_id):
        with contextlib.suppress(ProcessLookupError):
            if pid != play.pid and os.getsid(pid) == pid:
                return True
    return False


def _gone(run_id: str, within_s: float) -> bool:
    deadline = time.monotonic() + within_s
    while container_rig.controller_processes(run_id) and time.monotonic() < deadline:
        time.sleep(0.1)
    return not container_rig.controller_processes(run_id)


def test_killing_the_controller_kills_the_worker_that_left_its_process_group() -> None:
    run_id = f"test-{os.getpid()}-killed"
    assert container_rig.kill_controller(_play(run_id), run_id) == []
    assert not container_rig.controller_processes(run_id)


def test_a_kill_of_the_process_group_alone_leaves_the_worker_running() -> None:
    """What the chain did before: the fault the helper mends."""
    run_id = f"test-{os.getpid()}-group"
    play = _play(run_id)
    os.killpg(play.pid, signal.SIGKILL)
    play.wait(30)
    try:
        assert not _gone(run_id, within_s=2)
    finally:
        for pid in container_rig.controller_processes(run_id):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
