"""Start the engine with its API key while keeping the key out of every process list and the journal.

The failure this prevents: the key on a command line is readable by every user of the host
(`ps`, `/proc/*/cmdline` — processes inside a container are visible from the host too), and a
key an engine logs ends up in the journal. SGLang reads its key only from `--api-key` (it ignores
SGLANG_API_KEY) and logs its server args, api_key included, at startup; vLLM reads VLLM_API_KEY.

The unit hands the key over as a file: a systemd venv unit as a credential (`LoadCredential=`,
read from `$CREDENTIALS_DIRECTORY/<name>`), a podman quadlet as a secret mounted as a file
(`Secret=NAME,type=mount,target=/run/secrets/NAME`). This launcher reads the key from that file
and starts the engine module in-process (runpy), so the key is never on any command line: the
flag (SPECDEPLOY_KEY_ARG) is appended to `sys.argv` only, or the variable (SPECDEPLOY_KEY_ENV) is
set in this process's environment only. Everything the engine and its child processes write to
stdout/stderr passes through a redactor process that replaces the key with `***`.

    python3 /path/to/launch.py MODULE [ARG ...]

It runs under the engine's interpreter (a vLLM venv, a container image's python3, which may be
older than specdeploy's), so it imports only the standard library. With none of the
SPECDEPLOY_KEY_* variables set it just runs the module. An inconsistent setting or an unusable
key file exits 78 (EX_CONFIG) with one line on stderr, and the engine is not started.
"""

from __future__ import annotations

import os
import sys


def _forget_own_directory() -> None:
    """Run as a script, Python puts this file's directory first on sys.path, and its siblings
    (args.py, venv.py, units.py ...) would shadow modules of the engine and the standard library.
    Put the working directory there instead, as `python -m` would."""
    own = os.path.realpath(os.path.dirname(os.path.abspath(__file__)))
    sys.path[:] = [entry for entry in sys.path if os.path.realpath(entry or os.curdir) != own]
    if not getattr(sys.flags, "safe_path", False):
        sys.path.insert(0, os.getcwd())


if __name__ == "__main__":
    _forget_own_directory()  # before any other import

import atexit  # noqa: E402  (after the sys.path fix above)
import contextlib  # noqa: E402
import importlib.util  # noqa: E402
import runpy  # noqa: E402
import selectors  # noqa: E402
import signal  # noqa: E402
import socket  # noqa: E402
from collections.abc import Mapping  # noqa: E402
from dataclasses import dataclass  # noqa: E402
from typing import NoReturn  # noqa: E402

KEY_FILE_ENV = "SPECDEPLOY_KEY_FILE"
KEY_CREDENTIAL_ENV = "SPECDEPLOY_KEY_CREDENTIAL"
KEY_ENV_ENV = "SPECDEPLOY_KEY_ENV"
KEY_ARG_ENV = "SPECDEPLOY_KEY_ARG"
KEY_VARIABLES = (KEY_FILE_ENV, KEY_CREDENTIAL_ENV, KEY_ENV_ENV, KEY_ARG_ENV)
CREDENTIALS_DIRECTORY_ENV = "CREDENTIALS_DIRECTORY"  # set by systemd for a unit with LoadCredential=

EXIT_USAGE = 64  # EX_USAGE: no module named on the command line
EXIT_OSERR = 71  # EX_OSERR: the redactor could not be started
EXIT_CONFIG = 78  # EX_CONFIG: the unit's key settings or the key file are unusable

MASK = b"***"
CARRY_LIMIT = 64 * 1024  # a line without an end is written out (all but a key's length) past this
READ_SIZE = 64 * 1024
DRAIN_GRACE_S = 5.0  # at exit, how long the launcher waits for the redactor to write what is left

HINT_SOURCE = "check the unit's Secret= (podman secret ls) or LoadCredential= and the file it names"
HINT_DESTINATION = f"set {KEY_ENV_ENV}=VLLM_API_KEY for vLLM or {KEY_ARG_ENV}=--api-key for SGLang"


class LaunchError(Exception):
    """A reason not to start the engine, told in one line; `code` is the exit status."""

    def __init__(self, message: str, code: int = EXIT_CONFIG) -> None:
        super().__init__(message)
        self.code = code


@dataclass(frozen=True)
class KeyPlan:
    """Where the key comes from (`path`, named by `source` for messages) and where it goes:
    the environment variable `env` or the command-line flag `flag` (exactly one is set)."""

    path: str
    source: str
    env: str | None
    flag: str | None


# --- configuration ---------------------------------------------------------------------------


def key_plan(environ: Mapping[str, str]) -> KeyPlan | None:
    """The unit's SPECDEPLOY_KEY_* settings; None when there are none (run without a key)."""
    found = {name: environ[name] for name in KEY_VARIABLES if name in environ}
    if not found:
        return None
    shown = ", ".join(f"{name}={value!r}" for name, value in found.items())
    empty = [name for name, value in found.items() if not value]
    if empty:
        verb = "is" if len(empty) == 1 else "are"
        raise LaunchError(f"{' and '.join(empty)} {verb} set but empty (found {shown}); give a value or unset it")
    env, flag = _destination(found, shown)
    path, source = _source(found, environ, shown)
    return KeyPlan(path=path, source=source, env=env, flag=flag)


def _destination(found: Mapping[str, str], shown: str) -> tuple[str | None, str | None]:
    env, flag = found.get(KEY_ENV_ENV), found.get(KEY_ARG_ENV)
    if env and flag:
        raise LaunchError(f"both {KEY_ENV_ENV} and {KEY_ARG_ENV} are set (found {shown}); {HINT_DESTINATION}, not both")
    if not env and not flag:
        raise LaunchError(
            f"neither {KEY_ENV_ENV} nor {KEY_ARG_ENV} is set, so the key would never reach the engine "
            f"(found {shown}); {HINT_DESTINATION}"
        )
    if flag and not flag.startswith("-"):
        raise LaunchError(
            f"{KEY_ARG_ENV} is not a command-line flag (found {shown}); give the engine's flag: --api-key"
        )
    if env and not (env.isascii() and env.isidentifier()):
        raise LaunchError(f"{KEY_ENV_ENV} is not a variable name (found {shown}); give the one it reads: VLLM_API_KEY")
    return env, flag


def _source(found: Mapping[str, str], environ: Mapping[str, str], shown: str) -> tuple[str, str]:
    path, credential = found.get(KEY_FILE_ENV), found.get(KEY_CREDENTIAL_ENV)
    if path and credential:
        raise LaunchError(
            f"both {KEY_FILE_ENV} and {KEY_CREDENTIAL_ENV} are set (found {shown}); set only one: "
            "the file the key is mounted at, or the name of the unit's systemd credential"
        )
    if path:
        return path, f"{KEY_FILE_ENV}={path!r}"
    if not credential:
        raise LaunchError(
            f"neither {KEY_FILE_ENV} nor {KEY_CREDENTIAL_ENV} is set, so the engine would serve without its key "
            f"(found {shown}); name the key's file or credential, or unset every SPECDEPLOY_KEY_* to run keyless"
        )
    if "/" in credential or credential in (".", ".."):
        raise LaunchError(
            f"{KEY_CREDENTIAL_ENV} is not a credential name (found {shown}); "
            "give the name the unit's LoadCredential= loads"
        )
    directory = environ.get(CREDENTIALS_DIRECTORY_ENV)
    if not directory:
        raise LaunchError(
            f"{KEY_CREDENTIAL_ENV} is set but {CREDENTIALS_DIRECTORY_ENV} is not (found {shown}); "
            f"systemd sets it only for a unit with LoadCredential={credential}"
        )
    return os.path.join(directory, credential), f"{KEY_CREDENTIAL_ENV}={credential!r}"


def read_key(plan: KeyPlan) -> str:
    """The key in the plan's file, surrounding whitespace stripped; never part of a message."""
    try:
        with open(plan.path, "rb") as file:
            raw = file.read()
    except FileNotFoundError:
        problem = "is missing"
    except PermissionError:
        problem = "is not readable (permission denied)"
    except IsADirectoryError:
        problem = "is a directory"
    except OSError as error:
        problem = f"cannot be read ({error.strerror})"
    else:
        problem = _key_problem(raw.strip())
        if not problem:
            return raw.strip().decode()
    raise LaunchError(
        f"the API key file {plan.path} (from {plan.source}) {problem}, so the engine would serve without "
        f"its key: not starting it; {HINT_SOURCE}"
    )


def _key_problem(key: bytes) -> str | None:
    if not key:
        return "is empty"
    try:
        key.decode()
    except UnicodeDecodeError:
        return "is not UTF-8 text"
    if any(byte < 0x20 or byte == 0x7F for byte in key):
        return "holds a line break or another control character inside the key"
    return None


# --- redaction -------------------------------------------------------------------------------


def redact(buffer: bytes, key: bytes, *, final: bool = False) -> tuple[bytes, bytes]:
    """Split `buffer` into what may be written now, every `key` in it masked, and what must wait
    for the next read: the bytes after the last line end (a key may go on in the next read), or,
    past CARRY_LIMIT without a line end, only the last len(key) - 1 bytes. `final` keeps nothing."""
    masked = buffer.replace(key, MASK)
    if final:
        return masked, b""
    cut = max(masked.rfind(b"\n"), masked.rfind(b"\r")) + 1  # \r: progress bars redraw one line
    if len(masked) - cut > CARRY_LIMIT:
        cut = len(masked) - (len(key) - 1)
    return masked[:cut], masked[cut:]


class Redactor:
    """Copies each source pipe to its target (the original stdout/stderr) with the key masked,
    until every source reaches EOF, i.e. every process that could write to it has exited. On a
    request over `control` (the launcher exiting) it writes out all it holds and answers."""

    def __init__(self, key: bytes, targets: Mapping[int, int], control: socket.socket) -> None:
        self.key = key
        self.targets = dict(targets)
        self.carry = dict.fromkeys(targets, b"")
        self.control = control
        self.selector = selectors.DefaultSelector()
        for source in targets:
            os.set_blocking(source, False)
            self.selector.register(source, selectors.EVENT_READ)
        self.selector.register(control, selectors.EVENT_READ)

    def run(self) -> None:
        while self.carry:
            for selected, _ in self.selector.select():
                if selected.fileobj is self.control:
                    self._answer()
                elif selected.fd in self.carry:
                    self._read(selected.fd)

    def _read(self, source: int) -> bool:
        """One read from `source`; False when it had nothing (yet)."""
        try:
            chunk = os.read(source, READ_SIZE)
        except BlockingIOError:
            return False
        out, self.carry[source] = redact(self.carry[source] + chunk, self.key, final=not chunk)
        self._write(source, out)
        if not chunk:
            del self.carry[source]
            self.selector.unregister(source)
            os.close(source)
        return bool(chunk)

    def _answer(self) -> None:
        try:
            request = self.control.recv(1)
        except OSError:
            request = b""
        if not request:  # the launcher is gone
            self.selector.unregister(self.control)
            return
        for source in list(self.carry):
            while source in self.carry and self._read(source):
                pass
        for source in list(self.carry):
            self._write(source, redact(self.carry[source], self.key, final=True)[0])
            self.carry[source] = b""
        with contextlib.suppress(OSError):
            self.control.sendall(b"k")

    def _write(self, source: int, data: bytes) -> None:
        target = self.targets[source]
        while data and target >= 0:
            try:
                data = data[os.write(target, data) :]
            except BlockingIOError:  # a target another process made non-blocking
                _wait_writable(target)
            except OSError:  # the reader is gone: keep draining the engine's output, discard it
                self.targets[source] = target = -1


def _wait_writable(fd: int) -> None:
    with selectors.DefaultSelector() as selector:
        selector.register(fd, selectors.EVENT_WRITE)
        selector.select()


def _fork_detached() -> bool:
    """Fork a grandchild that init adopts, so it is not in the engine's process tree (SGLang
    SIGKILLs its whole tree when it shuts down). True in the grandchild."""
    middle = os.fork()
    if middle == 0:
        try:
            if os.fork() == 0:
                return True
        except BaseException:
            os._exit(1)
        os._exit(0)
    _, status = os.waitpid(middle, 0)
    if status != 0:
        raise LaunchError("could not fork the redactor; the engine is not started without it", EXIT_OSERR)
    return False


def _become_redactor(key: bytes, targets: Mapping[int, int], close: list[int], control: socket.socket) -> NoReturn:
    status = 0
    try:
        for fd in close:
            os.close(fd)
        for signum in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):  # outlive the engine, flush its last lines
            signal.signal(signum, signal.SIG_IGN)
        Redactor(key, targets, control).run()
    except BaseException as error:  # the type only: a message might quote what was being written
        os.write(2, f"specdeploy launch: the redactor failed: {type(error).__name__}\n".encode())
        status = 1
    finally:
        os._exit(status)


def install_redaction(key: bytes) -> None:
    """From here on fds 1 and 2 (inherited by every child of the engine) are pipes to a redactor
    process that writes to the original stdout/stderr with the key masked."""
    _ensure_std_fds()
    out_read, out_write = os.pipe()
    err_read, err_write = os.pipe()
    ours, theirs = socket.socketpair()
    _flush_std()
    if _fork_detached():
        _become_redactor(key, {out_read: 1, err_read: 2}, [out_write, err_write, ours.detach()], theirs)
    theirs.close()
    os.dup2(out_write, 1)
    os.dup2(err_write, 2)
    for fd in (out_read, out_write, err_read, err_write):
        os.close(fd)
    for stream in (sys.stdout, sys.stderr):
        if stream is not None and hasattr(stream, "reconfigure"):
            stream.reconfigure(line_buffering=True)
    atexit.register(_await_redactor, ours, os.getpid())


def _await_redactor(control: socket.socket, owner: int) -> None:
    """At exit, let the redactor write out everything before this process ends: in a container
    this is PID 1, and its end kills every other process there at once."""
    if os.getpid() != owner:  # a forked child of the engine running atexit
        return
    _flush_std()
    try:
        control.settimeout(DRAIN_GRACE_S)
        control.sendall(b"d")
        control.recv(1)
    except OSError:
        pass


def _ensure_std_fds() -> None:
    """Fds 0-2 open (on /dev/null if they were not), so no pipe created here lands on them."""
    for fd in (0, 1, 2):
        try:
            os.fstat(fd)
        except OSError:
            null = os.open(os.devnull, os.O_RDWR)
            if null != fd:
                os.dup2(null, fd)
                os.close(null)


def _flush_std() -> None:
    for stream in (sys.stdout, sys.stderr):
        try:
            if stream is not None:
                stream.flush()
        except (OSError, ValueError):
            pass


# --- the engine ------------------------------------------------------------------------------


def check_module(module: str) -> None:
    """Refuse, in one line, a module this interpreter lacks (the unit names the wrong python);
    a module that is there but fails to import keeps its traceback."""
    try:
        found = importlib.util.find_spec(module)
    except ModuleNotFoundError as error:
        if not error.name or not (module == error.name or module.startswith(error.name + ".")):
            raise
        found = None
    if found is None:
        raise LaunchError(f"no module {module} under {sys.executable}; name the interpreter the engine is installed in")


def hand_over(module: str, args: list[str], plan: KeyPlan | None, key: str | None) -> None:
    """The engine's argv, with the key appended or set in the environment: in this process only."""
    sys.argv = [module, *args]
    if plan is not None and key is not None:
        if plan.flag:
            sys.argv += [plan.flag, key]
        elif plan.env:
            os.environ[plan.env] = key


def run_engine(module: str) -> None:
    """Run `module` as __main__ in this process, as `python -m` would; SystemExit passes through."""
    runpy.run_module(module, run_name="__main__", alter_sys=True)
    _flush_std()


def main(argv: list[str] | None = None, environ: Mapping[str, str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    environ = os.environ if environ is None else environ
    try:
        if not argv or argv[0].startswith("-"):
            raise LaunchError("no engine module given; usage: python3 launch.py MODULE [ARG ...]", EXIT_USAGE)
        plan = key_plan(environ)
        key = read_key(plan) if plan is not None else None
        if key is not None:
            install_redaction(key.encode())
        hand_over(argv[0], argv[1:], plan, key)
        check_module(argv[0])  # after hand_over: it imports the module's packages, which may read sys.argv
    except LaunchError as error:
        print(f"specdeploy launch: {error}", file=sys.stderr)
        raise SystemExit(error.code) from None
    run_engine(argv[0])


if __name__ == "__main__":
    main()
