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
        "smoke_gate : Check the drafter's auxiliary layers in the engine's startup log",
        "smoke_gate : Restore what this run replaced and prove the previous stack serves",
    ):
        assert task in done.stdout, task
