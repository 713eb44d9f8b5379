"""Bad input to `verify-config` and `write-config` (issue 20: D1, D9, D11, D12, D14, D17).

Each case runs the real CLI the way a user (or the drafter_config role) does and checks what
docs/commands.md's bad-input table promises: the exit code, the field or file named, the fix, no
traceback — and, where nothing may change, every file under the serving root, the lock and the
rollback directory byte-identical to before. Inputs that could hang (a FIFO) or once took
minutes (a 9 MiB config, a 400k-entry list) run as a subprocess with a deadline.
"""

from __future__ import annotations

import copy
import json
import os
import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from tests.support.badinput import Run, Snapshot, download, write, write_config

from specdeploy.profile import Profile

TARGET_FIX = "pass --target"
DRAFTER_FIX = "fetch the drafter"


# --------------------------------------------------------------------------- inputs


def target_config(profile: Profile) -> dict[str, Any]:
    facts = profile.target.facts
    return {
        "num_hidden_layers": facts.num_hidden_layers.value,
        "hidden_size": facts.hidden_size.value,
        "vocab_size": facts.vocab_size.value,
    }


# ------------------------------------------------------------------ verify-config: the target (D9, D17)


@pytest.mark.parametrize(
    "hidden_size",
    ["abc", 128.5, True, [128]],
    ids=["a-string", "a-float", "a-boolean", "a-list"],
)
def test_a_target_config_whose_hidden_size_is_not_an_integer_is_refused_naming_the_field(
    run: Run, tmp_path: Path, profile_path: Path, good: dict[str, Any], dflash_profile: Profile, hidden_size: Any
) -> None:
    drafter = download(tmp_path / "drafter", good)
    target = write(
        tmp_path / "target" / "config.json", json.dumps(dict(target_config(dflash_profile), hidden_size=hidden_size))
    )
    answer = run("verify-config", drafter, "--profile", profile_path, "--target", target.parent)
    answer.expect(2, "hidden_size", "expected a positive integer", str(target), fix=TARGET_FIX)


def test_a_target_config_with_text_config_null_uses_its_top_level_fields(
    run: Run, tmp_path: Path, profile_path: Path, good: dict[str, Any], dflash_profile: Profile
) -> None:
    """transformers writes `text_config: null` for a model without one: the facts are at the top."""
    drafter = download(tmp_path / "drafter", good)
    target = write(
        tmp_path / "target" / "config.json", json.dumps(dict(target_config(dflash_profile), text_config=None))
    )
    run("verify-config", drafter, "--profile", profile_path, "--target", target.parent).expect(0, "config verified")


def test_a_target_config_with_text_config_null_and_no_facts_is_refused_naming_the_missing_field(
    run: Run, tmp_path: Path, profile_path: Path, good: dict[str, Any]
) -> None:
    drafter = download(tmp_path / "drafter", good)
    target = write(tmp_path / "target" / "config.json", json.dumps({"text_config": None, "model_type": "qwen3"}))
    answer = run("verify-config", drafter, "--profile", profile_path, "--target", target.parent)
    answer.expect(2, "num_hidden_layers", "is missing", str(target), fix=TARGET_FIX)


def test_a_target_config_whose_text_config_is_a_string_is_refused_naming_text_config(
    run: Run, tmp_path: Path, profile_path: Path, good: dict[str, Any]
) -> None:
    drafter = download(tmp_path / "drafter", good)
    target = write(tmp_path / "target" / "config.json", json.dumps({"text_config": "qwen3"}))
    answer = run("verify-config", drafter, "--profile", profile_path, "--target", target.parent)
    answer.expect(2, "text_config", "expected an object", '"qwen3"', fix=TARGET_FIX)


def test_a_missing_target_directory_gets_a_hint_about_the_target_not_the_drafter(
    run: Run, tmp_path: Path, profile_path: Path, good: dict[str, Any]
) -> None:
    drafter = download(tmp_path / "drafter", good)
    answer = run("verify-config", drafter, "--profile", profile_path, "--target", tmp_path / "no-target")
    answer.expect(2, "target config", str(tmp_path / "no-target"), "does not exist", fix=TARGET_FIX)
    assert DRAFTER_FIX not in answer.text


def test_a_target_config_that_is_not_utf8_is_refused_naming_the_target(
    run: Run, tmp_path: Path, profile_path: Path, good: dict[str, Any]
) -> None:
    drafter = download(tmp_path / "drafter", good)
    target = write(tmp_path / "target" / "config.json", b'{"hidden_size": "\xff\xfe"}')
    answer = run("verify-config", drafter, "--profile", profile_path, "--target", target.parent)
    answer.expect(2, "target config", str(target), "not UTF-8", fix="UTF-8")
    assert DRAFTER_FIX not in answer.text


# ------------------------------------------------------------------ verify-config: the drafter file (D9, D14, D17)


@pytest.mark.parametrize(
    "text",
    ["[" * 100_000 + "]" * 100_000, '{"a": ' * 900 + "1" + "}" * 900],
    ids=["arrays-100000-deep", "objects-900-deep"],
)
def test_a_deeply_nested_config_json_is_not_usable_json_exit_2(
    run: Run, tmp_path: Path, profile_path: Path, snapshot: Callable[..., Snapshot], text: str
) -> None:
    drafter = download(tmp_path / "drafter", text)
    before = snapshot(drafter)
    answer = run("verify-config", drafter, "--profile", profile_path)
    before.unchanged()
    answer.expect(2, str(drafter / "config.json"), "not usable JSON", "nested", fix="right file")


def test_a_number_of_5000_digits_is_not_usable_json_exit_2(run: Run, tmp_path: Path, profile_path: Path) -> None:
    drafter = download(tmp_path / "drafter", '{"hidden_size": ' + "1" * 5000 + "}")
    answer = run("verify-config", drafter, "--profile", profile_path)
    answer.expect(2, str(drafter / "config.json"), "not usable JSON", fix="right file")


def test_a_config_json_that_is_a_directory_is_reported_at_its_own_path(
    run: Run, tmp_path: Path, profile_path: Path
) -> None:
    drafter = tmp_path / "drafter"
    (drafter / "config.json").mkdir(parents=True)
    answer = run("verify-config", drafter, "--profile", profile_path)
    answer.expect(2, f"{drafter / 'config.json'}:", "found a directory", fix=DRAFTER_FIX)
    assert "config.json/config.json" not in answer.text


def test_a_config_json_directory_given_by_its_own_path_is_reported_at_that_path(
    run: Run, tmp_path: Path, profile_path: Path
) -> None:
    config = tmp_path / "drafter" / "config.json"
    config.mkdir(parents=True)
    answer = run("verify-config", config, "--profile", profile_path)
    answer.expect(2, f"{config}:", "found a directory", fix=DRAFTER_FIX)
    assert "config.json/config.json" not in answer.text


@pytest.mark.parametrize("which", ["drafter", "target"])
def test_a_config_json_that_is_a_fifo_is_refused_at_once(
    run_process: Run, tmp_path: Path, profile_path: Path, good: dict[str, Any], which: str
) -> None:
    drafter = download(tmp_path / "drafter", good)
    fifo_dir = tmp_path / which / "fifo"
    fifo_dir.mkdir(parents=True)
    os.mkfifo(fifo_dir / "config.json")
    args: list[object] = ["verify-config", drafter, "--profile", profile_path]
    args = [*args[:1], fifo_dir, *args[2:]] if which == "drafter" else [*args, "--target", fifo_dir]
    answer = run_process(*args)
    answer.expect(2, str(fifo_dir / "config.json"), "FIFO", fix=DRAFTER_FIX if which == "drafter" else TARGET_FIX)


def test_a_9_mib_config_json_is_refused_without_being_parsed(
    run_process: Run, tmp_path: Path, profile_path: Path
) -> None:
    entries = ",".join(['"full_attention"'] * 560_000)  # ~9.5 MB, over the 8 MiB ceiling
    drafter = download(tmp_path / "drafter", '{"layer_types": [' + entries + "]}")
    answer = run_process("verify-config", drafter, "--profile", profile_path)
    answer.expect(2, str(drafter / "config.json"), "over the 8.0 MiB", fix="right file")


def test_a_400k_entry_layer_types_fails_its_check_fast_and_is_shown_shortened(
    run_process: Run, tmp_path: Path, profile_path: Path, good: dict[str, Any]
) -> None:
    hostile = dict(good, layer_types=["full_attention"] * 400_000)  # ~7 MB: under the ceiling
    drafter = download(tmp_path / "drafter", json.dumps(hostile))
    answer = run_process("verify-config", drafter, "--profile", profile_path)
    answer.expect(1, "layer_types", "(400000", "entries", fix="layer_types: use the drafter's own config.json at the")
    assert len(answer.text) < 50_000, f"the report printed {len(answer.text)} characters"


# ------------------------------------------------------------------ verify-config: contradictory dialects (D12)

CONFLICTS = {
    "block_size": (("block_size",), 16, "dflash_config.block_size"),
    "mask_token_id": (("mask_token_id",), 7, "dflash_config.mask_token_id"),
    "target_layer_ids": (("target_layer_ids",), [0, 1], "dflash_config.target_layer_ids"),
    "rope_theta": (("rope_theta",), 500000.0, "rope_parameters.rope_theta"),
    "sliding_window": (("dflash_config", "swa_window_size"), 1024, "sliding_window"),
}


def _contradict(config: dict[str, Any], name: str) -> tuple[dict[str, Any], str, str]:
    """`config` with `name` also set, differently, in its other dialect's place."""
    config = copy.deepcopy(config)
    path, value, other = CONFLICTS[name]
    if name == "sliding_window":
        config["sliding_window"] = 2048
    node = config
    for key in path[:-1]:
        node = node[key]
    node[path[-1]] = value
    return config, ".".join(path), other


@pytest.mark.parametrize("name", sorted(CONFLICTS))
def test_a_field_set_in_both_dialects_with_different_values_is_refused_naming_both_places(
    run: Run, tmp_path: Path, profile_path: Path, good: dict[str, Any], name: str
) -> None:
    config, here, there = _contradict(good, name)
    drafter = download(tmp_path / "drafter", config)
    answer = run("verify-config", drafter, "--profile", profile_path)
    answer.expect(1, here, there, "different values", "check(s) failed", fix=f"keep {name} in one place with one value")


def test_a_field_set_in_both_dialects_with_one_value_verifies(
    run: Run, tmp_path: Path, profile_path: Path, good: dict[str, Any]
) -> None:
    config = dict(good, block_size=good["dflash_config"]["block_size"])
    drafter = download(tmp_path / "drafter", config)
    run("verify-config", drafter, "--profile", profile_path).expect(0, "config verified")


def test_a_profile_without_a_drafter_is_a_usage_error(run: Run, tmp_path: Path, good: dict[str, Any]) -> None:
    drafter = download(tmp_path / "drafter", good)
    answer = run("verify-config", drafter, "--profile", "a6000-mtp")
    answer.expect(2, "a6000-mtp", "no drafter config", fix="profile of a deployment with a drafter")


# --------------------------------------------------------------------------- write-config


@pytest.fixture
def serving(tmp_path: Path) -> Path:
    """The drafter's serving link, <serving>/drafter (not created)."""
    return tmp_path / "serving" / "drafter"


@pytest.fixture
def lock(tmp_path: Path) -> Path:
    return tmp_path / "state" / "specdeploy.lock"


def _first_write(run: Run, serving: Path, profile: Path, source: Path, tmp_path: Path) -> None:
    """The state before the case: a verified write, with a lock of its own."""
    write_config(run, serving, profile, source, tmp_path / "earlier.lock").expect(0, "config.json written")


@pytest.mark.parametrize("kind", ["regular-file", "fifo"])
def test_a_serving_path_that_is_not_a_link_is_refused_and_nothing_changes(
    run: Run,
    tmp_path: Path,
    profile_path: Path,
    source: Path,
    serving: Path,
    lock: Path,
    snapshot: Callable[..., Snapshot],
    kind: str,
) -> None:
    serving.parent.mkdir(parents=True)
    if kind == "fifo":
        os.mkfifo(serving)
    else:
        serving.write_text("someone's notes\n")
    before = snapshot(serving.parent, lock.parent, source)
    answer = write_config(run, serving, profile_path, source, lock)
    before.unchanged()
    answer.expect(2, str(serving), "expected the drafter's serving link", fix=f"move {serving} away")
    assert "free space" not in answer.text


def test_a_serving_path_under_a_regular_file_is_refused_with_the_right_hint(
    run: Run, tmp_path: Path, profile_path: Path, source: Path, lock: Path, snapshot: Callable[..., Snapshot]
) -> None:
    parent = write(tmp_path / "serving", "not a directory\n")
    before = snapshot(parent, lock.parent)
    answer = write_config(run, parent / "drafter", profile_path, source, lock)
    before.unchanged()
    answer.expect(2, str(parent), "not a directory", fix=f"move {parent} away")
    assert "free space" not in answer.text and "remount" not in answer.text


def test_a_drafter_builds_that_is_a_regular_file_is_refused_and_nothing_changes(
    run: Run,
    tmp_path: Path,
    profile_path: Path,
    source: Path,
    serving: Path,
    lock: Path,
    snapshot: Callable[..., Snapshot],
) -> None:
    builds = write(serving.parent / "drafter-builds", "not a directory\n")
    before = snapshot(serving.parent, lock.parent)
    answer = write_config(run, serving, profile_path, source, lock)
    before.unchanged()
    answer.expect(2, str(builds), "not a directory", fix=f"move {builds} away")
    assert "free space" not in answer.text


def test_a_regular_file_where_a_link_goes_in_an_old_serving_directory_is_never_deleted(
    run: Run,
    tmp_path: Path,
    profile_path: Path,
    source: Path,
    serving: Path,
    lock: Path,
    snapshot: Callable[..., Snapshot],
    good: dict[str, Any],
) -> None:
    """A serving directory from before drafter-builds, where someone copied the weights in:
    write-config replaces such a directory whole, so it must not delete bytes it did not write."""
    write(serving / "config.json", json.dumps(good))
    write(serving / "model.safetensors", b"hand-copied weights")
    before = snapshot(serving.parent, lock.parent)
    answer = write_config(run, serving, profile_path, source, lock)
    before.unchanged()
    answer.expect(2, "model.safetensors", "where a link to the download goes", fix="move")


def test_a_failed_write_does_not_poison_the_lock_for_a_corrected_source(
    run: Run, tmp_path: Path, profile_path: Path, source: Path, serving: Path, lock: Path, good: dict[str, Any]
) -> None:
    """D11: the lock used to record the hash before the write failed, so the next correct
    source was refused as drift."""
    serving.parent.mkdir(parents=True)
    serving.write_text("in the way\n")
    failed = write_config(run, serving, profile_path, source, lock)
    assert not lock.exists(), "a failed write recorded a hash in the lock"
    failed.expect(2, str(serving), fix="move")
    serving.unlink()
    corrected = download(tmp_path / "models" / "drafter" / "rev2", dict(good, rms_norm_eps=1e-5))
    write_config(run, serving, profile_path, corrected, lock).expect(0, "config.json written", "recorded")


@pytest.fixture
def tmpfs(tmp_path: Path) -> Iterator[Path]:
    """A real 256 KiB tmpfs (a full or read-only filesystem, not a patched system call)."""
    if os.geteuid() != 0:
        pytest.skip("mounting a tmpfs needs root (CI runs as root)")
    mount = tmp_path / "mnt"
    mount.mkdir()
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=256k", "tmpfs", str(mount)], capture_output=True).returncode:
        pytest.skip("mount(8) is not permitted here")
    try:
        yield mount
    finally:
        subprocess.run(["umount", "-l", str(mount)], check=False)


@pytest.mark.parametrize("fault", ["full", "read-only"])
def test_a_full_or_read_only_filesystem_changes_nothing_and_says_so(
    run: Run,
    tmp_path: Path,
    tmpfs: Path,
    profile_path: Path,
    source: Path,
    lock: Path,
    good: dict[str, Any],
    snapshot: Callable[..., Snapshot],
    fault: str,
) -> None:
    serving = tmpfs / "serving" / "drafter"
    _first_write(run, serving, profile_path, source, tmp_path)
    newer = download(tmp_path / "models" / "drafter" / "rev2", dict(good, rms_norm_eps=1e-5), "tokenizer.json")
    if fault == "full":
        subprocess.run(["dd", "if=/dev/zero", f"of={tmpfs / 'filler'}", "bs=4k", "count=1000"], capture_output=True)
    else:
        subprocess.run(["mount", "-o", "remount,ro", str(tmpfs)], check=True)
    before = snapshot(tmpfs / "serving", lock.parent, tmp_path / "rollback")
    answer = write_config(
        run, serving, profile_path, newer, lock, "--rollback-dir", tmp_path / "rollback", "--run-id", "r1"
    )
    cause, fix = ("full", "free space") if fault == "full" else ("read-only", "remount")
    before.unchanged()
    answer.expect(1, cause, "nothing was changed", str(serving), fix=fix)


def test_a_write_that_replaces_the_serving_link_is_recorded_for_rollback(
    run: Run, tmp_path: Path, profile_path: Path, source: Path, serving: Path, lock: Path, good: dict[str, Any]
) -> None:
    _first_write(run, serving, profile_path, source, tmp_path)
    previous = os.readlink(serving)
    newer = download(tmp_path / "models" / "drafter" / "rev2", good, "tokenizer.json")
    rollback = tmp_path / "state" / "rollback"
    answer = write_config(run, serving, profile_path, newer, lock, "--rollback-dir", rollback, "--run-id", "r1")
    answer.expect(0, "links updated")
    record = json.loads((rollback / "run.json").read_text())
    assert record["run_id"] == "r1" and [e["path"] for e in record["entries"]] == [str(serving)]
    assert os.readlink(record["entries"][0]["copy"]) == previous, "the kept copy is the link the run replaced"
    assert (serving / "tokenizer.json").is_symlink() and (serving.parent / previous / "config.json").is_file()


def test_an_open_rollback_run_of_another_deploy_is_refused_before_anything_changes(
    run: Run,
    tmp_path: Path,
    profile_path: Path,
    source: Path,
    serving: Path,
    lock: Path,
    snapshot: Callable[..., Snapshot],
) -> None:
    rollback = tmp_path / "state" / "rollback"
    entry = {"path": str(tmp_path / "unit"), "kind": "absent", "saved_at": 0.0, "copy": None}
    write(rollback / "run.json", json.dumps({"run_id": "r0", "closed": None, "entries": [entry]}))
    before = snapshot(tmp_path / "serving", lock.parent)
    answer = write_config(run, serving, profile_path, source, lock, "--rollback-dir", rollback, "--run-id", "r1")
    before.unchanged()
    assert not (tmp_path / "serving").exists(), "no build directory was left behind"
    answer.expect(1, "run r0", "never ended", fix="rollback recover")


def test_a_rollback_dir_without_a_run_id_is_a_usage_error(
    run: Run, tmp_path: Path, profile_path: Path, source: Path, serving: Path, lock: Path
) -> None:
    answer = write_config(run, serving, profile_path, source, lock, "--rollback-dir", tmp_path / "rollback")
    assert not (tmp_path / "serving").exists() and not lock.exists()
    answer.expect(2, "--rollback-dir", "--run-id", fix="--run-id")


def test_a_source_config_json_that_is_a_fifo_is_refused_at_once(
    run_process: Run, tmp_path: Path, profile_path: Path, serving: Path, lock: Path, snapshot: Callable[..., Snapshot]
) -> None:
    source = tmp_path / "models" / "drafter" / "rev1"
    source.mkdir(parents=True)
    os.mkfifo(source / "config.json")
    write(source / "model.safetensors", b"weights")
    answer = run_process("write-config", serving, "--profile", profile_path, "--source", source, "--lock", lock)
    assert not (tmp_path / "serving").exists() and not lock.exists()
    answer.expect(2, str(source / "config.json"), "FIFO", fix=DRAFTER_FIX)


def test_a_source_that_is_a_file_not_a_directory_is_refused(
    run: Run, tmp_path: Path, profile_path: Path, source: Path, serving: Path, lock: Path
) -> None:
    answer = write_config(run, serving, profile_path, source / "config.json", lock)
    assert not (tmp_path / "serving").exists() and not lock.exists()
    answer.expect(2, "--source", str(source / "config.json"), "download directory", fix="pass the directory")


def test_a_deeply_nested_source_config_is_refused_and_nothing_is_written(
    run: Run, tmp_path: Path, profile_path: Path, serving: Path, lock: Path
) -> None:
    source = download(tmp_path / "models" / "drafter" / "rev1", "[" * 100_000 + "]" * 100_000)
    answer = write_config(run, serving, profile_path, source, lock)
    assert not (tmp_path / "serving").exists() and not lock.exists()
    answer.expect(2, str(source / "config.json"), "not usable JSON", fix="right file")


@pytest.mark.parametrize(
    ("target", "field"),
    [({"text_config": None}, "num_hidden_layers"), ({"num_hidden_layers": 4, "hidden_size": "128"}, "hidden_size")],
    ids=["text-config-null", "hidden-size-a-string"],
)
def test_an_unusable_target_config_is_refused_and_nothing_is_written(
    run: Run,
    tmp_path: Path,
    profile_path: Path,
    source: Path,
    serving: Path,
    lock: Path,
    target: dict[str, Any],
    field: str,
) -> None:
    target_dir = write(tmp_path / "target" / "config.json", json.dumps(dict(target, vocab_size=640))).parent
    answer = write_config(run, serving, profile_path, source, lock, "--target", target_dir)
    assert not (tmp_path / "serving").exists() and not lock.exists()
    answer.expect(2, field, str(target_dir / "config.json"), fix=TARGET_FIX)


def test_a_missing_target_is_reported_with_a_hint_about_the_target(
    run: Run, tmp_path: Path, profile_path: Path, source: Path, serving: Path, lock: Path
) -> None:
    answer = write_config(run, serving, profile_path, source, lock, "--target", tmp_path / "no-target")
    assert not (tmp_path / "serving").exists() and not lock.exists()
    answer.expect(2, str(tmp_path / "no-target"), "does not exist", fix=TARGET_FIX)
    assert DRAFTER_FIX not in answer.text


def test_a_contradictory_source_is_refused_and_the_serving_state_is_kept(
    run: Run,
    tmp_path: Path,
    profile_path: Path,
    source: Path,
    serving: Path,
    lock: Path,
    good: dict[str, Any],
    snapshot: Callable[..., Snapshot],
) -> None:
    _first_write(run, serving, profile_path, source, tmp_path)
    config, _, _ = _contradict(good, "block_size")
    contradictory = download(tmp_path / "models" / "drafter" / "rev2", config)
    before = snapshot(serving.parent, lock.parent)
    answer = write_config(run, serving, profile_path, contradictory, lock)
    before.unchanged()
    answer.expect(1, "dflash_config.block_size", "block_size=16", fix="never hand-edit")


def test_a_config_json_directory_in_the_source_is_reported_at_its_own_path(
    run: Run, tmp_path: Path, profile_path: Path, serving: Path, lock: Path
) -> None:
    source = tmp_path / "models" / "drafter" / "rev1"
    (source / "config.json").mkdir(parents=True)
    answer = write_config(run, serving, profile_path, source, lock)
    answer.expect(2, f"{source / 'config.json'}:", "found a directory", fix=DRAFTER_FIX)
    assert "config.json/config.json" not in answer.text


def test_a_profile_without_a_drafter_is_a_usage_error_for_write_config(
    run: Run, tmp_path: Path, source: Path, serving: Path, lock: Path
) -> None:
    answer = write_config(run, serving, "a6000-mtp", source, lock)
    assert not (tmp_path / "serving").exists()
    answer.expect(2, "a6000-mtp", "no drafter", fix="profile of a deployment with a drafter")
