"""`specdeploy gate --as-unit` (gate.unit, issue 35): the gate as a transient systemd unit, so that a
controller that dies mid-gate leaves it to finish.

Real: the gate itself (this checkout's CLI, run as its own process against an endpoint nothing
listens on, so it ends "could not test" with a finished report), its report file, the caller's
kill. Stand-ins (this machine runs no systemd): `systemd-run` starts the command as a detached
process of its own session, as systemd starts a unit, and `systemctl show` reports it active
while that process lives. The same path on real systemd — a controller killed mid-gate, the gate
finishing with its rollback — is tests/integration/test_container_rehearsal.py's."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from specdeploy.gate import unit as gate_unit

pytestmark = pytest.mark.timeout(120)

SYSTEMD_RUN = """#!{python}
import os, subprocess, sys
args = sys.argv[1:]
name = args[args.index("--unit") + 1]
env = dict(os.environ)
for a in args:
    if a.startswith("--setenv="):
        k, v = a[len("--setenv="):].split("=", 1)
        env[k] = v
command = args[args.index("--") + 1:]
{body}
"""
START = """log = open(os.path.join({units!r}, name + ".log"), "wb")
p = subprocess.Popen(command, env=env, stdin=subprocess.DEVNULL, stdout=log, stderr=log, start_new_session=True)
open(os.path.join({units!r}, name + ".pid"), "w").write(str(p.pid))
"""
SYSTEMCTL = """#!{python}
import os, sys
name = sys.argv[2]
pid_file = os.path.join({units!r}, name + ".pid")
alive = False
if os.path.exists(pid_file):
    pid = int(open(pid_file).read())
    try:
        done, _ = os.waitpid(pid, os.WNOHANG)
    except ChildProcessError:
        done = 0
    try:
        os.kill(pid, 0)
        alive = open(f"/proc/{{pid}}/stat").read().split()[2] != "Z"
    except ProcessLookupError:
        alive = False
print("LoadState=loaded" if alive else "LoadState=not-found")
print("ActiveState=active" if alive else "ActiveState=inactive")
print("ExecMainStatus=0")
"""


def _stand_ins(tmp_path: Path, body: str = START) -> tuple[Path, Path]:
    bin_dir, units = tmp_path / "bin", tmp_path / "units"
    bin_dir.mkdir()
    units.mkdir()
    run = bin_dir / "systemd-run"
    run.write_text(SYSTEMD_RUN.format(python=sys.executable, body=body.format(units=str(units))))
    ctl = bin_dir / "systemctl"
    ctl.write_text(SYSTEMCTL.format(python=sys.executable, units=str(units)))
    run.chmod(0o755)
    ctl.chmod(0o755)
    return bin_dir, units


def _gate_argv(state: Path, run_id: str, *extra: str) -> list[str]:
    return [sys.executable, "-m", "specdeploy", "gate", "--profile", "cpu-rehearsal", "--run-id", run_id,
            "--state-dir", str(state), "--endpoint", "http://127.0.0.1:9", "--readiness-timeout", "3",
            "--no-rollback", "--as-unit", "--json", *extra]  # fmt: skip


def test_the_gate_runs_as_its_unit_and_its_report_and_exit_code_come_back(tmp_path: Path) -> None:
    bin_dir, units = _stand_ins(tmp_path)
    state = tmp_path / "state"
    state.mkdir()
    env = os.environ | {"PATH": f"{bin_dir}:{os.environ['PATH']}", "SPECDEPLOY_DEPLOY_RUN": "play-7"}
    done = subprocess.run(_gate_argv(state, "run-1"), capture_output=True, text=True, env=env, timeout=100)
    report = json.loads((state / "runs" / "run-1" / "gate.json").read_text())
    shown = json.loads(done.stdout)
    assert done.returncode == report["exit_code"] == 2 and report["verdict"] == "error", done.stderr
    assert shown["unit"] == "specdeploy-gate-run-1.service" and shown["verdict"] == "error"
    assert "gate: running as specdeploy-gate-run-1.service" in done.stderr
    assert (units / "specdeploy-gate-run-1.service.log").is_file()  # the unit's own output: its journal


def test_a_caller_killed_mid_gate_leaves_the_gate_to_finish_its_report(tmp_path: Path) -> None:
    """What the SSH session's end does to the controller's side: the caller is killed while the
    gate waits for readiness; the gate (the unit) finishes on its own and its report is final."""
    bin_dir, units = _stand_ins(tmp_path)
    state = tmp_path / "state"
    state.mkdir()
    env = os.environ | {"PATH": f"{bin_dir}:{os.environ['PATH']}"}
    caller = subprocess.Popen(_gate_argv(state, "run-2"), env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    report = state / "runs" / "run-2" / "gate.json"
    deadline = time.monotonic() + 60
    while not report.exists() and time.monotonic() < deadline:
        time.sleep(0.1)
    assert json.loads(report.read_text())["verdict"] == "running"
    caller.send_signal(signal.SIGKILL)
    caller.wait(10)
    pid = int((units / "specdeploy-gate-run-2.service.pid").read_text())
    deadline = time.monotonic() + 60
    while json.loads(report.read_text())["verdict"] == "running" and time.monotonic() < deadline:
        time.sleep(0.2)
    final = json.loads(report.read_text())
    assert final["verdict"] == "error" and final["finished_at"], final  # judged to its end, not "running"
    assert "could not" in final["message"] or final["smoke"], final
    with pytest.raises(ProcessLookupError):  # and it ended by itself
        for _ in range(100):
            os.kill(pid, 0)
            time.sleep(0.1)


def test_a_unit_that_ends_without_a_finished_report_is_an_error_naming_its_journal(tmp_path: Path) -> None:
    bin_dir, _ = _stand_ins(tmp_path, body="pass  # the unit dies before the gate writes anything\n")
    old_path = os.environ["PATH"]
    os.environ["PATH"] = f"{bin_dir}:{old_path}"
    try:
        with pytest.raises(gate_unit.GateUnitError) as info:
            gate_unit.run(["true"], "run-3", tmp_path / "runs" / "run-3" / "gate.json", progress=lambda _: None)
    finally:
        os.environ["PATH"] = old_path
    assert "ended (exit status 0) without a finished report" in info.value.message
    assert "journalctl -u specdeploy-gate-run-3.service" in (info.value.hint or "")
    assert "rollback restore --run-id run-3" in (info.value.hint or "")


@pytest.mark.parametrize(
    ("run_id", "path", "expected"),
    [
        ("a b", None, "--run-id 'a b': expected letters, digits, '-', '_' or '.' for --as-unit"),
        ("run-4", "", "systemd-run not found"),
    ],
)
def test_as_unit_refuses_a_run_id_no_unit_can_be_named_by_and_a_host_without_systemd(
    cli: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, run_id: str, path: str | None, expected: str
) -> None:
    state = tmp_path / "state"
    state.mkdir()
    if path is not None:
        monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    done = cli("gate", "--profile", "cpu-rehearsal", "--run-id", run_id, "--state-dir", state, "--as-unit")
    assert done.exit_code == 2, done.output
    assert expected in " ".join(done.output.split())
    assert not (state / "runs" / run_id).exists()  # nothing started


# ------------------------------------------------------------------ detached: what a deploy's play does


def test_a_detached_gate_returns_at_once_and_each_short_wait_names_the_check_it_runs_until_its_report(
    tmp_path: Path,
) -> None:
    """The deploy's two tasks (issue 37, no silent minutes): `gate --as-unit --detach` starts the unit and
    returns; `gate-wait --for S` exits 75 while it runs with one line naming the gate's current check (its
    own progress line, kept in <run dir>/gate.progress), which the play prints as the task's retry; the
    wait that finds it ended prints the report and exits with the gate's code."""
    bin_dir, _ = _stand_ins(tmp_path)
    state = tmp_path / "state"
    state.mkdir()
    # the ticker's own period (20 s) outlasts this gate: what each look shows is the gate's newest observation
    env = {k: v for k, v in os.environ.items() if k != "SPECDEPLOY_PROGRESS_PERIOD_S"}
    env["PATH"] = f"{bin_dir}:{os.environ['PATH']}"
    argv = _gate_argv(state, "run-5", "--detach")
    argv[argv.index("--readiness-timeout") + 1] = "8"
    argv[argv.index("--endpoint") + 1] = "http://127.0.0.1:9/"  # a base URL nothing listens on: readiness waits
    began = time.monotonic()
    started = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=60)
    assert started.returncode == 0, started.stderr
    assert json.loads(started.stdout) == {
        "run_id": "run-5", "unit": "specdeploy-gate-run-5.service", "detached": True,
        "report": str(state / "runs" / "run-5" / "gate.json"),
    }  # fmt: skip
    assert time.monotonic() - began < 8  # it did not wait for the gate
    wait = [sys.executable, "-m", "specdeploy", "gate-wait", "--run-id", "run-5", "--state-dir", str(state)]
    said = []
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        look = subprocess.run([*wait, "--for", "0.5"], capture_output=True, text=True, env=env, timeout=60)
        if look.returncode != 75:
            break
        said.append(look.stdout.strip())
    assert said, "the gate ended before any wait saw it running"
    assert all(line.startswith("unit active; ") and "\n" not in line for line in said), said
    assert any(re.search(r"\d\d:\d\d:\d\d gate: \d+s, last: smoke: readiness: tiny-qwen3 not served yet", line)
               for line in said), said  # fmt: skip
    assert look.returncode == 2, look.stdout + look.stderr  # the gate's own: could not test
    assert "gate: error (exit 2)" in look.stdout  # the report's table
    again = subprocess.run([*wait, "--json"], capture_output=True, text=True, env=env, timeout=60)
    assert again.returncode == 2 and json.loads(again.stdout)["unit"] == "specdeploy-gate-run-5.service"


def test_waiting_for_a_run_no_gate_was_started_for_is_an_error_naming_the_run(cli: Any, tmp_path: Path) -> None:
    state = tmp_path / "state"
    state.mkdir()
    bin_dir, _ = _stand_ins(tmp_path)
    old_path = os.environ["PATH"]
    os.environ["PATH"] = f"{bin_dir}:{old_path}"
    try:
        done = cli("gate-wait", "--run-id", "run-6", "--state-dir", state, "--for", "0")
    finally:
        os.environ["PATH"] = old_path
    assert done.exit_code == 2, done.output
    text = " ".join(done.output.split())
    assert "no gate runs for run run-6: there is no unit specdeploy-gate-run-6.service and no report" in text
    assert "gate --as-unit --detach --run-id ID" in text


def test_detach_without_as_unit_is_refused_before_anything(cli: Any, tmp_path: Path) -> None:
    state = tmp_path / "state"
    state.mkdir()
    done = cli("gate", "--profile", "cpu-rehearsal", "--run-id", "run-7", "--state-dir", state, "--detach")
    assert done.exit_code == 2, done.output
    assert "--detach: expected together with --as-unit, found alone" in " ".join(done.output.split())
    assert not (state / "runs" / "run-7").exists()


def test_a_restore_is_refused_while_the_run_s_gate_still_runs_as_its_unit_and_allowed_once_it_ended(
    tmp_path: Path,
) -> None:
    """A deploy's rescue after its wait ran out, or a person, must not restore the previous stack beneath
    a gate judging the new one (it rolls back on its own): `rollback restore|recover` ask first. A host
    where systemd cannot be asked runs no gate unit: nothing is refused there."""
    bin_dir, units = _stand_ins(tmp_path)
    gate = subprocess.Popen(["sleep", "30"])
    try:
        (units / "specdeploy-gate-run-8.service.pid").write_text(str(gate.pid))
        with pytest.raises(gate_unit.GateStillRunning) as info:
            gate_unit.refuse_while_running(
                "run-8", "restore what run run-8 replaced", systemctl=str(bin_dir / "systemctl")
            )
        assert info.value.exit_code == 75
        assert "the gate of run run-8 still runs as specdeploy-gate-run-8.service: not going to restore" in (
            info.value.message
        )
        assert "gate-wait --run-id run-8" in (info.value.hint or "")
    finally:
        gate.kill()
        gate.wait()
    gate_unit.refuse_while_running("run-8", "restore", systemctl=str(bin_dir / "systemctl"))  # ended: allowed
    # a host not booted with systemd: systemctl answers nothing but its complaint
    unbooted = tmp_path / "unbooted" / "systemctl"
    unbooted.parent.mkdir()
    unbooted.write_text(f"#!{sys.executable}\nimport sys\nsys.exit('System has not been booted with systemd')\n")
    unbooted.chmod(0o755)
    gate_unit.refuse_while_running("run-8", "restore", systemctl=str(unbooted))
