"""Running podman (or the `--podman` a user names) without a traceback. The stat-only checks of
the paths an image or engine step hands to it are core.files' (`regular_file`, `directory`).

Failures prevented (tried as a new user would): `image check --podman /nope` and an `image ensure`
whose podman was not executable ended in Python tracebacks; `image build` reported a podman that
exists but cannot be run as "not found, install podman"; an archive that was a directory, a
missing build context or a FIFO in place of an archive reached podman (or blocked it). Every
refusal here is exit 2 (bad input) and names the option, what was expected and what was found.
"""

from __future__ import annotations

import os
import shlex
import shutil
import stat
import subprocess
from pathlib import Path

from specdeploy.core.errors import ProgramError
from specdeploy.core.files import FILE_KINDS

INSTALL_HINT = "install podman >= 4.5 (the gpu_runtime role does), or pass --podman PATH to a podman that runs"


def command(podman: str) -> list[str]:
    """`podman` may carry global flags, e.g. "podman --runtime runc --cgroup-manager=cgroupfs"."""
    try:
        argv = shlex.split(podman)
    except ValueError as exc:
        raise ProgramError(
            f"--podman {podman!r}: expected a command line, found unbalanced quoting ({exc})",
            hint="quote the podman command as a shell would, e.g. --podman 'podman --runtime runc'",
        ) from None
    if not argv:
        raise ProgramError("--podman is empty: expected the podman executable", hint=INSTALL_HINT)
    return argv


def require(podman: str) -> list[str]:
    """The podman command line, once its program is known to exist and be executable: a
    ProgramError (exit 2) naming --podman and what was found otherwise. Nothing is run."""
    argv = command(podman)
    program = argv[0]
    if os.sep not in program:
        if shutil.which(program) is None:
            raise ProgramError(
                f"--podman {podman}: expected an executable podman, found no {program!r} on PATH; nothing was run",
                hint=INSTALL_HINT,
            )
        return argv
    path = Path(program)
    try:
        info = path.stat()
    except OSError as exc:
        found = "no such file" if isinstance(exc, FileNotFoundError) else (exc.strerror or str(exc))
        raise ProgramError(
            f"--podman {podman}: expected an executable podman, found {found} at {path}; nothing was run",
            hint=INSTALL_HINT,
        ) from None
    kind = stat.S_IFMT(info.st_mode)
    if kind != stat.S_IFREG:
        raise ProgramError(
            f"--podman {podman}: expected an executable podman, found {FILE_KINDS.get(kind, 'not a file')} at {path}; "
            "nothing was run",
            hint=INSTALL_HINT,
        )
    if not os.access(path, os.X_OK):
        raise ProgramError(
            f"--podman {podman}: {path} is not executable (mode {stat.S_IMODE(info.st_mode):04o}); nothing was run",
            hint=f"chmod +x {path}, or {INSTALL_HINT}",
        )
    return argv


def run(
    podman: str, *args: str, capture: bool = True, stdin: bytes | None = None, text: bool = True
) -> subprocess.CompletedProcess:  # type: ignore[type-arg]
    """Run podman with `args`; a podman that cannot be started is a ProgramError, not a traceback."""
    argv = [*require(podman), *args]
    try:
        if stdin is not None:
            return subprocess.run(argv, input=stdin, capture_output=capture)
        return subprocess.run(argv, capture_output=capture, text=text)
    except OSError as exc:  # exists but cannot run: a script without its interpreter, no exec permission
        raise ProgramError(
            f"--podman {podman}: cannot run it: {exc.strerror or exc}; nothing was done",
            hint=INSTALL_HINT,
        ) from None
