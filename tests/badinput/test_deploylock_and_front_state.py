"""Bad input to `deploy-lock acquire|release|status`, `front save-state` and `gate --as-unit`
(issue 35): a run id that is not a plain name, a state directory that is missing or a file, a
host another run holds, a lock record that is damaged, a runtime socket that is missing or a
regular file, a state file that cannot be written, a run id no unit can be named by.

The lock and state files are real, in temporary directories; the runtime socket's faults are real
files and a real, closed unix socket; the save against a real HAProxy is tests/unit/test_front.py's."""

from __future__ import annotations

import json
import socket
from pathlib import Path

import pytest
from tests.support.badinput import Run, Snapshot, write

from specdeploy.core import deploylock


@pytest.fixture
def state(tmp_path: Path) -> Path:
    directory = tmp_path / "state"
    directory.mkdir()
    return directory


# ------------------------------------------------------------------------------------------ deploy-lock


def test_acquire_with_a_run_id_that_is_not_a_plain_name_is_refused(run: Run, state: Path, snapshot: type) -> None:
    before: Snapshot = snapshot(state)
    run("deploy-lock", "acquire", "--run-id", "../other", "--state-dir", state).expect(
        2, "--run-id '../other' is not a plain name", fix="use letters, digits"
    )
    assert before.unchanged()


def test_acquire_without_the_host_s_state_directory_is_refused(run: Run, tmp_path: Path) -> None:
    run("deploy-lock", "acquire", "--run-id", "run-a", "--state-dir", tmp_path / "nowhere").expect(
        2, "nowhere", "expected the host's state directory, found nothing there", fix="specdeploy role creates it"
    )
    assert not (tmp_path / "nowhere").exists()


def test_acquire_on_a_state_directory_that_is_a_file_is_refused(run: Run, tmp_path: Path) -> None:
    target = write(tmp_path / "state", "not a directory\n")
    run("deploy-lock", "acquire", "--run-id", "run-a", "--state-dir", target).expect(
        2, str(target), "expected the host's state directory", fix="specdeploy role creates it"
    )
    assert target.read_text() == "not a directory\n"


def test_acquire_while_another_run_holds_the_host_names_it_and_changes_nothing(
    run: Run, state: Path, snapshot: type
) -> None:
    deploylock.acquire(state, "run-a", "deploy.yml (Deploy a specdeploy stack)", origin="ops@ctl")
    before: Snapshot = snapshot(state)
    run("deploy-lock", "acquire", "--run-id", "run-b", "--state-dir", state).expect(
        75, "this host is being deployed by run run-a", "ops@ctl", fix="deploy-lock release --run-id run-a"
    )
    assert before.unchanged()


@pytest.mark.parametrize(
    ("option", "value", "fix"),
    [("--wait", "-1", "specdeploy_lock_wait_s"), ("--wait", "nan", "specdeploy_lock_wait_s"),
     ("--lease", "5", "longer than the longest play")],
)  # fmt: skip
def test_acquire_with_a_wait_or_lease_out_of_range_is_refused(
    run: Run, state: Path, option: str, value: str, fix: str
) -> None:
    run("deploy-lock", "acquire", "--run-id", "run-a", option, value, "--state-dir", state).expect(
        2, f"{option} {value}: expected seconds", fix=fix
    )
    assert deploylock.current(state) is None


def test_release_by_a_run_that_does_not_hold_the_host_changes_nothing(run: Run, state: Path, snapshot: type) -> None:
    deploylock.acquire(state, "run-a", "deploy.yml")
    before: Snapshot = snapshot(state)
    answer = run("deploy-lock", "release", "--run-id", "run-b", "--state-dir", state, "--json").expect(0)
    assert json.loads(answer.stdout)["released"] is None and json.loads(answer.stdout)["holder"]["run_id"] == "run-a"
    assert before.unchanged()


def test_release_with_a_bad_run_id_or_no_state_directory_is_refused(run: Run, tmp_path: Path) -> None:
    run("deploy-lock", "release", "--run-id", "a/b", "--state-dir", tmp_path).expect(
        2, "--run-id 'a/b' is not a plain name", fix="use letters, digits"
    )
    run("deploy-lock", "release", "--run-id", "run-a", "--state-dir", tmp_path / "nowhere").expect(
        2, "nowhere", fix="specdeploy role creates it"
    )


@pytest.mark.parametrize("record", ["{not json", "[]", '{"run_id": 7}', "\x00\xff"])
def test_a_damaged_lock_record_holds_nothing_and_the_next_holder_replaces_it(
    run: Run, state: Path, record: str
) -> None:
    write(state / deploylock.LOCK_NAME, record)
    status = run("deploy-lock", "status", "--state-dir", state, "--json").expect(0)
    assert json.loads(status.stdout) == {"holder": None, "alive": False}
    run("deploy-lock", "acquire", "--run-id", "run-a", "--state-dir", state).expect(0)
    assert deploylock.current(state).run_id == "run-a"  # type: ignore[union-attr]


def test_status_without_the_host_s_state_directory_is_refused(run: Run, tmp_path: Path) -> None:
    run("deploy-lock", "status", "--state-dir", tmp_path / "nowhere").expect(
        2, "nowhere", fix="specdeploy role creates it"
    )


def test_status_names_a_holder_whose_process_is_gone_as_not_holding(run: Run, state: Path) -> None:
    deploylock.acquire(state, "rollback-1", "rollback restore", pid=2**22 + 1)  # no such process
    answer = run("deploy-lock", "status", "--state-dir", state, "--json").expect(0)
    data = json.loads(answer.stdout)
    assert data["holder"]["run_id"] == "rollback-1" and data["alive"] is False


# ------------------------------------------------------------------------------------------ front save-state


def test_save_state_without_a_runtime_socket_is_refused_and_writes_nothing(run: Run, tmp_path: Path) -> None:
    target = tmp_path / "server-state"
    run("front", "save-state", "--socket", tmp_path / "admin.sock", "--file", target).expect(
        2, "admin.sock: no such socket", fix="start HAProxy"
    )
    assert not target.exists()


def test_save_state_on_a_regular_file_for_a_socket_is_refused(run: Run, tmp_path: Path) -> None:
    fake = write(tmp_path / "admin.sock", "not a socket\n")
    run("front", "save-state", "--socket", fake, "--file", tmp_path / "state").expect(
        2, "not a socket: expected HAProxy's unix socket", fix="start HAProxy"
    )


def test_save_state_on_a_socket_left_by_a_stopped_haproxy_is_refused(run: Run, tmp_path: Path) -> None:
    path = tmp_path / "admin.sock"
    left = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    left.bind(str(path))
    left.close()  # bound, never listening: what a killed HAProxy leaves
    run("front", "save-state", "--socket", path, "--file", tmp_path / "state").expect(
        2, "connection refused", fix="start (or restart) HAProxy"
    )


def test_save_state_keeps_an_earlier_state_file_when_haproxy_cannot_be_asked(run: Run, tmp_path: Path) -> None:
    earlier = write(tmp_path / "server-state", "1\n# be_id be_name srv_id srv_name srv_addr srv_op_state\n")
    run("front", "save-state", "--socket", tmp_path / "missing.sock", "--file", earlier).expect(
        2, "no such socket", fix="start HAProxy"
    )
    assert earlier.read_text().startswith("1\n# be_id")  # never replaced by nothing


def test_save_state_to_a_path_under_a_file_is_refused(run: Run, tmp_path: Path) -> None:
    blocker = write(tmp_path / "blocker", "x")
    run("front", "save-state", "--socket", tmp_path / "admin.sock", "--file", blocker / "state").expect(
        2, "admin.sock", fix="start HAProxy"
    )  # the socket is asked first: nothing is written before HAProxy answered


# ------------------------------------------------------------------------------------------ gate --as-unit


@pytest.mark.parametrize("run_id", ["a b", "run;id", "run$(id)", "tab\there", "quote'd"])
def test_gate_as_unit_refuses_a_run_id_no_unit_can_be_named_by(run: Run, state: Path, run_id: str) -> None:
    run("gate", "--profile", "cpu-rehearsal", "--run-id", run_id, "--state-dir", state, "--as-unit").expect(
        2, "for --as-unit", fix="use a run id like the deploy's own"
    )
    assert not (state / "runs").exists()


# ------------------------------------------------------------------------------------------ gate-wait


@pytest.mark.parametrize(
    ("args", "expected", "fix"),
    [
        (["--run-id", "../x"], "--run-id '../x'", "letters"),
        (["--run-id", "run-1", "--for", "-1"], "--for: expected seconds >= 0, found -1", "leave it out"),
        (["--run-id", "run-1", "--for", "nan"], "--for: expected seconds >= 0, found nan", "leave it out"),
    ],
)
def test_gate_wait_refuses_a_bad_run_id_or_wait_before_looking(
    run: Run, state: Path, args: list[str], expected: str, fix: str
) -> None:
    run("gate-wait", "--state-dir", state, *args).expect(2, expected, fix=fix)
    assert not (state / "runs").exists()


# ------------------------------------------------------------------------------------------ cdi keep


def test_cdi_keep_with_a_run_id_that_is_not_a_plain_name_keeps_nothing(run: Run, state: Path) -> None:
    spec = write(state.parent / "nvidia.yaml", "cdiVersion: 0.5.0\n")
    run("cdi", "keep", "--spec", spec, "--state-dir", state, "--rollback-dir", state / "rollback",
        "--run-id", "../x").expect(2, "--run-id '../x' is not a plain name", fix="use letters, digits")  # fmt: skip
    assert not (state / "rollback").exists()


def test_cdi_keep_while_an_earlier_run_is_open_refuses_and_keeps_its_copies(
    run: Run, state: Path, snapshot: type
) -> None:
    from specdeploy.core.keeper import Keeper

    spec = write(state.parent / "nvidia.yaml", "cdiVersion: 0.5.0\n")
    Keeper(state / "rollback", "interrupted-1").stage(spec).commit()  # an earlier run that never ended
    before: Snapshot = snapshot(state / "rollback", spec)
    run("cdi", "keep", "--spec", spec, "--state-dir", state, "--rollback-dir", state / "rollback",
        "--run-id", "run-2").expect(1, "run interrupted-1 replaced 1 item(s) and never ended",
                                    fix="specdeploy rollback recover --run-id run-2")  # fmt: skip
    assert before.unchanged()


def test_cdi_keep_during_another_deploy_is_refused_naming_it(run: Run, state: Path, snapshot: type) -> None:
    spec = write(state.parent / "nvidia.yaml", "cdiVersion: 0.5.0\n")
    deploylock.acquire(state, "play-9", "deploy.yml")
    before: Snapshot = snapshot(state)
    answer = run("cdi", "keep", "--spec", spec, "--state-dir", state, "--rollback-dir", state / "rollback",
                 "--run-id", "run-3")  # fmt: skip
    answer.expect(75, "run play-9 (deploy.yml", fix="deploy-lock release --run-id play-9")
    assert before.unchanged()
