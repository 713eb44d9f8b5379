"""Build once, ship everywhere, for real: a small engine image built by `specdeploy image build`
(the code path every engine image takes), pushed to a real registry (Debian's `docker-registry`
on a test host of its own, TLS with a site CA) and pulled back by digest.

- Two builds of one set of inputs, the second with no cache, are the same image bit for bit
  (the same image ID, i.e. config digest over every layer's bytes, and the same manifest).
- `image push` records the registry's own digest (`--digestfile`) in the lock; the registry
  serves that digest for the tag; `image ensure --source pull` pulls NAME@DIGEST and gets the
  very image that was built (same ID); a digest the registry does not hold is refused.
"""

from __future__ import annotations

import json
import os
import signal
import ssl
import subprocess
from pathlib import Path
from typing import Any

import httpx
import pytest
from tests.support.local_images import PODMAN, build_base, run_limits_conf

from specdeploy.images import build as images
from specdeploy.profile import Profile, load_profile
from specdeploy.profile.lock import Lock
from specdeploy.rehearsal import registry, variants

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.podman
REPOSITORY = "specdeploy-test/small-pushed"


@pytest.fixture(autouse=True)
def _run_limits(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch) -> None:
    """`image ensure` runs the guard inside the image: give it this sandbox's limits."""
    monkeypatch.setenv("CONTAINERS_CONF", str(run_limits_conf(tmp_path_factory.mktemp("conf"))))
    monkeypatch.setenv("SOURCE_DATE_EPOCH", "1767225600")  # 2026-01-01, as a site's release date


def _profile(name: str, version: str) -> Profile:
    patch = {
        "engine": {
            "source": {"version": {"value": version, "provenance": "rehearsal", "source": "test image"}},
            "image": {
                "name": name,
                "containerfile": "tests/data/images/Containerfile.small",
                "base": {
                    "name": build_base(),
                    "digest": {"value": None, "provenance": "unresolved", "source": "the first build"},
                },
            },
        }
    }
    # a CPU base stands in for the CUDA one: the variant claims no GPU (no CUDA is read from its base)
    patch["host"] = {"compute_capability_min": None}
    return variants.derive(load_profile("a6000-mtp"), "a6000-mtp-pushed", patch)


def _rmi(tag: str) -> None:
    subprocess.run([*PODMAN.split(), "rmi", "-f", tag], capture_output=True)


def test_an_image_built_twice_from_the_same_inputs_is_the_same_image_bit_for_bit(tmp_path: Path) -> None:
    profile = _profile("localhost/specdeploy-test/reproducible", "0.5.19")
    tag = images.image_tag(profile)
    _rmi(tag)
    first = images.build(profile, lock=Lock(tmp_path / "a.lock"), context=ROOT, podman=PODMAN, no_cache=True)
    first_digest = images.local_digest(tag, PODMAN)
    _rmi(tag)
    second = images.build(profile, lock=Lock(tmp_path / "b.lock"), context=ROOT, podman=PODMAN, no_cache=True)
    assert "--no-cache" in second.argv and "--timestamp" in second.argv
    # the image ID is the digest of the config, which lists every layer's digest: equal IDs are equal bytes
    assert second.image_id == first.image_id
    assert images.local_digest(tag, PODMAN) == first_digest
    created = subprocess.run(
        [*PODMAN.split(), "image", "inspect", "--format", "{{.Created}}", tag], capture_output=True, text=True
    ).stdout
    assert created.startswith("2026-01-01"), "the image carries the source date, not the build's clock"
    _rmi(tag)


def test_a_registry_whose_processes_died_with_a_session_is_replaced_and_answers_at_once() -> None:
    """What CI met: a session's end killed the registry's processes while podman still listed it
    running. Replacing it gave a new container a fresh MAC while the controller's neighbour table
    held the old one: the registry did not answer for over a minute. Now an address keeps its MAC."""
    site = registry.start_registry()
    pids = subprocess.run(
        # conmon first: left alive a moment, it would record the exit and podman would list it exited
        [*PODMAN.split(), "inspect", "--format", "{{.State.ConmonPid}} {{.State.Pid}}", registry.NAME],
        capture_output=True, text=True, check=True,
    ).stdout.split()  # fmt: skip
    for pid in pids:
        os.kill(int(pid), signal.SIGKILL)
    listed = subprocess.run(
        [*PODMAN.split(), "inspect", "--format", "{{.State.Running}}", registry.NAME], capture_output=True, text=True
    )
    assert listed.stdout.strip() == "true", "podman still lists the dead registry as running (the case met)"
    again = registry.start_registry()  # raises RegistryError where it does not answer within 30 s
    assert again == site
    answered = httpx.get(f"https://{site.address}/v2/", verify=ssl.create_default_context(cafile=str(site.ca)))
    assert answered.status_code == 200


def test_push_records_the_registrys_digest_and_a_host_pulls_exactly_that_image(tmp_path: Path, cli: Any) -> None:
    site = registry.start_registry()
    profile = _profile(f"localhost/{REPOSITORY}", "0.5.19")
    path = variants.materialize(profile, tmp_path / "p")
    tag = images.image_tag(profile)
    _rmi(tag)
    controller_lock = tmp_path / "controller.lock"
    built = images.build(profile, lock=Lock(controller_lock), context=ROOT, podman=PODMAN)

    pushed = cli(
        "image", "push", "--profile", path, "--registry", site.address, "--lock", controller_lock,
        "--podman", PODMAN, "--cert-dir", site.cert_dir, "--json",
    )  # fmt: skip
    assert pushed.exit_code == 0, pushed.stdout + pushed.stderr
    data = json.loads(pushed.stdout)
    digest = data["digest"]
    assert Lock(controller_lock).value(profile.name, "engine.image.digest") == digest
    assert data["reference"] == f"{site.address}/{REPOSITORY}@{digest}"
    served = httpx.get(
        f"https://{site.address}/v2/{REPOSITORY}/manifests/0.5.19",
        headers={"Accept": "application/vnd.oci.image.manifest.v1+json"},
        verify=ssl.create_default_context(cafile=str(site.ca)),
    )
    assert served.status_code == 200 and served.headers["Docker-Content-Digest"] == digest

    # a host: the image is not there; its lock holds what the controller's lock recorded at the push
    _rmi(tag)
    host_lock = tmp_path / "host.lock"
    Lock(host_lock).record(profile.name, "engine.image.digest", digest, by="the controller's lock")

    def ensure(lock: Path) -> Any:
        return cli(
            "image", "ensure", "--profile", path, "--source", "pull", "--registry", site.address,
            "--lock", lock, "--podman", PODMAN, "--cert-dir", site.cert_dir,
        )  # fmt: skip

    pulled = ensure(host_lock)
    assert pulled.exit_code == 0, pulled.stdout + pulled.stderr
    got = json.loads(pulled.stdout)
    assert (got["action"], got["label_mismatches"]) == ("pulled", [])
    # the engine unit runs the profile's name at the registry's digest
    assert got["reference"] == f"localhost/{REPOSITORY}@{digest}"
    assert got["image_id"] == f"sha256:{built.image_id}", "the config digest survives push and pull"

    # a digest the registry does not hold: refused, nothing pulled
    _rmi(tag)
    wrong = tmp_path / "wrong.lock"
    Lock(wrong).record(profile.name, "engine.image.digest", "sha256:" + "0" * 64, by="a typo")
    refused = ensure(wrong)
    assert refused.exit_code != 0 and "cannot pull" in refused.stderr
    _rmi(tag)


def test_a_push_without_a_registry_is_refused_before_anything_is_pushed(tmp_path: Path, cli: Any) -> None:
    profile = _profile("localhost/specdeploy-test/unpushable", "0.5.19")
    path = variants.materialize(profile, tmp_path / "p")
    done = cli("image", "push", "--profile", path, "--lock", tmp_path / "l", "--podman", PODMAN)
    assert done.exit_code == 1
    assert "no registry to push" in done.stderr and "--registry HOST[:PORT]" in done.stderr
