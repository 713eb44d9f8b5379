"""Golden transcripts and prefix agreement: how two greedy outputs of one prompt are compared.

A golden transcript is the greedy outputs of the smoke's coherence prompts recorded at a verified
deploy (`specdeploy smoke --record-golden`, or the gate keyed by the served identity: gate.golden).
Outputs are compared on engine-independent tokens (ASCII words, else single characters), over a
prefix: vLLM's own CI compares the first 10 generated tokens of greedy runs.

A --golden file is read and checked before any stage runs (issue 20, D8): a regular file, JSON, an
object whose `outputs` maps each prompt to its recorded text.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from specdeploy.core import files
from specdeploy.core.errors import InputFileError

GOLDEN = "golden transcript"
GOLDEN_HINT = (
    "pass the file a verified deploy recorded with `specdeploy smoke --record-golden PATH`, or record one again"
)


def golden_tokens(text: str) -> list[str]:
    """Engine-independent tokens for prefix comparison: ASCII words, else single characters."""
    return re.findall(r"[A-Za-z0-9_]+|\S", text)


def agrees(alone: str, concurrent: str, n: int) -> bool:
    """Two outputs of one greedy prompt agree when their first `n` tokens match (vLLM's CI compares
    the first 10 generated tokens); outputs shorter than `n` must match whole."""
    return golden_tokens(alone)[:n] == golden_tokens(concurrent)[:n]


def load_golden(path: Path) -> dict[str, Any]:
    """A golden transcript, read and checked before any stage runs."""
    data = files.read_json(path, what=GOLDEN, hint=GOLDEN_HINT)
    record = files.expect_mapping(data, str(path), what=GOLDEN)
    outputs = record.get("outputs")
    if not isinstance(outputs, dict) or not outputs:
        if "outputs" not in record:
            found = "no such field"
        else:
            found = "an empty object" if outputs == {} else type(outputs).__name__
        raise InputFileError(
            f"{GOLDEN} {path}: field outputs: expected an object mapping each prompt to its recorded text, "
            f"found {found}; nothing was compared",
            hint=GOLDEN_HINT,
        )
    bad = next((k for k, v in outputs.items() if not isinstance(v, str)), None)
    if bad is not None:
        raise InputFileError(
            f"{GOLDEN} {path}: field outputs[{bad!r}]: expected the recorded text (a string), "
            f"found {type(outputs[bad]).__name__}",
            hint=GOLDEN_HINT,
        )
    return record


def compare(recorded: dict[str, Any], outputs: dict[str, str], n: int) -> tuple[float, list[str]]:
    """The share of recorded prompts whose output now agrees over `n` tokens, and the drifted ones."""
    drifted = []
    prompts = recorded["outputs"]
    for prompt, text in prompts.items():
        if prompt not in outputs or not agrees(text, outputs[prompt], n):
            drifted.append(prompt)
    return 1 - len(drifted) / max(1, len(prompts)), drifted
