"""Whether the CDI spec that exposes the GPUs to containers must be (re)generated.

The failure this prevents: the gpu_runtime role generated the CDI spec
(`nvidia-ctk cdi generate --output /etc/cdi/nvidia.yaml`) only when `nvidia-ctk cdi list`
lacked `nvidia.com/gpu=all`. A spec names the driver's library files by version
(libcuda.so.570.86.15, ...), so after a driver upgrade it still listed the old driver's
files, every GPU container broke, and nothing regenerated it because the device name was
still there.

So the driver a spec was generated for is recorded when it is generated, in a stamp
(`<state>/cdi.json`: driver version, spec path, the spec's sha256, when) — never under
/etc/cdi, where podman parses every *.yaml and *.json as a CDI spec. `status` decides from
the spec, the stamp and the running driver: regenerate when the spec is missing, when no
stamp says which driver it is for (once), when the stamp names another driver or another
spec, and when the spec's sha256 is not the recorded one (someone replaced it); otherwise
not. The running driver is what nvidia-smi reports, read with the query preflight uses
(with a deadline: a hung driver is an error after `timeout` seconds, not a wait without end).

Bad input found by trying, now each a named error (exit 2) before anything is written: a spec
path that is a directory or a FIFO was reported as "does not exist" (and hashing a FIFO would
block); a stamp that was a FIFO blocked `status` forever; a stamp path that was a directory, or
a state directory that was a file, failed the write with "free space or remount".
"""

from __future__ import annotations

import os
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from specdeploy.core import atomic, files
from specdeploy.core.errors import InputFileError, SpecdeployError
from specdeploy.core.keeper import Keeper
from specdeploy.host import command, gpus

STAMP_NAME = "cdi.json"  # under the host layout's <state>


class CdiError(SpecdeployError):
    """The CDI spec's stamp cannot be decided on or recorded."""


class SpecMissingError(CdiError):
    """`record` was asked to record a spec that does not exist (an input file: exit 2)."""

    exit_code = 2


@dataclass(frozen=True)
class Stamp:
    """What a CDI spec was generated for, recorded right after generating it."""

    driver_version: str
    spec: str
    spec_sha256: str
    recorded_at: str

    def to_json(self) -> dict[str, str]:
        return asdict(self)


@dataclass(frozen=True)
class CdiStatus:
    """The decision, and what it was made from."""

    regenerate: bool
    reason: str
    driver_version: str
    recorded_driver_version: str | None
    spec: str

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def stamp_path(state_dir: Path) -> Path:
    return Path(state_dir) / STAMP_NAME


def _not_a_file(path: Path) -> str | None:
    """What is at `path` when it is there and not a regular file (a link is followed); else None."""
    found = files.kind_of(path)
    return None if found == "a regular file" else found


def read_stamp(path: Path) -> Stamp | None:
    """The stamp at `path`; None when there is none. A stamp whose content cannot be read or is
    not one is a CdiError naming it (the caller decides: `check` regenerates once and records
    anew); one that is not a regular file (a directory, a FIFO) is an InputFileError (exit 2):
    recording anew could not replace it."""
    path = Path(path)
    if not os.path.lexists(path):
        return None
    found = _not_a_file(path)
    if found:
        raise InputFileError(
            f"the CDI stamp {path}: expected a file specdeploy writes, found {found}; nothing was decided",
            hint=f"remove {path} (`specdeploy cdi record` writes it anew), then run this again",
        )
    try:
        data = files.read_json(path, what="CDI stamp")
    except InputFileError as exc:
        detail = exc.message.removeprefix(f"CDI stamp {path}").lstrip(" :")
        raise CdiError(f"the CDI stamp {path} is unreadable: {detail}") from None
    fields = ("driver_version", "spec", "spec_sha256", "recorded_at")
    if not isinstance(data, dict) or not all(isinstance(data.get(f), str) and data.get(f) for f in fields):
        raise CdiError(f"the CDI stamp {path} is not a stamp: it needs the strings {', '.join(fields)}")
    return Stamp(**{f: data[f] for f in fields})


def status(spec: Path, stamp: Stamp | None, driver_version: str, *, stamp_problem: str | None = None) -> CdiStatus:
    """Must the CDI spec at `spec` be (re)generated for a host running `driver_version`?

    `stamp` is what was recorded when the spec was last generated (None: nothing was, or
    `stamp_problem` says why it could not be read)."""
    spec = Path(spec)
    recorded = stamp.driver_version if stamp else None

    def decided(regenerate: bool, reason: str) -> CdiStatus:
        return CdiStatus(regenerate, reason, driver_version, recorded, str(spec))

    found = _not_a_file(spec)
    if found:
        raise SpecMissingError(
            f"the CDI spec {spec}: expected the YAML file nvidia-ctk generates, found {found}; "
            "nvidia-ctk could not write the spec there",
            hint=f"move {spec} away (or pass --spec the path gpu_runtime_cdi_spec names), then run this again",
        )
    if not spec.is_file():
        return decided(True, f"the CDI spec {spec} does not exist; the host runs driver {driver_version}")
    if stamp is None:
        why = stamp_problem or "no stamp records which driver it was generated for"
        return decided(
            True, f"the CDI spec {spec} was generated for an unknown driver ({why}); the host runs {driver_version}"
        )
    if stamp.driver_version != driver_version:
        return decided(
            True, f"the spec was generated for driver {stamp.driver_version}, the host now runs {driver_version}"
        )
    if Path(stamp.spec).absolute() != spec.absolute():
        return decided(
            True, f"the stamp records the spec {stamp.spec}, not {spec}: which driver {spec} is for is unknown"
        )
    found = files.sha256_file(spec, follow=True)
    if found != stamp.spec_sha256:
        return decided(
            True,
            f"the CDI spec {spec} changed after it was generated for driver {driver_version} "
            f"(sha256 {stamp.spec_sha256[:12]} recorded, {found[:12]} found): something else replaced it",
        )
    return decided(False, f"the spec was generated for driver {driver_version}, which the host runs")


def require_spec(spec: Path) -> Path:
    """The spec's path, when there is a spec file there to record."""
    spec = Path(spec)
    if not spec.is_file():
        found = _not_a_file(spec)
        what = f"is not a file but {found}" if found else "does not exist"
        raise SpecMissingError(
            f"the CDI spec {spec} {what}: there is nothing to record",
            hint=f"generate it first (nvidia-ctk cdi generate --output {spec}), then record it",
        )
    return spec


def record(spec: Path, state_dir: Path, driver_version: str, *, now: datetime | None = None) -> Stamp:
    """Record that the spec at `spec` was just generated for `driver_version` (atomically,
    in `<state_dir>/cdi.json`)."""
    spec = require_spec(spec)
    require_state_dir(state_dir)
    stamp = Stamp(
        driver_version=driver_version,
        spec=str(spec.absolute()),
        spec_sha256=files.sha256_file(spec, follow=True),
        recorded_at=(now or datetime.now(UTC)).isoformat(timespec="seconds"),
    )
    atomic.ensure_dir(Path(state_dir))
    atomic.write_json(stamp_path(state_dir), stamp.to_json())
    return stamp


# --------------------------------------------------------------------------- the running driver

_RESTART_HINT = (
    "check the driver with `nvidia-smi`; after a driver upgrade, reboot (or reload the nvidia kernel "
    "modules) so the kernel module matches the new libraries, then run this again"
)


def parse_driver_versions(text: str) -> dict[str, str]:
    """Parse the CSV of gpus.CAPABILITY_QUERY (header included): {bus id: driver version}."""
    lines = [line for line in text.splitlines() if line.strip()]
    if not lines:
        return {}
    header = [h.strip().split(" ")[0] for h in lines[0].split(",")]
    if "pci.bus_id" not in header or "driver_version" not in header:
        return {}
    bus, driver = header.index("pci.bus_id"), header.index("driver_version")
    found: dict[str, str] = {}
    for line in lines[1:]:
        cells = [c.strip() for c in line.split(",")]
        if len(cells) == len(header) and cells[driver][:1].isdigit():
            found[cells[bus].upper()] = cells[driver]
    return found


def single_driver(versions: dict[str, str]) -> str:
    """The one driver version every GPU reports; GPUs reporting different ones are an error."""
    if not versions:
        raise gpus.GpuQueryError("nvidia-smi reported no GPU with a driver version", hint=_RESTART_HINT)
    distinct = sorted(set(versions.values()))
    if len(distinct) > 1:
        each = ", ".join(f"{bus} {version}" for bus, version in sorted(versions.items()))
        raise CdiError(
            f"the GPUs report different driver versions ({each}): no one CDI spec fits them all",
            hint="finish the driver upgrade (reboot the host so every GPU runs the same driver), then run this again",
        )
    return distinct[0]


def driver_version(nvidia_smi: str, *, timeout: float = command.DEFAULT_TIMEOUT_S) -> str:
    """The driver version the host runs, from the `--query-gpu` query preflight uses.

    A driver too old for one of its fields (compute_cap) rejects the whole query; `nvidia-smi
    -q` then gives the driver version, as it does on every driver. An nvidia-smi that hangs or
    cannot be run is not asked twice."""
    try:
        return single_driver(
            parse_driver_versions(gpus.run_nvidia_smi(nvidia_smi, *gpus.CAPABILITY_QUERY, timeout=timeout))
        )
    except gpus.GpuQueryError as exc:
        if exc.reason in ("missing", "not executable", "timeout", "output"):  # asking again would not help
            raise gpus.GpuQueryError(
                f"cannot read the driver version: {exc.message}", hint=exc.hint or _RESTART_HINT
            ) from None
    try:
        return gpus.parse_query(gpus.run_nvidia_smi(nvidia_smi, "-q", timeout=timeout)).driver_version
    except gpus.GpuQueryError as exc:
        raise gpus.GpuQueryError(
            f"cannot read the driver version: {exc.message}", hint=exc.hint or _RESTART_HINT
        ) from None


# --------------------------------------------------------------------------- the host's stamp


def require_state_dir(state_dir: Path) -> Path:
    """`state_dir` when it is a directory or not there yet (created on record); else exit 2."""
    state_dir = Path(state_dir)
    parent = state_dir
    while not os.path.lexists(parent) and parent != parent.parent:
        parent = parent.parent
    if not parent.is_dir():
        raise InputFileError(
            f"state directory {state_dir}: {parent} is a file, not a directory; nothing was written",
            hint="pass --state-dir a directory (the host layout's state directory), or move that file away",
        )
    stamp = stamp_path(state_dir)
    found = _not_a_file(stamp) if os.path.lexists(stamp) else None
    if found:
        raise InputFileError(
            f"the CDI stamp {stamp}: expected a file specdeploy writes, found {found}; nothing was written",
            hint=f"remove {stamp}, then run this again",
        )
    return state_dir


def check(spec: Path, state_dir: Path, nvidia_smi: str, *, timeout: float = command.DEFAULT_TIMEOUT_S) -> CdiStatus:
    """`status` for this host: its stamp under `state_dir` and the driver nvidia-smi reports."""
    require_state_dir(state_dir)
    if _not_a_file(spec):
        status(spec, None, "unknown")  # refuses the spec before nvidia-smi runs
    running = driver_version(nvidia_smi, timeout=timeout)
    try:
        stamp, problem = read_stamp(stamp_path(state_dir)), None
    except CdiError as exc:
        stamp, problem = None, exc.message
    return status(spec, stamp, running, stamp_problem=problem)


def record_running(
    spec: Path, state_dir: Path, nvidia_smi: str, *, timeout: float = command.DEFAULT_TIMEOUT_S
) -> Stamp:
    """`record` for the driver nvidia-smi reports now (the spec and the state directory are
    checked first: refused before nvidia-smi runs)."""
    spec = require_spec(spec)
    require_state_dir(state_dir)
    return record(spec, state_dir, driver_version(nvidia_smi, timeout=timeout))


def keep_for_rollback(spec: Path, state_dir: Path, keeper: Keeper) -> list[str]:
    """Before `nvidia-ctk cdi generate` replaces the spec: the current spec and its stamp kept for
    the deploy run's rollback (`keeper`), which puts both back with the previous stack, so the
    engine it restarts reaches its GPUs through the spec it ran with. Returns the paths kept (a
    path that does not exist yet is kept as absent: the rollback removes what the run created)."""
    kept = []
    for path in (Path(spec), stamp_path(state_dir)):
        keeper.stage(path).commit()
        kept.append(str(path))
    return kept
