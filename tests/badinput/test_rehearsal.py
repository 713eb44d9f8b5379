"""Bad input to `rehearsal up|down|status|check-dflash|fixtures|deploy` (issue 20: D17).

Arguments and the environment are checked before anything heavy starts: stack names, option
values, a `--workdir`/`--export` that cannot be a directory, a `$SPECDEPLOY_CACHE` that is a
regular file (or under one), a stack's state file that is damaged, a controller without podman
or ansible-core. Nothing heavy ever runs: the engine install, the stack start and stop, the
DFlash proof, the fixture build and the main job are tripwires (a tripped one answers exit 70,
failing the case), and so is `os.killpg` — a damaged state file's pid is never signalled. A FIFO
runs as a subprocess with a deadline: it must be refused, never read.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
from tests.support.badinput import Run, Snapshot, write

from specdeploy.rehearsal.stacks import STACKS

CACHE_FIX = "point $SPECDEPLOY_CACHE at a directory"
GOOD_STATE = '{"pid": 4242, "url": "http://127.0.0.1:8100", "profile": "cpu-rehearsal", "argv": ["vllm"]}'


@pytest.fixture
def cache(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Path:
    """Tripwires in place of every heavy step the rehearsal commands take: an argument error
    must be reported before any of them. Returns the cache directory the commands use."""
    from specdeploy.rehearsal import archive, deploy, install, proof, stacks

    def tripwire(*_: object, **__: object) -> None:
        raise RuntimeError("a heavy step ran before the arguments were checked")

    heavy = (
        (install, "ensure_engine"), (stacks, "start"), (stacks, "stop"), (proof, "run_dflash_proof"),
        (archive, "build_all"), (archive, "export"), (deploy, "main_job"), (os, "killpg"),
    )  # fmt: skip
    for module, name in heavy:
        monkeypatch.setattr(module, name, tripwire)
    monkeypatch.setenv("SPECDEPLOY_CACHE", str(tmp_path / "cache"))
    return tmp_path / "cache"


def state(cache: Path, stack: str, content: str | bytes) -> Path:
    """Stack `stack`'s state file (what `rehearsal up` records) holding `content`."""
    return write(cache / "runs" / stack / "state.json", content)


def cache_file(tmp_path: Path) -> Path:
    """A $SPECDEPLOY_CACHE that is a regular file (a typo'd path, a file left where the cache goes)."""
    return write(tmp_path / "cache-file", "not a directory\n")


# =========================================================================== rehearsal up


@pytest.mark.usefixtures("cache")
def test_rehearsal_up_refuses_an_unknown_stack_before_installing_or_starting_anything(run: Run) -> None:
    run("rehearsal", "up", "healthy", "bogus").expect(2, "'bogus'", "nothing was started", fix="known stacks: healthy")


@pytest.mark.usefixtures("cache")
@pytest.mark.parametrize("timeout", ["0", "nan"], ids=["zero", "nan"])
def test_rehearsal_up_refuses_a_timeout_that_is_no_wait(run: Run, timeout: str) -> None:
    run("rehearsal", "up", "--timeout", timeout).expect(2, "--timeout", "seconds > 0", fix="--timeout SECONDS")


def test_rehearsal_up_refuses_a_truncated_state_file_before_installing_anything(
    run: Run, cache: Path, snapshot: Callable[..., Snapshot]
) -> None:
    """It was read with json.loads: a traceback, after the engine install had run."""
    record = state(cache, "healthy", GOOD_STATE[:20])
    before = snapshot(cache)
    run("rehearsal", "up").expect(2, str(record), "not valid JSON", "nothing was started", fix=f"remove {record}")
    before.unchanged()


def test_rehearsal_up_refuses_a_state_file_whose_pid_is_init(
    run: Run, cache: Path, snapshot: Callable[..., Snapshot]
) -> None:
    """`up` stops a stack that is not ready before starting it: a pid of 1 would be killpg'd."""
    record = state(cache, "healthy", GOOD_STATE.replace("4242", "1"))
    before = snapshot(cache)
    run("rehearsal", "up", "healthy").expect(2, str(record), "field pid", "found 1", fix=f"remove {record}")
    before.unchanged()


@pytest.mark.usefixtures("cache")
def test_rehearsal_up_with_a_cache_that_is_a_regular_file_is_refused_before_installing_anything(
    run: Run, tmp_path: Path
) -> None:
    """It ended in a FileExistsError traceback from whichever step first made the cache."""
    file = cache_file(tmp_path)
    run("rehearsal", "up", env={"SPECDEPLOY_CACHE": str(file)}).expect(
        2, "$SPECDEPLOY_CACHE", str(file), "found a regular file", fix=CACHE_FIX
    )
    assert file.read_text() == "not a directory\n"


# =========================================================================== rehearsal down


@pytest.mark.usefixtures("cache")
def test_rehearsal_down_refuses_names_together_with_all(run: Run) -> None:
    run("rehearsal", "down", "--all", "healthy").expect(2, "--all", "healthy", "nothing was stopped", fix="down --all")


@pytest.mark.usefixtures("cache")
def test_rehearsal_down_refuses_an_unknown_stack_before_stopping_any(run: Run) -> None:
    run("rehearsal", "down", "healthy", "helthy").expect(
        2, "'helthy'", "nothing was started or stopped", fix="known stacks: healthy, dflash-random"
    )


@pytest.mark.parametrize(
    ("pid", "shown"),
    [("0", "found 0"), ("-1", "found -1"), ('"4242"', 'found "4242"'), ("true", "found true"), ("null", "found null")],
    ids=["own-process-group", "every-process", "a-string", "a-boolean", "null"],
)
def test_rehearsal_down_never_signals_the_pid_of_a_damaged_state_file(
    run: Run, cache: Path, snapshot: Callable[..., Snapshot], pid: str, shown: str
) -> None:
    """`os.killpg(0)` signals this process's own group, `-1` every process it may: stop() read the
    pid unchecked. The state file stays (it is the only record of what may still run)."""
    record = state(cache, "healthy", GOOD_STATE.replace("4242", pid))
    before = snapshot(cache)
    run("rehearsal", "down", "healthy").expect(2, str(record), "field pid", shown, fix=f"remove {record}")
    before.unchanged()


def test_rehearsal_down_all_checks_every_state_file_before_stopping_any(
    run: Run, cache: Path, snapshot: Callable[..., Snapshot]
) -> None:
    """A damaged state of the last stack refuses the whole `down --all`: the stop tripwire of the
    first (healthy, whose state is good) is never reached."""
    state(cache, "healthy", GOOD_STATE)
    record = state(cache, "no-spec", "[]")
    before = snapshot(cache)
    run("rehearsal", "down", "--all").expect(2, str(record), "expected a JSON object", fix=f"remove {record}")
    before.unchanged()


def test_rehearsal_down_with_a_state_file_that_is_a_fifo_is_refused_without_blocking(
    run_process: Run, cache: Path
) -> None:
    record = cache / "runs" / "healthy" / "state.json"
    record.parent.mkdir(parents=True)
    os.mkfifo(record)
    run_process("rehearsal", "down", "healthy").expect(2, str(record), "a FIFO", fix=f"remove {record}")
    assert record.is_fifo()


@pytest.mark.usefixtures("cache")
def test_rehearsal_down_with_a_cache_under_a_regular_file_is_refused(run: Run, tmp_path: Path) -> None:
    file = cache_file(tmp_path)
    run("rehearsal", "down", env={"SPECDEPLOY_CACHE": str(file / "specdeploy")}).expect(
        2, str(file / "specdeploy"), f"found a regular file at {file}", fix=CACHE_FIX
    )


# =========================================================================== rehearsal status


def test_rehearsal_status_names_a_truncated_state_file_and_still_shows_every_stack(
    run: Run, cache: Path, snapshot: Callable[..., Snapshot]
) -> None:
    """It was read with json.loads: a traceback instead of the table."""
    record = state(cache, "dflash-random", GOOD_STATE[:30])
    before = snapshot(cache)
    answer = run("rehearsal", "status").expect(2, str(record), "not valid JSON", fix=f"remove {record}")
    rows = {c[1].strip(): c[2].strip() for line in answer.stdout.splitlines() if len(c := line.split("│")) > 3}
    assert rows["dflash-random"] == "damaged" and rows["healthy"] == "down", rows
    assert set(STACKS) <= set(rows), rows
    before.unchanged()


@pytest.mark.parametrize(
    ("content", "names"),
    [
        ('["pid", 4242]', ("expected a JSON object", "found list")),
        (GOOD_STATE.replace("http://127.0.0.1:8100", "file:///etc/passwd"), ("field url", '"file:///etc/passwd"')),
        (GOOD_STATE.replace('"cpu-rehearsal"', '""'), ("field profile",)),
    ],
    ids=["a-list", "not-an-http-url", "empty-profile"],
)
def test_rehearsal_status_refuses_a_state_file_of_another_shape(
    run: Run, cache: Path, snapshot: Callable[..., Snapshot], content: str, names: tuple[str, ...]
) -> None:
    record = state(cache, "healthy", content)
    before = snapshot(cache)
    run("rehearsal", "status", "--json").expect(2, str(record), *names, '"state": "damaged"', fix=f"remove {record}")
    before.unchanged()


def test_rehearsal_status_with_a_state_file_that_is_a_directory_says_so(
    run: Run, cache: Path, snapshot: Callable[..., Snapshot]
) -> None:
    record = cache / "runs" / "healthy" / "state.json"
    record.mkdir(parents=True)
    before = snapshot(cache)
    run("rehearsal", "status").expect(2, str(record), "found a directory", fix=f"remove {record}")
    before.unchanged()


@pytest.mark.usefixtures("cache")
def test_rehearsal_status_with_a_cache_that_is_a_regular_file_is_refused(run: Run, tmp_path: Path) -> None:
    file = cache_file(tmp_path)
    run("rehearsal", "status", env={"SPECDEPLOY_CACHE": str(file)}).expect(
        2, "$SPECDEPLOY_CACHE", str(file), "found a regular file", fix=CACHE_FIX
    )
    assert file.read_text() == "not a directory\n"


# =========================================================================== rehearsal check-dflash


@pytest.mark.usefixtures("cache")
def test_rehearsal_check_dflash_refuses_a_workdir_that_is_a_file(run: Run, tmp_path: Path) -> None:
    workdir = write(tmp_path / "workdir", "a file\n")
    run("rehearsal", "check-dflash", "--workdir", workdir).expect(
        2, "--workdir", str(workdir), "a regular file", fix="pass a directory"
    )
    assert workdir.read_text() == "a file\n"


@pytest.mark.usefixtures("cache")
def test_rehearsal_check_dflash_refuses_a_workdir_under_a_file(run: Run, tmp_path: Path) -> None:
    file = write(tmp_path / "file", "a file\n")
    run("rehearsal", "check-dflash", "--workdir", file / "run").expect(
        2, "--workdir", f"found a regular file at {file}", "nothing was started", fix="pass a directory as --workdir"
    )
    assert file.read_text() == "a file\n"


@pytest.mark.usefixtures("cache")
@pytest.mark.parametrize("kind", ["dangling-link", "fifo"])
def test_rehearsal_check_dflash_refuses_a_workdir_that_is_neither_file_nor_directory(
    run: Run, tmp_path: Path, kind: str
) -> None:
    """A dangling link failed the proof's mkdir with FileExistsError, after the fixtures were built."""
    workdir = tmp_path / "workdir"
    if kind == "dangling-link":
        workdir.symlink_to(tmp_path / "gone")
    else:
        os.mkfifo(workdir)
    run("rehearsal", "check-dflash", "--workdir", workdir).expect(
        2, str(workdir), "something that is not a directory", fix="leave it out for the default"
    )
    assert os.path.lexists(workdir) and not (tmp_path / "gone").exists()


@pytest.mark.usefixtures("cache")
def test_rehearsal_check_dflash_with_a_cache_that_is_a_regular_file_is_refused(run: Run, tmp_path: Path) -> None:
    file = cache_file(tmp_path)
    run("rehearsal", "check-dflash", env={"SPECDEPLOY_CACHE": str(file)}).expect(
        2, "$SPECDEPLOY_CACHE", str(file), "found a regular file", fix=CACHE_FIX
    )


# =========================================================================== rehearsal fixtures


@pytest.mark.usefixtures("cache")
def test_rehearsal_fixtures_refuses_an_export_that_is_a_file_before_building(run: Run, tmp_path: Path) -> None:
    export = write(tmp_path / "export", "a file\n")
    run("rehearsal", "fixtures", "--export", export).expect(
        2, "--export", str(export), "a regular file", "nothing was built", fix="pass a directory as --export"
    )
    assert export.read_text() == "a file\n"


@pytest.mark.usefixtures("cache")
def test_rehearsal_fixtures_refuses_an_export_under_a_file(run: Run, tmp_path: Path) -> None:
    file = write(tmp_path / "file", "a file\n")
    run("rehearsal", "fixtures", "--export", file / "models").expect(
        2, "--export", f"found a regular file at {file}", fix="leave it out to build the fixtures only"
    )


@pytest.mark.usefixtures("cache")
def test_rehearsal_fixtures_refuses_an_export_that_is_a_fifo(run: Run, tmp_path: Path) -> None:
    export = tmp_path / "export"
    os.mkfifo(export)
    run("rehearsal", "fixtures", "--export", export).expect(
        2, "--export", "something that is not a directory", fix="pass a directory as --export"
    )
    assert export.is_fifo()


@pytest.mark.usefixtures("cache")
@pytest.mark.parametrize("under", [False, True], ids=["the-file", "under-it"])
def test_rehearsal_fixtures_with_a_cache_that_cannot_be_a_directory_is_refused_before_building(
    run: Run, tmp_path: Path, under: bool
) -> None:
    file = cache_file(tmp_path)
    configured = file / "specdeploy" if under else file
    run("rehearsal", "fixtures", env={"SPECDEPLOY_CACHE": str(configured)}).expect(
        2, "$SPECDEPLOY_CACHE", str(configured), "found a regular file", fix=CACHE_FIX
    )
    assert file.read_text() == "not a directory\n"


# =========================================================================== rehearsal deploy


@pytest.mark.usefixtures("cache")
@pytest.mark.parametrize("under", [False, True], ids=["the-file", "under-it"])
def test_rehearsal_deploy_with_a_cache_that_cannot_be_a_directory_is_refused_before_the_host_boots(
    run: Run, tmp_path: Path, under: bool
) -> None:
    file = cache_file(tmp_path)
    configured = file / "specdeploy" if under else file
    run("rehearsal", "deploy", env={"SPECDEPLOY_CACHE": str(configured)}).expect(
        2, "$SPECDEPLOY_CACHE", str(configured), "found a regular file", fix=CACHE_FIX
    )
    assert file.read_text() == "not a directory\n"


@pytest.mark.usefixtures("cache")
def test_rehearsal_deploy_without_podman_is_refused_before_anything_is_built(run: Run, tmp_path: Path) -> None:
    empty = tmp_path / "empty-bin"
    empty.mkdir()
    run("rehearsal", "deploy", env={"PATH": str(empty)}).expect(
        2, "podman is not on PATH", "nothing was built or booted", fix="install podman"
    )


@pytest.mark.usefixtures("cache")
def test_rehearsal_deploy_without_ansible_core_is_refused_before_anything_is_built(
    run: Run, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """specdeploy installed into a venv without the dev extra: ansible-playbook is not beside its
    Python, nor on PATH."""
    bare = tmp_path / "venv" / "bin"
    write(bare / "python", "")
    podman = write(tmp_path / "bin" / "podman", f"#!/bin/sh\ntouch {tmp_path / 'podman-ran'}\nexit 1\n")
    podman.chmod(0o755)
    monkeypatch.setattr(sys, "executable", str(bare / "python"))
    run("rehearsal", "deploy", env={"PATH": str(podman.parent)}).expect(
        2,
        "ansible-playbook is neither beside",
        str(bare / "python"),
        "nor on PATH",
        "nothing was built or booted",
        fix="scripts/setup.sh prints",
    )
    assert not (tmp_path / "podman-ran").exists()


@pytest.mark.usefixtures("cache")
def test_rehearsal_deploy_outside_a_checkout_is_refused_before_anything_is_built(
    run: Run, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """specdeploy installed from a wheel: there is no ansible/deploy.yml to play."""
    from specdeploy.rehearsal import deploy

    monkeypatch.setattr(deploy, "ROOT", tmp_path / "site-packages")
    run("rehearsal", "deploy").expect(
        1, str(tmp_path / "site-packages"), "not a specdeploy checkout", fix="from a clone of the repository"
    )
