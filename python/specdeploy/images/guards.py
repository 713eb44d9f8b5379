"""Build-time guards that run inside the image builds (standard library only).

In the field vLLM came from an unmerged PR installed by hand, and the DFlash +1
auxiliary-layer shift (#40727) was reportedly present in the #40898 head already —
applying it again shifts twice and lowers acceptance. The vLLM image build therefore
fails unless: the checked-out commit equals the pin, the shift occurs exactly once, and —
for the precompiled fast path — the PR touches no C++/CUDA sources (whose binaries the
merge-base wheel would not contain). The SGLang build fails unless the installed version
equals the pin and is on no known-bad list.

Usage inside a Containerfile:
    python3 build_guards.py vllm --source /src --commit SHA --merge-base SHA --build-mode precompiled
    python3 build_guards.py sglang --expected 0.5.19 --known-bad '==0.5.17.*' --known-bad '<0.5.10'
"""

from __future__ import annotations

import argparse
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


def check_sglang_version(installed: str | None, *, expected: str, known_bad: list[str]) -> list[str]:
    if installed is None:
        return ["sglang is not installed in the image"]
    errors = []
    if installed != expected:
        errors.append(f"sglang {installed} is installed, the profile pins {expected}")
    errors += [
        f"sglang {installed} is on the known-bad list ({spec})" for spec in known_bad if _matches(installed, spec)
    ]
    return errors


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="engine", required=True)
    v = sub.add_parser("vllm")
    v.add_argument("--source", type=Path, required=True)
    v.add_argument("--commit", required=True)
    v.add_argument("--merge-base", default="")
    v.add_argument("--build-mode", required=True)
    s = sub.add_parser("sglang")
    s.add_argument("--expected", required=True)
    s.add_argument("--known-bad", action="append", default=[])
    s.add_argument("--known-bad-list", default="", help="space-separated specs (one build arg)")
    args = parser.parse_args(argv)
    if args.engine == "vllm":
        errors = check_vllm_source(
            args.source, commit=args.commit, merge_base=args.merge_base, build_mode=args.build_mode
        )
    else:
        try:
            installed = metadata.version("sglang")
        except metadata.PackageNotFoundError:
            installed = None
        specs = args.known_bad + args.known_bad_list.split()
        errors = check_sglang_version(installed, expected=args.expected, known_bad=specs)
    for error in errors:
        print(f"specdeploy build guard: {error}", file=sys.stderr)
    if not errors:
        print(f"specdeploy build guard: {args.engine} checks passed")
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main())
