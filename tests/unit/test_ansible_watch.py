"""The watch role (ansible/roles/watch), run for real on localhost with the real host CLI (this
checkout's `specdeploy`) and the facts `specdeploy facts` prints, every host path moved into a
temporary directory. What is not real: systemd. The role's last task (enable and start the timer)
needs it; the timer is renamed to one no systemd has, so that task fails on any machine and the
play stops there, after everything else was written. Where it is placed in deploy.yml is read
from the playbook itself."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

from tests.support.playbooks import host_tasks

from specdeploy.core import layout
from specdeploy.profile import load_profile, resolve_profile_path
from specdeploy.profile.facts import deploy_facts

ROOT = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent
ENV = {
    **os.environ,
    "ANSIBLE_CONFIG": str(ROOT / "ansible" / "ansible.cfg"),
    "ANSIBLE_ROLES_PATH": str(ROOT / "ansible" / "roles"),
}
NO_SUCH_TIMER = "specdeploy-watch-test-no-such.timer"
START_TASK = "Enable and start the light gate's timer"


def _play(tmp_path: Path, **extra: Any) -> tuple[subprocess.CompletedProcess[str], dict[str, Any]]:
    host = layout.local_layout(tmp_path / "host")
    facts = deploy_facts(load_profile("cpu-rehearsal"), host, layout.InstallLayout(root=tmp_path / "opt"))
    facts["install"]["cli"] = str(BIN / "specdeploy")
    facts["profile"]["file"] = str(resolve_profile_path("cpu-rehearsal"))
    # this machine has no light-gate account: the role gives its directory to root here
    facts["watch"] |= {"unit_dir": str(tmp_path / "systemd"), "timer": NO_SUCH_TIMER, "user": "root"}
    playbook = tmp_path / "watch.yml"
    playbook.write_text("- hosts: localhost\n  connection: local\n  gather_facts: false\n  roles: [watch]\n")
    variables = tmp_path / "vars.json"
    settings = {
        "specdeploy_facts": facts,
        "watch_textfile": str(tmp_path / "tf" / "x.prom"),
        # the play's directory is the temporary one: the bundle's rules by their checkout path
        "watch_alert_rules_src": str(ROOT / "monitoring" / "alerts.yml"),
    }
    variables.write_text(json.dumps(settings | extra))
    done = subprocess.run(
        [str(BIN / "ansible-playbook"), str(playbook), "-e", f"@{variables}"],
        cwd=ROOT / "ansible", capture_output=True, text=True, env=ENV,
    )  # fmt: skip
    return done, facts


def test_the_watch_role_writes_the_settings_the_rules_and_the_units_from_the_profile(tmp_path: Path) -> None:
    hook = tmp_path / "page-oncall"
    hook.write_text("#!/bin/sh\nexit 0\n")
    hook.chmod(0o755)
    done, facts = _play(tmp_path, watch_hook=str(hook))
    assert f"TASK [watch : {START_TASK}]" in done.stdout, done.stdout[-3000:]
    assert done.stdout.split(f"TASK [watch : {START_TASK}]", 1)[1].count("fatal:") == 1  # no systemd timer here
    before_start = done.stdout.split(f"TASK [watch : {START_TASK}]", 1)[0]
    assert "fatal:" not in before_start and "Check the light gate's host settings" in before_start
    settings = json.loads(Path(facts["watch"]["config"]).read_text())
    assert settings == {"textfile": str(tmp_path / "tf" / "x.prom"), "hook": [str(hook)], "hook_timeout_s": 60.0}
    assert (tmp_path / "tf").is_dir()
    assert Path(facts["watch"]["alert_rules"]).read_text() == (ROOT / "monitoring" / "alerts.yml").read_text()
    service = (tmp_path / "systemd" / "specdeploy-watch.service").read_text()
    timer = (tmp_path / "systemd" / "specdeploy-watch.timer").read_text()
    assert f"ExecStart={BIN / 'specdeploy'} watch run --state-dir {tmp_path / 'host'}" in service
    # its own account, never root (test_watch.py: the key as a credential, for a profile with one)
    assert "User=specdeploy-watch\nGroup=specdeploy-watch\n" in service and "LoadCredential" not in service
    assert f"OnUnitActiveSec={load_profile('cpu-rehearsal').watch.interval_s}" in timer


def test_the_watch_role_stops_the_deploy_on_a_hook_that_cannot_run(tmp_path: Path) -> None:
    done, _ = _play(tmp_path, watch_hook=["relative/page-oncall", "--now"])
    assert "Check the light gate's host settings" in done.stdout and done.returncode != 0
    text = " ".join(done.stdout.split())
    assert "expected the program's absolute path first, found 'relative/page-oncall'" in text, done.stdout[-3000:]
    assert START_TASK not in done.stdout


def test_the_watch_stage_comes_after_the_gate_and_the_lock_merge() -> None:
    """A stack is watched only once its gate passed (a failed gate fails the host in the block's
    rescue), and the light gate's settings never keep the site's lock from being merged."""
    tasks = host_tasks()
    names = [t.get("ansible.builtin.import_role", {}).get("name") or ("block" if "block" in t else None) for t in tasks]
    lock_back = next(
        i for i, t in enumerate(tasks) if t.get("ansible.builtin.import_role", {}).get("tasks_from") == "lock_back.yml"
    )
    assert names.index("watch") > lock_back > names.index("block")
    assert tasks[names.index("watch")]["tags"] == ["watch"]
