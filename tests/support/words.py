"""Token ids for the engine stand-ins (vllm_stub, the SGLang stub): one id per whitespace-separated
word, stable across runs (crc32), so a stand-in can return an answer's token ids and re-score them.
An id of 1_000_000 or more marks a token the stand-in's "target" would not have chosen (a lossy
verifier's output): the re-score answers it with another top choice."""

from __future__ import annotations

import zlib
from typing import Any

_WORDS: dict[int, str] = {}
LOSSY = 1_000_000


def token_ids(text: str, *, lossy: bool = False) -> list[int]:
    """The words of `text` as ids; with `lossy`, the second token is marked as not the target's choice."""
    ids = []
    for word in text.split() or [""]:
        token = 100 + zlib.crc32(word.encode()) % 500_000
        _WORDS[token] = word
        ids.append(token)
    if lossy and len(ids) > 1:
        ids[1] += LOSSY
    return ids


def word_of(token: int) -> str:
    return _WORDS.get(token % LOSSY, f"<{token}>")


def prompt_logprobs(ids: list[int]) -> dict[str, Any]:
    """vLLM's answer to a completion over token ids with `prompt_logprobs` 2: every token the top
    choice (logprob -0.05, the runner-up 2 nats below), except a token marked lossy, whose position's
    top choice is another token 2.5 nats above it."""
    entries: list[Any] = [None]
    for token in ids[1:]:
        chosen = token % LOSSY
        if token >= LOSSY:
            entries.append({
                str(token): {"logprob": -2.6, "rank": 2, "decoded_token": word_of(chosen)},
                str(chosen + 1): {"logprob": -0.1, "rank": 1, "decoded_token": "other"},
            })  # fmt: skip
            continue
        entries.append({
            str(token): {"logprob": -0.05, "rank": 1, "decoded_token": word_of(chosen)},
            str(token + 1): {"logprob": -2.05, "rank": 2, "decoded_token": "other"},
        })  # fmt: skip
    return {
        "choices": [{"index": 0, "text": "", "finish_reason": "length", "prompt_logprobs": entries}],
        "usage": {"prompt_tokens": len(ids), "completion_tokens": 1, "total_tokens": len(ids) + 1},
    }


def with_token_ids(answer: dict[str, Any], prompt: str, *, lossy: bool = False) -> dict[str, Any]:
    """A chat answer as vLLM returns it when asked for token ids (return_token_ids, 0.10.2+)."""
    choice = answer["choices"][0]
    return answer | {
        "prompt_token_ids": token_ids(prompt),
        "choices": [choice | {"token_ids": token_ids(choice["message"]["content"], lossy=lossy)}],
    }


def input_logprobs(ids: list[int]) -> dict[str, Any]:
    """SGLang's /generate answer over `input_ids` with return_logprob, logprob_start_len 0 and
    top_logprobs_num 2 (shapes from SGLang's code and tests, docs/sources.md#lossless): entry 0 is
    [null, id, null]; every other token the top choice, except a token marked lossy."""
    own: list[Any] = [[None, ids[0] % LOSSY, None]]
    tops: list[Any] = [None]
    for token in ids[1:]:
        chosen = token % LOSSY
        if token >= LOSSY:
            own.append([-2.6, token, word_of(chosen)])
            tops.append([[-0.1, chosen + 1, "other"], [-2.6, token, word_of(chosen)]])
            continue
        own.append([-0.05, token, word_of(chosen)])
        tops.append([[-0.05, token, word_of(chosen)], [-2.05, token + 1, "other"]])
    meta = {"prompt_tokens": len(ids), "completion_tokens": 1, "cached_tokens": 0}
    return {
        "text": "",
        "output_ids": [0],
        "meta_info": meta | {"input_token_logprobs": own, "input_top_logprobs": tops},
    }
