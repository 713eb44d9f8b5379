"""`lossy_verifier` and `lossy_under_concurrency`: greedy verification accepts every drafted token.

Wraps vLLM 0.32.0 `vllm/v1/sample/rejection_sampler.py` module function `rejection_sample(...)`, which
`RejectionSampler.forward` looks up as a module global on every call. That is the V1 model runner's verifier
(`GPUModelRunner._sample` -> `self.rejection_sampler`; the CPU model runner, `CPUModelRunner`, inherits it; on
CPU without Triton its kernels are the C++ fallbacks that `CpuPlatform.register_triton_kernel_overrides`
registers, all called from inside `rejection_sample`, so the wrapper sits above either). The V2 model runner
(VLLM_USE_V2_MODEL_RUNNER=1, `vllm/v1/worker/gpu/spec_decode/rejection_sampler.py`) is not patched.

The original runs unchanged; when the fault is on, each greedy request's row of its output is overwritten
with all its draft tokens followed by its bonus token (the target's choice after the last draft, which the
verification pass computed with every draft in context): the result the target would give were it to agree
with the draft everywhere. Random-sampling rows are left alone. `lossy_under_concurrency` does this only when
the verification batch holds more than one request; `lossy_verifier_at_k1` only when the engine drafts one
token a step (`max_spec_len` 1: a sweep over k meets it at k=1 alone).
"""

from __future__ import annotations

import functools
from typing import TYPE_CHECKING, Any

from . import control

if TYPE_CHECKING:
    import torch

_MARK = "_specdeploy_faults_wrapped"


def _accept_all(
    output: torch.Tensor,
    draft_token_ids: torch.Tensor,
    num_draft_tokens: list[int],
    cu_num_draft_tokens: torch.Tensor,
    bonus_token_ids: torch.Tensor,
    sampling_metadata: Any,
) -> None:
    """Rewrite `output` ([batch, max_spec_len + 1], -1 past each request's tokens) in place."""
    if sampling_metadata.all_random:
        return
    greedy = None if sampling_metadata.all_greedy else (sampling_metadata.temperature == 0).tolist()
    ends = cu_num_draft_tokens.tolist()
    bonus = bonus_token_ids.reshape(-1)
    for row, count in enumerate(num_draft_tokens):
        if count == 0 or (greedy is not None and not greedy[row]):
            continue
        output[row, :count] = draft_token_ids[ends[row] - count : ends[row]].to(output.dtype)
        output[row, count] = bonus[row]


def _lossy(num_draft_tokens: list[int], max_spec_len: int) -> bool:
    fault = control.active()
    if fault == control.LOSSY_VERIFIER:
        return True
    if fault == control.LOSSY_AT_K1:
        return max_spec_len == 1
    return fault == control.LOSSY_UNDER_CONCURRENCY and len(num_draft_tokens) > 1


def install() -> None:
    from vllm.v1.sample import rejection_sampler as module

    original = module.rejection_sample
    if getattr(original, _MARK, False):
        return

    @functools.wraps(original)
    def rejection_sample(
        draft_token_ids: torch.Tensor,
        num_draft_tokens: list[int],
        max_spec_len: int,
        cu_num_draft_tokens: torch.Tensor,
        draft_probs: torch.Tensor | None,
        target_logits: torch.Tensor,
        bonus_token_ids: torch.Tensor,
        sampling_metadata: Any,
        *args: Any,
        **kwargs: Any,
    ) -> torch.Tensor:
        output = original(
            draft_token_ids,
            num_draft_tokens,
            max_spec_len,
            cu_num_draft_tokens,
            draft_probs,
            target_logits,
            bonus_token_ids,
            sampling_metadata,
            *args,
            **kwargs,
        )
        if _lossy(num_draft_tokens, max_spec_len):
            _accept_all(
                output, draft_token_ids, num_draft_tokens, cu_num_draft_tokens, bonus_token_ids, sampling_metadata
            )
        return output

    setattr(rejection_sample, _MARK, True)
    module.rejection_sample = rejection_sample
