"""The main job: `ansible-playbook deploy.yml -l rehearsal` against a disposable systemd host.

Everything the play needs from the controller is prepared here and cached: a wheelhouse
(the hosts install exactly it, offline), the fixture weights as an archive directory, and
the host itself (booted when missing, reused when running). The play's own smoke gate
decides; its report is read back from the host and printed.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from specdeploy.cache import cache_dir
from specdeploy.errors import SpecdeployError
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


def wheelhouse() -> Path:
    """The controller-built wheelhouse for rehearsal hosts, keyed by the pins; the specdeploy
    wheel in it is rebuilt from the checkout each time (byte-identical when unchanged)."""
    root = checkout()
    inputs = (root / "pyproject.toml").read_bytes() + (root / "scripts" / "wheelhouse.sh").read_bytes()
    dest = cache_dir() / f"wheelhouse-{hashlib.sha256(inputs).hexdigest()[:12]}"
    env = {**os.environ, "SOURCE_DATE_EPOCH": SOURCE_DATE_EPOCH}
    if not (dest / ".complete").exists():
        subprocess.run(["bash", str(root / "scripts" / "wheelhouse.sh"), str(dest), "rehearsal"], check=True, env=env)
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
    """The rehearsal's fixture models laid out as <org>/<name> (the archive the play copies)."""
    dest = cache_dir() / "rehearsal-weights"
    archive.export(dest)
    return dest


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
    profile: str = "cpu-rehearsal",
    profiles: Path | None = None,
) -> list[str]:
    inventory.write_text(f"[rehearsal]\n{target.inventory_line()}\n")
    return [
        str(Path(sys.executable).parent / "ansible-playbook"), "deploy.yml", "-i", str(inventory), "-l", "rehearsal",
        "-e", f"specdeploy_profile={profile}",
        "-e", f"specdeploy_profiles_src={profiles or checkout() / 'profiles'}",
        "-e", f"specdeploy_wheelhouse_src={wheels}",
        "-e", "weights_source=archive", "-e", f"weights_archive_src={archive}",
    ]  # fmt: skip


def run_playbook(argv: list[str], *, capture: bool) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "ANSIBLE_CONFIG": str(checkout() / "ansible" / "ansible.cfg")}
    return subprocess.run(argv, cwd=checkout() / "ansible", capture_output=capture, text=True, env=env)
