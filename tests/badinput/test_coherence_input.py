"""Bad input to `specdeploy coherence FILE` (issue 22): a JSON-lines file of outputs that is
missing, not a regular file, not UTF-8, empty, or holds a line that is not an object with a
string "text" — exit 2, naming the file, the line, the expected and the found value, with a
fix; the file is never changed."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

import pytest
from tests.support.badinput import Run, Snapshot

JSONL_FIX = 'string field "text"'


@pytest.mark.parametrize(
    ("content", "names"),
    [
        (b'{"text": "ok"}\n"just a string"\n', ["line 2", "found a string just a string"]),
        (b'{"text": "ok"}\n{"answer": "Paris"}\n', ["line 2", 'without "text"', "keys: answer"]),
        (b'{"text": ["a", "b"]}\n', ["line 1", '"text" to be a string', 'found a list ["a", "b"]']),
        (b'{"text": "ok"}\n{"text": "cut\n', ["line 2", "not JSON", "Unterminated string"]),
        (
            b'{"text": "' + b"9" * 5000 + b'"}\n{"text": ' + b"9" * 5000 + b"}\n",
            ["line 2", "more than Python converts"],
        ),
        (b'{"text": "ok"}\n' + b"[" * 100_000 + b"\n", ["line 2", "nested too deeply"]),
    ],
)
def test_a_line_of_the_wrong_shape_is_named_with_expected_and_found(
    run: Run, snapshot: Callable[..., Snapshot], tmp_path: Path, content: bytes, names: list[str]
) -> None:
    path = tmp_path / "outputs.jsonl"
    path.write_bytes(content)
    before = snapshot(tmp_path)
    run("coherence", path).expect(2, str(path), *names, fix=JSONL_FIX)
    before.unchanged()


def test_an_empty_file_holds_no_outputs(run: Run, tmp_path: Path) -> None:
    path = tmp_path / "outputs.jsonl"
    path.write_bytes(b"\n\n")
    run("coherence", path, "--json").expect(2, str(path), "holds no outputs", fix="JSON-lines file of the outputs")


def test_a_file_that_is_not_utf8_names_the_byte(run: Run, tmp_path: Path) -> None:
    path = tmp_path / "outputs.jsonl"
    path.write_bytes(b'{"text": "\xff\xfe"}\n')
    run("coherence", path).expect(2, str(path), "not UTF-8", "0xff", fix="save the JSON-lines file as UTF-8")


def test_a_directory_or_a_missing_file_is_named(run: Run, tmp_path: Path) -> None:
    run("coherence", tmp_path).expect(2, str(tmp_path), "found a directory", fix="JSON-lines file file itself")
    missing = tmp_path / "nope.jsonl"
    run("coherence", missing).expect(2, str(missing), "does not exist", fix="an existing JSON-lines file")


def test_a_fifo_is_refused_at_once_not_read_forever(run_process: Run, tmp_path: Path) -> None:
    fifo = tmp_path / "outputs.jsonl"
    os.mkfifo(fifo)
    run_process("coherence", fifo).expect(2, "FIFO", fix="JSON-lines file file itself")
