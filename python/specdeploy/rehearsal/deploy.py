"""The main job: `ansible-playbook deploy.yml -l rehearsal` against a disposable systemd host.

Everything the play needs from the controller is prepared here and cached: a wheelhouse
(the hosts install exactly it, offline), the fixture weights as an archive directory, and
the host itself (booted when missing, reused when running). The play's own gate decides;
this run's report (`<state>/runs/<run-id>/gate.json`, the run id chosen here and handed to
the play) is read back from the host — never an earlier run's.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from specdeploy.core import layout
from specdeploy.core.cache import cache_dir
from specdeploy.core.errors import SpecdeployError
from specdeploy.gate.run import REPORT, new_run_id
from specdeploy.profile import load_profile
from specdeploy.rehearsal import archive, hosts

ROOT = Path(__file__).resolve().parents[3]
HOST_NAME = "specdeploy-rehearsal"
HOST_SSH_PORT = 2320
# Reproducible wheel bytes: an unchanged checkout gives an identical specdeploy wheel, so a
# re-run copies nothing and reinstalls nothing on the host.
SOURCE_DATE_EPOCH = "315532800"


def checkout() -> Path:
    if not (ROOT / "ansible" / "deploy.yml").is_file():
        raise SpecdeployError(
            f"{ROOT} is not a specdeploy checkout (no ansible/deploy.yml)",
            hint="run the rehearsal deploy from a clone of the repository (pip install -e .)",
        )
    return ROOT


def wheelhouse(*profiles: str) -> Path:
    """The controller-built wheelhouse for rehearsal hosts, keyed by the pins, with the engine
    archive of every venv-runtime profile named (default: cpu-rehearsal); the specdeploy wheel
    in it is rebuilt from the checkout each time (byte-identical when unchanged)."""
    root = checkout()
    inputs = (root / "pyproject.toml").read_bytes() + (root / "scripts" / "wheelhouse.sh").read_bytes()
    dest = cache_dir() / f"wheelhouse-{hashlib.sha256(inputs).hexdigest()[:12]}"
    env = {**os.environ, "SOURCE_DATE_EPOCH": SOURCE_DATE_EPOCH}
    script = ["bash", str(root / "scripts" / "wheelhouse.sh"), str(dest)]
    for name in profiles or ("cpu-rehearsal",):
        engine = load_profile(name).engine
        spec = engine.requirement()
        if spec and not (dest / "engines" / f"{engine.venv_name()}.tar").is_file():
            print(f"wheelhouse: downloading the engine {spec} (once)", file=sys.stderr)
            subprocess.run([*script, "--engine", spec], check=True, env=env, stdout=subprocess.DEVNULL)
    if not (dest / ".complete").exists():
        subprocess.run(script, check=True, env=env, stdout=subprocess.DEVNULL)
        (dest / ".complete").touch()
        return dest
    with tempfile.TemporaryDirectory() as tmp:
        argv = [sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation", "-w", tmp, str(root)]
        subprocess.run(argv, check=True, env=env)
        (built,) = Path(tmp).glob("specdeploy-*.whl")
        current = dest / built.name
        if not (current.is_file() and current.read_bytes() == built.read_bytes()):
            for old in dest.glob("specdeploy-*.whl"):
                old.unlink()
            shutil.move(built, current)
    return dest


def weights() -> Path:
    """The rehearsal's fixture models laid out as <org>/<name>/<revision> with their manifest,
    as one tar (the archive the play unpacks)."""
    dest = cache_dir() / "rehearsal-weights"
    archive.export(dest)
    return archive.pack(dest, cache_dir() / "rehearsal-weights.tar")


def host() -> hosts.Host:
    """The disposable rehearsal host: reused when it runs and answers SSH, booted otherwise."""
    state = cache_dir() / "rehearsal-host"
    state.mkdir(parents=True, exist_ok=True)
    found = hosts.running(HOST_NAME, HOST_SSH_PORT, state / f"{HOST_NAME}_ed25519")
    if found is not None:
        return found
    print(f"booting the disposable rehearsal host {HOST_NAME} (ssh on 127.0.0.1:{HOST_SSH_PORT})", file=sys.stderr)
    return hosts.start(HOST_NAME, HOST_SSH_PORT, state, image=hosts.rehearsal_host_image())


def playbook_argv(
    target: hosts.Host,
    inventory: Path,
    *,
    wheels: Path,
    archive: Path,
    run_id: str,
    profile: str = "cpu-rehearsal",
    profiles: Path | None = None,
    extra_vars: dict[str, str] | None = None,
    vars_file: Path | None = None,
) -> list[str]:
    """The play's command line; secrets (an API key) go in `vars_file` (mode 0600), never in argv."""
    inventory.write_text(f"[rehearsal]\n{target.inventory_line()}\n")
    variables = {
        "specdeploy_profile": profile,
        "specdeploy_profiles_src": str(profiles or checkout() / "profiles"),
        "specdeploy_wheelhouse_src": str(wheels),
        "specdeploy_run_id": run_id,
        "weights_source": "archive",
        "weights_archive_src": str(archive),
    } | (extra_vars or {})
    argv = [
        str(Path(sys.executable).parent / "ansible-playbook"),
        "deploy.yml",
        "-i",
        str(inventory),
        "-l",
        "rehearsal",
    ]
    for key, value in variables.items():
        argv += ["-e", f"{key}={value}"]
    if vars_file is not None:
        argv += ["-e", f"@{vars_file}"]
    return argv


def run_playbook(argv: list[str], *, capture: bool) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "ANSIBLE_CONFIG": str(checkout() / "ansible" / "ansible.cfg")}
    return subprocess.run(argv, cwd=checkout() / "ansible", capture_output=capture, text=True, env=env)


def gate_report(target: hosts.Host, run_id: str, state: Path | None = None) -> dict[str, Any] | None:
    """Run `run_id`'s gate report, read from the host; None when the play never reached the gate."""
    path = layout.HostLayout.of(state=state).runs / run_id / REPORT
    done = target.ssh(f"cat {path}", check=False)
    return json.loads(done.stdout) if done.returncode == 0 and done.stdout.strip() else None


@dataclass
class MainJob:
    run_id: str
    playbook_exit: int
    report: dict[str, Any] | None


def main_job(*, remove_host: bool = False) -> MainJob:
    """Deploy `cpu-rehearsal` to the disposable host (booted when missing) and read this run's gate report."""
    wheels, weights_dir, target = wheelhouse(), weights(), host()
    inventory = cache_dir() / "rehearsal-host" / "inventory.ini"
    run_id = new_run_id()
    argv = playbook_argv(target, inventory, wheels=wheels, archive=weights_dir, run_id=run_id)
    print(f"ansible-playbook deploy.yml -l rehearsal (inventory {inventory}, run {run_id})", file=sys.stderr)
    played = run_playbook(argv, capture=False)
    report = gate_report(target, run_id)
    if remove_host:
        hosts.stop(target.name)
    return MainJob(run_id, played.returncode, report)
