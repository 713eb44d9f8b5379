"""The rehearsal distribution's version and dependency, from the host package itself: the version is
specdeploy.__version__ (as the host package's is), and it needs exactly that specdeploy with the
rehearsal's and the controller's extras (their pins live once, in ../../pyproject.toml)."""

from __future__ import annotations

import re
from pathlib import Path

from hatchling.metadata.plugin.interface import MetadataHookInterface

PACKAGE = Path(__file__).resolve().parents[2] / "python" / "specdeploy" / "__init__.py"


class CustomMetadataHook(MetadataHookInterface):
    def update(self, metadata: dict) -> None:
        found = re.search(r'^__version__ = "([^"]+)"$', PACKAGE.read_text(), re.M)
        if found is None:
            raise ValueError(f"{PACKAGE}: no __version__ = \"...\" line; the rehearsal's version comes from it")
        metadata["version"] = found.group(1)
        metadata["dependencies"] = [f"specdeploy[rehearsal,controller]=={found.group(1)}"]
