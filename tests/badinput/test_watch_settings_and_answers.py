"""Bad input to `specdeploy watch run|show|check|units` (the light gate after the deploy).

Each case runs the real CLI in-process, as the timer's service or a person does, and checks what
docs/commands.md's bad-input table promises: exit 2 for bad input and for "could not test", the file,
field and found value named, a `fix:` line, no traceback. The host settings file
(<state>/watch-config.json) is checked before anything is judged; what the light gate keeps
itself (its counter snapshot) is never a reason to stop: a damaged one is reported and replaced.
The engine is a loopback stand-in for vLLM (tests/support/vllm_stub.py) where one is needed;
systemd is a stand-in `systemctl` that knows no unit, so nothing on this machine is asked or
changed.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from tests.support.badinput import (  # noqa: F401  no_systemctl: an autouse fixture
    Run,
    no_systemctl,
    write,
)
from tests.support.vllm_stub import VLLMStub, engines

HOOK_FIX = "watch_hook"
SETTINGS_FIX = "the watch role writes this file"


@pytest.fixture
def engine() -> Iterator[Callable[..., tuple[VLLMStub, str]]]:
    with engines() as start:
        yield start


def _state(tmp_path: Path, settings: object | None = None) -> Path:
    """A state directory whose light gate settings are `settings` (JSON, or raw text); by default
    a textfile in the temporary directory and no hook."""
    state = tmp_path / "state"
    (tmp_path / "tf").mkdir(exist_ok=True)
    value = {"textfile": str(tmp_path / "tf" / "specdeploy.prom")} if settings is None else settings
    write(state / "watch-config.json", value if isinstance(value, str) else json.dumps(value))
    return state


def _run(run: Run, state: Path, *args: object) -> object:
    return run("watch", "run", "--profile", "cpu-rehearsal", "--state-dir", state, "--readiness-timeout", "2", *args)


# --------------------------------------------------------------------------- the host settings


@pytest.mark.parametrize(
    ("settings", "names"),
    [
        ("{not json", ["light gate settings", "config.json", "not valid JSON", "line 1, column 2"]),
        ('["textfile"]', ["light gate settings", "expected a JSON object"]),
        ({"hooks": ["/bin/true"]}, ["unknown field(s) ['hooks']"]),
        ({"hook": "/bin/true"}, ["hook: expected a list of strings", "'/bin/true'"]),
        ({"hook": ["relative/page"]}, ["expected the program's absolute path first, found 'relative/page'"]),
        ({"hook": ["/nonexistent/page-oncall"]}, ["hook program /nonexistent/page-oncall is nothing"]),
        ({"hook": ["/bin/true", 7]}, ["hook: expected a list of strings"]),
        ({"textfile": "/tmp/specdeploy.txt"}, ["textfile: expected an absolute path ending in .prom"]),
        ({"textfile": "/nonexistent/dir/specdeploy.prom"}, ["its directory /nonexistent/dir is nothing"]),
        ({"hook_timeout_s": 0}, ["field hook_timeout_s: expected a number of seconds between 1 and 3600", "0"]),
        ({"hook_timeout_s": "60"}, ["field hook_timeout_s", "'60'"]),
        ({"hook_timeout_s": True}, ["field hook_timeout_s"]),
    ],
    ids=[
        "not-json", "a-list", "unknown-key", "hook-a-string", "hook-relative", "hook-missing", "hook-arg-a-number",
        "textfile-not-prom", "textfile-dir-missing", "timeout-zero", "timeout-a-string", "timeout-a-boolean",
    ],
)  # fmt: skip
def test_unusable_host_settings_are_refused_before_anything_is_judged(
    run: Run, tmp_path: Path, settings: object, names: list[str], snapshot: Callable
) -> None:
    usable = {"textfile": str(tmp_path / "tf" / "specdeploy.prom")}
    state = _state(tmp_path, usable | settings if isinstance(settings, dict) else settings)
    before = snapshot(state, tmp_path / "tf")
    checked = ("watch", "check", "--state-dir", state)
    judged = ("watch", "run", "--profile", "cpu-rehearsal", "--state-dir", state, "--endpoint", "http://127.0.0.1:9")
    fix = "install the hook program" if "is nothing" in names[0] and "hook" in names[0] else SETTINGS_FIX
    fix = "point watch_textfile at the collector's directory" if "its directory" in names[0] else fix
    for args in (checked, judged):
        run(*args).expect(2, *names, fix=fix)
    assert before.unchanged()  # no result, no textfile, no snapshot: nothing was judged


def test_a_hook_that_is_not_executable_is_named_with_the_fix(run: Run, tmp_path: Path) -> None:
    hook = write(tmp_path / "page-oncall", "#!/bin/sh\nexit 0\n")
    hook.chmod(0o644)
    state = _state(tmp_path, {"textfile": None, "hook": [str(hook)]})
    run("watch", "check", "--state-dir", state).expect(2, str(hook), "not executable", fix=f"chmod +x {hook}")


@pytest.mark.parametrize("flaw", ["writable-by-others", "owned-by-another-account", "directory-writable"])
def test_a_hook_another_account_could_replace_is_refused_before_it_runs(run: Run, tmp_path: Path, flaw: str) -> None:
    """The hook must be root's: a program (or a directory above it) that another account owns or may
    write (the light gate's, which runs it, included) is refused, naming the place and the fix (issue 35)."""
    ran = tmp_path / "ran"
    hook = write(tmp_path / "hooks" / "page-oncall", f"#!/bin/sh\ntouch {ran}\n")
    hook.chmod(0o755)
    place = hook
    if flaw == "writable-by-others":
        hook.chmod(0o757)
    elif flaw == "owned-by-another-account":
        os.chown(hook, 65534, 65534)
    else:
        place = hook.parent
        place.chmod(0o777)
    state = _state(tmp_path, {"textfile": None, "hook": [str(hook)]})
    run("watch", "check", "--state-dir", state).expect(2, str(place), "another account could replace",
                                                       fix=f"chown root:root {place}")  # fmt: skip
    assert not ran.exists()


def test_a_settings_file_that_is_a_directory_is_refused(run: Run, tmp_path: Path) -> None:
    state = tmp_path / "state"
    (state / "watch-config.json").mkdir(parents=True)
    run("watch", "check", "--state-dir", state).expect(2, "watch-config.json", "a directory", fix=SETTINGS_FIX)


def test_a_textfile_option_that_is_not_a_prom_file_is_refused(run: Run, tmp_path: Path) -> None:
    state = _state(tmp_path)
    _run(run, state, "--textfile", tmp_path / "metrics.txt").expect(2, "--textfile", "ending in .prom", fix="watch_")


# --------------------------------------------------------------------------- options and files


def test_a_readiness_timeout_of_zero_is_refused(run: Run, tmp_path: Path) -> None:
    run("watch", "run", "--state-dir", tmp_path, "--readiness-timeout", "0").expect(
        2, "--readiness-timeout", "found 0", fix="positive number of seconds"
    )


def test_a_state_dir_that_is_a_file_is_refused(run: Run, tmp_path: Path) -> None:
    state = write(tmp_path / "state", "not a directory")
    settings = write(tmp_path / "settings.json", json.dumps({"textfile": None}))
    run("watch", "run", "--profile", "cpu-rehearsal", "--state-dir", state, "--config", settings).expect(
        2, "--state-dir", "expected a directory, found a file", fix="state directory"
    )


def test_an_unknown_profile_is_refused(run: Run, tmp_path: Path) -> None:
    run("watch", "run", "--profile", "no-such-profile", "--state-dir", _state(tmp_path)).expect(
        2, "no-such-profile", fix="profile"
    )


def test_without_an_engine_unit_or_a_profile_it_could_not_test_and_says_so(run: Run, tmp_path: Path) -> None:
    """The timer's service names no profile: it reads the one the installed engine unit names. On
    a host without the unit the run is "could not test" with a result and a textfile that say so."""
    state = _state(tmp_path)
    answer = run("watch", "run", "--state-dir", state)
    answer.expect(2, "no engine unit is installed here", fix="deploy the stack first")
    result = json.loads((state / "watch" / "result.json").read_text())
    assert result["verdict"] == "error" and result["exit_code"] == 2
    assert 'specdeploy_watch_failed{profile=""} 1.0' in (tmp_path / "tf" / "specdeploy.prom").read_text()


def test_a_missing_key_file_is_could_not_test_naming_the_file(run: Run, tmp_path: Path) -> None:
    state = _state(tmp_path)
    answer = run("watch", "run", "--profile", "cpu-rehearsal-container", "--state-dir", state,
                 "--endpoint", "http://127.0.0.1:9")  # fmt: skip
    answer.expect(2, "specdeploy_api_key", "cannot be read", fix="engine stage")


def test_show_without_a_result_and_with_a_damaged_one(run: Run, tmp_path: Path) -> None:
    run("watch", "show", "--state-dir", tmp_path).expect(2, "no light gate has run", fix="specdeploy watch run")
    write(tmp_path / "watch" / "result.json", json.dumps(["pass"]))
    run("watch", "show", "--state-dir", tmp_path).expect(
        2, "result.json", "expected a JSON object", fix="specdeploy watch run` again"
    )


def test_units_into_a_file_instead_of_a_directory_are_refused(run: Run, tmp_path: Path) -> None:
    dest = write(tmp_path / "systemd", "a file")
    run("watch", "units", dest, "--profile", "cpu-rehearsal", "--state-dir", tmp_path).expect(
        2, "expected a directory, found a regular file", fix="unit directory"
    )


# --------------------------------------------------------------------------- what the engine answers


def test_garbage_at_metrics_is_could_not_test_and_the_hook_is_called(
    run: Run, tmp_path: Path, engine: Callable
) -> None:
    _, url = engine(overrides={"GET /metrics": (200, "<html>It works</html>")})
    calls = tmp_path / "calls"
    hook = write(tmp_path / "hook", f'#!/bin/sh\necho "$@" >> {calls}\n')
    hook.chmod(0o755)
    state = _state(tmp_path, {"textfile": str(tmp_path / "tf" / "specdeploy.prom"), "hook": [str(hook)]})
    _run(run, state, "--endpoint", url).expect(2, "/metrics", "expected Prometheus text", fix="base URL")
    assert calls.read_text().split() == [str(state / "watch" / "result.json")]


def test_a_damaged_counter_snapshot_is_reported_and_replaced_never_a_stop(
    run: Run, tmp_path: Path, engine: Callable
) -> None:
    """The light gate's own file: a truncated snapshot must not stop the watching for good."""
    _, url = engine()
    state = _state(tmp_path)
    write(state / "watch" / "counters.json", '{"taken_at": 17, "coun')
    answer = _run(run, state, "--endpoint", url)
    answer.expect(0, "counter snapshot", "not valid JSON", "measured since the engine started instead")
    kept = json.loads((state / "watch" / "counters.json").read_text())
    assert kept["counters"]["drafts"] > 0


def test_a_hook_that_hangs_is_stopped_at_its_deadline_and_the_verdict_stands(
    run: Run, tmp_path: Path, engine: Callable
) -> None:
    _, url = engine(version="0.31.0")
    hook = write(tmp_path / "hook", "#!/bin/sh\nsleep 60\n")
    hook.chmod(0o755)
    state = _state(tmp_path, {"textfile": None, "hook": [str(hook)], "hook_timeout_s": 1})
    answer = _run(run, state, "--endpoint", url)
    answer.expect(1, "0.31.0", "did not finish within 1 s", fix="specdeploy smoke --profile")
    result = json.loads((state / "watch" / "result.json").read_text())
    assert result["verdict"] == "fail" and "did not finish within 1 s" in result["hook"]["error"]
