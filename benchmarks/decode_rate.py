"""Benchmark: where a streamed decode rate comes from on the CPU rehearsal, and why the client's
timing of a stream alone once printed 189470 tok/s.

Starts (or reuses) the `healthy` stack, then streams the profile's first acceptance prompt N times
and prints, per run: the tokens, the reads that carried text (distinct arrival times), the client's
naive figure (tokens after the first over first-to-last text chunk, as the smoke computed it before
issue 22), the guarded client figure, and the rate from the engine's own counters
(`vllm:request_decode_time_seconds`). Not a test: figures vary with the machine.

    python benchmarks/decode_rate.py [--runs 5] [--max-tokens N] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import time

import httpx
from rich.console import Console
from rich.table import Table

from specdeploy.rehearsal import stacks
from specdeploy.smoke import metrics, responses
from specdeploy.smoke.clients import stream_rate


def _engine() -> tuple[str, object]:
    state = stacks.status("healthy")
    if state["state"] != "ready":
        stacks.stop("healthy")
        engine = stacks.start("healthy")
        engine.wait_ready(timeout=900)
        return engine.url, engine.profile
    from specdeploy.profile import load_profile

    return state["url"], load_profile(state["profile"])


def _one(url: str, model: str, prompt: str, max_tokens: int) -> dict[str, object]:
    body = {
        "model": model,
        "prompt": prompt,
        "max_tokens": max_tokens,
        "temperature": 0,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    before = metrics.scrape(url)
    arrivals: list[float] = []
    tokens = 0
    with httpx.stream("POST", f"{url}/v1/completions", json=body, timeout=300) as response:
        for line in response.iter_lines():
            chunk = responses.parse_stream_line(line)
            if chunk is None:
                continue
            if chunk.completion_tokens is not None:
                tokens = chunk.completion_tokens
            if chunk.has_text:
                arrivals.append(time.monotonic())
    after = metrics.scrape(url)
    span = arrivals[-1] - arrivals[0] if len(arrivals) > 1 else 0.0
    naive = (tokens - 1) / span if tokens > 1 and span > 0 else 0.0
    guarded, _, _, note = stream_rate(tokens, arrivals, 16)
    decode_s = metrics.total(after, metrics.DECODE_TIME_SUM) - metrics.total(before, metrics.DECODE_TIME_SUM)
    generated = metrics.total(after, metrics.GENERATION_TOKENS_SUM) - metrics.total(
        before, metrics.GENERATION_TOKENS_SUM
    )
    return {
        "tokens": tokens,
        "text_chunks": len(arrivals),
        "distinct_reads_1ms": len({round(t, 3) for t in arrivals}),
        "span_s": round(span, 6),
        "naive_client_tok_s": round(naive, 1),
        "guarded_client_tok_s": None if guarded is None else round(guarded, 1),
        "guard_note": note,
        "engine_tok_s": round((generated - 1) / decode_s, 1) if decode_s > 0 and generated > 1 else None,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--max-tokens", type=int, default=None)
    parser.add_argument("--json", default=None)
    args = parser.parse_args()
    url, profile = _engine()
    prompt = profile.smoke.prompts.acceptance[0]  # type: ignore[attr-defined]
    max_tokens = args.max_tokens or profile.smoke.acceptance_max_tokens  # type: ignore[attr-defined]
    model = profile.engine.serve.served_model_name  # type: ignore[attr-defined]
    rows = [_one(url, model, prompt, max_tokens) for _ in range(args.runs)]
    table = Table(*rows[0].keys(), title=f"decode rate, healthy stack, prompt {prompt!r}, max_tokens {max_tokens}")
    for row in rows:
        table.add_row(*(str(v) for v in row.values()))
    Console().print(table)
    text = json.dumps(rows, indent=2)
    print(text)
    if args.json:
        with open(args.json, "w") as f:
            f.write(text)


if __name__ == "__main__":
    main()
