"""The disposable systemd test host that the Ansible deploy tests run against: it boots
systemd, answers real SSH, and real Ansible reaches it; its podman has the quadlet
generator the GPU profiles' units are validated with."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from tests.support.testhost import Host

pytestmark = pytest.mark.testhost


def test_host_boots_systemd_and_ansible_reaches_it_over_ssh(trixie_host: Host, tmp_path: Path) -> None:
    host = trixie_host
    assert host.ssh("systemctl is-active ssh").stdout.strip() == "active"
    assert host.ssh("systemctl is-system-running", check=False).stdout.strip() in ("running", "degraded")
    assert host.ssh("test -x /usr/libexec/podman/quadlet && echo yes").stdout.strip() == "yes"

    inventory = tmp_path / "hosts.ini"
    inventory.write_text(f"[rehearsal]\n{host.inventory_line()}\n")
    ansible = Path(sys.executable).parent / "ansible"
    argv = [str(ansible), "rehearsal", "-i", str(inventory), "-m", "ansible.builtin.setup"]
    done = subprocess.run([*argv, "-a", "filter=ansible_service_mgr"], capture_output=True, text=True)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    # ad-hoc output: "<host> | SUCCESS => {json}"
    head, _, body = done.stdout.partition(" => ")
    assert head.strip() == f"{host.name} | SUCCESS"
    assert json.loads(body)["ansible_facts"]["ansible_service_mgr"] == "systemd"
