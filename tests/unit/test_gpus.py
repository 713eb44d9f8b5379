"""Parsing real nvidia-smi outputs recorded from public issue threads (no GPU here;
tests/data/nvidia-smi/SOURCES.md names each host and thread)."""

from __future__ import annotations

from pathlib import Path

import pytest

from specdeploy.host import gpus

DATA = Path(__file__).resolve().parents[1] / "data" / "nvidia-smi"


def test_four_a6000_host_counts_attached_gpus_and_reads_the_driver() -> None:
    inv = gpus.parse_query((DATA / "a6000-x4-r515" / "q.txt").read_text())
    assert (inv.driver_version, inv.cuda_version, inv.attached, inv.driver_branch) == ("515.65.01", "11.7", 4, 515)
    assert inv.gpus == [gpus.Gpu("00000000:17:00.0", "NVIDIA RTX A6000")]
    assert inv.gpus[0].compute_capability == 8.6


def test_single_a6000_and_an_old_consumer_gpu() -> None:
    one = gpus.parse_query((DATA / "a6000-x1-r515" / "q.txt").read_text())
    assert one.attached == 1 and one.gpus[0].bus_id == "00000000:41:00.0"
    old = gpus.parse_query((DATA / "gtx1060-r430" / "q.txt").read_text())
    assert (old.driver_version, old.attached, old.gpus[0].compute_capability) == ("430.64", 1, 6.1)


def test_r610_header_names_are_read_too() -> None:
    """Driver R610 renamed the header fields (sglang#27487, gkyle/startrails#18)."""
    text = "KMD Version : 610.43.02\nCUDA UMD Version : 13.3\n\nAttached GPUs : 0\n"
    inv = gpus.parse_query(text)
    assert (inv.driver_version, inv.cuda_version, inv.attached) == ("610.43.02", "13.3", 0)


def test_output_without_a_driver_is_refused_with_a_fix() -> None:
    with pytest.raises(gpus.GpuQueryError, match="no driver version") as info:
        gpus.parse_query("NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver.")
    assert "nvidia-smi" in (info.value.hint or "")


def test_topology_of_a_pcie_pair_and_an_nvlink_host() -> None:
    pair = gpus.parse_topology((DATA / "topo" / "pair-phb.txt").read_text())
    assert pair == {(0, 1): "PHB", (1, 0): "PHB"}
    assert gpus.without_nvlink(pair, 2) == [(0, 1, "PHB")]
    h100 = gpus.parse_topology((DATA / "topo" / "h100-x4-nv6.txt").read_text())
    assert h100[(2, 3)] == "NV6" and (0, 4) not in h100  # NIC columns are not GPUs
    assert gpus.without_nvlink(h100, 4) == []


def test_a_missing_nvidia_smi_names_the_driver_fix(tmp_path: Path) -> None:
    with pytest.raises(gpus.GpuQueryError, match="not found") as info:
        gpus.run_nvidia_smi(str(tmp_path / "nvidia-smi"), "-q")
    assert "driver" in (info.value.hint or "")


H200 = DATA / "h200-x2-r580"  # recorded by this project on a real 2x H200 host, driver 580.159.04


def test_the_r580_topology_is_read_through_its_ansi_underlined_header() -> None:
    """topo.txt was recorded on a real host: its header is `\\t\\x1b[4mGPU0\\tGPU1...\\x1b[0m`."""
    text = (H200 / "topo.txt").read_text()
    assert "\x1b[4m" in text
    assert gpus.parse_topology(text) == {(0, 1): "NV18", (1, 0): "NV18"}
    assert gpus.without_nvlink(gpus.parse_topology(text), 2) == []


def test_compute_capability_comes_from_the_driver_field_when_there_is_one() -> None:
    """csv.txt was recorded on a real host; a GPU the name table does not know still gets its
    capability, and the driver's figure wins over the table."""
    caps = gpus.parse_capabilities((H200 / "csv.txt").read_text())
    assert caps == {"00000000:00:06.0": 9.0, "00000000:00:07.0": 9.0}
    inventory = gpus.parse_query((H200 / "q.txt").read_text())
    gpus.with_capabilities(inventory, caps)
    assert [g.reported_capability for g in inventory.gpus] == [9.0, 9.0]
    unknown = gpus.Gpu("00000000:00:06.0", "NVIDIA Future GPU", 11.0)
    assert unknown.compute_capability == 11.0 and gpus.Gpu("x", "NVIDIA Future GPU").compute_capability is None
    assert gpus.parse_capabilities('Field "compute_cap" is not a valid field to query.') == {}
