"""Profile variants only the tests need (the shared ones live in specdeploy.rehearsal.variants)."""

from __future__ import annotations

from typing import Any

from specdeploy.profile import Profile
from specdeploy.rehearsal.variants import derive


def engine_version(base: Profile, version: str) -> Profile:
    """The profile pinning another engine version: what a host with the wrong build looks like."""
    pin = {"value": version, "provenance": "rehearsal", "source": "test variant: a different engine version"}
    return derive(base, f"{base.name}-v{version.replace('.', '-')}", {"engine": {"source": {"version": pin}}})


def drafter_config(profile: Profile) -> dict[str, Any]:
    """A drafter config.json that verifies against the rehearsal DFlash profile (the fixture's
    nested dialect), written without transformers so a case takes milliseconds."""
    facts = profile.target.facts
    layers = profile.drafter_expected("num_hidden_layers")
    return {
        "architectures": ["DFlashDraftModel"],
        "model_type": "qwen3",
        "vocab_size": facts.vocab_size.value,
        "hidden_size": profile.drafter_expected("hidden_size"),
        "num_hidden_layers": layers,
        "num_attention_heads": 2,
        "num_key_value_heads": 1,
        "head_dim": 64,
        "rope_parameters": {"rope_theta": 10000.0, "rope_type": "default"},
        "sliding_window": None,
        "layer_types": profile.drafter_expected("layer_types") or ["full_attention"] * layers,
        "dflash_config": {
            "mask_token_id": profile.drafter_expected("mask_token_id"),
            "target_layer_ids": profile.drafter_expected("target_layer_ids"),
            "block_size": profile.drafter_expected("block_size"),
        },
    }
