"""Run the network-facing part of a command as an unprivileged account.

Failure prevented: the weight fetch ran as root. It reads a remote server's answers (a hub's
file list, its downloads), so a mistake in checking them, here or in the hub client, was a
root process reading, writing or deleting any file. As its own account (`specdeploy-fetch`,
no login, no supplementary groups), what it can touch is what that account owns: the models
directory. The caller keeps what only root may touch (the lock, the token's source) and is
handed back a JSON result, which it checks as input from the network.

    done = run_as(account("specdeploy-fetch"), lambda: {"files": 3}, home=models / ".fetch-home")
"""

from __future__ import annotations

import importlib
import json
import os
import pkgutil
import pwd
import sys
import traceback
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from specdeploy.core.errors import SpecdeployError, UsageError

RESULT_LIMIT = 64 * 1024 * 1024  # a result is a file list with hashes: kilobytes


@dataclass(frozen=True)
class Account:
    name: str
    uid: int
    gid: int  # its primary group: the files it writes get this group


def account(name: str) -> Account:
    """The account `name`, refused (exit 2) when it does not exist, is root, or this process is not
    root (only root can become another account)."""
    try:
        entry = pwd.getpwnam(name)
    except KeyError:
        raise UsageError(
            f"--as-user {name!r}: no such account on this host; nothing was fetched",
            hint="create it (the deploy's specdeploy role does: a system account without login), or leave "
            "--as-user out to fetch as yourself",
        ) from None
    if entry.pw_uid == 0:
        raise UsageError(
            f"--as-user {name!r} is root (uid 0): expected an unprivileged account; nothing was fetched",
            hint="pass the fetch account (specdeploy-fetch on a deployed host)",
        )
    if os.geteuid() != 0:
        raise UsageError(
            f"--as-user {name!r}: only root can run the fetch as another account (this process is uid "
            f"{os.geteuid()}); nothing was fetched",
            hint="run it as root (the deploy does), or leave --as-user out to fetch as yourself",
        )
    return Account(name, entry.pw_uid, entry.pw_gid)


def preload(packages: tuple[str, ...]) -> None:
    """Import `packages` and every submodule they have (those that cannot load here, e.g. an optional
    dependency missing, are skipped): nothing is left to import lazily after `run_as` drops to an
    account that may not read the install."""
    for name in packages:
        try:
            package = importlib.import_module(name)
        except ImportError:
            continue
        for module in pkgutil.walk_packages(getattr(package, "__path__", []), prefix=f"{name}."):
            skipped = (".tests", "._vendor", "__main__", ".cli.", ".commands.")
            if module.name in sys.modules or any(part in f"{module.name}." for part in skipped):
                continue
            try:
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore")
                    importlib.import_module(module.name)
            except Exception:  # noqa: BLE001, S112 - an optional part: skipped, as its users would be
                continue


def _become(who: Account, home: Path) -> None:
    os.setgroups([])
    os.setgid(who.gid)
    os.setuid(who.uid)
    os.umask(0o027)  # what it writes: the engine's group reads, nobody else
    os.environ.update({"HOME": str(home), "HF_HOME": str(home / "huggingface"), "USER": who.name})
    hub = sys.modules.get("huggingface_hub.constants")
    if hub is not None:  # imported already: its paths were read from the root's environment
        old_home = str(hub.HF_HOME)
        for name in dir(hub):
            value = getattr(hub, name)
            if name.startswith("HF_") and isinstance(value, str) and value.startswith(old_home):
                setattr(hub, name, str(home / "huggingface") + value[len(old_home) :])


def run_as(who: Account, work: Callable[[], Any], *, home: Path) -> Any:
    """`work()` in a child process running as `who` (home `home`, made and given to it here); its
    JSON-able result, or the SpecdeployError it raised, raised again here by its class."""
    home.mkdir(mode=0o700, parents=True, exist_ok=True)
    os.chown(home, who.uid, who.gid)
    read_end, write_end = os.pipe()
    sys.stdout.flush()
    sys.stderr.flush()
    pid = os.fork()
    if pid == 0:  # the child: never returns
        os.close(read_end)
        code = 0
        try:
            _become(who, home)
            payload: dict[str, Any] = {"result": work()}
        except SpecdeployError as exc:
            cls = type(exc)
            payload = {
                "error": {"module": cls.__module__, "class": cls.__qualname__, "message": exc.message,
                          "hint": exc.hint, "exit_code": exc.exit_code}
            }  # fmt: skip
        except BaseException as exc:  # noqa: BLE001 - reported to the parent, which names it
            payload = {"crash": f"{type(exc).__name__}: {exc}", "trace": traceback.format_exc()[-4000:]}
            code = 1
        try:
            with os.fdopen(write_end, "wb") as out:
                out.write(json.dumps(payload).encode())
        finally:
            os._exit(code)
    os.close(write_end)
    with os.fdopen(read_end, "rb") as answer:
        data = answer.read(RESULT_LIMIT + 1)
    _, status = os.waitpid(pid, 0)
    try:
        payload = json.loads(data) if len(data) <= RESULT_LIMIT else None
    except ValueError:
        payload = None
    if not isinstance(payload, dict):
        raise SpecdeployError(
            f"the fetch as {who.name} (uid {who.uid}) ended without a result (wait status {status})",
            hint="run it again; if it repeats, run the same command without --as-user to see the error",
        )
    if "result" in payload:
        return payload["result"]
    if "error" in payload:
        raise _rebuilt(payload["error"])
    raise SpecdeployError(
        f"the fetch as {who.name} (uid {who.uid}) failed: {payload.get('crash')}",
        hint="this is a bug in specdeploy or the hub client: report it with the lines above\n"
        + str(payload.get("trace", "")),
    )


def _rebuilt(error: dict[str, Any]) -> SpecdeployError:
    """The child's error as the class it raised (a SpecdeployError of this package), else a plain one."""
    cls: Any = SpecdeployError
    module = str(error.get("module", ""))
    if module.startswith("specdeploy."):
        try:
            found = importlib.import_module(module)
            for part in str(error.get("class", "")).split("."):
                found = getattr(found, part)
            if isinstance(found, type) and issubclass(found, SpecdeployError):
                cls = found
        except (ImportError, AttributeError):
            pass
    try:
        exc = cls(str(error.get("message")), hint=error.get("hint"))
    except TypeError:
        exc = SpecdeployError(str(error.get("message")), hint=error.get("hint"))
    if isinstance(error.get("exit_code"), int) and exc.exit_code != error["exit_code"]:
        exc.exit_code = error["exit_code"]
    return exc
