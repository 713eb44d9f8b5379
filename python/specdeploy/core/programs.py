"""Where the controller's ansible-core programs are found: one rule for every caller.

Failure prevented: the rehearsal looked only beside this Python and `migrate` only on PATH, so
`.venv/bin/specdeploy rehearsal migrate` (the venv not on PATH) first failed where the rehearsal
deploy, run the same way, worked. Now both take the program of this Python's own environment (the
ansible-core of the lock, the one the tests run) and fall back to PATH (a `nix run`, or ansible-core
installed beside a system Python), and a missing one is a ProgramError saying what cannot be done.
"""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

from specdeploy.core.errors import ProgramError


def ansible_program(name: str, *, why: str) -> Path:
    """`name` (ansible-playbook, ansible-vault, ansible-inventory) beside this Python, else on
    PATH; a ProgramError naming `why` it is needed when neither has it."""
    here = Path(sys.executable).parent
    found = shutil.which(name, path=str(here)) or shutil.which(name)
    if found is None:
        raise ProgramError(
            f"{name} is neither beside {sys.executable} nor on PATH: {why}",
            hint="run from the project's venv (bash scripts/setup.sh prints its path; its bin has ansible-core's "
            "programs), or install ansible-core on PATH, then run this again",
        )
    return Path(found)
