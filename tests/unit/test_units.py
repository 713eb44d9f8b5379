"""`specdeploy unit`: rendering needs what the profile cannot know (the image digest) and
installing reports a change only when the unit text changes. The units themselves are
checked by systemd and quadlet on a real host in tests/integration/test_units_on_host.py."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from tests.support.units import exec_argv

from specdeploy.engine import args as engine_args
from specdeploy.engine import units
from specdeploy.profile import load_profile


def test_unit_cli_renders_and_installs(cli: Any, tmp_path: Path) -> None:
    """`specdeploy unit`: GPU profiles need an image; install reports change for Ansible."""
    missing = cli("unit", "render", "--profile", "a6000-dflash")
    assert missing.exit_code == 1 and "pass the image reference" in missing.stderr
    rendered = cli(
        "unit", "render", "--profile", "a6000-mtp", "--image", "localhost/specdeploy/sglang@sha256:" + "1" * 64
    )
    assert rendered.exit_code == 0
    # GPU-host blocker 11: only the GPUs tensor parallelism (2) needs, never every GPU of the host
    devices = [line for line in rendered.stdout.splitlines() if line.startswith("AddDevice=")]
    assert devices == ["AddDevice=nvidia.com/gpu=0", "AddDevice=nvidia.com/gpu=1"]
    first = json.loads(cli("unit", "install", tmp_path, "--profile", "cpu-rehearsal").stdout)
    again = json.loads(cli("unit", "install", tmp_path, "--profile", "cpu-rehearsal").stdout)
    assert (first["changed"], again["changed"]) == (True, False)
    assert first["path"].endswith("specdeploy-engine.service")


def test_exec_line_round_trips_every_argument() -> None:
    """Quoting survives JSON with quotes, spaces, % and $ (systemd specifiers/expansion)."""
    argv = engine_args.render(load_profile("a6000-dflash"), model="/models/x y", drafter="/serving/%d$HOME").argv
    line = "ExecStart=" + units._exec_line(argv)
    assert '"/models/x y"' in line and "/serving/%%d$$HOME" in line
    assert exec_argv(line) == argv


def test_a_container_engine_is_published_on_loopback_unless_the_host_says_otherwise(cli: Any) -> None:
    """GPU-host blocker 5: the port was published on the profile's serve.host, 0.0.0.0, leaving
    the routes vLLM's key does not guard (/metrics, /tokenize, /invocations) open to the network."""
    profile = load_profile("a6000-dflash")
    image = f"{profile.engine.image.name}@sha256:{'0' * 64}"
    assert profile.engine.serve.host == "0.0.0.0"  # inside the container, all interfaces
    default = units.render(profile, image=image).text
    assert "PublishPort=127.0.0.1:8000:8000" in default and "PublishPort=0.0.0.0" not in default
    exposed = cli("unit", "render", "--profile", "a6000-dflash", "--image", image, "--publish-host", "10.1.2.3")
    assert "PublishPort=10.1.2.3:8000:8000" in exposed.stdout
    facts = json.loads(cli("facts", "--profile", "a6000-dflash", "--publish-host", "10.1.2.3").stdout)
    assert facts["unit"]["publish_host"] == "10.1.2.3"
    assert json.loads(cli("facts", "--profile", "a6000-dflash").stdout)["unit"]["publish_host"] == "127.0.0.1"
