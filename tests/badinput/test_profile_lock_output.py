"""Bad input to the profile, the lock and the tables (issue 20: D6, D9, D13, D14).

`profile show`, `profile list` and `facts` read a profile; every other command reads one
too (`--profile`) and most read the lock (`--lock`), so the lock cases go through
`verify-config`, `write-config` and `image check`. Each case runs the real CLI and checks
what docs/commands.md's bad-input table promises: the exit code, the field or file named, the fix,
no traceback — and where nothing may change (the lock, a serving directory), bytes identical
to before. Inputs that could hang (a FIFO, an alias bomb) run as a subprocess with a deadline.
"""

from __future__ import annotations

import copy
import json
import os
import re
import shutil
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from tests.support.badinput import ROOT, Run, Snapshot, write
from tests.support.variants import drafter_config

from specdeploy.profile import Profile
from specdeploy.rehearsal import variants

BASE = ROOT / "profiles" / "cpu-rehearsal.yaml"
PROFILE_FIX = "profile"  # every profile refusal's fix names the profile (list / path / field)
LOCK_FIX = "restore the lock"


# --------------------------------------------------------------------------- inputs


def base_text() -> str:
    return BASE.read_text(encoding="utf-8")


def base_data() -> dict[str, Any]:
    return yaml.safe_load(base_text())


def profile_file(directory: Path, content: str | bytes | dict[str, Any], name: str = "cpu-rehearsal") -> Path:
    """`<directory>/<name>.yaml` holding `content` (a dict is dumped as YAML)."""
    if isinstance(content, dict):
        content = yaml.safe_dump(content, sort_keys=False)
    return write(directory / f"{name}.yaml", content)


def with_engine_fact(value: Any, data: dict[str, Any] | None = None) -> dict[str, Any]:
    """cpu-rehearsal with one engine fact pinned to `value` (a pin's value may be anything)."""
    data = copy.deepcopy(data or base_data())
    data["engine"]["facts"] = {"shown": {"value": value, "provenance": "rehearsal", "source": "a bad-input case"}}
    return data


def alias_bomb(levels: int = 9) -> str:
    """A billion-laughs document: 9 aliases of 9 aliases ... 9**levels strings from ~1 KB."""
    lines = ["lol0: &a0 [" + ", ".join(['"lol"'] * 9) + "]"]
    lines += [f"lol{i}: &a{i} [" + ", ".join([f"*a{i - 1}"] * 9) + "]" for i in range(1, levels)]
    return "\n".join(lines) + "\n"


def fifo(path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    os.mkfifo(path)
    return path


@pytest.fixture
def dflash_path(tmp_path: Path, dflash_profile: Profile) -> Path:
    return variants.materialize(dflash_profile, tmp_path / "profiles")


@pytest.fixture
def drafter(tmp_path: Path, dflash_profile: Profile) -> Path:
    directory = tmp_path / "drafter"
    write(directory / "config.json", json.dumps(drafter_config(dflash_profile), indent=2))
    write(directory / "model.safetensors", b"weights")
    return directory


# --------------------------------------------------------------------------- profile show (D6, D9, D14)


def test_a_key_written_twice_is_refused_naming_both_lines_not_loaded_as_the_last(run: Run, tmp_path: Path) -> None:
    """The issue's example: `num_speculative_tokens: 5` then `: 15` loaded as 15."""
    text = base_text().replace(
        "    num_speculative_tokens: 3\n", "    num_speculative_tokens: 5\n    num_speculative_tokens: 15\n"
    )
    path = profile_file(tmp_path, text)
    line = text.splitlines().index("    num_speculative_tokens: 5") + 1
    answer = run("profile", "show", path)
    answer.expect(
        2, str(path), "'num_speculative_tokens' appears twice", f"line {line}", f"line {line + 1}", fix="keep one"
    )
    assert "'5'" in answer.text and "'15'" in answer.text


@pytest.mark.parametrize("host", ["0.0.0.0", "10.0.0.5", "::"])
def test_a_venv_engine_listening_beyond_the_loopback_is_refused_naming_what_it_would_expose(
    run: Run, tmp_path: Path, host: str
) -> None:
    """Issue 35: a venv engine binds the host itself; off the loopback every route of it would answer
    the network without the key, past the front and its listener."""
    data = base_data()
    data["engine"]["serve"]["host"] = host
    path = profile_file(tmp_path, data)
    run("profile", "show", path).expect(
        2, str(path), "engine.serve.host", "expected a loopback address", repr(host), "/invocations", fix=PROFILE_FIX
    )


def test_an_alias_bomb_fails_fast_with_a_clear_message(run_process: Run, tmp_path: Path) -> None:
    path = profile_file(tmp_path, base_text() + alias_bomb())
    answer = run_process("profile", "show", path)
    answer.expect(2, str(path), "expands to more than", "aliases", fix="write the values out")


def test_an_alias_that_contains_itself_is_refused_not_a_recursion_error(run: Run, tmp_path: Path) -> None:
    path = profile_file(tmp_path, base_text() + "loop: &loop [1, *loop]\n")
    run("profile", "show", path).expect(2, str(path), "refers to the value that contains it", fix="replace the alias")


def test_a_profile_nested_600_deep_is_refused_not_a_recursion_error(run: Run, tmp_path: Path) -> None:
    path = profile_file(tmp_path, base_text() + "deep: " + "[" * 600 + "]" * 600 + "\n")
    run("profile", "show", path).expect(2, str(path), "nested more than", fix="right file")


def test_a_profile_of_2_mib_is_refused_unread(run: Run, tmp_path: Path) -> None:
    path = profile_file(tmp_path, base_text() + "# " + "x" * (2 * 1024 * 1024) + "\n")
    run("profile", "show", path).expect(2, str(path), "2.0 MiB", "over the 1.0 MiB", fix="right file")


def test_a_profile_that_is_not_utf8_is_refused_naming_the_byte(run: Run, tmp_path: Path) -> None:
    text = base_text().encode()
    path = profile_file(tmp_path, text[:40] + b"\xff\xfe" + text[40:])
    run("profile", "show", path).expect(2, str(path), "not UTF-8", "0xff", "offset 40", fix="UTF-8")


@pytest.mark.parametrize(
    ("field", "text", "found", "fix"),
    [
        ("description", "0x_", "cannot read '0x_' as int", "fix the YAML at that line"),
        ("target.facts.hidden_size", "!!binary /w==", "tag tag:yaml.org,2002:binary", "remove the tag"),
    ],
    ids=["a-scalar-yaml-cannot-convert", "a-binary-value"],
)
def test_a_scalar_that_is_not_plain_data_is_refused_naming_its_line(
    run: Run, tmp_path: Path, field: str, text: str, found: str, fix: str
) -> None:
    if field == "description":
        content = re.sub(r"description: >-\n(  .*\n)+", f"description: {text}\n", base_text())
    else:
        content = base_text().replace("      value: 128\n", f"      value: {text}\n", 1)
    path = profile_file(tmp_path, content)
    answer = run("profile", "show", path, "--json")
    answer.expect(2, str(path), found, "line", fix=fix)


def test_a_date_like_description_is_read_as_the_text_it_is(run: Run, tmp_path: Path) -> None:
    """YAML 1.1 reads `2001-13-45` as a timestamp (and crashed on the month): a profile is text."""
    content = re.sub(r"description: >-\n(  .*\n)+", "description: 2001-13-45\n", base_text())
    run("profile", "show", profile_file(tmp_path, content)).expect(0, "cpu-rehearsal", "2001-13-45")


@pytest.mark.parametrize(
    ("name", "found"),
    [("a" * 300, "no profile named 'aaaa"), ("", "the profile is empty")],
    ids=["a-name-longer-than-a-file-name", "an-empty-name"],
)
def test_a_profile_name_that_cannot_be_a_file_is_refused_listing_the_known_ones(
    run: Run, name: str, found: str
) -> None:
    run("profile", "show", name).expect(2, found, fix="profile")


def test_a_profile_that_is_a_directory_is_named_as_a_directory(run: Run, tmp_path: Path) -> None:
    path = tmp_path / "cpu-rehearsal.yaml"
    path.mkdir()
    run("profile", "show", path).expect(2, str(path), "found a directory", fix="profile")


def test_a_profile_that_is_a_fifo_is_refused_at_once(run_process: Run, tmp_path: Path) -> None:
    path = fifo(tmp_path / "cpu-rehearsal.yaml")
    run_process("profile", "show", path).expect(2, str(path), "FIFO", fix="profile")


def test_an_empty_profile_file_says_it_is_empty(run: Run, tmp_path: Path) -> None:
    path = profile_file(tmp_path, "")
    run("profile", "show", path).expect(2, str(path), "the file is empty", fix="committed profile")


def test_a_drafter_block_size_that_is_text_is_refused_not_a_type_error(
    run: Run, tmp_path: Path, dflash_profile: Profile
) -> None:
    data = dflash_profile.model_dump(mode="json")
    data["drafter"]["config"]["expected"]["block_size"]["value"] = "16"
    path = profile_file(tmp_path, data, name=dflash_profile.name)
    run("profile", "show", path).expect(2, str(path), "block_size", "positive integer", "'16'", fix="correct the field")


def test_a_target_fact_that_is_text_is_refused_naming_the_fact(run: Run, tmp_path: Path) -> None:
    data = base_data()
    data["target"]["facts"]["hidden_size"]["value"] = "128"
    path = profile_file(tmp_path, data)
    run("profile", "show", path).expect(2, str(path), "hidden_size", "positive integer", "'128'", fix="correct")


@pytest.mark.parametrize(
    "command",
    [("preflight",), ("verify-config", "{tmp}/drafter"), ("image", "check", "img")],
    ids=["preflight", "verify-config", "image-check"],
)
def test_every_command_refuses_a_profile_that_is_not_utf8_before_it_does_anything(
    run: Run, tmp_path: Path, command: tuple[str, ...]
) -> None:
    path = profile_file(tmp_path, base_text().encode().replace(b"tiny-qwen3", b"tiny-\xe9qwen3", 1))
    argv = [part.format(tmp=tmp_path) for part in command]
    answer = run(*argv, "--profile", path)
    answer.expect(2, str(path), "not UTF-8", "0xe9", fix="UTF-8")


# --------------------------------------------------------------------------- profile list (D6, D9, D14)


def _listed(answer: Any) -> None:
    """The good profiles are listed although one file is broken."""
    assert "a6000-dflash" in answer.stdout and "cpu-rehearsal-0-31" in answer.stdout, answer.stdout


def test_list_names_a_profile_that_is_not_utf8_and_still_lists_the_others(run: Run, tmp_path: Path) -> None:
    path = profile_file(tmp_path, b"schema_version: 1\nname: \xff\n", name="zz-broken")
    answer = run("profile", "list", env={"SPECDEPLOY_PROFILES": str(tmp_path)})
    answer.expect(2, "1 of", str(path), "not UTF-8", fix="fix or remove")
    _listed(answer)


def test_list_refuses_a_profile_with_a_key_written_twice(run: Run, tmp_path: Path) -> None:
    text = base_text().replace("    port: 8100\n", "    port: 8100\n    port: 8101\n")
    path = profile_file(tmp_path, text)
    answer = run("profile", "list", env={"SPECDEPLOY_PROFILES": str(tmp_path)})
    answer.expect(2, str(path), "'port' appears twice", fix="keep one")
    _listed(answer)


def test_list_names_a_directory_called_yaml(run: Run, tmp_path: Path) -> None:
    (tmp_path / "zz-dir.yaml").mkdir()
    answer = run("profile", "list", env={"SPECDEPLOY_PROFILES": str(tmp_path)})
    answer.expect(2, str(tmp_path / "zz-dir.yaml"), "found a directory", fix="fix or remove")
    _listed(answer)


def test_list_does_not_block_on_a_fifo_called_yaml(run_process: Run, tmp_path: Path) -> None:
    path = fifo(tmp_path / "zz-fifo.yaml")
    answer = run_process("profile", "list", env={"SPECDEPLOY_PROFILES": str(tmp_path)})
    answer.expect(2, str(path), "FIFO", fix="fix or remove")


def test_list_does_not_spin_on_an_alias_bomb(run_process: Run, tmp_path: Path) -> None:
    path = profile_file(tmp_path, base_text() + alias_bomb())
    answer = run_process("profile", "list", env={"SPECDEPLOY_PROFILES": str(tmp_path)})
    answer.expect(2, str(path), "expands to more than", fix="fix or remove")


def test_list_json_stays_json_with_the_broken_profile_marked(run: Run, tmp_path: Path) -> None:
    path = profile_file(tmp_path, b"\xff\xfe\x00", name="zz-broken")
    answer = run("profile", "list", "--json", env={"SPECDEPLOY_PROFILES": str(tmp_path)})
    answer.expect(2, str(path), "not UTF-8", fix="fix or remove")
    rows = {r["name"]: r for r in json.loads(answer.stdout)}
    assert "not UTF-8" in rows["zz-broken"]["error"] and rows["a6000-dflash"]["unresolved_pins"] >= 1


# --------------------------------------------------------------------------- facts (D6, D9, D14, bad options)


def test_facts_refuse_a_profile_that_is_not_utf8(run: Run, tmp_path: Path) -> None:
    path = profile_file(tmp_path, base_text().encode() + b"\n# \xc3\x28\n")
    run("facts", "--profile", path).expect(2, str(path), "not UTF-8", fix="UTF-8")


def test_facts_refuse_a_key_written_twice(run: Run, tmp_path: Path) -> None:
    text = base_text().replace("    port: 8100\n", "    port: 8100\n    port: 8200\n")
    path = profile_file(tmp_path, text)
    run("facts", "--profile", path).expect(2, str(path), "'port' appears twice", "'8100'", "'8200'", fix="keep one")


def test_facts_refuse_an_alias_that_contains_itself(run: Run, tmp_path: Path) -> None:
    path = profile_file(tmp_path, base_text() + "loop: &loop {again: *loop}\n")
    run("facts", "--profile", path).expect(2, str(path), "refers to the value that contains it", fix="replace")


def test_facts_do_not_block_on_a_fifo_profile(run_process: Run, tmp_path: Path) -> None:
    path = fifo(tmp_path / "cpu-rehearsal.yaml")
    run_process("facts", "--profile", path).expect(2, str(path), "FIFO", fix="profile")


def test_facts_refuse_a_profile_name_longer_than_a_file_name(run: Run) -> None:
    run("facts", "--profile", "x" * 300).expect(2, "no profile named", fix="known profiles")


@pytest.mark.parametrize(
    "option", ["--models-dir", "--state-dir", "--install-root"], ids=["models-dir", "state-dir", "install-root"]
)
def test_facts_refuse_a_relative_host_path(run: Run, option: str) -> None:
    answer = run("facts", "--profile", "cpu-rehearsal", option, "data/models")
    answer.expect(2, option, "absolute path", "'data/models'", fix="/absolute/path")
    assert answer.stdout == ""


@pytest.mark.parametrize("address", ["models.example.com", "10.0.0.300"], ids=["a-host-name", "not-an-ip"])
def test_facts_refuse_a_publish_host_that_is_not_an_address(run: Run, address: str) -> None:
    answer = run("facts", "--profile", "cpu-rehearsal", "--publish-host", address)
    answer.expect(2, "--publish-host", repr(address), "IP address", fix="IPv4 or IPv6")


def test_facts_take_empty_overrides_as_the_defaults(run: Run) -> None:
    """What the play passes for an inventory without overrides: empty strings."""
    argv = ["--models-dir", "", "--state-dir", "", "--publish-host", "", "--install-root", ""]
    answer = run("facts", "--profile", "cpu-rehearsal", *argv).expect(0, "/var/lib/specdeploy")
    assert json.loads(answer.stdout)["unit"]["publish_host"] == "127.0.0.1"


# --------------------------------------------------------------------------- the lock, through commands (D9, D14)

PROFILE_KEY = "drafter.config.canonical_sha256"  # the entry verify-config reads for this profile


def _entry(**fields: Any) -> dict[str, Any]:
    return {"value": "0" * 64, "recorded_by": "write-config", "recorded_at": "2026-01-01T00:00:00+00:00"} | fields


def _lock(entry: Any, name: str = "cpu-rehearsal-dflash") -> str:
    return json.dumps({"schema_version": 1, "profiles": {name: {PROFILE_KEY: entry}}})


LOCKS: dict[str, tuple[str | bytes, tuple[str, ...]]] = {
    "a-list": ("[1]", ("the top level", "expected an object", "a list")),
    "an-empty-object": ("{}", ("schema_version", "expected 1", "nothing")),
    "no-profiles": ('{"schema_version": 1}', ("field profiles", "nothing")),
    "profiles-a-list": ('{"schema_version": 1, "profiles": []}', ("field profiles", "a list")),
    "an-entry-without-value": (
        _lock({"recorded_by": "fetch", "recorded_at": "x"}),
        (f"{PROFILE_KEY}.value", "nothing"),
    ),
    "detail-a-string": (_lock(_entry(detail="content")), (f"{PROFILE_KEY}.detail", "an object", "'content'")),
    "a-hash-that-is-a-list": (_lock(_entry(value=[1, 2])), (f"{PROFILE_KEY}.value", "a non-empty string", "a list")),
    "schema-version-true": ('{"schema_version": true, "profiles": {}}', ("schema_version", "expected 1", "True")),
    "truncated": ('{"schema_version": 1, "prof', ("not valid JSON", "line 1")),
    "empty": ("", ("not valid JSON",)),
    "not-utf8": (b'{"schema_version": 1, "profiles": {"\xff": {}}}', ("not UTF-8", "0xff")),
    "a-number-of-5000-digits": ('{"schema_version": 1, "profiles": {}, "n": ' + "7" * 5000 + "}", ("not usable JSON",)),
}


@pytest.mark.parametrize("case", list(LOCKS), ids=list(LOCKS))
def test_a_lock_that_is_not_a_lock_is_refused_before_anything_runs(
    run: Run, tmp_path: Path, dflash_path: Path, drafter: Path, snapshot: Callable[..., Snapshot], case: str
) -> None:
    content, names = LOCKS[case]
    lock = write(tmp_path / "specdeploy.lock", content)
    before = snapshot(lock, drafter)
    answer = run("verify-config", drafter, "--profile", dflash_path, "--lock", lock)
    answer.expect(2, "lock file", str(lock), *names, fix=LOCK_FIX)
    before.unchanged()


def test_a_good_lock_still_verifies(run: Run, tmp_path: Path, dflash_path: Path, drafter: Path) -> None:
    """The control: the same command with a well-formed lock (an empty one) passes."""
    lock = write(tmp_path / "specdeploy.lock", '{"schema_version": 1, "profiles": {}}')
    run("verify-config", drafter, "--profile", dflash_path, "--lock", lock).expect(0, "config verified")


def test_a_lock_of_9_mib_is_refused_unread(run: Run, tmp_path: Path, dflash_path: Path, drafter: Path) -> None:
    pad = "x" * (9 * 1024 * 1024)
    lock = write(tmp_path / "specdeploy.lock", json.dumps({"schema_version": 1, "profiles": {}, "pad": pad}))
    answer = run("verify-config", drafter, "--profile", dflash_path, "--lock", lock)
    answer.expect(2, "lock file", str(lock), "9.0 MiB", "over the 8.0 MiB", fix="right file")


def test_a_lock_under_a_regular_file_is_refused(run: Run, tmp_path: Path, dflash_path: Path, drafter: Path) -> None:
    lock = write(tmp_path / "not-a-dir", "x") / "specdeploy.lock"
    answer = run("verify-config", drafter, "--profile", dflash_path, "--lock", lock)
    answer.expect(2, "lock file", str(lock), "a component of the path is a file", fix="--lock")


def test_write_config_with_a_lock_that_is_a_list_changes_nothing(
    run: Run, tmp_path: Path, dflash_path: Path, drafter: Path, snapshot: Callable[..., Snapshot]
) -> None:
    lock = write(tmp_path / "specdeploy.lock", "[]")
    serving = tmp_path / "serving" / "drafter"
    write(serving / "config.json", '{"previous": true}\n')
    before = snapshot(lock, serving, drafter)
    answer = run("write-config", serving, "--profile", dflash_path, "--source", drafter, "--lock", lock)
    answer.expect(2, "lock file", str(lock), "a list", fix=LOCK_FIX)
    before.unchanged()


@pytest.fixture
def podman_stub(tmp_path: Path) -> Path:
    """A podman that answers nothing (the lock must be refused before it is run)."""
    path = write(tmp_path / "bin" / "podman", "#!/bin/sh\necho 'podman stub: not expected to run' >&2\nexit 125\n")
    path.chmod(0o755)
    return path


def test_image_check_with_a_lock_that_is_a_directory_says_so(
    run: Run, tmp_path: Path, podman_stub: Path, snapshot: Callable[..., Snapshot]
) -> None:
    lock = tmp_path / "specdeploy.lock"
    lock.mkdir()
    before = snapshot(lock)
    answer = run(
        "image", "check", "img", "--profile", "cpu-rehearsal-container", "--lock", lock, "--podman", podman_stub
    )
    answer.expect(2, "lock file", str(lock), "found a directory", fix="--lock")
    assert "podman stub" not in answer.text
    before.unchanged()


def test_image_check_does_not_block_on_a_lock_that_is_a_fifo(
    run_process: Run, tmp_path: Path, podman_stub: Path
) -> None:
    lock = fifo(tmp_path / "specdeploy.lock")
    argv = ["image", "check", "img", "--profile", "cpu-rehearsal-container", "--lock", lock, "--podman", podman_stub]
    run_process(*argv).expect(2, "lock file", str(lock), "FIFO", fix="--lock")


# --------------------------------------------------------------------------- tables show every value (D13)


@pytest.fixture
def wide(monkeypatch: pytest.MonkeyPatch) -> None:
    """Tables 400 columns wide: a value is asserted whole, never wrapped inside its cell."""
    from specdeploy.cli import output

    monkeypatch.setattr(output.out, "width", 400)


@pytest.fixture
def short_dir() -> Iterator[Path]:
    """A directory with a short path (a profile's path is a table cell)."""
    directory = Path(tempfile.mkdtemp(prefix="sd-"))
    yield directory
    shutil.rmtree(directory, ignore_errors=True)


def test_show_prints_a_description_holding_markup_as_written(run: Run, tmp_path: Path, wide: None) -> None:
    data = base_data() | {"description": "[bold red]ALERT[/] read me"}
    answer = run("profile", "show", profile_file(tmp_path, data))
    answer.expect(0, "[bold red]ALERT[/] read me")


@pytest.mark.parametrize(
    ("value", "shown"),
    [
        ([True, None], "[true, null]"),
        ("[true, false]", "[true, false]"),
        ("[null, 1] [bold red]x[/]", "[null, 1] [bold red]x[/]"),
        ("C:\\models\\", "C:\\models\\ "),
        ("\x1b[31mred", "\\x1b[31mred"),
    ],
    ids=["a-list-of-true-and-null", "text-like-a-list", "markup-in-a-value", "a-trailing-backslash", "an-escape-code"],
)
def test_show_prints_every_pin_value_exactly(run: Run, tmp_path: Path, wide: None, value: Any, shown: str) -> None:
    answer = run("profile", "show", profile_file(tmp_path, with_engine_fact(value)))
    answer.expect(0, "engine.facts.shown", shown)
    assert "\x1b" not in answer.stdout and "C:\\models\\\\" not in answer.stdout


def test_list_shows_an_engine_version_that_looks_like_markup(run: Run, short_dir: Path, wide: None) -> None:
    data = base_data()
    data["engine"]["source"]["version"]["value"] = "[true, false]"
    profile_file(short_dir, data)
    run("profile", "list", env={"SPECDEPLOY_PROFILES": str(short_dir)}).expect(0, "vllm [true, false]")


def test_list_shows_a_profile_directory_whose_name_looks_like_markup(run: Run, short_dir: Path, wide: None) -> None:
    directory = short_dir / "[red]site[/]"
    path = profile_file(directory, base_data())
    run("profile", "list", env={"SPECDEPLOY_PROFILES": str(directory)}).expect(0, str(path))


def test_an_error_names_a_path_that_looks_like_markup_exactly(run: Run, tmp_path: Path) -> None:
    path = profile_file(tmp_path / "[bold]x[/]", "schema_version: 2\n")
    run("profile", "show", path).expect(2, f"{path}: field schema_version", "found 2", fix="upgrade")


def test_every_table_row_goes_through_the_output_helper() -> None:
    """The structural half of D13: a cell added without `output.cells` would be read as markup."""
    rows = []
    for path in sorted((ROOT / "python" / "specdeploy" / "cli").glob("*.py")):
        text = path.read_text()
        rows += [f"{path.name}: {m.group()}" for m in re.finditer(r"add_row\((?!\s*\*output\.cells\()[^\n]*", text)]
    assert rows == []
