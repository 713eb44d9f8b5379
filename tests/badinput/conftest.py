"""The bad-input suite's harness: run one command the way a user does and check the answer.

Every case asserts what docs/commands.md's "Bad input" table promises: the documented exit code, a
message that names the field or file, a fix, no traceback and never the error boundary's
generic internal-error fallback (which would mean the input reached code that did not expect
it) — and, where nothing may change, files byte-identical to before (`Snapshot`).

Commands run in-process through the real CLI (typer's runner: milliseconds a case); a case
that could hang (a FIFO, an nvidia-smi that never returns, a server that never answers) runs
the CLI as a subprocess with a deadline instead (`run_process`).
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from tests.support import BADINPUT_FIGURES
from tests.support.badinput import (  # noqa: F401  the fixtures several case files use
    FIGURES,
    ROOT,
    Answer,
    Run,
    Snapshot,
    _tried,
    archive,
    good,
    profile_path,
    quick_profile,
    serve,
    source,
)
from typer.testing import CliRunner

from specdeploy.cli import app
from specdeploy.core.errors import EXIT_INTERNAL


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Every case finishes in seconds: a hang fails its case after 60 s, not the suite after 900."""
    here = Path(__file__).parent
    for item in items:
        if here in Path(str(item.fspath)).parents:
            item.add_marker(pytest.mark.timeout(60))


@pytest.fixture(autouse=True)
def _figures(request: pytest.FixtureRequest) -> Iterator[None]:
    """Each case's figures travel in its report (tests/conftest.py sums and prints them), so the
    table is whole when the suite runs on several workers (scripts/test.sh)."""
    FIGURES.clear()
    yield
    request.node.user_properties.append((BADINPUT_FIGURES, {c: dict(f) for c, f in FIGURES.items()}))
    FIGURES.clear()


@pytest.fixture
def run() -> Run:
    """`run("verify-config", "--profile", ...)`: the CLI in-process, as a user invokes it."""
    runner = CliRunner()

    def invoke(*args: object, input: str | None = None, env: dict[str, str] | None = None) -> Answer:
        command = _tried(args)
        result = runner.invoke(app, [str(a) for a in args], input=input, env=env, catch_exceptions=True)
        if result.exception is not None and not isinstance(result.exception, SystemExit):
            # escaped the boundary altogether: the worst kind of answer, report it as a traceback
            import traceback

            tb = "".join(traceback.format_exception(result.exception))
            text = result.stderr + "\nTraceback (most recent call last)\n" + tb
            return Answer(EXIT_INTERNAL, result.stdout, text, command)
        return Answer(result.exit_code, result.stdout, result.stderr, command)

    return invoke


@pytest.fixture
def run_process() -> Run:
    """The CLI as a subprocess with a deadline: for inputs that could hang it. A hang fails the
    case (`timeout` seconds, default 60) instead of the suite. The deadline tells a hang (forever)
    from an answer, not a slow answer from a fast one: CI's loaded machine once took over 15 s to
    start Python and give an answer that takes 3 s here."""

    def invoke(
        *args: object, input: str | None = None, env: dict[str, str] | None = None, timeout: float = 60
    ) -> Answer:
        command = _tried(args)
        argv = [sys.executable, "-m", "specdeploy", *(str(a) for a in args)]
        full_env = {**os.environ, **(env or {}), "PYTHONPATH": os.pathsep.join([str(ROOT / "python"), str(ROOT)])}
        try:
            done = subprocess.run(argv, input=input, capture_output=True, text=True, env=full_env, timeout=timeout)
        except subprocess.TimeoutExpired as exc:
            pytest.fail(f"specdeploy {' '.join(map(str, args))} hung for {timeout} s: {exc.stderr!r}")
        return Answer(done.returncode, done.stdout, done.stderr, command)

    return invoke


@pytest.fixture
def snapshot() -> Callable[..., Snapshot]:
    return Snapshot
