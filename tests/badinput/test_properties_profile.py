"""Property tests for the profile, the lock and the table cells (issue 20: D6, D9, D13, D14).

Whatever text or bytes a profile file or a lock file holds, loading it ends in the loaded
object or in one of specdeploy's own errors (a `SpecdeployError`: a message and exit code the
CLI prints), never in another exception — the error boundary's internal-error fallback is
for bugs. And whatever a table cell is given, it shows it exactly.
"""

from __future__ import annotations

import copy
import io
import json
import re
import tempfile
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from rich.console import Console
from rich.table import Table

from specdeploy.cli import output
from specdeploy.core.errors import SpecdeployError
from specdeploy.profile import iter_pins, load_profile, parse_profile
from specdeploy.profile.load import parse_yaml
from specdeploy.profile.lock import Lock, require

ROOT = Path(__file__).resolve().parents[2]
BASE_TEXT = (ROOT / "profiles" / "cpu-rehearsal.yaml").read_text(encoding="utf-8")
BASE = yaml.safe_load(BASE_TEXT)
PROFILE = load_profile(ROOT / "profiles" / "cpu-rehearsal.yaml")

# Per example: typical runs take milliseconds (--hypothesis-show-statistics); an input that makes a parser
# unbounded (D14: minutes) fails at once, while a loaded 2-core CI machine has room to spare.
DEADLINE = timedelta(seconds=2)

SETTINGS = settings(
    max_examples=200, deadline=DEADLINE, derandomize=True, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
FEW = settings(
    max_examples=100, deadline=DEADLINE, derandomize=True, suppress_health_check=[HealthCheck.function_scoped_fixture]
)


@pytest.fixture(scope="module")
def scratch() -> Iterator[Path]:
    with tempfile.TemporaryDirectory(prefix="sd-props-") as directory:
        yield Path(directory)


def only_our_errors(action: Any) -> Any:
    """Run `action`; a SpecdeployError is an answer, anything else fails the property."""
    try:
        return action()
    except SpecdeployError as exc:
        assert exc.message, "an error without a message"
        return exc


# --------------------------------------------------------------------------- strategies

json_scalars = st.none() | st.booleans() | st.integers() | st.floats(allow_nan=True) | st.text(max_size=20)
json_values = st.recursive(
    json_scalars,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=10), inner, max_size=4),
    max_leaves=12,
)

# YAML fragments that reach the loader's corners: anchors, aliases (of aliases), merge keys,
# tags, flow and block nesting, duplicate keys, odd scalars (0x_, dates, 1e999, .nan, ~).
YAML_TOKENS = [
    "a: ",
    "a: ",
    "b: ",
    "schema_version: 1\n",
    "name: cpu-rehearsal\n",
    "&x ",
    "&y ",
    "*x",
    "*y",
    "<<: ",
    "!!binary ",
    "!!set ",
    "!!python/object ",
    "!foo ",
    "[",
    "]",
    "{",
    "}",
    ", ",
    "- ",
    "? ",
    "\n",
    "\n  ",
    "\n    ",
    "0x_",
    "0b_",
    "2001-13-45",
    "2001-01-01",
    "1e999",
    ".nan",
    "~",
    "yes",
    "'q'",
    '"\\xff"',
    "#c",
    "---\n",
    "...\n",
    "%YAML 1.1\n",
    "|\n  ",
    ">-\n  ",
    "hf_" + "A" * 34,
    "\t",
    "\ufeff",
    "\x00",
]
yaml_like = st.lists(st.sampled_from(YAML_TOKENS), max_size=40).map("".join)


def leaf_paths(node: Any, prefix: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    """Every path to a value in the profile document (mappings and lists)."""
    paths = [prefix]
    if isinstance(node, dict):
        for key, value in node.items():
            paths += leaf_paths(value, (*prefix, key))
    elif isinstance(node, list):
        for i, value in enumerate(node):
            paths += leaf_paths(value, (*prefix, i))
    return paths


PATHS = leaf_paths(BASE)[1:]


def replaced(data: dict[str, Any], path: tuple[Any, ...], value: Any) -> dict[str, Any]:
    data = copy.deepcopy(data)
    node: Any = data
    for part in path[:-1]:
        node = node[part]
    node[path[-1]] = value
    return data


# --------------------------------------------------------------------------- profile


@SETTINGS
@given(text=st.text(max_size=300) | yaml_like)
def test_any_text_as_a_profile_loads_or_is_our_error(scratch: Path, text: str) -> None:
    path = scratch / "cpu-rehearsal.yaml"
    path.write_text(text, encoding="utf-8")
    only_our_errors(lambda: load_profile(path))


@SETTINGS
@given(data=st.binary(max_size=300))
def test_any_bytes_as_a_profile_load_or_are_our_error(scratch: Path, data: bytes) -> None:
    path = scratch / "cpu-rehearsal.yaml"
    path.write_bytes(data)
    only_our_errors(lambda: load_profile(path))


@SETTINGS
@given(extra=yaml_like)
def test_the_real_profile_with_any_yaml_appended_loads_or_is_our_error(extra: str) -> None:
    def load() -> Any:
        return parse_profile(parse_yaml(BASE_TEXT + "\n" + extra, "p"), "p")

    only_our_errors(load)


@SETTINGS
@given(path=st.sampled_from(PATHS), value=json_values)
def test_the_real_profile_with_any_value_anywhere_validates_or_is_our_error(path: tuple[Any, ...], value: Any) -> None:
    """Every field of a real profile replaced by any JSON value: the schema answers, never a
    TypeError from a validator that computed with it; and what loads prints as JSON."""
    result = only_our_errors(lambda: parse_profile(replaced(BASE, path, value), "p"))
    if not isinstance(result, SpecdeployError):
        json.dumps(result.model_dump(mode="json"))


@FEW
@given(data=json_values)
def test_any_yaml_document_of_plain_data_reads_back_as_that_data(data: Any) -> None:
    """What the strict loader reads is what a plain dump wrote (nothing lost, nothing added),
    unless it is refused as too deep: the strictness only refuses, never changes a value."""
    text = yaml.safe_dump(data)
    result = only_our_errors(lambda: parse_yaml(text, "p"))
    if not isinstance(result, SpecdeployError):
        assert json.dumps(result, sort_keys=True) == json.dumps(yaml.safe_load(text), sort_keys=True)


# --------------------------------------------------------------------------- lock


def use(lock: Lock) -> None:
    """What stages do with a lock: read entries, resolve pins, record a new value."""
    for name in list(lock.data["profiles"]) + [PROFILE.name]:
        for key in ("drafter.revision", "drafter.config.canonical_sha256", "target.files@abc", "engine.image.id"):
            entry = lock.get(name, key)
            if entry is not None:
                assert "value" in entry and entry["value"] is not None
                (entry.get("detail") or {}).get("content")
            lock.value(name, key)
    for path, _ in iter_pins(PROFILE):
        only_our_errors(lambda path=path: require(PROFILE, path, lock))
    only_our_errors(lambda: lock.record(PROFILE.name, "drafter.revision", "f" * 40, by="property test"))


@SETTINGS
@given(data=json_values)
def test_any_json_as_a_lock_is_usable_or_our_error(scratch: Path, data: Any) -> None:
    path = scratch / "specdeploy.lock"
    path.write_text(json.dumps(data))
    lock = only_our_errors(lambda: Lock(path))
    if isinstance(lock, Lock):
        use(lock)


JSON_CORNERS = ["1" * 5000, "[" * 100_000, "NaN", "-Infinity", '"\\ud800"', "1e999", '{"a": 1, "a": 2}', "null"]


@SETTINGS
@given(
    data=st.binary(max_size=200)
    | st.text(max_size=200).map(str.encode)
    | st.lists(st.sampled_from(JSON_CORNERS), min_size=1, max_size=3).map(lambda parts: ", ".join(parts).encode())
    | st.sampled_from(JSON_CORNERS).map(lambda v: f'{{"schema_version": 1, "profiles": {{}}, "x": {v}}}'.encode())
)
def test_any_bytes_as_a_lock_are_usable_or_our_error(scratch: Path, data: bytes) -> None:
    path = scratch / "specdeploy.lock"
    path.write_bytes(data)
    lock = only_our_errors(lambda: Lock(path))
    if isinstance(lock, Lock):
        use(lock)


lock_entries = st.fixed_dictionaries(
    {},
    optional={
        "value": json_values,
        "recorded_by": json_values,
        "recorded_at": json_values,
        "detail": json_values | st.fixed_dictionaries({"content": json_values}),
    },
)
lock_keys = st.sampled_from(
    ["drafter.revision", "drafter.config.canonical_sha256", "target.files@abc", "engine.image.id", "x"]
)
lock_docs = st.fixed_dictionaries(
    {},
    optional={
        "schema_version": st.sampled_from([1, 1.0, True, "1", 2, None]),
        "profiles": st.dictionaries(
            st.sampled_from([PROFILE.name, "other"]), st.dictionaries(lock_keys, lock_entries) | json_values
        )
        | json_values,
    },
)


@SETTINGS
@given(data=lock_docs)
def test_any_lock_shaped_json_is_usable_or_our_error(scratch: Path, data: Any) -> None:
    """Near-misses of the lock's shape (the right keys, wrong kinds) are what a hand edit or a
    bad merge leaves: each is refused at once or usable by every stage."""
    path = scratch / "specdeploy.lock"
    path.write_text(json.dumps(data))
    lock = only_our_errors(lambda: Lock(path))
    if isinstance(lock, Lock):
        use(lock)


# --------------------------------------------------------------------------- table cells


printable = st.text(
    alphabet=st.characters(blacklist_categories=("Cc", "Cs", "Co", "Cn", "Zl", "Zp", "Mn", "Me", "Cf")), max_size=40
)


@SETTINGS
@given(value=printable)
def test_a_table_cell_shows_any_text_exactly(value: str) -> None:
    console = Console(width=400, record=True, file=io.StringIO())
    table = Table("value")
    table.add_row(*output.cells(value))
    console.print(table)
    shown = console.export_text()
    assert value.strip() in shown


@SETTINGS
@given(value=json_values)
def test_a_table_cell_shows_any_value_as_its_json(value: Any) -> None:
    text = output.cell(value).plain
    expected = value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)
    # control characters are shown as \xNN, everything else as it is
    assert text == re.sub(r"[\x00-\x08\x0b-\x1f\x7f-\x9f]", lambda m: f"\\x{ord(m.group()):02x}", expected)
