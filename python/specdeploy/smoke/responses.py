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
    """The smoke could not test the endpoint: exit 2 ("could not test", docs/commands.md "Exit codes")."""

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
    # the prompt as the server rendered and tokenized it, and the generated tokens (return_token_ids)
    prompt_ids: tuple[int, ...] | None = None
    token_ids: tuple[int, ...] | None = None
    cached_tokens: int | None = None  # prompt tokens served from the prefix cache, where reported


@dataclass(frozen=True)
class Scored:
    """One generated token as a fresh prefill of its prompt and the answer before it scores it: its
    logprob and rank, the target's top choice there, and (for a token that is the top choice) its
    margin over the runner-up, which tells how close the position came to a tie."""

    token_id: int
    text: str
    logprob: float
    rank: int
    top_id: int
    top_text: str
    top_logprob: float
    margin: float | None = None

    @property
    def gap(self) -> float:
        """Nats the generated token sits below the top choice (0 when it is the top choice)."""
        return max(0.0, self.top_logprob - self.logprob) if self.rank != 1 else 0.0


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


def token_ids(obj: dict[str, Any], key: str, what: str) -> tuple[int, ...] | None:
    """A list of token ids (whole numbers >= 0) at obj[key]; None when absent or null."""
    value = _field(obj, key, what, list, optional=True)
    if value is None:
        return None
    for n, item in enumerate(value):
        if not isinstance(item, int) or isinstance(item, bool) or item < 0:
            raise EngineResponseError(
                f"{what}: field {key!r}[{n}]: expected a token id (a whole number >= 0), found {_kind(item)}"
            )
    return tuple(value)


def parse_chat(data: Any, what: str = "POST /v1/chat/completions") -> Completion:
    """The first choice of a chat completion: its text, finish reason and completion tokens, and where
    the server returned them (vLLM and SGLang `return_token_ids`) the prompt's and the answer's token
    ids: vLLM puts the prompt's at the top level, SGLang in the choice; SGLang 0.5.19 names the answer's
    `response_token_ids`, later versions `token_ids` (docs/sources.md#lossless)."""
    body = expect_object(data, what)
    choices = _field(body, "choices", what, list)
    if not choices:
        raise EngineResponseError(f"{what}: field 'choices': expected at least one choice, found an empty list")
    where = f"{what}: choices[0]"
    choice = expect_object(choices[0], where)
    message = expect_object(_field(choice, "message", where, dict), f"{where}.message")
    content = _field(message, "content", f"{where}.message", str, optional=True)
    reason = _field(choice, "finish_reason", where, str, optional=True)
    usage = _field(body, "usage", what, dict, optional=True) or {}
    prompt_ids = token_ids(body, "prompt_token_ids", what) or token_ids(choice, "prompt_token_ids", where)
    answer_ids = token_ids(choice, "token_ids", where) or token_ids(choice, "response_token_ids", where)
    meta = _field(choice, "meta_info", where, dict, optional=True) or {}
    details = _field(usage, "prompt_tokens_details", f"{what}: usage", dict, optional=True) or {}
    cached = meta.get("cached_tokens", details.get("cached_tokens"))
    return Completion(
        content or "",
        reason,
        _count(usage, "completion_tokens", f"{what}: usage", default=0),
        prompt_ids=prompt_ids,
        token_ids=answer_ids,
        cached_tokens=cached if isinstance(cached, int) and not isinstance(cached, bool) and cached >= 0 else None,
    )


def _logprob(value: Any, what: str) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise EngineResponseError(f"{what}: expected a logprob (a number), found {_kind(value)}")
    number = float(value)
    if math.isnan(number) or number > 0:
        raise EngineResponseError(f"{what}: expected a logprob (a number <= 0), found {_number_text(value)}")
    return number


def parse_prompt_logprobs(data: Any, ids: list[int], start: int, what: str) -> list[Scored]:
    """vLLM's `prompt_logprobs` of a completion over `ids`, for the positions from `start` on: each
    position's entry maps token ids (as strings) to {logprob, rank, decoded_token}, and holds the
    position's own token and the top choices asked for (the first position's entry is null)."""
    body = expect_object(data, what)
    choices = _field(body, "choices", what, list)
    if not choices:
        raise EngineResponseError(f"{what}: field 'choices': expected at least one choice, found an empty list")
    choice = expect_object(choices[0], f"{what}: choices[0]")
    entries = _field(choice, "prompt_logprobs", f"{what}: choices[0]", list, optional=True)
    if entries is None:
        entries = _field(body, "prompt_logprobs", what, list)
    if len(entries) != len(ids):
        raise EngineResponseError(
            f"{what}: prompt_logprobs has {len(entries)} entries for a prompt of {len(ids)} tokens: expected one each"
        )
    scored = []
    for i in range(start, len(ids)):
        where = f"{what}: prompt_logprobs[{i}]"
        entry = expect_object(entries[i], where)
        ranked = {}
        for key, value in entry.items():
            item = expect_object(value, f"{where}[{key!r}]")
            rank = _count(item, "rank", f"{where}[{key!r}]")
            text = item.get("decoded_token")
            ranked[key] = (
                rank,
                _logprob(item.get("logprob"), f"{where}[{key!r}].logprob"),
                text if isinstance(text, str) else "",
            )
        own = ranked.get(str(ids[i]))
        top = next(((k, v) for k, v in ranked.items() if v[0] == 1), None)
        if own is None or top is None or not top[0].isdigit():
            raise EngineResponseError(
                f"{where}: expected the position's own token {ids[i]} and the top choice (rank 1), "
                f"found {sorted(ranked)[:4]}"
            )
        second = next((v for v in ranked.values() if v[0] == 2), None)
        margin = own[1] - second[1] if own[0] == 1 and second is not None else None
        scored.append(Scored(ids[i], own[2], own[1], own[0], int(top[0]), top[1][2], top[1][1], margin))
    return scored


def parse_input_logprobs(data: Any, ids: list[int], start: int, what: str) -> list[Scored]:
    """SGLang's /generate `meta_info.input_token_logprobs` and `input_top_logprobs` asked from position
    0: entry k is [logprob, token id, text] of ids[k] given ids[:k] (entry 0 is null), and its top
    choices, best first (shapes from SGLang's own tests: docs/sources.md#lossless; unverified live)."""
    body = expect_object(data, what)
    meta = expect_object(_field(body, "meta_info", what, dict), f"{what}: meta_info")
    own = _field(meta, "input_token_logprobs", f"{what}: meta_info", list)
    tops = _field(meta, "input_top_logprobs", f"{what}: meta_info", list)
    if len(own) != len(ids) or len(tops) != len(ids):
        raise EngineResponseError(
            f"{what}: meta_info: {len(own)} input_token_logprobs and {len(tops)} input_top_logprobs for "
            f"{len(ids)} tokens: expected one each (asked with logprob_start_len 0)"
        )

    def triple(value: Any, where: str) -> tuple[float, int, str]:
        if not isinstance(value, list) or len(value) < 2 or not isinstance(value[1], int):
            raise EngineResponseError(f"{where}: expected [logprob, token id, text], found {_kind(value)}")
        return _logprob(value[0], where), value[1], value[2] if len(value) > 2 and isinstance(value[2], str) else ""

    scored = []
    for i in range(start, len(ids)):
        lp, tid, text = triple(own[i], f"{what}: input_token_logprobs[{i}]")
        if tid != ids[i]:
            raise EngineResponseError(f"{what}: input_token_logprobs[{i}] scores token {tid}, expected {ids[i]}")
        choices = [triple(t, f"{what}: input_top_logprobs[{i}]") for t in (tops[i] or [])]
        if not choices:
            raise EngineResponseError(f"{what}: input_top_logprobs[{i}]: expected the top choices, found none")
        rank = next((n + 1 for n, c in enumerate(choices) if c[1] == tid), len(choices) + 1)
        margin = choices[0][0] - choices[1][0] if rank == 1 and len(choices) > 1 else None
        scored.append(Scored(tid, text, lp, rank, choices[0][1], choices[0][2], choices[0][0], margin))
    return scored


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
