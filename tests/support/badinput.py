"""The bad-input suite's shared harness and inputs, in one module every case file imports.

The harness (`Answer`, `Run`, `Snapshot`, `write`: what a user saw, and files byte-identical where
nothing may change) and the inputs several case files use (a drafter download, an unpacked weights
archive, a stand-in podman, a loopback vLLM stub, the quick gate profile) live here, never in a
test module: a test module importing another collected its tests twice and made each file's
cases depend on another's (issue 37: tests/badinput/test_records.py imported four). The fixtures
below are used by importing them by name into the case file (`from tests.support.badinput import
source  # noqa: F401`); tests/badinput/conftest.py keeps the pytest hooks and the `run` fixtures.
"""

from __future__ import annotations

import hashlib
import json
import os
import stat
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler
from pathlib import Path
from typing import Any

import pytest
from tests.support.stub import stubs
from tests.support.variants import drafter_config
from tests.support.words import prompt_logprobs, with_token_ids

from specdeploy.cli import app
from specdeploy.core.errors import EXIT_INTERNAL
from specdeploy.profile import Profile, load_profile
from specdeploy.rehearsal import variants

# --------------------------------------------------------------------------- the harness

# The suite's figures (docs/commands.md "Bad input"), per command: CLI calls made by the cases, answered
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


def write(path: Path, content: str | bytes) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    if isinstance(content, bytes):
        path.write_bytes(content)
    else:
        path.write_text(content)
    return path


def paths(*items: Iterable[Path]) -> list[Path]:
    return [p for group in items for p in group]


# --------------------------------------------------------------------------- a drafter download and write-config


def download(directory: Path, config: dict[str, Any] | str | bytes, *extra: str) -> Path:
    """A drafter download: config.json plus a weight file (and any `extra` files)."""
    write(directory / "config.json", config if isinstance(config, (str, bytes)) else json.dumps(config, indent=2))
    write(directory / "model.safetensors", b"weights")
    for name in extra:
        write(directory / name, f"{name}\n")
    return directory


@pytest.fixture
def profile_path(tmp_path: Path, dflash_profile: Profile) -> Path:
    return variants.materialize(dflash_profile, tmp_path / "profiles")


@pytest.fixture
def good(dflash_profile: Profile) -> dict[str, Any]:
    return drafter_config(dflash_profile)


@pytest.fixture
def source(tmp_path: Path, good: dict[str, Any]) -> Path:
    return download(tmp_path / "models" / "drafter" / "rev1", good)


def write_config(run: Run, serving: Path, profile: Path, source: Path, lock: Path, *extra: object) -> Any:
    return run("write-config", serving, "--profile", profile, "--source", source, "--lock", lock, *extra)


# --------------------------------------------------------------------------- an unpacked weights archive

TARGET, DRAFTER = "specdeploy-fixtures/tiny-qwen3", "specdeploy-fixtures/tiny-qwen3-draft"  # cpu-rehearsal's repos


REV_T, REV_D = "c" * 40, "d" * 40


def _sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


@pytest.fixture
def archive(tmp_path: Path) -> dict[str, Path]:
    """An unpacked weights archive for cpu-rehearsal: both revisions and their manifest."""
    models, serving = tmp_path / "models", tmp_path / "serving"
    files = {}
    for repo, rev in ((TARGET, REV_T), (DRAFTER, REV_D)):
        data = f'{{"repo": "{repo}"}}'.encode()
        write(models / repo / rev / "config.json", data)
        files[repo] = {"revision": rev, "files": {"config.json": _sha(data)}}
    write(models / "specdeploy-archive.json", json.dumps({"models": files}))
    serving.mkdir()
    return {"models": models, "serving": serving, "lock": tmp_path / "state" / "specdeploy.lock", "root": tmp_path}


def serve_argv(host: dict[str, Path]) -> tuple[object, ...]:
    return (
        "weights",
        "serve",
        "-p",
        "cpu-rehearsal",
        "--lock",
        host["lock"],
        "--models-dir",
        host["models"],
        "--serving-dir",
        host["serving"],
    )


# --------------------------------------------------------------------------- a stand-in podman

CONTAINER = "cpu-rehearsal-container"  # a container profile that needs no GPU (and no --driver)


PODMAN_FIX = "install podman"


class Podman:
    """A stand-in podman: a script that appends its argv to a log, prints `out` and exits 0."""

    def __init__(self, directory: Path, out: str = "", *, by_verb: dict[str, str] | None = None) -> None:
        directory.mkdir(parents=True, exist_ok=True)
        self.path = directory / "podman"
        self.log = directory / "podman.calls"
        cases = "".join(f"  *'{verb}'*) cat <<'EOF'\n{text}\nEOF\n  ;;\n" for verb, text in (by_verb or {}).items())
        body = (
            f'case "$*" in\n{cases}  *) printf %s {_sh_quote(out)} ;;\nesac\n'
            if cases
            else (f"printf %s {_sh_quote(out)}\n")
        )
        self.path.write_text(f'#!/bin/sh\nprintf "%s\\n" "$*" >> {_sh_quote(str(self.log))}\n{body}exit 0\n')
        self.path.chmod(0o755)

    def calls(self) -> list[str]:
        return self.log.read_text().splitlines() if self.log.exists() else []

    def __str__(self) -> str:
        return str(self.path)


def _sh_quote(text: str) -> str:
    return "'" + text.replace("'", "'\\''") + "'"


# ------------------------------------------------------------------- a loopback vLLM stub, the quick gate profile

FAST = ("--readiness-timeout", "1")


NOT_AN_ENGINE_FIX = "base URL"  # every "answered, but not as the engine's API" names the base URL


MODEL = "tiny-qwen3"  # cpu-rehearsal's served_model_name


RESCORE = "POST /v1/completions (prompt_logprobs)"  # a completion over token ids: the lossless check's


def _metrics(completions: int) -> str:
    """vLLM's spec-decode counters after `completions` requests: 10 drafts and 18 accepted tokens
    each (mean acceptance length 2.8, inside cpu-rehearsal's band), per position 9, 6, 3."""
    n = completions
    labels = 'engine="0",model_name="tiny-qwen3"'
    lines = []
    for name, value in (
        ("vllm:spec_decode_num_drafts_total", 10 * n),
        ("vllm:spec_decode_num_draft_tokens_total", 30 * n),
        ("vllm:spec_decode_num_accepted_tokens_total", 18 * n),
        ("vllm:request_success_total", n),
    ):
        lines += [f"# TYPE {name} counter", f"{name}{{{labels}}} {float(value)}"]
    name = "vllm:spec_decode_num_accepted_tokens_per_pos_total"
    lines.append(f"# TYPE {name} counter")
    lines += [f'{name}{{{labels},position="{p}"}} {float(k * n)}' for p, k in enumerate((9, 6, 3))]
    return "\n".join(lines) + "\n"


def _chat(text: str) -> dict[str, Any]:
    return {
        "id": "chatcmpl-1",
        "object": "chat.completion",
        "model": MODEL,
        "choices": [{"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": "stop"}],
        "usage": {"prompt_tokens": 12, "completion_tokens": 8, "total_tokens": 20},
    }


# What cpu-rehearsal's known-answer and free-form prompts get from a healthy engine.
ANSWERS = {
    "6 times 7": "6 times 7 is 42.",
    "capital of France": "The capital of France is Paris.",
    "JSON object": '{"ok": true}',
    "Python function": "```python\ndef one():\n    return 1\n```",
    "capital of Italy": "The capital of Italy is Rome.",
    "largest planet": "Jupiter is the largest planet in the solar system.",
    "colour is the sky": "On a clear day the sky is blue.",
}


HEALTHY: dict[str, Any] = {
    "GET /health": (200, ""),
    "GET /v1/models": (200, {"object": "list", "data": [{"id": MODEL, "object": "model"}]}),
    "GET /version": (200, {"version": "0.32.0"}),
    "POST /v1/completions": (
        200,
        {
            "choices": [{"index": 0, "text": " jumps over the lazy dog", "finish_reason": "length"}],
            "usage": {"prompt_tokens": 4, "completion_tokens": 6, "total_tokens": 10},
        },
    ),  # fmt: skip
}


STREAM = [{"choices": [{"index": 0, "text": f" tok{i}", "finish_reason": None}], "usage": None} for i in range(4)] + [
    {"choices": [], "usage": {"prompt_tokens": 4, "completion_tokens": 4, "total_tokens": 8}}
]


@dataclass
class Engine:
    """What the stub answers per "METHOD /path": (status, body), a body being JSON-able or raw
    text; `stream` is the streamed completion's lines (raw strings are sent as they are). Left
    alone it answers as a healthy vLLM serving cpu-rehearsal: the smoke passes."""

    answers: dict[str, Any] = field(default_factory=dict)
    stream: list[Any] = field(default_factory=lambda: list(STREAM))
    seen: list[str] = field(default_factory=list)
    completions: int = 0

    def answer(self, key: str, body: dict[str, Any]) -> tuple[int, Any]:
        if key == "POST /v1/completions" and isinstance(body.get("prompt"), list):
            key = RESCORE  # the lossless check's fresh prefill, over token ids
        if key in self.answers:
            return self.answers[key]
        if key == "GET /metrics":
            return 200, _metrics(self.completions)
        if key == "POST /v1/chat/completions":
            prompt = body["messages"][0]["content"]
            self.completions += 1  # each answer moves the speculative counters, as a real engine's do
            return 200, with_token_ids(
                _chat(next((a for k, a in ANSWERS.items() if k in prompt), "I am not sure.")), prompt
            )
        if key == RESCORE:
            return 200, prompt_logprobs(body["prompt"])
        if key == "POST /v1/completions":
            self.completions += 1
        return HEALTHY.get(key, (404, {"detail": "Not Found"}))


def _handler(engine: Engine) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args: Any) -> None:
            pass

        def _send(self, status: int, body: Any, content_type: str = "application/json") -> None:
            data = body.encode() if isinstance(body, str) else json.dumps(body).encode()
            if isinstance(body, str):
                content_type = "text/html" if body.lstrip().startswith("<") else "text/plain"
            self.send_response(status)
            self.send_header("Content-Type", content_type)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def do_GET(self) -> None:  # noqa: N802 - http.server's naming
            engine.seen.append(f"GET {self.path}")
            self._send(*engine.answer(f"GET {self.path}", {}))

        def do_POST(self) -> None:  # noqa: N802
            body = json.loads(self.rfile.read(int(self.headers.get("Content-Length") or 0)) or b"{}")
            engine.seen.append(f"POST {self.path}")
            if self.path == "/v1/completions" and body.get("stream") and "POST /v1/completions" not in engine.answers:
                self.send_response(200)
                self.send_header("Content-Type", "text/event-stream")
                self.end_headers()
                for line in [*engine.stream, "[DONE]"]:
                    text = line if isinstance(line, str) else json.dumps(line)
                    self.wfile.write(f"data: {text}\n\n".encode())
                return
            self._send(*engine.answer(f"POST {self.path}", body))

    return Handler


@pytest.fixture
def serve() -> Iterator[Callable[..., str]]:
    """`serve(Engine(...))`: the stub on a loopback port; its base URL. Shut down after the case."""
    with stubs() as started:
        yield lambda engine=None: started.start(_handler(engine or Engine()))


@pytest.fixture(autouse=True)
def no_systemctl(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """A `systemctl` first on PATH that records its arguments and fails: no case may restart,
    stop or reload anything on the machine running the suite (old code included)."""
    bin_dir = tmp_path_factory.mktemp("bin")
    calls = bin_dir / "calls"
    fake = write(bin_dir / "systemctl", f'#!/bin/sh\necho "$*" >> {calls}\nexit 1\n')
    fake.chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ.get('PATH', '')}")
    yield
    made = calls.read_text().splitlines() if calls.exists() else []
    changing = [c for c in made if c.split()[:1] != ["show"]]
    assert not changing, f"systemctl was asked to change the machine: {changing}"


def _variant(tmp_path: Path, name: str, readiness_timeout_s: int) -> Path:
    profile = variants.derive(
        load_profile("cpu-rehearsal"), name, {"smoke": {"readiness_timeout_s": readiness_timeout_s}}
    )
    return variants.materialize(profile, tmp_path / "profiles")


@pytest.fixture
def quick_profile(tmp_path: Path) -> Path:
    """cpu-rehearsal with a 1 s readiness timeout, as a file the gate keeps beside its report."""
    return _variant(tmp_path, "cpu-rehearsal-quick", 1)
