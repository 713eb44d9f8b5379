"""The container rehearsal's rig: one disposable Debian trixie host running podman itself (nested),
the gated hub, the site registry, and what a play needs from the controller. Shared for the session
(tests/integration/conftest.py): test_container_rehearsal.py deploys it, test_migration.py then moves
its deployment to a second host (the deployment it leaves is OLD)."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from tests.support import canary

from specdeploy.core import progress
from specdeploy.core.keeper import new_run_id
from specdeploy.profile import load_profile
from specdeploy.rehearsal import deploy, engine_image, hosts, hub, registry

HOST_NAME, SSH_PORT, HOST_IP = "specdeploy-container-host", 2340, "10.89.64.30"
PROFILE = "cpu-rehearsal-container"  # the tiny fixtures: the chains keep them (the main job serves the real model)
TOKEN = canary.new_canary("hf_CANARYtoken")
API_KEY = canary.new_canary("sk-CANARYkey")


@dataclass
class Rig:
    """The shared host, the hub, and everything a play needs from the controller."""

    host: hosts.Host
    served: hub.Hub
    site: registry.Registry  # the site registry: the base by its digest (and, last, the image built once)
    wheels: Path
    # the engine image as an archive, kept once per cache key (engine_image.archive_key): loaded
    # when there (`images_source: archive`, as an air-gapped site), else built on the host and kept
    engine_archive: Path
    profiles: Path  # the profile pinned at the hub's commits
    vault: deploy.Vault  # the canary token and key, in an ansible-vault file as a site keeps them
    logs: Path  # every play's -vvv output and the controller's ssh argv log
    ssh: Path
    recording: str  # the host's argv logger, as inventory variables
    # "archive" when a run before this one kept the image for this key, else "build" (and keep it)
    images_source: str
    plays: int = 0


@contextlib.contextmanager
def started(work: Path) -> Iterator[Rig]:
    """The hub, the site registry and the container host, started (the host stopped on exit)."""
    profile = load_profile(PROFILE)
    site = registry.start_registry()
    base = engine_image.base_in_registry(profile, registry=site.address, cert_dir=site.cert_dir)
    wheels = deploy.wheelhouse(PROFILE)
    vault = deploy.rehearsal_vault(work / "secrets", token=TOKEN, api_key=API_KEY)
    # the chains' drafter and the main job's (the real model's, deployed at the end of the migration chain)
    gated = [p.drafter.repo for p in (profile, load_profile(deploy.PROFILE)) if p.drafter]
    with hub.hub(token=TOKEN, gated=gated) as served:
        profiles = deploy.pinned_profile(profile, served.commits, work / "profiles", base=base).parent
        pinned = load_profile(profiles / f"{PROFILE}.yaml")
        key = engine_image.archive_key(pinned, context=deploy.checkout(), wheels=wheels)
        hub.ensure_network()
        host = hosts.start(
            HOST_NAME,
            SSH_PORT,
            work,
            image=hosts.host_image(),
            containers=True,
            network=hosts.Network(hub.NETWORK, HOST_IP),
        )
        try:
            logs = work / "logs"
            logs.mkdir()
            yield Rig(
                host=host,
                served=served,
                site=site,
                wheels=wheels,
                engine_archive=engine_image.engine_archive(pinned, key),
                images_source="archive" if engine_image.engine_archive(pinned, key).is_file() else "build",
                profiles=profiles,
                vault=vault,
                logs=logs,
                ssh=canary.ssh_wrapper(logs),
                recording=canary.install_argv_logger(host),
            )
        finally:
            hosts.stop(HOST_NAME)


def _play_argv(
    rig: Rig, run_id: str, profiles: Path | None, images: dict[str, str] | None, vars_file: Path | None = None
) -> list[str]:
    recording = dict(item.split("=", 1) for item in rig.recording.split())
    argv = deploy.playbook_argv(
        rig.host,
        rig.logs.parent / "hosts.ini",
        wheels=rig.wheels,
        archive=None,
        run_id=run_id,
        profile=PROFILE,
        profiles=profiles or rig.profiles,
        extra_vars={
            "weights_source": "hub",
            "weights_hf_endpoint": rig.served.endpoint_in_network,
            "weights_hf_ca_src": str(rig.served.ca),
            # the site registry's CA: the base the host build starts from comes from there by its digest
            "images_registry": rig.site.address,
            "images_registry_ca_src": str(rig.site.ca),
            **(images or {"images_source": rig.images_source, "images_archive_src": str(rig.engine_archive)}),
            "ansible_ssh_executable": str(rig.ssh),
        },
        vault=rig.vault,
        host_vars=recording,
    )
    # a secret's override (a rotated key) from a root-only file, never on the command line
    return [*argv, *(["-e", f"@{vars_file}"] if vars_file is not None else []), "-vvv"]


def play(
    rig: Rig, *, profiles: Path | None = None, images: dict[str, str] | None = None, vars_file: Path | None = None
) -> tuple[progress.Timed, dict | None]:
    """One play (-vvv, kept for the canary search), and its own gate report from the host."""
    run_id = new_run_id()
    run = deploy.run_playbook(_play_argv(rig, run_id, profiles, images, vars_file), capture=True)
    rig.plays += 1
    (rig.logs / f"play-{rig.plays}-vvv.log").write_text(run.stdout + run.stderr)
    return run, deploy.gate_report(rig.host, run_id)


def start_play(rig: Rig, *, profiles: Path | None = None) -> tuple[subprocess.Popen[bytes], str, Path]:
    """One play started in the background, as a controller of its own (its own session: killing its
    process group is the controller's machine dying): the process, its run id and its -vvv log (kept
    for the canary search)."""
    run_id = new_run_id()
    rig.plays += 1
    log = rig.logs / f"play-{rig.plays}-vvv.log"
    env = {**os.environ, "ANSIBLE_CONFIG": str(deploy.checkout() / "ansible" / "ansible.cfg")}
    with log.open("wb") as sink:
        process = subprocess.Popen(
            _play_argv(rig, run_id, profiles, None), cwd=deploy.checkout() / "ansible", env=env,
            stdout=sink, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True,
        )  # fmt: skip
    return process, run_id, log


def controller_processes(run_id: str) -> list[int]:
    """The pids of every process of the play of `run_id` (its command line carries the run id)."""
    mark = f"specdeploy_run_id={run_id}".encode()
    pids = []
    for proc in Path("/proc").iterdir():
        if proc.name.isdigit() and int(proc.name) != os.getpid():
            with contextlib.suppress(OSError):
                if mark in (proc / "cmdline").read_bytes().split(b"\0"):
                    pids.append(int(proc.name))
    return pids


def kill_controller(process: subprocess.Popen[bytes], run_id: str, *, within_s: float = 10) -> list[int]:
    """The controller's machine dying mid-play: SIGKILL to the play's process group and to the group of
    each of Ansible's workers (with their SSH connections), which leave it (ansible-core's WorkerProcess
    calls os.setsid(); one left alive slept for good beside the next test run). Returns the play's
    processes still there `within_s` later (none, when the kill reached them all)."""
    os.killpg(process.pid, signal.SIGKILL)
    for pid in controller_processes(run_id):  # each worker leads a group of its own, its SSH connections in it
        with contextlib.suppress(ProcessLookupError):
            os.killpg(os.getpgid(pid), signal.SIGKILL)
    process.wait(30)
    deadline = time.monotonic() + within_s
    while (left := controller_processes(run_id)) and time.monotonic() < deadline:
        time.sleep(0.1)
    return left
