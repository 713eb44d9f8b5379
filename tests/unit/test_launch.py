"""The engine launcher keeps the API key off every command line and out of the engine's output.

SGLang itself cannot run on these CPU machines, so a stand-in entry point plays the engine: a
module that behaves like SGLang's launch_server in the ways that matter here. It reads
`--api-key` from sys.argv (or VLLM_API_KEY from its environment, as vLLM does), logs its server
args with the key in them to stdout and stderr, and starts a child process with multiprocessing
(spawn) that prints the key too. What it received it records in a JSON file, never on stdout.
The launcher runs as a real subprocess, as the unit runs it: `python3 launch.py MODULE ARG ...`.
"""

from __future__ import annotations

import ast
import contextlib
import json
import os
import secrets
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from specdeploy.engine import launch

LAUNCHER = Path(launch.__file__)
TIMEOUT_S = 30

STANDIN = '''
"""Stand-in for SGLang's launch_server (see tests/unit/test_launch.py)."""
import argparse
import json
import logging
import multiprocessing
import os
import sys
import time
from pathlib import Path

HERE = Path(os.environ["STANDIN_DIR"])


def wait_for_go():
    deadline = time.monotonic() + 20
    while not (HERE / "go").exists():
        if time.monotonic() > deadline:
            raise SystemExit("stand-in: the test never said go")
        time.sleep(0.02)


def scheduler(key):
    """What SGLang's scheduler subprocess does with the server args: print them."""
    print(f"child: scheduler up, api_key={key}", flush=True)
    print(f"child: warning about {key}", file=sys.stderr, flush=True)
    (HERE / "ready.tmp").write_text(str(os.getpid()))
    (HERE / "ready.tmp").rename(HERE / "ready")
    wait_for_go()


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--port", type=int)
    parser.add_argument("--api-key")
    args = parser.parse_args()
    record = {"argv": sys.argv, "env": os.environ.get("VLLM_API_KEY"), "path": sys.path, "pid": os.getpid()}
    (HERE / "record.json").write_text(json.dumps(record))
    key = args.api_key or os.environ.get("VLLM_API_KEY")
    logging.basicConfig(level=logging.INFO, stream=sys.stderr, format="%(levelname)s %(message)s")
    print(f"server_args=ServerArgs(port={args.port}, api_key={args.api_key!r})")
    logging.info("serving with key %s", key)
    if os.environ.get("STANDIN_SPLIT"):
        sys.stdout.write("split: " + key[:10])
        sys.stdout.flush()
        time.sleep(0.2)
        sys.stdout.write(key[10:] + " end\\n")
        sys.stdout.flush()
    if os.environ.get("STANDIN_CHILD"):
        child = multiprocessing.get_context("spawn").Process(target=scheduler, args=(key,))
        child.start()
        child.join(30)
    sys.exit(int(os.environ.get("STANDIN_EXIT", "0")))


if __name__ == "__main__":
    main()
'''


@pytest.fixture
def standin(tmp_path: Path) -> Path:
    """tmp_path holding the stand-in engine module `standin_engine` (and, later, what it records)."""
    (tmp_path / "standin_engine.py").write_text(STANDIN)
    return tmp_path


def _env(directory: Path, **settings: str) -> dict[str, str]:
    """This process's environment without any key setting of its own, plus `settings`."""
    drop = {*launch.KEY_VARIABLES, launch.CREDENTIALS_DIRECTORY_ENV, "VLLM_API_KEY"}
    env = {name: value for name, value in os.environ.items() if name not in drop}
    return {**env, "PYTHONPATH": str(directory), "STANDIN_DIR": str(directory), **settings}


def _argv() -> list[str]:
    return [sys.executable, str(LAUNCHER), "standin_engine", "--port", "1"]


def _launch(directory: Path, **settings: str) -> subprocess.CompletedProcess[str]:
    env = _env(directory, **settings)
    return subprocess.run(_argv(), cwd=directory, env=env, capture_output=True, text=True, timeout=TIMEOUT_S)


def _record(directory: Path) -> dict[str, Any]:
    return json.loads((directory / "record.json").read_text())


def _key_file(directory: Path, key: str) -> Path:
    path = directory / "api-key"
    path.write_text(f"  {key}\n")  # as an editor or `echo` leaves it: whitespace around the key
    return path


def _wait_ready(directory: Path, process: subprocess.Popen[str]) -> int:
    """The pid of the stand-in's spawn child once it has printed the key and waits to be let go."""
    deadline = time.monotonic() + TIMEOUT_S
    while not (directory / "ready").exists():
        assert process.poll() is None, f"the launcher exited early: {process.communicate()}"
        assert time.monotonic() < deadline, "the stand-in's child never got ready"
        time.sleep(0.02)
    return int((directory / "ready").read_text())


def _cmdlines() -> dict[int, bytes]:
    """Every process's command line, as `ps` shows it to any user of the host."""
    found = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            with contextlib.suppress(OSError):  # gone meanwhile
                found[int(entry.name)] = (entry / "cmdline").read_bytes()
    return found


def test_the_key_reaches_sglang_as_its_flag_but_never_any_command_line(standin: Path) -> None:
    """ARG mode (SGLang reads only `--api-key`): the flag is appended to sys.argv in-process, so
    while the engine and its spawn child run, no /proc/*/cmdline holds the key, and what both
    processes print to stdout and stderr reaches the journal with `***` in its place."""
    key = secrets.token_hex(16)
    settings = {launch.KEY_FILE_ENV: str(_key_file(standin, key)), launch.KEY_ARG_ENV: "--api-key"}
    env = _env(standin, STANDIN_CHILD="1", **settings)
    with subprocess.Popen(
        _argv(), cwd=standin, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    ) as p:
        try:
            child = _wait_ready(standin, p)
            cmdlines = _cmdlines()
        finally:
            (standin / "go").touch()
        out, err = p.communicate(timeout=TIMEOUT_S)
    assert {p.pid, child} <= cmdlines.keys()  # the scan saw the engine and its child alive
    assert [pid for pid, cmdline in cmdlines.items() if key.encode() in cmdline] == []
    assert p.returncode == 0, err
    assert _record(standin)["argv"][1:] == ["--port", "1", "--api-key", key]
    assert key not in out + err
    assert "server_args=ServerArgs(port=1, api_key='***')" in out
    assert "INFO serving with key ***" in err
    assert "child: scheduler up, api_key=***" in out and "child: warning about ***" in err


def test_the_key_reaches_vllm_in_its_environment_from_a_systemd_credential(standin: Path) -> None:
    """ENV mode with a credential, as `LoadCredential=` hands it over: the engine finds
    VLLM_API_KEY in os.environ, its argv stays without the key, and its log shows `***`."""
    key = secrets.token_hex(16)
    credentials = standin / "credentials"
    credentials.mkdir()
    (credentials / "vllm-api-key").write_text(key + "\n")
    result = _launch(
        standin,
        **{
            launch.KEY_CREDENTIAL_ENV: "vllm-api-key",
            launch.CREDENTIALS_DIRECTORY_ENV: str(credentials),
            launch.KEY_ENV_ENV: "VLLM_API_KEY",
        },
    )
    assert result.returncode == 0, result.stderr
    record = _record(standin)
    assert record["env"] == key
    assert record["argv"][1:] == ["--port", "1"]
    assert key not in result.stdout + result.stderr and "INFO serving with key ***" in result.stderr


def test_a_key_split_across_two_writes_of_one_line_is_still_redacted(standin: Path) -> None:
    """The engine writes part of the key, flushes, waits and writes the rest: the redactor reads
    them apart, and masks the key only because it holds back a line until its end."""
    key = secrets.token_hex(16)
    settings = {launch.KEY_FILE_ENV: str(_key_file(standin, key)), launch.KEY_ARG_ENV: "--api-key"}
    result = _launch(standin, STANDIN_SPLIT="1", **settings)
    assert result.returncode == 0, result.stderr
    assert key not in result.stdout and key[:10] not in result.stdout
    assert "split: *** end\n" in result.stdout


@pytest.mark.parametrize("chunk", [997, 4096, launch.READ_SIZE])
def test_a_line_longer_than_the_carry_limit_is_written_before_its_end_with_the_key_still_masked(chunk: int) -> None:
    """Progress output may never end a line: past 64 KiB the redactor writes it out, holding back
    only a key's length less one, so a key cut by the read boundary is still masked."""
    key = secrets.token_hex(16).encode()
    stream = b"x" * (launch.CARRY_LIMIT - 5) + key + b"y" * launch.CARRY_LIMIT + key + b"z\n" + key
    out, carry, longest = b"", b"", 0
    for start in range(0, len(stream), chunk):
        written, carry = launch.redact(carry + stream[start : start + chunk], key)
        out, longest = out + written, max(longest, len(carry))
    out += launch.redact(carry, key, final=True)[0]
    assert out == stream.replace(key, launch.MASK)
    assert longest <= launch.CARRY_LIMIT + chunk


@pytest.mark.parametrize("content", [None, "", " \n\t\n"], ids=["missing", "empty", "whitespace"])
def test_a_missing_or_empty_key_file_stops_the_launch_with_one_line_naming_it(
    standin: Path, content: str | None
) -> None:
    """Without its key the engine would serve unauthenticated: exit 78 with one line that names
    the file and what was found there, and the engine never starts."""
    path = standin / "api-key"
    if content is not None:
        path.write_text(content)
    result = _launch(standin, **{launch.KEY_FILE_ENV: str(path), launch.KEY_ARG_ENV: "--api-key"})
    assert result.returncode == launch.EXIT_CONFIG
    assert result.stderr.startswith("specdeploy launch: ") and result.stderr.count("\n") == 1
    assert str(path) in result.stderr and "Traceback" not in result.stderr
    assert ("is missing" if content is None else "is empty") in result.stderr
    assert "without its key" in result.stderr
    assert not (standin / "record.json").exists() and result.stdout == ""


@pytest.mark.parametrize(
    ("settings", "named"),
    [
        ({launch.KEY_FILE_ENV: "KEYFILE"}, [launch.KEY_FILE_ENV, launch.KEY_ENV_ENV, launch.KEY_ARG_ENV]),
        (
            {launch.KEY_FILE_ENV: "KEYFILE", launch.KEY_ENV_ENV: "VLLM_API_KEY", launch.KEY_ARG_ENV: "--api-key"},
            [launch.KEY_ENV_ENV, launch.KEY_ARG_ENV, "VLLM_API_KEY", "--api-key"],
        ),
        ({launch.KEY_ARG_ENV: "--api-key"}, [launch.KEY_FILE_ENV, launch.KEY_CREDENTIAL_ENV, "--api-key"]),
        (
            {launch.KEY_CREDENTIAL_ENV: "vllm-api-key", launch.KEY_ENV_ENV: "VLLM_API_KEY"},
            [launch.KEY_CREDENTIAL_ENV, launch.CREDENTIALS_DIRECTORY_ENV, "LoadCredential=vllm-api-key"],
        ),
    ],
    ids=["file-without-destination", "env-and-arg", "arg-without-source", "credential-without-directory"],
)
def test_inconsistent_key_settings_stop_the_launch_naming_the_variables(
    standin: Path, settings: dict[str, str], named: list[str]
) -> None:
    """A unit that names the key's source but not its destination (or the other way round, or
    both destinations) exits 78 with one line naming the variables and their values."""
    key = secrets.token_hex(16)
    key_file = str(_key_file(standin, key))
    result = _launch(standin, **{name: key_file if value == "KEYFILE" else value for name, value in settings.items()})
    assert result.returncode == launch.EXIT_CONFIG
    assert result.stderr.startswith("specdeploy launch: ") and result.stderr.count("\n") == 1
    assert all(name in result.stderr for name in named), result.stderr
    assert "Traceback" not in result.stderr and key not in result.stderr
    assert not (standin / "record.json").exists()


def test_without_key_settings_the_module_just_runs_and_its_exit_status_propagates(standin: Path) -> None:
    """No SPECDEPLOY_KEY_*: the module runs as `python -m` would run it, with its arguments, its
    output untouched, and its sys.exit(3) is the launcher's exit status."""
    result = _launch(standin, STANDIN_EXIT="3")
    assert result.returncode == 3, result.stderr
    assert _record(standin)["argv"][1:] == ["--port", "1"]
    assert "server_args=ServerArgs(port=1, api_key=None)" in result.stdout
    assert "INFO serving with key None" in result.stderr


def test_an_engine_module_the_interpreter_lacks_stops_the_launch_with_one_line(tmp_path: Path) -> None:
    """A unit naming the wrong python (one without the engine) is told so in one line, exit 78."""
    argv = [sys.executable, str(LAUNCHER), "no_such_engine.entrypoint", "--port", "1"]
    result = subprocess.run(argv, cwd=tmp_path, env=_env(tmp_path), capture_output=True, text=True, timeout=TIMEOUT_S)
    assert result.returncode == launch.EXIT_CONFIG
    assert result.stderr == f"specdeploy launch: no module no_such_engine.entrypoint under {sys.executable}; " + (
        "name the interpreter the engine is installed in\n"
    )


def test_the_launchers_own_directory_is_not_on_the_engines_sys_path(standin: Path) -> None:
    """Its siblings (args.py, venv.py, units.py ...) must not shadow the engine's modules: the
    engine package's directory is gone from sys.path and the working directory stands first."""
    key = secrets.token_hex(16)
    result = _launch(standin, **{launch.KEY_FILE_ENV: str(_key_file(standin, key)), launch.KEY_ENV_ENV: "X_KEY"})
    assert result.returncode == 0, result.stderr
    path = [os.path.realpath(entry or os.curdir) for entry in _record(standin)["path"]]
    assert os.path.realpath(LAUNCHER.parent) not in path
    assert path[0] == os.path.realpath(standin)


def test_the_launcher_imports_only_the_standard_library() -> None:
    """It runs under the engine's interpreter, where neither specdeploy nor its dependencies are."""
    tree = ast.parse(LAUNCHER.read_text())
    imported = {alias.name for node in ast.walk(tree) if isinstance(node, ast.Import) for alias in node.names}
    imported |= {node.module or "" for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)}
    outside = {name for name in imported if name.split(".")[0] not in sys.stdlib_module_names | {"__future__"}}
    assert outside == set()
