"""A stand-in for a vLLM server with speculative decoding, for the light gate's tests: loopback
only (tests.support.stub), answering as vLLM's OpenAI-compatible server does on the routes the
light gate uses — /health, /v1/models, /version, /metrics, chat and (non-streamed) completions.

What is real and what is not: the HTTP exchange, the Prometheus text it serves (parsed by
prometheus_client's own parser in the code under test) and the JSON bodies are real; the
engine is not. Its speculative-decoding counters are made up per request — `drafts_per_request`
drafts, `(acceptance - 1)` accepted tokens per draft, spread over the `k` positions decreasingly —
so a test can set the acceptance, collapse it, switch speculation off or restart the "engine"
(counters back to 0, a new process start time) exactly. The counter names and labels are vLLM's
(smoke.metrics; docs/sources.md#vllm): the per-position counter carries exactly `k` positions,
at 0 before any request, as recorded on a real server (docs/sources.md#gpu-recordings).
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler
from typing import Any

from tests.support.stub import stubs
from tests.support.words import prompt_logprobs, token_ids

# What cpu-rehearsal's known-answer prompts get from a healthy engine (its fixture target's answers).
ANSWERS = {
    "6 times 7": "6 times 7 is 42.",
    "capital of France": "The capital of France is Paris.",
    "JSON object": '{"ok": true}',
    "Python function": "```python\ndef one():\n    return 1\n```",
}
LABELS = 'engine="0",model_name="tiny-qwen3"'


@dataclass
class VLLMStub:
    model: str = "tiny-qwen3"
    version: str = "0.32.0"
    k: int = 3
    acceptance: float = 2.8  # mean acceptance length of what it serves from now on
    drafts_per_request: int = 12
    speculating: bool = True
    answers: dict[str, str] = field(default_factory=lambda: dict(ANSWERS))
    api_key: str | None = None  # when set, /v1/* answers 401 without `Authorization: Bearer <key>`
    overrides: dict[str, tuple[int, Any]] = field(default_factory=dict)  # "GET /metrics": (200, "garbage")
    drafts: float = 0.0
    draft_tokens: float = 0.0
    accepted: float = 0.0
    requests: float = 0.0
    per_position: list[float] = field(default_factory=list)
    process_start: float = field(default_factory=lambda: float(int(time.time()) - 3600))
    created: float = field(default_factory=lambda: float(int(time.time()) - 3500))
    export_process_start: bool = True  # a real vLLM's /metrics may lack it (multiprocess mode)
    seen: list[str] = field(default_factory=list)
    authorizations: list[str | None] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)
    # answers (keys of `answers`) whose second generated token a fresh prefill does not choose: a lossy
    # verifier's signature (the lossless check's tests)
    lossy: set[str] = field(default_factory=set)

    def __post_init__(self) -> None:
        self.per_position = [0.0] * self.k

    def serve_requests(self, n: int = 1) -> None:
        """Count `n` requests' worth of speculation at the current acceptance (user traffic)."""
        with self.lock:
            for _ in range(n):
                self.requests += 1
                if not self.speculating:
                    continue
                drafts = float(self.drafts_per_request)
                accepted = drafts * (self.acceptance - 1.0)
                weights = [float(self.k - i) for i in range(self.k)]
                total = sum(weights)
                self.drafts += drafts
                self.draft_tokens += drafts * self.k
                self.accepted += accepted
                for i, w in enumerate(weights):
                    self.per_position[i] += accepted * w / total

    def restart(self) -> None:
        """The engine process restarted: every counter starts again at 0, a new start time."""
        with self.lock:
            self.drafts = self.draft_tokens = self.accepted = self.requests = 0.0
            self.per_position = [0.0] * self.k
            self.process_start += 600.0
            self.created += 600.0

    def metrics(self) -> str:
        lines = []
        for name, value in (
            ("vllm:spec_decode_num_drafts", self.drafts),
            ("vllm:spec_decode_num_draft_tokens", self.draft_tokens),
            ("vllm:spec_decode_num_accepted_tokens", self.accepted),
        ):
            if self.speculating:  # as a real vLLM writes them: each counter with its creation time
                lines += [f"{name}_total{{{LABELS}}} {value}", f"{name}_created{{{LABELS}}} {self.created}"]
        name = "vllm:request_success_total"
        lines += [f'{name}{{{LABELS},finished_reason="stop"}} {self.requests}']
        if self.speculating:
            name = "vllm:spec_decode_num_accepted_tokens_per_pos_total"
            lines += [f'{name}{{{LABELS},position="{p}"}} {v}' for p, v in enumerate(self.per_position)]
        if self.export_process_start:
            lines += ["# TYPE process_start_time_seconds gauge", f"process_start_time_seconds {self.process_start}"]
        return "\n".join(lines) + "\n"

    def answer(self, method: str, path: str, body: dict[str, Any], authorization: str | None) -> tuple[int, Any]:
        if f"{method} {path}" in self.overrides:
            return self.overrides[f"{method} {path}"]
        if path.startswith("/v1/") and self.api_key and authorization != f"Bearer {self.api_key}":
            return 401, {"error": "Unauthorized"}
        if (method, path) == ("GET", "/health"):
            return 200, ""
        if (method, path) == ("GET", "/v1/models"):
            return 200, {"object": "list", "data": [{"id": self.model, "object": "model"}]}
        if (method, path) == ("GET", "/version"):
            return 200, {"version": self.version}
        if (method, path) == ("GET", "/metrics"):
            return 200, self.metrics()
        if (method, path) == ("POST", "/v1/chat/completions"):
            self.serve_requests(1)
            prompt = body["messages"][0]["content"]
            key, text = next(((k, a) for k, a in self.answers.items() if k in prompt), ("", "I am not sure."))
            choice = {"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": "stop"}
            answer = {
                "id": "chatcmpl-1",
                "object": "chat.completion",
                "model": self.model,
                "choices": [choice],
                "usage": {"prompt_tokens": 12, "completion_tokens": 8, "total_tokens": 20},
            }
            if body.get("return_token_ids"):  # as vLLM 0.10.2+ returns them
                answer["prompt_token_ids"] = token_ids(prompt)
                choice["token_ids"] = token_ids(text, lossy=key in self.lossy)
            return 200, answer
        if (method, path) == ("POST", "/v1/completions") and isinstance(body.get("prompt"), list):
            return 200, prompt_logprobs(body["prompt"])
        if (method, path) == ("POST", "/v1/completions"):
            self.serve_requests(1)
            return 200, {
                "choices": [{"index": 0, "text": " jumps over the lazy dog", "finish_reason": "length"}],
                "usage": {"prompt_tokens": 4, "completion_tokens": 6, "total_tokens": 10},
            }
        return 404, {"detail": "Not Found"}


def handler(stub: VLLMStub) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args: Any) -> None:
            pass

        def _serve(self, method: str, body: dict[str, Any]) -> None:
            stub.seen.append(f"{method} {self.path}")
            authorization = self.headers.get("Authorization")
            stub.authorizations.append(authorization)
            status, payload = stub.answer(method, self.path, body, authorization)
            data = payload.encode() if isinstance(payload, str) else json.dumps(payload).encode()
            self.send_response(status)
            self.send_header("Content-Type", "text/plain" if isinstance(payload, str) else "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def do_GET(self) -> None:  # noqa: N802 - http.server's naming
            self._serve("GET", {})

        def do_POST(self) -> None:  # noqa: N802
            self._serve("POST", json.loads(self.rfile.read(int(self.headers.get("Content-Length") or 0)) or b"{}"))

    return Handler


@contextmanager
def engines() -> Iterator[Callable[..., tuple[VLLMStub, str]]]:
    """`with engines() as start: stub, url = start(acceptance=2.8, ...)`: vLLM stand-ins on loopback
    ports, all stopped on exit."""
    with stubs() as started:

        def start(**settings: object) -> tuple[VLLMStub, str]:
            stub = VLLMStub(**settings)  # type: ignore[arg-type]
            return stub, started.start(handler(stub))

        yield start
