"""Property-based tests for what the smoke, the gate and the rollback parse (issue 20): the
Prometheus text of `/metrics`, the engine's JSON answers (models, chat, completions, version,
SGLang's /generate, streamed chunks), an engine client fed arbitrary statuses and bodies, the
endpoint URL, a golden transcript and the rollback run record. Whatever the input, the only
exception is the project's own (`SpecdeployError`, whose subclasses the CLI maps to exit codes);
a KeyError, a JSONDecodeError or a ValueError from a third-party parser would be a traceback.

Short text cannot reach every failure: `json.loads` raises a bare ValueError for an integer of
more than `sys.get_int_max_str_digits()` (4300) digits. `long_json` draws JSON bodies holding
numbers of 4290-6000 digits (around the limit, and well past it) in the places the parsers read,
for each decoder of outside text: core.files.loads, the smoke's engine answers and known-answer
check, the engine clients, golden transcripts, the rollback run record, podman's labels.

Bounded and reproducible: `derandomize=True`, at most 200 examples a property (60 for the long
numbers), no deadline.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from specdeploy.core import files, keeper
from specdeploy.core.errors import SpecdeployError
from specdeploy.images import ensure
from specdeploy.profile.schema import KnownAnswer
from specdeploy.rollback import restore
from specdeploy.smoke import answers, clients, metrics, responses, transcript

SETTINGS = settings(
    max_examples=200,
    deadline=2000,  # ms per example (typical: well under 100 ms); a hang fails, a slow machine does not
    derandomize=True,
    database=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)

# The fields the parsers read: drawing keys from these reaches past the first check.
KEYS = [
    "choices", "message", "content", "usage", "completion_tokens", "finish_reason", "data", "id", "version",
    "text", "meta_info", "spec_verify_ct", "type", "outputs", "run_id", "entries", "path", "kind", "saved_at",
    "copy", "closed",
]  # fmt: skip

scalars = st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=20)
json_values = st.recursive(
    scalars,
    lambda children: (
        st.lists(children, max_size=4)
        | st.dictionaries(st.sampled_from(KEYS) | st.text(max_size=6), children, max_size=6)
    ),
    max_leaves=24,
)


# Numbers around and past the digits Python converts (4300): integers, negative, with a fraction or
# an exponent (floats convert at any length), and with leading zeros (not JSON at all).
long_numbers = st.builds(
    lambda sign, digits, n, tail: sign + (digits * (n // len(digits) + 1))[:n] + tail,
    st.sampled_from(["", "-"]),
    st.sampled_from(["1", "7", "1234567890", "0123"]),  # "0123...": a leading zero, not JSON at all
    st.integers(min_value=4290, max_value=6000),
    st.sampled_from(["", "", ".5", "e3", "E-2"]),
)
# Where the parsers read a number (and a bare one): a body otherwise of the right shape.
LONG_WRAPS = [
    "{}",
    "[{}]",
    '{{"object": "list", "data": [{{"id": "m", "created": {}}}]}}',
    '{{"version": "0.32.0", "build": {}}}',
    '{{"choices": [{{"message": {{"content": "Paris"}}, "finish_reason": "stop"}}], '
    '"usage": {{"completion_tokens": {}}}}}',
    '{{"choices": [{{"text": " x", "finish_reason": "length"}}], "usage": {{"completion_tokens": {}}}}}',
    '{{"text": "x", "meta_info": {{"completion_tokens": 3, "spec_verify_ct": {}}}}}',
    '{{"outputs": {{"What is 6 times 7?": {}}}}}',
    '{{"run_id": "r0", "entries": [{{"path": "/srv/x", "kind": "absent", "saved_at": {}, "copy": null}}]}}',
    '{{"org.opencontainers.image.version": {}}}',
]
long_json = st.builds(lambda wrap, number: wrap.format(number), st.sampled_from(LONG_WRAPS), long_numbers)
LONG = settings(SETTINGS, max_examples=60)


def only_ours(call: Any, *args: Any) -> Any:
    """Run `call`; anything raised must be a SpecdeployError."""
    try:
        return call(*args)
    except SpecdeployError as exc:
        assert exc.message  # an empty message would leave the user with nothing
        return exc


# --------------------------------------------------------------------------- /metrics


METRIC_NAMES = [metrics.DRAFTS, metrics.DRAFT_TOKENS, metrics.ACCEPTED, metrics.ACCEPTED_PER_POS, "x", "", "1bad"]
label = st.tuples(st.sampled_from(["position", "engine", "model_name", "le", "a b", ""]), st.text(max_size=6))
metric_line = st.one_of(
    st.builds(
        lambda name, labels, value: f"{name}{{{','.join(f'{k}={json.dumps(v)}' for k, v in labels)}}} {value}",
        st.sampled_from(METRIC_NAMES),
        st.lists(label, max_size=3),
        st.one_of(st.floats().map(repr), st.text(max_size=8), st.integers().map(str)),
    ),
    st.builds(
        lambda kind, name, t: f"# {kind} {name} {t}",
        st.sampled_from(["TYPE", "HELP", "EOF", "UNIT"]),
        st.sampled_from(METRIC_NAMES),
        st.sampled_from(["counter", "gauge", "histogram", "summary", "untyped", "bogus", ""]),
    ),
    st.text(max_size=40),
)


@SETTINGS
@given(st.text(max_size=400))
def test_any_text_at_metrics_parses_or_raises_only_our_error(text: str) -> None:
    result = only_ours(metrics.parse, text)
    if isinstance(result, dict):
        assert all(isinstance(v, float) for samples in result.values() for v in samples.values())


@SETTINGS
@given(st.lists(metric_line, max_size=12))
def test_prometheus_like_text_parses_or_raises_only_our_error(lines: list[str]) -> None:
    only_ours(metrics.parse, "\n".join(lines) + "\n")


# --------------------------------------------------------------------------- engine answers

PARSERS = {
    "models": responses.parse_models,
    "chat": responses.parse_chat,
    "completion": responses.parse_completion,
    "version": responses.parse_version,
    "generate": responses.parse_generate,
}


@pytest.mark.parametrize("name", list(PARSERS))
@SETTINGS
@given(data=json_values)
def test_any_json_body_parses_or_raises_only_our_error(name: str, data: Any) -> None:
    result = only_ours(PARSERS[name], data)
    if isinstance(result, responses.Completion):
        assert isinstance(result.text, str) and result.completion_tokens >= 0
    if isinstance(result, responses.Generated):
        assert math.isfinite(result.spec_verify_ct) and result.spec_verify_ct >= 0


@SETTINGS
@given(st.text(max_size=200))
def test_any_body_text_decodes_or_raises_only_our_error(text: str) -> None:
    only_ours(responses.decode_json, text, "GET /v1/models")


@SETTINGS
@given(st.one_of(st.text(max_size=80), json_values.map(lambda v: "data: " + json.dumps(v))))
def test_any_stream_line_parses_or_raises_only_our_error(line: str) -> None:
    result = only_ours(responses.parse_stream_line, line)
    if isinstance(result, responses.StreamChunk) and result.completion_tokens is not None:
        assert result.completion_tokens >= 0


bodies = st.one_of(
    json_values.map(lambda v: json.dumps(v).encode()),
    st.binary(max_size=120),
    st.just(b"<html><body>502 Bad Gateway</body></html>"),
    long_json.map(str.encode),
)


@SETTINGS
@given(
    status=st.sampled_from([200, 201, 204, 301, 400, 401, 404, 422, 500, 502, 503]),
    body=bodies,
    call=st.sampled_from(["served_models", "chat", "identity", "complete", "stream", "health"]),
    kind=st.sampled_from(["vllm", "sglang"]),
)
def test_an_engine_client_answered_anything_raises_only_our_error(
    status: int, body: bytes, call: str, kind: str
) -> None:
    """The whole client path — status handling, decoding, shape checks — for any answer."""
    client = clients.client_for(kind, "http://127.0.0.1:1", "m")
    client.http = httpx.Client(
        base_url=client.base_url, transport=httpx.MockTransport(lambda request: httpx.Response(status, content=body))
    )
    calls = {
        "served_models": client.served_models,
        "chat": lambda: client.chat("p", max_tokens=4),
        "identity": client.identity,
        "complete": lambda: (
            client._complete("p", 4) if isinstance(client, clients.VLLMClient) else client._generate("p", 4)
        ),
        "stream": lambda: client.stream_completion("p", max_tokens=4),
        "health": client.check_health,
    }
    try:
        only_ours(calls[call])
    finally:
        client.close()


# --------------------------------------------------------------------------- the endpoint


@SETTINGS
@given(st.one_of(st.text(max_size=40), st.builds(lambda s, r: f"{s}://{r}", st.sampled_from(["http", "https", "ftp"]),
                                                 st.text(max_size=30))))  # fmt: skip
def test_any_endpoint_is_judged_without_raising_and_a_good_one_makes_a_client(url: str) -> None:
    problem = clients.endpoint_problem(url)
    if problem is None:
        clients.client_for("vllm", url, "m").close()  # a URL judged good is one httpx accepts


# --------------------------------------------------------------------------- files the commands read


@SETTINGS
@given(
    content=st.one_of(
        json_values.map(lambda v: json.dumps(v).encode()), st.binary(max_size=200), long_json.map(str.encode)
    )
)
def test_any_golden_file_loads_or_raises_only_our_error(tmp_path: Path, content: bytes) -> None:
    path = tmp_path / "golden.json"
    path.write_bytes(content)
    result = only_ours(transcript.load_golden, path)
    if isinstance(result, dict):
        assert result["outputs"] and all(isinstance(v, str) for v in result["outputs"].values())


@pytest.mark.parametrize("reader", [keeper.load_run, restore.read_record], ids=["keeper", "restore"])
@SETTINGS
@given(
    content=st.one_of(
        json_values.map(lambda v: json.dumps(v).encode()), st.binary(max_size=200), long_json.map(str.encode)
    )
)
def test_any_rollback_record_reads_or_raises_only_our_error(tmp_path: Path, reader: Any, content: bytes) -> None:
    """Both names read the record through the keeper's one reader: a damaged record is its
    RunRecordError (exit 2), never a traceback."""
    (tmp_path / "run.json").write_bytes(content)
    result = only_ours(reader, tmp_path)
    if isinstance(result, SpecdeployError):
        assert isinstance(result, keeper.RunRecordError) and result.exit_code == 2 and "run.json" in result.message
    elif result is not None:
        assert all(e.kind in ("file", "dir", "absent") for e in result.entries)


# --------------------------------------------------------------------------- numbers of thousands of digits


@LONG
@given(text=st.one_of(long_json, long_numbers))
def test_long_numbers_decode_or_raise_only_the_one_decoders_error(text: str) -> None:
    """core.files.loads, the one decoder of outside text: JSONTextError (exit 2 if unmapped), or a value."""
    try:
        files.loads(text)
    except files.JSONTextError as exc:
        assert exc.exit_code == 2 and exc.detail
        if exc.kind == "value":
            assert "4300 digits" in exc.detail


@LONG
@given(text=long_json)
def test_an_engine_answer_with_long_numbers_is_could_not_test_or_parses(text: str) -> None:
    """An engine's body, a streamed chunk: EngineError ("could not test", exit 2), never a ValueError."""
    for result in (
        only_ours(responses.decode_json, text, "GET /v1/models"),
        only_ours(responses.parse_stream_line, "data: " + text),
    ):
        if isinstance(result, SpecdeployError):
            assert isinstance(result, responses.EngineError) and result.exit_code == 2


@LONG
@given(text=long_json)
def test_a_model_answer_with_long_numbers_is_judged_not_raised(text: str) -> None:
    """The known-answer check parses the model's JSON answer: a verdict string or None."""
    answer = KnownAnswer(name="json", prompt="Reply with a JSON object", expect="json_object")
    result = answers.check_answer(answer, text)
    assert result is None or isinstance(result, str)


@LONG
@given(text=long_json)
def test_podman_labels_with_long_numbers_are_read_or_refused_as_our_error(text: str) -> None:
    result = only_ours(ensure._labels, text, "podman", "some/image")
    if isinstance(result, SpecdeployError):
        assert result.exit_code == 2
