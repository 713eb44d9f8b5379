"""Real ELF objects for the CUDA guard's tests: an engine extension linked against a stub CUDA runtime.

The guard reads which CUDA runtime (`libcudart.so.N`) an engine's compiled extension needs from
its ELF DT_NEEDED entries; these are built with gcc, not written by hand."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

GCC = shutil.which("gcc")


def compile_extension(directory: Path, cuda_major: int) -> Path:
    """`_C.abi3.so` linked against a stub `libcudart.so.<major>` (both real ELF objects)."""
    assert GCC is not None
    directory.mkdir(parents=True, exist_ok=True)
    build = directory.parent / f"build-cu{cuda_major}"
    build.mkdir(exist_ok=True)
    (build / "cudart.c").write_text("int cudaRuntimeGetVersion(int *v) { *v = 0; return 0; }\n")
    (build / "ext.c").write_text(
        "int cudaRuntimeGetVersion(int *v);\nint probe(void) { int v; return cudaRuntimeGetVersion(&v); }\n"
    )
    soname = f"libcudart.so.{cuda_major}"
    subprocess.run(
        [GCC, "-shared", "-fPIC", f"-Wl,-soname,{soname}", "-o", str(build / soname), str(build / "cudart.c")],
        check=True,
    )
    target = directory / "_C.abi3.so"
    subprocess.run(
        [GCC, "-shared", "-fPIC", "-Wl,--no-as-needed", "-o", str(target), str(build / "ext.c"), str(build / soname)],
        check=True,
    )
    return target
