"""Reading rendered units back, for tests and audits."""

from __future__ import annotations

import shlex


def exec_argv(unit_text: str) -> list[str]:
    """The argv of a rendered unit's Exec/ExecStart line, unquoted."""
    for line in unit_text.splitlines():
        if line.startswith(("ExecStart=", "Exec=")):
            return shlex.split(line.split("=", 1)[1].replace("$$", "$").replace("%%", "%"))
    raise ValueError("no Exec line")
