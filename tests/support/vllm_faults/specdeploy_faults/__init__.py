"""TEST-ONLY vLLM general plugin: runtime faults for proving the gate's checks catch them. Never ship it.

With tests/support/vllm_faults on the engine's PYTHONPATH, vLLM finds the entry point in
specdeploy_faults-0.0.0.dist-info (group vllm.general_plugins) and `vllm.plugins.load_general_plugins` calls
`register` once in every process: the API server (`EngineArgs`), the engine core (`EngineCore.__init__`,
before the scheduler and its KV cache manager exist) and each worker (`WorkerWrapperBase.init_worker`,
before the model runner and its rejection sampler exist). `register` patches nothing unless
$SPECDEPLOY_FAULT_FILE is set; the faults themselves are switched at run time by that file (control.py).

What each fault wraps in vLLM 0.32.0:

- lossy_verifier: vllm/v1/sample/rejection_sampler.py `rejection_sample` (verifier.py);
- lossy_under_concurrency: the same, for verification batches of more than one request only;
- prefix_cache_swap: vllm/v1/core/kv_cache_manager.py `KVCacheManager.get_computed_blocks`, with the tokens
  of each cached block noted by vllm/v1/core/block_pool.py `BlockPool.cache_full_blocks` (prefix_cache.py).
"""

from __future__ import annotations

import os

from . import control, prefix_cache, verifier

__all__ = ["register"]


def register() -> None:
    file = control.path()
    if file is None:
        control.log(f"{control.ENV} is unset: nothing patched (pid {os.getpid()})")
        return
    verifier.install()
    prefix_cache.install()
    control.log(
        f"patched rejection_sample, KVCacheManager.get_computed_blocks and BlockPool.cache_full_blocks in pid "
        f"{os.getpid()}; control file {file} (faults: {', '.join(control.FAULTS)})"
    )
