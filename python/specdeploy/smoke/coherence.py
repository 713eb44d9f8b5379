"""Is this model output coherent? Detectors for the ways broken engines really fail.

Each detector targets a failure quoted in public engine issues (341 of them kept in
tests/data/coherence/, cited line by line; docs/sources.md#judging) or seen in engine CI:

- token loops long and short, in any script: a unit repeated back to back, counted in bytes
  and repeats, not in Latin characters ("洗小洗小洗小…" is 90 bytes in 30 characters), wherever
  the loop starts ("…customize  This  Code  Let me   (   Let me   )  Let me …"), a short answer
  that is one character said again ("めめめめめめ..."), one mark glued to a word 16+ times
  ("One####…"); lines and sentences repeated ("很高兴你们能在这里。" three times, a sentence
  ending in "…" three times, a paragraph twice);
- NaN logits decoding to "!" (Qwen's token 0);
- U+FFFD and control characters from garbage byte tokens, and mojibake (UTF-8 read as
  cp1252: "相思那得å¤¢ç¡¯來", checked with ftfy; GBK punctuation read as Latin-1: "Google¡¯s");
- chat-template and tokenizer tokens of any family leaking into the text: ChatML, Llama,
  Phi, gpt-oss harmony (also with its markers stripped: "…assistantfinalfour"), Gemma turn
  markers and ``<unusedN>`` (up to five digits), DeepSeek's ``<｜begin▁of▁sentence｜>``, FIM tokens, ``<s>``/``</s>``,
  ``[PAD]``;
- word salad: words from many languages, identifiers and numbers glued together without
  repetition ("Demp Schul.scalablytyped373ьallis gutterぼdiaeftry Fallon572"): letters of
  unrelated writing systems inside one word, four or more writing systems in one answer, and
  long lines of words that lack the function words every language is made of (measured with
  the word frequencies of the line's language, from wordfreq);
- a stray script inside a sentence ("активными或者说", "My честный recommendation");
- stutters ("IIII see see see see what what") and broken spacing from a wrong detokenizer
  ("Eachclass,hasits.own;purpose", "between  the  two  of  us");
- punctuation salad (symbols and stray marks instead of words; short answers of mostly marks;
  dashes, quotes and ellipses standing alone as words; 40+ characters without a space mixing
  letters, digits and marks with no word in them: "1GB$B*:+GC3@34(*!%,(<:"), answers of one
  token per line, answers without a letter or digit, and empty answers;
- tokenizer markers printed undecoded ("HelloĠworld", "▁The▁current") and words run together,
  also by underscores (16+ parts: "main_module_example_rebind_to_context_…"), and runs of mixed
  case and digits in prose ("world-Europae4Ugqpg0oIuPzDK");
- a word said four times in a row, or two words each said twice in a sixth of the words;
- the same combining mark twice on a letter (Thai, Indic, Arabic: "เป็็น");
- Han, kana or Hangul glued inside words of a Latin text ("mo比亚", "convention禁"), English
  function words in an order no sentence has ("description of to and get-request to to"), a long
  line said twice in a row, sentences clipped to a word or two ("In this. assistant In. On."),
  lines of 12+ words with hardly a function word.

Thresholds are the same for every profile and were set on tuning data only (issue 22's
protocol, tests/data/coherence/README.md) and on 374 healthy texts (real model answers in six
scripts, code, markdown, message catalogs in 16 languages). Round 1: 40/40 of its tuning half,
29/40 of its held-out half (measured once). Round 2, tuned on round 1's two halves and 31 new
outputs (100/111 flagged): 26 of 31 other new outputs held out (83.9%, measured once; issue
22's target of 85% is not reached), 0 of the healthy texts. Round 3, tuned on rounds 1 and 2's
four halves and 32 new outputs (160/174 flagged, 152 before): 24 of 32 other new outputs held out
(75.0%). Round 4 chose its general signals by leave-one-round-out validation and tuned on all
earlier halves and 31 new outputs (215/237 flagged, 209 before): 25 of 32 other new outputs held
out (78.1%, as with the detectors before round 4; issue 22's 85% is not reached). Round 5 chose
its signals the same way and tuned on all earlier halves and 36 new outputs (277/305 flagged, 270
before): 24 of 36 other new outputs held out (66.7%, as before round 5; measured once, after which
rules were only narrowed against false positives); tests keep the figures (docs/benchmarks.md).
Issue 34 dropped the 85% target: these detectors are the gate's cheap first stage, and what the text's
form cannot show (fluent salad, a wrong word, a wrong answer) the accuracy, lossless and prefix-cache
checks judge on the answers themselves. Lengths are counted in UTF-8 bytes or in tokens, never in
Latin characters.
A 4 KB answer is judged in a few milliseconds (the word lists are loaded once, on first use).
"""

from __future__ import annotations

import functools
import math
import re
import unicodedata
import zlib
from collections import Counter
from dataclasses import dataclass

import numpy as np

MAX_PERIOD = 48  # characters in the longest unit a loop is searched for
LOOP_BLOCK = 16384  # characters searched for loops at once (~2 MB of numpy arrays)


@dataclass(frozen=True)
class Finding:
    detector: str
    detail: str


# ----------------------------------------------------------------------------- template tokens
# Control tokens of the chat templates and tokenizers in use: ChatML/Qwen/Llama 3/Phi/harmony
# (<|name|>), DeepSeek (fullwidth bars), Gemma, FIM (StarCoder/Granite spelling without bars),
# SentencePiece/BERT specials, Llama 2's [INST] and <<SYS>>.
_TEMPLATE_RE = re.compile(
    r"<\|[A-Za-z][A-Za-z0-9_]{1,30}\|>"  # also upper case: <|EOT|>, <|END_OF_TURN_TOKEN|>
    r"|<｜[^｜\n]{1,40}｜>"
    r"|</?(?:start|end)_of_(?:turn|text)>|<unused\d{1,5}>|<0x[0-9A-F]{2}>"  # Gemma 3: <unused6226>
    # SentencePiece/BERT/Cohere specials in either case, with or without "_TOKEN"
    r"|<(?:eos|bos|pad|unk|mask|sep|cls|eop|eot)(?:_token)?>|<(?:EOS|BOS|PAD|UNK|MASK|SEP|CLS|EOP|EOT)(?:_TOKEN)?>"
    r"|<reserved_\d{1,4}>|\[control_\d{1,4}\]|<extra_id_\d{1,3}>"
    r"|<(?:fim_(?:prefix|suffix|middle|pad)|file_sep|repo_name|reponame|gh_stars)>"
    r"|\[/?INST\]|<</?SYS>>|\[(?:PAD|UNK|CLS|SEP|MASK)\]"
    r"|<\|?(?:channel|message|constrain)\|?>"
    # gpt-oss harmony with the control tokens stripped: role and channel names run together
    r"|assistant(?:final|analysis|commentary)"
)
# <s>/</s> are also HTML (strikethrough): only outside code
_SENTENCE_TOKEN_RE = re.compile(r"</?s>")

_BANG_RE = re.compile(r"[!！]{6,}")
# One mark 16+ times glued to the end of a word ("One####…####"): junk tokens, not a rule line
# or a heading; dot leaders, dashes and underscores (forms, tables of contents) are left out.
_GLUED_MARK_RUN_RE = re.compile(r"(?<=[^\W\d_])([^\w\s.\-=~·…])\1{15,}")
# A heading's underline or a horizontal rule ("=====", "-----"): decoration, not a loop
_RULE_LINE_RE = re.compile(r"^[ \t]*([=\-_*~#])\1{2,79}[ \t]*$", re.M)
_CONTROL_RE = re.compile("[\x00-\x08\x0b\x0c\x0e-\x1f\x7f-\x9f]")  # Cc but \t \n \r
_SURROGATE_RE = re.compile("[\ud800-\udfff]")  # lone surrogates (JSON's "\\ud83d" alone): no character
_FENCE_RE = re.compile(r"```.*?(?:```|\Z)", re.S)
_INLINE_CODE_RE = re.compile(r"`[^`\n]*`")

# Scripts written without spaces around embedded Latin words ("libpam을", "AppStreamの").
_ATTACHES_TO_LATIN = frozenset({"CJK", "HANGUL", "THAI", "LAO", "KHMER", "MYANMAR"})
# Greek letters are mathematics in any text (ΔH, π, α): never a script of their own here.
_NEUTRAL = frozenset({"GREEK"})


def compression_ratio(text: str) -> float:
    raw = text.encode("utf-8")
    return len(raw) / max(1, len(zlib.compress(raw, 9)))


def compression_threshold(n_bytes: int) -> float:
    """Whisper's fixed 2.4 flags healthy text: 2000-character markdown reaches ~2.6 and
    lists of similar UI messages ~3.3 at 1 KB, while loops reach ~8 at 100 bytes and ~30
    when long (docs/sources.md#judging). So start at 3.2 and give longer text more room."""
    return 3.2 + 0.7 * math.log2(max(n_bytes, 400) / 400)


@functools.lru_cache(maxsize=4096)
def _script(ch: str) -> str | None:
    # Letters proper only: modifier letters (Ukrainian's U+02BC apostrophe) belong to no script.
    if unicodedata.category(ch) not in ("Lu", "Ll", "Lt", "Lo"):
        return None
    name = unicodedata.name(ch, "")
    head = name.split(" ")[0]
    if head in ("CJK", "HIRAGANA", "KATAKANA", "IDEOGRAPHIC") or "FULLWIDTH" in name or "HALFWIDTH" in name:
        return "CJK"
    return head or None


def _code_free(text: str, gap: str = " ") -> str:
    """The text without fenced and inline code, where identifiers and symbols are normal; inline
    code leaves `gap` (a newline where the words around it must not count as neighbours)."""
    return _INLINE_CODE_RE.sub(gap, _FENCE_RE.sub("\n", text))


# ----------------------------------------------------------------------------- loops
def _loops(text: str) -> list[tuple[str, int, int]]:
    """Every stretch that repeats a unit of 1..48 characters at least three times back to
    back, as (unit, repeats, bytes of the stretch), judged in overlapping blocks so that
    memory stays bounded (a loop longer than a block is reported block by block)."""
    found: list[tuple[str, int, int]] = []
    for start in range(0, max(1, len(text) - 2 * MAX_PERIOD), LOOP_BLOCK):
        found += _block_loops(text[start : start + LOOP_BLOCK + 2 * MAX_PERIOD])
    return found


def _block_loops(text: str) -> list[tuple[str, int, int]]:
    """For each period p, the characters equal to the one p further on form runs; a run of
    2p+ of them is a unit repeated 3+ times. numpy compares every character with the 48
    after it in one pass."""
    points = np.frombuffer(text.encode("utf-32-le"), dtype=np.uint32)
    size = len(points)
    if size < 3:
        return []
    # distinct values past the last code point, so that nothing repeats into the padding
    padded = np.concatenate((points, np.arange(0x110000, 0x110000 + MAX_PERIOD, dtype=np.uint32)))
    windows = np.lib.stride_tricks.sliding_window_view(padded, MAX_PERIOD + 1)[:size]
    same = np.zeros((MAX_PERIOD, size + 2), dtype=np.int8)  # row p-1: points[i] == points[i + p]
    same[:, 1:-1] = (windows[:, 1:] == windows[:, :1]).T
    rows, cols = np.nonzero(np.diff(same, axis=1))  # run starts and ends alternate in each row
    periods, starts, lengths = rows[::2] + 1, cols[::2], cols[1::2] - cols[::2]
    keep = lengths >= 2 * periods
    if not keep.any():
        return []
    # UTF-8 length of each character, summed from the start: the bytes of any stretch
    widths = 1 + (points >= 0x80).astype(np.int64) + (points >= 0x800) + (points >= 0x10000)
    offsets = np.concatenate(([0], np.cumsum(widths)))
    found: list[tuple[str, int, int]] = []
    for period, start, length in zip(periods[keep], starts[keep], lengths[keep], strict=True):
        repeats = (length + period) // period
        stop = start + repeats * period
        found.append((text[start : start + period], int(repeats), int(offsets[stop] - offsets[start])))
    return found


def _loop_finding(stripped: str) -> Finding | None:
    total = len(stripped.encode("utf-8"))
    worst: tuple[float, str, int] | None = None
    for unit, repeats, run in _loops(stripped):
        unit_bytes = len(unit.encode("utf-8"))
        letters = any(ch.isalnum() for ch in unit)
        if letters:
            loop = (
                (repeats >= 4 and run >= 24 and run >= 0.3 * total)  # most of the answer
                # a short answer that is one character said again ("めめめめめめ..."): 18+ bytes
                or (repeats >= 6 and run >= 18 and run >= 0.5 * total)
                or (repeats >= 8 and run >= 48)  # a short unit looping anywhere
                # a phrase looping anywhere; whole lines need a fourth time (lists repeat lines)
                or (repeats >= (4 if "\n" in unit else 3) and unit_bytes >= 16 and run >= 60)
                or run >= 240
            )
        else:
            loop = (run >= 32 and run >= 0.5 * total) or (repeats >= 16 and run >= 96 and unit.strip() != "")
        if loop and (worst is None or run > worst[0]):
            worst = (run, unit, repeats)
    if worst is None:
        return None
    run, unit, repeats = worst
    return Finding("repetition-loop", f"{unit!r} repeated {repeats}x ({run:.0f} of {total} bytes)")


_SENTENCE_SPLIT_RE = re.compile(r"(?<=[.!?])\s+|(?<=[。！？])")


def _repeated_lines(text: str) -> Finding | None:
    """A sentence said again and again: loops whose unit is longer than the loop search
    window, or that vary a number ("Step 7: Add a contact form." x3). Sentences only (they
    end in a full stop, ! or ?): list items, headings and UI strings repeat in healthy text."""
    prose = _FENCE_RE.sub("\n", text)
    counts: Counter[str] = Counter()
    for raw in prose.split("\n"):
        if raw[:1].isspace():  # indented: code or a nested list
            continue
        for part in _SENTENCE_SPLIT_RE.split(raw.strip()):
            key = re.sub(r"\d+", "0", part.strip()).lower()
            if key[-1:] in ".!?。！？…" and sum(ch.isalpha() for ch in key) >= 6:
                counts[key] += 1
    for key, n in counts.most_common():
        size = len(key.encode("utf-8"))
        if (n >= 3 and size >= 20) or (n >= 2 and size >= 240):
            return Finding("repeated-lines", f"{n}x the same {size}-byte sentence: {key[:60]!r}")
        if n < 2:
            break
    lines = [line.strip() for line in prose.split("\n") if line.strip()]
    if len(lines) >= 3 and len(set(lines)) == 1:  # the whole answer is one line said again and again
        return Finding("repeated-lines", f"the only line, {len(lines)}x: {lines[0][:60]!r}")
    # a long line said twice in a row: 80+ letters (healthy catalogs repeat a line of 56 letters)
    for line, after in zip(lines, lines[1:], strict=False):
        if line == after and sum(ch.isalpha() for ch in line) >= 80:
            return Finding("repeated-lines", f"the same {len(line)}-character line twice in a row: {line[:60]!r}")
    # a paragraph said twice, however it is indented (a reasoning loop's long turns)
    paragraphs = Counter(
        " ".join(line.strip() for line in block.split("\n")).strip() for block in _BLANK_LINE_RE.split(prose)
    )
    for block, n in paragraphs.most_common(1):
        if n >= 2 and len(block.encode("utf-8")) >= 120:
            return Finding("repeated-lines", f"{n}x the same paragraph: {block[:60]!r}")
    return None


_BLANK_LINE_RE = re.compile(r"\n[ \t]*\n")


# ----------------------------------------------------------------------------- scripts
def _tokens(text: str) -> list[str]:
    return re.findall(r"\w+", text)


def _letter_scripts(token: str) -> list[str]:
    if token.isascii():
        return ["LATIN"] * sum(ch.isalpha() for ch in token)
    return [s for s in (_script(ch) for ch in token) if s and s not in _NEUTRAL]


def _runs(seq: list[str]) -> list[str]:
    out: list[str] = []
    for s in seq:
        if not out or out[-1] != s:
            out.append(s)
    return out


def _is_mixed(token_scripts: list[str], dominant: str | None) -> bool:
    """Letters of unrelated writing systems in one word: Latin+Cyrillic ("Рaris"), or a
    word of the text's own alphabet with another script inside it ("gutterぼdiaeftry",
    "дляコンテンツа"). Latin next to CJK/Hangul/Thai is normal writing ("libpam을")."""
    groups = set(token_scripts)
    if len(groups) < 2:
        return False
    spaced = groups - _ATTACHES_TO_LATIN
    if len(spaced) > 1 or (spaced and spaced != {"LATIN"} and groups & _ATTACHES_TO_LATIN):
        return True  # Latin+Cyrillic ("Рaris"), Cyrillic+Han ("активными或者说")
    runs = _runs(token_scripts)
    return len(runs) >= 3 and runs[0] == runs[-1] == dominant and dominant not in _ATTACHES_TO_LATIN


def _script_counts(text: str) -> Counter[str]:
    counts: Counter[str] = Counter()
    for ch, n in Counter(text).items():
        script = _script(ch)
        if script and script not in _NEUTRAL:
            counts[script] += n
    return counts


_QUOTED_RE = re.compile(
    r"[(\[（「『\"'“‘«《【][^)\]）」』\"'”’»》】\n]{0,40}[)\]）」』\"'”’»》】]|(\*{1,2}|_)[^*_\n]{1,40}\1"
)


def _script_findings(text: str) -> list[Finding]:
    prose = _code_free(text)
    counts = _script_counts(prose)
    letters = sum(counts.values())
    if not letters:
        return []
    dominant = counts.most_common(1)[0][0]
    findings: list[Finding] = []

    words = 0
    mixed: list[str] = []
    for tok, n in Counter(_tokens(prose)).items():
        if token_scripts := _letter_scripts(tok):
            words += n
            if _is_mixed(token_scripts, dominant):
                mixed += [tok] * n
    if mixed and (len(mixed) >= 5 or (len(mixed) >= 2 and len(mixed) >= 0.08 * words)):
        findings.append(Finding("script-mixing", f"{len(mixed)} of {words} words mix writing systems: {mixed[:5]}"))
    elif glued := _glued_to_latin(prose, counts, letters):
        findings.append(glued)

    many = sorted(s for s, n in counts.items() if n >= 2)
    if len(many) >= 4:
        findings.append(Finding("many-scripts", f"{len(many)} writing systems in one answer: {many}"))
    elif stray := _stray_script(prose, counts, letters):
        findings.append(stray)
    return findings


def _glued_to_latin(prose: str, counts: Counter[str], letters: int) -> Finding | None:
    """Han, kana or Hangul glued inside words of a text written in Latin letters ("mo比亚",
    "convention禁", "e基本信息B"). Chinese, Japanese and Korean glue Latin terms to their own
    words ("使用Python", "libpam을"), but then their letters are a third or more of the text's
    (healthy answers and catalogs in those languages with many Latin terms: 0.47 at least);
    in English, two such words outside quotes are token salad (healthy texts: none)."""
    if counts.most_common(1)[0][0] != "LATIN" or sum(counts[s] for s in _ATTACHES_TO_LATIN) > letters / 3:
        return None
    unquoted = _QUOTED_RE.sub(" ", prose)  # "'API를' (the API, as object)": a quoted example
    glued = [
        tok
        for tok in _tokens(unquoted)
        if "LATIN" in (found := set(_letter_scripts(tok))) and found & {"CJK", "HANGUL"}
    ]
    if len(glued) >= 2:
        return Finding("script-mixing", f"{len(glued)} words glue Han, kana or Hangul to Latin letters: {glued[:5]}")
    return None


def _stray_script(prose: str, counts: Counter[str], letters: int) -> Finding | None:
    """A few letters of an unrelated script inside a line written in another: Cyrillic or Han
    in English, Cyrillic in Chinese, Han in Russian. Latin is at home everywhere (terms,
    names), Greek is mathematics; text in brackets or quotes is a quotation, not a slip; a
    script that has lines of its own is a second language of the answer, not a slip."""
    rare = {s for s, n in counts.items() if s != "LATIN" and n <= max(24, 0.1 * letters)}
    if not rare:
        return None
    for line in _QUOTED_RE.sub(" ", prose).split("\n"):
        here = _script_counts(line)
        if len(here) < 2:
            continue
        home = here.most_common(1)[0][0]
        for script in rare & set(here):
            if script == home or (home in _ATTACHES_TO_LATIN and script in _ATTACHES_TO_LATIN):
                continue  # Hangul text with Hanja, Chinese with kana: one family of usage
            chunks = [chunk for chunk in line.split() if any(ch.isalpha() for ch in chunk)]
            spots = [chunk for chunk in chunks if script in _letter_scripts(chunk)]
            if home == "LATIN" and script in _ATTACHES_TO_LATIN and len(spots) > len(chunks) / 4:
                continue  # Chinese written around English terms ("使用 Python 的 requests 库")
            return Finding("stray-script", f"{script.lower()} letters inside a {home.lower()} line: {spots[:5]}")
    return None


# ----------------------------------------------------------------------------- word salad
_SPACED_LANGS = {
    "LATIN": ("en", "de", "fr", "es", "it", "pt", "nl", "pl", "cs", "sv", "tr", "vi", "id", "ro", "hu", "fi", "da"),
    "CYRILLIC": ("ru", "uk", "bg"),
    "ARABIC": ("ar", "fa"),
}


@functools.cache
def _common_words(lang: str) -> frozenset[str]:
    """The 100 most frequent words of a language: its function words (wordfreq)."""
    import wordfreq  # loads its word lists on first use only

    return frozenset(wordfreq.top_n_list(lang, 100, wordlist="small"))


def _function_word_share(words: list[str], script: str) -> float:
    counts = Counter(words)
    return max(
        sum(n for w, n in counts.items() if w in _common_words(lang)) / len(words) for lang in _SPACED_LANGS[script]
    )


# Markup whose words are names, not prose: URLs, HTML tags, link targets, reST directives.
_MARKUP_RE = re.compile(
    r"https?://\S+|<[^>\n]*>|\]\([^)\n]*\)|\[[^\]\n]*\]\[[^\]\n]*\]|^\s*\.\. .*$|^\s*:\w+:.*$", re.M
)
_WORD_EDGES = "\"'“”‘’()[]{}.,;:!?*_`~<>«»„"


def _prose_words(line: str) -> list[str]:
    """The whitespace-separated words of a line made of letters only, lowercased."""
    words = (tok.strip(_WORD_EDGES) for tok in line.split())
    return [w.lower() for w in words if w.isalpha()]


def _capitalised(line: str) -> float:
    """The share of a line's letter-only words that start with a capital letter."""
    words = [w for w in (tok.strip(_WORD_EDGES) for tok in line.split()) if w.isalpha()]
    return sum(1 for w in words if w[0].isupper()) / max(1, len(words))


def _word_salad(text: str) -> Finding | None:
    """Words without grammar. A long line in a spaced script where almost none is a function
    word: every language spends a third to a half of its running words on its 100 most
    common ones, a sample of vocabulary entries does not (lines of code, lists and UI strings
    are short, so lines of 40+ words are judged at under 12%, lines of 12+ at under 5%). Or a
    handful of words shuffled: fewer than 30 different words in 100 running ones, without a
    loop (healthy prose and message catalogs keep 36+)."""
    prose = _MARKUP_RE.sub(" ", _code_free(text))
    everything: list[str] = []
    for line in prose.split("\n"):
        words = _prose_words(line)
        everything += words
        if len(words) < 12:
            continue
        scripts = Counter(_script(w[0]) for w in words)
        script, n = scripts.most_common(1)[0]
        if script not in _SPACED_LANGS or n < 0.8 * len(words):
            continue
        share = _function_word_share([w for w in words if _script(w[0]) == script], script)
        # 40+ words under 12%; or 12+ words with hardly one (healthy lines of 12-39 words: 6%+),
        # unless separators make the line a list of terms ("Skills: Python, Java, machine learning")
        # or names ("Kubernetes Docker Terraform Ansible …": most words capitalised)
        listed = sum(line.count(mark) for mark in ",;|/·、") >= len(words) / 4 or _capitalised(line) >= 0.5
        if share < 0.12 and (len(words) >= 40 or (share < 0.05 and not listed)):
            return Finding("word-salad", f"{len(words)} words with {share:.0%} function words (natural text: 30-50%)")
    for start in range(0, len(everything) - 99, 25):
        distinct = len(set(everything[start : start + 100]))
        if distinct < 30:
            return Finding("word-salad", f"{distinct} different words in 100 running ones (natural text: 40+)")
    return None


# English function words, and pairs of them no English clause puts side by side: two
# determiners ("the an", "their the"), and prepositions or conjunctions doubled or crossed ("to
# to", "of to", "and and"). Only words that are nothing but determiners ("a" is also a variable,
# "these" and "those" are pronouns); a determiner before a preposition is left out, for it names
# a keyword or a button as often ("the for loop", "the ON clause", "the About dialog"), and so are
# "in in" and "on on" ("log in in the corner"). Hyphenated and underscored words are one word
# ("in-place", "in_list"). Healthy English (READMEs, code comments, answers) has at most two pairs.
_DETERMINERS = frozenset({"the", "an", "my", "your", "its", "our", "their", "every"})
_NEVER_ADJACENT = frozenset(
    {(p, p) for p in ("to", "of", "at", "by", "for", "with", "from", "and", "or")}
    | {(a, b) for a in ("of", "to") for b in ("to", "of")}
    | {(a, "of") for a in ("in", "at", "by", "for", "with")}
    | {("of", b) for b in ("in", "on", "at", "for", "with", "from")}
)
_CLAUSE_BREAK_RE = re.compile(r"[^\w\s'’-]+|\n")
_ENGLISH_WORD_RE = re.compile(r"[A-Za-z][A-Za-z0-9_'-]*")


def _broken_grammar(text: str) -> Finding | None:
    """Function words in an order no English sentence has ("description of to and get-request
    to to"): fluent-looking salad keeps the common words but not their order. Three such pairs
    in one answer; code, markup and punctuation break the pairs."""
    prose = _MARKUP_RE.sub("\n", _code_free(text, gap="\n"))
    pairs: list[str] = []
    for clause in _CLAUSE_BREAK_RE.split(prose):
        words = [word.lower() for word in _ENGLISH_WORD_RE.findall(clause)]
        for a, b in zip(words, words[1:], strict=False):
            if (a in _DETERMINERS and b in _DETERMINERS) or (a, b) in _NEVER_ADJACENT:
                pairs.append(f"{a} {b}")
    if len(pairs) >= 3:
        return Finding("broken-grammar", f"{len(pairs)} function-word pairs no English sentence has: {pairs[:5]}")
    return None


_LONE_MARK_LINES = frozenset({".", ",", "!", "?", "。", "，", "！", "？"})


def _fragments(text: str) -> Finding | None:
    """Lines broken off mid-sentence: lines that are a lone punctuation mark, or that open a
    quotation and never close it, making up a third of the answer's lines."""
    lines = [line.strip() for line in _code_free(text).split("\n")]
    lines = [line for line in lines if line and '"""' not in line]
    lone = sum(1 for line in lines if line in _LONE_MARK_LINES)
    unclosed = sum(1 for line in lines if line.count('"') % 2 == 1)
    if lone >= 3 and lone >= 0.3 * len(lines):
        return Finding("fragments", f"{lone} of {len(lines)} lines are a lone punctuation mark")
    # one token per line ("当然\n可以\n。\n请\n…", "2\n*\n1\n Wal\n…"): lines of up to 3 characters
    tiny = sum(1 for line in lines if len(line) <= 3)
    if len(lines) >= 10 and tiny >= 0.6 * len(lines):
        return Finding("fragments", f"{tiny} of {len(lines)} lines hold 3 characters or fewer")
    if unclosed >= 10 and unclosed >= 0.3 * len(lines):
        return Finding("fragments", f"{unclosed} of {len(lines)} lines open a quotation and never close it")
    return _clipped_sentences(text)


# List items are left out (a list of short items is no clipped text: "- Flour.\n- Sugar."); a
# heading's "#" is dropped, its words kept.
_LIST_ITEM_RE = re.compile(r"^[ \t]*(?:\d+[.)]|[-*+])[ \t]+.*$", re.M)
_HEADING_MARK_RE = re.compile(r"^[ \t]*#+[ \t]+", re.M)
# Abbreviations end no sentence ("e.g. Rust", "See Fig. 3", "Dr. Smith")
_ABBREVIATION_RE = re.compile(
    r"\b(?:e\.g|i\.e|etc|vs|cf|al|approx|Fig|Figs|Eq|No|Nos|Vol|pp|Dr|Mr|Mrs|Ms|Prof|St|Jr|Sr|Inc|Ltd|Co)\.", re.I
)


def _clipped_sentences(text: str) -> Finding | None:
    """Sentences cut to a word or two ("In this. assistant In. 3. On.", "(Done).\n(Action)."):
    in a text written in Latin letters, three in five of 8+ sentences (list items left out) end
    after two words or fewer; healthy READMEs, code and answers: under a third."""
    prose = _MARKUP_RE.sub(" ", _code_free(text))
    counts = _script_counts(prose)
    if not counts or counts.most_common(1)[0][0] != "LATIN":
        return None
    prose = _ABBREVIATION_RE.sub(" ", _HEADING_MARK_RE.sub("", _LIST_ITEM_RE.sub("", prose)))
    sentences = [part.strip() for line in prose.split("\n") for part in _SENTENCE_SPLIT_RE.split(line) if part.strip()]
    if len(sentences) < 8:
        return None
    clipped = [s for s in sentences if s[-1] in ".!?" and len(re.findall(r"[^\W\d_]+", s)) <= 2]
    if len(clipped) >= 0.6 * len(sentences):
        return Finding("fragments", f"{len(clipped)} of {len(sentences)} sentences end after two words or fewer")
    return None


# ----------------------------------------------------------------------------- stutter, spacing
_GLUED_TWICE_RE = re.compile(r"\b([A-Za-z]{2,})\1\b")
_GLUED_THRICE_RE = re.compile(r"([^\W\d_]{3,})\1\1")  # "friendfriendfriend", "TheTheThe", any script


def _stutter(text: str) -> Finding | None:
    words = re.findall(r"[^\W\d_]+", _code_free(text).lower())
    if len(words) < 6:
        return None
    # single letters repeat in formulas ("x x" of "3x^3 + 2x^2"); "is is is" loops are loops
    if thrice := _GLUED_THRICE_RE.search(_MARKUP_RE.sub(" ", _code_free(text))):
        return Finding("stutter", f"a word glued to itself three times: {thrice.group()!r}")
    # one word said four times in a row ("Care Care Care Care"): healthy text says a word at
    # most twice in a row; a mark between the words ("to, to, to, to") breaks the run
    tokens = re.findall(r"\w+|[^\w\s]+", _code_free(text).lower())
    run = 1
    for a, b in zip(tokens, tokens[1:], strict=False):
        run = run + 1 if a == b and sum(ch.isalpha() for ch in a) >= 2 else 1
        if run >= 4:
            return Finding("stutter", f"{a!r} said {run} times in a row")
    doubled = sum(1 for a, b in zip(words, words[1:], strict=False) if a == b and len(a) >= 2)
    glued = len(_GLUED_TWICE_RE.findall(text))
    # a word said twice in a row is emphasis once ("very very"); 2+ times in a sixth of the words
    # ("Over Iz Iz Our Iz Iz Amb") is a stutter, as 3+ are in a fifth (healthy text: under a tenth)
    if (doubled + glued >= 3 and doubled + glued >= 0.2 * len(words)) or (
        doubled >= 2 and doubled >= 0.15 * len(words)
    ):
        return Finding("stutter", f"{doubled} words said twice in a row, {glued} glued to themselves, in {len(words)}")
    return None


_DOUBLE_SPACE_RE = re.compile(r"(?<=[^\W\d_])[.,!?]? {2}(?=[^\W\d_])")
_SINGLE_SPACE_RE = re.compile(r"(?<=[^\W\d_])[.,!?]? (?=[^\W\d_])")


# A word of 32+ letters in lower case (after a capital at most): words run together, any
# language's longest common words are shorter ("Thereareseveralclassesavailablebydefault").
_CHAINED_WORDS_RE = re.compile(r"(?<![A-Za-z0-9_])[A-Za-z0-9]++(?:_[A-Za-z0-9]++){15,}")
_MIXED_RUN_RE = re.compile(r"(?<![A-Za-z0-9])[A-Za-z0-9]{12,}+(?![A-Za-z0-9])")
_RUN_TOGETHER_RE = re.compile(r"(?<![\w-])[A-Z]?[a-z]{31,}(?![\w-])")
# Byte-level BPE's space and newline (Ġ U+0120, Ċ U+010A) after a lower-case letter or a mark,
# SentencePiece's space (▁ U+2581) between letters: tokens printed undecoded ("HelloĠworld").
_BPE_SPACE_RE = re.compile(r"(?<=[a-z0-9\"',.:;{}\[\]()`])[ĠĊ]|(?<=[^\W\d_])▁(?=[^\W\d_])")


def _spacing(text: str) -> Finding | None:
    prose = _code_free(text)
    if len(markers := _BPE_SPACE_RE.findall(text)) >= 1 and ("▁" not in markers or len(markers) >= 2):
        return Finding("broken-spacing", f"{len(markers)} tokenizer space markers left in the text: {markers[:3]}")
    if glued := _RUN_TOGETHER_RE.search(_MARKUP_RE.sub(" ", prose)):
        return Finding("broken-spacing", f"{len(glued.group())} letters without a space: {glued.group()[:40]!r}")
    # words run together with underscores: 16+ parts in one name outside code spans (healthy
    # code: 6 at most; a long test name has a dozen)
    if chained := _CHAINED_WORDS_RE.search(_MARKUP_RE.sub(" ", prose)):
        return Finding(
            "broken-spacing", f"{chained.group().count('_') + 1} words joined by '_': {chained.group()[:40]!r}"
        )
    for rand in _MIXED_RUN_RE.findall(_MARKUP_RE.sub(" ", prose)):
        # 12+ letters and digits in prose switching case or kind every 2.5 characters: token
        # soup, not a word or a hex hash ("world-Europae4Ugqpg0oIuPzDK")
        kinds = ["d" if ch.isdigit() else "u" if ch.isupper() else "l" for ch in rand]
        switches = sum(1 for a, b in zip(kinds, kinds[1:], strict=False) if a != b)
        if {"d", "u", "l"} <= set(kinds) and switches >= 0.4 * len(rand):
            return Finding("broken-spacing", f"a run of mixed letters and digits in prose: {rand[:40]!r}")
    doubled = len(_DOUBLE_SPACE_RE.findall(prose)) if "  " in prose else 0
    if doubled >= 8 and doubled >= (single := len(_SINGLE_SPACE_RE.findall(prose))):
        return Finding("broken-spacing", f"{doubled} of {doubled + single} word gaps are two spaces")
    for chunk in prose.split():
        if len(chunk) < 60 or any(ch in chunk for ch in "/_=\\@#"):
            continue
        letters = sum(ch.isalpha() for ch in chunk)
        # words and sentence marks run together ("classes,each.The"): 3+ marks between words
        clauses = [piece for piece in re.split(r"[,.;:]", chunk) if len(piece) >= 2 and piece.isalpha()]
        if letters >= 60 and letters >= 0.8 * len(chunk) and len(clauses) >= 4:
            return Finding("broken-spacing", f"{len(chunk)} characters of prose without a space: {chunk[:40]!r}")
    return None


# ----------------------------------------------------------------------------- punctuation
_SENTENCE_MARKS = set(".,;:!?'\"()-–—…·、。，！？：；「」『』（）《》")


def _punctuation_salad(text: str) -> Finding | None:
    """Symbols and stray marks where words should be: judged on prose only, where healthy
    text keeps symbols (beyond sentence punctuation) well under a third of its characters,
    and all marks together (sentence punctuation too) under two fifths."""
    prose = _RULE_LINE_RE.sub("", _code_free(text))
    if _TABLE_RULE_RE.search(prose):
        return None  # a markdown table (its header separator row: "|---|:---:|")
    chars = Counter(prose)
    visible = sum(n for ch, n in chars.items() if not ch.isspace())
    if visible < 12:
        return None
    # mostly marks, few letters ('\\\\},""#im)\// &#..'), a run of one mark counted once (dot leaders);
    # a short answer (12+) only when letters are almost absent ("|s |- 1 |  | |-2| | |3")
    squeezed = [ch for ch in _MARK_RUN_RE.sub(r"\1", prose) if not ch.isspace()]
    marks = sum(1 for ch in squeezed if not _is_letter(ch))
    letters = sum(1 for ch in squeezed if ch.isalpha())
    if marks >= 0.6 * len(squeezed) and (
        (len(squeezed) >= 24 and letters <= 0.25 * len(squeezed))
        or (len(squeezed) >= 12 and letters <= 0.1 * len(squeezed))
    ):
        return Finding("punctuation-salad", f"{marks} of {len(squeezed)} characters are marks, {letters} letters")
    if visible < 24:
        return None
    if visible >= 48:
        symbols = sum(n for ch, n in chars.items() if not (ch.isspace() or _is_letter(ch) or ch in _SENTENCE_MARKS))
        if symbols >= 0.35 * visible:
            return Finding("punctuation-salad", f"{symbols} of {visible} characters are symbols")
    tokens = prose.split()
    lone = [tok for tok in tokens if _LONE_MARK_TOKEN_RE.match(tok)]
    if len(lone) >= 20 and len(lone) >= 0.4 * len(tokens):  # "— — ( ( — ` —. …": marks instead of words
        return Finding("punctuation-salad", f"{len(lone)} of {len(tokens)} words are punctuation marks alone")
    for chunk in tokens:  # "1GB$B*:+GC3@34(*!%,(<:C@@2#30.25,8A2$8%*": characters, not words
        if len(chunk) >= 40 and "://" not in chunk and (soup := _character_soup(chunk)):
            return soup
    return None


_MARK_RUN_RE = re.compile(r"([^\w\s])\1+")
_TABLE_RULE_RE = re.compile(r"^[ \t]*\|?[ \t]*:?-{3,}:?[ \t]*\|", re.M)


def _is_letter(ch: str) -> bool:
    """A letter, a digit, or a letter's combining mark (Devanagari and Thai vowel signs are
    marks of category M, not symbols: "हिन्दी" is five letters' worth of writing)."""
    return ch.isalnum() or unicodedata.category(ch)[0] == "M"


# Prose punctuation standing alone as a word (dashes, ellipses, quotes, brackets, ticks); list
# markers and operators (- * + = < >) are left out: they stand alone in lists and formulas.
_LONE_MARK_TOKEN_RE = re.compile(r"^[—–…\"'`✓()\[\].,:;!?/]+$")


def _character_soup(chunk: str) -> Finding | None:
    """40+ characters without a space that mix letters, digits and marks with no word in them:
    letters come one or two at a time and marks make up a third."""
    marks = sum(1 for ch in chunk if not ch.isalnum())
    letter_runs = re.findall(r"[^\W\d_]+", chunk)
    if not letter_runs or marks < 0.3 * len(chunk) or not any(ch.isdigit() for ch in chunk):
        return None
    if sum(map(len, letter_runs)) / len(letter_runs) <= 2:
        return Finding("punctuation-salad", f"{len(chunk)} characters of letters, digits and marks: {chunk[:40]!r}")
    return None


# ----------------------------------------------------------------------------- combining marks
# The same combining mark twice on one letter ("เป็็น", "สั่่น"): Thai, Indic and Arabic vowel and
# tone marks are written once; a decoder that drops or repeats byte tokens doubles them.
# Variation selectors (emoji) are not marks of a letter.
_DOUBLED_MARK_RE = re.compile(r"([\u0300-\u036f\u0591-\u05c7\u064b-\u065f\u0900-\u0dff\u0e31-\u0eff\u1000-\u109f])\1")


def _doubled_marks(text: str) -> Finding | None:
    spots = [m.group() for m in _DOUBLED_MARK_RE.finditer(text) if unicodedata.category(m.group(1)) == "Mn"]
    if spots:
        return Finding("broken-marks", f"the same combining mark twice on a letter, {len(spots)}x: {spots[:3]}")
    return None


# ----------------------------------------------------------------------------- mojibake
_LEAD_BYTE_RE = re.compile("[\u00c2-\u00f4]")
# GBK/GB18030 punctuation (row 0xA1: ’ “ ” 、 …) read as Latin-1: "¡" and a second Latin-1 sign
# right after a letter ("Google¡¯s"); Spanish "¡" opens a sentence, it never follows a letter.
_GBK_AS_LATIN1_RE = re.compile("(?<=[^\\W\\d_])\u00a1[\u00a1-\u00bf]")


def _mojibake(text: str) -> Finding | None:
    """UTF-8 decoded as cp1252/Latin-1 ("Ã©", "å¤¢"): ftfy's calibrated heuristic; GBK
    punctuation decoded as Latin-1 ("Google¡¯s")."""
    if gbk := _GBK_AS_LATIN1_RE.findall(text):
        return Finding("mojibake", f"{len(gbk)} GBK punctuation marks decoded as Latin-1: {gbk[:3]}")
    if not _LEAD_BYTE_RE.search(text):
        return None  # UTF-8 lead bytes read as cp1252/Latin-1 are Â..ô: none, no mojibake
    from ftfy.badness import badness

    score = badness(text)
    if score >= 2 and score >= len(text) / 200:  # one per 200 characters: quoting one is no failure
        return Finding("mojibake", f"{score} sequences of UTF-8 decoded as a single-byte codepage")
    return None


# ----------------------------------------------------------------------------- detect
def detect(text: str) -> list[Finding]:
    """Every degeneracy finding for one output; an empty list means it looks coherent."""
    findings: list[Finding] = []
    text = _SURROGATE_RE.sub("\ufffd", text)  # counted below as U+FFFD; UTF-8 cannot encode them
    stripped = text.strip()
    if not stripped:
        return [Finding("empty", "the output is empty or whitespace only")]

    code_free = _code_free(text)
    template = _TEMPLATE_RE.findall(text) + _SENTENCE_TOKEN_RE.findall(code_free)
    if template:
        findings.append(Finding("template-tokens", f"chat-template tokens in the text: {sorted(set(template))[:6]}"))

    replacement = text.count("\ufffd")
    control = len(_CONTROL_RE.findall(text))
    if replacement or control >= 2:  # one BEL is a terminal message's (bash's catalog)
        findings.append(
            Finding("bad-characters", f"{replacement} U+FFFD and {control} control characters in {len(text)}")
        )

    if bang := _BANG_RE.search(text):
        findings.append(Finding("exclamation-run", f"a run of {len(bang.group())} '!' (NaN logits decode to '!')"))
    elif glued := _GLUED_MARK_RUN_RE.search(code_free):
        findings.append(Finding("repetition-loop", f"{len(glued.group())}x {glued.group(1)!r} glued to a word"))

    visible = [ch for ch in stripped if not ch.isspace()]
    if len(visible) >= 3 and not any(ch.isalnum() for ch in visible):
        findings.append(Finding("no-words", f"{len(visible)} characters and not one letter or digit"))
    for period in range(1, 5):  # "GGGGGGGGG", "OfOfOfOf": the whole answer is one short unit again
        if len(stripped) >= 5 * period and stripped == stripped[:period] * (len(stripped) // period):
            findings.append(Finding("repetition-loop", f"the whole output repeats {stripped[:period]!r}"))
            break

    loop = _loop_finding(_RULE_LINE_RE.sub("", stripped))
    if loop:
        findings.append(loop)
    elif (
        len(stripped.encode("utf-8")) <= 40 and (words := stripped.split()) and len(words) >= 2 and len(set(words)) == 1
    ):
        findings.append(Finding("repetition-loop", f"the whole output repeats one word: {stripped!r}"))
    if not loop and (repeated := _repeated_lines(text)):
        findings.append(repeated)

    n_bytes = len(text.encode("utf-8"))
    if n_bytes >= 64:
        ratio = compression_ratio(text)
        limit = compression_threshold(n_bytes)
        if ratio > limit:
            findings.append(Finding("compression-ratio", f"zlib ratio {ratio:.1f} > {limit:.1f} for {n_bytes} bytes"))

    findings += _script_findings(text)
    checks = (
        _word_salad,
        _broken_grammar,
        _fragments,
        _stutter,
        _spacing,
        _punctuation_salad,
        _doubled_marks,
        _mojibake,
    )
    for check in checks:
        if found := check(text):
            findings.append(found)
    return findings
