"""Coherence detectors: every real degenerate sample flagged, <= 1% false positives on
200+ healthy real texts in many languages and formats."""

from __future__ import annotations

import json
from collections import Counter

import pytest
from tests.support.data import DATA
from tests.support.healthy_corpus import LANGUAGES, gather

from specdeploy.smoke import coherence


def _samples() -> list[dict[str, str]]:
    """Real outputs: the rehearsal's own (recorded on vLLM-CPU) and degenerate outputs reported in
    public engine issues, with healthy texts beside them (tests/data/README.md names each source)."""
    rows = []
    for name in ("rehearsal-outputs.jsonl", "field-outputs.jsonl"):
        rows += [json.loads(line) for line in (DATA / name).read_text().splitlines()]
    return rows


@pytest.mark.parametrize(
    "sample", [s for s in _samples() if s["label"] == "degenerate"], ids=lambda s: s["source"][:50]
)
def test_every_degenerate_sample_is_flagged(sample: dict[str, str]) -> None:
    assert coherence.detect(sample["text"]), sample["text"][:80]


@pytest.mark.parametrize("sample", [s for s in _samples() if s["label"] == "healthy"], ids=lambda s: s["text"][:30])
def test_every_healthy_sample_passes(sample: dict[str, str]) -> None:
    assert coherence.detect(sample["text"]) == []


def test_false_positive_rate_on_real_healthy_text() -> None:
    texts = gather()
    kinds = Counter(kind.split(":")[0] for kind, _ in texts)
    languages = {kind.split(":")[1] for kind, _ in texts if kind.startswith("catalog:")}
    assert len(texts) >= 200 and kinds["code"] >= 30 and kinds["markdown"] >= 30, kinds
    assert len(languages) >= 8, languages
    flagged = [(kind, text[:60], coherence.detect(text)) for kind, text in texts if coherence.detect(text)]
    assert len(flagged) <= 0.01 * len(texts), flagged
    assert set(LANGUAGES) >= languages


@pytest.mark.parametrize(
    ("text", "detector"),
    [
        ("", "empty"),
        ("   \n", "empty"),
        ("The answer is<|im_end|>", "template-tokens"),
        ("[INST] hello [/INST] hi", "template-tokens"),
        ("ok \ufffd\ufffd\ufffd then", "bad-characters"),
        ("Sure!!!!!!!! Here it is.", "exclamation-run"),
        ("I think that " + "we should " * 6, "repetition-loop"),
        ("amber amber", "repetition-loop"),
        ("Here:\n\n" + "/" * 100, "repetition-loop"),
        ("Рaris Лondon Бerlin Мadrid", "script-mixing"),
    ],
)
def test_each_detector_fires(text: str, detector: str) -> None:
    assert detector in {f.detector for f in coherence.detect(text)}


@pytest.mark.parametrize(
    "text",
    [
        "Paris",
        "Sure! Here it is!",
        "Sure, sure.",  # a whole answer of one repeated word ("amber amber") is flagged by design
        "# " + "-" * 76 + "\nimport os\nimport sys\n\n\ndef main() -> None:\n    print(os.getcwd(), sys.argv)\n",
        "Москва — столица России, а Paris — столица Франции.",
        "アプリケーションはlibpamを再び呼び出す必要があります",
        "| a | b | c |\n|---|---|---|\n| 1 | 2 | 3 |",
    ],
)
def test_detectors_stay_quiet_on_normal_text(text: str) -> None:
    assert coherence.detect(text) == []


def test_compression_threshold_grows_with_length() -> None:
    assert coherence.compression_threshold(100) == pytest.approx(3.2)
    assert coherence.compression_threshold(2000) > coherence.compression_threshold(800) > 3.2
    loop = " fox" * 200
    assert coherence.compression_ratio(loop) > 10 * coherence.compression_threshold(len(loop))
