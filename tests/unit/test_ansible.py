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
