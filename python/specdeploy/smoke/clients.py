"""HTTP clients for the engines the smoke test talks to: vLLM and SGLang.

Both expose the OpenAI-compatible chat API, which the coherence checks use. They differ
where speculative decoding is measured: vLLM exposes server-wide Prometheus counters
(read as before/after deltas around our own requests), SGLang reports per request in the
native /generate endpoint's `meta_info` (completion_tokens / spec_verify_ct). Identity
comes from vLLM's /version and SGLang's /server_info (older: /get_server_info).
"""

from __future__ import annotations

import dataclasses
import math
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import httpx

from specdeploy.profile import Profile
from specdeploy.smoke import metrics, responses
from specdeploy.smoke.acceptance import Sample
from specdeploy.smoke.responses import (
    Completion,
    EngineError,
    EngineResponseError,
    EngineUnavailable,
    Scored,
    ServedSpeculation,
    describe_http_error,
    snippet,
)

__all__ = ["Completion", "EngineError", "EngineResponseError", "EngineUnavailable", "Scored", "client_for"]

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
class LongContext:
    """The long-context probe's one request: the counters it moved, and its prompt's length."""

    sample: Sample
    prompt_tokens: int | None


# The long-context probe's prompt is this sentence repeated past the position.
LONG_CONTEXT_UNIT = "The quick brown fox jumps over the lazy dog, and the dog sleeps in the sun. "


@dataclass(frozen=True)
class Throughput:
    """One streamed completion's timing. `decode_tokens_per_s` is None when it cannot be measured
    (too few tokens, or chunks that arrived together), with `note` saying why: a 2-core CPU engine was
    once reported decoding 189470 tok/s from two chunks read in one network buffer."""

    ttft_s: float
    decode_tokens_per_s: float | None
    tokens: int
    measured_by: str = "client stream timing"
    note: str = ""


def stream_rate(tokens: int, arrivals: list[float], min_tokens: int) -> tuple[float | None, int, str, str]:
    """(rate, tokens, measured_by, note) from the client's view of a stream: the tokens after the
    first over the time from the first text chunk to the last. Not measurable from fewer than
    `min_tokens` tokens, or when the text came in fewer than 3 reads spread over time (a speculative
    engine streams several tokens per step, and a network buffer can carry several chunks)."""
    how = "client stream timing"
    if tokens < min_tokens:
        return None, tokens, how, f"{tokens} tokens streamed (< {min_tokens}): too few to time the decode"
    distinct = len({round(t, 3) for t in arrivals})  # reads at least a millisecond apart
    if distinct < 3:
        return None, tokens, how, f"the text arrived in {distinct} read(s): no decode timing in it"
    return (tokens - 1) / (arrivals[-1] - arrivals[0]), tokens, how, ""


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
        self.base_url = base_url.strip().rstrip("/")  # as endpoint_problem judged it
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

    def chat(
        self,
        prompt: str,
        *,
        max_tokens: int,
        template_kwargs: dict[str, Any] | None = None,
        sampling_defaults: bool = False,
        cache_salt: str | None = None,
    ) -> Completion:
        """One chat answer, greedy (temperature 0) unless `sampling_defaults` (no sampling parameter at
        all: what the server's defaults give), with the prompt's and the answer's token ids. A
        `cache_salt` keeps the request out of every cached prefix: a fresh prefill."""
        body: dict[str, Any] = {
            "model": self.model,
            "messages": [{"role": "user", "content": prompt}],
            "max_tokens": max_tokens,
            **self.CHAT_TOKEN_IDS,
        }
        if not sampling_defaults:
            body["temperature"] = 0
        if template_kwargs:
            body["chat_template_kwargs"] = template_kwargs
        if cache_salt is not None:
            body["cache_salt"] = cache_salt
        data = self._json("POST", "/v1/chat/completions", json=body)
        return responses.parse_chat(data, f"POST {self.base_url}/v1/chat/completions")

    def served_max_model_len(self) -> int | None:
        """The context length /v1/models reports for the served model (vLLM and SGLang model cards
        carry `max_model_len`), or None where it does not say."""
        what = f"GET {self.base_url}/v1/models"
        body = responses.expect_object(self._json("GET", "/v1/models"), what)
        for entry in body.get("data") or []:
            if isinstance(entry, dict) and entry.get("id") == self.model:
                value = entry.get("max_model_len")
                return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else None
        return None

    def stream_completion(self, prompt: str, *, max_tokens: int, min_tokens: int = 16) -> Throughput:
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
        arrivals: list[float] = []
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
                        arrivals.append(now)
        except httpx.HTTPError as exc:
            raise EngineUnavailable(f"{what}: {describe_http_error(exc)}") from None
        if first is None or last is None:
            return Throughput(float("nan"), None, tokens, note="no text was streamed")
        return Throughput(first - start, *stream_rate(tokens, arrivals, min_tokens))

    # ------------------------------------------------------------------ per engine

    def identity(self) -> Identity:
        raise NotImplementedError

    def served_speculation(self) -> ServedSpeculation:
        raise NotImplementedError

    def complete_once(self, prompt: str, max_tokens: int) -> Completion:
        raise NotImplementedError

    def long_context_wave(self, position: int, *, max_tokens: int) -> LongContext:
        """One greedy request whose prompt crosses `position` tokens (a sentence repeated, its length
        measured by the engine's own tokenizer first), and the acceptance counters it moved."""
        per = self.complete_once(LONG_CONTEXT_UNIT, 1).prompt_tokens
        if not per:
            raise EngineResponseError(
                f"{self.base_url}: a completion reported no prompt_tokens: the probe cannot size its prompt",
                hint="this engine's answers differ from the version the profile pins: check the identity stage",
            )
        wave = self.acceptance_wave([LONG_CONTEXT_UNIT * (position // per + 2)], max_tokens=max_tokens)
        return LongContext(wave.sample, wave.completions[0].prompt_tokens)

    def acceptance_wave(self, prompts: list[str], *, max_tokens: int) -> Wave:
        raise NotImplementedError

    # What a chat request adds to get the prompt's and the answer's token ids back.
    CHAT_TOKEN_IDS: dict[str, Any] = {}

    def rescore(self, prompt_ids: list[int], answer_ids: list[int]) -> list[Scored]:
        """Each answer token as a fresh prefill of the prompt and the answer before it scores it."""
        raise NotImplementedError

    def speculation_counters(self) -> Sample | None:
        """The speculative counters' totals now, or None where the engine exports none."""
        return None

    def prefix_cache_hits(self) -> float | None:
        """Prompt tokens served from the prefix cache so far (a counter), or None where not exported."""
        return None

    def prefix_caching_off(self, profile: Profile) -> str | None:
        """Why the profile serves without prefix caching (the flag that turns it off), or None."""
        raise NotImplementedError


class VLLMClient(EngineClient):
    CHAT_TOKEN_IDS = {"return_token_ids": True}  # vLLM 0.10.2 and later

    def rescore(self, prompt_ids: list[int], answer_ids: list[int]) -> list[Scored]:
        """`prompt_logprobs` of prompt + answer, one token generated: a request with prompt logprobs
        skips reading the prefix cache (vLLM's sampling_params.py), so this is a fresh prefill."""
        ids = prompt_ids + answer_ids
        body = {"model": self.model, "prompt": ids, "max_tokens": 1, "temperature": 0, "prompt_logprobs": 2}
        what = f"POST {self.base_url}/v1/completions (prompt_logprobs)"
        return responses.parse_prompt_logprobs(
            self._json("POST", "/v1/completions", json=body), ids, len(prompt_ids), what
        )

    def speculation_counters(self) -> Sample | None:
        samples = self._counters()
        if not any(name.startswith(metrics.SPEC_PREFIX) for name in samples):
            return Sample(0.0, 0.0, 0.0)
        positions = sorted(_positions(self.base_url, samples), key=int)
        per_pos = tuple(samples[metrics.ACCEPTED_PER_POS].get((("position", p),), 0.0) for p in positions)
        return Sample(
            metrics.total(samples, metrics.DRAFTS),
            metrics.total(samples, metrics.DRAFT_TOKENS),
            metrics.total(samples, metrics.ACCEPTED),
            per_pos,
            int(metrics.total(samples, metrics.REQUESTS_FINISHED)),
        )

    def prefix_cache_hits(self) -> float | None:
        samples = self._counters()
        return metrics.total(samples, metrics.PREFIX_CACHE_HITS) if metrics.PREFIX_CACHE_HITS in samples else None

    def prefix_caching_off(self, profile: Profile) -> str | None:
        serve = profile.engine.serve
        if serve.enable_prefix_caching is False:
            return "engine.serve.enable_prefix_caching: false"
        if "--no-enable-prefix-caching" in serve.extra_args:
            return "--no-enable-prefix-caching in engine.serve.extra_args"
        return None

    def identity(self) -> Identity:
        response = self._request("GET", "/version")
        if response.status_code == 404:
            return Identity("not vllm (no /version)", "")
        what = f"GET {self.base_url}/version: HTTP {response.status_code}"
        if response.status_code >= 400:
            raise EngineResponseError(f"{what}: {snippet(response.text)}")
        return Identity("vllm", responses.parse_version(responses.decode_json(response.text, what), what))

    def complete_once(self, prompt: str, max_tokens: int) -> Completion:
        return self._complete(prompt, max_tokens)

    def _complete(self, prompt: str, max_tokens: int) -> Completion:
        data = self._json(
            "POST",
            "/v1/completions",
            json={"model": self.model, "prompt": prompt, "max_tokens": max_tokens, "temperature": 0},
        )
        return responses.parse_completion(data, f"POST {self.base_url}/v1/completions")

    def _counters(self) -> metrics.Samples:
        return metrics.scrape(self.base_url)

    def served_speculation(self) -> ServedSpeculation:
        """k from the per-position acceptance counter: vLLM registers one `position` label per draft
        position at start (0..k-1, at 0 before any request) and no spec-decode series at all without
        speculation (recorded on vLLM 0.26, docs/sources.md#judging). The method is not in /metrics."""
        samples = self._counters()
        source = f"GET {self.base_url}/metrics"
        if not any(name.startswith(metrics.SPEC_PREFIX) for name in samples):
            return ServedSpeculation(None, 0, source + ": no vllm:spec_decode_* series")
        positions = _positions(self.base_url, samples)
        k = len(positions) if positions else None
        return ServedSpeculation(None, k, source + f": {metrics.ACCEPTED_PER_POS} has {len(positions)} positions")

    def stream_completion(self, prompt: str, *, max_tokens: int, min_tokens: int = 16) -> Throughput:
        """The decode rate from the engine's own counters where our request was the only one the
        server finished meanwhile: generated tokens after the first over the engine's decode time
        (vllm:request_decode_time_seconds), which no network buffering distorts. Else the client's
        stream timing, with its own guards."""
        before = self._counters()
        timed = super().stream_completion(prompt, max_tokens=max_tokens, min_tokens=min_tokens)
        after = self._counters()

        def moved(name: str) -> float:
            return metrics.total(after, name) - metrics.total(before, name)

        finished, decode_s = moved(metrics.REQUESTS_FINISHED), moved(metrics.DECODE_TIME_SUM)
        generated = moved(metrics.GENERATION_TOKENS_SUM)
        if metrics.DECODE_TIME_SUM not in after or metrics.GENERATION_TOKENS_SUM not in after:
            return timed  # an engine without these histograms: the client's timing, with its guards
        if finished != 1 or not math.isfinite(decode_s) or not math.isfinite(generated):
            note = f"{int(finished)} requests finished meanwhile: the engine's counters are not this request's"
            return dataclasses.replace(timed, note="; ".join(filter(None, (timed.note, note))))
        if generated < min_tokens:
            why = f"{generated:.0f} tokens generated (< {min_tokens}): too few to time the decode"
            return dataclasses.replace(timed, decode_tokens_per_s=None, measured_by="engine counters", note=why)
        if decode_s <= 0:
            why = "the engine counted no decode time"
            return dataclasses.replace(timed, decode_tokens_per_s=None, measured_by="engine counters", note=why)
        return dataclasses.replace(
            timed, decode_tokens_per_s=(generated - 1) / decode_s, measured_by="engine counters", note=""
        )

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
    # SGLang 0.5.19's chat: token ids only when asked, non-streamed; meta_info carries cached_tokens
    # (docs/sources.md#lossless; unverified live)
    CHAT_TOKEN_IDS = {"return_token_ids": True, "return_prompt_token_ids": True, "return_meta_info": True}

    def rescore(self, prompt_ids: list[int], answer_ids: list[int]) -> list[Scored]:
        """/generate's input logprobs from position 0: with `logprob_start_len` 0 no cached prefix is
        reused, a fresh prefill (SGLang's schedule_batch `_compute_max_prefix_len`; unverified live)."""
        ids = prompt_ids + answer_ids
        body = {
            "input_ids": ids,
            "sampling_params": {"max_new_tokens": 1, "temperature": 0},
            "return_logprob": True,
            "logprob_start_len": 0,
            "top_logprobs_num": 2,
            "return_text_in_logprobs": True,
        }
        what = f"POST {self.base_url}/generate (input logprobs)"
        return responses.parse_input_logprobs(self._json("POST", "/generate", json=body), ids, len(prompt_ids), what)

    def prefix_caching_off(self, profile: Profile) -> str | None:
        return (
            "--disable-radix-cache in engine.serve.extra_args"
            if "--disable-radix-cache" in profile.engine.serve.extra_args
            else None
        )

    def _server_info(self) -> tuple[Any, str] | None:
        for path in ("/server_info", "/get_server_info"):
            response = self._request("GET", path)
            if response.status_code == 200:
                what = f"GET {self.base_url}{path}: HTTP 200"
                return responses.decode_json(response.text, what), what
        return None

    def identity(self) -> Identity:
        found = self._server_info()
        if found is None:
            return Identity("not sglang (no /server_info or /get_server_info)", "")
        return Identity("sglang", responses.parse_version(*found))

    def served_speculation(self) -> ServedSpeculation:
        """SGLang's server info is its server arguments: speculative_algorithm (None without
        speculation), speculative_num_steps and speculative_draft_model_path."""
        found = self._server_info()
        if found is None:
            return ServedSpeculation(None, None, f"{self.base_url}: no server info")
        info, what = found
        return responses.parse_sglang_speculation(info, what)

    def _generate(self, prompt: str, max_tokens: int) -> responses.Generated:
        data = self._json(
            "POST",
            "/generate",
            json={"text": prompt, "sampling_params": {"max_new_tokens": max_tokens, "temperature": 0}},
        )
        return responses.parse_generate(data, f"POST {self.base_url}/generate")

    def complete_once(self, prompt: str, max_tokens: int) -> Completion:
        return self._generate(prompt, max_tokens).completion

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
