"""Where each DFlash drafter config field lives, in every dialect real drafters use.

Real DFlash drafters disagree on where fields sit: older z-lab drafters keep `block_size`
at the top level, newer ones inside `dflash_config`; `mask_token_id` and
`target_layer_ids` appear in either place; the window is `sliding_window` or
`dflash_config.swa_window_size`; rope settings are `rope_theta` or `rope_parameters`.
Profiles name fields by their *logical* name and this module finds them, so a profile
never depends on one dialect — and each field carries the consequence of getting it
wrong, because "mismatch" alone does not tell an operator why it matters.

A field set in two places with different values (top-level `block_size: 4` beside
`dflash_config.block_size: 16`) is a contradiction, not a dialect: engines read different
places, so the drafter would run with a value its pins were never checked against.
`conflict` finds every such field so verification refuses it naming both places.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

_MISSING = object()


@dataclass(frozen=True)
class LogicalField:
    """A drafter config field: the paths it may live at (first match wins) and why it matters."""

    name: str
    paths: tuple[str, ...]
    consequence: str


FIELDS: dict[str, LogicalField] = {
    f.name: f
    for f in (
        LogicalField(
            "architectures",
            ("architectures",),
            "vLLM will not load the file as a DFlash drafter (unknown or wrong model class)",
        ),
        LogicalField(
            "mask_token_id",
            ("dflash_config.mask_token_id", "mask_token_id"),
            "the drafter fills its block with the wrong token; position-0 acceptance "
            "collapses (seen in the field: 11%)",
        ),
        LogicalField(
            "target_layer_ids",
            ("dflash_config.target_layer_ids", "target_layer_ids"),
            "the drafter reads the wrong hidden states of the target; acceptance collapses toward 1",
        ),
        LogicalField(
            "block_size",
            ("dflash_config.block_size", "block_size"),
            "the drafter proposes a block of the wrong length; num_speculative_tokens must be <= block_size - 1",
        ),
        LogicalField(
            "layer_types",
            ("layer_types",),
            "sliding and full attention layers are mixed up; the drafter attends over "
            "the wrong span and acceptance drops",
        ),
        LogicalField(
            "sliding_window",
            ("sliding_window", "dflash_config.swa_window_size"),
            "sliding-attention layers run without their trained window; acceptance drops on long contexts",
        ),
        LogicalField(
            "num_hidden_layers",
            ("num_hidden_layers",),
            "the layer count disagrees with the shipped weights; loading fails or layers are dropped",
        ),
        LogicalField(
            "hidden_size",
            ("hidden_size",),
            "the drafter cannot consume the target's hidden states; loading fails",
        ),
        LogicalField(
            "vocab_size",
            ("vocab_size",),
            "the drafter's vocabulary disagrees with the target's borrowed embeddings",
        ),
        LogicalField(
            "head_dim",
            ("head_dim",),
            "attention shapes disagree with the shipped weights; loading fails",
        ),
        LogicalField(
            "num_attention_heads",
            ("num_attention_heads",),
            "attention shapes disagree with the shipped weights; loading fails",
        ),
        LogicalField(
            "num_key_value_heads",
            ("num_key_value_heads",),
            "attention shapes disagree with the shipped weights; loading fails",
        ),
        LogicalField(
            "rope_theta",
            ("rope_theta", "rope_parameters.rope_theta"),
            "positions are encoded differently from training; acceptance drops",
        ),
    )
}

KNOWN_ARCHITECTURES = frozenset({"DFlashDraftModel"})
KNOWN_LAYER_TYPES = frozenset({"sliding_attention", "full_attention"})


def _lookup(config: dict[str, Any], path: str) -> Any:
    node: Any = config
    for part in path.split("."):
        if not isinstance(node, dict) or part not in node:
            return _MISSING
        node = node[part]
    return node


def find(config: dict[str, Any], name: str) -> tuple[str | None, Any]:
    """Return (path found at, value) for a logical field, or (None, None) when absent.

    JSON null counts as absent: transformers writes `"sliding_window": null` for models
    without a window, and a drafter may then carry its real window in dflash_config.
    """
    for path in FIELDS[name].paths:
        value = _lookup(config, path)
        if value is not _MISSING and value is not None:
            return path, value
    return None, None


def places(config: dict[str, Any], name: str) -> list[tuple[str, Any]]:
    """Every (path, value) at which a logical field is set, in lookup order (null counts as unset)."""
    found = []
    for path in FIELDS[name].paths:
        value = _lookup(config, path)
        if value is not _MISSING and value is not None:
            found.append((path, value))
    return found


def _equal(a: Any, b: Any) -> bool:
    """Equal as an engine would read them: 10000000 and 10000000.0 agree; true and 1 do not."""
    numbers = (int, float)
    if isinstance(a, numbers) and isinstance(b, numbers) and not isinstance(a, bool) and not isinstance(b, bool):
        return a == b
    return type(a) is type(b) and a == b


def conflict(config: dict[str, Any], name: str) -> list[tuple[str, Any]]:
    """The places a field is set with differing values ([] when set once, or everywhere alike)."""
    found = places(config, name)
    if all(_equal(found[0][1], value) for _, value in found[1:]):
        return []
    return found


MULTI_PLACE = tuple(name for name, f in FIELDS.items() if len(f.paths) > 1)
