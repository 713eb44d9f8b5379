"""Where the smoke, the gate and `rollback restore` write their reports, checked before they run.

Failures prevented (issue 20, D2/D16): `smoke --json` to an unwritable path printed
"verdict: pass (exit 0)" and then exited 1 on the write; a smoke that crashed left the previous
run's "pass" report where the role read it. A report file is now claimed before anything runs
— its directory must exist, the path must not be a directory, and a "running" placeholder is
written at once (so no earlier verdict survives the run) — and the final report is written on
every exit path, before the verdict is printed.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from specdeploy.core import atomic
from specdeploy.core.errors import UsageError, WriteError


def writable_problem(path: Path, *, create_parents: bool = False) -> str | None:
    """Why a file cannot be written at `path`, or None (a best guess: the write itself decides).
    With `create_parents`, missing directories are fine when the nearest existing one is writable."""
    if path.is_dir():
        return "is a directory"
    parent = path.parent
    if create_parents:
        while not parent.exists() and not parent.is_symlink() and parent != parent.parent:
            parent = parent.parent
    if not parent.exists():
        return f"is in {parent}, which does not exist"
    if not parent.is_dir():
        return f"is in {parent}, which is not a directory"
    if not os.access(parent, os.W_OK | os.X_OK):
        return f"is in {parent}, which this user cannot write to"
    return None


def check_writable(path: Path, option: str, *, create_parents: bool = False) -> None:
    """A UsageError (exit 2) naming `option` when a report cannot be written at `path`: checked
    before the command runs anything."""
    if problem := writable_problem(Path(path), create_parents=create_parents):
        raise UsageError(
            f"{option} {path} {problem}: the report could not be written there; nothing was run",
            hint=f"pass {option} a file path in an existing, writable directory",
        )


class ReportFile:
    """A report's file: claimed with a placeholder before the command runs, then written on every
    exit path (`write`)."""

    def __init__(self, path: Path, option: str) -> None:
        self.path = Path(path)
        self.option = option

    def claim(self, placeholder: dict[str, Any]) -> None:
        check_writable(self.path, self.option)
        try:
            atomic.write_json(self.path, placeholder)
        except WriteError as exc:
            raise UsageError(
                f"{self.option} {self.path}: the report could not be written there ({exc.message}); nothing was run",
                hint=f"pass {self.option} a file path in an existing, writable directory",
            ) from None

    def write(self, data: dict[str, Any]) -> None:
        atomic.write_json(self.path, data)
