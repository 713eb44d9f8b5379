"""The build guards against fixture source trees (real git repositories made here) and the
host-side refusals of `image build`, which need no podman."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import pytest
from tests.support.variants import engine_version
from tests.support.vllm_repo import fixture_vllm_repo, git

from specdeploy.images import build as images
from specdeploy.images import guards as build_guards
from specdeploy.profile import load_profile
from specdeploy.profile.lock import Lock
from specdeploy.rehearsal import variants


def test_pinned_commit_with_one_shift_passes(tmp_path: Path) -> None:
    repo, head, base = fixture_vllm_repo(tmp_path)
    assert build_guards.check_vllm_source(repo, commit=head, merge_base=base, build_mode="precompiled") == []
    assert (
        build_guards.main(
            ["vllm", "--source", str(repo), "--commit", head, "--merge-base", base, "--build-mode", "precompiled"]
        )
        == 0
    )


@pytest.mark.parametrize(
    ("shifts", "needle"), [(0, "missing (the build lacks #40727)"), (2, "present 2 times (#40727 applied twice)")]
)
def test_shift_must_occur_exactly_once(tmp_path: Path, shifts: int, needle: str) -> None:
    repo, head, base = fixture_vllm_repo(tmp_path, shifts=shifts)
    errors = build_guards.check_vllm_source(repo, commit=head, merge_base=base, build_mode="full")
    assert len(errors) == 1 and needle in errors[0]


def test_another_commit_is_refused(tmp_path: Path) -> None:
    repo, head, base = fixture_vllm_repo(tmp_path)
    errors = build_guards.check_vllm_source(repo, commit="f" * 40, merge_base=base, build_mode="full")
    assert errors and f"checked-out commit is {head}" in errors[0]


def test_native_changes_need_the_full_build(tmp_path: Path, capsys: Any) -> None:
    repo, head, base = fixture_vllm_repo(tmp_path, touch_native=True)
    assert build_guards.check_vllm_source(repo, commit=head, merge_base=base, build_mode="full") == []
    errors = build_guards.check_vllm_source(repo, commit=head, merge_base=base, build_mode="precompiled")
    assert errors and "csrc/attention.cu" in errors[0] and "BUILD_MODE=full" in errors[0]
    assert (
        build_guards.main(
            ["vllm", "--source", str(repo), "--commit", head, "--merge-base", base, "--build-mode", "precompiled"]
        )
        == 1
    )
    assert "specdeploy build guard:" in capsys.readouterr().err


def test_precompiled_without_merge_base_is_refused(tmp_path: Path) -> None:
    repo, head, _ = fixture_vllm_repo(tmp_path)
    errors = build_guards.check_vllm_source(repo, commit=head, merge_base="", build_mode="precompiled")
    assert errors == ["the precompiled path needs the merge-base commit (empty means a 404 on the wheel)"]


@pytest.mark.parametrize(
    ("installed", "errors"),
    [
        ("0.5.19", 0),
        ("0.5.17", 2),  # not the pin, and known bad
        ("0.5.13.post2", 2),
        ("0.5.21", 2),  # CUDA 13 only
        (None, 1),
    ],
)
def test_sglang_version_guard(installed: str | None, errors: int) -> None:
    specs = [b.version_spec for b in load_profile("a6000-mtp").engine.known_bad if b.version_spec]
    found = build_guards.check_release(
        "sglang", installed, expected="0.5.19", known_bad=specs, torch_cuda="12.9", cuda="12.9"
    )
    assert len(found) == errors


@pytest.mark.parametrize(
    ("installed", "torch_cuda", "expect"),
    [
        ("0.29.0", "12.9", []),
        ("0.29.0+cu129", "12.9", []),  # the official image's local version part is the same release
        ("0.28.0", "12.9", ["vllm 0.28.0 is installed, the profile pins 0.29.0"]),
        ("0.25.1", "12.9", ["vllm 0.25.1 is installed, the profile pins 0.29.0", "known-bad list (<0.26.0)"]),
        ("0.29.0", "13.0", ["torch in the image is built for CUDA 13.0, the base image is CUDA 12.9"]),
    ],
)
def test_stock_vllm_guard_names_the_installed_version_and_torch_cuda(
    installed: str, torch_cuda: str, expect: list[str]
) -> None:
    specs = [b.version_spec for b in load_profile("a6000-dflash-stock").engine.known_bad if b.version_spec]
    errors = build_guards.check_release(
        "vllm", installed, expected="0.29.0", known_bad=specs, torch_cuda=torch_cuda, cuda="12.9"
    )
    assert len(errors) == len(expect)
    for error, part in zip(errors, expect, strict=True):
        assert part in error


def test_a_pinned_git_build_version_must_match_whole() -> None:
    assert build_guards.same_release("0.20.2rc1.dev206+g23002d3f3", "0.20.2rc1.dev206+g23002d3f3")
    assert not build_guards.same_release("0.20.2rc1.dev206+gdeadbeef0", "0.20.2rc1.dev206+g23002d3f3")


def test_inspect_reads_torch_cuda_without_importing_torch(tmp_path: Path, monkeypatch: Any, capsys: Any) -> None:
    """A stand-in torch package whose import would fail: inspect must read version.py only."""
    torch = tmp_path / "torch"
    torch.mkdir()
    (torch / "__init__.py").write_text("raise ImportError('no GPU here')\n")
    (torch / "version.py").write_text("__version__ = '2.13.0+cu129'\ncuda: Optional[str] = '12.9'\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    # an earlier test in this process may have imported the real (CPU) torch: look it up afresh
    for name in [m for m in sys.modules if m == "torch" or m.startswith("torch.")]:
        monkeypatch.delitem(sys.modules, name)
    assert build_guards.torch_cuda() == "12.9"
    assert build_guards.main(["inspect"]) == 0
    assert json.loads(capsys.readouterr().out)["torch_cuda"] == "12.9"


def test_merge_base_is_computed_from_git_and_recorded(tmp_path: Path) -> None:
    """With a local repository standing in for GitHub: fetch the PR ref and main, compute
    the merge-base, record it in the lock; a PR that moved is refused."""
    repo, head, base = fixture_vllm_repo(tmp_path)
    git(repo, "update-ref", "refs/pull/40898/head", head)
    profile = variants.derive(
        load_profile("a6000-dflash"),
        "a6000-dflash-local",
        {
            "engine": {
                "source": {
                    "git_repo": str(repo),
                    "commit": {"value": head, "provenance": "rehearsal", "source": "fixture"},
                }
            }
        },
    )
    lock = Lock(tmp_path / "specdeploy.lock")
    assert images.resolve_merge_base(profile, lock) == base
    assert lock.value(profile.name, "engine.source.merge_base") == base

    moved = variants.derive(
        profile,
        "a6000-dflash-moved",
        {"engine": {"source": {"commit": {"value": base, "provenance": "rehearsal", "source": "x y"}}}},
    )
    with pytest.raises(images.ImageError, match="now points at"):
        images.resolve_merge_base(moved, Lock(tmp_path / "other.lock"))


def test_image_build_refuses_known_bad_before_podman(tmp_path: Path) -> None:
    mtp = engine_version(load_profile("a6000-mtp"), "0.5.17")
    with pytest.raises(
        images.ImageError, match=r"refusing to build: version 0.5.17 is known bad \(==0.5.17.\*\): token loops"
    ):
        images.build(mtp, lock=Lock(tmp_path / "l"), context=tmp_path, podman="/nonexistent/podman")
    bad_commit = "53b9640fb" + "0" * 31
    dflash = variants.derive(
        load_profile("a6000-dflash"),
        "a6000-dflash-old",
        {"engine": {"source": {"commit": {"value": bad_commit, "provenance": "reported", "source": "#41190"}}}},
    )
    with pytest.raises(images.ImageError, match="cudaErrorIllegalAddress"):
        images.build(dflash, lock=Lock(tmp_path / "l"), context=tmp_path, podman="/nonexistent/podman")


def test_cuda_must_fit_the_host_driver(tmp_path: Path) -> None:
    profile = load_profile("a6000-dflash")
    images.check_driver(profile, "550.127.05")  # CUDA 12.9 on R550: fine
    cuda13 = variants.derive(
        profile,
        "a6000-dflash-cu13",
        {
            "engine": {
                "image": {
                    "base": {"name": "docker.io/nvidia/cuda:13.0.2-devel-ubuntu24.04"},
                    "lock": {
                        "file": "locks/images/a6000-dflash-cu130.txt",
                        "torch_index": "https://download.pytorch.org/whl/cu130",
                    },
                }
            }
        },
    )
    with pytest.raises(images.ImageError, match="CUDA 13, which needs driver R580"):
        images.check_driver(cuda13, "570.86.15")


def test_dry_run_renders_every_arg_from_the_profile(cli: Any) -> None:
    result = cli("image", "build", "--profile", "a6000-mtp", "--dry-run")
    assert result.exit_code == 0
    assert "--build-arg SGLANG_VERSION=0.5.19" in result.stdout
    assert "BASE_IMAGE=docker.io/lmsysorg/sglang:v0.5.19-cu129@<unresolved>" in result.stdout
