"""The smoke gate against SGLang, tested on recorded SGLang response shapes.

No SGLang build runs here (it needs a GPU). A real HTTP server on loopback answers with the
shapes SGLang's own code returns (tests/data/sglang/README.md cites http_server.py's
get_server_info and tokenizer_manager.py's meta_info): `/get_server_info` (or
`/server_info`), OpenAI chat and streamed completions, and native `/generate` whose
`meta_info.completion_tokens / spec_verify_ct` is the request's acceptance length.
"""

from __future__ import annotations

import copy
import json
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest
from tests.support.data import DATA
from tests.support.words import input_logprobs, token_ids

from specdeploy.core.verdicts import Verdict
from specdeploy.profile import load_profile
from specdeploy.smoke.run import SmokeOptions, run

RECORDED = DATA / "sglang"

# Answers a healthy Qwen3.6-27B gives to a6000-mtp's known-answer and free-form prompts.
ANSWERS = {
    "17 times 23": "391",
    "capital of France": "Paris",
    "JSON object": '{"city": "Paris", "population": 2102650}',
    "is_prime": "```python\ndef is_prime(n):\n    if n < 2:\n        return False\n"
    "    return all(n % d for d in range(2, int(n ** 0.5) + 1))\n```",
    "speculative decoding": "Speculative decoding lets a small draft model propose several tokens that the "
    "large model then checks in a single forward pass.\n\nWhen the guesses are right, several tokens are "
    "accepted at once, so generation is faster while the output stays exactly the same.",
    "checklist": "- [ ] Drain traffic from the server\n- [ ] Power down and label every cable\n"
    "- [ ] Move and rack the server\n- [ ] Reconnect, power on and run the smoke test",
    "water cycle": "Water evaporates from oceans and lakes. The vapour cools and condenses into clouds. "
    "It falls back as rain or snow. Rivers and groundwater carry it back to the sea.",
    "巴黎": "巴黎是法国的首都。它以埃菲尔铁塔和卢浮宫闻名。每年有数千万游客到访。",
}


@dataclass
class SGLangStub:
    version: str = "0.5.19"
    new_endpoint: bool = True  # /server_info exists (newer releases); else only /get_server_info
    completion_tokens: int = 128
    spec_verify_ct: int = 41
    stream_tokens_per_s: float = 500.0
    # per wave of 4 /generate calls, cycle through these spec_verify_ct values (overrides the above)
    verify_by_wave: tuple[int, ...] = ()
    # server-info overrides: what the recorded server arguments say of speculation
    server_args: dict[str, Any] = field(default_factory=dict)
    requests: list[str] = field(default_factory=list)
    lossy: set[str] = field(default_factory=set)  # answers (ANSWERS keys) a fresh prefill would not give
    _generated: int = 0
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def server_info(self) -> dict[str, Any]:
        info = json.loads((RECORDED / "get_server_info.json").read_text())
        info["version"] = self.version
        info.update(self.server_args)
        return info

    def generate(self) -> dict[str, Any]:
        body = copy.deepcopy(json.loads((RECORDED / "generate.json").read_text()))
        verify = self.spec_verify_ct
        with self._lock:  # the server answers each wave's 4 requests on 4 threads
            if self.verify_by_wave:
                verify = self.verify_by_wave[(self._generated // 4) % len(self.verify_by_wave)]
            self._generated += 1
        body["meta_info"].update(completion_tokens=self.completion_tokens, spec_verify_ct=verify)
        if self.server_args.get("speculative_algorithm", "EAGLE") is None:  # no speculation: no verify count
            del body["meta_info"]["spec_verify_ct"]
        return body


def _handler(stub: SGLangStub) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args: Any) -> None:
            pass

        def _send(self, status: int, body: Any) -> None:
            data = json.dumps(body).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def do_GET(self) -> None:  # noqa: N802 - http.server's naming
            stub.requests.append(self.path)
            if self.path == "/health":
                self._send(200, {})
            elif self.path == "/v1/models":
                self._send(200, {"object": "list", "data": [{"id": "qwen3.6-27b", "object": "model"}]})
            elif self.path == "/get_server_info" or (self.path == "/server_info" and stub.new_endpoint):
                self._send(200, stub.server_info())
            else:
                self._send(404, {"detail": "Not Found"})

        def do_POST(self) -> None:  # noqa: N802
            stub.requests.append(self.path)
            body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            if self.path == "/generate" and "input_ids" in body:  # the lossless check's re-score
                self._send(200, input_logprobs(body["input_ids"]))
            elif self.path == "/generate":
                self._send(200, stub.generate())
            elif self.path == "/v1/chat/completions":
                prompt = body["messages"][0]["content"]
                key, text = next(((k, a) for k, a in ANSWERS.items() if k in prompt), ("", "I am not sure."))
                choice: dict[str, Any] = {
                    "index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": "stop"
                }  # fmt: skip
                if body.get("return_token_ids"):  # 0.5.19's fields (docs/sources.md#lossless)
                    choice["prompt_token_ids"] = token_ids(prompt)
                    choice["response_token_ids"] = token_ids(text, lossy=key in stub.lossy)
                if body.get("return_meta_info"):  # a prompt after the shared context hits the radix cache
                    cached = 256 if len(prompt) > 1000 and not body.get("cache_salt") else 0
                    choice["meta_info"] = {"cached_tokens": cached}
                self._send(
                    200,
                    {
                        "id": "chatcmpl-1",
                        "object": "chat.completion",
                        "model": "qwen3.6-27b",
                        "choices": [choice],
                        "usage": {"prompt_tokens": 20, "completion_tokens": 30, "total_tokens": 50},
                    },
                )
            elif self.path == "/v1/completions" and body.get("stream"):
                self.send_response(200)
                self.send_header("Content-Type", "text/event-stream")
                self.end_headers()
                n = 24
                for i in range(n):
                    chunk = {"choices": [{"index": 0, "text": f" tok{i}", "finish_reason": None}], "usage": None}
                    self.wfile.write(f"data: {json.dumps(chunk)}\n\n".encode())
                    self.wfile.flush()
                    time.sleep(1 / stub.stream_tokens_per_s)
                usage = {"choices": [], "usage": {"prompt_tokens": 10, "completion_tokens": n, "total_tokens": n + 10}}
                self.wfile.write(f"data: {json.dumps(usage)}\n\ndata: [DONE]\n\n".encode())
            else:
                self._send(404, {"detail": "Not Found"})

    return Handler


@pytest.fixture
def serve() -> Iterator[Any]:
    servers: list[ThreadingHTTPServer] = []

    def start(stub: SGLangStub) -> str:
        server = ThreadingHTTPServer(("127.0.0.1", 0), _handler(stub))
        threading.Thread(target=server.serve_forever, daemon=True).start()
        servers.append(server)
        return f"http://127.0.0.1:{server.server_address[1]}"

    yield start
    for server in servers:
        server.shutdown()


QUIET = SmokeOptions(show_progress=False, readiness_timeout_s=5)


def test_healthy_sglang_passes(serve: Any) -> None:
    stub = SGLangStub()
    report = run(load_profile("a6000-mtp"), serve(stub), QUIET)
    assert report.exit_code == 0, report.to_json()
    acc = report.stage("acceptance")
    assert acc is not None
    assert acc.details["mean_acceptance_length"] == pytest.approx(128 / 41)  # completion_tokens / spec_verify_ct
    assert acc.details["per_position"] == []  # SGLang reports no per-position counts
    assert "/generate" in stub.requests and "/server_info" in stub.requests


def test_older_sglang_identity_via_get_server_info(serve: Any) -> None:
    stub = SGLangStub(new_endpoint=False)
    report = run(load_profile("a6000-mtp"), serve(stub), QUIET)
    identity = report.stage("identity")
    assert identity is not None and identity.status is Verdict.passed and "0.5.19" in identity.summary
    assert "/get_server_info" in stub.requests


def test_known_bad_sglang_version_is_refused_with_reason(serve: Any) -> None:
    report = run(load_profile("a6000-mtp"), serve(SGLangStub(version="0.5.17")), QUIET)
    identity = report.stage("identity")
    assert report.exit_code == 1 and identity is not None and identity.status is Verdict.failed
    assert "0.5.17 is known bad" in identity.summary and "token loops (issue #35723)" in identity.summary


def test_unpinned_sglang_version_fails_naming_both(serve: Any) -> None:
    report = run(load_profile("a6000-mtp"), serve(SGLangStub(version="0.5.16")), QUIET)
    identity = report.stage("identity")
    assert identity is not None and identity.status is Verdict.failed
    assert "0.5.16" in identity.summary and "0.5.19" in identity.summary


def test_sglang_acceptance_collapse(serve: Any) -> None:
    """One verify step per token: MTP drafts are all rejected (acceptance length 1.0)."""
    report = run(load_profile("a6000-mtp"), serve(SGLangStub(spec_verify_ct=128)), QUIET)
    acc = report.stage("acceptance")
    assert report.exit_code == 1 and acc is not None and acc.details["decision"] == "below"
    assert acc.details["mean_acceptance_length"] == pytest.approx(1.0)


def test_good_acceptance_low_throughput_blames_draft_length(serve: Any) -> None:
    report = run(load_profile("a6000-mtp"), serve(SGLangStub(stream_tokens_per_s=25)), QUIET)
    statuses = {s.name: s.status for s in report.stages}
    assert statuses["acceptance"] is Verdict.passed and statuses["throughput"] is Verdict.failed
    assert any("too many draft tokens" in line for line in report.diagnosis)


def test_vllm_profile_against_sglang_server_is_an_identity_failure(serve: Any) -> None:
    # the rehearsal rig (specdeploy-rehearsal): absent where only the host package is installed (the Nix build)
    variants = pytest.importorskip("specdeploy.rehearsal.variants")
    profile = variants.derive(
        load_profile("a6000-dflash"), "a6000-dflash-x", {"engine": {"serve": {"served_model_name": "qwen3.6-27b"}}}
    )
    report = run(profile, serve(SGLangStub()), QUIET)
    identity = report.stage("identity")
    assert identity is not None and identity.status is Verdict.failed and "not vllm" in identity.summary


def test_straddling_the_band_after_the_budget_is_inconclusive(serve: Any) -> None:
    """Waves alternate between acceptance 2.29 and 2.98 around the 2.6 floor: the interval
    never clears it, the budget (64 requests) runs out, and the verdict is 3, not a guess."""
    report = run(load_profile("a6000-mtp"), serve(SGLangStub(verify_by_wave=(56, 43))), QUIET)
    acc = report.stage("acceptance")
    assert acc is not None and acc.status is Verdict.inconclusive
    assert acc.details["requests"] == 64 and acc.details["interval_95"][0] < 2.6 < acc.details["interval_95"][1]
    assert report.exit_code == 3


def test_sglang_serving_without_speculation_fails_identity_naming_the_profiles_setup(serve: Any) -> None:
    """Recorded shape with speculative_algorithm null, as SGLang's server args read without the flag."""
    stub = SGLangStub(server_args={"speculative_algorithm": None, "speculative_draft_model_path": None})
    report = run(load_profile("a6000-mtp"), serve(stub), QUIET)
    identity = report.stage("identity")
    assert report.exit_code == 1 and identity is not None and identity.status is Verdict.failed
    assert "speculative decoding is off" in identity.summary and "'EAGLE'" in identity.summary
    assert "num_speculative_tokens 3" in identity.summary
    assert any(line.startswith("speculative setup:") for line in report.diagnosis)


def test_sglang_nextn_without_a_draft_model_path_fails_naming_the_upstream_issue(serve: Any) -> None:
    stub = SGLangStub(server_args={"speculative_draft_model_path": None})
    report = run(load_profile("a6000-mtp"), serve(stub), QUIET)
    identity = report.stage("identity")
    assert identity is not None and identity.status is Verdict.failed
    assert "speculative_draft_model_path" in identity.summary and "sgl-project/sglang#23859" in identity.summary


def test_sglang_with_another_step_count_fails_naming_both_values(serve: Any) -> None:
    stub = SGLangStub(server_args={"speculative_num_steps": 6, "speculative_num_draft_tokens": 7})
    report = run(load_profile("a6000-mtp"), serve(stub), QUIET)
    identity = report.stage("identity")
    assert identity is not None and identity.status is Verdict.failed
    assert "served num_speculative_tokens 6, the profile pins 3" in identity.summary
    assert "the field ran 15 instead of 5" in identity.summary


def test_sglang_speculating_with_accept_length_one_fails_as_inactive(serve: Any) -> None:
    """The server says EAGLE, yet every verify step emits one token: speculation is inactive."""
    report = run(load_profile("a6000-mtp"), serve(SGLangStub(spec_verify_ct=128)), QUIET)
    acc = report.stage("acceptance")
    assert report.exit_code == 1 and acc is not None and acc.status is Verdict.failed
    assert "speculation inactive" in acc.summary
    assert any(line.startswith("speculation inactive") for line in report.diagnosis)
    assert not any("drafter config" in line for line in report.diagnosis)


def test_sglang_concurrency_reruns_the_prompts_with_four_in_flight(serve: Any) -> None:
    stub = SGLangStub()
    report = run(load_profile("a6000-mtp"), serve(stub), QUIET)
    conc = report.stage("concurrency")
    assert conc is not None and conc.status is Verdict.passed, conc
    assert conc.details["concurrency"] == 4 and conc.details["agreement"] == 1.0
    assert conc.details["requests"] >= 2 * 8  # every known-answer and free-form prompt twice
