"""Preflight: refuse a host that cannot run the profile, before anything is installed.

Each check names what it found, what the profile needs and how to fix it. Failures stop
the deploy; warnings (a GPU pair without NVLink) are printed and the deploy goes on.

Every program a check runs (nvidia-smi, podman, apt-cache, systemctl) runs with a deadline
(`Options.timeout_s`, host.command): one that hangs, cannot be run or prints garbage is a
failed check naming it, never a traceback or a wait without end. A check that does not apply
says so (`skip`) instead of "ok" with a placeholder: the NVLink check on a host with fewer GPUs
than tensor_parallel_size said "ok, NVLink: ?".
"""

from __future__ import annotations

import contextlib
import os
import pwd
import re
import shlex
import shutil
import socket
from collections.abc import Callable
from dataclasses import asdict, dataclass
from enum import StrEnum
from pathlib import Path
from typing import Any

from specdeploy.core import hashcache, layout
from specdeploy.core.sizes import GIB
from specdeploy.host import command, cuda, gpus
from specdeploy.profile import Profile


class Level(StrEnum):
    ok = "ok"
    warn = "warn"
    fail = "fail"
    skip = "skip"


@dataclass
class Check:
    name: str
    level: Level
    found: str
    expected: str
    fix: str = ""


@dataclass
class Report:
    profile: str
    checks: list[Check]

    @property
    def ok(self) -> bool:
        return all(c.level != Level.fail for c in self.checks)

    def to_json(self) -> dict[str, Any]:
        return {"profile": self.profile, "ok": self.ok, "checks": [asdict(c) for c in self.checks]}


@dataclass(frozen=True)
class Options:
    nvidia_smi: str = "nvidia-smi"
    podman: str = "podman"
    apt_cache: str = "apt-cache"  # where podman is absent: what the gpu_runtime role would install
    unit: str = layout.UNIT_NAME
    weights_source: str = "hub"  # "archive": weights arrive without the hub; no token needed
    token_present: bool = False
    models_dir: Path = layout.HostLayout().models
    timeout_s: float = command.DEFAULT_TIMEOUT_S  # for each program a check runs
    image: str | None = None  # the image to run: its io.specdeploy.cuda label decides, when present
    system_bus: Path = Path("/run/dbus/system_bus_socket")  # D-Bus's: the light gate asks systemd through it


# --------------------------------------------------------------------------- GPU checks


def _arch_ok(capability: float, arch_list: str) -> bool:
    """A cubin for sm_XY runs on compute capability X.Z with Z >= Y (same major)."""
    for arch in re.findall(r"\d+\.\d+", arch_list):
        major, minor = (int(x) for x in arch.split("."))
        cap_major, cap_minor = int(capability), round((capability - int(capability)) * 10)
        if cap_major == major and cap_minor >= minor:
            return True
    return False


def gpu_checks(profile: Profile, options: Options) -> list[Check]:
    if not profile.uses_gpus:
        return [Check("gpus", Level.skip, "CPU profile", "no GPU")]
    tp = profile.engine.serve.tensor_parallel_size
    try:
        inventory = gpus.parse_query(gpus.run_nvidia_smi(options.nvidia_smi, "-q", timeout=options.timeout_s))
    except gpus.GpuQueryError as exc:
        return [Check("gpus", Level.fail, exc.message, f">= {tp} NVIDIA GPU(s)", exc.hint or "")]
    # the driver's own compute capability; drivers without the field fall back to the name table
    with contextlib.suppress(gpus.GpuQueryError):
        reported = gpus.run_nvidia_smi(options.nvidia_smi, *gpus.CAPABILITY_QUERY, timeout=options.timeout_s)
        gpus.with_capabilities(inventory, gpus.parse_capabilities(reported))
    names = ", ".join(sorted({g.name for g in inventory.gpus})) or "names not shown"
    checks = [_count_check(inventory, tp, names), *_capability_checks(profile, inventory)]
    checks.append(_driver_check(profile, inventory, options))
    checks.append(_nvlink_check(profile, options, tp, inventory.attached))
    return checks


def _count_check(inventory: gpus.GpuInventory, tp: int, names: str) -> Check:
    found = f"{inventory.attached} GPU(s): {names}"
    if inventory.attached >= tp:
        return Check("gpu count", Level.ok, found, f">= {tp} (tensor_parallel_size)")
    return Check(
        "gpu count",
        Level.fail,
        found,
        f">= {tp} (engine.serve.tensor_parallel_size)",
        f"deploy to a host with {tp} GPUs, or use a profile with tensor_parallel_size {inventory.attached}",
    )


def _capability_checks(profile: Profile, inventory: gpus.GpuInventory) -> list[Check]:
    assert profile.host is not None and profile.host.compute_capability_min is not None
    minimum = profile.host.compute_capability_min
    arch_list = profile.engine.image.build_args.get("TORCH_CUDA_ARCH_LIST") if profile.engine.image else None
    expected = f">= {minimum}" + (f" and built for it (TORCH_CUDA_ARCH_LIST {arch_list})" if arch_list else "")
    checks = []
    for gpu in inventory.gpus:
        cap = gpu.compute_capability
        source = "reported by the driver" if gpu.reported_capability is not None else "by product name"
        found = f"{gpu.name} ({gpu.bus_id}): " + (f"compute capability {cap} ({source})" if cap else "unknown model")
        if cap is None:
            fix = "add the model to specdeploy.host.gpus.COMPUTE_CAPABILITY (developer.nvidia.com/cuda-gpus)"
            checks.append(Check("compute capability", Level.fail, found, expected, fix))
        elif cap < minimum or (arch_list and not _arch_ok(cap, arch_list)):
            fix = f"run on GPUs of compute capability {minimum}" + (
                f", or rebuild the image with TORCH_CUDA_ARCH_LIST including {cap}" if arch_list else ""
            )
            checks.append(Check("compute capability", Level.fail, found, expected, fix))
        else:
            checks.append(Check("compute capability", Level.ok, found, expected))
    return checks or [Check("compute capability", Level.warn, "no GPU block in nvidia-smi -q", expected)]


def image_cuda(profile: Profile, options: Options) -> tuple[str | None, str]:
    """The CUDA the image to run is built for, and where that was read: the image's
    io.specdeploy.cuda label when `--image` names an image present on this host, else the
    profile's variant (its base image's CUDA)."""
    base = profile.engine.image.base.name if profile.engine.image else ""
    profile_cuda = cuda.cuda_version(base)
    if options.image:
        try:
            done = command.run(
                [*shlex.split(options.podman), "image", "inspect", "--format", "{{json .Labels}}", options.image],
                timeout=options.timeout_s,
            )
        except command.ProgramRunError:
            done = None
        if done is not None and done.returncode == 0:
            label = re.search(r'"io\.specdeploy\.cuda"\s*:\s*"([0-9]+\.[0-9]+)"', done.stdout)
            if label:
                return label.group(1), f"label io.specdeploy.cuda of {options.image}"
            return profile_cuda, f"{options.image} has no io.specdeploy.cuda label: the profile's base {base}"
        return profile_cuda, f"{options.image} not on this host: the profile's base {base}"
    return profile_cuda, f"the profile's base {base}"


def _cuda_tuple(version: str | None) -> tuple[int, int] | None:
    match = re.match(r"^(\d+)\.(\d+)", version or "")
    return (int(match.group(1)), int(match.group(2))) if match else None


def _driver_check(profile: Profile, inventory: gpus.GpuInventory, options: Options | None = None) -> Check:
    """The image's CUDA against the highest CUDA the driver supports: nvidia-smi's "CUDA Version"
    and NVIDIA's minimum driver branch per CUDA major (host.cuda). Another major is refused (an
    image of a newer major does not start); a newer minor of the same major is a warning (minor
    version compatibility runs it, but not PTX JIT, and the CUDA base images' NVIDIA_REQUIRE_CUDA
    check refuses it unless disabled)."""
    wanted, source = image_cuda(profile, options or Options())
    found = f"driver {inventory.driver_version} (CUDA {inventory.cuda_version or 'unknown'})"
    image, host = _cuda_tuple(wanted), _cuda_tuple(inventory.cuda_version)
    if image is None:
        return Check("driver", Level.warn, found, f"a driver for {source}", "image CUDA version unknown")
    needed = cuda.MIN_DRIVER_FOR_CUDA.get(image[0])
    expected = f"CUDA {wanted} ({source}): driver R{needed}+" if needed else f"CUDA {wanted} ({source})"
    profile_cuda = profile.engine.image.cuda if profile.engine.image else None
    other = (
        f", or use the profile's cu{profile_cuda.replace('.', '')} image"
        if profile_cuda and _cuda_tuple(profile_cuda) != image
        else ""
    )
    older = (
        f", or an image built for CUDA {host[0]}.x (e.g. the cu129 variant on R535-R575)"
        if host and host[0] >= 12 and not other
        else ""
    )
    too_old_branch = needed is not None and inventory.driver_branch < needed
    if too_old_branch or (host is not None and host[0] < image[0]):
        return Check(
            "driver",
            Level.fail,
            found,
            expected,
            f"upgrade the NVIDIA driver to R{needed or '?'}+ (the image's CUDA {wanted} cannot start on "
            f"R{inventory.driver_branch}){other}{older}",
        )
    if host is not None and host < image:
        return Check(
            "driver",
            Level.warn,
            found,
            expected,
            f"the driver supports CUDA {inventory.cuda_version}, the image is {wanted}: CUDA minor version "
            "compatibility runs it (no PTX JIT); the CUDA base images' NVIDIA_REQUIRE_CUDA check may refuse to start "
            f"it — upgrade the driver to one reporting CUDA {wanted}+{other}",
        )
    return Check("driver", Level.ok, found, expected)


def _nvlink_check(profile: Profile, options: Options, tp: int, attached: int) -> Check:
    if tp < 2:
        return Check("nvlink", Level.skip, "tensor_parallel_size 1", "no GPU-to-GPU traffic")
    if attached < tp:  # the gpu count check fails already; there is no tensor-parallel group to judge
        return Check(
            "nvlink",
            Level.skip,
            f"{attached} GPU(s) attached: no group of {tp} GPUs to check (see gpu count)",
            f"NVLink between GPUs 0-{tp - 1}",
        )
    try:
        topology = gpus.run_nvidia_smi(options.nvidia_smi, "topo", "-m", timeout=options.timeout_s)
        links = gpus.parse_topology(topology)
    except gpus.GpuQueryError as exc:
        return Check("nvlink", Level.warn, f"topology unreadable: {exc.message}", "NVLink between the TP GPUs")
    return nvlink_verdict(links, tp, profile.engine.serve.disable_custom_all_reduce)


def nvlink_verdict(links: dict[tuple[int, int], str], tp: int, custom_all_reduce_off: bool | None) -> Check:
    """ok only when `topo -m` shows NVLink between every pair of the first `tp` GPUs; a pair it
    does not show is reported as unknown (a warning), never counted as NVLink."""
    expected = f"NVLink between GPUs 0-{tp - 1}"
    if tp < 2:
        return Check("nvlink", Level.skip, f"tensor_parallel_size {tp}", "no GPU-to-GPU traffic")
    group = [(i, j) for i in range(tp) for j in range(i + 1, tp)]
    unknown = [(i, j) for i, j in group if (i, j) not in links]
    if unknown:
        shown = ", ".join(f"GPU{i}-GPU{j}" for i, j in unknown[:6]) + (" ..." if len(unknown) > 6 else "")
        return Check(
            "nvlink",
            Level.warn,
            f"nvidia-smi topo -m shows no link between {shown}: unknown whether they have NVLink",
            expected,
            "check `nvidia-smi topo -m` on the host: it should list every GPU tensor parallelism uses",
        )
    pcie = gpus.without_nvlink(links, tp)
    if not pcie:
        return Check("nvlink", Level.ok, "NVLink: " + ", ".join(sorted({links[pair] for pair in group})), expected)
    pairs = ", ".join(f"GPU{i}-GPU{j} over {link}" for i, j, link in pcie)
    fix = "vLLM #41190: the PR #40898 build crashed at TP=2 without NVLink (illegal address); "
    fix += (
        "the profile already disables the custom all-reduce"
        if custom_all_reduce_off
        else "set engine.serve.disable_custom_all_reduce: true"
    )
    return Check("nvlink", Level.warn, f"no NVLink: {pairs}", expected, fix)


# --------------------------------------------------------------------------- host checks


def _nearest_existing(path: Path) -> Path:
    while not path.exists() and path != path.parent:
        path = path.parent
    return path


def disk_check(profile: Profile, options: Options) -> Check:
    host = profile.host
    if host is None:
        return Check(
            "disk", Level.warn, "profile states no disk needs", "a host section", "add host.disk to the profile"
        )
    models = options.models_dir
    # weights already verified at the pinned revisions need no space again; partial downloads and
    # other revisions do not count (they are not what this deploy serves)
    have = (
        sum(
            hashcache.verified_bytes(models / ref.repo / ref.revision.value, ref.revision.value)
            for ref in (profile.target, profile.drafter)
            if ref is not None and ref.revision.resolved and isinstance(ref.revision.value, str)
        )
        / GIB
    )
    need = max(0.0, host.disk.weights_gib - have) + host.disk.margin_gib
    if profile.engine.runtime == "container":
        need += host.disk.images_gib
    where = _nearest_existing(models)
    free = shutil.disk_usage(where).free / GIB
    found = f"{free:.1f} GiB free on {where} ({have:.1f} GiB of the pinned revisions already verified there)"
    d = host.disk
    expected = f">= {need:.1f} GiB (weights {d.weights_gib}, images {d.images_gib}, margin {d.margin_gib})"
    if free >= need:
        return Check("disk", Level.ok, found, expected)
    return Check(
        "disk",
        Level.fail,
        found,
        expected,
        f"free {need - free:.1f} GiB on {where}, or put the models elsewhere (specdeploy_models_dir in "
        "the inventory, --models-dir by hand)",
    )


def _version(text: str) -> tuple[int, ...]:
    match = re.search(r"(\d+)\.(\d+)(?:\.(\d+))?", text)
    return tuple(int(x) for x in match.groups() if x is not None) if match else ()


def _apt_candidate(apt_cache: str, package: str, timeout: float) -> str | None:
    """The version `apt-get install package` would install, or None (no apt, or no candidate)."""
    try:
        done = command.run([apt_cache, "policy", package], timeout=timeout)
    except command.ProgramRunError:
        return None
    match = re.search(r"Candidate:\s*(\S+)", done.stdout)
    return match.group(1) if match and match.group(1) != "(none)" else None


def podman_check(profile: Profile, options: Options) -> Check:
    """podman new enough for the quadlet's health keys. Preflight runs before gpu_runtime
    installs podman, so an absent podman is judged by the version the distribution would install."""
    minimum = profile.host.podman_min if profile.host else None
    if profile.engine.runtime != "container" or minimum is None:
        return Check("podman", Level.skip, f"runtime {profile.engine.runtime}", "no container engine needed")
    expected = f">= {minimum} (the quadlet keys the engine unit uses)"
    upgrade = (
        f"use a distribution whose podman is {minimum}+ (Debian trixie ships 5.4; bookworm ships 4.3, Ubuntu 24.04 4.9)"
    )
    try:
        done = command.run([options.podman, "--version"], timeout=options.timeout_s)
    except command.ProgramRunError as exc:
        if exc.reason != "missing":  # there, but it cannot be run, hangs or floods: not a podman to use
            return Check(
                "podman",
                Level.fail,
                exc.message,
                expected,
                f"pass --podman the path of a working podman (`podman --version` must answer), or {upgrade}",
            )
        candidate = _apt_candidate(options.apt_cache, "podman", options.timeout_s)
        if candidate is None:
            return Check("podman", Level.fail, "podman not installed, and apt offers none", expected, upgrade)
        found = f"podman not installed yet; gpu_runtime installs podman {candidate} (apt candidate)"
        if _version(candidate) >= _version(minimum):
            return Check("podman", Level.ok, found, expected)
        return Check("podman", Level.fail, found, expected, upgrade)
    found = done.stdout.strip() or done.stderr.strip()
    if _version(found) >= _version(minimum):
        return Check("podman", Level.ok, found, expected)
    return Check("podman", Level.fail, found, expected, f"upgrade podman to {minimum}+ (Debian bookworm ships 4.3)")


def _listeners(port: int) -> dict[str, int]:
    """Socket inode -> owner uid of every socket listening on `port` (IPv4 and IPv6), from /proc/net."""
    found = {}
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            rows = Path(table).read_text().splitlines()[1:]
        except OSError:
            continue
        for row in rows:
            cols = row.split()
            if len(cols) > 9 and cols[3] == "0A" and int(cols[1].rsplit(":", 1)[1], 16) == port:
                found[cols[9]] = int(cols[7])
    return found


def _unit_user_uid(unit: str, timeout: float) -> int | None:
    """The uid an active unit runs as (None when the unit is not active, or systemd cannot say)."""
    show = ["systemctl", "show", "--property=ActiveState,User", unit]
    try:
        done = command.run(show, timeout=timeout)
    except command.ProgramRunError:
        return None
    props = dict(line.split("=", 1) for line in done.stdout.splitlines() if "=" in line)
    if props.get("ActiveState") != "active":
        return None
    try:
        return pwd.getpwnam(props["User"]).pw_uid if props.get("User") else 0
    except KeyError:
        return None


def _owners(inodes: set[str] | dict[str, int]) -> list[tuple[int, str, str]]:
    """(pid, command line, cgroup) of the processes holding those sockets."""
    owners = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            entries = list((proc / "fd").iterdir())
        except OSError:  # another user's process, or gone
            continue
        fds = set()
        for fd in entries:
            with contextlib.suppress(OSError):  # closed meanwhile
                fds.add(os.readlink(fd))
        if any(f"socket:[{i}]" in fds for i in inodes):
            try:
                cmd = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace").strip()
                cgroup = (proc / "cgroup").read_text()
            except OSError:
                cmd, cgroup = "?", ""
            owners.append((int(proc.name), cmd, cgroup))
    return owners


def port_check(profile: Profile, options: Options) -> Check:
    serve = profile.engine.serve
    port = serve.port
    expected = (
        f"port {port} free, or held by {options.unit} (which the deploy replaces) and its listener "
        f"({layout.LISTENER_UNIT_NAME}, behind a front)"
    )
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # TIME_WAIT is not "in use"
        try:
            sock.bind(("0.0.0.0" if serve.host == "0.0.0.0" else serve.host, port))
            return Check("port", Level.ok, f"{port} free", expected)
        except OSError:
            pass
    listeners = _listeners(port)
    owners = _owners(listeners)
    # the engine (on loopback) and, behind a front, the host's listener (the internal address: front/listener.py)
    ours = (f"{options.unit}.service", f"{layout.LISTENER_UNIT_NAME}.service")
    if owners and all(any(unit in cgroup for unit in ours) for _, _, cgroup in owners):
        return Check("port", Level.ok, f"{port} held by the running {options.unit} or its listener", expected)
    if not owners and listeners:
        # Processes of another user hide their sockets without CAP_SYS_PTRACE (containers):
        # fall back to the socket's owner, which must be the user the active engine runs as.
        uid = _unit_user_uid(options.unit, options.timeout_s)
        if uid is not None and set(listeners.values()) == {uid}:
            return Check("port", Level.ok, f"{port} held by the running {options.unit} (uid {uid})", expected)
    who = "; ".join(f"pid {pid} ({cmd[:80]})" for pid, cmd, _ in owners)
    who = who or ", ".join(f"uid {u}" for u in sorted(set(listeners.values()))) or "an unknown process"
    return Check(
        "port", Level.fail, f"{port} in use by {who}", expected, "stop it, or change engine.serve.port in the profile"
    )


def token_check(profile: Profile, options: Options) -> Check:
    gated = [m.repo for m in (profile.target, profile.drafter) if m is not None and getattr(m, "gated", False)]
    if not gated:
        return Check("hub token", Level.skip, "no gated repository", "none")
    if options.weights_source != "hub":
        return Check("hub token", Level.skip, f"weights from {options.weights_source}", "none")
    expected = f"a token with access to {', '.join(gated)}"
    if options.token_present:
        return Check("hub token", Level.ok, "configured (value not shown)", expected)
    fix = (
        f"request access at https://huggingface.co/{gated[0]}, then store the token with ansible-vault as "
        "weights_hf_token (docs/ansible.md: vault setup) or export HF_TOKEN for a hand-run fetch"
    )
    return Check("hub token", Level.fail, "no token configured", expected, fix)


def system_bus_check(profile: Profile, options: Options) -> Check:
    """The light gate runs as its own account (watch/units.py), which asks systemd for the engine
    unit's state (its automatic restarts) over the system bus: without D-Bus it still judges the
    stack, but its result and textfile carry no restart count. A warning, not a refusal."""
    expected = "D-Bus's system bus (the light gate reads the engine unit's restarts through it)"
    try:
        found = options.system_bus.is_socket()
    except OSError as exc:  # a directory on the way this account may not enter
        return Check("system bus", Level.warn, f"{options.system_bus}: {exc.strerror}", expected, "run as root")
    if found:
        return Check("system bus", Level.ok, str(options.system_bus), expected)
    return Check(
        "system bus", Level.warn, f"no socket at {options.system_bus}", expected,
        "apt-get install dbus (Debian servers have it; a minimal image may not)",
    )  # fmt: skip


CHECKS: tuple[Callable[[Profile, Options], Check], ...] = (
    disk_check, podman_check, port_check, token_check, system_bus_check,
)  # fmt: skip


def run(profile: Profile, options: Options) -> Report:
    return Report(profile.name, [*gpu_checks(profile, options), *(check(profile, options) for check in CHECKS)])
