"""The bad-input suite's harness: run one command the way a user does and check the answer.

Every case asserts what the README's "Bad input" table promises: the documented exit code, a
message that names the field or file, a fix, no traceback and never the error boundary's
generic internal-error fallback (which would mean the input reached code that did not expect
it) — and, where nothing may change, files byte-identical to before (`Snapshot`).

Commands run in-process through the real CLI (typer's runner: milliseconds a case); a case
that could hang (a FIFO, an nvidia-smi that never returns, a server that never answers) runs
the CLI as a subprocess with a deadline instead (`run_process`).
"""

from __future__ import annotations

import os
import stat
import subprocess
import sys
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from tests.support import BADINPUT_FIGURES
from typer.testing import CliRunner

from specdeploy.cli import app
from specdeploy.core.errors import EXIT_INTERNAL

# The suite's figures (README "Bad input"), per command: CLI calls made by the cases, answered
# as promised (exit code, names and fix, no traceback), and checked byte-identical where nothing may change
FIGURES: dict[str, dict[str, int]] = {}


def _command(args: tuple[object, ...]) -> str:
    """`specdeploy image check ...` -> "image check": the verb, and its subcommand for a group."""
    import typer.main

    root = typer.main.get_command(app)
    words = [str(a) for a in args if not str(a).startswith("-")][:2]
    if not words:
        return "(no command)"
    group = getattr(root, "commands", {}).get(words[0])
    return " ".join(words) if hasattr(group, "commands") and len(words) > 1 else words[0]


def _count(command: str, key: str) -> None:
    FIGURES.setdefault(command, {"tried": 0, "clear": 0, "unchanged": 0})[key] += 1


LAST = ["(no command)"]  # the command a snapshot's check belongs to: the one run since it was taken


def _tried(args: tuple[object, ...]) -> str:
    LAST[0] = _command(args)
    _count(LAST[0], "tried")
    return LAST[0]


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


ROOT = Path(__file__).resolve().parents[2]
FALLBACK = "a bug in specdeploy"  # the boundary's generic internal-error message


@dataclass
class Answer:
    """What the user saw: the exit code and both streams."""

    exit_code: int
    stdout: str
    stderr: str
    command: str = "(no command)"

    @property
    def text(self) -> str:
        return self.stdout + self.stderr

    def advice(self) -> list[str]:
        """What the answer tells the user to do: each `fix:` line (with the lines that continue
        it) and each `diagnosis:` line of a smoke report."""
        found = []
        for marker in ("fix:", "diagnosis:"):
            for part in self.text.split(marker)[1:]:
                lines = part.split("\n")
                tail = [line for line in lines[1:4] if line.startswith("    ")]  # a wrapped hint's lines
                found.append(" ".join([lines[0], *(line.strip() for line in tail)]))
        return found

    def expect(self, exit_code: int, *names: str, fix: str | None = None) -> Answer:
        """The documented exit code, each of `names` (the field, the file, the found value) in
        the message, no traceback or internal-error fallback, and — for every non-zero exit —
        `fix` in the advice itself: a `fix:` line (or the smoke's `diagnosis:` line), not
        merely somewhere in the message."""
        assert "Traceback (most recent call last)" not in self.text, self.text[-3000:]
        assert FALLBACK not in self.text and self.exit_code != EXIT_INTERNAL, self.text[-3000:]
        assert self.exit_code == exit_code, f"exit {self.exit_code}, expected {exit_code}:\n{self.text[-3000:]}"
        for name in names:
            assert name in self.text, f"{name!r} not in the message:\n{self.text[-3000:]}"
        if exit_code != 0:
            assert fix, "a case with a non-zero exit names the fix it expects (expect(..., fix=...))"
        if fix is not None:
            advice = self.advice()
            assert any(fix in line for line in advice), f"no fix {fix!r} in the advice {advice}:\n{self.text[-3000:]}"
        _count(self.command, "clear")
        return self


Run = Callable[..., Answer]


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


class Snapshot:
    """Every file and link under the given roots — bytes, mode and link target — taken before a
    command, compared after: `assert snapshot.unchanged()` where nothing may change."""

    def __init__(self, *roots: Path) -> None:
        self.roots = roots
        self.before = self._take()

    def _take(self) -> dict[str, tuple[object, ...]]:
        seen: dict[str, tuple[object, ...]] = {}
        for root in self.roots:
            for path in [root, *sorted(root.rglob("*"))] if root.is_dir() else [root]:
                if not os.path.lexists(path):
                    continue
                info = path.lstat()
                if stat.S_ISLNK(info.st_mode):
                    seen[str(path)] = ("link", os.readlink(path))
                elif stat.S_ISREG(info.st_mode):
                    seen[str(path)] = ("file", stat.S_IMODE(info.st_mode), path.read_bytes())
                else:
                    seen[str(path)] = ("other", stat.S_IFMT(info.st_mode), stat.S_IMODE(info.st_mode))
        return seen

    def changes(self) -> list[str]:
        after = self._take()
        return sorted(p for p in set(self.before) | set(after) if self.before.get(p) != after.get(p))

    def unchanged(self) -> bool:
        changed = self.changes()
        assert not changed, f"changed: {changed}"
        _count(LAST[0], "unchanged")
        return True


@pytest.fixture
def snapshot() -> Callable[..., Snapshot]:
    return Snapshot


def write(path: Path, content: str | bytes) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    if isinstance(content, bytes):
        path.write_bytes(content)
    else:
        path.write_text(content)
    return path


def paths(*items: Iterable[Path]) -> list[Path]:
    return [p for group in items for p in group]
