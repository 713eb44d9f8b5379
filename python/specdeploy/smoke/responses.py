"""What an engine answered, read strictly: every body the smoke uses is checked for the shape the
OpenAI-compatible API (and SGLang's native one) promises before a field is used.

Failures prevented (issue 20, D2): a 200 answer with an unexpected body — an HTML page from a
proxy or another service, a list where an object belongs, a chat answer without `choices`,
garbage at `/metrics`, a JSON number of 5000 digits — ended the smoke in a KeyError,
JSONDecodeError or ValueError traceback (exit 1 or 70), with no report. Each is now an
`EngineResponseError` naming the endpoint, what was expected and the first bytes found; the
smoke reports it as "could not test" (exit 2).

These are pure functions of the decoded body, so they are tested with arbitrary JSON
(tests/badinput/test_properties_smoke.py): they raise nothing but `EngineError`s.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from typing import Any

from specdeploy.core import files
from specdeploy.core.errors import SpecdeployError
from specdeploy.engine.speculation import ServedSpeculation

# What to do when an endpoint answers with something that is not an engine's API.
NOT_AN_ENGINE = (
    "check that --endpoint is the engine's base URL (http://HOST:PORT, without /v1) and that nothing else "
    "(a proxy, another service) answers there; `curl -s ENDPOINT/v1/models` shows what it serves"
)


class EngineError(SpecdeployError):
    """The smoke could not test the endpoint: exit 2 ("could not test", README "Exit codes")."""

    exit_code = 2


class EngineUnavailable(EngineError):
    """The server cannot be reached, did not answer in time, or answered with a server error."""


class EngineResponseError(EngineError):
    """The server answered, but not with the body the engine's API promises (HTML, a list where an
    object belongs, a missing field): whatever answers there is not the engine, or not as pinned."""

    def __init__(self, message: str, *, hint: str | None = NOT_AN_ENGINE) -> None:
        super().__init__(message, hint=hint)


@dataclass(frozen=True)
class Completion:
    text: str
    finish_reason: str | None
    completion_tokens: int
    prompt_tokens: int | None = None  # where the answer reports it (usage / meta_info)


def snippet(text: str | bytes, limit: int = 160) -> str:
    """The first bytes of a body, on one line, for a message."""
    if isinstance(text, bytes):
        text = text.decode("utf-8", errors="replace")
    flat = " ".join(text[: limit * 2].split())
    if not flat:
        return "an empty body"
    return repr(flat[:limit] + ("…" if len(flat) > limit or len(text) > limit * 2 else ""))


def _kind(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return f"a boolean ({json.dumps(value)})"
    if isinstance(value, dict):
        return "an object"
    if isinstance(value, list):
        return f"a list of {len(value)}"
    if isinstance(value, str):
        return f"a string {snippet(value, 60)}"
    if isinstance(value, (int, float)):
        return f"a number ({_number_text(value)})"
    return type(value).__name__


def decode_json(text: str, what: str) -> Any:
    """`text` as JSON (core.files.loads, the one decoder of text from outside), or an
    EngineResponseError naming `what` ("GET http://…/v1/models") and what was found: the first
    bytes, or JSON Python will not hold (nested too deeply, a number of thousands of digits)."""
    try:
        return files.loads(text)
    except files.JSONTextError as exc:
        if exc.kind == "syntax":
            raise EngineResponseError(f"{what}: expected a JSON body, found {snippet(text)}") from None
        found = "JSON nested too deeply to be one" if exc.kind == "nested" else f"JSON no engine answers ({exc.detail})"
        raise EngineResponseError(f"{what}: expected a JSON body, found {found}: {snippet(text, 60)}") from None


def expect_object(data: Any, what: str) -> dict[str, Any]:
    if not isinstance(data, dict):
        raise EngineResponseError(f"{what}: expected a JSON object, found {_kind(data)}")
    return data


def _field(obj: dict[str, Any], key: str, what: str, *types: type, optional: bool = False) -> Any:
    """obj[key] of one of `types` (bool never counts as a number); absent or null is None when optional."""
    value = obj.get(key)
    if value is None and optional:
        return None
    if value is None or not isinstance(value, types) or (isinstance(value, bool) and bool not in types):
        names = {"str": "a string", "dict": "an object", "list": "a list", "int": "a number", "float": "a number"}
        expected = " or ".join(dict.fromkeys(names.get(t.__name__, t.__name__) for t in types))
        found = "no such field" if key not in obj else _kind(value)
        raise EngineResponseError(f"{what}: field {key!r}: expected {expected}, found {found}")
    return value


def _finite(value: float) -> float | None:
    """`value` as a finite float, or None: infinity, NaN, or a JSON integer of hundreds of digits
    (past float's range: OverflowError)."""
    try:
        number = float(value)
    except OverflowError:
        return None
    return number if math.isfinite(number) else None


def _number_text(value: float) -> str:
    """A number for a message: as it is, or its size when it has hundreds of digits."""
    if isinstance(value, int) and value.bit_length() > 128:
        return f"a number of about {int(value.bit_length() * math.log10(2)) + 1} digits"
    return repr(value)


def _count(obj: dict[str, Any], key: str, what: str, *, default: int | None = None) -> int:
    """A token count: a non-negative whole number (JSON 30 or 30.0) a float holds."""
    if obj.get(key) is None and default is not None:
        return default
    value = _field(obj, key, what, int, float)
    number = _finite(value)
    if number is None or number < 0 or number != int(number):
        raise EngineResponseError(f"{what}: field {key!r}: expected a whole number >= 0, found {_number_text(value)}")
    return int(value)


def _number(obj: dict[str, Any], key: str, what: str) -> float:
    """A counter: a finite number >= 0 (absent is 0)."""
    if obj.get(key) is None:
        return 0.0
    value = _field(obj, key, what, int, float)
    number = _finite(value)
    if number is None or number < 0:
        raise EngineResponseError(f"{what}: field {key!r}: expected a number >= 0, found {_number_text(value)}")
    return number


def parse_models(data: Any, what: str = "GET /v1/models") -> list[str]:
    """The model ids a /v1/models answer lists."""
    body = expect_object(data, what)
    entries = _field(body, "data", what, list)
    ids = []
    for n, entry in enumerate(entries):
        ids.append(_field(expect_object(entry, f"{what}: data[{n}]"), "id", f"{what}: data[{n}]", str))
    return ids


def parse_chat(data: Any, what: str = "POST /v1/chat/completions") -> Completion:
    """The first choice of a chat completion: its text, finish reason and completion tokens."""
    body = expect_object(data, what)
    choices = _field(body, "choices", what, list)
    if not choices:
        raise EngineResponseError(f"{what}: field 'choices': expected at least one choice, found an empty list")
    choice = expect_object(choices[0], f"{what}: choices[0]")
    message = expect_object(_field(choice, "message", f"{what}: choices[0]", dict), f"{what}: choices[0].message")
    content = _field(message, "content", f"{what}: choices[0].message", str, optional=True)
    reason = _field(choice, "finish_reason", f"{what}: choices[0]", str, optional=True)
    usage = _field(body, "usage", what, dict, optional=True) or {}
    return Completion(content or "", reason, _count(usage, "completion_tokens", f"{what}: usage", default=0))


def parse_completion(data: Any, what: str = "POST /v1/completions") -> Completion:
    """A (non-streamed) completion: the first choice's text and the completion tokens."""
    body = expect_object(data, what)
    choices = _field(body, "choices", what, list)
    if not choices:
        raise EngineResponseError(f"{what}: field 'choices': expected at least one choice, found an empty list")
    choice = expect_object(choices[0], f"{what}: choices[0]")
    text = _field(choice, "text", f"{what}: choices[0]", str)
    reason = _field(choice, "finish_reason", f"{what}: choices[0]", str, optional=True)
    usage = expect_object(_field(body, "usage", what, dict), f"{what}: usage")
    prompt = _count(usage, "prompt_tokens", f"{what}: usage", default=-1)
    return Completion(
        text, reason, _count(usage, "completion_tokens", f"{what}: usage"), None if prompt < 0 else prompt
    )


def parse_version(data: Any, what: str = "GET /version") -> str:
    """The engine version an identity endpoint (vLLM /version, SGLang /server_info) reports."""
    body = expect_object(data, what)
    return str(_field(body, "version", what, str))


def parse_sglang_speculation(data: Any, what: str) -> ServedSpeculation:
    """The speculative setup in SGLang's server info (its server arguments, as
    `dataclasses.asdict(server_args)`)."""
    body = expect_object(data, what)
    method = _field(body, "speculative_algorithm", what, str, optional=True)
    if method is None:
        return ServedSpeculation(None, 0, f"{what}: speculative_algorithm is null")
    steps = _count(body, "speculative_num_steps", what, default=0)
    path = _field(body, "speculative_draft_model_path", what, str, optional=True)
    return ServedSpeculation(method, steps or None, what, draft_model_path=path)


@dataclass(frozen=True)
class Generated:
    """One SGLang /generate answer: its completion and the spec-decode verify steps."""

    completion: Completion
    spec_verify_ct: float


def parse_generate(data: Any, what: str = "POST /generate") -> Generated:
    body = expect_object(data, what)
    text = _field(body, "text", what, str)
    meta = expect_object(_field(body, "meta_info", what, dict), f"{what}: meta_info")
    reason = meta.get("finish_reason")
    if isinstance(reason, dict):
        reason = reason.get("type")
    if reason is not None and not isinstance(reason, str):
        raise EngineResponseError(
            f"{what}: meta_info field 'finish_reason': expected a string or an object with a 'type', "
            f"found {_kind(reason)}"
        )
    tokens = _count(meta, "completion_tokens", f"{what}: meta_info", default=0)
    prompt = _count(meta, "prompt_tokens", f"{what}: meta_info", default=-1)
    completion = Completion(text, reason, tokens, None if prompt < 0 else prompt)
    return Generated(completion, _number(meta, "spec_verify_ct", f"{what}: meta_info"))


@dataclass(frozen=True)
class StreamChunk:
    """One `data:` line of a streamed completion: the usage it reports (if any), whether text came."""

    completion_tokens: int | None
    has_text: bool


def parse_stream_line(line: str, what: str = "POST /v1/completions (stream)") -> StreamChunk | None:
    """A server-sent-events line of a streamed completion; None for lines that carry no chunk."""
    if not line.startswith("data: ") or line.strip() == "data: [DONE]":
        return None
    chunk = expect_object(decode_json(line[6:], what), what)
    usage = _field(chunk, "usage", what, dict, optional=True)
    tokens = _count(usage, "completion_tokens", f"{what}: usage") if usage else None
    choices = _field(chunk, "choices", what, list, optional=True) or []
    has_text = False
    for n, choice in enumerate(choices):
        text = _field(
            expect_object(choice, f"{what}: choices[{n}]"), "text", f"{what}: choices[{n}]", str, optional=True
        )
        has_text = has_text or bool(text)
    return StreamChunk(tokens, has_text)


def describe_http_error(exc: Exception) -> str:
    """What went wrong with a request, concretely: refused, timed out, unresolvable, and so on."""
    import httpx  # the smoke's HTTP client; only the clients raise its errors

    text = str(exc) or type(exc).__name__
    if isinstance(exc, httpx.TimeoutException):
        kind = {
            httpx.ConnectTimeout: "connecting timed out",
            httpx.ReadTimeout: "no answer in time (read timeout)",
            httpx.WriteTimeout: "sending the request timed out",
            httpx.PoolTimeout: "no free connection in time",
        }.get(type(exc), "timed out")
        return kind
    if isinstance(exc, httpx.ConnectError):
        lowered = text.lower()
        if "refused" in lowered:
            return "connection refused (nothing listens there)"
        if "name or service not known" in lowered or "nodename nor servname" in lowered or "resolution" in lowered:
            return f"the host name does not resolve ({text})"
        return f"cannot connect ({text})"
    if isinstance(exc, httpx.RemoteProtocolError):
        return f"the server closed the connection or broke the protocol ({text})"
    return f"{type(exc).__name__}: {text}"
