"""The rehearsal on the production path, end to end: `ansible-playbook deploy.yml -l rehearsal`
with profile cpu-rehearsal-container over real SSH to a disposable Debian trixie host running
podman 5.4.2 itself (nested in this machine's podman). On the host the play installs the CLI
for the host's Python 3.13, builds the CPU vLLM image from exactly the build context the images
role ships (its guard stage run by build_guards) — once per cache key: the image is then kept as
an archive, and later runs load it (`images_source: archive`, as an air-gapped site) — fetches
the weights from the gated hub — olah behind a token-checking proxy, a test host of its own on
the test network — with a canary token on standard input, installs a canary API key as a podman
secret, runs the engine under quadlet (health check, Restart=always, hardening, serving directory
mounted at its host path) and gates it with the key.

Then, on the same host and in file order (each test starts from what the previous one left;
a deploy on vLLM-CPU takes minutes): a re-run changes nothing; the three failure paths — a gate
that fails, a run interrupted after it replaced the engine, an engine container that cannot
start — each end with the previous stack restored and proven to serve; and every command line
Ansible ran on the host and the controller, the -vvv logs, the journal, the files others can
read, the unit files, the image history and the process list hold neither canary, while the
same search finds a canary leaked on purpose.

What still needs a GPU host (CUDA images, CDI, the NVIDIA runtime): docs/verified-where.md.

On the tiny fixtures (cpu-rehearsal-container, the chains' profile): plumbing and speed, for they
answer only the corpus they memorised; the gate's content checks are proven on a model that speaks
in tests/integration/test_real_model.py and the migration chain's last test (the main job's model).
"""

from __future__ import annotations

import json
import re
import secrets
import subprocess
import sys
import time
from pathlib import Path

import pytest
from tests.support import canary, container_rig

from specdeploy.core import layout, progress
from specdeploy.images import build as images
from specdeploy.profile import load_profile
from specdeploy.profile.lock import Lock
from specdeploy.rehearsal import deploy, engine_image, hosts, variants

pytestmark = [pytest.mark.testhost, pytest.mark.vllm, pytest.mark.podman, pytest.mark.hub]
HOST_NAME, PROFILE, TOKEN, API_KEY = (
    container_rig.HOST_NAME,
    container_rig.PROFILE,
    container_rig.TOKEN,
    container_rig.API_KEY,
)
Rig = container_rig.Rig
DEFAULT = layout.HostLayout()
UNIT = layout.UNIT_FILES["container"]
CLI = layout.InstallLayout().to_json()["cli"]


@pytest.fixture(scope="module")
def rig(container_rig: Rig) -> Rig:
    """The session's container host (tests/support/container_rig.py), deployed by this module."""
    return container_rig


def _variant(rig: Rig, tmp_path: Path, patch: dict) -> Path:
    """The pinned profile with `patch` applied, under the same name (what a site's edit looks like)."""
    pinned = load_profile(rig.profiles / f"{PROFILE}.yaml")
    return variants.materialize(variants.derive(pinned, PROFILE, patch), tmp_path / "profiles").parent


def _status(rig: Rig, path: str, *, key: str | None) -> int:
    """HTTP status of GET `path` on the engine, from the host (its port is published on loopback
    only). The probe and the key travel on the ssh session's standard input, never on a command line."""
    probe = (
        "import urllib.request, urllib.error\n"
        f"request = urllib.request.Request('http://127.0.0.1:{load_profile(PROFILE).engine.serve.port}{path}')\n"
        + (f"request.add_header('Authorization', 'Bearer ' + {key!r})\n" if key else "")
        + "try: print(urllib.request.urlopen(request, timeout=10).status)\n"
        "except urllib.error.HTTPError as exc: print(exc.code)\n"
    )
    return int(canary.ssh_stdin(rig.host, "python3 -", probe).stdout.strip())


# On a fresh machine this test's setup downloads the engine and builds the wheelhouse, and its first
# play builds the engine image nested on the host: past the suite's 15-minute default (seen in a
# fresh-cache CI run, 2026-12-02); a warm cache takes ~3 minutes.
@pytest.mark.timeout(2700)
def test_the_container_profile_deploys_with_hub_weights_a_key_and_quadlet_and_a_rerun_changes_nothing(
    rig: Rig,
) -> None:
    run, report = container_rig.play(rig)
    assert run.returncode == 0, run.stdout[-5000:]
    assert report is not None and report["verdict"] == "pass" and report["smoke"]["verdict"] == "pass", report
    # no silent minutes (issue 37): the image's build or load, the engine's start and the gate each said
    # at least every 30 s what they were waiting on (the progress callback's lines)
    assert run.longest_silence < progress.MAX_SILENCE_S, run.times
    # and the gate's lines name its own current check (the unit's progress line, each wait's retry)
    gate_ticks = re.findall(
        r"\d\d:\d\d:\d\d TASK \[smoke_gate : Gate the new stack[^\n]*: \d+s, last: \S+: attempt \d+ of \d+: "
        r"unit active; \d\d:\d\d:\d\d gate: \d+s, last: (smoke: [^\n]*)",
        run.stdout,
    )
    assert gate_ticks, run.stdout[-5000:]
    # each look is a wait, printed as one (ansible/callback_plugins/specdeploy_default.py), never as FAILED
    # (the rig's plays run at -vvv: Ansible's result follows, as the default callback adds it from -vv)
    looked = r"^waiting: \[\S+\]: unit active; \d\d:\d\d:\d\d gate: .* \(attempt \d+ of \d+: Gate the new stack .*\)"
    assert re.search(looked, run.stdout, re.M), run.stdout[-5000:]
    assert "FAILED - RETRYING" not in run.stdout
    host = rig.host
    if rig.images_source == "build":  # the first run for this cache key: built on the host from
        # the context the role shipped, its guard passing (kept once the canary search passed)
        assert "specdeploy build guard: vllm release checks passed" in run.stdout
        assert '"action": "built"' in run.stdout
    else:  # loaded from the archive, its labels and contents checked, the base digest recorded
        assert '"action": "loaded"' in run.stdout
        assert "engine.image.base.digest" in host.ssh(f"cat {DEFAULT.lock}").stdout
    # weights from the hub at its commits, per revision, served through relative links
    served = load_profile(PROFILE)
    repos = [served.target.repo] + ([served.drafter.repo] if served.drafter else [])
    for repo in repos:  # the profile's models only: the hub also serves other profiles' fixtures
        commit = rig.served.commits[repo]
        assert host.ssh(f"test -d {DEFAULT.download(repo)}/{commit} && echo ok").stdout.strip() == "ok", repo
    target = host.ssh(f"readlink -f {DEFAULT.target_serving}").stdout.strip()
    assert target.endswith(rig.served.commits[load_profile(PROFILE).target.repo]), target
    # the quadlet: no GPU device on a CPU profile, the startup health check, the key as a secret
    unit = host.ssh(f"cat {UNIT}").stdout
    assert "AddDevice=" not in unit and "HealthStartupInterval=2s" in unit and "Notify=healthy" in unit
    assert "Secret=specdeploy_api_key,type=mount" in unit and "Restart=always" in unit
    inspected = json.loads(host.ssh(f"podman inspect {layout.UNIT_NAME}").stdout)[0]
    assert inspected["Config"]["User"] == f"{layout.ENGINE_UID}:{layout.ENGINE_UID}"
    assert inspected["State"]["Health"]["Status"] == "healthy"
    # the hardening, as the running engine has it: no capabilities, no privilege gain, read-only root
    assert {"NoNewPrivileges=true", "DropCapability=all", "ReadOnly=true"} <= set(unit.splitlines())
    status = host.ssh(f"podman exec {layout.UNIT_NAME} cat /proc/1/status").stdout
    assert re.search(r"^CapEff:\s+0+$", status, re.M) and re.search(r"^NoNewPrivs:\s+1$", status, re.M), status
    assert host.ssh(f"podman exec {layout.UNIT_NAME} touch /written", check=False).returncode != 0
    # the GPU profiles pin trixie's podman and catatonit: what this trixie host (debootstrapped from
    # deb.debian.org) has installed, read again on every run
    installed = dict(line.split("\t") for line in host.ssh("dpkg-query -W podman catatonit").stdout.splitlines())
    for name in ("a6000-dflash", "a6000-dflash-stock", "a6000-mtp"):
        pinned = load_profile(name).host.packages  # type: ignore[union-attr]
        assert {pkg: pinned[pkg].value for pkg in installed} == installed, name
    # issue 35: the state directory is root's, the light gate's group entering it (0750); its reports
    # root's alone to read (0640, root's group)
    report_file = DEFAULT.state / "runs" / report["run_id"] / "gate.json"
    modes = host.ssh(f"stat -c '%a %U %G' {DEFAULT.state} {report_file}").stdout.splitlines()
    assert modes == [f"750 root {layout.WATCH_USER}", "640 root root"], modes
    # the API key guards the API: 401 without it, 200 with it
    assert _status(rig, "/v1/models", key=None) == 401
    assert _status(rig, "/v1/models", key=API_KEY) == 200

    again, second = container_rig.play(rig)
    assert again.returncode == 0, again.stdout[-4000:]
    assert second is not None and second["verdict"] == "pass"
    assert deploy.changed_tasks(again.stdout) == []


def test_the_light_gate_runs_as_its_own_account_with_a_copy_of_the_key_for_each_run(rig: Rig) -> None:
    """Issue 35, item 6: the light gate's service runs as its own account, never root. Started as its
    timer starts it, it passes against the keyed container stack: the API key reached it as a copy for
    that run (systemd's privileged ExecStartPre=+, into the run's own directory, gone after it) of the
    root-only key file, which that account cannot read, nor a gate report; what it wrote is its
    account's."""
    host, service = rig.host, layout.WATCH_UNIT_FILES["service"].name
    done = host.ssh(f"systemctl start {service}", check=False)
    journal = host.ssh(f"journalctl -u {service} --no-pager -n 60", check=False).stdout
    assert done.returncode == 0, done.stdout + done.stderr + journal
    result = json.loads(host.ssh(f"cat {DEFAULT.watch_result}").stdout)
    assert result["verdict"] == "pass", result["message"]
    unit = host.ssh(f"systemctl cat {service}").stdout
    key = load_profile(PROFILE).engine.serve.api_key
    assert key is not None and f"User={layout.WATCH_USER}" in unit
    assert f"{DEFAULT.secret_file(key.secret)} {layout.WATCH_RUNTIME_DIR / key.secret}" in unit
    assert host.ssh(f"test -e {layout.WATCH_RUNTIME_DIR} || echo gone").stdout.strip() == "gone"  # the copy too
    owners = host.ssh(f"stat -c '%U %a' {DEFAULT.watch} {DEFAULT.watch_result} {DEFAULT.watch_counters}").stdout
    assert owners.splitlines() == [f"{layout.WATCH_USER} {mode}" for mode in ("750", "640", "640")], owners
    verified = host.ssh(f"readlink -f {DEFAULT.verified}").stdout.strip()
    for secret in (str(DEFAULT.secret_file(key.secret)), f"{verified}/gate.json"):
        denied = host.ssh(f"runuser -u {layout.WATCH_USER} -- cat {secret}", check=False)
        assert denied.returncode != 0 and "Permission denied" in denied.stderr, (secret, denied.stderr)


def test_the_engine_image_built_on_the_host_holds_the_same_files_as_the_one_built_on_the_controller(
    rig: Rig, tmp_path: Path
) -> None:
    """Reproducible by construction: the CPU engine image the images role built on this host
    (podman 5 on trixie; on a warm cache the archive a host built for this cache key, loaded) and
    the one built once on the controller (podman 4, the main job's builder, `build_on_controller`)
    from the same lock and build context hold the same files: path, type, mode, owner and sha256
    of every file (`specdeploy image manifest`; what it leaves out, and why:
    specdeploy.images.manifest.EXCLUDED)."""
    profile = load_profile(rig.profiles / f"{PROFILE}.yaml")  # the base by its registry digest, as on the host
    built = engine_image.build_on_controller(
        profile,
        context=deploy.checkout(),
        wheels=rig.wheels,
        lock=Lock(tmp_path / "builder.lock"),
        cert_dir=rig.site.cert_dir,
    )
    there = "/var/tmp/engine-manifest.json"
    rig.host.ssh(f"{CLI} image manifest {images.image_tag(profile)} --output {there} --json > /dev/null")
    copied = tmp_path / "host-manifest.json"
    subprocess.run(["podman", "cp", f"{HOST_NAME}:{there}", str(copied)], check=True, capture_output=True)
    compared = subprocess.run(
        [sys.executable, "-m", "specdeploy", "image", "manifest", built, "--against", str(copied), "--json",
         "--podman", hosts.PODMAN],
        capture_output=True, text=True,
    )  # fmt: skip
    result = json.loads(compared.stdout)
    assert compared.returncode == 0 and result["equal"] is True, result["differences"][:20]
    assert result["entries"] > 50000  # the whole image: vLLM, torch, the OS
    host_id = json.loads(copied.read_text())["image_id"]
    print(f"host-built {host_id}, controller-built {result['image_id']}: {result['entries']} entries equal")


def test_a_failed_gate_restores_the_previous_container_stack_which_serves(rig: Rig, tmp_path: Path) -> None:
    """A stack that starts and answers but fails the gate (here: an acceptance floor it cannot
    reach, as a corrupted drafter would) is replaced by the previous one, proven to serve. The run
    also rotated the API key (issue 35): the previous stack serves again with the previous key, its
    podman secret made from the kept key file, and the rotated key is refused."""
    unit_before = rig.host.ssh(f"cat {UNIT}").stdout
    profiles = _variant(rig, tmp_path, variants.unreachable_acceptance_floor(load_profile(PROFILE)))
    rotated = "sk-rotated-" + secrets.token_hex(16)
    vars_file = tmp_path / "rotated.json"
    vars_file.touch(mode=0o600)
    vars_file.write_text(json.dumps({"engine_api_key": rotated}))
    run, report = container_rig.play(rig, profiles=profiles, vars_file=vars_file)
    assert run.returncode != 0 and "the gate did not pass" in run.stdout, run.stdout[-4000:]
    assert report is not None and report["verdict"] == "fail", report
    assert report["rollback"]["previous_stack_serves"] is True, report["rollback"]
    assert rig.host.ssh(f"cat {UNIT}").stdout == unit_before
    assert _status(rig, "/v1/models", key=API_KEY) == 200
    assert _status(rig, "/v1/models", key=rotated) == 401


def test_an_interrupted_run_is_restored_and_proven_before_the_next_run_replaces_anything(rig: Rig) -> None:
    """A run that replaced the engine unit and died before its gate (the controller lost): the
    ungated engine serves until the next play, whose first act restores the last good unit and
    proves it serves; that play then passes its own gate."""
    host = rig.host
    unit_before = host.ssh(f"cat {UNIT}").stdout
    image = re.search(r"^Image=(\S+)$", unit_before, re.M)
    assert image is not None
    profiles = layout.InstallLayout().to_json()["profiles"]
    max_model_len = load_profile(PROFILE).engine.serve.max_model_len
    interrupted = host.ssh(
        f"mkdir -p /tmp/interrupted && sed 's/max_model_len: {max_model_len}$/max_model_len: 384/' "
        f"{profiles}/{PROFILE}.yaml > /tmp/interrupted/{PROFILE}.yaml && "
        f"{CLI} unit install {UNIT.parent} --profile /tmp/interrupted/{PROFILE}.yaml "
        f"--state-dir {DEFAULT.state} --rollback-dir {DEFAULT.rollback} --run-id interrupted-1 "
        f"--image {image.group(1)} && systemctl daemon-reload && systemctl restart {layout.UNIT_NAME}",
        check=False,
    )
    assert interrupted.returncode == 0, interrupted.stdout + interrupted.stderr
    assert "--max-model-len 384" in host.ssh(f"cat {UNIT}").stdout  # the ungated engine runs

    run, report = container_rig.play(rig)
    assert run.returncode == 0, run.stdout[-4000:]
    assert "specdeploy : Recover an interrupted earlier run (restore and prove the previous stack)" in (
        deploy.changed_tasks(run.stdout)
    )
    assert report is not None and report["verdict"] == "pass"
    assert host.ssh(f"cat {UNIT}").stdout == unit_before
    # the interrupted run was closed by restoring it; this play replaced nothing of its own
    record = json.loads(host.ssh(f"cat {DEFAULT.rollback}/run.json").stdout)
    assert (record["run_id"], record["closed"]) == ("interrupted-1", "restored"), record


def test_an_engine_container_that_cannot_start_is_rolled_back_at_once(rig: Rig, tmp_path: Path) -> None:
    """A new image or flag the engine dies on (here an unknown serve flag): the container exits,
    systemd restarts it in a loop; the gate reads the crash loop from the unit and rolls back."""
    unit_before = rig.host.ssh(f"cat {UNIT}").stdout
    profiles = _variant(rig, tmp_path, {"engine": {"serve": {"extra_args": ["--no-such-flag"]}}})
    run, report = container_rig.play(rig, profiles=profiles)
    assert run.returncode != 0 and "the gate did not pass" in run.stdout, run.stdout[-4000:]
    assert report is not None and report["verdict"] == "error", report
    readiness = report["smoke"]["stages"][0]
    assert "the engine stopped before it was ready" in readiness["summary"], report["smoke"]
    # at once: the crash loop read from the unit, not the readiness timeout waited out
    assert "auto-restart" in readiness["summary"] or "automatic restarts" in readiness["summary"]
    assert report["smoke"]["elapsed_s"] < load_profile(PROFILE).smoke.readiness_timeout_s / 4
    assert report["rollback"]["previous_stack_serves"] is True, report["rollback"]
    assert rig.host.ssh(f"cat {UNIT}").stdout == unit_before
    assert _status(rig, "/v1/models", key=API_KEY) == 200


def _wait_on_host(rig: Rig, command: str, expected: str, timeout: float) -> str:
    """Poll `command` on the host until its output is `expected`; its last output."""
    deadline = time.monotonic() + timeout
    shown = ""
    while time.monotonic() < deadline:
        shown = rig.host.ssh(command, check=False).stdout.strip()
        if shown == expected:
            return shown
        time.sleep(2)
    return shown


def _lock_holder(rig: Rig) -> str | None:
    shown = rig.host.ssh(f"{CLI} deploy-lock status --json", check=False).stdout
    holder = json.loads(shown)["holder"] if shown.strip() else None
    return holder["run_id"] if holder else None


def test_a_second_play_against_the_host_is_refused_naming_the_play_that_holds_it(rig: Rig) -> None:
    """Two plays against one host at once (issue 35): the second is refused at its first task on the
    host, naming the run that holds it, and changes nothing; the first runs to its end (a re-run:
    nothing to change) and gives the host back."""
    first, run_id, log = container_rig.start_play(rig)
    try:
        assert _wait_on_host(rig, f"{CLI} deploy-lock status --json | grep -c {run_id}", "1", 600) == "1", (
            log.read_text()[-4000:]
        )
        second, report = container_rig.play(rig)
        assert second.returncode != 0 and report is None, second.stdout[-4000:]
        text = " ".join(second.stdout.split())
        assert f"this host is being deployed by run {run_id} (deploy.yml" in text, text[-4000:]
        assert "Recover an interrupted earlier run" not in second.stdout  # refused before anything
        assert first.wait(900) == 0, log.read_text()[-4000:]
    finally:
        if first.poll() is None:
            container_rig.kill_controller(first, run_id)
    assert _lock_holder(rig) is None  # the first gave it back


def test_a_controller_killed_during_the_gate_leaves_a_finished_report_and_the_previous_stack_proven(
    rig: Rig, tmp_path: Path
) -> None:
    """The controller (ansible-playbook and its SSH connections) killed while the gate judges a stack
    that fails it: the gate, a transient unit of its own (specdeploy-gate-<run id>), goes on — its
    report is finished, not "running", the previous stack is restored and proven to serve. The dead
    play's hold on the host stays until released by hand, and a play meanwhile is refused naming it."""
    unit_before = rig.host.ssh(f"cat {UNIT}").stdout
    profiles = _variant(rig, tmp_path, variants.unreachable_acceptance_floor(load_profile(PROFILE)))
    controller, run_id, log = container_rig.start_play(rig, profiles=profiles)
    gate_unit = f"specdeploy-gate-{run_id}.service"
    try:
        state = _wait_on_host(rig, f"systemctl is-active {gate_unit}", "active", 900)
        assert state == "active", log.read_text()[-4000:]
    finally:
        left = container_rig.kill_controller(controller, run_id)  # the controller's machine dies mid-gate
    assert left == []  # every process of the play, its workers too
    assert "PLAY RECAP" not in log.read_text()
    assert _wait_on_host(rig, f"systemctl is-active {gate_unit}", "inactive", 900) == "inactive"
    report = deploy.gate_report(rig.host, run_id)
    assert report is not None and report["verdict"] == "fail" and report["finished_at"], report
    assert report["rollback"]["previous_stack_serves"] is True, report["rollback"]
    assert rig.host.ssh(f"cat {UNIT}").stdout == unit_before
    assert _status(rig, "/v1/models", key=API_KEY) == 200
    assert _lock_holder(rig) == run_id  # the dead play still holds the host
    refused, _ = container_rig.play(rig)
    assert refused.returncode != 0 and f"this host is being deployed by run {run_id}" in " ".join(
        refused.stdout.split()
    ), refused.stdout[-4000:]
    released = rig.host.ssh(f"{CLI} deploy-lock release --run-id {run_id} --json")
    assert json.loads(released.stdout)["released"]["run_id"] == run_id


def test_no_canary_appears_in_any_command_line_log_file_unit_image_or_process(rig: Rig) -> None:
    """After every play above (a deploy, a re-run, a failed gate, a crash loop, a recovery, each
    with the canary token and key): zero hits in each place, every place searched."""
    assert rig.plays >= 5
    profile = load_profile(rig.profiles / f"{PROFILE}.yaml")
    assert profile.engine.image is not None
    base = profile.engine.image.base
    result = canary.search(
        rig.host,
        [TOKEN, API_KEY],
        controller_logs=sorted(rig.logs.glob("*.log")),
        # the engine image's history holds its base's; the base (by its digest) only where it was pulled to build
        images=[
            images.image_tag(profile),
            *([f"{base.name.rsplit(':', 1)[0]}@{base.digest.value}"] if rig.images_source == "build" else []),
        ],
    )
    assert result.unsearched == {}, result.describe()
    assert result.total == 0, result.describe()
    if rig.images_source == "build":  # the image this run built, its history searched: kept for the next runs
        engine_image.save_from_host(HOST_NAME, profile, rig.engine_archive)
    # the recording recorded: the CLI's commands on the host, the play's ssh sessions
    assert any("image" in " ".join(r.get("argv", [])) for r in canary.read_argv_log(rig.host))
    assert (rig.logs / "ssh-argv.log").stat().st_size > 0


def test_the_same_search_finds_a_canary_leaked_on_purpose(rig: Rig, tmp_path: Path) -> None:
    """The control run: the token handed over the way this project forbids — a task's
    `environment:` (ansible/ansible#13664 puts it on the remote command line) — is found."""
    leak = canary.new_canary("hf_LEAKED")
    play = tmp_path / "leak.yml"
    play.write_text(
        "- hosts: all\n  gather_facts: false\n  tasks:\n"
        '    - ansible.builtin.command: {argv: ["true"]}\n'
        f"      environment: {{HF_TOKEN: {leak}}}\n"
    )
    argv = [str(Path(sys.executable).parent / "ansible-playbook"), "-i", str(rig.logs.parent / "hosts.ini")]
    argv += [str(play), "-vvv", "-e", f"ansible_ssh_executable={rig.ssh}"]
    run = deploy.run_playbook([*argv, "--vault-password-file", str(rig.vault.password_file)], capture=True)
    assert run.returncode == 0, run.stdout[-3000:]
    log = tmp_path / "leak-vvv.log"
    log.write_text(run.stdout)
    result = canary.search(rig.host, [leak], controller_logs=[log], images=[])
    assert result.hits["argv-log"] and result.hits["leak-vvv.log"], result.describe()


def test_the_host_pulls_the_image_built_once_on_the_controller_by_its_digest_and_serves_it(rig: Rig) -> None:
    """Build once, ship everywhere, through the images role (last in this module: the image the
    host built was searched for canaries and kept above). The controller, the site's builder,
    pushes its build to the site registry (Debian's docker-registry on a test host of its own,
    TLS with a site CA) and `image push` records the registry's digest in the site's lock beside
    the inventory; the play pushes that lock to the host, installs the CA where podman reads it
    and pulls NAME@DIGEST (`images_source: pull`, the default) — another image ID than the host's
    own build, the same files (above) — and the engine restarts on it and passes its gate."""
    site = rig.site
    site_lock = rig.logs.parent / "specdeploy.lock"  # beside the inventory the plays use
    profile = load_profile(rig.profiles / f"{PROFILE}.yaml")
    digest = deploy.build_once(profile, wheels=rig.wheels, site=site, site_lock=site_lock)
    run, report = container_rig.play(rig, images={"images_source": "pull"})
    assert run.returncode == 0, run.stdout[-5000:]
    assert report is not None and report["verdict"] == "pass", report
    assert '"action": "pulled"' in run.stdout
    assert f"Image={profile.engine.image.name}@{digest}" in rig.host.ssh(f"cat {UNIT}").stdout.splitlines()
    ca = rig.host.ssh(f"cat /etc/containers/certs.d/{site.address}/ca.crt").stdout
    assert ca == site.ca.read_text()
    assert _status(rig, "/v1/models", key=API_KEY) == 200
