"""Running a host program (nvidia-smi, podman, apt-cache, systemctl) with a deadline and a
ceiling on what it may print.

Failures prevented (tried as a hostile host would): an nvidia-smi that hung kept preflight
waiting 60 s and then ended in a traceback — and a stand-in script's child (`sleep`) kept the
pipe open past the kill, so the wait never ended; an nvidia-smi that was not executable, or a
script without its interpreter, was a traceback too. Here the program runs in its own process
group, is killed with everything it started when the deadline passes, its output is read up to
a ceiling (a program printing forever is stopped), bytes that are not UTF-8 are replaced, and
every way it can fail is a `ProgramRunError` whose `reason` the caller turns into its own
message (a failed preflight check, a CDI error).
"""

from __future__ import annotations

import contextlib
import os
import selectors
import signal
import subprocess
import time
from dataclasses import dataclass

from specdeploy.core.errors import SpecdeployError

DEFAULT_TIMEOUT_S = 60.0  # what a real nvidia-smi -q or topo -m on an 8-GPU host needs, with room to spare
OUTPUT_LIMIT = 16 * 1024 * 1024  # nvidia-smi -q on 8 GPUs prints ~50 KB


class ProgramRunError(SpecdeployError):
    """A host program that is missing, cannot be run, did not finish in time or printed too much.
    `reason` is one of "missing", "not executable", "timeout", "output"."""

    def __init__(self, message: str, *, reason: str, hint: str | None = None) -> None:
        super().__init__(message, hint=hint)
        self.reason = reason


@dataclass(frozen=True)
class Finished:
    returncode: int
    stdout: str
    stderr: str


def _kill(proc: subprocess.Popen[bytes]) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGKILL)  # the program and whatever it started (its own group)
    with contextlib.suppress(ProcessLookupError):
        proc.kill()
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(5)


def run(
    argv: list[str],
    *,
    timeout: float = DEFAULT_TIMEOUT_S,
    limit: int = OUTPUT_LIMIT,
    env: dict[str, str] | None = None,
    account: tuple[int, int] | None = None,
) -> Finished:
    """Run `argv` (stdin closed) and return its exit code and output, or raise ProgramRunError.
    `env`: the program's whole environment (None: this process's). `account`: the (uid, gid) it
    runs as, with no supplementary group (a root caller dropping privileges; None: this process's)."""
    program = argv[0] if argv else ""
    shown = " ".join(argv)
    if not program:
        raise ProgramRunError("no program given (an empty path)", reason="missing")
    try:
        proc = subprocess.Popen(
            argv,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            start_new_session=True,
            env=env,
            **({"user": account[0], "group": account[1], "extra_groups": []} if account else {}),
        )
    except FileNotFoundError:
        raise ProgramRunError(f"{program} not found", reason="missing") from None
    except PermissionError:
        raise ProgramRunError(
            f"{program} cannot be run: permission denied (not an executable file)", reason="not executable"
        ) from None
    except OSError as exc:  # a script without its interpreter (ENOEXEC), a directory, a loop of links
        raise ProgramRunError(f"{program} cannot be run: {exc.strerror or exc}", reason="not executable") from None
    assert proc.stdout is not None and proc.stderr is not None
    out_fd, err_fd = proc.stdout.fileno(), proc.stderr.fileno()
    deadline = time.monotonic() + timeout
    buffers: dict[int, list[bytes]] = {out_fd: [], err_fd: []}
    total = 0
    try:
        with selectors.DefaultSelector() as selector:
            selector.register(proc.stdout, selectors.EVENT_READ)
            selector.register(proc.stderr, selectors.EVENT_READ)
            while selector.get_map():
                left = deadline - time.monotonic()
                if left <= 0:
                    raise ProgramRunError(f"{shown} did not finish within {timeout:g} s", reason="timeout")
                for key, _ in selector.select(left):
                    data = os.read(key.fd, 1 << 16)
                    if not data:
                        selector.unregister(key.fileobj)
                        continue
                    buffers[key.fd].append(data)
                    total += len(data)
                    if total > limit:
                        raise ProgramRunError(
                            f"{shown} printed more than {limit // (1024 * 1024)} MiB; stopped", reason="output"
                        )
        try:
            proc.wait(max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            raise ProgramRunError(f"{shown} did not finish within {timeout:g} s", reason="timeout") from None
    except ProgramRunError:
        _kill(proc)
        raise
    finally:
        proc.stdout.close()
        proc.stderr.close()

    def text(fd: int) -> str:
        return b"".join(buffers[fd]).decode("utf-8", errors="replace")

    return Finished(proc.returncode, text(out_fd), text(err_fd))
