"""HTTP clients for the engines the smoke test talks to: vLLM and SGLang.

Both expose the OpenAI-compatible chat API, which the coherence checks use. They differ
where speculative decoding is measured: vLLM exposes server-wide Prometheus counters
(read as before/after deltas around our own requests), SGLang reports per request in the
native /generate endpoint's `meta_info` (completion_tokens / spec_verify_ct). Identity
comes from vLLM's /version and SGLang's /server_info (older: /get_server_info).
"""

from __future__ import annotations

import math
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import httpx

from specdeploy.smoke import metrics, responses
from specdeploy.smoke.acceptance import Sample
from specdeploy.smoke.responses import (
    Completion,
    EngineError,
    EngineResponseError,
    EngineUnavailable,
    describe_http_error,
    snippet,
)

__all__ = ["Completion", "EngineError", "EngineResponseError", "EngineUnavailable", "client_for"]

HEALTH_TIMEOUT_S = 5.0  # one readiness probe; the readiness stage never waits past its own deadline


@dataclass(frozen=True)
class Identity:
    kind: str
    version: str


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


def endpoint_problem(url: str) -> str | None:
    """Why `url` is not an engine's base URL (http://HOST:PORT), or None. Checked before the
    first request: a URL without a scheme, or one ending in /v1, otherwise costs the whole
    readiness timeout (30 minutes on the GPU profiles) and ends in "not ready" (issue 20, D5)."""
    text = url.strip()
    if not text:
        return "is empty"
    if "://" not in text:
        return "has no scheme: expected http:// or https:// before the host"
    try:
        parsed = httpx.URL(text)
    except (httpx.InvalidURL, ValueError, TypeError) as exc:
        return f"is not a valid URL ({exc})"
    if parsed.scheme not in ("http", "https"):
        return f"has the scheme {parsed.scheme}://: expected http:// or https://"
    if not parsed.host:
        return "names no host"
    path = parsed.path.rstrip("/")
    if path == "/v1" or path.endswith("/v1") or "/v1/" in path + "/":
        return "ends in /v1: expected the base URL, without /v1 (the smoke adds /v1/... itself)"
    if parsed.query or parsed.fragment:
        return "has a query or fragment: expected a plain base URL"
    return None


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
            raise EngineUnavailable(f"{method} {self.base_url}{path}: {describe_http_error(exc)}") from None
        if response.status_code >= 500:
            raise EngineUnavailable(
                f"{method} {self.base_url}{path}: HTTP {response.status_code}: {snippet(response.text)}"
            )
        return response

    def _json(self, method: str, path: str, **kwargs: Any) -> Any:
        """The JSON body of a 2xx answer; a 4xx or a body that is not JSON is an EngineResponseError."""
        response = self._request(method, path, **kwargs)
        what = f"{method} {self.base_url}{path}"
        if response.status_code >= 400:
            hint = (
                "set $SPECDEPLOY_API_KEY to the key the engine serves with (or the host's key file)"
                if response.status_code in (401, 403)
                else responses.NOT_AN_ENGINE
            )
            raise EngineResponseError(f"{what}: HTTP {response.status_code}: {snippet(response.text)}", hint=hint)
        return responses.decode_json(response.text, f"{what}: HTTP {response.status_code}")

    # ------------------------------------------------------------------ common API

    def healthy(self) -> bool:
        try:
            self.check_health()
        except EngineError:
            return False
        return True

    def check_health(self, timeout: float = HEALTH_TIMEOUT_S) -> None:
        """Return when /health answers 200; else EngineUnavailable with the concrete reason
        (refused, timed out, HTTP status and the first bytes of the body), or EngineResponseError
        where the server has no /health at all (404: not an engine's base URL)."""
        url = f"{self.base_url}/health"
        try:
            response = self.http.get("/health", timeout=timeout)
        except httpx.TimeoutException as exc:
            raise EngineUnavailable(f"GET {url}: {describe_http_error(exc)} after {timeout:g} s") from None
        except httpx.HTTPError as exc:
            raise EngineUnavailable(f"GET {url}: {describe_http_error(exc)}") from None
        if response.status_code == 404:
            raise EngineResponseError(f"GET {url}: HTTP 404: {snippet(response.text)}: no /health here")
        if response.status_code != 200:
            raise EngineUnavailable(f"GET {url}: HTTP {response.status_code}: {snippet(response.text)}")

    def served_models(self, timeout: float | None = None) -> list[str]:
        kwargs = {"timeout": timeout} if timeout is not None else {}
        return responses.parse_models(self._json("GET", "/v1/models", **kwargs), f"GET {self.base_url}/v1/models")

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
        return responses.parse_chat(data, f"POST {self.base_url}/v1/chat/completions")

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
        what = f"POST {self.base_url}/v1/completions (stream)"
        try:
            with self.http.stream("POST", "/v1/completions", json=body) as response:
                if response.status_code >= 400:
                    text = snippet(response.read())
                    error = EngineUnavailable if response.status_code >= 500 else EngineResponseError
                    raise error(f"{what}: HTTP {response.status_code}: {text}")
                for line in response.iter_lines():
                    chunk = responses.parse_stream_line(line, what)
                    if chunk is None:
                        continue
                    if chunk.completion_tokens is not None:
                        tokens = chunk.completion_tokens
                    if chunk.has_text:
                        now = time.monotonic()
                        first = first or now
                        last = now
        except httpx.HTTPError as exc:
            raise EngineUnavailable(f"{what}: {describe_http_error(exc)}") from None
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
        what = f"GET {self.base_url}/version: HTTP {response.status_code}"
        if response.status_code >= 400:
            raise EngineResponseError(f"{what}: {snippet(response.text)}")
        return Identity("vllm", responses.parse_version(responses.decode_json(response.text, what), what))

    def _complete(self, prompt: str, max_tokens: int) -> Completion:
        data = self._json(
            "POST",
            "/v1/completions",
            json={"model": self.model, "prompt": prompt, "max_tokens": max_tokens, "temperature": 0},
        )
        return responses.parse_completion(data, f"POST {self.base_url}/v1/completions")

    def _counters(self) -> metrics.Samples:
        return metrics.scrape(self.base_url)

    def acceptance_wave(self, prompts: list[str], *, max_tokens: int) -> Wave:
        before = self._counters()
        with ThreadPoolExecutor(max_workers=len(prompts)) as pool:
            completions = list(pool.map(lambda p: self._complete(p, max_tokens), prompts))
        after = self._counters()

        def delta(name: str) -> float:
            moved = metrics.total(after, name) - metrics.total(before, name)
            if not math.isfinite(moved):
                raise EngineResponseError(
                    f"GET {self.base_url}/metrics: counter {name} moved by {moved} over a wave: expected a number",
                    hint="read the engine's /metrics by hand; a counter that is not a number is an engine bug",
                )
            return moved

        positions = sorted(_positions(self.base_url, after), key=int)
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


def _positions(base_url: str, samples: metrics.Samples) -> set[str]:
    """The draft positions the per-position counter reports (label `position`, a whole number)."""
    found = set()
    for labels in samples.get(metrics.ACCEPTED_PER_POS, {}):
        position = dict(labels).get("position")
        if position is None or not position.isdigit():
            raise EngineResponseError(
                f"GET {base_url}/metrics: {metrics.ACCEPTED_PER_POS} with labels {dict(labels)}: "
                "expected a label position=<a whole number>",
                hint="this engine's metrics differ from the vLLM version the profile pins: check `specdeploy smoke`'s "
                "identity stage and the image",
            )
        found.add(position)
    return found


class SGLangClient(EngineClient):
    def identity(self) -> Identity:
        for path in ("/server_info", "/get_server_info"):
            response = self._request("GET", path)
            if response.status_code == 200:
                what = f"GET {self.base_url}{path}: HTTP 200"
                return Identity("sglang", responses.parse_version(responses.decode_json(response.text, what), what))
        return Identity("not sglang (no /server_info or /get_server_info)", "")

    def _generate(self, prompt: str, max_tokens: int) -> responses.Generated:
        data = self._json(
            "POST",
            "/generate",
            json={"text": prompt, "sampling_params": {"max_new_tokens": max_tokens, "temperature": 0}},
        )
        return responses.parse_generate(data, f"POST {self.base_url}/generate")

    def acceptance_wave(self, prompts: list[str], *, max_tokens: int) -> Wave:
        """SGLang: per request, acceptance length = completion_tokens / spec_verify_ct, so
        one verify step emits (accepted + 1) tokens: drafts = verify steps, accepted =
        completion_tokens - verify steps. Per-position rates are not reported."""
        with ThreadPoolExecutor(max_workers=len(prompts)) as pool:
            results = list(pool.map(lambda p: self._generate(p, max_tokens), prompts))
        verify = sum(g.spec_verify_ct for g in results)
        tokens = sum(g.completion.completion_tokens for g in results)
        accepted = max(0.0, tokens - verify) if verify else 0.0
        return Wave([g.completion for g in results], Sample(verify, 0.0, accepted, (), len(prompts)), other_requests=0)


def client_for(kind: str, base_url: str, model: str, *, api_key: str | None = None) -> EngineClient:
    return (VLLMClient if kind == "vllm" else SGLangClient)(base_url, model, api_key=api_key)
