"""Image builds with real podman, here, without CUDA bases.

- `specdeploy image build` / `image check` on a small image built from a local Debian base:
  build args come from the profile, the base digest and image ID land in the lock, labels
  and the SGLang version inside match the profile, and a different profile fails the check
  naming the label and both versions.
- The real Containerfile.vllm (stock vLLM) built on a local stand-in for the official image:
  its guard passes the pinned version and refuses a CUDA 13 torch; `image check` passes the
  image, and fails, naming both versions, an image whose vLLM inside reports another one.
- The real Containerfile.vllm-pr40898, built up to its `source` stage on a local Debian base
  (git + Python standing in for the CUDA devel image) against a fixture vLLM repository:
  the guard passes the pinned tree and fails the build of a tree with the shift twice.
"""

from __future__ import annotations

import json
import subprocess
import tempfile
from pathlib import Path
from typing import Any

import pytest
from tests.support.elf import compile_extension
from tests.support.local_images import PODMAN, RUN_FLAGS, build_base, run_limits_conf
from tests.support.vllm_repo import fixture_vllm_repo, git

from specdeploy.images import build as images
from specdeploy.profile import Profile, load_profile
from specdeploy.profile.lock import Lock
from specdeploy.rehearsal import variants

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.podman


@pytest.fixture(autouse=True)
def _run_limits(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch) -> None:
    """`image check` runs a container itself: give it this sandbox's limits (podman's exceed them)."""
    monkeypatch.setenv("CONTAINERS_CONF", str(run_limits_conf(tmp_path_factory.mktemp("conf"))))


def _small_profile(version: str = "0.5.19") -> Profile:
    base = build_base()
    patch = {
        "engine": {
            "source": {"version": {"value": version, "provenance": "rehearsal", "source": "test image"}},
            "image": {
                "name": "localhost/specdeploy-test/small",
                "containerfile": "tests/data/images/Containerfile.small",
                "base": {
                    "name": base,
                    "digest": {"value": None, "provenance": "unresolved", "source": "the first build"},
                },
            },
        }
    }
    # a CPU base stands in for the CUDA one: the variant claims no GPU (no CUDA is read from its base)
    patch["host"] = {"compute_capability_min": None}
    return variants.derive(load_profile("a6000-mtp"), "a6000-mtp-small", patch)


def test_image_build_then_check(tmp_path: Path, cli: Any) -> None:
    profile = _small_profile()
    lock = Lock(tmp_path / "specdeploy.lock")
    result = images.build(profile, lock=lock, context=ROOT, podman=PODMAN)
    assert result.tag == "localhost/specdeploy-test/small:0.5.19"

    base_digest = lock.value(profile.name, "engine.image.base.digest")
    assert base_digest and base_digest.startswith("sha256:")
    # The build's image ID is recorded as such, never as the (registry) digest a pull needs.
    assert lock.value(profile.name, "engine.image.id") == f"sha256:{result.image_id}"
    assert lock.value(profile.name, "engine.image.digest") is None
    assert f"BASE_IMAGE={build_base()}@{base_digest}" in result.argv

    content = subprocess.run(
        [*PODMAN.split(), "run", "--rm", *RUN_FLAGS, result.tag, "cat", "/engine.txt"],
        capture_output=True, text=True, check=True,
    ).stdout  # fmt: skip
    assert content.startswith("engine 0.5.19; refused: <0.5.10 ==0.5.12.*")

    profile_path = variants.materialize(profile, tmp_path / "p")
    checked = cli(
        "image", "check", result.tag, "--profile", profile_path, "--lock", lock.path, "--json", "--podman", PODMAN
    )
    assert checked.exit_code == 0, checked.stdout
    assert json.loads(checked.stdout)["ok"] is True
    inside = {row["label"]: row["found"] for row in json.loads(checked.stdout)["labels"]}
    assert inside["inside: sglang version"] == "0.5.19"

    other = variants.materialize(
        _small_profile("0.5.18").model_copy(update={"name": "a6000-mtp-small"}), tmp_path / "q"
    )
    mismatch = cli("image", "check", result.tag, "--profile", other, "--lock", lock.path, "--json", "--podman", PODMAN)
    failed = {row["label"]: row for row in json.loads(mismatch.stdout)["labels"] if not row["ok"]}
    assert mismatch.exit_code == 1
    assert set(failed) == {
        "org.opencontainers.image.version",
        "org.opencontainers.image.revision",
        "inside: sglang version",
    }
    assert (failed["inside: sglang version"]["expected"], failed["inside: sglang version"]["found"]) == (
        "0.5.18",
        "0.5.19",
    )


def test_image_ensure_builds_loads_an_archive_and_hands_over_a_digest_reference(tmp_path: Path, cli: Any) -> None:
    """The images role's command: build when missing, present on a re-run, and on an
    air-gapped host load a `podman save` archive; every path ends in a label check and a
    reference by digest for the engine unit."""
    profile = _small_profile("0.5.16")
    path = variants.materialize(profile, tmp_path / "p")
    lock = tmp_path / "specdeploy.lock"
    tag = "localhost/specdeploy-test/small:0.5.16"
    subprocess.run([*PODMAN.split(), "rmi", "-f", tag], capture_output=True)

    def ensure(*extra: Any, lock: Path = lock) -> Any:
        return cli("image", "ensure", "--profile", path, "--lock", lock, "--podman", PODMAN, *extra)

    # `ansible-playbook --check` (GPU-host blocker 11): says what it would do, builds nothing
    would = json.loads(ensure("--source", "build", "--context", ROOT, "--check").stdout)
    assert (would["action"], would["changed"]) == ("would build", True)
    assert subprocess.run([*PODMAN.split(), "image", "exists", tag]).returncode != 0
    built = ensure("--source", "build", "--context", ROOT)
    assert built.exit_code == 0, built.stdout + built.stderr
    first = json.loads(built.stdout)
    assert (first["action"], first["changed"], first["label_mismatches"]) == ("built", True, [])
    assert first["reference"].startswith("localhost/specdeploy-test/small@sha256:")
    again = json.loads(ensure("--source", "build", "--context", ROOT).stdout)
    assert (again["action"], again["changed"], again["reference"]) == ("present", False, first["reference"])
    checked = json.loads(ensure("--source", "build", "--context", ROOT, "--check").stdout)
    assert (checked["action"], checked["reference"], checked["label_mismatches"]) == ("present", first["reference"], [])

    archive = tmp_path / "small.tar"
    subprocess.run([*PODMAN.split(), "save", "--output", str(archive), tag], check=True, capture_output=True)
    subprocess.run([*PODMAN.split(), "rmi", "-f", tag], check=True, capture_output=True)
    loaded = ensure("--source", "archive", "--archive", archive)
    assert loaded.exit_code == 0, loaded.stdout + loaded.stderr
    data = json.loads(loaded.stdout)
    assert data["action"] == "loaded" and data["label_mismatches"] == []
    assert data["reference"].startswith("localhost/specdeploy-test/small@sha256:")
    assert data["image_id"] == first["image_id"] == Lock(lock).value(profile.name, "engine.image.id")
    # a host whose lock has never seen the base (built elsewhere, the profile's base digest
    # unresolved): the image's base label is the first sighting, recorded there
    elsewhere = tmp_path / "elsewhere.lock"
    subprocess.run([*PODMAN.split(), "rmi", "-f", tag], check=True, capture_output=True)
    there = ensure("--source", "archive", "--archive", archive, lock=elsewhere)
    assert there.exit_code == 0 and json.loads(there.stdout)["label_mismatches"] == [], there.stdout + there.stderr
    base_digest = Lock(lock).value(profile.name, "engine.image.base.digest")
    assert base_digest and Lock(elsewhere).value(profile.name, "engine.image.base.digest") == base_digest

    # The reference by digest handed to the engine unit runs the image.
    ran = subprocess.run(
        [*PODMAN.split(), "run", "--rm", *RUN_FLAGS, data["reference"], "cat", "/engine.txt"],
        capture_output=True, text=True,
    )  # fmt: skip
    assert ran.returncode == 0 and ran.stdout.startswith("engine 0.5.16"), ran.stderr

    subprocess.run([*PODMAN.split(), "rmi", "-f", tag], check=True, capture_output=True)
    missing = ensure("--source", "archive", "--archive", tmp_path / "none.tar")
    assert missing.exit_code == 2 and "--archive" in missing.stderr and "podman save" in missing.stderr  # bad input

    # Pull needs the registry's manifest digest; the recorded image ID is not one.
    unpinned = ensure("--source", "pull")
    assert unpinned.exit_code == 1
    assert "engine.image.digest is unresolved" in unpinned.stderr and "podman push --digestfile" in unpinned.stderr


def _source_stage(repo: Path, commit: str, merge_base: str, tmp_path: Path) -> subprocess.CompletedProcess[str]:
    """Build the Containerfile's source stage from the fixture repo, and leave nothing behind: each
    run's fixture commit is new, and its image (plus the layers a failed build cached) once stayed,
    about 1 GB a run, until CI's disk filled (`--layers=false`: a failed build commits nothing)."""
    tag = f"localhost/specdeploy-test/guard:{commit[:12]}"
    argv = [
        *PODMAN.split(), "build", "--layers=false", "--target", "source",
        "--file", str(ROOT / "Containerfile.vllm-pr40898"), "--volume", f"{repo}:/fixture:ro", "--tag", tag,
        "--build-arg", f"BASE_IMAGE={build_base()}",
        "--build-arg", "VLLM_REPO=/fixture", "--build-arg", "VLLM_REF=refs/pull/40898/head",
        "--build-arg", f"VLLM_COMMIT={commit}", "--build-arg", f"VLLM_MERGE_BASE_COMMIT={merge_base}",
        "--build-arg", "BUILD_MODE=precompiled", str(ROOT),
    ]  # fmt: skip
    try:
        return subprocess.run(argv, capture_output=True, text=True)
    finally:
        subprocess.run([*PODMAN.split(), "rmi", "--force", "--ignore", tag], capture_output=True)


@pytest.mark.parametrize(("shifts", "passes"), [(1, True), (2, False)], ids=["pinned-tree", "shift-applied-twice"])
def test_vllm_containerfile_guard_stage(tmp_path: Path, shifts: int, passes: bool) -> None:
    repo, head, base = fixture_vllm_repo(tmp_path, shifts=shifts)
    git(repo, "update-ref", "refs/pull/40898/head", head)
    done = _source_stage(repo, head, base, tmp_path)
    output = done.stdout + done.stderr
    if passes:
        assert done.returncode == 0, output[-3000:]
        assert "specdeploy build guard: vllm source checks passed" in output
    else:
        assert done.returncode != 0
        assert "present 2 times (#40727 applied twice)" in output


# --------------------------------------------------------------------------- stock vLLM (Containerfile.vllm)

STANDIN = "localhost/specdeploy-test/vllm-openai"


def _official_standin(vllm: str, torch_cuda: str) -> str:
    """The official cu129 image's stand-in, tagged like the real one (the `-cu129` suffix is the
    CUDA the profile expects; `torch_cuda` is what the torch inside was built for)."""
    tag = f"{STANDIN}:v{vllm.split('+')[0]}-torch{torch_cuda}-cu129"
    recipe = ROOT / "tests" / "data" / "images" / "Containerfile.vllm-openai-standin"
    with tempfile.TemporaryDirectory() as context:  # vLLM's extension, linked to the CUDA runtime of torch's major
        compile_extension(Path(context) / "vllm", int(torch_cuda.split(".")[0]))
        argv = [
            *PODMAN.split(), "build", "--quiet", "--file", str(recipe),
            "--build-arg", f"BASE_IMAGE={build_base()}", "--build-arg", f"VLLM_VERSION={vllm}",
            "--build-arg", f"TORCH_CUDA={torch_cuda}", "--tag", tag, context,
        ]  # fmt: skip
        subprocess.run(argv, check=True, capture_output=True)
    return tag


def _stock_profile(base: str) -> Profile:
    """a6000-dflash-stock with the stand-in as its official image (digest: resolved at build)."""
    patch = {
        "engine": {
            "image": {
                "name": "localhost/specdeploy-test/vllm",
                "base": {
                    "name": base,
                    "digest": {"value": None, "provenance": "unresolved", "source": "the first build"},
                },
            }
        }
    }
    return variants.derive(load_profile("a6000-dflash-stock"), "a6000-dflash-stock-local", patch)


def test_stock_vllm_image_is_checked_by_the_version_inside_not_only_its_labels(tmp_path: Path, cli: Any) -> None:
    """The official image is a base image: Containerfile.vllm adds labels and the guard, built
    like the other images. `image check` passes it, and fails an image whose labels still say
    0.29.0 while the vLLM inside reports 0.28.0, naming both versions."""
    profile = _stock_profile(_official_standin("0.29.0+cu129", "12.9"))
    lock = Lock(tmp_path / "specdeploy.lock")
    result = images.build(profile, lock=lock, context=ROOT, podman=PODMAN)
    assert result.tag == "localhost/specdeploy-test/vllm:0.29.0"
    assert lock.value(
        profile.name,
        "engine.image.base.digest",
    ).startswith("sha256:")
    assert "TORCH_CUDA=12.9" in result.argv and "VLLM_VERSION=0.29.0" in result.argv

    path = variants.materialize(profile, tmp_path / "p")
    checked = cli("image", "check", result.tag, "--profile", path, "--lock", lock.path, "--json", "--podman", PODMAN)
    assert checked.exit_code == 0, checked.stdout + checked.stderr
    rows = {row["label"]: row for row in json.loads(checked.stdout)["labels"]}
    assert rows["inside: vllm version"]["found"] == "0.29.0+cu129" and rows["inside: vllm version"]["ok"]
    assert rows["inside: torch CUDA"]["found"] == "12.9"

    # Same labels, another vLLM inside: what a hand-patched image or a wrong base looks like.
    tampered = "localhost/specdeploy-test/vllm:tampered"
    recipe = tmp_path / "Containerfile.tampered"
    recipe.write_text(
        f"FROM {result.tag}\nUSER 0\n"
        "RUN mv /opt/standin/vllm-0.29.0+cu129.dist-info /opt/standin/vllm-0.28.0.dist-info "
        "&& sed -i 's/^Version: .*/Version: 0.28.0/' /opt/standin/vllm-0.28.0.dist-info/METADATA\nUSER 10001\n"
    )
    subprocess.run([*PODMAN.split(), "build", "--quiet", "-f", str(recipe), "-t", tampered, str(tmp_path)], check=True)
    bad = cli("image", "check", tampered, "--profile", path, "--lock", lock.path, "--podman", PODMAN)
    assert bad.exit_code == 1
    table = " ".join(bad.stdout.split())
    assert "inside: vllm version" in table and "0.29.0" in table and "0.28.0" in table
    rows = {
        row["label"]: row
        for row in json.loads(
            cli("image", "check", tampered, "--profile", path, "--lock", lock.path, "--json", "--podman", PODMAN).stdout
        )["labels"]
    }
    assert (rows["inside: vllm version"]["expected"], rows["inside: vllm version"]["found"]) == ("0.29.0", "0.28.0")
    assert rows["org.opencontainers.image.version"]["ok"]  # the labels alone would have passed it


def test_stock_vllm_build_refuses_an_official_image_whose_torch_needs_cuda_13(
    tmp_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    """A base tagged cu129 whose torch is a CUDA 13.0 build (PyPI's torch 2.11+ default): the
    guard in Containerfile.vllm fails the build naming both CUDAs, before any host runs it."""
    base = _official_standin("0.29.0", "13.0")
    with pytest.raises(images.ImageError, match="podman build failed"):
        images.build(_stock_profile(base), lock=Lock(tmp_path / "l"), context=ROOT, podman=PODMAN)
    printed = "".join(capfd.readouterr())
    assert "torch in the image is built for CUDA 13.0, the base image is CUDA 12.9" in printed


def test_a_failing_command_left_of_a_pipe_cannot_pass_the_build(tmp_path: Path) -> None:
    """GPU-host blocker 14: `SHELL [bash, -o, pipefail, -c]` is ignored in the OCI format the
    images are built in (for reproducibility), so `false | true` would pass. `image build` refuses
    the Containerfile before podman runs, naming the line."""
    patch = {"engine": {"image": {"containerfile": "tests/data/images/Containerfile.pipefail"}}}
    profile = variants.derive(_small_profile("0.5.15"), "a6000-mtp-pipefail", patch)
    with pytest.raises(images.ImageError, match=r"Containerfile.pipefail:\d+: a shell-form RUN with a pipe"):
        images.build(profile, lock=Lock(tmp_path / "l"), context=ROOT, podman=PODMAN)


def test_the_serving_links_resolve_inside_the_container_as_its_user_and_nobody_else_reads_them(
    tmp_path: Path,
) -> None:
    """GPU-host blockers 6, 10 and 13, with a real `podman run` using exactly the rendered
    quadlet's Volume= mounts and User=/Group=, on a host whose models sit on another disk than
    its serving directory (an inventory override). Blocker 6: the serving links named host paths
    that did not exist inside the container. Blocker 10: weights are kept per revision and served
    through relative links (<serving>/target, the drafter's build) that must resolve on the host
    and in the container alike. Blocker 13: the image runs as uid 10001, so the directories are
    group-readable by it (mode 750/640, as the engine role sets them), the cache writable, and
    another uid reads nothing (gated weights are not world-readable)."""
    import os

    from specdeploy.core import atomic, layout
    from specdeploy.drafter import serving
    from specdeploy.engine import units
    from specdeploy.weights import store

    host = layout.HostLayout(
        models=tmp_path / "data" / "models", serving=tmp_path / "srv" / "serving", cache=tmp_path / "cache"
    )
    target = host.download("Qwen/Qwen3.6-27B") / "rev1"
    drafter = host.download("z-lab/drafter") / "rev1"
    for directory, text in ((target, "target weights\n"), (drafter, "drafter weights\n")):
        directory.mkdir(parents=True)
        (directory / "model.safetensors").write_text(text)
    store.point(host.target_serving, target, None)
    store.point(host.drafter_source, drafter, None)
    builds = host.serving / layout.DRAFTER_BUILDS
    build = serving._build(builds, b"{}", serving._wanted_links(builds / "x", drafter))  # what write-config makes
    atomic.symlink(host.drafter_serving, Path(os.path.relpath(build, host.serving)))
    assert (host.drafter_serving / "model.safetensors").read_text() == "drafter weights\n"  # on the host
    host.cache.mkdir()
    uid = layout.ENGINE_UID
    for root in (host.models, host.serving):  # what the engine role does: group-readable, others nothing
        subprocess.run(["chown", "-R", "-h", f"0:{uid}", str(root)], check=True)
        subprocess.run(["chmod", "-R", "u=rwX,g=rX,o=", str(root)], check=True)
    os.chown(host.cache, uid, uid)
    host.cache.chmod(0o700)
    for parent in (tmp_path, tmp_path / "data", tmp_path / "srv"):
        parent.chmod(0o755)  # pytest's tmp dirs are 700: the host's parents of these dirs are 755
    profile = load_profile("a6000-dflash")
    unit = units.render(profile, host=host, image=f"{profile.engine.image.name}@sha256:{'0' * 64}").text
    lines = unit.splitlines()
    mounts = [arg for line in lines if line.startswith("Volume=") for arg in ("-v", line[7:])]
    user = next(line[5:] for line in lines if line.startswith("User="))
    group = next(line[6:] for line in lines if line.startswith("Group="))
    assert (user, group) == (str(uid), str(uid))

    def run(as_user: str, script: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [*PODMAN.split(), "run", "--rm", *RUN_FLAGS, "--read-only", "--user", as_user, *mounts, build_base(),
             "sh", "-c", script],
            capture_output=True, text=True,
        )  # fmt: skip

    read = run(
        f"{user}:{group}",
        f"cat {host.target_serving}/model.safetensors {host.drafter_serving}/model.safetensors && touch /cache/written",
    )
    assert read.returncode == 0 and read.stdout == "target weights\ndrafter weights\n", read.stderr
    assert (host.cache / "written").exists()
    stranger = run("10002:10002", f"cat {host.target_serving}/model.safetensors")
    assert stranger.returncode != 0 and "Permission denied" in stranger.stderr, stranger
