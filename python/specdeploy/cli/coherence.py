"""`specdeploy coherence FILE`: a bad engine's outputs triaged with the smoke's own detectors.

Reads a JSON-lines file of outputs (one object a line with a string `text`; other fields are
ignored, blank lines skipped) through the bounded reader (core/files.py), checks every line
before judging any, and prints per line the findings of `smoke.coherence.detect` — a table,
or with `--json` a list of `{"line": N, "findings": [{"detector", "detail"}, ...]}` (every
line, an empty list when it looks coherent). Exit 0 when nothing is flagged, 1 when an output
is, 2 when the file cannot be read: missing, not a regular file, over 64 MiB, not UTF-8, no
outputs at all, or a line that is not a JSON object with a string `text` (the message names
the line, what was expected and what was found; never a traceback).
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer
from rich.table import Table

from specdeploy.cli import base, output
from specdeploy.core import files
from specdeploy.core.errors import InputFileError

WHAT = "JSON-lines file"
EXCERPT = 60  # characters of each output shown in the table
HINT = 'write one JSON object per line with the output in a string field "text", e.g. {"text": "Paris"}'


def _found(value: Any) -> str:
    """A found value in words: its JSON kind and a bounded excerpt."""
    kinds = {dict: "an object", list: "a list", str: "a string", bool: "a boolean", type(None): "null"}
    kind = kinds.get(type(value), "a number")
    shown = output.as_text(value)
    return kind if value is None else f"{kind} {shown[:80]}{'…' if len(shown) > 80 else ''}"


def read_outputs(path: Path) -> list[tuple[int, str]]:
    """(line number, text) for every non-blank line of `path`, or an InputFileError naming the
    first line that is not a JSON object with a string "text"."""
    content = files.read_text(path, what=WHAT, limit=files.LIMITS["text"])
    outputs: list[tuple[int, str]] = []
    # "\n" only: JSON strings may hold U+2028 and other characters splitlines() breaks at
    for number, line in enumerate(content.split("\n"), start=1):
        if not line.strip():
            continue
        where = f"{WHAT} {path} line {number}"
        try:
            record = files.loads(line)
        except files.JSONTextError as exc:
            raise InputFileError(
                f'{where}: expected a JSON object with a string "text", found text that is not JSON ({exc.detail})',
                hint=HINT,
            ) from None
        if not isinstance(record, dict):
            raise InputFileError(
                f'{where}: expected a JSON object with a string "text", found {_found(record)}', hint=HINT
            )
        if "text" not in record:
            keys = ", ".join(sorted(map(str, record))[:8]) or "none"
            raise InputFileError(
                f'{where}: expected a JSON object with a string "text", found an object without "text" (keys: {keys})',
                hint=HINT,
            )
        if not isinstance(record["text"], str):
            raise InputFileError(f'{where}: expected "text" to be a string, found {_found(record["text"])}', hint=HINT)
        outputs.append((number, record["text"]))
    if not outputs:
        raise InputFileError(
            f"{WHAT} {path} holds no outputs (it is empty or blank)", hint="pass the JSON-lines file of the outputs"
        )
    return outputs


def _table(path: Path, results: list[dict[str, Any]], texts: dict[int, str]) -> None:
    flagged = [r for r in results if r["findings"]]
    table = Table("line", "", "finding", "output", title=f"coherence {path}")
    for result in results:
        excerpt = texts[result["line"]][:EXCERPT] + ("…" if len(texts[result["line"]]) > EXCERPT else "")
        excerpt = excerpt.replace("\n", "⏎")
        findings = result["findings"] or [{"detector": "", "detail": ""}]
        for index, finding in enumerate(findings):
            label = f"{finding['detector']}: {finding['detail']}" if finding["detector"] else ""
            table.add_row(
                *output.cells(
                    result["line"] if index == 0 else "",
                    output.MARKS[not result["findings"]] if index == 0 else "",
                    label,
                    excerpt if index == 0 else "",
                )
            )
    output.out.print(table)
    verdict = "[bold red]" if flagged else "[green]"
    output.out.print(f"{verdict}{len(flagged)} of {len(results)} outputs flagged[/]")


def coherence(
    path: Annotated[Path, typer.Argument(metavar="FILE", help='JSON-lines outputs: one object a line with "text"')],
    as_json: base.JsonOpt = False,
) -> None:
    """Score a JSON-lines file of model outputs with the smoke's degeneracy detectors.

    Prints each line's findings (loops, word salad, template tokens, stray scripts, ...).
    Exit 0 when nothing is flagged, 1 when an output is, 2 when the file cannot be read.
    """
    from specdeploy.smoke import coherence as detectors  # the word lists load only for this command

    outputs = read_outputs(path)
    results = [
        {"line": number, "findings": [{"detector": f.detector, "detail": f.detail} for f in detectors.detect(text)]}
        for number, text in outputs
    ]
    output.emit(results, as_json, lambda: _table(path, results, dict(outputs)))
    raise typer.Exit(1 if any(r["findings"] for r in results) else 0)


def register(app: typer.Typer) -> None:
    app.command("coherence")(coherence)
