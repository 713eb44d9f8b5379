"""The coherence corpora (tests/data/coherence, README.md there): real degenerate outputs quoted
in public engine issues, split into a held-out and a tuning half, and real healthy model
answers, plus the healthy texts of healthy_corpus.py and the labelled healthy outputs."""

from __future__ import annotations

import json
from typing import Any

from tests.support.data import DATA
from tests.support.healthy_corpus import gather

COHERENCE = DATA / "coherence"
HALVES = (
    "heldout",
    "tuning",
    "heldout-2",
    "tuning-2",
    "heldout-3",
    "tuning-3",
    "heldout-4",
    "tuning-4",
    "heldout-5",
    "tuning-5",
)
# The data the detectors are tuned on: rounds 1 to 4's two halves (each held-out half was
# measured once, at the end of its round, and is tuning data since the next round) and round 5's
# tuning half. Round 5's held-out half (HELDOUT) is not.
TUNING = ("tuning", "heldout", "tuning-2", "heldout-2", "tuning-3", "heldout-3", "tuning-4", "heldout-4", "tuning-5")
HELDOUT = "heldout-5"
# Each held-out half's sha256 at the commit that added it, before any detector change of its
# round made after its collection (issue 22): round 1 at 949915204edd, round 2 at 399614f, round 3
# at 0e72457, round 4 at 8659a63, round 5 at cb77ffd.
HELDOUT_SHA256 = "19c2762fbe1adc9bd89e8773edcc550670bd598558483252450191e29e67f7e5"
HELDOUT2_SHA256 = "b2e84c27972d0db69a62070ecd9afac4661049d0a2ca2e48b853e6d9c858386d"
HELDOUT3_SHA256 = "b2a1ff3c231adea7496bd87293113c5a4211d8b723a8b602155e4834dfb60e80"
HELDOUT4_SHA256 = "bc06a6cf112b2907c0f649da672477772b4e8ab1bf657e912278f66934210240"
HELDOUT5_SHA256 = "5349af5ad197d6d1b88ed239e68136db4bce04e4881cf793cb9d7a83f948d803"


def _jsonl(name: str) -> list[dict[str, Any]]:
    return [json.loads(line) for line in (COHERENCE / name).read_text(encoding="utf-8").splitlines()]


def degenerate(half: str) -> list[dict[str, Any]]:
    """One half of the degenerate corpus (HALVES): {"text", "source", "engine", "class", "note"?}."""
    return _jsonl(f"degenerate-{half}.jsonl")


def tuning_data() -> list[dict[str, Any]]:
    """Every degenerate output the detectors may be tuned on (TUNING)."""
    return [row for half in TUNING for row in degenerate(half)]


def real_answers() -> list[dict[str, Any]]:
    """Recorded model answers: {"text", "kind" (answer|code), "lang", "model", "source", "item"}."""
    return _jsonl("healthy-answers.jsonl") + _jsonl("healthy-code.jsonl")


def healthy_texts() -> list[tuple[str, str]]:
    """Every healthy text as (kind, text): catalogs, READMEs and stdlib code (healthy_corpus),
    the real answers ("answer:LANG", "code:LANG") and the healthy lines of the recorded outputs."""
    texts = list(gather())
    texts += [(f"{row['kind']}:{row['lang']}", row["text"]) for row in real_answers()]
    for name in ("rehearsal-outputs.jsonl", "field-outputs.jsonl"):
        rows = [json.loads(line) for line in (DATA / name).read_text(encoding="utf-8").splitlines()]
        texts += [(f"recorded:{name}", row["text"]) for row in rows if row["label"] == "healthy"]
    return texts
