"""The playbook and roles: ansible-lint's production profile clean and a syntax check."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent
ENV = {**os.environ, "ANSIBLE_CONFIG": str(ROOT / "ansible" / "ansible.cfg")}


def test_ansible_lint_production_profile() -> None:
    done = subprocess.run(
        [str(BIN / "ansible-lint"), "--profile", "production", "--nocolor"],
        cwd=ROOT / "ansible", capture_output=True, text=True, env=ENV,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]


def test_playbook_syntax() -> None:
    done = subprocess.run(
        [str(BIN / "ansible-playbook"), "--syntax-check", "deploy.yml"],
        cwd=ROOT / "ansible", capture_output=True, text=True, env=ENV,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr


def test_every_stage_is_tagged() -> None:
    import yaml

    play = yaml.safe_load((ROOT / "ansible" / "deploy.yml").read_text())[0]
    assert play["serial"] == 1 and play["any_errors_fatal"] is True
    tags = {r["role"]: r["tags"] for r in play["roles"]}
    assert all(tags[role] for role in tags) and list(tags) == [
        "specdeploy",
        "preflight",
        "gpu_runtime",
        "images",
        "weights",
        "drafter_config",
        "engine",
        "smoke_gate",
    ]


def test_the_a6000_play_lists_every_stage_for_the_example_inventory() -> None:
    """What `-l a6000` would run, rendered without touching a host: the inventory parses,
    both GPU hosts are selected, and every stage's tasks are present under its tag."""
    done = subprocess.run(
        [str(BIN / "ansible-playbook"), "deploy.yml", "-i", "inventory/example.yml", "-l", "a6000",
         "--list-hosts", "--list-tasks"],
        cwd=ROOT / "ansible", capture_output=True, text=True, env=ENV,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    assert "gpu-a6000-01.example.internal" in done.stdout and "gpu-a6000-02.example.internal" in done.stdout
    assert "specdeploy-rehearsal" not in done.stdout.split("tasks:", 1)[0]
    for task in (
        "preflight : Check the host against the profile",
        "gpu_runtime : Generate the CDI spec (nvidia.com/gpu=all)",
        "images : Build, pull or load the image and check its labels",
        "weights : Fetch and verify weights at the pinned commits",
        "drafter_config : Verify the downloaded drafter config",
        "engine : Install the engine unit rendered from the profile",
        "smoke_gate : Gate the new stack (startup log, smoke; on failure roll back and prove the previous stack)",
    ):
        assert task in done.stdout, task


def _tasks() -> list[tuple[str, dict]]:
    """(role, task) for every task in every role, blocks flattened."""
    import yaml

    found = []

    def walk(role: str, tasks: list[dict]) -> None:
        for task in tasks or []:
            found.append((role, task))
            walk(role, task.get("block", []))

    for path in sorted((ROOT / "ansible" / "roles").glob("*/tasks/main.yml")):
        walk(path.parts[-3], yaml.safe_load(path.read_text()))
    return found


def _argv(task: dict) -> list[str]:
    command = task.get("ansible.builtin.command") or {}
    argv = command.get("argv", []) if isinstance(command, dict) else []
    return [str(a) for a in argv] if isinstance(argv, list) else [str(argv)]


def test_exactly_one_task_reads_the_profile_and_every_role_uses_its_facts() -> None:
    readers = [
        (role, task["name"])
        for role, task in _tasks()
        if "facts" in _argv(task) or ("profile" in _argv(task) and "show" in _argv(task))
    ]
    assert readers == [("specdeploy", "Read the deployment facts (profile values, host paths, engine unit)")]
    reader = next(task for _, task in _tasks() if task.get("name") == readers[0][1])
    assert reader["delegate_to"] == "localhost" and "always" in reader["tags"]
    roles_text = "".join(p.read_text() for p in (ROOT / "ansible" / "roles").glob("*/tasks/main.yml"))
    assert "from_json).engine" not in roles_text and "profile show" not in roles_text


def test_the_smoke_gate_role_is_one_call_to_specdeploy_gate() -> None:
    commands = [_argv(task) for role, task in _tasks() if role == "smoke_gate" and "ansible.builtin.command" in task]
    assert len(commands) == 1 and commands[0][1] == "gate", commands
    gate_yaml = (ROOT / "ansible" / "roles" / "smoke_gate" / "tasks" / "main.yml").read_text()
    assert "from_json" not in gate_yaml and "slurp" not in gate_yaml  # parses nothing
