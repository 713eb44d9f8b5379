"""No silent minutes: a long step says, at least every `PERIOD_S`, what it is, how long it has run
and the last thing it observed.

Failure prevented (issue 37, tried as a new user would): the main job's first run spent minutes at a
time with no output at all (the image base's debootstrap, the hub's build, the engine image's build,
the engine's start), and `migrate prepare` printed nothing for nine minutes while its play ran into a
log file. A person cannot tell a hung step from a slow one, and stops a healthy run. Here every long
step is a `Step`: a ticker prints `12:03:40 engine image: 1m40s, last: STEP 7/9: COPY wheels /tmp/wheels`
every `PERIOD_S` until the step ends, never a bare heartbeat (the last line the step's program
printed, the last task its play started, the last host that answered). Where a terminal is attached
the same facts are one live rich line per step instead of a line every period.

One ticker for everything that waits: the rehearsal's preparation (core of the main job), `migrate`'s
plays and copies, and every Ansible task (ansible/callback_plugins/specdeploy_progress.py makes each
running task a `Step`). `run` and `follow` feed a step from a program's output or a log file as it
grows; `timed_run` keeps the time of every line a program prints, so a test can prove the longest
silence of a real run (`longest_silence`).
"""

from __future__ import annotations

import contextlib
import contextvars
import functools
import os
import re
import subprocess
import sys
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

MAX_SILENCE_S = 30.0  # issue 37: no run of the main job, `migrate` or a deploy goes longer without a line
PERIOD_S = 20.0  # the ticker's: within MAX_SILENCE_S with room for a loaded machine
# A look from outside at a long job on a host (the deploy's `gate-wait --for`, each a retry of its task):
# shorter than PERIOD_S, so each of the play's ticker lines carries a fresh answer
LOOK_S = 15
PERIOD_ENV = "SPECDEPLOY_PROGRESS_PERIOD_S"  # tests shorten it; never longer than PERIOD_S
LIMIT = 160  # characters of an observation shown (a program's line can be a whole JSON document)
_CONTROL = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]|[\x00-\x1f\x7f-\x9f]")

_current: contextvars.ContextVar[Step | None] = contextvars.ContextVar("specdeploy_progress_step", default=None)
_write_lock = threading.Lock()


def period() -> float:
    """The ticker's period: `PERIOD_S`, or shorter where $SPECDEPLOY_PROGRESS_PERIOD_S asks (tests)."""
    try:
        asked = float(os.environ.get(PERIOD_ENV, PERIOD_S))
    except ValueError:
        return PERIOD_S
    return min(PERIOD_S, asked) if asked > 0 else PERIOD_S


def clean(text: str) -> str:
    """One observation as shown: escape sequences and control characters dropped (a program's colours,
    a carriage-return progress bar's last frame), runs of blanks made one, cut to `LIMIT`."""
    frames = [f for f in text.rstrip("\r\n").split("\r") if f.strip()]
    shown = " ".join(_CONTROL.sub(" ", frames[-1] if frames else "").split())
    return shown if len(shown) <= LIMIT else shown[: LIMIT - 1] + "…"


def duration(seconds: float) -> str:
    """`42s`, `3m05s`, `1h02m`: an elapsed time as a person reads it."""
    s = int(seconds)
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m{s % 60:02d}s"
    return f"{s // 3600}h{s % 3600 // 60:02d}m"


def line(name: str, elapsed: float, last: str | None) -> str:
    """The ticker's line: the step, its time so far and what it last saw."""
    return f"{time.strftime('%H:%M:%S')} {name}: {duration(elapsed)}, last: {last or 'started, no output yet'}"


def retry_words(answer: Mapping[str, Any]) -> tuple[str, str]:
    """One retry of an Ansible `until` loop as both callback plugins say it (ansible/callback_plugins):
    `attempt 3 of 961` (Ansible's `retries` counts every attempt, the first too: a retry is a wait, not a
    failure) and the attempt's last line of output, stdout before stderr before the module's message (a
    retried probe says there what it waits for, as `gate-wait` does; its `msg` is "non-zero return
    code"), or "" where it said nothing."""
    total = answer.get("retries")
    attempt = f"attempt {answer.get('attempts', '?')}" + (f" of {total}" if isinstance(total, int) else "")
    return attempt, last_said(answer, "stdout", "stderr", "msg")


def last_said(answer: Mapping[str, Any], *keys: str) -> str:
    """The last line of the first of `keys` an Ansible result says something in (a retry reads stdout
    first, a failure the module's message first), or "" where it said nothing."""
    said = next((str(answer[k]).strip() for k in keys if str(answer.get(k) or "").strip()), "")
    return said.splitlines()[-1] if said else ""


def plain(text: str) -> None:
    """One line to stderr, never interleaved with another step's (every plain line goes through here)."""
    with _write_lock:
        print(text, file=sys.stderr, flush=True)


class _Live:
    """Where stderr is a terminal: one rich progress display shared by the steps running at once (the
    main job prepares seven things side by side), a live line per step instead of a line per period."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._progress: Any = None
        self._users = 0

    def add(self, name: str) -> tuple[Any, Any]:
        from rich.console import Console
        from rich.progress import Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

        with self._lock:
            if self._progress is None:
                self._progress = Progress(
                    SpinnerColumn(), TextColumn("[bold]{task.description}"), TimeElapsedColumn(),
                    TextColumn("{task.fields[last]}", markup=False), console=Console(stderr=True), transient=True,
                    redirect_stdout=False,  # a command's result (JSON) on stdout stays there
                )  # fmt: skip
                self._progress.start()
            self._users += 1
            return self._progress, self._progress.add_task(name, last="started, no output yet")

    def remove(self, task: Any, text: str) -> None:
        with self._lock:
            self._progress.remove_task(task)
            if text:
                self._progress.console.print(text, markup=False, highlight=False)
            self._users -= 1
            if self._users == 0:
                self._progress.stop()
                self._progress = None


_live = _Live()


class Step:
    """One long step: `with Step("engine image") as step: ... step.observe(text)`. While it runs, a
    daemon thread prints `line(...)` every `period()`; it says how it ended when `announce` (a play's
    tasks do not: Ansible prints their result). `write` receives each line (default: stderr).

    A step begun inside another (`parent`: `step()` passes the current one) prints nothing itself: what
    it observes goes to its parent as `name: text`, so a booting host inside the main job's preparation
    is one line every period, not two."""

    def __init__(
        self,
        name: str,
        *,
        write: Callable[[str], None] | None = None,
        announce: bool = True,
        parent: Step | None = None,
    ) -> None:
        self.name = name
        self.parent = parent
        self.every = period()
        self.announce = announce
        # rich's live display where a person watches (and no one asked for lines), else plain lines
        self._rich = write is None and sys.stderr.isatty()
        self._write = write or plain
        self._task: tuple[Any, Any] | None = None
        self._last: str | None = None
        self._lock = threading.Lock()
        self._done = threading.Event()
        self._thread: threading.Thread | None = None
        self._token: contextvars.Token[Step | None] | None = None
        self.started = time.monotonic()

    @property
    def last(self) -> str | None:
        with self._lock:
            return self._last

    @property
    def elapsed(self) -> float:
        return time.monotonic() - self.started

    def observe(self, text: str) -> None:
        """What the step last saw (a program's line, a task, a host's answer); blank text is ignored."""
        shown = clean(text)
        if shown and self.parent is not None:
            self.parent.observe(f"{self.name}: {shown}")
        elif shown:
            with self._lock:
                self._last = shown
                if self._task is not None:
                    progress, task = self._task
                    progress.update(task, last=shown)

    def start(self) -> Step:
        self.started = time.monotonic()
        self._done.clear()
        if self.parent is not None:
            return self
        if self._rich:
            self._task = _live.add(self.name)
            return self
        self._thread = threading.Thread(target=self._tick, name=f"progress {self.name}", daemon=True)
        self._thread.start()
        return self

    def stop(self, ok: bool = True) -> None:
        self._done.set()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout=5)
        if self.parent is not None:
            return
        ended = f"{time.strftime('%H:%M:%S')} {self.name}: {'done' if ok else 'failed'} after {duration(self.elapsed)}"
        with self._lock:  # a late observe (a pump outliving its join) must not update a removed task
            task, self._task = self._task, None
        if task is not None:
            _live.remove(task[1], ended if self.announce else "")
        elif self.announce:
            self._write(ended)

    def _tick(self) -> None:
        while not self._done.wait(self.every):
            self._write(line(self.name, self.elapsed, self.last))

    def __enter__(self) -> Step:
        self._token = _current.set(self)
        return self.start()

    def __exit__(self, kind: type[BaseException] | None, *_: Any) -> None:
        if self._token is not None:
            _current.reset(self._token)
        self.stop(ok=kind is None)


def step(name: str, **options: Any) -> Step:
    """`with progress.step("hub image"):` — the step `observe` and `run` feed in this thread; inside
    another step (and printing where it does), one that reports to it."""
    parent = _current.get()
    if parent is not None and "write" not in options:
        return Step(name, parent=parent, **options)
    return Step(name, **options)


def stepped(name: Callable[..., str]) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """A function that is one long step each time it runs: `@progress.stepped(lambda name, *_, **__:
    f"booting {name}")` (the step's name from the call's arguments)."""

    def wrap(function: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(function)
        def stepped_call(*args: Any, **kwargs: Any) -> Any:
            with step(name(*args, **kwargs)):
                return function(*args, **kwargs)

        return stepped_call

    return wrap


def current() -> Step | None:
    """The step this thread runs in (a worker thread starts in none: capture it before, as the smoke's
    bars do for their thread pools)."""
    return _current.get()


def observe(text: str) -> None:
    """Tell the current step (if any) what was just seen."""
    if (now := _current.get()) is not None:
        now.observe(text)


# --------------------------------------------------------------------------- programs and logs


@dataclass
class Timed:
    """A finished program's exit code and output, with the time (monotonic, s from its start) of every
    line it printed on either stream and of its exit."""

    returncode: int
    stdout: str
    stderr: str
    # (time, line) of every line printed, both streams in the order they came; None: not captured
    lines: list[tuple[float, str]] | None = field(default_factory=list)
    ended: float = 0.0

    @property
    def times(self) -> list[float]:
        return [t for t, _ in self._captured()]

    @property
    def longest_silence(self) -> float:
        return longest_silence(self.times, self.ended)

    def silence_after(self) -> tuple[float, str]:
        """The longest silence and the line it followed ("(the start)" when none came before)."""
        marks = [(0.0, "(the start)"), *self._captured()]
        ends = [t for t, _ in marks[1:]] + [self.ended]
        return max(((end - t, text) for (t, text), end in zip(marks, ends, strict=True)), key=lambda g: g[0])

    def _captured(self) -> list[tuple[float, str]]:
        if self.lines is None:
            raise ValueError("this run's output was not captured: it has no line times")
        return self.lines


def longest_silence(times: list[float], ended: float) -> float:
    """The longest stretch without a line: from the start to the first line, between two lines, and
    from the last line to the end."""
    marks = [0.0, *sorted(times), ended]
    return max(b - a for a, b in zip(marks, marks[1:], strict=False))


def _pump(
    pipe: IO[bytes], chunks: list[str], lines: list[tuple[float, str]], started: float, seen: Callable[[str], None]
) -> None:
    for raw in iter(pipe.readline, b""):
        text = raw.decode(errors="replace")
        lines.append((time.monotonic() - started, text.rstrip("\n")))  # list.append: safe across the pumps
        chunks.append(text)
        seen(text)
    pipe.close()


def timed_run(
    argv: list[str],
    *,
    env: dict[str, str] | None = None,
    cwd: Path | str | None = None,
    timeout: float | None = None,
    input_text: str | None = None,
    echo: IO[str] | None = None,
    echo_stdout: bool = True,
) -> Timed:
    """Run `argv`, keeping both streams and the time of each line (`Timed.longest_silence`). Each line
    also goes to the current step (if any) and to `echo` (if given; stderr's only unless `echo_stdout`),
    as it comes."""
    step_now = _current.get()

    def seen(text: str, *, shown: bool) -> None:
        if step_now is not None:
            step_now.observe(text)
        if echo is not None and shown:
            with _write_lock:
                echo.write(text)
                echo.flush()

    started = time.monotonic()
    proc = subprocess.Popen(
        argv,
        stdin=subprocess.PIPE if input_text is not None else subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=env,
        cwd=cwd,
    )
    assert proc.stdout is not None and proc.stderr is not None
    out: list[str] = []
    err: list[str] = []
    lines: list[tuple[float, str]] = []
    streams = ((proc.stdout, out, echo_stdout), (proc.stderr, err, True))
    pumps = [
        threading.Thread(
            target=_pump, args=(pipe, kept, lines, started, lambda t, shown=shown: seen(t, shown=shown)), daemon=True
        )
        for pipe, kept, shown in streams
    ]
    for pump in pumps:
        pump.start()
    if input_text is not None:
        assert proc.stdin is not None
        with contextlib.suppress(BrokenPipeError):
            proc.stdin.write(input_text.encode())
        proc.stdin.close()
    try:
        code = proc.wait(timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
        raise
    finally:
        for pump in pumps:
            pump.join(timeout=10)
    return Timed(code, "".join(out), "".join(err), sorted(lines, key=lambda item: item[0]), time.monotonic() - started)


def run(argv: list[str], *, check: bool = True, keep: int = 40, **options: Any) -> subprocess.CompletedProcess[str]:
    """`subprocess.run(argv, capture_output=True, text=True, check=check)` whose lines feed the current
    step as they come (debootstrap, podman build, the wheelhouse: minutes each on a first run). A failure
    raises CalledProcessError carrying the last `keep` lines of each stream."""
    done = timed_run(argv, **options)
    if check and done.returncode != 0:
        tail = lambda text: "".join(deque(text.splitlines(keepends=True), maxlen=keep))  # noqa: E731
        raise subprocess.CalledProcessError(done.returncode, argv, tail(done.stdout), tail(done.stderr))
    return subprocess.CompletedProcess(argv, done.returncode, done.stdout, done.stderr)


@contextlib.contextmanager
def follow(path: Path, *, pick: Callable[[str], str | None] = lambda text: text) -> Iterator[None]:
    """While the block runs, every complete line appended to `path` (a play's log, written by another
    process) is offered to the current step through `pick` (a line, or None to skip it)."""
    step_now = _current.get()
    done = threading.Event()

    def tail() -> None:
        offset = 0
        pending = b""
        while True:
            finished = done.wait(0.5)
            with contextlib.suppress(OSError), path.open("rb") as f:
                f.seek(offset)
                data = f.read()
                offset += len(data)
                pending += data
            *complete, pending = pending.split(b"\n")
            for raw in complete:
                chosen = pick(raw.decode(errors="replace"))
                if chosen and step_now is not None:
                    step_now.observe(chosen)
            if finished:
                return

    thread = threading.Thread(target=tail, name=f"follow {path.name}", daemon=True)
    thread.start()
    try:
        yield
    finally:
        done.set()
        thread.join(timeout=5)
