"""The engine's API key on a host: one root-only file, the source of every other copy.

Before this, nothing created the podman secret the quadlet names, so a GPU engine could not
start; and the gate and the rollback's proof sent no key, so vLLM answered 401, every GPU
deploy rolled back and the rollback reported the old stack as not serving. Now the deploy
writes the key (from ansible-vault, on standard input) to `<state>/secrets/<name>` (mode 0600
in a 0700 directory), creates the podman secret from that file for container engines, and the
venv unit loads it as a systemd credential; the gate and the rollback read the same file.
The key never appears in argv, an environment passed by Ansible, a log or a world-readable file.
"""

from __future__ import annotations

import os
import re
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

from specdeploy.core import atomic, files, layout
from specdeploy.core.errors import InputFileError, SpecdeployError
from specdeploy.core.files import LIMITS
from specdeploy.core.keeper import Keeper
from specdeploy.engine import launch
from specdeploy.images import podman as podman_exe
from specdeploy.profile import Profile

FILE_MODE = 0o600
DIR_MODE = 0o700
MIN_LENGTH = 16  # a shorter key is guessable: refuse it rather than deploy it
# Characters a log prints as they are (repr, JSON): the launcher's masking sees the key verbatim.
KEY_CHARACTERS = re.compile(r"[A-Za-z0-9._~+/=-]+")


class SecretError(SpecdeployError):
    """The API key is missing, too weak, or could not be stored."""


class KeyInputError(SecretError):
    """The key given (standard input), the profile or the place it goes is not usable: bad input,
    exit 2, and nothing was written."""

    exit_code = 2


KEY_HINT = (
    "set a long random key in ansible-vault (engine_api_key), e.g. `openssl rand -hex 32`, and pass it on "
    "standard input: `printf '%s\\n' \"$KEY\" | specdeploy engine api-key ...`"
)


def read_key(stream: IO[Any]) -> str:
    """The first line of standard input, at most LIMITS["key"] bytes and UTF-8: a KeyInputError
    otherwise (never an unbounded read, never a UnicodeDecodeError)."""
    limit = LIMITS["key"]
    raw = getattr(stream, "buffer", None)
    data: bytes | str = raw.readline(limit + 1) if raw is not None else stream.readline(limit + 1)
    if len(data) > limit:
        raise KeyInputError(
            f"API key on standard input: expected one line of at most {limit} bytes, found more; nothing was written",
            hint=KEY_HINT,
        )
    if isinstance(data, str):
        return data
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise KeyInputError(
            f"API key on standard input: expected UTF-8 text, found byte {data[exc.start]:#04x} at offset "
            f"{exc.start}; nothing was written",
            hint=KEY_HINT,
        ) from None


@dataclass
class Installed:
    name: str
    file: str
    changed: bool  # the file's content changed: the engine must restart to take the new key
    podman: str  # "created", "unchanged" or "not used" (venv runtime)


def secret_name(profile: Profile) -> str:
    """The secret the profile's API key is stored as; a KeyInputError (exit 2) when it has none."""
    ref = profile.engine.serve.api_key
    if ref is None:
        raise KeyInputError(
            f"profile {profile.name} has no engine.serve.api_key: there is no key to install",
            hint="reference a secret in the profile (api_key: {secret: specdeploy_api_key}) or skip this step",
        )
    return ref.secret


_secret_name = secret_name  # the name it had


def _podman(podman: str, *args: str, stdin: bytes | None = None) -> subprocess.CompletedProcess[bytes]:
    """podman secret `args` (the key on standard input, never argv); a missing podman is exit 2."""
    return podman_exe.run(podman, "secret", *args, stdin=stdin if stdin is not None else b"", text=False)


def _require_key_path(path: Path, host: layout.HostLayout) -> None:
    """The state directory and its secrets directory are directories (or nothing yet) and the key
    file is a file (or nothing yet): a KeyInputError naming the path otherwise, before anything
    is written."""
    for directory in (host.state, path.parent):
        found = files.kind_of(directory)
        if found not in (None, "a directory"):
            raise KeyInputError(
                f"--state-dir {host.state}: expected a directory to hold the API key ({directory}), found {found}; "
                "nothing was written",
                hint="pass the host's state directory (`specdeploy facts`: paths.state) as --state-dir",
            )
    found = files.kind_of(path)
    if found not in (None, "a regular file"):
        raise KeyInputError(
            f"API key file {path}: expected a regular file (or nothing, to create it), found {found}; "
            "nothing was written",
            hint=f"remove {path} (it is not a key file), then run the engine stage again",
        )


def install(
    profile: Profile, host: layout.HostLayout, key: str, *, podman: str = "podman", keeper: Keeper | None = None
) -> Installed:
    """Store `key` as the profile's API key on this host (idempotent), and as a podman secret
    for a container engine. The key is passed to podman on standard input, never in argv. With a
    `keeper` (the deploy run's), the key it replaces is kept first: a rollback puts it back and
    makes the podman secret from it again (`renew_podman_secret`), so the previous stack serves
    with the key its clients have."""
    name = secret_name(profile)
    key = key.strip()
    if len(key) < MIN_LENGTH:
        raise KeyInputError(
            f"API key for secret {name}: expected at least {MIN_LENGTH} characters, found {len(key)}",
            hint="set a long random key in ansible-vault (engine_api_key), e.g. `openssl rand -hex 32`; "
            "a missing or short key leaves the engine open or guessable",
        )
    if not KEY_CHARACTERS.fullmatch(key):
        raise KeyInputError(
            f"API key for secret {name}: expected only letters, digits and . _ ~ + / = -, found other characters",
            hint="use e.g. `openssl rand -hex 32`: the launcher masks the key in the engine's logs, and a "
            "quote or backslash would be escaped there (SGLang logs its arguments with repr) and slip past it",
        )
    path = host.secret_file(name)
    _require_key_path(path, host)
    if profile.engine.runtime == "container":
        podman_exe.require(podman)  # before the key file is written: a missing podman leaves nothing behind
    atomic.ensure_dir(path.parent)
    os.chmod(path.parent, DIR_MODE)
    data = key.encode()
    changed = not (path.is_file() and path.read_bytes() == data and (path.stat().st_mode & 0o777) == FILE_MODE)
    if changed:
        staged = keeper.stage(path) if keeper is not None else None
        try:
            atomic.write_bytes(path, data, FILE_MODE)
        except BaseException:
            if staged is not None:
                staged.discard()
            raise
        if staged is not None:
            staged.commit()
    podman_state = "not used"
    if profile.engine.runtime == "container":
        exists = _podman(podman, "inspect", name).returncode == 0
        podman_state = "unchanged"
        if changed or not exists:
            _create_podman_secret(
                podman, name, data, replace=exists,
                hint="check that podman works on this host (`podman info`); the engine cannot start without it",
            )  # fmt: skip
            podman_state = "created"
    return Installed(name, str(path), changed, podman_state)


def renew_podman_secret(path: Path, *, podman: str = "podman") -> str:
    """After a rollback put a key file back: the podman secret of the same name made again from it
    (a container engine reads the secret, not the file). "not used" where there is no podman or it
    holds no secret of that name (a venv engine reads the file itself); "created" otherwise."""
    import shutil

    name = path.name
    if shutil.which(podman) is None or _podman(podman, "inspect", name).returncode != 0:
        return "not used"
    data = files.read_bytes(path, what="API key file", limit=LIMITS["key"]).strip()
    _create_podman_secret(
        podman, name, data, replace=True,
        hint=f"recreate it by hand from {path}: `podman secret create {name} {path}`, then restart the engine",
    )  # fmt: skip
    return "created"


def _create_podman_secret(podman: str, name: str, data: bytes, *, replace: bool, hint: str) -> None:
    """podman secret `name` made from `data` (on standard input, never argv), the old one removed first."""
    if replace:
        _podman(podman, "rm", name)
    done = _podman(podman, "create", name, "-", stdin=data)
    if done.returncode != 0:
        raise SecretError(
            f"podman secret create {name} failed (exit {done.returncode}): "
            + done.stderr.decode(errors="replace").strip(),
            hint=hint,
        )


def read(profile: Profile, host: layout.HostLayout) -> str | None:
    """The key the gate, the light gate and the rollback's proof send: None when the profile needs
    none; the environment's $SPECDEPLOY_API_KEY first (a run by hand), then the file
    $SPECDEPLOY_KEY_FILE names (the light gate's service: its copy for one run, watch/units.py),
    else the host's key file."""
    if profile.engine.serve.api_key is None:
        return None
    from_env = os.environ.get("SPECDEPLOY_API_KEY")
    if from_env:
        return from_env
    handed = os.environ.get(launch.KEY_FILE_ENV)
    path = Path(handed) if handed else host.secret_file(profile.engine.serve.api_key.secret)
    try:  # bounded, regular files only: a FIFO in its place must not block the gate
        key = files.read_text(path, what="API key file", limit=LIMITS["key"]).strip()
    except InputFileError as exc:
        raise SecretError(
            f"profile {profile.name} serves with an API key, but {path} cannot be read "
            f"({exc.message}): the smoke would be answered 401",
            hint="run the deploy's engine stage (it installs the key from ansible-vault), "
            "or set $SPECDEPLOY_API_KEY for a run by hand",
        ) from None
    if not key:
        raise SecretError(f"{path} is empty: profile {profile.name} needs its API key there")
    return key
