"""The command line's single error boundary: a bad input is a message, a hint and its exit
code; a bug is one line and exit 70, with the traceback only under --debug."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from specdeploy.cli import app
from specdeploy.core.errors import EXIT_INTERNAL
from specdeploy.profile import facts


def _boom(*args: Any, **kwargs: Any) -> Any:
    raise RuntimeError("boom in the facts")


def test_an_unexpected_exception_is_one_line_and_exit_70(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(facts, "deploy_facts", _boom)
    monkeypatch.setattr("specdeploy.cli.profile.deploy_facts", _boom)
    result = CliRunner().invoke(app, ["facts", "--profile", "cpu-rehearsal"])
    assert result.exit_code == EXIT_INTERNAL == 70
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert "internal error in specdeploy facts: RuntimeError: boom in the facts" in lines[0]
    assert "--debug" in lines[0] and "Traceback" not in result.stderr


def test_debug_adds_the_traceback(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("specdeploy.cli.profile.deploy_facts", _boom)
    result = CliRunner().invoke(app, ["--debug", "facts", "--profile", "cpu-rehearsal"])
    assert result.exit_code == 70
    assert "Traceback (most recent call last)" in result.stderr and "boom in the facts" in result.stderr


def test_a_bad_input_is_a_message_a_hint_and_its_exit_code() -> None:
    result = CliRunner().invoke(app, ["profile", "show", "no-such-profile"])
    assert result.exit_code == 2  # ProfileError
    assert result.stderr.startswith("error: no profile named 'no-such-profile'")
    assert "fix: known profiles:" in result.stderr and "Traceback" not in result.stderr


def test_a_nested_command_is_named_in_an_internal_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("specdeploy.cli.profile.list_profiles", _boom)
    result = CliRunner().invoke(app, ["profile", "list"])
    assert result.exit_code == 70 and "internal error in specdeploy profile list: RuntimeError" in result.stderr


def test_python_dash_m_specdeploy_is_the_cli() -> None:
    done = subprocess.run([sys.executable, "-m", "specdeploy", "--help"], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert "gate" in done.stdout and "facts" in done.stdout


def test_facts_take_the_inventorys_path_overrides(tmp_path: Path) -> None:
    """What the roles read: every path already joined, the overrides applied, the rest default."""
    argv = ["facts", "--profile", "cpu-rehearsal", "--models-dir", "/data/models", "--serving-dir", "/srv/serving"]
    result = CliRunner().invoke(app, argv)
    assert result.exit_code == 0, result.stderr
    data = json.loads(result.stdout)
    assert data["paths"]["models"] == "/data/models"
    assert data["paths"]["target_serving"] == "/srv/serving/target"
    assert data["paths"]["drafter_source"] == "/srv/serving/drafter-source"
    assert data["paths"]["lock"] == "/var/lib/specdeploy/state/specdeploy.lock"
    assert data["unit"] == {
        "name": "specdeploy-engine",
        "file": "/etc/systemd/system/specdeploy-engine.service",
        "dir": "/etc/systemd/system",
        "user": "specdeploy",
        "uid": 10001,
        "user_home": "/var/lib/specdeploy/home",
        "publish_host": "127.0.0.1",
        # both runtimes' unit files (decommission.yml removes whichever is there)
        "files": [
            "/etc/containers/systemd/specdeploy-engine.container",
            "/etc/systemd/system/specdeploy-engine.service",
        ],
    }
    quadlet = json.loads(CliRunner().invoke(app, ["facts", "--profile", "a6000-dflash"]).stdout)
    assert quadlet["unit"]["dir"] == "/etc/containers/systemd" and quadlet["profile"]["container"] is True
    assert quadlet["profile"]["gated_repos"] == ["z-lab/Qwen3.6-27B-DFlash"]


def test_a_profile_with_host_paths_is_refused_naming_the_inventory_variables(tmp_path: Path) -> None:
    from specdeploy.profile import resolve_profile_path

    text = resolve_profile_path("cpu-rehearsal").read_text() + "\npaths:\n  models_dir: /data\n"
    (tmp_path / "cpu-rehearsal.yaml").write_text(text)
    result = CliRunner().invoke(app, ["profile", "show", str(tmp_path / "cpu-rehearsal.yaml")])
    assert result.exit_code == 2
    assert "field paths" in result.stderr and "specdeploy_models_dir" in result.stderr


def test_the_token_is_read_from_stdin_and_an_empty_line_means_none(monkeypatch: Any) -> None:
    """`--token-stdin` (how Ansible hands the token over) reads one line; nothing else is read."""
    import io

    from specdeploy.weights.fetch import read_token

    monkeypatch.setenv("HF_TOKEN", "hf_from_environment")
    monkeypatch.setattr("sys.stdin", io.StringIO("hf_from_stdin\nnext line\n"))
    assert read_token(None, from_stdin=True) == "hf_from_stdin"
    monkeypatch.setattr("sys.stdin", io.StringIO("\n"))
    assert read_token(None, from_stdin=True) is None  # stdin wins, even empty: never the environment
