"""Scrape and parse engine Prometheus metrics with prometheus_client's own parser.

vLLM's spec-decode counters (docs/sources.md#vllm) are server-wide, so callers take a snapshot
before and after their own requests and use the difference.
"""

from __future__ import annotations

from collections import defaultdict

import httpx
from prometheus_client.parser import text_string_to_metric_families

DRAFTS = "vllm:spec_decode_num_drafts_total"
DRAFT_TOKENS = "vllm:spec_decode_num_draft_tokens_total"
ACCEPTED = "vllm:spec_decode_num_accepted_tokens_total"
ACCEPTED_PER_POS = "vllm:spec_decode_num_accepted_tokens_per_pos_total"
REQUESTS_FINISHED = "vllm:request_success_total"


def parse(text: str) -> dict[str, dict[tuple[tuple[str, str], ...], float]]:
    """Samples by name, then by their label set (minus engine/model_name, which vary by server)."""
    samples: dict[str, dict[tuple[tuple[str, str], ...], float]] = defaultdict(dict)
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            labels = tuple(sorted((k, v) for k, v in s.labels.items() if k not in ("engine", "model_name")))
            samples[s.name][labels] = samples[s.name].get(labels, 0.0) + s.value
    return dict(samples)


def total(samples: dict[str, dict[tuple[tuple[str, str], ...], float]], name: str) -> float:
    return sum(samples.get(name, {}).values())


def scrape(base_url: str, timeout: float = 5.0) -> dict[str, dict[tuple[tuple[str, str], ...], float]]:
    response = httpx.get(f"{base_url}/metrics", timeout=timeout)
    response.raise_for_status()
    return parse(response.text)
