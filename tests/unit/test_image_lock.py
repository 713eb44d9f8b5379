"""The engine image lock: `specdeploy image lock` with the real uv against indexes that cannot be
reached (offline, answered at once) and against local indexes made here (real wheels, real
hashes), and `image build` / `image check` refusing what the lock does not prove."""

from __future__ import annotations

import hashlib
import json
import shutil
import sys
import zipfile
from pathlib import Path
from typing import Any

import pytest
import yaml

from specdeploy.images import build as images
from specdeploy.images import ensure
from specdeploy.images import lock as image_lock
from specdeploy.profile import Profile, load_profile
from specdeploy.rehearsal import variants

UV = shutil.which("uv") or (
    str(Path(sys.executable).parent / "uv") if (Path(sys.executable).parent / "uv").exists() else None
)
needs_uv = pytest.mark.skipif(UV is None, reason="uv is not installed (dev extra): the lock cannot be produced")
ROOT = Path(__file__).resolve().parents[2]


def _variant(tmp_path: Path, name: str, lock: dict[str, Any]) -> Path:
    """The a6000-dflash profile with its lock section patched, written as <name>.yaml."""
    profile = variants.derive(load_profile("a6000-dflash"), name, {"engine": {"image": {"lock": lock}}})
    path = tmp_path / f"{name}.yaml"
    path.write_text(yaml.safe_dump(profile.model_dump(mode="json", exclude_none=True), sort_keys=False))
    return path


def _wheel(directory: Path, name: str, version: str, requires: list[str] = ()) -> Path:  # type: ignore[assignment]
    directory.mkdir(parents=True, exist_ok=True)
    wheel = directory / f"{name}-{version}-py3-none-any.whl"
    info = f"{name}-{version}.dist-info"
    metadata = f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n" + "".join(
        f"Requires-Dist: {r}\n" for r in requires
    )
    with zipfile.ZipFile(wheel, "w") as zf:
        zf.writestr(f"{name}/__init__.py", "")
        zf.writestr(f"{info}/METADATA", metadata)
        zf.writestr(f"{info}/WHEEL", "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n")
        zf.writestr(f"{info}/RECORD", "")
    return wheel


def _simple_index(root: Path, wheels: list[Path]) -> str:
    """A PEP 503 index on disk: <root>/<project>/index.html linking each wheel with its sha256."""
    for wheel in wheels:
        project = root / wheel.name.split("-")[0].replace("_", "-")
        project.mkdir(parents=True, exist_ok=True)
        digest = hashlib.sha256(wheel.read_bytes()).hexdigest()
        shutil.copy(wheel, project / wheel.name)
        page = project / "index.html"
        links = page.read_text() if page.exists() else ""
        page.write_text(links + f'<a href="{wheel.name}#sha256={digest}">{wheel.name}</a>\n')
    return root.as_uri()


@needs_uv
def test_an_unreachable_index_fails_clearly_and_the_lock_stays_unresolved(
    tmp_path: Path, cli: Any, monkeypatch: Any
) -> None:
    monkeypatch.setenv("UV_CACHE_DIR", str(tmp_path / "uv-cache"))
    monkeypatch.setenv("UV_HTTP_RETRIES", "0")
    monkeypatch.setenv("PATH", f"{Path(UV).parent}:/usr/bin:/bin")  # type: ignore[arg-type]
    closed = "http://127.0.0.1:9"  # the discard port: nothing listens, the connection is refused at once
    profile = _variant(
        tmp_path, "a6000-dflash-offline", {"torch_index": f"{closed}/whl/cu129", "index": f"{closed}/simple"}
    )
    result = cli("image", "lock", "--profile", profile, "--context", tmp_path)
    assert result.exit_code == 2
    assert f"cannot reach the indexes the image lock comes from ({closed}/whl/cu129 for torch" in result.output
    assert "the lock stays unresolved" in result.output and "not written" in result.output
    assert "Traceback" not in result.output
    assert not (tmp_path / "locks").exists()


@needs_uv
def test_image_lock_writes_hashed_exact_pins_with_torch_from_the_cuda_index(
    tmp_path: Path, cli: Any, monkeypatch: Any
) -> None:
    """Local indexes: the CUDA one serves torch 2.11.0+cu129, the other torch 2.11.0 (PyPI's CUDA 13
    build in real life) and the rest; the lock must take torch from the CUDA index, every line
    exact and hashed, and the file must be what `image build` then accepts once pinned."""
    monkeypatch.setenv("UV_CACHE_DIR", str(tmp_path / "uv-cache"))
    wheels = tmp_path / "wheels"
    cuda_index = _simple_index(
        tmp_path / "idx" / "cu129", [_wheel(wheels / "cu", "torch", "2.11.0+cu129", ["filelock"])]
    )
    pypi = _simple_index(
        tmp_path / "idx" / "pypi",
        [_wheel(wheels / "py", "torch", "2.11.0", ["filelock"]), _wheel(wheels / "py", "filelock", "3.20.0")],
    )
    profile_path = _variant(
        tmp_path, "a6000-dflash-local", {"torch_index": cuda_index, "index": pypi, "requires": ["torch==2.11.0"]}
    )
    result = cli("image", "lock", "--profile", profile_path, "--context", tmp_path, "--uv", UV, "--json")
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    lock_file = tmp_path / "locks" / "images" / "a6000-dflash-cu129.txt"
    assert data["lock"] == str(lock_file) and data["pinned"] is False and data["requirements"] == 2
    text = lock_file.read_text()
    assert text.startswith("# specdeploy image lock: profile a6000-dflash-local, CUDA 12.9")
    locked = {r.name: r for r in image_lock.parse(text, "lock")}
    assert locked["torch"].version == "2.11.0+cu129" and locked["filelock"].version == "3.20.0"
    cu_wheel = wheels / "cu" / "torch-2.11.0+cu129-py3-none-any.whl"
    assert f"sha256:{hashlib.sha256(cu_wheel.read_bytes()).hexdigest()}" in locked["torch"].hashes
    assert data["sha256"] == image_lock.file_sha256(lock_file)

    # pinned in the profile, the build takes it; a one-byte change to the file is refused
    pinned = variants.derive(
        load_profile(profile_path),
        "a6000-dflash-local",
        {"engine": {"image": {"lock": {"value": data["sha256"], "provenance": "verified", "source": "image lock"}}}},
    )
    assert image_lock.require(pinned, tmp_path) == ("locks/images/a6000-dflash-cu129.txt", data["sha256"])
    lock_file.write_text(text.replace("3.20.0", "3.20.1", 1))
    with pytest.raises(image_lock.ImageLockError, match="is not the lock the profile pins"):
        image_lock.require(pinned, tmp_path)


def test_image_build_refuses_an_unresolved_image_lock_naming_it_and_image_lock(cli: Any) -> None:
    result = cli("image", "build", "--profile", "a6000-dflash", "--context", ROOT, "--dry-run")
    assert result.exit_code == 2
    out = " ".join(result.output.split())
    assert "field engine.image.lock (locks/images/a6000-dflash-cu129.txt) is unresolved" in out
    assert "specdeploy image lock --profile a6000-dflash" in out and "--unlocked" in out


def test_an_unlocked_build_is_labelled_unlocked_and_takes_the_profiles_cuda_variant(cli: Any) -> None:
    result = cli("image", "build", "--profile", "a6000-dflash", "--context", ROOT, "--dry-run", "--unlocked")
    assert result.exit_code == 0, result.output
    for arg in (
        "IMAGE_LOCK_SHA256=unlocked",
        "IMAGE_LOCK=locks/images/a6000-dflash-cu129.txt",
        "TORCH_CUDA=12.9",
        "VLLM_PRECOMPILED_WHEEL_VARIANT=cu129",
        "TORCH_INDEX=https://download.pytorch.org/whl/cu129",
    ):
        assert f"--build-arg {arg}" in result.stdout
    upstream = cli("image", "build", "--profile", "a6000-mtp", "--dry-run", "--unlocked")
    assert upstream.exit_code == 2 and "installs no image lock" in upstream.output


def test_a_lock_file_without_hashes_or_with_a_range_is_refused_by_line() -> None:
    with pytest.raises(image_lock.ImageLockError, match=r"line 2: expected at least one --hash=sha256:"):
        image_lock.parse("# header\ntorch==2.11.0+cu129\n", "x.txt")
    with pytest.raises(image_lock.ImageLockError, match=r"line 1: expected an exact name==version"):
        image_lock.parse("torch>=2.11 \\\n    --hash=sha256:" + "0" * 64 + "\n", "x.txt")


def test_profile_refuses_a_torch_index_or_lock_name_of_another_cuda() -> None:
    from specdeploy.core.errors import ProfileError

    with pytest.raises(ProfileError, match="lock.torch_index: expected the index serving torch for CUDA 12.9"):
        variants.derive(
            load_profile("a6000-dflash"),
            "x",
            {"engine": {"image": {"lock": {"torch_index": "https://download.pytorch.org/whl/cu130"}}}},
        )
    with pytest.raises(ProfileError, match="lock.file: expected a name ending -cu129.txt"):
        variants.derive(
            load_profile("a6000-dflash"), "x", {"engine": {"image": {"lock": {"file": "locks/images/x-cu130.txt"}}}}
        )


def _labels(profile: Profile, **extra: str) -> dict[str, str]:
    return {images.CUDA_LABEL: "12.9", **extra}


def test_image_check_refuses_an_unlocked_image_and_a_lock_label_other_than_the_pin() -> None:
    profile = load_profile("a6000-dflash")
    rows = {r.label: r for r in ensure.cuda_lock_rows(profile, _labels(profile, **{images.LOCK_LABEL: "unlocked"}))}
    assert rows[images.CUDA_LABEL].ok and not rows[images.LOCK_LABEL].ok
    assert rows[images.LOCK_LABEL].expected.startswith("(unresolved in the profile")
    digest = "sha256:" + "a" * 64
    pinned = variants.derive(
        profile,
        "a6000-dflash-pinned",
        {"engine": {"image": {"lock": {"value": digest, "provenance": "verified", "source": "x y"}}}},
    )
    good = ensure.cuda_lock_rows(pinned, _labels(pinned, **{images.LOCK_LABEL: digest}))
    assert all(r.ok for r in good)
    wrong = ensure.cuda_lock_rows(pinned, {images.CUDA_LABEL: "13.0", images.LOCK_LABEL: "sha256:" + "b" * 64})
    assert [r.ok for r in wrong] == [False, False] and wrong[0].found == "13.0"


def test_image_check_compares_the_lock_inside_the_image_with_the_profiles(tmp_path: Path, monkeypatch: Any) -> None:
    digest = "c" * 64
    pinned = variants.derive(
        load_profile("a6000-dflash"),
        "a6000-dflash-pinned",
        {"engine": {"image": {"lock": {"value": f"sha256:{digest}", "provenance": "verified", "source": "x y"}}}},
    )
    inside = {"vllm": "0.20.2rc1.dev206+g23002d3f3", "torch_cuda": "12.9", "image_lock_sha256": digest}
    monkeypatch.setattr(ensure, "inspect_inside", lambda image, podman: inside)
    rows = {r.label: r for r in ensure.inside_rows("img", pinned, "podman")}
    assert rows["inside: /opt/specdeploy/image.lock sha256"].ok
    inside["image_lock_sha256"] = "d" * 64
    rows = {r.label: r for r in ensure.inside_rows("img", pinned, "podman")}
    assert not rows["inside: /opt/specdeploy/image.lock sha256"].ok


def test_image_freeze_writes_the_upstream_images_pip_freeze_under_a_reference_only_header(tmp_path: Path) -> None:
    podman = tmp_path / "podman"
    podman.write_text(
        '#!/bin/sh\ncase "$*" in\n'
        "  *'pip freeze'*) printf 'torch==2.11.0+cu129\\nvllm==0.29.0+cu129\\n' ;;\n"
        "  *'{{.Digest}}'*) echo sha256:" + "e" * 64 + " ;;\n"
        "  *) exit 3 ;;\nesac\n"
    )
    podman.chmod(0o755)
    out = ensure.freeze("docker.io/vllm/vllm-openai:v0.29.0-cu129", tmp_path / "freeze.txt", podman=str(podman))
    text = out.read_text()
    assert text.startswith("# REFERENCE ONLY: `pip freeze` inside docker.io/vllm/vllm-openai:v0.29.0-cu129 (sha256:eee")
    assert "nothing is installed from this list" in text and text.endswith("vllm==0.29.0+cu129\n")


def test_the_locked_profiles_lock_lives_under_locks_images_unresolved_and_not_invented() -> None:
    lock = load_profile("a6000-dflash").engine.image.lock  # type: ignore[union-attr]
    assert lock is not None and not lock.resolved and "download.pytorch.org/whl/cu129" in lock.source
    assert not (ROOT / lock.file).exists(), "a GPU image lock cannot be produced here: it must not exist"


def test_gpu_runtime_gets_exact_package_versions_and_refuses_what_the_profile_leaves_unpinned() -> None:
    """`specdeploy facts` hands gpu_runtime `name=version` for each pinned package and each unpinned
    one's source (the role asserts there is none), and the check image by digest or nothing."""
    from specdeploy.profile.facts import host_pins

    pins = host_pins(load_profile("a6000-dflash"))
    assert pins["pinned"] == {"podman": "podman=5.4.2+ds1-2+b2", "catatonit": "catatonit=0.2.1-2+b14"}
    assert set(pins["unresolved"]) == {
        "nvidia-container-toolkit",
        "nvidia-container-toolkit-base",
        "libnvidia-container-tools",
        "libnvidia-container1",
    }
    assert pins["check_image"] is None and "busybox:1.37" in pins["check_image_source"]
    digest = "sha256:" + "f" * 64
    pinned = variants.derive(
        load_profile("a6000-dflash"),
        "a6000-dflash-host",
        {"host": {"check_image": {"digest": {"value": digest, "provenance": "verified", "source": "podman pull"}}}},
    )
    assert host_pins(pinned)["check_image"] == f"docker.io/library/busybox@{digest}"
    tasks = (ROOT / "ansible" / "roles" / "gpu_runtime" / "tasks" / "main.yml").read_text()
    assert "gpu_runtime_check_image" not in tasks and "specdeploy_facts.host.check_image" in tasks


def _locked_context(tmp_path: Path) -> tuple[Path, dict[str, Any]]:
    """A build context holding a hashed lock for a6000-dflash, and the lock section pinning it."""
    lock = load_profile("a6000-dflash").engine.image.lock  # type: ignore[union-attr]
    assert lock is not None
    context = tmp_path / "context"
    (context / lock.file).parent.mkdir(parents=True)
    (context / lock.file).write_text("pip==26.3 \\\n    --hash=sha256:" + "a" * 64 + "\n")
    (context / "Containerfile.vllm-pr40898").write_bytes((ROOT / "Containerfile.vllm-pr40898").read_bytes())
    digest = hashlib.sha256((context / lock.file).read_bytes()).hexdigest()
    return context, {"value": digest, "provenance": "verified", "source": "a test lock"}


def test_a_locked_pr_build_refuses_precompiled_binaries_it_cannot_check(tmp_path: Path, cli: Any) -> None:
    """The precompiled fast path takes vLLM's binaries from wheels.vllm.ai: a locked build needs
    their URL and sha256 in the profile (checked in the build stage), else it is refused naming
    engine.source.precompiled_wheel; with them, the build args carry both."""
    context, pinned = _locked_context(tmp_path)
    path = _variant(tmp_path, "a6000-dflash-locked", pinned)
    refused = cli("image", "build", "--profile", path, "--context", context, "--dry-run")
    assert refused.exit_code == 2, refused.output
    out = " ".join(refused.output.split())
    assert "field engine.source.precompiled_wheel is unresolved" in out and "--unlocked" in out

    url = "https://wheels.vllm.ai/" + "1" * 40 + "/cu129/vllm-1.0.0.dev-cp38-abi3-manylinux1_x86_64.whl"
    wheel = {"value": "b" * 64, "provenance": "verified", "source": "a test wheel", "url": url}
    profile = variants.derive(
        load_profile(path), "a6000-dflash-locked", {"engine": {"source": {"precompiled_wheel": wheel}}}
    )
    resolved = variants.materialize(profile, tmp_path / "resolved")
    built = cli("image", "build", "--profile", resolved, "--context", context, "--dry-run")
    assert built.exit_code == 0, built.output
    assert f"--build-arg PRECOMPILED_WHEEL_URL={url}" in built.stdout
    assert f"--build-arg PRECOMPILED_WHEEL_SHA256=sha256:{'b' * 64}" in built.stdout


def test_a_precompiled_wheel_pin_needs_an_https_url_and_a_sha256() -> None:
    from pydantic import ValidationError

    from specdeploy.profile.schema import PrecompiledWheel

    with pytest.raises(ValidationError, match="needs its https:// url"):
        PrecompiledWheel(value="c" * 64, provenance="verified", source="x y z")
    with pytest.raises(ValidationError, match="expected the wheel's sha256"):
        PrecompiledWheel(value="nope", provenance="verified", source="x y z", url="https://x/y.whl")
