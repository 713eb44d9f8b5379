"""The plays of ansible/deploy.yml, by what they do: the front door's play comes first, the engine
hosts' (the stages, the gate) after it."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[2]
ENGINE_PLAY = "Deploy a specdeploy stack"
FRONT_PLAY = "Install the site's front door"


def plays(name: str = "deploy.yml") -> list[dict[str, Any]]:
    return yaml.safe_load((ROOT / "ansible" / name).read_text())


def play(title: str, name: str = "deploy.yml") -> dict[str, Any]:
    """The play of that name in the playbook."""
    return next(p for p in plays(name) if p["name"] == title)


def engine_play() -> dict[str, Any]:
    return play(ENGINE_PLAY)


HOLD_BLOCK = "Deploy this host, holding it alone"


def host_tasks() -> list[dict[str, Any]]:
    """The engine play's tasks in order, its hold block (every task after the CLI's install, run
    holding the host's deploy lock) opened: what runs on each host, the lock's acquire first."""
    tasks = engine_play()["tasks"]
    hold = next(t for t in tasks if t.get("name") == HOLD_BLOCK)
    return [t for t in tasks if t is not hold] + hold["block"]
