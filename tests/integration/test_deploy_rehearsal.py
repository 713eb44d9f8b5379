"""`ansible-playbook deploy.yml -l rehearsal` over real SSH against a disposable systemd host:
the CLI installed offline from a controller-built wheelhouse, the fixture weights copied,
the drafter verified and written to the serving directory, the engine unit rendered from the
profile and started by systemd, and the smoke gate passing on the host. A second run
changes nothing."""

from __future__ import annotations

import hashlib
import json
import os
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from tests.testhost import Host, boot_host, rehearsal_host_image

from specdeploy.cache import cache_dir

pytestmark = [pytest.mark.testhost, pytest.mark.vllm]
ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def wheelhouse() -> Path:
    inputs = (ROOT / "pyproject.toml").read_bytes() + (ROOT / "scripts" / "wheelhouse.sh").read_bytes()
    key = hashlib.sha256(inputs).hexdigest()[:12]
    dest = cache_dir() / f"wheelhouse-{key}"
    if not (dest / ".complete").exists():
        subprocess.run(["bash", str(ROOT / "scripts" / "wheelhouse.sh"), str(dest), "rehearsal"], check=True)
        (dest / ".complete").touch()
    else:  # the specdeploy wheel itself follows the checkout
        for old in dest.glob("specdeploy-*.whl"):
            old.unlink()
        subprocess.run(
            [
                sys.executable,
                "-m",
                "pip",
                "wheel",
                "-q",
                "--no-deps",
                "--no-build-isolation",
                "-w",
                str(dest),
                str(ROOT),
            ],
            check=True,
        )
    return dest


@pytest.fixture(scope="module")
def host(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Host]:
    with boot_host(
        "specdeploy-rehearsal-host", 2310, tmp_path_factory.mktemp("host"), image=rehearsal_host_image()
    ) as h:
        yield h


def _playbook(host: Host, tmp_path: Path, wheelhouse: Path, weights: Path) -> subprocess.CompletedProcess[str]:
    inventory = tmp_path / "hosts.ini"
    inventory.write_text(f"[rehearsal]\n{host.inventory_line()}\n")
    argv = [
        str(Path(sys.executable).parent / "ansible-playbook"), "deploy.yml", "-i", str(inventory), "-l", "rehearsal",
        "-e", "specdeploy_profile=cpu-rehearsal",
        "-e", f"specdeploy_wheelhouse_src={wheelhouse}", "-e", "weights_source=archive",
        "-e", f"weights_archive_src={weights}",
    ]  # fmt: skip
    env = {**os.environ, "ANSIBLE_CONFIG": str(ROOT / "ansible" / "ansible.cfg")}
    return subprocess.run(argv, cwd=ROOT / "ansible", capture_output=True, text=True, env=env)


def test_rehearsal_deploy_passes_the_smoke_gate_and_is_idempotent(
    host: Host, tmp_path: Path, wheelhouse: Path, cli: object
) -> None:
    weights = tmp_path / "weights"
    subprocess.run(
        [str(Path(sys.executable).parent / "specdeploy"), "rehearsal", "fixtures", "--export", str(weights)],
        check=True,
        capture_output=True,
    )

    first = _playbook(host, tmp_path, wheelhouse, weights)
    assert first.returncode == 0, first.stdout[-4000:] + first.stderr[-2000:]
    report = json.loads(host.ssh("cat /var/lib/specdeploy/state/smoke.json").stdout)
    assert report["verdict"] == "pass" and report["exit_code"] == 0
    assert host.ssh("systemctl is-active specdeploy-engine").stdout.strip() == "active"
    assert (
        host.ssh("test -L /var/lib/specdeploy/serving/drafter/model.safetensors && echo link").stdout.strip() == "link"
    )

    second = _playbook(host, tmp_path, wheelhouse, weights)
    assert second.returncode == 0, second.stdout[-4000:]
    assert _changed_tasks(second.stdout) == []
    recap = re.search(r"changed=(\d+)", second.stdout.split("PLAY RECAP", 1)[1])
    assert recap and recap.group(1) == "0"


def _changed_tasks(output: str) -> list[str]:
    """Names of the tasks the run reported as changed."""
    changed, task = [], ""
    for line in output.splitlines():
        if line.startswith(("TASK [", "RUNNING HANDLER [")):
            task = line.split("[", 1)[1].rsplit("]", 1)[0]
        elif line.startswith("changed: ["):
            changed.append(task)
    return changed
