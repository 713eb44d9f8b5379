"""The smoke_gate role run for real (ansible-playbook on localhost) against a stand-in `specdeploy`
CLI: the role starts the gate detached, then retries `gate-wait --for` while it exits 75 (the gate
still runs), and ends on the gate's own exit code. The stand-in only plays the CLI's exit codes and
lines; the real CLI behind them (a unit started, its looks, its report) is tests/unit/test_gate_unit.py's,
and the whole path on a real systemd host is tests/integration/test_container_rehearsal.py's."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from specdeploy.core import layout
from specdeploy.profile import load_profile
from specdeploy.profile.facts import deploy_facts

ROOT = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent

STAND_IN = """#!{python}
import pathlib, sys
calls = pathlib.Path({calls!r})
with calls.open("a") as log:
    log.write(" ".join(sys.argv[1:]) + "\\n")
if sys.argv[1] == "gate":
    print("gate: started as specdeploy-gate-run-1.service")
    sys.exit(0)
looks = sum(1 for line in calls.read_text().splitlines() if line.startswith("gate-wait"))
if looks <= {running}:
    print(f"unit active; 12:00:0{{looks}} gate: {{looks * 15}}s, last: smoke: coherence prompts {{looks}}/12")
    sys.exit(75)
print("gate: {verdict} (exit {code}) in 45s")
sys.exit({code})
"""


def _play(
    tmp_path: Path, *, running: int, code: int, attempts: int = 5, without_package: bool = False
) -> tuple[subprocess.CompletedProcess[str], list[str]]:
    calls = tmp_path / "calls"
    cli = tmp_path / "specdeploy"
    verdict = {0: "pass", 1: "fail"}.get(code, "error")
    cli.write_text(
        STAND_IN.format(python=sys.executable, calls=str(calls), running=running, code=code, verdict=verdict)
    )
    cli.chmod(0o755)
    facts = deploy_facts(load_profile("cpu-rehearsal"), layout.HostLayout(), layout.InstallLayout(root=tmp_path))
    facts["install"]["cli"] = str(cli)
    facts["gate"]["attempts"] = attempts
    extra = tmp_path / "vars.json"
    extra.write_text(json.dumps({"specdeploy_facts": facts, "specdeploy_run_id": "run-1"}))
    playbook = tmp_path / "gate.yml"
    playbook.write_text("- hosts: localhost\n  connection: local\n  gather_facts: false\n  roles: [smoke_gate]\n")
    env = {**os.environ, "ANSIBLE_CONFIG": str(ROOT / "ansible" / "ansible.cfg"), "ANSIBLE_NOCOLOR": "1",
           "ANSIBLE_ROLES_PATH": str(ROOT / "ansible" / "roles")}  # fmt: skip
    if without_package:  # a controller whose Python cannot import specdeploy (a package of that name that fails)
        hidden = tmp_path / "hidden" / "specdeploy"
        hidden.mkdir(parents=True)
        (hidden / "__init__.py").write_text("raise ImportError('specdeploy hidden by the test')\n")
        env["PYTHONPATH"] = str(hidden.parent)
    done = subprocess.run(
        [str(BIN / "ansible-playbook"), "-i", "localhost,", str(playbook), "-e", f"@{extra}",
         "-e", f"ansible_python_interpreter={sys.executable}"],
        cwd=ROOT / "ansible", capture_output=True, text=True, env=env, timeout=300,
    )  # fmt: skip
    return done, calls.read_text().splitlines()


def test_a_gate_that_passes_after_two_looks_passes_the_role_after_starting_once_and_looking_three_times(
    tmp_path: Path,
) -> None:
    done, calls = _play(tmp_path, running=2, code=0)
    assert done.returncode == 0, done.stdout[-3000:]
    assert [c.split()[0] for c in calls] == ["gate", "gate-wait", "gate-wait", "gate-wait"]
    assert calls[0].endswith("--as-unit --detach") and "--run-id run-1" in calls[0]
    assert all(c.endswith("--for 15") for c in calls[1:])
    assert "gate: pass (exit 0) in 45s" in done.stdout
    # each look that finds the gate running says so, with the gate's own line (ansible.cfg's stdout
    # callback, ansible/callback_plugins/specdeploy_default.py), never Ansible's "FAILED - RETRYING"
    looks = [line for line in done.stdout.splitlines() if line.startswith("waiting: [localhost]: ")]
    task = "Gate the new stack (startup log, smoke; on failure roll back and prove the previous stack)"
    assert looks == [
        f"waiting: [localhost]: unit active; 12:00:0{n} gate: {15 * n}s, last: smoke: coherence prompts {n}/12 "
        f"(attempt {n} of 6: {task})"
        for n in (1, 2)
    ], done.stdout[-3000:]
    assert "FAILED" not in done.stdout
    assert "did not pass on localhost" not in done.stdout and "still runs after" not in done.stdout


def test_without_the_package_on_the_controller_each_look_gets_ansible_s_own_retry_line_and_the_play_still_passes(
    tmp_path: Path,
) -> None:
    """Both plugins take a retry's words from specdeploy.core.progress.retry_words; a controller that
    cannot import it still runs the play, with Ansible's default retry line and no progress lines."""
    done, calls = _play(tmp_path, running=2, code=0, without_package=True)
    assert done.returncode == 0, done.stdout[-3000:]
    assert len(calls) == 4 and "gate: pass (exit 0) in 45s" in done.stdout
    assert "FAILED - RETRYING: [localhost]: Gate the new stack" in done.stdout, done.stdout[-3000:]
    assert not any(line.startswith("waiting: ") for line in done.stdout.splitlines())
    assert "specdeploy_progress: specdeploy is not importable here" in done.stdout + done.stderr
    assert "Failure using method" not in done.stdout + done.stderr  # neither plugin broke on a retry


def test_a_gate_that_fails_fails_the_play_with_its_report_and_exit_code(tmp_path: Path) -> None:
    done, calls = _play(tmp_path, running=1, code=1)
    assert done.returncode != 0
    text = " ".join(done.stdout.split())
    assert "the gate did not pass on localhost (exit 1)" in text, done.stdout[-3000:]
    assert "gate: fail (exit 1) in 45s" in text
    assert "still runs after" not in text
    assert len(calls) == 3


def test_a_gate_that_outlives_the_wait_fails_the_play_saying_it_still_runs_and_how_to_wait_for_it(
    tmp_path: Path,
) -> None:
    """Out of retries, the pinned ansible-core prints an error for the wait task but keeps its failed_when
    (false): the role's next task says what happened (the gate runs on, gate-wait waits for it, the host
    stays held), never "the gate did not pass"."""
    done, calls = _play(tmp_path, running=99, code=0, attempts=2)
    assert done.returncode != 0
    assert len(calls) == 1 + 3  # the start, then attempts + 1 looks
    text = " ".join(done.stdout.split())
    assert "the gate of run run-1 on localhost still runs after the profile's smoke.gate_timeout_s (30 s" in text, (
        done.stdout[-3000:]
    )
    assert "last: unit active; 12:00:03 gate: 45s, last: smoke: coherence prompts 3/12" in text
    assert "`specdeploy gate-wait --run-id run-1` on the host waits for it" in text
    assert "deploy-lock release --run-id run-1" in text
    assert "did not pass on localhost" not in text
