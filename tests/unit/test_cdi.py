"""When the CDI spec must be (re)generated (GPU-host blocker 11 of issue 18): after a driver
upgrade the spec still named the old driver's library files and nothing regenerated it.

The running driver comes from nvidia-smi outputs recorded on real hosts, replayed by the
stand-in binary (tests/data/nvidia-smi/SOURCES.md names each host): the 2x H200 host on
driver 580.159.04 recorded by this project, and a 1x RTX A6000 host on driver 515.48.07
posted in a public issue thread. The spec is a file of this test's; nvidia-ctk is not run.
"""

from __future__ import annotations

import json
import os
import shutil
from datetime import UTC, datetime
from pathlib import Path

import pytest
from click.testing import Result
from typer.testing import CliRunner

from specdeploy.cli import app
from specdeploy.core import files
from specdeploy.host import cdi, gpus

DATA = Path(__file__).resolve().parents[1] / "data" / "nvidia-smi"
H200_DRIVER = "580.159.04"  # h200-x2-r580: recorded by this project on a real 2x H200 host
A6000_DRIVER = "515.48.07"  # a6000-x1-r515: a real host's `nvidia-smi -q`, from NVIDIA/k8s-device-plugin#324

SPEC_TEXT = (  # the shape nvidia-ctk writes; what matters here is that it names the driver's files
    "cdiVersion: 0.5.0\nkind: nvidia.com/gpu\ndevices:\n- name: all\ncontainerEdits:\n  mounts:\n"
    f"  - hostPath: /usr/lib/x86_64-linux-gnu/libcuda.so.{H200_DRIVER}\n"
)


def _stand_in(tmp_path: Path, record: str) -> str:
    """An `nvidia-smi` replaying the recorded real host `record` (as test_preflight does)."""
    directory = tmp_path / "smi" / record
    directory.mkdir(parents=True)
    for recorded in (DATA / record).glob("*.txt"):  # q.txt, and csv.txt where recorded
        shutil.copy(recorded, directory / recorded.name)
    shutil.copy(DATA / "stand-in.sh", directory / "nvidia-smi")
    return str(directory / "nvidia-smi")


def _spec(tmp_path: Path, text: str = SPEC_TEXT) -> Path:
    spec = tmp_path / "etc" / "cdi" / "nvidia.yaml"
    spec.parent.mkdir(parents=True, exist_ok=True)
    spec.write_text(text)
    return spec


def _cli(*args: object) -> Result:
    return CliRunner().invoke(app, [str(a) for a in args])


def test_the_h200_hosts_query_reports_the_driver_of_each_gpu() -> None:
    """The real H200 host's answer to the `--query-gpu` query preflight uses, read by header."""
    assert cdi.parse_driver_versions((DATA / "h200-x2-r580" / "csv.txt").read_text()) == {
        "00000000:00:06.0": H200_DRIVER,
        "00000000:00:07.0": H200_DRIVER,
    }


def test_the_stand_ins_report_the_recorded_hosts_drivers(tmp_path: Path) -> None:
    """Both drivers as the real hosts reported them, through the stand-in nvidia-smi: the H200
    host (R580) from the query; the A6000 host (R515) was recorded without it (the stand-in
    rejects it as a driver without compute_cap does), so from `nvidia-smi -q`."""
    assert cdi.driver_version(_stand_in(tmp_path, "h200-x2-r580")) == H200_DRIVER
    assert cdi.driver_version(_stand_in(tmp_path, "a6000-x1-r515")) == A6000_DRIVER


def test_a_missing_spec_is_regenerated(tmp_path: Path) -> None:
    """No spec at all (a fresh host, or someone deleted it): generate it, whatever the stamp says."""
    spec = _spec(tmp_path)
    stamp = cdi.record(spec, tmp_path / "state", H200_DRIVER)
    spec.unlink()
    decision = cdi.status(spec, stamp, H200_DRIVER)
    assert decision.regenerate and "does not exist" in decision.reason and str(spec) in decision.reason


def test_a_spec_without_a_stamp_is_regenerated_once(tmp_path: Path) -> None:
    """A spec generated before stamps existed (or by hand): the driver it is for is unknown, so it
    is regenerated once, on the real H200 host's driver; recording it then settles the matter."""
    spec, state = _spec(tmp_path), tmp_path / "state"
    smi = _stand_in(tmp_path, "h200-x2-r580")
    decision = cdi.check(spec, state, smi)
    assert decision.regenerate and decision.recorded_driver_version is None
    assert "unknown driver" in decision.reason and H200_DRIVER in decision.reason
    cdi.record_running(spec, state, smi)
    assert not cdi.check(spec, state, smi).regenerate


def test_a_stamp_recorded_for_another_driver_is_regenerated_naming_both_versions(tmp_path: Path) -> None:
    """The field failure: the spec was generated on the real A6000 host's R515 driver, the host
    now runs the real H200 host's R580 driver (an upgrade). The reason names both."""
    spec, state = _spec(tmp_path), tmp_path / "state"
    cdi.record_running(spec, state, _stand_in(tmp_path, "a6000-x1-r515"))
    decision = cdi.check(spec, state, _stand_in(tmp_path, "h200-x2-r580"))
    assert decision.regenerate
    assert (decision.recorded_driver_version, decision.driver_version) == (A6000_DRIVER, H200_DRIVER)
    assert decision.reason == f"the spec was generated for driver {A6000_DRIVER}, the host now runs {H200_DRIVER}"


def test_a_matching_stamp_and_an_unchanged_spec_are_not_regenerated(tmp_path: Path) -> None:
    """Recorded for the driver the real H200 host runs, spec untouched since: nothing to do."""
    spec, state = _spec(tmp_path), tmp_path / "state"
    smi = _stand_in(tmp_path, "h200-x2-r580")
    cdi.record_running(spec, state, smi)
    decision = cdi.check(spec, state, smi)
    assert not decision.regenerate
    assert (decision.recorded_driver_version, decision.driver_version) == (H200_DRIVER, H200_DRIVER)
    assert H200_DRIVER in decision.reason


def test_a_spec_changed_after_recording_is_regenerated(tmp_path: Path) -> None:
    """Someone else replaced the spec after it was recorded (same driver): its sha256 no longer
    matches the stamp's, so it is regenerated to be sure."""
    spec, state = _spec(tmp_path), tmp_path / "state"
    smi = _stand_in(tmp_path, "h200-x2-r580")
    recorded = cdi.record_running(spec, state, smi)
    spec.write_text(SPEC_TEXT.replace(H200_DRIVER, "570.86.15"))
    decision = cdi.check(spec, state, smi)
    assert decision.regenerate and "changed after it was generated" in decision.reason
    assert recorded.spec_sha256[:12] in decision.reason


def test_the_stamp_lives_in_the_state_directory_and_is_written_whole(tmp_path: Path) -> None:
    """Never under /etc/cdi (podman reads every *.yaml/*.json there as a spec): <state>/cdi.json,
    with the driver, the spec, its sha256 and when; nothing else is left in either directory."""
    spec, state = _spec(tmp_path), tmp_path / "state"
    when = datetime(2026, 11, 30, 20, 5, 4, tzinfo=UTC)
    cdi.record(spec, state, H200_DRIVER, now=when)
    assert os.listdir(spec.parent) == ["nvidia.yaml"] and os.listdir(state) == ["cdi.json"]
    assert json.loads((state / "cdi.json").read_text()) == {
        "driver_version": H200_DRIVER,
        "spec": str(spec),
        "spec_sha256": files.sha256_file(spec),
        "recorded_at": "2026-11-30T20:05:04+00:00",
    }


def test_an_unreadable_stamp_regenerates_once_naming_it(tmp_path: Path) -> None:
    """A stamp cut short (a full disk before atomic writes, a hand edit) is an unknown driver."""
    spec, state = _spec(tmp_path), tmp_path / "state"
    state.mkdir()
    (state / "cdi.json").write_text('{"driver_version": "580.')
    decision = cdi.check(spec, state, _stand_in(tmp_path, "h200-x2-r580"))
    assert decision.regenerate and "cdi.json is unreadable" in decision.reason


def test_gpus_reporting_different_drivers_are_an_error_with_a_hint() -> None:
    """The real H200 host's query output with its second GPU's driver changed (the one edit):
    no one CDI spec fits two drivers."""
    text = (DATA / "h200-x2-r580" / "csv.txt").read_text()
    first, second, third = text.splitlines()
    mixed = "\n".join([first, second, third.replace(H200_DRIVER, "570.86.15")])
    with pytest.raises(cdi.CdiError, match="different driver versions") as info:
        cdi.single_driver(cdi.parse_driver_versions(mixed))
    assert "reboot" in (info.value.hint or "")


def test_record_then_status_round_trip_through_the_cli(tmp_path: Path) -> None:
    """The role's sequence on the real H200 host's driver: status says regenerate (no stamp),
    record after generation, then status says the spec fits; the table names the decision."""
    spec, state = _spec(tmp_path), tmp_path / "state"
    smi = _stand_in(tmp_path, "h200-x2-r580")
    options = ("--spec", spec, "--state-dir", state, "--nvidia-smi", smi)
    before = _cli("cdi", "status", *options, "--json")
    assert before.exit_code == 0, before.stderr
    assert json.loads(before.stdout)["regenerate"] is True
    recorded = _cli("cdi", "record", *options, "--json")
    assert recorded.exit_code == 0, recorded.stderr
    assert json.loads(recorded.stdout)["driver_version"] == H200_DRIVER
    assert json.loads(recorded.stdout)["stamp"] == str(state / "cdi.json")
    after = _cli("cdi", "status", *options, "--json")
    data = json.loads(after.stdout)
    assert after.exit_code == 0 and data["regenerate"] is False
    assert (data["driver_version"], data["recorded_driver_version"]) == (H200_DRIVER, H200_DRIVER)
    table = _cli("cdi", "status", *options)
    assert table.exit_code == 0 and "regenerate" in table.stdout and H200_DRIVER in table.stdout


def test_record_refuses_a_missing_spec_with_a_clear_message(tmp_path: Path) -> None:
    """Recording a spec that was not generated would stamp nothing: exit 2 (an input file that
    does not exist), the spec and the fix named, no traceback, no stamp written."""
    spec, state = tmp_path / "etc" / "cdi" / "nvidia.yaml", tmp_path / "state"
    smi = _stand_in(tmp_path, "h200-x2-r580")
    result = _cli("cdi", "record", "--spec", spec, "--state-dir", state, "--nvidia-smi", smi)
    assert result.exit_code == 2, result.stderr
    assert result.stderr.startswith(f"error: the CDI spec {spec} does not exist: there is nothing to record")
    assert "fix: generate it first (nvidia-ctk cdi generate" in result.stderr
    assert "Traceback" not in result.stderr and not (state / "cdi.json").exists()


def test_a_missing_nvidia_smi_is_a_clear_error(tmp_path: Path) -> None:
    """A host without the driver's nvidia-smi: exit 1, the driver fix named, no traceback."""
    result = _cli("cdi", "status", "--spec", _spec(tmp_path), "--state-dir", tmp_path / "state",
                  "--nvidia-smi", tmp_path / "none")  # fmt: skip
    assert result.exit_code == 1
    assert "error: cannot read the driver version:" in result.stderr and "not found" in result.stderr
    assert "fix: install the NVIDIA driver" in result.stderr and "Traceback" not in result.stderr


def test_a_failing_nvidia_smi_is_a_clear_error(tmp_path: Path) -> None:
    """Right after a driver upgrade without a reboot nvidia-smi fails ("Driver/library version
    mismatch", written here, not recorded): exit 1, its message and the reboot fix, no traceback."""
    smi = tmp_path / "nvidia-smi"
    smi.write_text("#!/bin/sh\necho 'Failed to initialize NVML: Driver/library version mismatch' >&2\nexit 18\n")
    smi.chmod(0o755)
    result = _cli("cdi", "status", "--spec", _spec(tmp_path), "--state-dir", tmp_path / "state", "--nvidia-smi", smi)
    assert result.exit_code == 1
    assert "Driver/library version mismatch" in result.stderr and "(exit 18)" in result.stderr
    assert "fix:" in result.stderr and "reboot" in result.stderr and "Traceback" not in result.stderr
    with pytest.raises(gpus.GpuQueryError):
        cdi.driver_version(str(smi))


def test_the_gpu_runtime_role_regenerates_the_spec_after_a_driver_upgrade_and_only_then(tmp_path: Path) -> None:
    """The role run for real (localhost, from its CDI status task on) with the real CLI, stand-ins
    for nvidia-ctk (writes a new spec each time it generates) and podman (two GPUs), and the
    recorded real hosts' nvidia-smi: first deploy on the A6000 host's R515 driver generates and
    records; a second deploy on it generates nothing; after the upgrade to the H200 host's R580
    driver the spec is regenerated and recorded for R580; a dry run (--check) changes nothing."""
    import subprocess
    import sys

    from specdeploy.core import layout
    from specdeploy.profile import load_profile
    from specdeploy.profile.facts import deploy_facts

    root = Path(__file__).resolve().parents[2]
    tools = tmp_path / "bin"
    tools.mkdir()
    generated = tmp_path / "generated.log"
    scripts = {
        "specdeploy": f'#!/bin/sh\nPYTHONPATH="{root / "python"}" exec "{sys.executable}" -m specdeploy "$@"\n',
        "nvidia-ctk": f'#!/bin/sh\n# cdi generate --output SPEC\necho "$*" >> "{generated}"\n'
        'mkdir -p "$(dirname "$4")" && echo "cdiVersion: 0.5.0 # $(date +%s%N)" > "$4"\n',
        "podman": '#!/bin/sh\nfor i in 0 1; do echo "GPU $i: NVIDIA RTX A6000 (UUID: GPU-$i)"; done\n',
    }
    for name, text in scripts.items():
        (tools / name).write_text(text)
        (tools / name).chmod(0o755)
    host = layout.local_layout(tmp_path / "host")
    facts = deploy_facts(load_profile("a6000-dflash"), host, layout.InstallLayout(root=tmp_path / "opt"))
    facts["install"]["cli"] = str(tools / "specdeploy")
    spec = tmp_path / "etc" / "cdi" / "nvidia.yaml"
    playbook = tmp_path / "play.yml"
    playbook.write_text("- hosts: localhost\n  connection: local\n  gather_facts: false\n  roles: [gpu_runtime]\n")

    stand_ins = {record: _stand_in(tmp_path, record) for record in ("a6000-x1-r515", "h200-x2-r580")}

    def deploy(record: str, *options: str) -> None:
        extra = tmp_path / "vars.json"
        smi = stand_ins[record]
        extra.write_text(json.dumps({"specdeploy_facts": facts, "gpu_runtime_cdi_spec": str(spec),
                                     "preflight_nvidia_smi": smi, "specdeploy_run_id": "run-cdi"}))  # fmt: skip
        done = subprocess.run(
            [str(Path(sys.executable).parent / "ansible-playbook"), str(playbook), "-e", f"@{extra}",
             "--start-at-task", "Check the CDI spec was generated for the running driver", *options],
            cwd=root / "ansible", capture_output=True, text=True,
            env={**os.environ, "ANSIBLE_CONFIG": str(root / "ansible" / "ansible.cfg"),
                 "ANSIBLE_ROLES_PATH": str(root / "ansible" / "roles"), "PATH": f"{tools}:{os.environ['PATH']}"},
        )  # fmt: skip
        assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]

    def generations() -> int:
        return len(generated.read_text().splitlines()) if generated.exists() else 0

    deploy("a6000-x1-r515")
    assert generations() == 1 and generated.read_text().split() == ["cdi", "generate", "--output", str(spec)]
    stamp = cdi.read_stamp(host.state / "cdi.json")
    assert stamp is not None and (stamp.driver_version, stamp.spec) == (A6000_DRIVER, str(spec))
    deploy("a6000-x1-r515")
    assert generations() == 1  # the same driver: left alone
    deploy("h200-x2-r580")
    assert generations() == 2
    stamp = cdi.read_stamp(host.state / "cdi.json")
    assert stamp is not None and (stamp.driver_version, stamp.spec_sha256) == (H200_DRIVER, files.sha256_file(spec))
    assert not list(spec.parent.glob("*.json"))  # nothing podman would take for a spec beside it
    deploy("a6000-x1-r515", "--check")  # a dry run that would regenerate: reads, changes nothing
    assert generations() == 2 and cdi.read_stamp(host.state / "cdi.json") == stamp
    # the run kept what the first regeneration replaced (no spec then: absent), for its rollback
    record = json.loads((host.rollback / "run.json").read_text())
    kinds = {e["path"]: e["kind"] for e in record["entries"]}
    assert kinds == {str(spec): "absent", str(host.state / "cdi.json"): "absent"}


def test_a_failed_run_s_rollback_puts_back_the_spec_and_stamp_the_previous_stack_ran_with(tmp_path: Path) -> None:
    """Issue 35: `cdi keep` before the spec is generated again; the run's rollback (restore, with
    systemctl a recorder) puts back the previous spec and its stamp, byte for byte; a spec the run
    created where there was none is removed by it."""
    from specdeploy.core.keeper import Keeper
    from specdeploy.rollback import restore

    state = tmp_path / "state"
    state.mkdir()
    spec = tmp_path / "cdi" / "nvidia.yaml"
    spec.parent.mkdir()
    spec.write_text(SPEC_TEXT.replace("DRIVER", "515.48.07"))
    stamp = cdi.stamp_path(state)
    stamp.write_text('{"driver": "515.48.07"}\n')
    before = (spec.read_bytes(), stamp.read_bytes())
    kept = CliRunner().invoke(app, ["cdi", "keep", "--spec", str(spec), "--state-dir", str(state), "--rollback-dir",
                                    str(state / "rollback"), "--run-id", "run-1", "--json"])  # fmt: skip
    assert kept.exit_code == 0, kept.output
    assert json.loads(kept.output)["kept"] == [str(spec), str(stamp)]
    spec.write_text(SPEC_TEXT.replace("DRIVER", "580.159.04"))  # what nvidia-ctk and `cdi record` then write
    stamp.write_text('{"driver": "580.159.04"}\n')
    done = restore.restore(state / "rollback", "run-1", unit="specdeploy-engine", run=lambda _: None,
                           unit_files=(tmp_path / "no-unit",))  # fmt: skip
    assert sorted(done.restored) == sorted([str(spec), str(stamp)])
    assert (spec.read_bytes(), stamp.read_bytes()) == before

    fresh = tmp_path / "fresh"
    (fresh / "state").mkdir(parents=True)
    new_spec = fresh / "nvidia.yaml"
    cdi.keep_for_rollback(new_spec, fresh / "state", Keeper(fresh / "state" / "rollback", "run-2"))
    new_spec.write_text(SPEC_TEXT)
    restore.restore(fresh / "state" / "rollback", "run-2", unit="specdeploy-engine", run=lambda _: None,
                    unit_files=(tmp_path / "no-unit",))  # fmt: skip
    assert not new_spec.exists()
