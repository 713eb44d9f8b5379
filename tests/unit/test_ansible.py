"""The playbook and roles: ansible-lint's production profile clean and a syntax check."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from tests.support.playbooks import engine_play, host_tasks

ROOT = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent
ENV = {**os.environ, "ANSIBLE_CONFIG": str(ROOT / "ansible" / "ansible.cfg")}


def test_ansible_lint_production_profile() -> None:
    done = subprocess.run(
        [str(BIN / "ansible-lint"), "--profile", "production", "--nocolor"],
        cwd=ROOT / "ansible", capture_output=True, text=True, env=ENV,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]


def test_playbook_syntax() -> None:
    done = subprocess.run(
        [str(BIN / "ansible-playbook"), "--syntax-check", "deploy.yml"],
        cwd=ROOT / "ansible", capture_output=True, text=True, env=ENV,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr


# "front": the engine host's listener, the front's way in (behind a front only)
STAGES = ["preflight", "gpu_runtime", "images", "weights", "drafter_config", "engine", "front", "smoke_gate"]


def _play_stages() -> list[tuple[str, list[str]]]:
    """(role, tags) of each stage in the play's order: the CLI role, then the block's imports."""
    play = engine_play()
    assert play["serial"] == 1 and play["any_errors_fatal"] is True
    tasks = host_tasks()
    stages = [(tasks[0]["ansible.builtin.import_role"]["name"], tasks[0]["tags"])]
    block = next(t for t in tasks if "block" in t)
    return stages + [(t["ansible.builtin.import_role"]["name"], t["tags"]) for t in block["block"]]


def test_every_stage_is_tagged() -> None:
    stages = _play_stages()
    assert [role for role, _ in stages] == ["specdeploy", *STAGES]
    assert all(role in tags for role, tags in stages[1:]) and stages[0][1] == ["cli"]


def _list_tasks(*extra: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(BIN / "ansible-playbook"), "deploy.yml", "-i", "inventory/example.yml", "-l", "a6000", "--list-tasks",
         *extra],
        cwd=ROOT / "ansible", capture_output=True, text=True, env=ENV,
    )  # fmt: skip


GATE_TASK = "smoke_gate : Gate the new stack"


def test_every_stage_that_can_restart_the_engine_brings_the_gate_when_run_alone() -> None:
    """GPU-host blocker 9: `--tags engine` restarted the engine with no gate after it, so a
    failing stack stayed and nothing rolled it back. Each stage that can replace what the
    engine runs on, run alone, now lists the gate (and the flush of its pending restart)
    after its own tasks; a stage that cannot (preflight) does not. The GPU container runtime
    (podman and the toolkit at new versions, a regenerated CDI spec) changes what the running
    engine's container runs through: it brings the gate too (issue 35)."""
    for stage in ("engine", "drafter_config", "weights", "images", "gpu_runtime"):
        listed = _list_tasks("--tags", stage)
        assert listed.returncode == 0, listed.stdout + listed.stderr
        tasks = [line.strip() for line in listed.stdout.splitlines()]
        gate = next(i for i, t in enumerate(tasks) if t.startswith(GATE_TASK))
        flush = next(i for i, t in enumerate(tasks) if t.startswith("smoke_gate : Apply a pending engine restart"))
        own = [i for i, t in enumerate(tasks) if t.startswith(f"{stage} : ")]
        assert own and max(own) < flush < gate, (stage, tasks)
    assert GATE_TASK not in _list_tasks("--tags", "preflight").stdout


def test_the_a6000_play_lists_every_stage_for_the_example_inventory() -> None:
    """What `-l a6000` would run, rendered without touching a host: the inventory parses,
    both GPU hosts are selected, and every stage's tasks are present under its tag."""
    done = subprocess.run(
        [str(BIN / "ansible-playbook"), "deploy.yml", "-i", "inventory/example.yml", "-l", "a6000",
         "--list-hosts", "--list-tasks"],
        cwd=ROOT / "ansible", capture_output=True, text=True, env=ENV,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    assert "gpu-a6000-01.example.internal" in done.stdout and "gpu-a6000-02.example.internal" in done.stdout
    assert "specdeploy-rehearsal" not in done.stdout.split("tasks:", 1)[0]
    for task in (
        "preflight : Check the host against the profile",
        "gpu_runtime : Generate the CDI spec (nvidia.com/gpu=all)",
        "images : Build, pull or load the image and check its labels",
        "weights : Fetch and verify weights at the pinned commits",
        "drafter_config : Verify the downloaded drafter config",
        "engine : Install the engine unit rendered from the profile",
        "smoke_gate : Gate the new stack (startup log, smoke; on failure roll back and prove the previous stack)",
    ):
        assert task in done.stdout, task


def _tasks() -> list[tuple[str, dict]]:
    """(role, task) for every task in every role, blocks flattened."""
    import yaml

    found = []

    def walk(role: str, tasks: list[dict]) -> None:
        for task in tasks or []:
            found.append((role, task))
            walk(role, task.get("block", []))

    for path in sorted((ROOT / "ansible" / "roles").glob("*/tasks/*.yml")):
        walk(path.parts[-3], yaml.safe_load(path.read_text()))
    return found


def _argv(task: dict) -> list[str]:
    command = task.get("ansible.builtin.command") or {}
    argv = command.get("argv", []) if isinstance(command, dict) else []
    return [str(a) for a in argv] if isinstance(argv, list) else [str(argv)]


def test_exactly_one_task_reads_the_profile_and_every_role_uses_its_facts() -> None:
    readers = [
        (role, task["name"])
        for role, task in _tasks()
        if "facts" in _argv(task) or ("profile" in _argv(task) and "show" in _argv(task))
    ]
    assert readers == [("specdeploy", "Read the deployment facts (profile values, host paths, engine unit)")]
    reader = next(task for _, task in _tasks() if task.get("name") == readers[0][1])
    assert reader["delegate_to"] == "localhost" and "always" in reader["tags"]
    roles_text = "".join(p.read_text() for p in (ROOT / "ansible" / "roles").glob("*/tasks/*.yml"))
    assert "from_json).engine" not in roles_text and "profile show" not in roles_text


def test_the_smoke_gate_role_starts_specdeploy_gate_as_its_unit_and_waits_for_it_in_short_looks() -> None:
    """The role's logic is the package's: one `gate --as-unit --detach`, then `gate-wait --for` retried
    until it exits other than gate.running_exit (75: still running), its retries and look bounded by the facts."""
    tasks = [task for role, task in _tasks() if role == "smoke_gate" and "ansible.builtin.command" in task]
    commands = [_argv(task) for task in tasks]
    assert [c[1] for c in commands] == ["gate", "gate-wait"], commands
    assert commands[0][-2:] == ["--as-unit", "--detach"]
    wait = tasks[1]
    assert commands[1][-2:] == ["--for", "{{ specdeploy_facts.gate.wait_s }}"]
    assert (
        wait["until"] == "smoke_gate_result.rc != specdeploy_facts.gate.running_exit"
        and wait["register"] == "smoke_gate_result"
    )
    assert wait["retries"] == "{{ specdeploy_facts.gate.attempts }}"
    gate_yaml = (ROOT / "ansible" / "roles" / "smoke_gate" / "tasks" / "main.yml").read_text()
    assert "from_json" not in gate_yaml and "slurp" not in gate_yaml  # parses nothing


def test_the_deploy_s_wait_for_its_gate_is_the_profile_s_gate_timeout_in_looks_shorter_than_a_progress_period(
    tmp_path: Path,
) -> None:
    from specdeploy.core import layout, progress
    from specdeploy.profile import load_profile
    from specdeploy.profile.facts import deploy_facts

    profile = load_profile("cpu-rehearsal")
    gate = deploy_facts(profile, layout.HostLayout(), layout.InstallLayout(root=tmp_path))["gate"]
    assert gate["wait_s"] == progress.LOOK_S < progress.PERIOD_S  # each ticker line carries a fresh look
    assert gate["running_exit"] == 75
    assert gate["attempts"] * gate["wait_s"] >= profile.smoke.gate_timeout_s == 14400
    shorter = profile.model_copy(update={"smoke": profile.smoke.model_copy(update={"gate_timeout_s": 600})})
    assert deploy_facts(shorter, layout.HostLayout(), layout.InstallLayout(root=tmp_path))["gate"]["attempts"] == 40


def test_the_images_role_puts_every_file_the_containerfile_copies_into_the_host_build_context(
    tmp_path: Path,
) -> None:
    """GPU-host blocker 1. The images role run for real (on localhost, with the facts
    `specdeploy facts` prints for a6000-dflash-stock and its build context in a temporary
    folder) up to the point where it needs a GPU: every COPY source of the profile's
    Containerfile must then be in the build context, or `podman build` on the host fails at
    that COPY."""
    import json

    from dockerfile_parse import DockerfileParser

    from specdeploy.core import layout
    from specdeploy.profile import load_profile
    from specdeploy.profile.facts import deploy_facts

    profile = load_profile("a6000-dflash-stock")
    facts = deploy_facts(profile, layout.HostLayout(), layout.InstallLayout(root=tmp_path / "opt"))
    playbook = tmp_path / "images.yml"
    playbook.write_text("- hosts: localhost\n  connection: local\n  gather_facts: false\n  roles: [images]\n")
    extra = tmp_path / "vars.json"
    extra.write_text(
        json.dumps({"specdeploy_facts": facts, "images_source": "build", "images_containerfiles_src": str(ROOT)})
    )
    done = subprocess.run(
        [str(BIN / "ansible-playbook"), str(playbook), "-e", f"@{extra}"],
        cwd=ROOT / "ansible", capture_output=True, text=True,
        env={**ENV, "ANSIBLE_ROLES_PATH": str(ROOT / "ansible" / "roles")},
    )  # fmt: skip
    # the first task that needs a GPU host (nvidia-smi) stops it here; the context is copied by then
    assert "Read the driver version" in done.stdout, done.stdout[-3000:]
    context = tmp_path / "opt" / "build"
    parser = DockerfileParser(fileobj=(ROOT / "Containerfile.vllm").open("rb"))
    sources = [
        ins["value"].split()[0]
        for ins in parser.structure
        if ins["instruction"] == "COPY" and not ins["value"].startswith("--from")
    ]
    assert sources and [s for s in sources if not (context / s).is_file()] == [], sorted(
        str(p.relative_to(context)) for p in context.rglob("*") if p.is_file()
    )


CANARY = "hf_CANARYtokenNeverOnACommandLine0123456789"


def test_the_hub_token_reaches_fetch_and_preflight_on_stdin_only_and_no_empty_mirror(tmp_path: Path) -> None:
    """GPU-host blockers 2 and 3, with a canary token. The preflight and weights roles run for
    real (localhost, `-vvv`) with a stand-in CLI that records how it was called and lingers;
    meanwhile every process's command line is scanned. A task's `environment:` put the token
    on the remote shell's command line (ansible/ansible#13664) and an empty HF_ENDPOINT broke
    huggingface_hub ("UnsupportedProtocol"): the token must arrive on stdin only, appear in
    no process's argv and no output, and no mirror means no HF_ENDPOINT at all."""
    import json
    import time

    from specdeploy.core import layout
    from specdeploy.profile import load_profile
    from specdeploy.profile.facts import deploy_facts

    record = tmp_path / "calls.txt"
    cli = tmp_path / "specdeploy"
    cli.write_text(
        "#!/bin/sh\n"
        f'{{ echo "argv: $*"; echo "HF_ENDPOINT=${{HF_ENDPOINT-unset}}"; echo "HF_TOKEN=${{HF_TOKEN-unset}}"; '
        f'echo "stdin: $(head -n 1)"; }} >> "{record}"\n'
        "sleep 2\n"
        'echo \'{"checks": [], "changed": false}\'\n'
    )
    cli.chmod(0o755)
    host = layout.local_layout(tmp_path / "host")
    facts = deploy_facts(load_profile("a6000-dflash"), host, layout.InstallLayout(root=tmp_path / "opt"))
    facts["install"]["cli"] = str(cli)
    facts["unit"]["user"] = "root"  # the group the models directory gets (no engine user on this machine)
    facts["fetch"]["user"] = "root"  # its owner (no fetch account either)
    playbook = tmp_path / "play.yml"
    playbook.write_text(
        "- hosts: localhost\n  connection: local\n  gather_facts: false\n  roles: [preflight, weights]\n"
    )
    extra = tmp_path / "vars.json"
    extra.write_text(
        json.dumps(
            {"specdeploy_facts": facts, "weights_source": "hub", "weights_hf_token": CANARY, "specdeploy_run_id": "t"}
        )
    )
    play = subprocess.Popen(
        [str(BIN / "ansible-playbook"), "-vvv", str(playbook), "-e", f"@{extra}"],
        cwd=ROOT / "ansible", stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        env={**ENV, "ANSIBLE_ROLES_PATH": str(ROOT / "ansible" / "roles")},
    )  # fmt: skip
    seen_in_argv = []
    while play.poll() is None:
        for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
            try:
                if CANARY.encode() in cmdline.read_bytes():
                    seen_in_argv.append(cmdline.read_bytes().replace(b"\0", b" ")[:200])
            except OSError:
                pass
        time.sleep(0.05)
    output = play.stdout.read() if play.stdout else ""
    assert play.returncode == 0, output[-3000:]
    assert seen_in_argv == []  # no process ever had the token on its command line
    calls = [c for c in record.read_text().split("argv: ")[1:] if "--token-stdin" in c or CANARY in c]
    assert len(calls) == 2, record.read_text()  # preflight, then fetch (not `weights serve`: no token there)
    for call in calls:
        assert f"stdin: {CANARY}" in call and "--token-stdin" in call
        assert "HF_TOKEN=unset" in call and "HF_ENDPOINT=unset" in call
        assert CANARY not in call.split("\n")[0]  # not in argv
    assert CANARY not in output


def test_a_play_without_a_limit_is_refused_before_anything_runs(tmp_path: Path) -> None:
    """GPU-host blocker 11: `hosts: all` deployed to every host when `-l` was forgotten. Without
    a limit the play stops at its first task, naming the fix; with `-l` it gets past it."""
    inventory = tmp_path / "hosts.ini"
    inventory.write_text("[a6000]\nlocalhost ansible_connection=local\n")

    def play(*extra: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [str(BIN / "ansible-playbook"), "deploy.yml", "-i", str(inventory), *extra],
            cwd=ROOT / "ansible", capture_output=True, text=True, env=ENV,
        )  # fmt: skip

    everywhere = play()
    assert everywhere.returncode != 0 and "refusing to deploy to every host" in everywhere.stdout
    assert "Require a profile and a wheelhouse" not in everywhere.stdout  # nothing after it ran
    limited = play("-l", "a6000")
    assert "refusing to deploy to every host" not in limited.stdout
    assert "Require a profile and a wheelhouse" in limited.stdout  # it went on (and stops there: no profile)
    meant = play("-e", "specdeploy_all_hosts=true")
    assert "refusing to deploy to every host" not in meant.stdout


def test_skipping_the_gate_is_refused_before_anything_runs(tmp_path: Path) -> None:
    """GPU-host blocker 9: `--skip-tags smoke_gate` restarted the engine without the gate. So
    would skipping any tag the gate carries (`--skip-tags images`: the gate is skipped with it
    while the engine stage still queues a restart). The play now stops at its first tasks,
    naming the alternative, before the CLI or any stage."""
    inventory = tmp_path / "hosts.ini"
    inventory.write_text("[a6000]\nlocalhost ansible_connection=local\n")
    for skipped in ("smoke_gate", "engine,smoke_gate", "images", "weights"):
        done = subprocess.run(
            [str(BIN / "ansible-playbook"), "deploy.yml", "-i", str(inventory), "-l", "a6000",
             "--skip-tags", skipped],
            cwd=ROOT / "ansible", capture_output=True, text=True, env=ENV,
        )  # fmt: skip
        assert done.returncode != 0 and "would restart the engine without the gate" in done.stdout, done.stdout
        assert "Require a profile and a wheelhouse" not in done.stdout


def test_the_refusal_and_the_gate_name_the_same_stages() -> None:
    """Tags cannot be templated, so the gate's import lists its tags and the play's variable
    lists them again for the refusal: the two lists must stay one."""
    play = engine_play()
    gate_tags = dict(_play_stages())["smoke_gate"]
    assert sorted(play["vars"]["specdeploy_gate_tags"]) == sorted(gate_tags)


def test_a_deploys_restart_starts_the_engines_start_limit_count_afresh_first() -> None:
    """The unit's StartLimitBurst (3 starts an hour on a container host) is for crash loops: a deploy's
    own restart resets the count first, or the fourth deploy within the hour found its engine refused
    to start (start-limit-hit, 0 automatic restarts; seen in the migration chain's rolling deploy)."""
    import yaml

    handlers = yaml.safe_load((ROOT / "ansible" / "roles" / "engine" / "handlers" / "main.yml").read_text())
    on_restart = [h for h in handlers if "Restart the engine" in (h["name"], h.get("listen"))]
    first, restart = on_restart[0], next(h for h in on_restart if h["name"] == "Restart the engine")
    assert first["ansible.builtin.command"]["argv"] == ["systemctl", "reset-failed", "{{ specdeploy_facts.unit.name }}"]
    assert handlers.index(first) < handlers.index(restart)


def test_every_task_after_the_cli_runs_holding_the_host_and_gives_it_back_however_the_play_ends() -> None:
    """One deploy at a time (core.deploylock): after the CLI's install (which the lock needs), the
    engine play has one block; its first task takes the host's deploy lock, its `always` gives it back
    (a failed gate, a failed drain, a refused preflight included), and each task's verbs carry the
    run id the lock knows them by. Neither is ever a change: a re-run stays changed=0."""
    import yaml

    play = engine_play()
    cli, hold = play["tasks"]
    assert cli["ansible.builtin.import_role"] == {"name": "specdeploy"}
    assert hold["block"][0]["ansible.builtin.import_role"] == {"name": "specdeploy", "tasks_from": "deploylock.yml"}
    assert "always" in hold["block"][0]["tags"]
    (release,) = hold["always"]
    argv = release["ansible.builtin.command"]["argv"]
    assert argv[1:5] == ["deploy-lock", "release", "--run-id", "{{ specdeploy_run_id }}"]
    assert release["changed_when"] is False and "always" in release["tags"]
    (acquire,) = yaml.safe_load((ROOT / "ansible" / "roles" / "specdeploy" / "tasks" / "deploylock.yml").read_text())
    argv = acquire["ansible.builtin.command"]["argv"]
    assert argv[1:5] == ["deploy-lock", "acquire", "--run-id", "{{ specdeploy_run_id }}"]
    assert "{{ specdeploy_lock_wait_s }}" in argv and acquire["changed_when"] is False
    assert play["environment"]["SPECDEPLOY_DEPLOY_RUN"] == "{{ specdeploy_run_id | default('') }}"
