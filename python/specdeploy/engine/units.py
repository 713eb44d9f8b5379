"""Render the engine's systemd unit from the profile: a podman quadlet `.container` for the
GPU profiles, a plain service running the venv engine for the rehearsal.

Every flag and environment variable comes from `engine_args.render` — the same renderer the
rehearsal launcher uses — so the unit cannot drift from what was tested. The engine serves
offline from local paths (`HF_HUB_OFFLINE=1`, no token); the API key reaches it only as a
podman secret or a credential file, never in the unit. `install` writes atomically and
reports whether anything changed, so Ansible restarts the engine only when it must.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import re
import tempfile
from dataclasses import dataclass
from pathlib import Path

from specdeploy.core import atomic, files, layout
from specdeploy.core.errors import ProfileError, UsageError, WriteError
from specdeploy.core.keeper import Keeper
from specdeploy.engine import args as engine_args
from specdeploy.profile import Profile

# What a unit may run: an image by its digest, which no push can move (a tag can: the unit would
# then start an image nobody checked). `image ensure` prints exactly this form as its reference.
IMAGE_BY_DIGEST = re.compile(r"[^\s@\x00-\x1f\x7f]+@sha256:[0-9a-f]{64}")  # no control character in a unit line
# What `image ensure --check` prints for an image it would still build, pull or load: accepted by
# `unit install --check` only, which writes nothing (ansible-playbook --check).
IMAGE_PLACEHOLDER = re.compile(r"[^\s@\x00-\x1f\x7f]+@\(not yet (?:build|pull|archive)\)")
# A line break (or any control character) in a value would end the unit's line and start a
# directive of its own: ExecStartPre=, a second Environment=, a Volume= of the whole disk.
CONTROL = re.compile(r"[\x00-\x1f\x7f]")
ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


def require_image_ref(image: str | None, profile: Profile, *, placeholder_ok: bool = False) -> str:
    """The `--image` a container unit runs: NAME@sha256:<64 hex>, or a UsageError (exit 2) that
    names the flag, the form expected and what was found."""
    hint = (
        'pass the image reference `specdeploy image ensure` prints (its "reference": NAME@sha256:DIGEST), '
        "or `podman image inspect --format '{{.Digest}}' IMAGE` for the digest"
    )
    if image is None:
        raise UsageError(
            f"profile {profile.name} runs in a container: --image is missing; expected the image reference "
            "by digest, NAME@sha256:<64 hex digits>",
            hint=hint,
        )
    if IMAGE_BY_DIGEST.fullmatch(image) or (placeholder_ok and IMAGE_PLACEHOLDER.fullmatch(image)):
        return image
    if "@sha256:" in image:
        found = "a digest that is not 64 lowercase hex digits"
    elif "@" in image:
        found = "a digest that is not sha256"
    else:
        found = "a mutable tag" if ":" in image.rsplit("/", 1)[-1] else "a name without a digest (tag latest)"
    raise UsageError(
        f"--image {image!r}: expected a reference by digest NAME@sha256:<64 hex digits>, found {found}: a tag can "
        "move to another image after the check, and the unit would run an image nobody checked; nothing was written",
        hint=hint,
    )


def _refuse_control(value: str, field: str, *, profile: Profile | None = None) -> None:
    if match := CONTROL.search(value):
        where = f"profile {profile.name}: field {field}" if profile else field
        error = ProfileError if profile else UsageError
        raise error(
            f"{where}: expected no control characters in a value rendered into the engine's unit, found "
            f"{match.group()!r} in {value[:80]!r}: a line break would end the unit's line and start a directive "
            "of its own; nothing was written",
            hint=f"remove the line break (or other control character) from {field}",
        )


def require_renderable(profile: Profile, **paths: str | None) -> None:
    """Every value the unit renders from the profile (and the command line's paths) is one line:
    a ProfileError / UsageError (exit 2) naming the field otherwise."""
    serve = profile.engine.serve
    fields: dict[str, str | None] = {
        "name": profile.name,
        "engine.source.version": str(profile.engine.source.version.value),
        "engine.serve.host": serve.host,
        "engine.serve.served_model_name": serve.served_model_name,
        "engine.serve.dtype": serve.dtype,
        "engine.serve.attention_backend": serve.attention_backend,
        "engine.serve.api_key.secret": serve.api_key.secret if serve.api_key else None,
        **{f"engine.serve.extra_args[{i}]": a for i, a in enumerate(serve.extra_args)},
        **{f"engine.env.{k}": v for k, v in profile.engine.env.items()},
    }
    for field, value in fields.items():
        if value is not None:
            _refuse_control(value, field, profile=profile)
    for key in profile.engine.env:
        if not ENV_NAME.fullmatch(key):
            raise ProfileError(
                f"profile {profile.name}: field engine.env: expected environment variable names (letters, digits "
                f"and _, not starting with a digit), found {key!r}; nothing was written",
                hint="rename the variable in the profile's engine.env",
            )
    for option, value in paths.items():
        if value is not None:
            _refuse_control(value, f"--{option.replace('_', '-')}")


def systemd_quote(arg: str) -> str:
    """Quote one argument for an Exec line (systemd.service(5) "COMMAND LINES")."""
    if arg and all(c.isalnum() or c in "-_./:=,@+" for c in arg):
        return arg
    escaped = arg.replace("\\", "\\\\").replace('"', '\\"').replace("%", "%%").replace("$", "$$")
    return f'"{escaped}"'


def _exec_line(argv: list[str]) -> str:
    return " ".join(systemd_quote(a) for a in argv)


@dataclass(frozen=True)
class RenderedUnit:
    filename: str
    text: str


# How often an engine may fail to start before systemd gives up and marks the unit failed
# (seconds, starts): a container engine loads 27B weights for minutes, a CPU one in seconds.
# Past the engine's own shutdown timeout (engine.args.shutdown_timeout_s): time to exit before a kill.
STOP_MARGIN_S = 30
START_LIMIT = {"container": (3600, 3), "venv": (600, 3)}


def _unit_section(profile: Profile, profile_file: str | None) -> list[str]:
    interval, burst = START_LIMIT[profile.engine.runtime]
    return [
        layout.UNIT_HEADER.format(name=profile.name),
        *([layout.UNIT_PROFILE_LINE + profile_file] if profile_file else []),
        "",
        "[Unit]",
        f"Description=specdeploy {profile.name}: {profile.engine.kind} {profile.engine.source.version.value}",
        "After=network-online.target",
        "Wants=network-online.target",
        # Restart=always (below) restarts an engine that died with exit 0 (vllm-project/vllm#53726);
        # these end a crash loop as `failed` in bounded time, where the gate and rollback see it
        f"StartLimitIntervalSec={interval}",
        f"StartLimitBurst={burst}",
        "",
    ]


def _model_paths(profile: Profile, host: layout.HostLayout) -> tuple[str, str | None]:
    model = str(host.target_serving)  # a link to the verified revision (weights.store)
    drafter = str(host.drafter_serving) if profile.drafter is not None else None
    return model, drafter


# A read-only root (hardening): every cache an engine writes goes under the /cache volume.
CONTAINER_CACHE_ENV = {
    "HOME": "/cache/home",  # the image user's home is on the read-only root (~/.deep_gemm, ~/.config, ...)
    "XDG_CACHE_HOME": "/cache/xdg",  # ~/.cache users
    "FLASHINFER_WORKSPACE_BASE": "/cache/flashinfer",  # FlashInfer's JIT cache ignores XDG_CACHE_HOME
    "TRITON_CACHE_DIR": "/cache/triton",
    "TORCHINDUCTOR_CACHE_DIR": "/cache/torchinductor",
    "VLLM_CACHE_ROOT": "/cache/vllm",
}


def render_quadlet(
    profile: Profile,
    *,
    image: str,
    host: layout.HostLayout,
    profile_file: str | None = None,
) -> RenderedUnit:
    """A quadlet `.container` for a GPU profile (the profile's podman_min: 5.0)."""
    serve = profile.engine.serve
    # the models and serving directories are mounted at their host paths: the serving links are
    # relative (weights.store), so they resolve in the container exactly as on the host
    model, drafter = _model_paths(profile, host)
    command = engine_args.render(profile, model=model, drafter=drafter, launcher=layout.LAUNCHER_IN_IMAGE)
    args = command.engine_args  # the image's ENTRYPOINT is `python3 <launcher> <engine module>`
    key = command.api_key
    key_in_container = f"{layout.SECRETS_IN_CONTAINER}/{key.secret}" if key else None
    key_env = key.launcher_env(key_file=key_in_container) if key else {}
    port = serve.port
    # Single quotes outside: podman 5.4.2's quadlet drops the closing double quote of
    # `HealthCmd=python3 -c "..."`, and the check then never passes (tests/integration/test_units_on_host.py).
    probe = f'import urllib.request; urllib.request.urlopen("http://127.0.0.1:{port}/health", timeout=5)'
    health = f"python3 -c '{probe}'"
    lines = [
        *_unit_section(profile, profile_file),
        "[Container]",
        f"Image={image}",
        f"ContainerName={layout.UNIT_NAME}",
        # the image's user, named here so the host directories' group access is what it gets
        f"User={layout.ENGINE_UID}",
        f"Group={layout.ENGINE_UID}",
        # only the GPUs tensor parallelism uses (CDI names them by index), not every GPU of the host;
        # none for a CPU profile (the rehearsal's container engine)
        *(f"AddDevice=nvidia.com/gpu={i}" for i in range(serve.tensor_parallel_size) if profile.uses_gpus),
        # hardening: no privilege gain, no capabilities, a read-only root (podman puts tmpfs on
        # /tmp, /var/tmp and /run); the engine writes only to /cache and /dev/shm
        "NoNewPrivileges=true",
        "DropCapability=all",
        "ReadOnly=true",
        # at their host paths, so the relative serving links resolve as on the host (GPU-host blocker 6)
        f"Volume={host.models}:{host.models}:ro",
        f"Volume={host.serving}:{host.serving}:ro",
        f"Volume={host.cache}:/cache",
        # inside the container the engine listens on serve.host; the host publishes it on its loopback
        # only, where the gate, the light gate and the rollback's proof reach it. A front reaches it
        # through the host's listener (front/listener.py: mutual TLS on the internal address), never
        # here: vLLM's key guards /v1 alone, /metrics, /tokenize and /invocations answer anyone
        f"PublishPort={layout.DEFAULT_PUBLISH_HOST}:{port}:{port}",
        "ShmSize=16g",
        *(f"Environment={k}={v}" for k, v in sorted((CONTAINER_CACHE_ENV | command.env | key_env).items())),
        # the key as a file only the engine's user can read; the launcher hands it over in-process
        *(
            [f"Secret={key.secret},type=mount,target={key_in_container},uid={layout.ENGINE_UID},mode=0400"]
            if key
            else []
        ),
        f"Exec={_exec_line(args)}",
        f"HealthCmd={health}",
        "HealthInterval=30s",
        "HealthRetries=3",
        "HealthStartPeriod=30m",
        # while starting, probe every 2 s: a 27 s start is not rounded up to the next 30 s check
        # (systemd sees READY through Notify=healthy); then the 30 s check above takes over
        f"HealthStartupCmd={health}",
        "HealthStartupInterval=2s",
        "HealthStartupSuccess=1",
        "Notify=healthy",
        # an init as PID 1: the launcher's log redactor must outlive SGLang's kill of its process tree
        "RunInit=true",
        "LogDriver=journald",
        # podman stop's SIGKILL only after the requests in flight had their time (podman >= 5.0)
        f"StopTimeout={engine_args.shutdown_timeout_s(profile) + STOP_MARGIN_S // 2}",
        "",
        "[Service]",
        "Restart=always",
        "RestartSec=30",
        "TimeoutStartSec=2400",
        f"TimeoutStopSec={engine_args.shutdown_timeout_s(profile) + STOP_MARGIN_S}",
        "",
        "[Install]",
        "WantedBy=multi-user.target",
        "",
    ]
    return RenderedUnit(layout.UNIT_FILES["container"].name, "\n".join(lines))


# The venv service's sandbox (`systemd-analyze security`: 9.2 "UNSAFE" without it). What stays
# exposed, and why: MemoryDenyWriteExecute (torch and Triton JIT-compile into writable
# executable memory); SystemCallFilter (vLLM-CPU binds memory to NUMA nodes with mbind and
# set_mempolicy, which @system-service lacks); ProcSubset=pid (vLLM reads /proc/cpuinfo and
# /proc/meminfo); PrivateNetwork and IPAddressDeny (it serves over TCP); PrivateUsers (the
# engine user's files on the host must keep their owner).
HARDENING = (
    "NoNewPrivileges=yes",
    "CapabilityBoundingSet=",
    "AmbientCapabilities=",
    "ProtectSystem=strict",
    "ProtectHome=yes",
    "PrivateTmp=yes",
    "PrivateDevices=yes",
    "ProtectKernelTunables=yes",
    "ProtectKernelModules=yes",
    "ProtectKernelLogs=yes",
    "ProtectControlGroups=yes",
    "ProtectClock=yes",
    "ProtectHostname=yes",
    "ProtectProc=invisible",
    "RestrictNamespaces=yes",
    "RestrictRealtime=yes",
    "RestrictSUIDSGID=yes",
    "RestrictAddressFamilies=AF_UNIX AF_INET AF_INET6 AF_NETLINK",
    "LockPersonality=yes",
    "SystemCallArchitectures=native",
    "RemoveIPC=yes",
    "UMask=0077",
)


def render_service(
    profile: Profile, *, python: str, host: layout.HostLayout, profile_file: str | None = None
) -> RenderedUnit:
    """A plain systemd service running the engine from a venv (the CPU rehearsal)."""
    model, drafter = _model_paths(profile, host)
    command = engine_args.render(profile, model=model, drafter=drafter, python=python)
    key = command.api_key
    env = command.env | (key.launcher_env(credential=key.secret) if key else {})
    lines = [
        *_unit_section(profile, profile_file),
        "[Service]",
        "Type=exec",
        f"User={layout.ENGINE_USER}",
        *HARDENING,
        # the only place it writes: its home (vLLM's caches); models and serving stay read-only
        f"ReadWritePaths={layout.ENGINE_HOME}",
        *(f"Environment={systemd_quote(f'{k}={v}')}" for k, v in sorted(env.items())),
        # systemd reads the root-only key file and hands it to the engine's user alone
        *([f"LoadCredential={key.secret}:{host.secret_file(key.secret)}"] if key else []),
        f"ExecStart={_exec_line(command.argv)}",
        # SIGTERM to the API server only: it shuts its engine processes down itself; whatever
        # is left is killed once the requests in flight had their time (engine.args.shutdown_timeout_s;
        # an idle vLLM stops in seconds)
        "KillMode=mixed",
        f"TimeoutStopSec={engine_args.shutdown_timeout_s(profile) + STOP_MARGIN_S}",
        "Restart=always",
        "RestartSec=10",
        "TimeoutStartSec=900",
        "",
        "[Install]",
        "WantedBy=multi-user.target",
        "",
    ]
    return RenderedUnit(layout.UNIT_FILES["venv"].name, "\n".join(lines))


def render(
    profile: Profile,
    *,
    host: layout.HostLayout | None = None,
    image: str | None = None,
    python: str | None = None,
    profile_file: str | None = None,
    placeholder_ok: bool = False,
) -> RenderedUnit:
    """The profile's engine unit for a host laid out as `host` (default: the standard layout).
    Container profiles need the image reference (by digest; `placeholder_ok`: or the placeholder
    `image ensure --check` prints, for a check that writes nothing); the venv runtime runs `python`
    (default: the specdeploy venv's, where the rehearsal installs the engine). Every refusal is
    exit 2 and names the flag or the profile's field."""
    host = host or layout.HostLayout()
    require_renderable(
        profile,
        python=python,
        profile_file=profile_file,
        models_dir=str(host.models),
        serving_dir=str(host.serving),
        state_dir=str(host.state),
        cache_dir=str(host.cache),
    )
    if profile.engine.runtime == "container":
        if python is not None:
            raise UsageError(
                f"--python {python}: profile {profile.name} runs its engine in a container (the image's python), "
                "expected no --python; nothing was written",
                hint="leave --python out for a container profile (it names a venv profile's engine venv)",
            )
        image = require_image_ref(image, profile, placeholder_ok=placeholder_ok)
        return render_quadlet(profile, image=image, host=host, profile_file=profile_file)
    if image is not None:
        raise UsageError(
            f"--image {image}: profile {profile.name} runs its engine from a venv (engine.runtime venv), "
            "expected no --image; nothing was written",
            hint="leave --image out for a venv profile, or pass the container profile you meant",
        )
    python = python or str(layout.InstallLayout().venv / "bin" / "python")
    return render_service(profile, python=python, host=host, profile_file=profile_file)


def _probe_writable(directory: Path, *, what: str) -> None:
    """Create and remove a file in `directory` (the atomic write's own first step), so that a
    directory nothing can be written to is found before anything else is written."""
    try:
        fd, name = tempfile.mkstemp(prefix=".specdeploy-probe.", dir=directory)
    except OSError as exc:
        raise WriteError(
            f"{what} {directory} cannot be written: {exc.strerror or exc}; nothing was written (no unit, no "
            "profile copy, no rollback copy)",
            hint="run as root on the host (the unit directory is root's), or remount it read-write",
        ) from None
    os.close(fd)
    with contextlib.suppress(OSError):
        os.unlink(name)


def require_unit_dir(directory: Path, filename: str, *, check: bool = False) -> Path:
    """Refuse, before anything is written, a unit directory the unit cannot go into: a file in
    its place or a missing parent (exit 2: a wrong DEST; with `check`, only a file in the way),
    a unit path that is not a file (exit 2), a directory nothing can be written to (exit 1; not
    probed with `check`, which writes nothing)."""
    directory = Path(directory)
    hint = "pass the unit directory `specdeploy facts` names (unit.dir: /etc/containers/systemd or /etc/systemd/system)"
    found = files.kind_of(directory)
    if found is None:
        if check:  # ansible-playbook --check on a fresh host: the runtime that makes the parent may not be there yet
            require_dir_or_creatable(directory, option="unit directory")
            return directory
        parent = directory.parent
        if files.kind_of(parent) != "a directory":
            raise UsageError(
                f"unit directory {directory}: expected a directory (or one to create in an existing directory), "
                f"found nothing there and {files.kind_of(parent) or 'nothing'} at its parent {parent}; "
                "nothing was written",
                hint=hint,
            )
        _probe_writable(parent, what="the parent of unit directory")
        return directory
    if found != "a directory":
        raise UsageError(
            f"unit directory {directory}: expected a directory, found {found}; nothing was written", hint=hint
        )
    path = directory / filename
    found_unit = files.kind_of(path)
    if found_unit is not None and found_unit != "a regular file":
        masked = path.is_symlink() and os.readlink(path) == os.devnull
        raise UsageError(
            f"unit {path}: expected a regular file (or nothing, to create it), found {found_unit}"
            + (" (the unit is masked)" if masked else "")
            + "; nothing was written",
            hint=f"systemctl unmask {layout.UNIT_NAME}" if masked else f"remove {path} (it is not a unit file)",
        )
    if not check:
        _probe_writable(directory, what="unit directory")
    return directory


def install(unit: RenderedUnit, directory: Path, keeper: Keeper | None = None, *, check: bool = False) -> bool:
    """Write the unit atomically; True when its content changed (the engine must restart).

    With a keeper, the unit being replaced (or its absence) is kept for a rollback first.
    With `check`, nothing is written: only whether it would change (`ansible-playbook --check`).
    A unit that cannot be written leaves nothing behind: no unit, no rollback copy.
    """
    require_unit_dir(directory, unit.filename, check=check)
    path = Path(directory) / unit.filename
    data = unit.text.encode()
    if path.is_file() and path.read_bytes() == data:
        return False
    if check:
        return True
    atomic.ensure_dir(path.parent)
    staged = keeper.stage(path) if keeper else None
    try:
        atomic.write_bytes(path, data)
    except BaseException:
        if staged:
            staged.discard()
        raise
    if staged:
        staged.commit()
    return True


def require_dir_or_creatable(path: Path, *, option: str) -> Path:
    """`path` when it is a directory or nothing yet under an existing directory (it is created
    when written); a UsageError (exit 2) naming `option` and what is there otherwise."""
    path = Path(path)
    found = files.kind_of(path)
    if found in (None, "a directory"):
        ancestor = path
        while files.kind_of(ancestor) is None and ancestor != ancestor.parent:
            ancestor = ancestor.parent
        if files.kind_of(ancestor) == "a directory":
            return path
        found = f"{files.kind_of(ancestor)} at {ancestor}"
    raise UsageError(
        f"{option} {path}: expected a directory (or a path where one can be created), found {found}; "
        "nothing was written",
        hint=f"pass a directory as {option} (`specdeploy facts` names the host's paths)",
    )


def _profile_bytes(source: Path) -> bytes:
    """The profile file's bytes, read as every profile is (a regular file under the YAML ceiling)."""
    return files.read_bytes(source, what="profile", limit=files.LIMITS["yaml"])


def profile_copy_path(source: Path, host: layout.HostLayout) -> Path:
    """Where `keep_profile_copy` keeps `source`: <sha12 of its content>/<its name>.yaml (a
    profile's file name must stay its name, profile.load_profile)."""
    return host.profiles / hashlib.sha256(_profile_bytes(source)).hexdigest()[:12] / Path(source).name


def keep_profile_copy(source: Path, host: layout.HostLayout) -> Path:
    """Store the profile file a unit is rendered from under `<state>/profiles/`, named by
    content, so the unit can name it and a rollback can find the thresholds it ran with."""
    data = _profile_bytes(source)
    path = profile_copy_path(source, host)
    if not (path.is_file() and path.read_bytes() == data):
        atomic.ensure_dir(path.parent)
        atomic.write_bytes(path, data)
    return path
