"""`prefix_cache_swap`: a prefix-cache hit hands back blocks cached for a different prefix.

Wraps two methods of vLLM 0.32.0:

- `vllm/v1/core/kv_cache_manager.py` `KVCacheManager.get_computed_blocks(request)`, the scheduler's
  prefix-cache lookup for a new request (`Scheduler._get_local_prefix_cache_hit` in
  `vllm/v1/core/sched/scheduler.py`): the cached full blocks of the request's longest cached prefix, per KV
  cache group, found by `BlockPool.get_cached_block` one block hash at a time. The original decides hit or
  miss, so hits, the hit counter (vllm:prefix_cache_hits_total) and the number of cached tokens stay what
  they would be. When the fault is on and the lookup hit, each hit block is replaced, in order, by a distinct
  cached block of the same group that holds other tokens than every hit block; hit blocks left when no such
  block remains stay. One line per swapped lookup goes to stderr.
- `vllm/v1/core/block_pool.py` `BlockPool.cache_full_blocks(request, blocks, ...)`, only to note which tokens
  each newly cached full block holds (block id -> hash of its token ids), whether or not a fault is on.

Why tokens and not hashes or order: a cached block of the same tokens under another `cache_salt` has another
hash but the same KV, and reordering a request's own hit blocks changes nothing (the keys carry their positions
(RoPE) and attention over a causal prefix does not depend on the blocks' order), so neither would change an
answer. Blocks of other tokens (another prompt's, or another part of the same prompt) make the answer
conditioned on the wrong context.

The blocks a request computes after a swapped hit are cached under their own (true) hashes with KV computed
from the wrong context, and stay cached after the fault is switched off: give each phase of a test its own
`cache_salt`, or restart the engine, to keep a later phase off them.
"""

from __future__ import annotations

import functools
import os
from typing import Any

from . import control

_MARK = "_specdeploy_faults_wrapped"
# block id -> hash of the token ids of the full block cached in it (stale entries are never looked at: only
# blocks in the prefix cache's map are)
_tokens: dict[int, int] = {}


def _replacements(pool: Any, hit: list[Any], group_id: int) -> list[Any]:
    """Distinct cached blocks of `group_id`, none of them a hit block, each holding other tokens than every
    hit block."""
    from vllm.v1.core.kv_cache_utils import get_group_id

    hit_ids = {block.block_id for block in hit}
    hit_tokens = {_tokens.get(block.block_id) for block in hit}
    chosen: list[Any] = []
    cache = pool.cached_block_hash_to_block  # BlockHashToBlockMap; its dict is keyed by hash + group id
    for key in cache._cache:
        if len(chosen) == len(hit):
            break
        if get_group_id(key) != group_id:
            continue
        block = cache.get_one_block(key)
        tokens = None if block is None else _tokens.get(block.block_id)
        if block is None or block.block_id in hit_ids or tokens is None or tokens in hit_tokens:
            continue
        hit_ids.add(block.block_id)
        chosen.append(block)
    return chosen


def _install_lookup() -> None:
    from vllm.v1.core.kv_cache_manager import KVCacheBlocks, KVCacheManager

    original = KVCacheManager.get_computed_blocks
    if getattr(original, _MARK, False):
        return

    @functools.wraps(original)
    def get_computed_blocks(self: Any, request: Any) -> tuple[Any, int, int]:
        blocks, num_computed_tokens, boundary = original(self, request)
        if not num_computed_tokens or control.active() != control.PREFIX_CACHE_SWAP:
            return blocks, num_computed_tokens, boundary
        groups = []
        for group_id, group in enumerate(blocks.blocks):
            hit = list(group)
            others = _replacements(self.block_pool, hit, group_id)
            groups.append(others + hit[len(others) :])
        control.log(
            f"prefix_cache_swap: request {request.request_id} hit {num_computed_tokens} tokens, blocks "
            f"{[[b.block_id for b in g] for g in blocks.blocks]} -> {[[b.block_id for b in g] for g in groups]} "
            f"(pid {os.getpid()})"
        )
        return KVCacheBlocks(tuple(groups)), num_computed_tokens, boundary

    setattr(get_computed_blocks, _MARK, True)
    KVCacheManager.get_computed_blocks = get_computed_blocks  # type: ignore[method-assign]


def _install_notes() -> None:
    from vllm.v1.core.block_pool import BlockPool

    original = BlockPool.cache_full_blocks
    if getattr(original, _MARK, False):
        return

    @functools.wraps(original)
    def cache_full_blocks(
        self: Any,
        request: Any,
        blocks: list[Any],
        num_cached_blocks: int,
        num_full_blocks: int,
        block_size: int,
        *args: Any,
        **kwargs: Any,
    ) -> None:
        original(self, request, blocks, num_cached_blocks, num_full_blocks, block_size, *args, **kwargs)
        tokens = request.all_token_ids
        for index in range(num_cached_blocks, num_full_blocks):
            block = blocks[index]
            if not block.is_null and block.block_hash is not None:
                _tokens[block.block_id] = hash(tuple(tokens[index * block_size : (index + 1) * block_size]))

    setattr(cache_full_blocks, _MARK, True)
    BlockPool.cache_full_blocks = cache_full_blocks  # type: ignore[method-assign]


def install() -> None:
    _install_notes()
    _install_lookup()
