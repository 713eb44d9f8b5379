"""HTTP clients for the engines the smoke test talks to: vLLM and SGLang.

Both expose the OpenAI-compatible chat API, which the coherence checks use. They differ
where speculative decoding is measured: vLLM exposes server-wide Prometheus counters
(read as before/after deltas around our own requests), SGLang reports per request in the
native /generate endpoint's `meta_info` (completion_tokens / spec_verify_ct). Identity
comes from vLLM's /version and SGLang's /server_info (older: /get_server_info).
"""

from __future__ import annotations

import json
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import httpx

from specdeploy.smoke import metrics
from specdeploy.smoke.acceptance import Sample


class EngineUnavailable(Exception):
    """The server cannot be reached or answered with a server error: the smoke cannot test."""


@dataclass(frozen=True)
class Identity:
    kind: str
    version: str


@dataclass(frozen=True)
class Completion:
    text: str
    finish_reason: str | None
    completion_tokens: int


@dataclass(frozen=True)
class Wave:
    """One wave of concurrent acceptance requests: their texts and the counters they moved."""

    completions: list[Completion]
    sample: Sample
    other_requests: int  # requests the server finished during the wave that were not ours


@dataclass(frozen=True)
class Throughput:
    ttft_s: float
    decode_tokens_per_s: float
    tokens: int


class EngineClient:
    def __init__(self, base_url: str, model: str, *, api_key: str | None = None, timeout: float = 300) -> None:
        self.base_url = base_url.rstrip("/")
        self.model = model
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self.http = httpx.Client(base_url=self.base_url, headers=headers, timeout=timeout)

    def close(self) -> None:
        self.http.close()

    # ------------------------------------------------------------------ plumbing

    def _request(self, method: str, path: str, **kwargs: Any) -> httpx.Response:
        try:
            response = self.http.request(method, path, **kwargs)
        except httpx.HTTPError as exc:
            raise EngineUnavailable(f"{method} {self.base_url}{path}: {type(exc).__name__}: {exc}") from None
        if response.status_code >= 500:
            raise EngineUnavailable(
                f"{method} {self.base_url}{path}: HTTP {response.status_code}: {response.text[:300]}"
            )
        return response

    def _json(self, method: str, path: str, **kwargs: Any) -> Any:
        response = self._request(method, path, **kwargs)
        if response.status_code >= 400:
            raise EngineUnavailable(f"{method} {path}: HTTP {response.status_code}: {response.text[:300]}")
        return response.json()

    # ------------------------------------------------------------------ common API

    def healthy(self) -> bool:
        try:
            return self.http.get("/health", timeout=5).status_code == 200
        except httpx.HTTPError:
            return False

    def served_models(self) -> list[str]:
        return [m["id"] for m in self._json("GET", "/v1/models").get("data", [])]

    def chat(self, prompt: str, *, max_tokens: int, template_kwargs: dict[str, Any] | None = None) -> Completion:
        body: dict[str, Any] = {
            "model": self.model,
            "messages": [{"role": "user", "content": prompt}],
            "max_tokens": max_tokens,
            "temperature": 0,
        }
        if template_kwargs:
            body["chat_template_kwargs"] = template_kwargs
        data = self._json("POST", "/v1/chat/completions", json=body)
        choice = data["choices"][0]
        return Completion(
            choice["message"].get("content") or "",
            choice.get("finish_reason"),
            int(data.get("usage", {}).get("completion_tokens", 0)),
        )

    def stream_completion(self, prompt: str, *, max_tokens: int) -> Throughput:
        """Time to first token and decode rate of one streamed completion (concurrency 1).

        A raw completion prompt, not chat: the same text every run, with no chat template or
        thinking block to shift the length, so figures compare across deploys.
        """
        body = {
            "model": self.model,
            "prompt": prompt,
            "max_tokens": max_tokens,
            "temperature": 0,
            "stream": True,
            "stream_options": {"include_usage": True},
        }
        start = time.monotonic()
        first = last = None
        tokens = 0
        try:
            with self.http.stream("POST", "/v1/completions", json=body) as response:
                if response.status_code >= 400:
                    raise EngineUnavailable(f"stream: HTTP {response.status_code}")
                for line in response.iter_lines():
                    if not line.startswith("data: ") or line == "data: [DONE]":
                        continue
                    chunk = json.loads(line[6:])
                    if chunk.get("usage"):
                        tokens = int(chunk["usage"].get("completion_tokens", tokens))
                    if any(c.get("text") for c in chunk.get("choices", [])):
                        now = time.monotonic()
                        first = first or now
                        last = now
        except httpx.HTTPError as exc:
            raise EngineUnavailable(f"stream: {type(exc).__name__}: {exc}") from None
        if first is None or last is None:
            return Throughput(float("nan"), 0.0, tokens)
        decode = (tokens - 1) / (last - first) if tokens > 1 and last > first else 0.0
        return Throughput(first - start, decode, tokens)

    # ------------------------------------------------------------------ per engine

    def identity(self) -> Identity:
        raise NotImplementedError

    def acceptance_wave(self, prompts: list[str], *, max_tokens: int) -> Wave:
        raise NotImplementedError


class VLLMClient(EngineClient):
    def identity(self) -> Identity:
        response = self._request("GET", "/version")
        if response.status_code == 404:
            return Identity("not vllm (no /version)", "")
        return Identity("vllm", str(response.json().get("version", "")))

    def _complete(self, prompt: str, max_tokens: int) -> Completion:
        data = self._json(
            "POST",
            "/v1/completions",
            json={"model": self.model, "prompt": prompt, "max_tokens": max_tokens, "temperature": 0},
        )
        choice = data["choices"][0]
        return Completion(choice["text"], choice.get("finish_reason"), int(data["usage"]["completion_tokens"]))

    def _counters(self) -> dict[str, Any]:
        try:
            return metrics.scrape(self.base_url)
        except httpx.HTTPError as exc:
            raise EngineUnavailable(f"GET {self.base_url}/metrics: {exc}") from None

    def acceptance_wave(self, prompts: list[str], *, max_tokens: int) -> Wave:
        before = self._counters()
        with ThreadPoolExecutor(max_workers=len(prompts)) as pool:
            completions = list(pool.map(lambda p: self._complete(p, max_tokens), prompts))
        after = self._counters()

        def delta(name: str) -> float:
            return metrics.total(after, name) - metrics.total(before, name)

        positions = sorted({dict(labels)["position"] for labels in after.get(metrics.ACCEPTED_PER_POS, {})}, key=int)
        per_pos = tuple(
            after[metrics.ACCEPTED_PER_POS].get((("position", p),), 0.0)
            - before.get(metrics.ACCEPTED_PER_POS, {}).get((("position", p),), 0.0)
            for p in positions
        )
        finished = delta(metrics.REQUESTS_FINISHED)
        return Wave(
            completions,
            Sample(
                delta(metrics.DRAFTS),
                delta(metrics.DRAFT_TOKENS),
                delta(metrics.ACCEPTED),
                per_pos,
                len(prompts),
            ),
            other_requests=max(0, int(round(finished)) - len(prompts)),
        )


class SGLangClient(EngineClient):
    def identity(self) -> Identity:
        for path in ("/server_info", "/get_server_info"):
            response = self._request("GET", path)
            if response.status_code == 200:
                return Identity("sglang", str(response.json().get("version", "")))
        return Identity("not sglang (no /server_info or /get_server_info)", "")

    def _generate(self, prompt: str, max_tokens: int) -> tuple[Completion, dict[str, Any]]:
        data = self._json(
            "POST",
            "/generate",
            json={"text": prompt, "sampling_params": {"max_new_tokens": max_tokens, "temperature": 0}},
        )
        meta = data.get("meta_info", {})
        reason = meta.get("finish_reason")
        reason = reason.get("type") if isinstance(reason, dict) else reason
        return Completion(data.get("text", ""), reason, int(meta.get("completion_tokens", 0))), meta

    def acceptance_wave(self, prompts: list[str], *, max_tokens: int) -> Wave:
        """SGLang: per request, acceptance length = completion_tokens / spec_verify_ct, so
        one verify step emits (accepted + 1) tokens: drafts = verify steps, accepted =
        completion_tokens - verify steps. Per-position rates are not reported."""
        with ThreadPoolExecutor(max_workers=len(prompts)) as pool:
            results = list(pool.map(lambda p: self._generate(p, max_tokens), prompts))
        verify = sum(float(meta.get("spec_verify_ct", 0)) for _, meta in results)
        tokens = sum(c.completion_tokens for c, _ in results)
        accepted = max(0.0, tokens - verify) if verify else 0.0
        return Wave([c for c, _ in results], Sample(verify, 0.0, accepted, (), len(prompts)), other_requests=0)


def client_for(kind: str, base_url: str, model: str, *, api_key: str | None = None) -> EngineClient:
    return (VLLMClient if kind == "vllm" else SGLangClient)(base_url, model, api_key=api_key)
