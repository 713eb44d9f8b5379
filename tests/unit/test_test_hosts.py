"""A command that fails on a test host says where, what and what it printed
(specdeploy.rehearsal.hosts.RemoteCommandFailed): the migration chain's kill of NEW's engine failed
once in CI with only "returned non-zero exit status 125", and podman's reason was lost."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from specdeploy.rehearsal import hosts


def _failed(script: str) -> hosts.RemoteCommandFailed:
    done = subprocess.run(["sh", "-c", script], capture_output=True, text=True)
    done.args = ["ssh", "-p", "2341", "root@127.0.0.1", script]  # as Host.ssh runs it
    return hosts.RemoteCommandFailed("specdeploy-container-new", done)


def test_the_error_names_the_host_the_remote_command_its_exit_code_and_what_it_printed() -> None:
    script = "echo ready; echo 'Error: can only kill running containers' >&2; exit 125"
    error = _failed(script)
    assert str(error).splitlines() == [
        f"on specdeploy-container-new: {script!r} exited 125",
        "stdout: ready",
        "stderr: Error: can only kill running containers",
    ]


def test_a_command_that_printed_nothing_says_so_and_a_long_output_keeps_its_end() -> None:
    error = _failed("seq 1 2000 >&2; exit 3")
    lines = str(error).splitlines()
    assert lines[1] == "stdout: (nothing)"
    assert lines[-1] == "2000" and len(str(error)) < 2 * hosts.RemoteCommandFailed.TAIL


def test_it_is_still_a_called_process_error_so_existing_handlers_catch_it() -> None:
    error = _failed("exit 1")
    assert isinstance(error, subprocess.CalledProcessError) and error.returncode == 1


def test_host_ssh_raises_it_with_the_remote_s_output_and_returns_a_failure_unchecked(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Host.ssh itself, through an `ssh` stand-in first on PATH that answers as podman did in CI."""
    stand_in = tmp_path / "ssh"
    stand_in.write_text("#!/bin/sh\necho 'Error: can only kill running containers' >&2\nexit 125\n")
    stand_in.chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path}:{os.environ['PATH']}")
    host = hosts.Host("specdeploy-container-new", 2341, tmp_path / "key")
    with pytest.raises(hosts.RemoteCommandFailed) as failed:
        host.ssh("podman kill --signal KILL specdeploy-engine")
    assert str(failed.value).splitlines() == [
        "on specdeploy-container-new: 'podman kill --signal KILL specdeploy-engine' exited 125",
        "stdout: (nothing)",
        "stderr: Error: can only kill running containers",
    ]
    assert host.ssh("anything", check=False).returncode == 125
