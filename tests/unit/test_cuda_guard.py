"""The CUDA guard (`build_guards.py cuda`) against fixture site-packages holding real compiled ELF
objects: a stub `libcudart.so.N` built here with its soname, and a `vllm/_C.abi3.so` linked against
it, so the DT_NEEDED entry the guard reads is the one a real linker wrote. The guard runs as the
image build runs it: a separate Python process with the fixture first on its path."""

from __future__ import annotations

import struct
import subprocess
import sys
from pathlib import Path

import pytest
from tests.support.elf import GCC, compile_extension

from specdeploy.images import guards

GUARD = Path(guards.__file__)
needs_gcc = pytest.mark.skipif(GCC is None, reason="gcc is not installed: the fixture ELF objects cannot be built")


def _site(tmp_path: Path, *, torch_cuda: str, cudart_major: int) -> Path:
    """A site-packages with a torch whose version.py reports `torch_cuda` (its import would fail:
    the guard must not import it) and a vllm package whose extension needs libcudart.so.<major>."""
    site = tmp_path / f"site-{torch_cuda}-{cudart_major}"
    torch = site / "torch"
    torch.mkdir(parents=True)
    (torch / "__init__.py").write_text("raise ImportError('the guard must not import torch')\n")
    (torch / "version.py").write_text(f"__version__ = '2.11.0'\ncuda: Optional[str] = '{torch_cuda}'\n")
    vllm = site / "vllm"
    compile_extension(vllm, cudart_major)
    (vllm / "__init__.py").write_text("raise ImportError('the guard must not import vllm')\n")
    return site


def _run_guard(site: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {"PYTHONPATH": str(site), "PATH": "/usr/bin:/bin"}
    return subprocess.run([sys.executable, str(GUARD), *args], capture_output=True, text=True, env=env)


@needs_gcc
def test_the_elf_reader_names_the_cuda_runtime_a_real_linked_extension_needs(tmp_path: Path) -> None:
    extension = compile_extension(tmp_path / "vllm", 12)
    needed = guards.elf_needed(extension)
    assert "libcudart.so.12" in needed and "libc.so.6" in needed


@needs_gcc
def test_a_torch_reporting_cuda_13_and_binaries_linking_libcudart_13_fail_the_cuda_129_build(tmp_path: Path) -> None:
    site = _site(tmp_path, torch_cuda="13.0", cudart_major=13)
    done = _run_guard(site, "cuda", "--expected", "12.9", "--binaries", "vllm")
    assert done.returncode == 1, done.stdout + done.stderr
    assert "torch.version.cuda is 13.0, the profile's CUDA variant is 12.9" in done.stderr
    assert "vllm/_C.abi3.so links libcudart.so.13: built for CUDA 13" in done.stderr
    assert "VLLM_PRECOMPILED_WHEEL_VARIANT must be cu129" in done.stderr


@needs_gcc
def test_torch_and_binaries_of_the_profiles_cuda_pass(tmp_path: Path) -> None:
    site = _site(tmp_path, torch_cuda="12.9", cudart_major=12)
    done = _run_guard(site, "cuda", "--expected", "12.9", "--binaries", "vllm")
    assert done.returncode == 0, done.stdout + done.stderr
    assert "vllm/_C.abi3.so needs libcudart.so.12" in done.stdout and "CUDA 12.9 checks passed" in done.stdout


@needs_gcc
def test_a_right_torch_with_binaries_of_another_cuda_still_fails(tmp_path: Path) -> None:
    """The precompiled-wheel trap: torch from the cu129 index, vLLM's binaries of the cu130 default."""
    site = _site(tmp_path, torch_cuda="12.9", cudart_major=13)
    done = _run_guard(site, "cuda", "--expected", "12.9", "--binaries", "vllm")
    assert done.returncode == 1 and "torch.version.cuda" not in done.stderr
    assert "libcudart.so.13" in done.stderr


def test_binaries_that_name_no_cuda_library_prove_nothing_and_fail() -> None:
    errors = guards.check_cuda("12.9", torch="12.9", binaries={})
    assert errors == [
        "no compiled extension of the engine names a CUDA runtime library (libcudart.so.N): the binaries' "
        "CUDA cannot be shown to be 12.x"
    ]


def test_the_elf_reader_refuses_what_is_not_elf(tmp_path: Path) -> None:
    text = tmp_path / "_C.abi3.so"
    text.write_text("not an ELF object\n")
    with pytest.raises(guards.ElfError, match="is not an ELF file"):
        guards.elf_needed(text)
    cut = tmp_path / "cut.so"
    # a 64-bit header whose program headers start past the end of the file
    header = b"\x7fELF\x02\x01\x01" + b"\0" * 25 + struct.pack("<Q", 10_000) + b"\0" * 14 + struct.pack("<HH", 56, 3)
    cut.write_bytes(header + b"\0" * 6)
    with pytest.raises(guards.ElfError, match="truncated or malformed"):
        guards.elf_needed(cut)
