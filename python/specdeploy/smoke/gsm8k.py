"""GSM8K questions as known answers: a subset of the test set of openai/grade-school-math (MIT),
shipped under profiles/data/ and checked against the profile's sha256 before a question is asked.

vLLM's CI (tests/evals/gsm8k) and SGLang's speculative-decoding tests gate on GSM8K accuracy
(docs/sources.md#lossless): a verifier or a cache that corrupts text costs accuracy there first. Each
question is asked as a chat prompt with the instruction below; the answer is right when its final
number (after `####`, else the last one) equals the reference's `#### N`."""

from __future__ import annotations

import hashlib
import json
from functools import cache
from pathlib import Path

from specdeploy.core import files
from specdeploy.core.errors import InputFileError
from specdeploy.profile import KnownAnswer
from specdeploy.profile.load import profile_dirs
from specdeploy.profile.schema import Gsm8k

INSTRUCTION = "\nSolve it step by step, then give the final answer as a number on the last line, after ####."
DATA = "data"


def data_file(name: str) -> Path:
    """`profiles/data/<name>` in the first profile directory that has it."""
    for directory in profile_dirs():
        if (directory / DATA / name).is_file():
            return directory / DATA / name
    raise InputFileError(
        f"GSM8K subset {name}: not found under {', '.join(str(d / DATA) for d in profile_dirs())}",
        hint="it ships with the profiles (profiles/data/); reinstall specdeploy or restore the file",
    )


@cache
def _read(name: str, sha256: str | None) -> tuple[KnownAnswer, ...]:
    path = data_file(name)
    data = files.read_bytes(path, what="GSM8K subset", limit=files.LIMITS["json"])
    found = hashlib.sha256(data).hexdigest()
    if sha256 is not None and found != sha256.removeprefix("sha256:"):
        raise InputFileError(
            f"GSM8K subset {path}: sha256 {found}, the profile pins {sha256}: not the recorded subset",
            hint="restore the file shipped with specdeploy (a different subset changes the accuracy it measures)",
        )
    asked = []
    for n, line in enumerate(data.decode().splitlines()):
        record = json.loads(line)
        reference = str(record["answer"]).rsplit("####", 1)[-1].strip().replace(",", "")
        asked.append(
            KnownAnswer(name=f"gsm8k[{n}]", prompt=record["question"] + INSTRUCTION, expect="number", value=reference)
        )
    return tuple(asked)


def questions(spec: Gsm8k) -> list[KnownAnswer]:
    """The first `spec.questions` of the subset, as known answers of kind `number`."""
    pinned = spec.sha256.value if spec.sha256.resolved else None
    return [a.model_copy(update={"max_tokens": spec.max_tokens}) for a in _read(spec.file, pinned)[: spec.questions]]
