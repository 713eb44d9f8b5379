"""The one output helper every command prints through: a table for people, JSON for machines.

Logs (Ansible, CI) are not terminals: tables get 160 columns (or $COLUMNS) there instead of
rich's 80-column default, which would wrap field names mid-word.

Every table cell goes through `cells()` (failures found by trying bad input: a found value
`[true, false]` or `[null, 1]` printed as an empty cell, because rich read it as a markup
tag; a config string `[bold red]...` printed in bold red instead of as written): a value is
shown exactly as it is — strings as written, anything else as compact JSON, control
characters made visible — and only the markup specdeploy writes itself (`Markup`: the ok/FAIL
marks, a coloured verdict) is rendered as markup.
"""

from __future__ import annotations

import json
import os
import re
import sys
from collections.abc import Callable
from typing import Any

from rich.console import Console
from rich.markup import escape
from rich.table import Table
from rich.text import Text

from specdeploy.core.errors import SpecdeployError

WIDTH = None if sys.stdout.isatty() else int(os.environ.get("COLUMNS", "160"))
out = Console(soft_wrap=True, width=WIDTH)
err = Console(stderr=True, soft_wrap=True, width=WIDTH)


class Markup(str):
    """Rich markup written by specdeploy itself (a mark, a coloured verdict, an escaped value):
    the only kind of string a table cell renders as markup."""


class Escaped(Markup):
    """`text(value)`: `value` with rich's markup escaped, for an f-string of markup; a table
    cell shows `plain`, the value exactly as it was."""

    plain: str


MARKS = {True: Markup("[green]ok[/]"), False: Markup("[bold red]FAIL[/]")}
STATUS_COLOURS = {
    "pass": "green",
    "ok": "green",
    "fail": "bold red",
    "error": "bold magenta",
    "warn": "yellow",
    "inconclusive": "yellow",
    "interrupted": "yellow",
    "running": "yellow",
    "skip": "dim",
    "skipped": "dim",
}

# C0 and C1 control characters but newline and tab: an escape sequence in a found value must
# show as text, never drive the terminal
_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f]")


def _visible(value: str) -> str:
    return _CONTROL.sub(lambda m: f"\\x{ord(m.group()):02x}", value)


def as_text(value: Any) -> str:
    """Strings as they are, anything else (None, booleans, lists, numbers) as compact JSON."""
    if isinstance(value, str):
        return value
    try:
        return json.dumps(value, ensure_ascii=False, default=str)
    except (TypeError, ValueError):  # a structure JSON cannot hold: still show something
        return repr(value)


def emit(data: Any, as_json: bool, table: Callable[[], Table | None]) -> None:
    """Print `data` as JSON, or the table (and whatever else) `table` renders for people."""
    if as_json:
        out.print_json(json.dumps(data, ensure_ascii=False, default=str))
        return
    rendered = table()
    if rendered is not None:
        out.print(rendered)


def cell(value: Any) -> Text:
    """One table cell showing `value` exactly: `Markup` rendered, a `Text` as it is, a string
    as written (never read as markup), anything else as compact JSON (`true`, `null`,
    `[true, null]`), control characters as `\\xNN`; a value wider than its column is folded
    onto the next line, never cut to an ellipsis."""
    if isinstance(value, Text):
        return value
    if isinstance(value, Escaped):
        return Text(_visible(value.plain), overflow="fold")
    if isinstance(value, Markup):
        return Text.from_markup(value, overflow="fold")
    return Text(_visible(as_text(value)), overflow="fold")


def cells(*values: Any) -> list[Text]:
    """A table row: `table.add_row(*output.cells(a, b, ...))`, each value through `cell`."""
    return [cell(v) for v in values]


def styled(value: Any, style: str) -> Text:
    """`value` shown exactly (as `cell` does) in `style`."""
    text = cell(value)
    text.stylize(style)
    return text


def line(*parts: Any) -> Text:
    """One printed line from parts shown as `cell` shows them: `out.print(line(styled(name,
    "bold"), ": ", description))` prints a description holding `[bold red]` as written."""
    return Text.assemble(*(cell(p) for p in parts))


def text(value: Any) -> Escaped:
    """A message part inside an f-string of markup: strings as they are, anything else as
    compact JSON, with rich's markup escaped (a source in brackets, "[vllm#41190]", must
    print, not vanish). In a table cell it shows the value exactly."""
    plain = _visible(as_text(value))
    escaped = Escaped(escape(plain))
    escaped.plain = plain
    return escaped


def status(value: str) -> Markup:
    """A verdict or level, coloured."""
    return Markup(f"[{STATUS_COLOURS.get(value, 'yellow')}]{escape(_visible(str(value)))}[/]")


def fix(hint: str, *, subject: str = "") -> None:
    """A `  fix: <hint>` line after a table of failed checks (on standard output, beside the
    table; `subject`: the rows it is for), printed exactly as written."""
    lead = f"{subject}: " if subject else ""
    out.print(Text.assemble("  ", ("fix:", "bold"), " ", _visible(lead + hint)), highlight=False)


def error(exc: SpecdeployError) -> None:
    """The one way an error reaches the user: `error: <message>`, then `  fix: <hint>`, each
    printed exactly as written (never read as markup)."""
    err.print(Text.assemble(("error:", "bold red"), " ", _visible(str(exc.message))), highlight=False)
    if exc.hint:
        err.print(Text.assemble("  ", ("fix:", "bold"), " ", _visible(str(exc.hint))), highlight=False)
