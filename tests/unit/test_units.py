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
from specdeploy.rehearsal import variants


def test_unit_cli_renders_and_installs(cli: Any, tmp_path: Path) -> None:
    """`specdeploy unit`: GPU profiles need an image; install reports change for Ansible."""
    missing = cli("unit", "render", "--profile", "a6000-dflash")
    assert missing.exit_code == 2 and "pass the image reference" in missing.stderr  # bad input (was 1)
    rendered = cli(
        "unit", "render", "--profile", "a6000-mtp", "--image", "localhost/specdeploy/sglang@sha256:" + "1" * 64
    )
    assert rendered.exit_code == 0
    # GPU-host blocker 11: only the GPUs tensor parallelism (2) needs, never every GPU of the host
    devices = [line for line in rendered.stdout.splitlines() if line.startswith("AddDevice=")]
    assert devices == ["AddDevice=nvidia.com/gpu=0", "AddDevice=nvidia.com/gpu=1"]
    # sgl-project/sglang#23859: without the flag NEXTN on Qwen3.5/3.6 serves without speculation, silently
    assert "--speculative-draft-model-path" in rendered.stdout
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


def test_a_container_engine_is_published_on_the_host_s_loopback_only_whatever_the_host_says(cli: Any) -> None:
    """GPU-host blocker 5: the port was published on the profile's serve.host, 0.0.0.0, leaving
    the routes vLLM's key does not guard (/metrics, /tokenize, /invocations) open to the network.
    Issue 35: an engine host behind a front published it on its internal address, open to every host
    of that network; now the host's listener takes that address (front/listener.py), and the unit
    has no way to publish anywhere but loopback."""
    profile = load_profile("a6000-dflash")
    image = f"{profile.engine.image.name}@sha256:{'0' * 64}"
    assert profile.engine.serve.host == "0.0.0.0"  # inside the container, all interfaces
    default = units.render(profile, image=image).text
    published = [line for line in default.splitlines() if line.startswith("PublishPort=")]
    assert published == ["PublishPort=127.0.0.1:8000:8000"]
    refused = cli("unit", "render", "--profile", "a6000-dflash", "--image", image, "--publish-host", "10.1.2.3")
    assert refused.exit_code == 2 and "--publish-host" in refused.output  # no such option any more
    # the facts keep the address: the host's listener takes it
    facts = json.loads(cli("facts", "--profile", "a6000-dflash", "--publish-host", "10.1.2.3").stdout)
    assert facts["unit"]["publish_host"] == "10.1.2.3"
    assert facts["front"]["listener"]["unit"] == "specdeploy-engine-listener"


def test_the_api_key_reaches_each_engine_through_the_launcher_never_the_unit(tmp_path: Path) -> None:
    """GPU-host blocker 4: nothing created the podman secret, the venv unit's `LoadCredential=`
    never reached vLLM, and SGLang (which reads only `--api-key`) ran open. Every unit now starts
    the engine through the launcher and tells it where the key is and how the engine takes it:
    the quadlet mounts the podman secret as a file only the image's user reads, the venv unit
    loads the root-only key file as a credential. The key itself is in no unit."""
    from specdeploy.core import layout
    from specdeploy.engine import launch

    host = layout.HostLayout(state=tmp_path / "state")
    image = "localhost/specdeploy/engine@sha256:" + "1" * 64
    for name, how in (
        ("a6000-dflash", {launch.KEY_ENV_ENV: "VLLM_API_KEY"}),
        ("a6000-mtp", {launch.KEY_ARG_ENV: "--api-key"}),
    ):
        text = units.render(load_profile(name), host=host, image=image).text
        mount = f"{layout.SECRETS_IN_CONTAINER}/specdeploy_api_key"
        assert f"Secret=specdeploy_api_key,type=mount,target={mount},uid={layout.ENGINE_UID},mode=0400" in text
        assert f"Environment={launch.KEY_FILE_ENV}={mount}" in text
        for key, value in how.items():
            assert f"Environment={key}={value}" in text, name
        assert "type=env" not in text and "--api-key" not in text.split("Exec=", 1)[1].split("\n", 1)[0]
        assert f"User={layout.ENGINE_UID}" in text and "RunInit=true" in text
    keyed = engine_args.render(load_profile("a6000-dflash"), model="/m", drafter="/d")
    assert keyed.argv[1] == engine_args.LAUNCHER and keyed.argv[2] == "vllm.entrypoints.openai.api_server"
    # the venv runtime: a credential from the host's key file, the launcher in front of vLLM
    from specdeploy.rehearsal import variants

    profile = variants.derive(
        load_profile("cpu-rehearsal"), "cpu-rehearsal-keyed", {"engine": {"serve": {"api_key": {"secret": "k1"}}}}
    )
    service = units.render(profile, host=host, python="/opt/engine/bin/python").text
    assert f"LoadCredential=k1:{host.secret_file('k1')}" in service
    assert (
        f"Environment={launch.KEY_CREDENTIAL_ENV}=k1" in service
        and f"Environment={launch.KEY_ENV_ENV}=VLLM_API_KEY" in service
    )
    argv = exec_argv(next(line for line in service.splitlines() if line.startswith("ExecStart=")))
    assert argv[:3] == ["/opt/engine/bin/python", engine_args.LAUNCHER, "vllm.entrypoints.openai.api_server"]
    assert "LoadCredential" not in units.render(load_profile("cpu-rehearsal"), host=host, python="/p").text


def test_the_engine_serves_the_target_through_its_serving_link() -> None:
    """GPU-host blocker 10: the target was served straight from its download directory, so a
    rollback after a revision bump restarted the old unit on the new weights. Both units now
    name `<serving>/target`, a link the weights stage flips and the rollback restores."""
    from specdeploy.core import layout

    profile = load_profile("a6000-dflash")
    quadlet = units.render(profile, image=f"{profile.engine.image.name}@sha256:{'0' * 64}").text
    assert f"--model {layout.HostLayout().target_serving} " in quadlet  # mounted at its host path
    service = units.render(load_profile("cpu-rehearsal"), python="/p").text
    assert f"--model {layout.HostLayout().target_serving} " in service


def test_a_stopping_vllm_lets_requests_in_flight_finish_for_the_drain_s_time_and_the_unit_waits_longer() -> None:
    """Issue 23: `migrate finish` stops OLD's engine with vLLM's --shutdown-timeout sized so requests in
    flight finish when the profile sets it (opt-in; 0, vLLM's default, aborts them); the units kill
    only after that time."""
    host = units.layout.HostLayout()
    for name in ("a6000-dflash", "a6000-dflash-stock", "cpu-rehearsal", "cpu-rehearsal-container"):
        profile = load_profile(name)
        wait = engine_args.shutdown_timeout_s(profile)
        chosen = profile.engine.serve.shutdown_timeout_s
        assert wait == (chosen if chosen is not None else 0)
        argv = engine_args.render(profile, model="/m", drafter="/d").engine_args
        assert ("--shutdown-timeout" in argv) == (wait > 0)
        where = {"python": "/p"} if profile.engine.runtime == "venv" else {"image": "img@sha256:" + "0" * 64}
        text = units.render(profile, host=host, **where).text
        stops = [
            int(line.split("=", 1)[1])
            for line in text.splitlines()
            if line.startswith(("TimeoutStopSec=", "StopTimeout="))
        ]
        assert stops and all(stop >= wait + 15 for stop in stops), (name, stops)
    # SGLang has no such flag: none rendered, and its units wait only their margin
    assert engine_args.shutdown_timeout_s(load_profile("a6000-mtp")) == 0
    # a profile that sets it gets that time, and units that wait past it
    drained = variants.derive(
        load_profile("a6000-dflash"), "a6000-drained", {"engine": {"serve": {"shutdown_timeout_s": 900}}}
    )
    assert engine_args.shutdown_timeout_s(drained) == 900
    flags = engine_args.render(drained, model="/m", drafter="/d").engine_args
    assert flags[flags.index("--shutdown-timeout") + 1] == "900"
    assert all(
        int(line.split("=")[1]) > 900
        for line in units.render(drained, host=host, image="i@sha256:" + "0" * 64).text.splitlines()
        if line.startswith(("TimeoutStopSec=", "StopTimeout="))
    )
    sglang = load_profile("a6000-mtp")
    assert "--shutdown-timeout" not in engine_args.render(sglang, model="/m", drafter=None).engine_args
