"""`specdeploy coherence FILE [--json]` (issue 22, item 5): a bad engine's outputs triaged from
a JSON-lines file — exit 0 when nothing is flagged, 1 when an output is, 2 when the file
cannot be read (each refusal naming the line, the expected and the found value)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from tests.support.coherence_corpus import degenerate
from typer.testing import CliRunner

from specdeploy.cli import app


def _run(*args: object) -> tuple[int, str, str]:
    result = CliRunner().invoke(app, ["coherence", *map(str, args)])
    assert "Traceback" not in result.stdout + result.stderr
    return result.exit_code, result.stdout, result.stderr


def _outputs(tmp_path: Path, *records: object, name: str = "outputs.jsonl") -> Path:
    path = tmp_path / name
    path.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in records), encoding="utf-8")
    return path


def test_healthy_outputs_exit_0_with_a_table_of_every_line(tmp_path: Path) -> None:
    path = _outputs(tmp_path, {"text": "Paris", "prompt": "capital?"}, {"text": "東京は日本の首都です。", "id": 2})
    code, stdout, _ = _run(path)
    assert code == 0, stdout
    assert "0 of 2 outputs flagged" in stdout and "東京は日本の首都です。" in stdout


def test_a_degenerate_output_exits_1_naming_its_line_and_detector(tmp_path: Path) -> None:
    path = _outputs(tmp_path, {"text": "Paris"}, {"text": "寄托" * 20}, {"text": "The answer is<|im_end|>"})
    code, stdout, _ = _run(path)
    assert code == 1, stdout
    assert "repetition-loop" in stdout and "template-tokens" in stdout and "2 of 3 outputs flagged" in stdout


def test_json_lists_every_line_with_its_findings(tmp_path: Path) -> None:
    path = tmp_path / "outputs.jsonl"
    path.write_text('{"text": "Paris"}\n\n{"text": "' + "!" * 40 + '", "other": [1, 2]}\n', encoding="utf-8")
    code, stdout, _ = _run(path, "--json")
    assert code == 1
    results = json.loads(stdout)
    assert [r["line"] for r in results] == [1, 3]  # physical lines: the blank line 2 is skipped
    assert results[0]["findings"] == []
    assert {f["detector"] for f in results[1]["findings"]} >= {"exclamation-run"}
    assert all(set(f) == {"detector", "detail"} for f in results[1]["findings"])


def test_the_tuning_half_of_the_degenerate_corpus_is_triaged_as_flagged(tmp_path: Path) -> None:
    rows = degenerate("tuning")
    code, stdout, _ = _run(_outputs(tmp_path, *rows), "--json")
    results = json.loads(stdout)
    assert code == 1 and len(results) == len(rows)
    assert sum(1 for r in results if r["findings"]) >= 0.85 * len(rows)


@pytest.mark.parametrize(
    ("content", "names"),
    [
        ('{"text": "ok"}\n[1, 2]\n', ["line 2", 'a string "text"', "found a list [1, 2]"]),
        ('{"text": "ok"}\n{"output": "x", "id": 3}\n', ["line 2", 'without "text"', "keys: id, output"]),
        ('{"text": 42}\n', ["line 1", '"text" to be a string', "found a number 42"]),
        ('{"text": null}\n', ["line 1", "found null"]),
        ('{"text": "ok"}\n{"text": "unterminated\n', ["line 2", "not JSON", "Unterminated string"]),
        ("\n  \n", ["holds no outputs"]),
    ],
)
def test_a_line_that_is_not_an_object_with_a_string_text_exits_2_naming_it(
    tmp_path: Path, content: str, names: list[str]
) -> None:
    path = tmp_path / "outputs.jsonl"
    path.write_text(content, encoding="utf-8")
    code, stdout, stderr = _run(path)
    assert code == 2, stdout + stderr
    for name in names:
        assert name in stderr, stderr
    assert "fix:" in stderr and stdout == ""


def test_a_missing_file_exits_2(tmp_path: Path) -> None:
    code, _, stderr = _run(tmp_path / "nope.jsonl")
    assert code == 2 and "does not exist" in stderr


def test_a_directory_exits_2_naming_what_it_is(tmp_path: Path) -> None:
    code, _, stderr = _run(tmp_path)
    assert code == 2 and "expected a regular file, found a directory" in stderr


def test_a_fifo_exits_2_at_once(tmp_path: Path) -> None:
    fifo = tmp_path / "outputs.jsonl"
    os.mkfifo(fifo)
    code, _, stderr = _run(fifo)
    assert code == 2 and "FIFO" in stderr


def test_a_file_that_is_not_utf8_exits_2_naming_the_byte(tmp_path: Path) -> None:
    path = tmp_path / "outputs.jsonl"
    path.write_bytes(b'{"text": "caf\xe9"}\n')
    code, _, stderr = _run(path)
    assert code == 2 and "not UTF-8" in stderr and "0xe9" in stderr


def test_a_file_over_the_ceiling_exits_2_without_reading_it(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from specdeploy.core import files

    monkeypatch.setitem(files.LIMITS, "text", 1024)
    path = _outputs(tmp_path, *({"text": "x" * 100} for _ in range(20)))
    code, _, stderr = _run(path)
    assert code == 2 and "over the 1024 bytes" in stderr


def test_a_lone_surrogate_from_json_is_judged_not_a_crash(tmp_path: Path) -> None:
    path = tmp_path / "outputs.jsonl"
    path.write_text('{"text": "broken \\ud83d emoji"}\n', encoding="utf-8")
    code, stdout, _ = _run(path, "--json")
    assert code == 1 and json.loads(stdout)[0]["findings"][0]["detector"] == "bad-characters"
