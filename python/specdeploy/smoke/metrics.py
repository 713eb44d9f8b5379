"""Scrape and parse engine Prometheus metrics with prometheus_client's own parser.

vLLM's spec-decode counters (docs/sources.md#vllm) are server-wide, so callers take a snapshot
before and after their own requests and use the difference.

A body that is not Prometheus text (an HTML page, garbage) is an `EngineResponseError` naming
the endpoint and the first bytes, never the parser's own exception (issue 20, D2): the smoke
reports it as "could not test".
"""

from __future__ import annotations

from collections import defaultdict

import httpx
from prometheus_client.parser import text_string_to_metric_families

from specdeploy.smoke.responses import EngineResponseError, EngineUnavailable, describe_http_error, snippet

DRAFTS = "vllm:spec_decode_num_drafts_total"
DRAFT_TOKENS = "vllm:spec_decode_num_draft_tokens_total"
ACCEPTED = "vllm:spec_decode_num_accepted_tokens_total"
ACCEPTED_PER_POS = "vllm:spec_decode_num_accepted_tokens_per_pos_total"
REQUESTS_FINISHED = "vllm:request_success_total"
DECODE_TIME_SUM = "vllm:request_decode_time_seconds_sum"
GENERATION_TOKENS_SUM = "vllm:request_generation_tokens_sum"
SPEC_PREFIX = "vllm:spec_decode_"
PREFIX_CACHE_HITS = "vllm:prefix_cache_hits_total"  # prompt tokens served from the prefix cache

Samples = dict[str, dict[tuple[tuple[str, str], ...], float]]


def parse(text: str, what: str = "GET /metrics") -> Samples:
    """Samples by name, then by their label set (minus engine/model_name, which vary by server)."""
    samples: Samples = defaultdict(dict)
    try:
        for family in text_string_to_metric_families(text):
            for s in family.samples:
                labels = tuple(sorted((k, v) for k, v in s.labels.items() if k not in ("engine", "model_name")))
                samples[s.name][labels] = samples[s.name].get(labels, 0.0) + float(s.value)
    except Exception as exc:  # noqa: BLE001 - the third-party parser raises what it likes on a bad body
        raise EngineResponseError(
            f"{what}: expected Prometheus text, found {snippet(text)} ({type(exc).__name__}: {exc})"
        ) from None
    return dict(samples)


def total(samples: Samples, name: str) -> float:
    return sum(samples.get(name, {}).values())


def scrape(base_url: str, timeout: float = 5.0, *, headers: dict[str, str] | None = None) -> Samples:
    url = f"{base_url}/metrics"
    try:
        response = httpx.get(url, timeout=timeout, headers=headers)
    except httpx.HTTPError as exc:
        raise EngineUnavailable(f"GET {url}: {describe_http_error(exc)}") from None
    if response.status_code >= 500:
        raise EngineUnavailable(f"GET {url}: HTTP {response.status_code}: {snippet(response.text)}")
    if response.status_code >= 400:
        raise EngineResponseError(f"GET {url}: HTTP {response.status_code}: {snippet(response.text)}")
    return parse(response.text, f"GET {url}")
