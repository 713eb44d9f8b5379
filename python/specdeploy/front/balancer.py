"""The balancer a host migration drives (issue 23's cutover: NEW in, OLD drained, OLD out),
behind one interface with two implementations:

- `HAProxyBalancer`: the front's HAProxy, through its runtime API (`runtime.RuntimeApi`);
- `HookBalancer`: a site's own balancer, through a program the site provides — the documented
  hook (docs/front.md, "Your own balancer").

The contract both keep, verb by verb:

- `add(server)`: the server takes new requests; returns once it does (HAProxy: its health check
  reports it UP);
- `drain(server)`: the server takes no new request; returns once its in-flight requests have
  finished (HAProxy: `scur` down to 0) — an error when they do not finish in time;
- `remove(server)`: the server is out (HAProxy: `maint`), nothing reaches it;
- `status()`: every server with its state (ready, drain, maint) and requests in flight.

The hook is called as `HOOK VERB SERVER` (`HOOK status` for status): an absolute path to an
executable, no shell, standard input closed, a deadline, and an environment of PATH and LANG only
(never this process's, which may hold an API key). Exit 0 means done; anything else is a
`HookError` naming the argv, the exit code and the end of what it printed. `status` prints a JSON
list on standard output: `[{"name": "old", "state": "ready", "sessions": 3}, ...]`.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

from specdeploy.core.errors import SpecdeployError
from specdeploy.front.config import STATES, backup_name
from specdeploy.front.runtime import RuntimeApi, ServerStatus
from specdeploy.host import command

DEFAULT_DRAIN_TIMEOUT_S = 900.0  # a long streamed answer at a few tokens/s finishes well within
DEFAULT_UP_TIMEOUT_S = 60.0
DEFAULT_HOOK_TIMEOUT_S = 1200.0  # a hook's drain waits for in-flight requests, like ours
HOOK_OUTPUT_KEPT = 2000
HOOK_VERBS = ("add", "drain", "remove", "status")
DEFAULT_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"


class HookError(SpecdeployError):
    """The site's balancer hook is missing, not executable, failed, hung or printed nonsense."""

    exit_code = 1


@runtime_checkable
class Balancer(Protocol):
    """What a migration needs of the site's balancer (the contract: this module's docstring)."""

    def add(self, server: str) -> None: ...

    def drain(self, server: str) -> None: ...

    def remove(self, server: str) -> None: ...

    def status(self) -> list[ServerStatus]: ...


class HAProxyBalancer:
    """The front's HAProxy, through its runtime API."""

    def __init__(
        self,
        api: RuntimeApi,
        *,
        drain_timeout_s: float = DEFAULT_DRAIN_TIMEOUT_S,
        up_timeout_s: float = DEFAULT_UP_TIMEOUT_S,
        poll_s: float = 0.5,
        progress: Callable[[str, int, float], None] | None = None,
    ) -> None:
        self.api = api
        self.drain_timeout_s = drain_timeout_s
        self.up_timeout_s = up_timeout_s
        self.poll_s = poll_s
        self.progress = progress

    def add(self, server: str) -> None:
        self.api.set_state(server, "ready")
        self.api.wait_up(server, self.up_timeout_s, poll_s=self.poll_s)

    def drain(self, server: str) -> None:
        self.api.set_state(server, "drain")
        report = None
        if self.progress is not None:
            progress = self.progress

            def report(left: int, elapsed: float) -> None:
                progress(server, left, elapsed)

        self.api.wait_drained(server, self.drain_timeout_s, poll_s=self.poll_s, progress=report)

    def remove(self, server: str) -> None:
        self.api.set_state(server, "maint")

    def keep_as_backup(self, server: str) -> None:
        """`server`'s backup twin in (it takes requests only while no other server is up)."""
        self.api.set_state(backup_name(server), "ready")
        self.api.wait_up(backup_name(server), self.up_timeout_s, poll_s=self.poll_s)

    def status(self) -> list[ServerStatus]:
        return self.api.status()


def check_hook(path: str | Path) -> Path:
    """The hook: an absolute path to an executable regular file."""
    hook = Path(path)
    hint = "install the site's balancer hook there (chmod +x), or correct the path (docs/front.md, Your own balancer)"
    if not hook.is_absolute():
        raise HookError(f"balancer hook: expected an absolute path, found {str(path)!r}", hint=hint)
    if not hook.is_file() or not os.access(hook, os.X_OK):
        found = (
            "nothing"
            if not hook.exists()
            else "not a regular file"
            if not hook.is_file()
            else "a file that is not executable"
        )
        raise HookError(f"balancer hook {hook} is {found}: expected an executable file", hint=hint)
    return hook


class HookBalancer:
    """A site's own balancer, through its hook program (called `HOOK VERB SERVER`)."""

    def __init__(self, hook: str | Path, *, timeout_s: float = DEFAULT_HOOK_TIMEOUT_S) -> None:
        self.hook = check_hook(hook)
        self.timeout_s = timeout_s

    def _call(self, verb: str, *args: str) -> str:
        argv = [str(self.hook), verb, *args]
        env = {"PATH": os.environ.get("PATH") or DEFAULT_PATH, "LANG": "C.UTF-8"}
        shown = " ".join(argv)
        try:
            done = command.run(argv, timeout=self.timeout_s, limit=1024 * 1024, env=env)
        except command.ProgramRunError as exc:
            raise HookError(
                f"balancer hook `{shown}`: {exc.message}",
                hint="the hook must finish within its deadline (a drain returns once the server's requests "
                "finished); check the hook program",
            ) from None
        if done.returncode != 0:
            said = (done.stderr or done.stdout).strip()[-HOOK_OUTPUT_KEPT:]
            raise HookError(
                f"balancer hook `{shown}` exited {done.returncode}"
                + (f": {said}" if said else " (it printed nothing)"),
                hint=f"the site's balancer did not {verb} {' '.join(args) or 'its status'}: see what the hook says, "
                "fix it, and run the step again (nothing after this step was done)",
            )
        return done.stdout

    def add(self, server: str) -> None:
        self._call("add", server)

    def drain(self, server: str) -> None:
        self._call("drain", server)

    def remove(self, server: str) -> None:
        self._call("remove", server)

    def status(self) -> list[ServerStatus]:
        out = self._call("status")
        shown = f"balancer hook `{self.hook} status`"
        hint = 'it must print a JSON list: [{"name": "old", "state": "ready", "sessions": 0}, ...]'
        try:
            data = json.loads(out)
        except ValueError:
            raise HookError(f"{shown} printed no JSON: {out[:200]!r}", hint=hint) from None
        if not isinstance(data, list):
            raise HookError(f"{shown}: expected a JSON list, found {type(data).__name__}", hint=hint)
        found = []
        for item in data:
            if not (isinstance(item, dict) and isinstance(item.get("name"), str) and item.get("state") in STATES):
                raise HookError(
                    f"{shown}: expected each entry to hold a name and a state of {list(STATES)}, found {item!r}",
                    hint=hint,
                )
            sessions = item.get("sessions", 0)
            if isinstance(sessions, bool) or not isinstance(sessions, int) or sessions < 0:
                raise HookError(f"{shown}: sessions: expected a count, found {sessions!r}", hint=hint)
            found.append(
                ServerStatus(
                    name=item["name"],
                    address=str(item.get("address", "")),
                    state=item["state"],
                    status=str(item.get("status", item["state"])),
                    sessions=sessions,
                    weight=0,
                    served_total=0,  # a site's balancer's hook reports no total
                    check="",
                )
            )
        return found


def cutover(balancer: Balancer, *, new: str, old: str) -> list[dict[str, Any]]:
    """Issue 23's cutover through any balancer: NEW in, OLD drained (its in-flight requests
    finish), OLD out — and, where the balancer has backups (HAProxy), OLD kept as the backup that
    serves while NEW is down. Stops at the first step that fails (its error says which); returns
    the steps done with their durations."""
    steps: list[dict[str, Any]] = []
    actions: list[tuple[str, str, Callable[[str], None]]] = [
        ("add", new, balancer.add),
        ("drain", old, balancer.drain),
        ("remove", old, balancer.remove),
    ]
    if isinstance(balancer, HAProxyBalancer):
        actions.append(("backup", old, balancer.keep_as_backup))
    for verb, server, action in actions:
        started = time.monotonic()
        action(server)
        steps.append({"step": verb, "server": server, "elapsed_s": round(time.monotonic() - started, 3)})
    return steps
