"""No silent minutes (issue 37, item 3): a long step prints, at least every period, its name, its time
so far and the last thing it observed; a play prints such a line while any task runs. Each check runs
real programs (a Python child, a real ansible-playbook on localhost) with the period shortened, and is
shown failing where the ticker is taken away."""

from __future__ import annotations

import io
import os
import re
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest

from specdeploy.core import progress
from specdeploy.migrate import steps as migrate_steps

ROOT = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent
PERIOD = 0.3
TICK = re.compile(r"^\d\d:\d\d:\d\d (?P<name>.+?): (?P<elapsed>\d+s|\d+m\d\ds), last: (?P<last>.*)$")


@pytest.fixture(autouse=True)
def _short_period(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(progress.PERIOD_ENV, str(PERIOD))


def _collect() -> tuple[list[str], callable]:
    lines: list[str] = []
    return lines, lines.append


def test_a_step_prints_its_name_its_time_and_the_last_thing_it_observed_every_period() -> None:
    lines, write = _collect()
    with progress.Step("engine image", write=write) as step:
        while not lines:  # the first tick, however late a loaded machine wakes the ticker
            time.sleep(0.05)
        step.observe("STEP 7/9: COPY wheels /tmp/wheels")
        time.sleep(PERIOD * 2.5)
    ticks = [TICK.match(text) for text in lines[:-1]]
    assert len(ticks) >= 2 and all(ticks), lines
    assert ticks[0]["name"] == "engine image" and ticks[0]["last"] == "started, no output yet"
    assert ticks[-1]["last"] == "STEP 7/9: COPY wheels /tmp/wheels"
    assert re.fullmatch(r"\d\d:\d\d:\d\d engine image: done after \ds", lines[-1]), lines[-1]


def test_a_step_that_raises_says_it_failed_and_stops_ticking() -> None:
    lines, write = _collect()
    with pytest.raises(RuntimeError), progress.Step("hub image", write=write):
        raise RuntimeError("boom")
    assert lines[-1].endswith("hub image: failed after 0s"), lines
    count = len(lines)
    time.sleep(PERIOD * 2)
    assert len(lines) == count  # the ticker ended with the step


def test_observations_are_shown_as_one_clean_line() -> None:
    assert progress.clean("\x1b[1;32mGetting image source signatures\x1b[0m\n") == "Getting image source signatures"
    assert progress.clean("  10%\r  55%\r  98%  ") == "98%"  # a carriage-return bar: its last frame
    assert progress.clean("10%\r 55%\r") == "55%" and progress.clean("done\r\n") == "done"
    assert progress.clean("a\tb\x00c") == "a b c"
    long = progress.clean("x" * 500)
    assert len(long) == progress.LIMIT and long.endswith("…")
    assert progress.duration(42) == "42s" and progress.duration(185) == "3m05s" and progress.duration(3720) == "1h02m"


def test_the_period_is_never_longer_than_twenty_seconds(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(progress.PERIOD_ENV, "600")
    assert progress.period() == progress.PERIOD_S == 20.0
    monkeypatch.setenv(progress.PERIOD_ENV, "not a number")
    assert progress.period() == 20.0
    monkeypatch.setenv(progress.PERIOD_ENV, "-1")
    assert progress.period() == 20.0


def test_run_feeds_the_current_step_with_its_program_s_lines_and_keeps_a_failure_s_tail() -> None:
    lines, write = _collect()
    script = "import sys, time\nprint('I: Retrieving libc6 2.36', flush=True)\ntime.sleep(1.0)\nprint('I: Extracting')"
    with progress.Step("debootstrap", write=write):
        done = progress.run([sys.executable, "-c", script])
    assert done.stdout.splitlines() == ["I: Retrieving libc6 2.36", "I: Extracting"]
    assert any(line.endswith("last: I: Retrieving libc6 2.36") for line in lines), lines
    with pytest.raises(subprocess.CalledProcessError) as failed:
        progress.run([sys.executable, "-c", "import sys\nfor i in range(100): print(i)\nsys.exit(3)"], keep=5)
    assert failed.value.returncode == 3 and failed.value.output.split() == ["95", "96", "97", "98", "99"]


def test_follow_turns_lines_another_process_appends_to_a_log_into_observations(tmp_path: Path) -> None:
    log = tmp_path / "play.log"
    lines, write = _collect()
    script = textwrap.dedent(f"""
        import time
        with open({str(log)!r}, "w") as f:
            f.write("TASK [engine : Start the engine] ****\\n"); f.flush(); time.sleep(1.2)
            f.write("ok: [new-host]\\n"); f.flush(); time.sleep(0.8)
    """)
    with progress.Step("deploy.yml -l new-host", write=write), progress.follow(log, pick=migrate_steps._play_line):
        subprocess.run([sys.executable, "-c", script], check=True)
    observed = [TICK.match(text)["last"] for text in lines if TICK.match(text)]
    assert "TASK [engine : Start the engine]" in observed and observed[-1] == "ok: [new-host]", lines


def _child(body: str) -> list[str]:
    """A Python child that runs `body` with specdeploy's progress imported (the package's step as a
    program uses it), its stderr kept line by line."""
    return [sys.executable, "-c", "from specdeploy.core import progress\nimport subprocess, sys, time\n" + body]


def test_a_silent_program_inside_a_step_never_goes_a_period_without_a_line_and_without_the_step_it_does() -> None:
    silent = f"subprocess.run([sys.executable, '-c', 'import time; time.sleep({PERIOD * 8})'])"
    stepped = progress.timed_run(_child(f"with progress.step('engine start'):\n    {silent}\n"))
    assert stepped.returncode == 0, stepped.stderr
    # from the first line on (the child's own start is Python's, not the step's), never a period's gap
    # and more: the silent 8 periods are cut into ticks
    times = stepped.times
    assert max(b - a for a, b in zip(times, times[1:], strict=False)) < PERIOD * 3, (times, stepped.stderr)
    assert "engine start: 0s, last: started, no output yet" in stepped.stderr
    # the fault: the same wait without its step is one long silence, which the same check catches
    bare = progress.timed_run(_child(silent))
    assert bare.longest_silence >= PERIOD * 8


def test_longest_silence_counts_the_start_the_gaps_and_the_end_and_names_the_line_before_it() -> None:
    assert progress.longest_silence([1.0, 1.5, 4.0], 4.2) == pytest.approx(2.5)
    assert progress.longest_silence([], 7.0) == 7.0
    assert progress.longest_silence([0.1], 9.0) == pytest.approx(8.9)
    run = progress.Timed(0, "", "", [(1.0, "TASK [a]"), (1.5, "ok: [h]"), (4.0, "TASK [b]")], 4.2)
    assert run.silence_after() == (pytest.approx(2.5), "ok: [h]")
    assert progress.Timed(0, "", "", [], 3.0).silence_after() == (3.0, "(the start)")
    with pytest.raises(ValueError, match="not captured"):
        _ = progress.Timed(0, "", "", lines=None).longest_silence


def test_where_a_terminal_is_attached_the_step_is_a_live_rich_line_not_a_line_per_period(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    class Terminal(io.StringIO):
        def isatty(self) -> bool:
            return True

    screen = Terminal()
    monkeypatch.setattr(sys, "stderr", screen)
    monkeypatch.setenv("TERM", "xterm-256color")
    with progress.Step("models") as step:
        step.observe("real model: converting SmolLM2-135M-Instruct")
        time.sleep(PERIOD * 4)
    shown = screen.getvalue()
    assert "real model: converting SmolLM2-135M-Instruct" in shown  # the live line, redrawn
    assert "\x1b[" in shown  # drawn as a terminal display, not appended lines
    assert not TICK.search(shown.replace("\r", "\n"))  # no plain ticker lines
    assert re.search(r"models: done after \ds", shown)


def test_a_step_inside_another_reports_to_it_and_prints_nothing_itself() -> None:
    """The main job's "rehearsal host" step boots a host, itself a step: one line per period, naming both."""
    lines, write = _collect()
    with progress.step("prepare: rehearsal host", write=write):
        with progress.step("booting the test host specdeploy-rehearsal") as inner:
            inner.observe("systemd starting")
            time.sleep(PERIOD * 2.5)
        assert inner.parent is not None
    ticks = [TICK.match(text) for text in lines if TICK.match(text)]
    assert ticks and {t["name"] for t in ticks} == {"prepare: rehearsal host"}, lines
    assert ticks[-1]["last"] == "booting the test host specdeploy-rehearsal: systemd starting"
    assert [text for text in lines if "done after" in text] == [lines[-1]]  # the outer step's alone


@progress.stepped(lambda name, *_: f"booting {name}")
def _boot(name: str, seconds: float) -> str:
    progress.observe("waiting for sshd")
    time.sleep(seconds)
    return name


def test_a_stepped_function_is_a_step_named_from_its_arguments(capfd: pytest.CaptureFixture[str]) -> None:
    assert _boot("new-host", PERIOD * 2.5) == "new-host"
    shown = capfd.readouterr().err.splitlines()
    assert any(TICK.match(text) and text.endswith("booting new-host: 0s, last: waiting for sshd") for text in shown)
    assert shown[-1].endswith("booting new-host: done after 0s")


def test_steps_running_side_by_side_each_say_their_own_last_observation() -> None:
    lines, write = _collect()

    def one(name: str) -> None:
        with progress.step(name, write=write):
            progress.observe(f"{name} is busy")
            time.sleep(PERIOD * 2.5)

    threads = [threading.Thread(target=one, args=(name,)) for name in ("wheelhouse", "registry")]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    ticks = [TICK.match(text) for text in lines if TICK.match(text)]
    assert {t["name"] for t in ticks} == {"wheelhouse", "registry"}
    assert all(t["last"] == f"{t['name']} is busy" for t in ticks), lines


# --------------------------------------------------------------------------- Ansible


PLAY = """\
- name: Progress
  hosts: localhost
  connection: local
  gather_facts: false
  tasks:
    - name: Wait for a slow host command
      ansible.builtin.command: sleep 2.5
      changed_when: false
    - name: A loop of slow items
      ansible.builtin.command: "sleep {{ item }}"
      loop: [1.2, 0.2]
      changed_when: false
    - name: A retried check
      ansible.builtin.command: "python3 -c 'import sys; print(\\"engine not ready: 503\\"); sys.exit(1)'"
      register: probe
      until: probe.rc == 0
      retries: 2
      delay: 1
      changed_when: false
      ignore_errors: true
"""


def _play(tmp_path: Path, *, enabled: bool = True) -> progress.Timed:
    playbook = tmp_path / "play.yml"
    playbook.write_text(PLAY)
    cfg = ROOT / "ansible" / "ansible.cfg"
    if not enabled:  # the checkout's configuration less the line that enables the plugin
        kept = [line for line in cfg.read_text().splitlines() if not line.startswith("callbacks_enabled")]
        # the stdout callback's directory where the copy is read (a relative path is the config file's)
        kept = [f"callback_plugins = {cfg.parent / 'callback_plugins'}" if k.startswith("callback_plugins") else k
                for k in kept]  # fmt: skip
        cfg = tmp_path / "ansible.cfg"
        cfg.write_text("\n".join(kept) + "\n")
    env = {**os.environ, "ANSIBLE_CONFIG": str(cfg), "ANSIBLE_NOCOLOR": "1"}
    argv = [str(BIN / "ansible-playbook"), "-i", "localhost,", "-e", f"ansible_python_interpreter={sys.executable}",
            str(playbook)]  # fmt: skip
    return progress.timed_run(argv, cwd=ROOT / "ansible", env=env, timeout=120)


def test_a_play_prints_a_line_while_each_long_task_runs_naming_the_task_and_what_the_controller_saw(
    tmp_path: Path,
) -> None:
    played = _play(tmp_path)
    assert played.returncode == 0, played.stdout[-3000:] + played.stderr[-2000:]
    ticks = [m for m in map(TICK.match, played.stdout.splitlines()) if m]
    names = {t["name"] for t in ticks}
    assert {"TASK [Wait for a slow host command]", "TASK [A loop of slow items]", "TASK [A retried check]"} <= names
    last = {t["name"]: t["last"] for t in ticks}
    assert last["TASK [Wait for a slow host command]"] == "localhost: started; waiting on localhost"
    looped = [t["last"] for t in ticks if t["name"] == "TASK [A loop of slow items]"]
    assert any(said.startswith("localhost: item 1.2 done") for said in looped), looped
    assert "localhost: attempt" in last["TASK [A retried check]"], last
    assert (
        "engine not ready: 503" in last["TASK [A retried check]"]
        or "non-zero return code" in last["TASK [A retried check]"]
    )
    times = played.times  # from Ansible's first line on: its own start-up is not a task
    assert max(b - a for a, b in zip(times, times[1:], strict=False)) < 2.0, played.times
    # the default callback's own lines are all still there: the plugin adds, it changes nothing
    assert "TASK [Wait for a slow host command] ***" in played.stdout and "PLAY RECAP" in played.stdout


def test_without_the_progress_callback_the_same_play_goes_silent_for_a_whole_task(tmp_path: Path) -> None:
    played = _play(tmp_path, enabled=False)
    assert played.returncode == 0, played.stdout[-3000:]
    assert not any(map(TICK.match, played.stdout.splitlines()))
    times = played.times
    assert max(b - a for a, b in zip(times, times[1:], strict=False)) >= 2.4  # the slow task: the check above fails


def test_the_checkout_s_ansible_cfg_enables_the_progress_callback_for_every_play() -> None:
    cfg = (ROOT / "ansible" / "ansible.cfg").read_text()
    assert re.search(r"^callbacks_enabled\s*=.*\bspecdeploy_progress\b", cfg, re.M)
    assert re.search(r"^callback_plugins\s*=\s*callback_plugins$", cfg, re.M)
    assert (ROOT / "ansible" / "callback_plugins" / "specdeploy_progress.py").is_file()


def test_the_smoke_s_bars_tell_the_step_they_were_made_in_even_from_a_thread_pool_s_workers() -> None:
    """The gate as a unit has no terminal: its line says which check runs and how far it is. The lossless
    and concurrency checks advance their bars from worker threads, which start in no step."""
    from concurrent.futures import ThreadPoolExecutor

    from specdeploy.profile import load_profile
    from specdeploy.smoke.state import Smoke, SmokeOptions

    smoke = Smoke(load_profile("cpu-rehearsal"), "http://127.0.0.1:9", SmokeOptions(show_progress=False))
    lines, write = _collect()
    with progress.step("gate", write=write) as step, smoke.progress() as bars:
        task = bars.add_task("lossless re-score", total=3)
        assert step.last == "smoke: lossless re-score 0/3"
        with ThreadPoolExecutor(max_workers=2) as pool:
            list(pool.map(lambda _: bars.advance(task), range(3)))
        assert step.last == "smoke: lossless re-score 3/3"


def test_a_retry_says_its_attempt_of_all_and_the_last_line_it_printed_stdout_first() -> None:
    """The words of an Ansible retry, shared by the stdout callback and the progress plugin."""
    answer = {"attempts": 3, "retries": 961, "stdout": "x\nunit active; gate: 45s", "stderr": "e", "msg": "rc 75"}
    assert progress.retry_words(answer) == ("attempt 3 of 961", "unit active; gate: 45s")
    assert progress.retry_words({"attempts": 2, "stderr": "  \n", "msg": "non-zero return code"}) == (
        "attempt 2",
        "non-zero return code",
    )
    assert progress.retry_words({}) == ("attempt ?", "")


def test_a_failure_says_the_module_s_message_first_and_a_retry_its_output_first() -> None:
    """One helper reads an Ansible result's last line, in the order each caller asks: the progress plugin's
    failure line the module's message, then stderr, then stdout; a retry stdout first."""
    answer = {"msg": "non-zero return code", "stderr": "e1\nengine refused", "stdout": "out"}
    assert progress.last_said(answer, "msg", "stderr", "stdout") == "non-zero return code"
    assert progress.last_said(answer, "stdout", "stderr", "msg") == "out"
    assert (
        progress.last_said({"msg": " ", "stderr": "e1\nengine refused\n"}, "msg", "stderr", "stdout")
        == "engine refused"
    )
    assert progress.last_said({"rc": 1}, "msg", "stderr", "stdout") == ""
