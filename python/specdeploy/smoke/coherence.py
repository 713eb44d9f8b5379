"""Is this model output coherent? Detectors for the ways broken engines really fail.

Each detector targets a failure seen in the field or in engine CI (docs/sources.md#judging;
samples in tests/data/field-outputs.jsonl): token loops long and short, NaN logits decoding to "!",
U+FFFD and control characters from garbage byte tokens, chat-template tokens leaking into
the text, empty answers, and garbage that mixes writing systems inside words. Thresholds
are the same for every profile and were set against real healthy text (tests check a false
positive rate <= 1% on 200+ texts shipped with installed packages, in many languages).
"""

from __future__ import annotations

import math
import re
import unicodedata
import zlib
from dataclasses import dataclass

# Template tokens of the Qwen/ChatML family and other common chat formats.
_TEMPLATE_RE = re.compile(r"<\|(?:im_start|im_end|endoftext|eot_id|start_header_id|end_header_id)\|>|\[/?INST\]")
_BANG_RE = re.compile(r"[!！]{6,}")
_MAX_PERIOD = 48


@dataclass(frozen=True)
class Finding:
    detector: str
    detail: str


def _longest_periodic_run(text: str) -> tuple[int, int, str]:
    """(run length in chars, period, unit) of the longest stretch that repeats a unit of
    1..48 characters at least twice. O(48 n)."""
    best = (0, 0, "")
    n = len(text)
    for period in range(1, min(_MAX_PERIOD, n // 2) + 1):
        matches = 0
        for i in range(n - period):
            if text[i] == text[i + period]:
                matches += 1
                run = matches + period
                if run > best[0] and run >= 2 * period:
                    best = (run, period, text[i + 1 - matches : i + 1 - matches + period])
            else:
                matches = 0
    return best


def compression_ratio(text: str) -> float:
    raw = text.encode("utf-8")
    return len(raw) / max(1, len(zlib.compress(raw, 9)))


def compression_threshold(n_bytes: int) -> float:
    """Whisper's fixed 2.4 flags healthy text: 2000-character markdown reaches ~2.6 and
    lists of similar UI messages ~3.3 at 1 KB, while loops reach ~8 at 100 bytes and ~30
    when long (docs/sources.md#judging). So start at 3.2 and give longer text more room."""
    return 3.2 + 0.7 * math.log2(max(n_bytes, 400) / 400)


def _script(ch: str) -> str | None:
    # Letters proper only: modifier letters (Ukrainian's U+02BC apostrophe) belong to no script.
    if unicodedata.category(ch) not in ("Lu", "Ll", "Lt", "Lo"):
        return None
    name = unicodedata.name(ch, "")
    head = name.split(" ")[0]
    if head in ("CJK", "HIRAGANA", "KATAKANA", "IDEOGRAPHIC") or "FULLWIDTH" in name:
        return "CJK"
    return head or None


# Scripts written without spaces around embedded Latin words ("libpam을", "AppStreamの").
_ATTACHES_TO_LATIN = frozenset({"CJK", "HANGUL", "THAI", "LAO", "KHMER", "MYANMAR"})


def _mixed_words(text: str) -> tuple[list[str], int]:
    """Words whose letters come from two alphabets (e.g. Latin+Cyrillic), and the word count.

    Latin attached to a CJK/Hangul/Thai word is normal writing and is not counted.
    """
    mixed, words = [], 0
    for word in re.findall(r"\w{2,}", text):
        scripts = {s for s in map(_script, word) if s}
        if not scripts:
            continue
        words += 1
        if len(scripts - _ATTACHES_TO_LATIN - {"LATIN"}) + ("LATIN" in scripts) > 1 and not (
            scripts & _ATTACHES_TO_LATIN and len(scripts - _ATTACHES_TO_LATIN) == 1
        ):
            mixed.append(word)
    return mixed, words


def detect(text: str) -> list[Finding]:
    """Every degeneracy finding for one output; an empty list means it looks coherent."""
    findings: list[Finding] = []
    stripped = text.strip()
    if not stripped:
        return [Finding("empty", "the output is empty or whitespace only")]

    template = _TEMPLATE_RE.findall(text)
    if template:
        findings.append(Finding("template-tokens", f"chat-template tokens in the text: {sorted(set(template))}"))

    bad = sum(1 for ch in text if ch == "\ufffd" or (unicodedata.category(ch) in ("Cc", "Cs") and ch not in "\n\r\t"))
    if bad >= 3 or bad / len(text) > 0.05:
        findings.append(Finding("bad-characters", f"{bad} U+FFFD/control characters in {len(text)}"))

    if bang := _BANG_RE.search(text):
        findings.append(Finding("exclamation-run", f"a run of {len(bang.group())} '!' (NaN logits decode to '!')"))

    run, period, unit = _longest_periodic_run(stripped)
    share = run / len(stripped)
    alnum = any(ch.isalnum() for ch in unit)
    repeats = run / max(period, 1)
    if (
        (alnum and repeats >= 4 and run >= 24 and share >= 0.3)
        or (not alnum and run >= 32 and share >= 0.5)
        or run >= 200
    ):
        findings.append(
            Finding("repetition-loop", f"{unit!r} repeated {repeats:.0f}x ({run} of {len(stripped)} characters)")
        )
    elif len(stripped) <= 40 and (words := stripped.split()) and len(words) >= 2 and len(set(words)) == 1:
        findings.append(Finding("repetition-loop", f"the whole output repeats one word: {stripped!r}"))

    n_bytes = len(text.encode("utf-8"))
    if n_bytes >= 64:
        ratio = compression_ratio(text)
        limit = compression_threshold(n_bytes)
        if ratio > limit:
            findings.append(Finding("compression-ratio", f"zlib ratio {ratio:.1f} > {limit:.1f} for {n_bytes} bytes"))

    # Garbage from a broken multilingual model mixes alphabets inside many words; human text
    # does so rarely (a stray Latin "i" in a Ukrainian word), so demand a share of the words.
    mixed, words = _mixed_words(text)
    if len(mixed) >= 3 and len(mixed) >= 0.15 * words:
        findings.append(Finding("script-mixing", f"{len(mixed)} of {words} words mix writing systems: {mixed[:5]}"))
    return findings
