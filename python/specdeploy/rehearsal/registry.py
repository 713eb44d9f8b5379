"""The rehearsal's site registry: Debian's `docker-registry` behind TLS with a site CA, a test host of its own.

A site builds its engine image once on a builder, pushes it (`podman push --digestfile`) and every
host pulls it by that digest; a host that builds its own image serves something no other host was
proven with. The rehearsal takes that path for real: the distribution registry from Debian's
`docker-registry` package in a bookworm container on the rehearsal network (REGISTRY_IP), TLS with
a certificate signed by a site CA generated once into the cache (the images role installs the CA
on a host as `/etc/containers/certs.d/<registry>/ca.crt`, as a site does for its own registry), its
storage in the cache so a warm re-run pushes no blob twice. The controller reaches it on the
network's bridge; the hosts on the network.
"""

from __future__ import annotations

import hashlib
import json
import ssl
import time
from dataclasses import dataclass
from pathlib import Path

import httpx

from specdeploy.core import atomic
from specdeploy.core.cache import cache_dir
from specdeploy.core.errors import SpecdeployError
from specdeploy.rehearsal import hosts, site_ca
from specdeploy.rehearsal.hub import NETWORK, _podman, ensure_network

REGISTRY_IP = "10.89.64.11"
REGISTRY_PORT = 5000
REGISTRY = f"{REGISTRY_IP}:{REGISTRY_PORT}"  # the registry part of an image name pushed there
NAME = "specdeploy-registry"
IMAGE = "localhost/specdeploy-test/registry"
PACKAGES = ("ca-certificates", "docker-registry")
_LABEL = "specdeploy.registry"
_CONFIG = "/etc/docker/registry/config.yml"
_TLS = "/etc/docker/registry/tls"
_STORAGE = "/var/lib/docker-registry"


class RegistryError(SpecdeployError):
    """The rehearsal's registry could not be set up or started."""


@dataclass(frozen=True)
class Registry:
    name: str
    address: str  # host:port, the registry part of the image names pushed there
    ca: Path  # the site CA's certificate: a host trusts the registry through it
    cert_dir: Path  # a directory holding ca.crt, for `podman push --cert-dir`


def _certificates(directory: Path) -> tuple[Path, Path, Path]:
    """The site CA and the registry's server certificate (for REGISTRY_IP), issued by the
    rehearsal's site CA (which signs the hub's too)."""
    issued = site_ca.issue(directory, ips=[REGISTRY_IP, "127.0.0.1"])
    return issued.ca, issued.cert, issued.key


def config() -> str:
    """The registry's configuration: TLS, filesystem storage, deletes allowed (image pruning)."""
    return json.dumps(
        {
            "version": 0.1,
            "log": {"level": "info"},
            "storage": {"filesystem": {"rootdirectory": _STORAGE}, "delete": {"enabled": True}},
            "http": {
                "addr": f"0.0.0.0:{REGISTRY_PORT}",
                "tls": {"certificate": f"{_TLS}/server.crt", "key": f"{_TLS}/server.key"},
            },
        },
        indent=2,
    )  # JSON is YAML: the registry reads it as its config.yml


def _ready(ca: Path, *, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if (
                httpx.get(
                    f"https://{REGISTRY}/v2/", verify=ssl.create_default_context(cafile=str(ca)), timeout=2
                ).status_code
                == 200
            ):
                return True
        except httpx.HTTPError:
            pass
        if _podman("inspect", "--format", "{{.State.Running}}", NAME, check=False).stdout.strip() != "true":
            return False
        time.sleep(0.3)
    return False


def start_registry() -> Registry:
    """The registry test host, started when missing (a running one with the same settings is reused)."""
    root = cache_dir() / "registry"
    tls = root / "tls"
    ca, _, _ = _certificates(tls)
    storage = root / "storage"
    atomic.ensure_dir(storage)
    atomic.write_bytes(root / "config.yml", (config() + "\n").encode(), mode=0o644)
    cert_dir = root / "cert-dir"
    atomic.ensure_dir(cert_dir)
    atomic.write_bytes(cert_dir / "ca.crt", ca.read_bytes(), mode=0o644)
    image = hosts.debootstrap_image("bookworm", PACKAGES, IMAGE)
    ensure_network()
    fingerprint = hashlib.sha256(json.dumps([image, str(root), config(), ca.read_text()]).encode()).hexdigest()[:16]
    served = Registry(NAME, REGISTRY, ca, cert_dir)
    state = _podman(
        "inspect", "--format", f'{{{{index .Config.Labels "{_LABEL}"}}}} {{{{.State.Running}}}}', NAME, check=False
    )
    if state.stdout.split() == [fingerprint, "true"] and _ready(ca, timeout=5):
        return served
    _podman("rm", "-f", "-t", "0", NAME, check=False)
    started = _podman(
        "run", "-d", "--name", NAME, "--hostname", NAME, "--label", f"{_LABEL}={fingerprint}",
        *hosts.Network(NETWORK, REGISTRY_IP).run_flags(), *hosts.RUN_FLAGS,
        "-v", f"{storage}:{_STORAGE}", "-v", f"{root / 'config.yml'}:{_CONFIG}:ro", "-v", f"{tls}:{_TLS}:ro",
        image, "/usr/bin/docker-registry", "serve", _CONFIG,
        check=False,
    )  # fmt: skip
    if started.returncode != 0:
        raise RegistryError(
            f"could not start the registry {NAME}: {started.stderr.strip()[-2000:]}",
            hint=f"is {REGISTRY_IP} on network {NETWORK} held by another container?",
        )
    if not _ready(ca, timeout=30):
        logs = _podman("logs", NAME, check=False)
        raise RegistryError(
            f"the registry {NAME} did not answer https://{REGISTRY}/v2/ within 30 s:\n"
            + (logs.stdout + logs.stderr)[-3000:],
            hint="the output above is the registry's own",
        )
    return served


def stop_registry() -> None:
    _podman("rm", "-f", "-t", "0", NAME, check=False)
