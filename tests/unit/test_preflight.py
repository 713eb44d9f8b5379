"""Preflight checks on this machine's real disk, sockets and processes; GPUs from recorded
real nvidia-smi outputs replayed by the stand-in binary (tests/data/nvidia-smi)."""

from __future__ import annotations

import json
import os
import shutil
import socket
from pathlib import Path

import pytest

from specdeploy.host import gpus, preflight
from specdeploy.profile import load_profile
from specdeploy.rehearsal import variants

DATA = Path(__file__).resolve().parents[1] / "data" / "nvidia-smi"


def _stand_in(tmp_path: Path, record: str, topo: str | None = None) -> str:
    directory = tmp_path / record
    directory.mkdir(parents=True)
    for recorded in (DATA / record).glob("*.txt"):  # q.txt, and topo.txt / csv.txt where recorded
        shutil.copy(recorded, directory / recorded.name)
    if topo:
        shutil.copy(DATA / "topo" / topo, directory / "topo.txt")
    shutil.copy(DATA / "stand-in.sh", directory / "nvidia-smi")
    return str(directory / "nvidia-smi")


def _levels(report: preflight.Report) -> dict[str, str]:
    return {c.name: c.level.value for c in report.checks}


def test_a6000_host_on_an_old_driver_is_refused_for_the_driver_only(tmp_path: Path) -> None:
    smi = _stand_in(tmp_path, "a6000-x4-r515", topo="pair-phb.txt")
    checks = preflight.gpu_checks(load_profile("a6000-dflash"), preflight.Options(nvidia_smi=smi))
    by_name = {c.name: c for c in checks}
    assert by_name["gpu count"].level == "ok" and by_name["compute capability"].level == "ok"
    driver = by_name["driver"]
    assert driver.level == "fail" and "515.65.01" in driver.found and "R535" in driver.expected
    assert "upgrade the NVIDIA driver to R535" in driver.fix
    nvlink = by_name["nvlink"]
    assert nvlink.level == "warn" and "PHB" in nvlink.found and "#41190" in nvlink.fix
    assert "already disables the custom all-reduce" in nvlink.fix


def test_a_single_gpu_is_refused_for_tensor_parallel_two(tmp_path: Path) -> None:
    smi = _stand_in(tmp_path, "a6000-x1-r515")
    count = preflight.gpu_checks(load_profile("a6000-mtp"), preflight.Options(nvidia_smi=smi))[0]
    assert count.level == "fail" and count.found.startswith("1 GPU(s)") and "tensor_parallel_size" in count.fix


def test_compute_capability_below_the_profile_or_not_built_for(tmp_path: Path) -> None:
    smi = _stand_in(tmp_path, "gtx1060-r430")
    checks = preflight.gpu_checks(load_profile("a6000-dflash"), preflight.Options(nvidia_smi=smi))
    cap = next(c for c in checks if c.name == "compute capability")
    assert cap.level == "fail" and "6.1" in cap.found and "TORCH_CUDA_ARCH_LIST" in cap.fix
    # sm_86 cubins run on 8.6 and 8.9 (same major, newer minor), not on 8.0 or 9.0
    assert preflight._arch_ok(8.9, "8.6") and not preflight._arch_ok(8.0, "8.6") and not preflight._arch_ok(9.0, "8.6")


def test_nvlink_verdict_on_nvlink_and_without_the_all_reduce_setting() -> None:
    h100 = gpus.parse_topology((DATA / "topo" / "h100-x4-nv6.txt").read_text())
    assert preflight.nvlink_verdict(h100, 2, True).level == "ok"
    pair = gpus.parse_topology((DATA / "topo" / "pair-phb.txt").read_text())
    warn = preflight.nvlink_verdict(pair, 2, None)
    assert warn.level == "warn" and "set engine.serve.disable_custom_all_reduce: true" in warn.fix


def test_a_host_without_nvidia_smi_fails_naming_the_driver(tmp_path: Path) -> None:
    checks = preflight.gpu_checks(load_profile("a6000-dflash"), preflight.Options(nvidia_smi=str(tmp_path / "none")))
    assert [c.level.value for c in checks] == ["fail"] and "driver" in checks[0].fix


def test_cpu_profile_skips_gpus() -> None:
    assert _levels(preflight.Report("x", preflight.gpu_checks(load_profile("cpu-rehearsal"), preflight.Options()))) == {
        "gpus": "skip"
    }


def test_port_held_by_another_process_names_it() -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        port = sock.getsockname()[1]
        profile = variants.on_port(load_profile("cpu-rehearsal"), "cpu-rehearsal-port", port)
        check = preflight.port_check(profile, preflight.Options())
    assert check.level == "fail" and f"pid {os.getpid()}" in check.found and "engine.serve.port" in check.fix
    assert preflight.port_check(profile, preflight.Options()).level == "ok"  # closed again


def test_disk_counts_only_verified_bytes_of_the_pinned_revisions_as_already_there(tmp_path: Path) -> None:
    """Issue 35: a partial download and an old revision were counted as weights already there, so a host
    short of disk passed preflight. Only files the hash cache verified at the pinned revision count."""
    import json

    from specdeploy.core import hashcache

    sha = "a" * 40
    profile = variants.derive(
        load_profile("a6000-mtp"), "mtp-pinned", {"target": {"revision": {"value": sha, "provenance": "reported",
                                                                         "source": "test"}}}
    )  # fmt: skip
    models = tmp_path / "models"
    pinned = models / profile.target.repo / sha
    pinned.mkdir(parents=True)
    verified, partial = pinned / "w-00001.safetensors", pinned / ".cache" / "huggingface" / "download" / "x.incomplete"
    verified.write_bytes(b"\0" * 3 * 1024 * 1024)
    partial.parent.mkdir(parents=True)
    partial.write_bytes(b"\0" * 5 * 1024 * 1024)
    old = models / profile.target.repo / ("b" * 40)
    old.mkdir()
    (old / "w.safetensors").write_bytes(b"\0" * 7 * 1024 * 1024)
    st = verified.stat()
    entry = {"size": st.st_size, "mtime_ns": st.st_mtime_ns, "sha256": "0" * 64, "revision": sha}
    (pinned / hashcache.STATE_DIR).mkdir()
    (pinned / hashcache.STATE_DIR / hashcache.STATE_FILE).write_text(
        json.dumps({"w-00001.safetensors": entry, "../../../../../etc/passwd": entry, "gone.bin": entry})
    )
    assert hashcache.verified_bytes(pinned, sha) == 3 * 1024 * 1024  # neither the partial, the old nor a hostile name
    check = preflight.disk_check(profile, preflight.Options(models_dir=models))
    assert "(0.0 GiB of the pinned revisions already verified there)" in check.found, check.found


def test_disk_counts_weights_already_present(tmp_path: Path) -> None:
    models = tmp_path / "models"
    (models / "org" / "m").mkdir(parents=True)
    (models / "org" / "m" / "w.bin").write_bytes(b"\0" * 4096)
    ok = preflight.disk_check(load_profile("cpu-rehearsal"), preflight.Options(models_dir=models))
    assert ok.level == "ok" and "GiB free on" in ok.found
    huge = load_profile("a6000-dflash")
    assert huge.host is not None
    free = shutil.disk_usage(tmp_path).free / preflight.GIB
    disk = huge.host.disk.model_copy(update={"weights_gib": free + 100})
    huge = huge.model_copy(update={"host": huge.host.model_copy(update={"disk": disk})})
    refused = preflight.disk_check(huge, preflight.Options(models_dir=models))
    assert refused.level == "fail" and "free" in refused.fix


@pytest.mark.parametrize(("version", "level"), [("podman version 4.3.1", "fail"), ("podman version 5.4.2", "ok")])
def test_podman_version(tmp_path: Path, version: str, level: str) -> None:
    fake = tmp_path / "podman"
    fake.write_text(f"#!/bin/sh\necho '{version}'\n")
    fake.chmod(0o755)
    check = preflight.podman_check(load_profile("a6000-mtp"), preflight.Options(podman=str(fake)))
    assert check.level == level and check.found == version


@pytest.mark.parametrize(
    ("candidate", "level", "fix"),
    [
        ("5.4.2+ds1-2", "ok", ""),  # trixie: gpu_runtime will install a podman new enough
        ("4.3.1+ds1-8+deb12u1", "fail", "Debian trixie"),  # bookworm: it would install one too old
        ("(none)", "fail", "Debian trixie"),
    ],
)
def test_an_absent_podman_is_judged_by_what_gpu_runtime_will_install(
    tmp_path: Path, candidate: str, level: str, fix: str
) -> None:
    """GPU-host blocker 7: preflight runs before gpu_runtime installs podman, and refused every
    fresh GPU host for "podman not installed". apt's candidate decides instead (apt-cache stand-in
    printing what `apt-cache policy podman` prints)."""
    apt = tmp_path / "apt-cache"
    apt.write_text(f"#!/bin/sh\necho 'podman:'\necho '  Installed: (none)'\necho '  Candidate: {candidate}'\n")
    apt.chmod(0o755)
    options = preflight.Options(podman=str(tmp_path / "no-podman"), apt_cache=str(apt))
    check = preflight.podman_check(load_profile("a6000-mtp"), options)
    assert check.level == level and check.fix.startswith("use a distribution") == bool(fix)
    if candidate != "(none)":
        assert f"gpu_runtime installs podman {candidate}" in check.found


def test_gated_drafter_needs_a_token_unless_weights_come_from_an_archive() -> None:
    profile = load_profile("a6000-dflash")
    missing = preflight.token_check(profile, preflight.Options())
    assert missing.level == "fail" and "huggingface.co/z-lab/Qwen3.6-27B-DFlash" in missing.fix
    assert "ansible-vault" in missing.fix
    assert preflight.token_check(profile, preflight.Options(token_present=True)).level == "ok"
    assert preflight.token_check(profile, preflight.Options(weights_source="archive")).level == "skip"


def test_the_recorded_r580_host_reads_nv18_and_compute_capability_9_from_the_driver(tmp_path: Path) -> None:
    """Recorded on a real 2x H200 host, driver 580.159.04 (tests/data/nvidia-smi/h200-x2-r580):
    `topo -m` underlines its header with ANSI escapes, which once read as "topology
    unreadable"; the capability comes from the driver's compute_cap field, not the name table."""
    smi = _stand_in(tmp_path, "h200-x2-r580")
    checks = {c.name: c for c in preflight.gpu_checks(load_profile("a6000-mtp"), preflight.Options(nvidia_smi=smi))}
    assert checks["nvlink"].level == "ok" and "NV18" in checks["nvlink"].found
    assert "compute capability 9.0 (reported by the driver)" in checks["compute capability"].found
    # a record without the csv answers as a driver without the field: the name table decides
    old = _stand_in(tmp_path / "old", "a6000-x4-r515")
    rows = [c for c in preflight.gpu_checks(load_profile("a6000-mtp"), preflight.Options(nvidia_smi=old))]
    capability = next(c for c in rows if c.name == "compute capability")
    assert "compute capability 8.6 (by product name)" in capability.found


def _podman_with_labels(tmp_path: Path, labels: str) -> str:
    """A stand-in podman answering `image inspect --format '{{json .Labels}}'` with `labels`."""
    fake = tmp_path / "podman-labels"
    fake.write_text(f"#!/bin/sh\ncat <<'JSON'\n{labels}\nJSON\n")
    fake.chmod(0o755)
    return str(fake)


def test_preflight_refuses_an_image_whose_cuda_the_recorded_driver_cannot_run(tmp_path: Path) -> None:
    """Recorded real outputs (tests/data/nvidia-smi): the A6000 host on driver 515.65.01 reports
    "CUDA Version: 11.7"; the image labelled io.specdeploy.cuda=13.0 needs R580, and the fix names
    the driver and the profile's cu129 image."""
    smi = _stand_in(tmp_path, "a6000-x4-r515", topo="pair-phb.txt")
    podman = _podman_with_labels(tmp_path, '{"io.specdeploy.cuda": "13.0"}')
    options = preflight.Options(nvidia_smi=smi, podman=podman, image="localhost/specdeploy/vllm-pr40898:x")
    driver = next(c for c in preflight.gpu_checks(load_profile("a6000-dflash"), options) if c.name == "driver")
    assert driver.level == "fail" and "CUDA 11.7" in driver.found
    assert (
        driver.expected == "CUDA 13.0 (label io.specdeploy.cuda of localhost/specdeploy/vllm-pr40898:x): driver R580+"
    )
    assert driver.fix.startswith("upgrade the NVIDIA driver to R580+") and "use the profile's cu129 image" in driver.fix


def test_the_recorded_r580_host_runs_a_cuda_13_image_and_the_profiles_cuda_129(tmp_path: Path) -> None:
    """Recorded on a real 2x H200 host, driver 580.159.04, "CUDA Version: 13.0"."""
    smi = _stand_in(tmp_path, "h200-x2-r580")
    podman = _podman_with_labels(tmp_path, '{"io.specdeploy.cuda": "13.0", "io.specdeploy.profile": "a6000-mtp"}')
    labelled = preflight.Options(nvidia_smi=smi, podman=podman, image="img")
    checks = {c.name: c for c in preflight.gpu_checks(load_profile("a6000-mtp"), labelled)}
    assert checks["driver"].level == "ok" and "CUDA 13.0 (label" in checks["driver"].expected
    plain = {c.name: c for c in preflight.gpu_checks(load_profile("a6000-mtp"), preflight.Options(nvidia_smi=smi))}
    assert plain["driver"].level == "ok" and plain["driver"].expected.startswith("CUDA 12.9 (the profile's base")


def test_an_image_absent_from_the_host_is_judged_by_the_profiles_cuda(tmp_path: Path) -> None:
    smi = _stand_in(tmp_path, "a6000-x1-r515")
    absent = tmp_path / "podman-absent"
    absent.write_text("#!/bin/sh\necho 'Error: no such image' >&2\nexit 125\n")
    absent.chmod(0o755)
    options = preflight.Options(nvidia_smi=smi, podman=str(absent), image="not-here")
    driver = next(c for c in preflight.gpu_checks(load_profile("a6000-dflash"), options) if c.name == "driver")
    assert driver.level == "fail" and "not-here not on this host" in driver.expected and "CUDA 12.9" in driver.expected
    assert driver.fix.startswith("upgrade the NVIDIA driver to R535+")


def test_a_newer_minor_than_the_driver_reports_is_a_warning_naming_minor_version_compatibility() -> None:
    inventory = gpus.GpuInventory("550.127.05", "12.4", 2, [])
    check = preflight._driver_check(load_profile("a6000-dflash"), inventory)
    assert check.level == "warn" and "minor version compatibility" in check.fix


def test_the_report_is_kept_where_asked_whatever_the_verdict(cli, tmp_path: Path) -> None:
    """`--report FILE` (the role's, for `migrate plan`): the same JSON as stdout, written atomically,
    for a failing host too — here a port held by this process."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        port = sock.getsockname()[1]
        profile = variants.materialize(
            variants.on_port(load_profile("cpu-rehearsal"), "cpu-rehearsal-port", port), tmp_path / "profiles"
        )
        kept = tmp_path / "state" / "preflight.json"
        kept.parent.mkdir()
        args = ["preflight", "--profile", str(profile), "--weights-source", "present", "--json"]
        result = cli(*args, "--models-dir", str(tmp_path / "models"), "--report", str(kept))
    assert result.exit_code == 1, result.output
    report = json.loads(kept.read_text())
    assert report == json.loads(result.stdout)
    assert {c["name"]: c["level"] for c in report["checks"]}["port"] == "fail"
    assert [p.name for p in kept.parent.iterdir()] == ["preflight.json"]  # no temporary file left


def test_a_host_without_the_system_bus_is_warned_that_the_light_gate_cannot_read_the_unit_s_restarts(
    tmp_path: Path,
) -> None:
    """The light gate's account asks systemd over D-Bus (issue 35): a host without its socket gets a
    warning naming the fix; a real listening socket passes."""
    profile = load_profile("cpu-rehearsal")
    missing = preflight.system_bus_check(profile, preflight.Options(system_bus=tmp_path / "system_bus_socket"))
    assert (missing.level, missing.name) == ("warn", "system bus") and "apt-get install dbus" in missing.fix
    with socket.socket(socket.AF_UNIX) as bus:
        bus.bind(str(tmp_path / "system_bus_socket"))
        found = preflight.system_bus_check(profile, preflight.Options(system_bus=tmp_path / "system_bus_socket"))
    assert found.level == "ok"
