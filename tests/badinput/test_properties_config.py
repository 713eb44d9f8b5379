"""Property tests for the config parsers behind `verify-config` and `write-config`: whatever a
drafter's or a target's config.json holds — arbitrary bytes, arbitrary JSON, a valid config with
any field replaced by any JSON value — verification answers with a report or with one of
specdeploy's own errors (a SpecdeployError: a message, a fix and an exit code), never with an
exception that the CLI would call a bug."""

from __future__ import annotations

import json
import math
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from specdeploy.core.errors import SpecdeployError
from specdeploy.drafter import verify
from specdeploy.profile import Profile, drafter_fields
from specdeploy.rehearsal import variants

# Per example: typical runs take milliseconds (--hypothesis-show-statistics); an input that makes a parser
# unbounded (D14: minutes) fails at once, while a loaded 2-core CI machine has room to spare.
DEADLINE = timedelta(seconds=2)

SETTINGS = settings(
    max_examples=200,
    deadline=DEADLINE,
    derandomize=True,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)

# Keys a real config uses (so examples reach the checks, not only the "absent" rows), and any text.
KEYS = sorted(
    {part for f in drafter_fields.FIELDS.values() for path in f.paths for part in path.split(".")}
    | {"text_config", "swa_window_size", "model_type"}
)
SCALARS = (
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**70), max_value=2**70)
    | st.floats(allow_nan=True, allow_infinity=True)
    | st.text(max_size=12)
)
JSON = st.recursive(
    SCALARS,
    lambda children: (
        st.lists(children, max_size=5)
        | st.dictionaries(st.sampled_from(KEYS) | st.text(max_size=8), children, max_size=5)
    ),
    max_leaves=25,
)


@pytest.fixture(scope="module")
def profile() -> Profile:
    return variants.dflash()


def good_config(profile: Profile) -> dict[str, Any]:
    layers = profile.drafter_expected("num_hidden_layers")
    return {
        "architectures": ["DFlashDraftModel"],
        "vocab_size": profile.target.facts.vocab_size.value,
        "hidden_size": profile.drafter_expected("hidden_size"),
        "num_hidden_layers": layers,
        "rope_parameters": {"rope_theta": 10000.0},
        "layer_types": ["full_attention"] * layers,
        "dflash_config": {
            "mask_token_id": profile.drafter_expected("mask_token_id"),
            "target_layer_ids": profile.drafter_expected("target_layer_ids"),
            "block_size": profile.drafter_expected("block_size"),
        },
    }


def _dumps(document: Any) -> bytes:
    return json.dumps(document, ensure_ascii=False, allow_nan=True).encode("utf-8", "surrogatepass")


def verifies_or_refuses(config: Path, profile: Profile, target: Path | None = None) -> None:
    """The property: a Report, or a SpecdeployError with a message; nothing else escapes."""
    try:
        report = verify.verify(config, profile, target_dir=target)
    except SpecdeployError as exc:
        assert exc.message and 0 < exc.exit_code < 70
        return
    json.dumps(report.to_json(), default=str)  # the report itself renders (the CLI prints it)


@SETTINGS
@given(data=st.binary(max_size=2048))
def test_arbitrary_bytes_as_a_drafter_config_json_only_raise_specdeploy_errors(
    tmp_path: Path, profile: Profile, data: bytes
) -> None:
    config = tmp_path / "config.json"
    config.write_bytes(data)
    verifies_or_refuses(config, profile)


@SETTINGS
@given(document=JSON)
def test_arbitrary_json_as_a_drafter_config_json_only_raise_specdeploy_errors(
    tmp_path: Path, profile: Profile, document: Any
) -> None:
    config = tmp_path / "config.json"
    config.write_bytes(_dumps(document))
    verifies_or_refuses(config, profile)


@SETTINGS
@given(path=st.sampled_from(sorted({p for f in drafter_fields.FIELDS.values() for p in f.paths})), value=JSON)
def test_a_valid_drafter_config_with_any_field_set_to_any_json_only_raises_specdeploy_errors(
    tmp_path: Path, profile: Profile, path: str, value: Any
) -> None:
    document = good_config(profile)
    node = document
    *parents, last = path.split(".")
    for key in parents:
        node = node.setdefault(key, {})
    node[last] = value
    config = tmp_path / "config.json"
    config.write_bytes(_dumps(document))
    verifies_or_refuses(config, profile)


@SETTINGS
@given(document=JSON)
def test_arbitrary_json_as_a_target_config_json_only_raise_specdeploy_errors(
    tmp_path: Path, profile: Profile, document: Any
) -> None:
    drafter = tmp_path / "drafter" / "config.json"
    drafter.parent.mkdir(exist_ok=True)
    drafter.write_bytes(_dumps(good_config(profile)))
    target = tmp_path / "target" / "config.json"
    target.parent.mkdir(exist_ok=True)
    target.write_bytes(_dumps(document))
    verifies_or_refuses(drafter, profile, target.parent)


@SETTINGS
@given(data=st.binary(max_size=1024))
def test_arbitrary_bytes_as_a_target_config_json_only_raise_specdeploy_errors(
    tmp_path: Path, profile: Profile, data: bytes
) -> None:
    drafter = tmp_path / "drafter" / "config.json"
    drafter.parent.mkdir(exist_ok=True)
    drafter.write_bytes(_dumps(good_config(profile)))
    target = tmp_path / "target" / "config.json"
    target.parent.mkdir(exist_ok=True)
    target.write_bytes(data)
    verifies_or_refuses(drafter, profile, target.parent)


@SETTINGS
@given(document=st.dictionaries(st.sampled_from(KEYS) | st.text(max_size=8), JSON, max_size=8))
def test_the_dialect_lookups_never_raise_and_a_conflict_names_every_place(document: dict[str, Any]) -> None:
    for name in drafter_fields.FIELDS:
        where, value = drafter_fields.find(document, name)
        places = drafter_fields.places(document, name)
        assert (where is None) == (not places)
        conflict = drafter_fields.conflict(document, name)
        assert conflict in ([], places)
        if len(places) < 2:
            assert conflict == []


def test_equal_numbers_in_both_dialects_are_no_conflict() -> None:
    """10000000 and 10000000.0 (transformers writes either) are one value; true and 1 are not."""
    assert drafter_fields.conflict({"rope_theta": 10000000, "rope_parameters": {"rope_theta": 1e7}}, "rope_theta") == []
    assert drafter_fields.conflict({"block_size": True, "dflash_config": {"block_size": 1}}, "block_size")
    assert drafter_fields.conflict({"block_size": math.nan, "dflash_config": {"block_size": 4}}, "block_size")
