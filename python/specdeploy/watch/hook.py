"""The light gate's host settings and the hook it calls when it fails.

Host settings are not the profile's (a profile describes a stack, not a host): where node_exporter
reads its textfiles and what to call on a failure differ per site. The watch role writes them from
the inventory to `<state>/watch-config.json` (core.layout):

    {"textfile": "/var/lib/prometheus/node-exporter/specdeploy.prom",
     "hook": ["/usr/local/bin/page-oncall", "--team", "inference"],
     "hook_timeout_s": 60}

`textfile` may be null (no textfile); `hook` an empty list (no hook). Without the file, the
defaults hold: Debian's textfile directory, no hook.

The hook is a program and its arguments, run as the light gate's account (specdeploy-watch, never
root; it must be root's and runnable by that account: `check_hook`), without a shell, with the
result file's path as its last argument, standard input closed, a deadline, and an environment of
its own: PATH, LANG, and SPECDEPLOY_WATCH_RESULT / SPECDEPLOY_WATCH_VERDICT — never this process's
environment, which may hold the API key of a run by hand ($SPECDEPLOY_API_KEY). Whatever it does
(exit non-zero, hang, not exist) is recorded in the result and never changes the verdict. It runs
only when the light gate fails or could not test; the light gate itself never restarts or rolls
back anything.
"""

from __future__ import annotations

import grp
import math
import os
import pwd
import stat
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from specdeploy.core import files, layout
from specdeploy.core.errors import InputFileError
from specdeploy.host import command

CONFIG = "light gate settings"
CONFIG_HINT = (
    "the watch role writes this file from the inventory (watch_textfile, watch_hook, watch_hook_timeout_s): "
    "correct them there and re-run the deploy, or fix the file by hand"
)
KEYS = ("textfile", "hook", "hook_timeout_s")
DEFAULT_HOOK_TIMEOUT_S = 60.0
HOOK_OUTPUT_KEPT = 2000  # characters of the hook's output kept in the result
DEFAULT_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"


@dataclass(frozen=True)
class HostConfig:
    textfile: Path | None = layout.DEFAULT_TEXTFILE
    hook: tuple[str, ...] = ()
    hook_timeout_s: float = DEFAULT_HOOK_TIMEOUT_S
    source: str = "defaults (no settings file)"

    def to_json(self) -> dict[str, Any]:
        return {
            "textfile": str(self.textfile) if self.textfile else None,
            "hook": list(self.hook),
            "hook_timeout_s": self.hook_timeout_s,
            "source": self.source,
        }


def _bad(path: Path, key: str, expected: str, found: Any) -> InputFileError:
    return InputFileError(f"{CONFIG} {path}: field {key}: expected {expected}, found {found!r}", hint=CONFIG_HINT)


def check_textfile(value: Any, origin: str) -> Path:
    """A textfile path node_exporter's collector will read: absolute, ending in .prom, in a
    directory that exists (the collector reads one directory; it is not created here)."""
    if not isinstance(value, str) or not value.startswith("/") or not value.endswith(".prom"):
        raise InputFileError(
            f"{origin}: textfile: expected an absolute path ending in .prom (node_exporter's textfile collector "
            f"reads only *.prom files), found {value!r}",
            hint=CONFIG_HINT,
        )
    path = Path(value)
    if not path.parent.is_dir():
        found = "nothing" if not path.parent.exists() and not path.parent.is_symlink() else "not a directory"
        raise InputFileError(
            f"{origin}: textfile {path}: its directory {path.parent} is {found}: expected the directory "
            "node_exporter's --collector.textfile.directory names",
            hint="create it (the watch role does), or point watch_textfile at the collector's directory",
        )
    return path


def check_hook(value: Any, origin: str) -> tuple[str, ...]:
    """The hook's argv: a list of strings, the first an absolute path to an executable file."""
    if not isinstance(value, list) or not all(isinstance(a, str) and a and "\0" not in a for a in value):
        raise InputFileError(
            f"{origin}: hook: expected a list of strings (a program's absolute path, then its arguments; "
            f"no shell), found {value!r}",
            hint=CONFIG_HINT,
        )
    if not value:
        return ()
    program = Path(value[0])
    if not program.is_absolute():
        raise InputFileError(
            f"{origin}: hook: expected the program's absolute path first, found {value[0]!r}", hint=CONFIG_HINT
        )
    if not program.is_file() or not os.access(program, os.X_OK):
        found = (
            "nothing"
            if not program.exists()
            else "not a regular file"
            if not program.is_file()
            else "a file that is not executable"
        )
        raise InputFileError(
            f"{origin}: hook program {program} is {found}: expected an executable file",
            hint=f"install the hook program on this host (chmod +x {program}), or correct watch_hook in the inventory",
        )
    # root's and written by root alone: no other account (the light gate's included) can put its own
    # code in the place of the site's hook
    for place in (program, *program.parents):
        st = place.stat()
        shared = place != program and st.st_mode & stat.S_ISVTX  # a sticky /tmp: others add, never replace
        if st.st_uid != 0 or (st.st_mode & (stat.S_IWGRP | stat.S_IWOTH) and not shared):
            mode = oct(st.st_mode & 0o777)
            who = f"owned by uid {st.st_uid}" if st.st_uid != 0 else f"writable by others (mode {mode})"
            raise InputFileError(
                f"{origin}: hook program {program}: {place} is {who}: expected root's, not writable by its group or "
                "others (another account could replace the site's hook); the hook was not run",
                hint=f"chown root:root {place} && chmod go-w {place}, or install the hook where only root writes",
            )
    denied = _not_runnable_by_watch(program)
    if denied is not None:
        raise InputFileError(
            f"{origin}: hook program {program}: {denied}: expected the light gate's account ({layout.WATCH_USER}), "
            "which runs the hook, to run it; the hook would fail at the first failure it was meant to report",
            hint=f"chmod o+rx {program} (and o+x on its directories), or correct watch_hook in the inventory",
        )
    return tuple(value)


def _not_runnable_by_watch(program: Path) -> str | None:
    """Why the light gate's account could not run `program` (None when it can, or when this host
    has no such account: not a deployed host). Checked from the modes, as root sees them in
    `watch check`: the account is neither the owner (root) nor, usually, in the file's group."""
    account = _watch_account()
    if account is None:
        return None
    if os.geteuid() == account.pw_uid:
        return None if os.access(program, os.X_OK) else "not executable by this account"
    groups = {account.pw_gid, *(g.gr_gid for g in grp.getgrall() if account.pw_name in g.gr_mem)}
    for place, need in ((program, stat.S_IXOTH | stat.S_IROTH), *((d, stat.S_IXOTH) for d in program.parents)):
        st = place.stat()
        bits = st.st_mode if st.st_gid not in groups else st.st_mode >> 3
        if bits & need != need:
            return f"{place} (mode {oct(st.st_mode & 0o777)}) is not {'runnable' if place == program else 'searchable'}"
    return None


def load_config(path: Path) -> HostConfig:
    """The host settings in `path` (the defaults where there is no such file), checked: an
    InputFileError naming the file, the field, what was expected and found."""
    if not path.exists() and not path.is_symlink():
        return HostConfig()
    try:
        record = files.expect_mapping(files.read_json(path, what=CONFIG, hint=CONFIG_HINT), str(path), what=CONFIG)
    except InputFileError as exc:  # not a file, not JSON, not an object: the same fix
        raise InputFileError(exc.message, hint=CONFIG_HINT) from None
    unknown = sorted(set(record) - set(KEYS))
    if unknown:
        raise InputFileError(
            f"{CONFIG} {path}: unknown field(s) {unknown}: expected only {list(KEYS)}", hint=CONFIG_HINT
        )
    origin = f"{CONFIG} {path}"
    # absent: the default, whose directory appears when node_exporter is installed (a textfile that
    # cannot be written is recorded in the result); named: it must be usable now
    raw = record.get("textfile", ...)
    textfile = layout.DEFAULT_TEXTFILE if raw is ... else None if raw is None else check_textfile(raw, origin)
    hook = check_hook(record.get("hook", []), origin)
    timeout = record.get("hook_timeout_s", DEFAULT_HOOK_TIMEOUT_S)
    if isinstance(timeout, bool) or not isinstance(timeout, int | float) or not math.isfinite(timeout):
        raise _bad(path, "hook_timeout_s", "a number of seconds between 1 and 3600", timeout)
    if not 1 <= timeout <= 3600:
        raise _bad(path, "hook_timeout_s", "a number of seconds between 1 and 3600", timeout)
    return HostConfig(textfile=textfile, hook=hook, hook_timeout_s=float(timeout), source=str(path))


@dataclass
class HookOutcome:
    argv: list[str]
    exit_code: int | None = None
    error: str | None = None
    elapsed_s: float = 0.0
    output: str = ""
    env: list[str] = field(default_factory=list)  # the names of the variables it was given
    user: str = ""  # the account it ran as

    @property
    def ok(self) -> bool:
        return self.error is None and self.exit_code == 0

    def to_json(self) -> dict[str, Any]:
        return {
            "argv": self.argv,
            "exit_code": self.exit_code,
            "ok": self.ok,
            "error": self.error,
            "elapsed_s": round(self.elapsed_s, 2),
            "output": self.output,
            "env": self.env,
            "user": self.user,
        }


def hook_environment(result_file: Path, verdict: str) -> dict[str, str]:
    """The hook's whole environment: nothing inherited but PATH (so a key in this process's
    environment never reaches it)."""
    return {
        "PATH": os.environ.get("PATH") or DEFAULT_PATH,
        "LANG": "C.UTF-8",
        "SPECDEPLOY_WATCH_RESULT": str(result_file),
        "SPECDEPLOY_WATCH_VERDICT": verdict,
    }


def _name(uid: int) -> str:
    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:
        return str(uid)


def hook_account() -> tuple[int, int] | None:
    """The (uid, gid) a hook runs as when this process is root (`migrate finish`, a run by hand): the
    light gate's account, as under its service, never root; None when not root (the service: it
    already is that account) or on a machine without the account (a development checkout)."""
    account = _watch_account() if os.geteuid() == 0 else None
    return (account.pw_uid, account.pw_gid) if account else None


def _watch_account() -> pwd.struct_passwd | None:
    """The light gate's account on this machine; None where there is none (not a deployed host)."""
    try:
        return pwd.getpwnam(layout.WATCH_USER)
    except KeyError:
        return None


def call(hook: tuple[str, ...], result_file: Path, verdict: str, *, timeout_s: float) -> HookOutcome:
    """Run the hook (its argv, then the result file's path); what happened, never an exception."""
    argv = [*hook, str(result_file)]
    env = hook_environment(result_file, verdict)
    account = hook_account()
    user = _name(account[0] if account else os.geteuid())
    outcome = HookOutcome(argv=argv, env=sorted(env), user=user)
    started = time.monotonic()
    try:
        done = command.run(argv, timeout=timeout_s, limit=1024 * 1024, env=env, account=account)
    except command.ProgramRunError as exc:
        outcome.error = exc.message
    else:
        outcome.exit_code = done.returncode
        outcome.output = (done.stdout + done.stderr)[-HOOK_OUTPUT_KEPT:]
        if done.returncode != 0:
            outcome.error = f"the hook exited {done.returncode}"
    outcome.elapsed_s = time.monotonic() - started
    return outcome
