"""What a host's GPUs are, read from `nvidia-smi -q`, `--query-gpu` and `topo -m`.

Parsers only: they take the text a real nvidia-smi printed (tests replay outputs recorded
on real hosts, tests/data/nvidia-smi). Driver R610+ renamed the header fields
("KMD Version", "CUDA UMD Version"); both spellings are read. A real R580 host underlines
`topo -m`'s header with ANSI escapes even into a pipe, which hid the whole matrix: escapes
are stripped first. The compute capability comes from the driver's own `compute_cap` field;
the product-name table below is only for drivers too old to report it.

Every parser takes whatever a program printed — an nvidia-smi that is a wrapper, a stand-in or
broken prints anything — and answers either with what it read or with a GpuQueryError naming
the field, what was expected and what was found (a count that is not a number ended in a
traceback; property tests feed them arbitrary text). nvidia-smi itself runs with a deadline
(host.command): one that hangs is reported after `timeout` seconds, never waited on forever.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from specdeploy.core.errors import SpecdeployError
from specdeploy.host import command

# Compute capability by product name (NVIDIA, "CUDA GPUs - Compute Capability",
# developer.nvidia.com/cuda-gpus). Matched as substrings, longest first.
COMPUTE_CAPABILITY = {
    "RTX A6000": 8.6,
    "RTX A5000": 8.6,
    "RTX A4000": 8.6,
    "A40": 8.6,
    "A10G": 8.6,
    "A10": 8.6,
    "RTX 3090": 8.6,
    "RTX 3080": 8.6,
    "A100": 8.0,
    "A30": 8.0,
    "RTX 6000 Ada": 8.9,
    "L40S": 8.9,
    "L40": 8.9,
    "L4": 8.9,
    "RTX 4090": 8.9,
    "H100": 9.0,
    "H200": 9.0,
    "B200": 10.0,
    "RTX 5090": 12.0,
    "RTX PRO 6000": 12.0,
    "V100": 7.0,
    "T4": 7.5,
    "Quadro RTX": 7.5,
    "GTX 1660": 7.5,
    "GTX 1080": 6.1,
    "GTX 1060": 6.1,
}


class GpuQueryError(SpecdeployError):
    """nvidia-smi is missing, cannot be run, hangs, or printed something preflight cannot read.
    `reason`: "missing", "not executable", "timeout" or "output" (host.command), "failed" (a
    non-zero exit), "unreadable" (printed something the parser cannot read)."""

    reason = "unreadable"


_DRIVER_HINT = "check the NVIDIA driver with `nvidia-smi`; reinstall it if that fails"


@dataclass(frozen=True)
class Gpu:
    bus_id: str
    name: str
    reported_capability: float | None = None  # the driver's compute_cap, when it has the field

    @property
    def compute_capability(self) -> float | None:
        if self.reported_capability is not None:
            return self.reported_capability
        for model in sorted(COMPUTE_CAPABILITY, key=len, reverse=True):
            if model in self.name:
                return COMPUTE_CAPABILITY[model]
        return None


@dataclass
class GpuInventory:
    driver_version: str
    cuda_version: str | None
    attached: int
    gpus: list[Gpu] = field(default_factory=list)

    @property
    def driver_branch(self) -> int:
        return int(self.driver_version.split(".")[0])


_FIELD = re.compile(r"^(\s*)([^:]+?)\s*:\s*(.*?)\s*$")


def parse_query(text: str) -> GpuInventory:
    """Parse `nvidia-smi -q`. The GPU count is the "Attached GPUs" line (authoritative even
    when only some GPU blocks are shown)."""
    top: dict[str, str] = {}
    gpus: list[Gpu] = []
    bus: str | None = None
    for line in text.splitlines():
        block = re.match(r"^GPU\s+([0-9A-Fa-f]{4,8}:[0-9A-Fa-f]{2}:[0-9A-Fa-f]{2}\.\d)\s*$", line)
        if block:
            bus = block.group(1)
            continue
        match = _FIELD.match(line)
        if not match:
            continue
        indent, key, value = match.groups()
        if not indent:
            top[key] = value
        elif bus is not None and key == "Product Name":
            gpus.append(Gpu(bus, value))
    if not text.strip():
        raise GpuQueryError(
            "nvidia-smi -q printed nothing: expected the driver version and the GPUs", hint=_DRIVER_HINT
        )
    driver = top.get("Driver Version") or top.get("KMD Version")
    if not driver or not re.match(r"^[0-9]+\.", driver):
        found = f"found {driver!r}" if driver else "found none"
        raise GpuQueryError(
            f"nvidia-smi -q printed no driver version (field Driver Version: expected a version like 580.82.07, "
            f"{found})",
            hint=_DRIVER_HINT,
        )
    cuda = top.get("CUDA Version") or top.get("CUDA UMD Version")
    count = top.get("Attached GPUs")
    if count is None:
        attached = len(gpus)
    elif re.fullmatch(r"[0-9]{1,4}", count):
        attached = int(count)
    else:
        raise GpuQueryError(
            f"nvidia-smi -q: field Attached GPUs: expected a number, found {count[:80]!r}; the GPUs cannot be counted",
            hint=f"{_DRIVER_HINT}; check that --nvidia-smi names the real nvidia-smi, not a wrapper",
        )
    return GpuInventory(driver, None if cuda in (None, "N/A", "Not Found") else cuda, attached, gpus)


# The query a real R580 host answered (tests/data/nvidia-smi/h200-x2-r580/csv.txt), read by header.
CAPABILITY_QUERY = ("--query-gpu=name,compute_cap,driver_version,pci.bus_id,memory.total", "--format=csv")
_ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")


def parse_capabilities(text: str) -> dict[str, float]:
    """Parse the CSV of CAPABILITY_QUERY (header included): {bus id: compute capability}."""
    lines = [line for line in text.splitlines() if line.strip()]
    if not lines:
        return {}
    header = [h.strip().split(" ")[0] for h in lines[0].split(",")]
    if "pci.bus_id" not in header or "compute_cap" not in header:
        return {}
    bus, cap = header.index("pci.bus_id"), header.index("compute_cap")
    found: dict[str, float] = {}
    for line in lines[1:]:
        cells = [c.strip() for c in line.split(",")]
        if len(cells) == len(header) and re.fullmatch(r"\d+\.\d+", cells[cap]):
            found[cells[bus].upper()] = float(cells[cap])
    return found


def with_capabilities(inventory: GpuInventory, capabilities: dict[str, float]) -> GpuInventory:
    """The inventory with each GPU's driver-reported compute capability."""
    inventory.gpus = [
        Gpu(g.bus_id, g.name, capabilities.get(g.bus_id.upper(), g.reported_capability)) for g in inventory.gpus
    ]
    return inventory


def parse_topology(text: str) -> dict[tuple[int, int], str]:
    """Parse the GPU-to-GPU part of `nvidia-smi topo -m`: {(i, j): "NV6" | "PHB" | ...}."""
    lines = [ln for ln in _ANSI.sub("", text).splitlines() if ln.strip()]
    header = next((ln for ln in lines if re.match(r"^\s+GPU0\b", ln)), None)
    if header is None:
        raise GpuQueryError("nvidia-smi topo -m printed no GPU matrix")
    columns = [c for c in re.split(r"\s+", header.strip()) if re.fullmatch(r"GPU\d+", c)]
    links: dict[tuple[int, int], str] = {}
    for line in lines:
        row = re.match(r"^GPU(\d+)\s+(.*)$", line)
        if not row:
            continue
        i = int(row.group(1))
        cells = re.split(r"\s+", row.group(2).strip())
        for col, cell in zip(columns, cells, strict=False):
            j = int(col[3:])
            if i != j:
                links[(i, j)] = cell
    return links


def without_nvlink(links: dict[tuple[int, int], str], count: int) -> list[tuple[int, int, str]]:
    """GPU pairs among the first `count` that talk over PCIe rather than NVLink."""
    return [
        (i, j, links[(i, j)])
        for i in range(count)
        for j in range(i + 1, count)
        if (i, j) in links and not links[(i, j)].startswith("NV")
    ]


def run_nvidia_smi(binary: str, *args: str, timeout: float = command.DEFAULT_TIMEOUT_S) -> str:
    """Run nvidia-smi for at most `timeout` seconds; a missing binary, one that cannot be run,
    hangs or fails is a GpuQueryError naming the fix."""
    try:
        done = command.run([binary, *args], timeout=timeout)
    except command.ProgramRunError as exc:
        hints = {
            "missing": "install the NVIDIA driver (R535 or newer for CUDA 12 images) and reboot",
            "not executable": f"pass --nvidia-smi the path of the driver's nvidia-smi (chmod +x {binary} if it is)",
            "timeout": "the driver does not answer: check `dmesg` for Xid errors and `nvidia-smi` by hand; a hung "
            "driver needs a reboot (or pass a longer --timeout)",
            "output": "check that --nvidia-smi names the real nvidia-smi",
        }
        message = f"{binary} not found: no NVIDIA driver on this host" if exc.reason == "missing" else exc.message
        error = GpuQueryError(message, hint=hints.get(exc.reason))
        error.reason = exc.reason
        raise error from None
    if done.returncode != 0:
        error = GpuQueryError(
            f"{binary} {' '.join(args)} failed (exit {done.returncode}): {done.stderr.strip()[:200]}",
            hint="check the NVIDIA driver with `nvidia-smi`; after a driver upgrade, reboot (or reload the nvidia "
            "kernel modules) so the kernel module matches the libraries; reinstall the driver if that fails",
        )
        error.reason = "failed"
        raise error
    return done.stdout
