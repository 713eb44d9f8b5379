"""The canary search that the secret-leak tests rely on (tests/support/canary.py). Failure
prevented: a leak test that passes because nothing was recorded or because its search
cannot find a leak. A real ansible-playbook runs against a test host with the argv
recording on; a clean run must leave zero hits (and a non-empty recording), and a control
run that leaks a canary into each place on purpose must be found in every place."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from tests.support import canary
from tests.support.testhost import Host, boot_host, host_image

pytestmark = [pytest.mark.testhost]

ANSIBLE_CFG = Path(__file__).resolve().parents[2] / "ansible" / "ansible.cfg"  # pipelining, as the deploy
CLEAN_IMAGE = "localhost/specdeploy-canary/clean"
LEAK_IMAGE = "localhost/specdeploy-canary/leak"


@dataclass(frozen=True)
class Bench:
    host: Host
    workdir: Path
    inventory: Path
    ssh_log: Path

    def play(self, name: str, tasks: str, variables: dict[str, str], canaries: list[str]) -> Path:
        """Run a play of `tasks` with ansible-playbook -vvv; its output is the returned log."""
        play = self.workdir / f"{name}.yml"
        play.write_text(f"- hosts: canary\n  gather_facts: false\n  tasks:\n{tasks}")
        extra = self.workdir / f"{name}-vars.json"  # a file: no canary on the controller's argv
        extra.write_text(json.dumps(variables))
        extra.chmod(0o600)
        log = self.workdir / f"ansible-{name}.log"
        env = {
            **os.environ,
            "ANSIBLE_CONFIG": str(ANSIBLE_CFG),
            "ANSIBLE_SSH_CONTROL_PATH_DIR": str(self.workdir / "cp"),  # no master left by an earlier host
            "ANSIBLE_NOCOLOR": "1",
        }
        ansible_playbook = Path(sys.executable).parent / "ansible-playbook"
        with log.open("w") as out:
            done = subprocess.run(
                [str(ansible_playbook), "-vvv", "-i", str(self.inventory), "-e", f"@{extra}", str(play)],
                stdout=out, stderr=subprocess.STDOUT, env=env, timeout=300,
            )  # fmt: skip
        assert done.returncode == 0, canary.mask(log.read_text()[-3000:], canaries)
        return log


@pytest.fixture(scope="module")
def bench(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Bench]:
    """A trixie test host with the argv recording installed and podman on vfs storage (the
    only driver that works inside the unprivileged test host container), reached by
    Ansible through the logging ssh."""
    workdir = tmp_path_factory.mktemp("canary")
    with boot_host("specdeploy-canary-host", 2330, workdir, image=host_image()) as host:
        variables = canary.install_argv_logger(host)
        host.ssh(
            'mkdir -p /etc/containers && printf \'[storage]\\ndriver = "vfs"\\n'
            'runroot = "/run/containers/storage"\\ngraphroot = "/var/lib/containers/storage"\\n\''
            " > /etc/containers/storage.conf"
        )
        wrapper = canary.ssh_wrapper(workdir)
        inventory = workdir / "hosts.ini"
        inventory.write_text(f"[canary]\n{host.inventory_line()} {variables} ansible_ssh_executable={wrapper}\n")
        yield Bench(host, workdir, inventory, workdir / "ssh-argv.log")


CLEAN_TASKS = f"""\
    - name: Import an image of an empty root filesystem (a shell command line)
      ansible.builtin.shell: tar -cf - -T /dev/null | podman import --change ENV=GREETING=hello - {CLEAN_IMAGE}
    - name: Read the kernel release (an argv the command module starts)
      ansible.builtin.command:
        argv: [uname, -r]
"""


def test_a_run_without_the_canaries_leaves_no_hit_and_a_recording_of_every_command(bench: Bench) -> None:
    canaries = [canary.new_canary("hf_"), canary.new_canary("key_")]
    log = bench.play("clean", CLEAN_TASKS, {}, canaries)

    result = canary.search(bench.host, canaries, controller_logs=[bench.ssh_log, log], images=[CLEAN_IMAGE])
    assert list(result.hits) == [*canary.HOST_PLACES, "ssh-argv.log", log.name]
    assert result.total == 0 and not result.unsearched, result.describe()
    again = canary.search(bench.host, canaries, controller_logs=[bench.ssh_log, log], images=[CLEAN_IMAGE])
    assert again.total == 0, "the search itself left the canaries somewhere:\n" + again.describe()

    # The recording is not empty: it holds what the play ran (the module launches through the
    # shell executable, the shell task's command line, the command module's argv).
    records = canary.read_argv_log(bench.host)
    shells = [" ".join(record["argv"][1:]) for record in records if record["event"] == "shell"]
    assert any(command.startswith(f"-c {canary.PYTHON_LOGGER}") for command in shells), shells
    assert any("podman import" in command and CLEAN_IMAGE in command for command in shells), shells
    assert any(record["argv"] == ["uname", "-r"] for record in records if record["event"] != "shell"), records
    sent = [json.loads(line)["argv"] for line in bench.ssh_log.read_text().splitlines()]
    assert any(argv[-1].startswith(canary.SHELL_LOGGER) for argv in sent), sent


# Each place gets its own canary, so that each place is shown to find its own leak.
LEAK_TASKS = """\
    - name: argv-log (the command module's argv, recorded by the Python audit hook)
      ansible.builtin.command:
        argv: [/bin/true, "{{ leak['argv-log'] }}"]
    - name: ssh-argv (environment goes on the remote shell's command line, ansible/ansible#13664)
      ansible.builtin.command:
        argv: [/bin/true]
      environment:
        SPECDEPLOY_CANARY: "{{ leak['ssh-argv.log'] }}"
    - name: journal
      ansible.builtin.command:
        argv: [logger, -t, specdeploy-canary, "{{ leak['journal'] }}"]
    - name: files-readable-by-others
      ansible.builtin.copy:
        content: "token = {{ leak['files-readable-by-others'] }}\\n"
        dest: /etc/specdeploy-canary.conf
        mode: "0644"
    - name: "unit-files, root-only: found regardless of mode"
      ansible.builtin.copy:
        content: "[Service]\\nEnvironment=TOKEN={{ leak['unit-files'] }}\\nExecStart=/bin/true\\n"
        dest: /etc/systemd/system/specdeploy-canary.service
        mode: "0600"
    - name: image-history
      ansible.builtin.shell: >-
        tar -cf - -T /dev/null | podman import --change "ENV=SPECDEPLOY_CANARY={{ leak['image-history'] }}"
        --change "LABEL=org.example.canary={{ leak['image-history'] }}" - {{ leak_image }}
    - name: process-list (outlives the play)
      ansible.builtin.command:
        argv: [systemd-run, --unit, specdeploy-canary-sleep, /bin/sh, -c, "sleep 300; :", sh,
               "{{ leak['process-list'] }}"]
    - name: the -vvv controller log
      ansible.builtin.debug:
        msg: "{{ leak['ansible-control.log'] }}"
"""


def test_a_canary_leaked_on_purpose_into_each_place_is_found_in_each_place(bench: Bench) -> None:
    places = [*canary.HOST_PLACES, "ssh-argv.log", "ansible-control.log"]
    leak = {place: canary.new_canary(f"{place.split('.')[0].replace('-', '_')}_") for place in places}
    canaries = list(leak.values())
    log = bench.play("control", LEAK_TASKS, {"leak": leak, "leak_image": LEAK_IMAGE}, canaries)

    result = canary.search(bench.host, canaries, controller_logs=[bench.ssh_log, log], images=[LEAK_IMAGE])
    assert not result.unsearched, result.describe()
    missed = [place for index, place in enumerate(places) if f"<canary-{index}>" not in "\n".join(result.hits[place])]
    assert not missed, f"no own canary found in {missed}:\n{result.describe()}"
    # The shell executable's record too (the environment prefix): both halves of the recording work.
    env_prefix = f"<canary-{places.index('ssh-argv.log')}>"
    assert any(env_prefix in hit for hit in result.hits["argv-log"]), result.describe()
    assert not [secret for secret in canaries if secret in result.describe()]  # reports mask them
