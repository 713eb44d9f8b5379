"""The one output helper every command prints through: a table for people, JSON for machines.

Logs (Ansible, CI) are not terminals: tables get 160 columns (or $COLUMNS) there instead of
rich's 80-column default, which would wrap field names mid-word.
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Callable
from typing import Any

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from specdeploy.core.errors import SpecdeployError

WIDTH = None if sys.stdout.isatty() else int(os.environ.get("COLUMNS", "160"))
out = Console(soft_wrap=True, width=WIDTH)
err = Console(stderr=True, soft_wrap=True, width=WIDTH)

MARKS = {True: "[green]ok[/]", False: "[bold red]FAIL[/]"}
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


def emit(data: Any, as_json: bool, table: Callable[[], Table | None]) -> None:
    """Print `data` as JSON, or the table (and whatever else) `table` renders for people."""
    if as_json:
        out.print_json(json.dumps(data, ensure_ascii=False, default=str))
        return
    rendered = table()
    if rendered is not None:
        out.print(rendered)


def text(value: Any) -> str:
    """A table cell or message part: strings as they are, anything else as compact JSON, with
    rich's markup escaped (a source in brackets, "[vllm#41190]", must print, not vanish)."""
    return escape(value if isinstance(value, str) else json.dumps(value))


def status(value: str) -> str:
    """A verdict or level, coloured."""
    return f"[{STATUS_COLOURS.get(value, 'yellow')}]{value}[/]"


def error(exc: SpecdeployError) -> None:
    err.print(f"[bold red]error:[/] {text(exc.message)}", highlight=False)
    if exc.hint:
        err.print(f"  [bold]fix:[/] {text(exc.hint)}", highlight=False)
