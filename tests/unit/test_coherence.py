"""Coherence detectors (the gate's cheap first stage): every real degenerate sample flagged, the
held-out half of the degenerate corpus measured against issue 22's figures (its 85% target was
dropped by issue 34; tests/data/coherence/README.md), <= 1% false positives on 300+ healthy real
texts in many languages, scripts and formats."""

from __future__ import annotations

import hashlib
import json
import random
import unicodedata
from collections import Counter

import pytest
from tests.support.coherence_corpus import (
    COHERENCE,
    HALVES,
    HELDOUT,
    HELDOUT2_SHA256,
    HELDOUT3_SHA256,
    HELDOUT4_SHA256,
    HELDOUT5_SHA256,
    HELDOUT_SHA256,
    degenerate,
    healthy_texts,
    real_answers,
    tuning_data,
)
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


# ----------------------------------------------------------------------------- issue 22's corpora
CLASSES = {
    "word-salad",
    "punctuation-salad",
    "cjk-loop",
    "late-loop",
    "long-loop",
    "stutter",
    "template-tokens",
    "stray-script",
    "replacement-chars",
    "exclamation-run",
    "detokenizer-spacing",
    "mojibake",
}


def _rate(rows: list[dict[str, str]]) -> float:
    return sum(1 for row in rows if coherence.detect(row["text"])) / len(rows)


@pytest.mark.parametrize(
    ("name", "sha256"),
    [
        ("heldout", HELDOUT_SHA256),
        ("heldout-2", HELDOUT2_SHA256),
        ("heldout-3", HELDOUT3_SHA256),
        ("heldout-4", HELDOUT4_SHA256),
        ("heldout-5", HELDOUT5_SHA256),
    ],
)
def test_each_held_out_half_is_the_file_committed_before_its_rounds_detector_changes(name: str, sha256: str) -> None:
    data = (COHERENCE / f"degenerate-{name}.jsonl").read_bytes()
    assert hashlib.sha256(data).hexdigest() == sha256


def test_the_degenerate_corpus_has_cited_outputs_in_every_class_split_in_halves_per_round() -> None:
    halves = {half: degenerate(half) for half in HALVES}
    rounds = (("heldout", "tuning"), ("heldout-2", "tuning-2"), ("heldout-3", "tuning-3"), ("heldout-4", "tuning-4"))
    rounds += (("heldout-5", "tuning-5"),)
    for heldout, tuning in rounds:
        assert len(halves[heldout]) + len(halves[tuning]) >= 60
        assert abs(len(halves[heldout]) - len(halves[tuning])) <= 1
    rows = [row for half in HALVES for row in halves[half]]
    assert len({row["text"] for row in rows}) == len(rows)  # no output twice, in a round or across
    # each round's threads are new: no source (issue or pull request) of one round in another
    sources = [{r["source"] for r in halves[heldout] + halves[tuning]} for heldout, tuning in rounds]
    for i, earlier in enumerate(sources):
        for later in sources[i + 1 :]:
            assert not earlier & later, earlier & later
    assert {r["class"] for r in rows} == CLASSES
    for row in rows:
        assert row["text"].strip() and row["engine"], row
        assert row["source"].startswith("https://github.com/") and (
            "/issues/" in row["source"] or "/pull/" in row["source"]
        ), row
        assert set(row) <= {"text", "source", "engine", "class", "note"}, row


# Round 1's held-out half was measured once (674b005): 29 of 40; round 2's once at the end of round
# 2: 26 of 31 (83.9%); round 3's once at the end of round 3 (600f707): 24 of 32 (75.0%); round 4's
# once at the end of round 4 (22162fe): 25 of 32 (78.1%). Each is tuning data since the round after
# its own (its misses may be read). Round 5's held-out half (cb77ffd) was measured once, at the end
# of round 5's tuning (26d7912), with the detectors from before round 5 and after it in one run: 24
# of 36 both (66.7%, docs/benchmarks.md). Issue 22's target of 85% was not reached in five rounds;
# issue 34 dropped it (the text form cannot show what the rest needs: the gate now also judges known
# answers, losslessness and the prefix cache on a real model), keeping the figures as measured, and
# round 5's held-out misses were never looked at (protocol, tests/data/coherence/README.md). Later commits
# (244fc08 and the one after it) only narrowed rules against false positives on normal answers; this
# floor checks the held-out rate did not fall below the figure measured.
HELDOUT5_MEASURED = 24 / 36


def test_round_5s_held_out_half_is_flagged_at_least_at_the_rate_measured_once() -> None:
    rate = _rate(degenerate(HELDOUT))  # the rate only: the misses are not looked at (protocol)
    assert rate >= HELDOUT5_MEASURED, f"held-out rate {rate:.1%}"


def test_the_tuning_data_is_flagged_at_85_percent_or_more() -> None:
    rows = tuning_data()  # rounds 1 to 4's eight halves and round 5's tuning half
    missed = [(row["class"], row["text"][:60]) for row in rows if not coherence.detect(row["text"])]
    assert _rate(rows) >= 0.85, missed


# The script each answer's language is written in: (name, the Unicode name prefixes of its letters)
SCRIPTS = {
    "en": ("Latin", ("LATIN",)),
    "ru": ("Cyrillic", ("CYRILLIC",)),
    "zh": ("Han", ("CJK",)),
    "ja": ("Japanese kana and kanji", ("HIRAGANA", "KATAKANA", "CJK")),
    "ko": ("Hangul", ("HANGUL",)),
    "th": ("Thai", ("THAI",)),
}


def _letters_in(text: str, prefixes: tuple[str, ...]) -> int:
    return sum(1 for ch in text if ch.isalpha() and unicodedata.name(ch, "").startswith(prefixes))


def test_the_healthy_corpus_has_300_texts_50_real_answers_in_5_scripts_and_50_code_answers() -> None:
    answers = real_answers()
    prose = [row for row in answers if row["kind"] == "answer"]
    for row in prose:  # written in its language's script, not only labelled so
        assert _letters_in(row["text"], SCRIPTS[row["lang"]][1]) >= 10, row["item"]
    scripts = {SCRIPTS[row["lang"]][0] for row in prose}
    assert len(healthy_texts()) >= 300
    assert len(prose) >= 50 and len(scripts) >= 5, scripts
    assert sum(1 for row in answers if row["kind"] == "code") >= 50
    for row in answers:
        assert row["source"].startswith("https://github.com/") and "/blob/" in row["source"] and row["item"], row


def test_the_healthy_corpus_is_flagged_at_1_percent_or_less() -> None:
    texts = healthy_texts()
    flagged = [(kind, text[:60], coherence.detect(text)) for kind, text in texts if coherence.detect(text)]
    assert len(flagged) <= 0.01 * len(texts), flagged


def _salad(words: list[str], n: int, seed: int = 22) -> str:
    pick = random.Random(seed)
    return " ".join(pick.choice(words) for _ in range(n))


VOCABULARY = [
    "granite",
    "velocity",
    "umbrella",
    "Lisbon",
    "quartz",
    "membrane",
    "harvest",
    "oxide",
    "pilgrim",
    "turbine",
    "sonnet",
    "walnut",
    "glacier",
    "census",
    "plywood",
    "carnival",
    "fjord",
    "lantern",
    "cobalt",
    "meridian",
    "tundra",
    "saffron",
    "beacon",
    "orchid",
]


@pytest.mark.parametrize(
    ("text", "detector"),
    [
        ("洗小" * 20, "repetition-loop"),  # 120 bytes in 40 characters
        ("好的，我来解释。" + "寄托" * 12, "repetition-loop"),
        ("Here is the plan. " + "Step 1: Add a contact form. Step 2: Add a contact form. " * 2, "repeated-lines"),
        ("<start_of_turn>model\nHello<end_of_turn>", "template-tokens"),
        ("Done.<｜end▁of▁sentence｜>", "template-tokens"),
        ("def f():<fim_middle>    return 1", "template-tokens"),
        ("The answer is four.</s>", "template-tokens"),
        ("We should output only that word.assistantfinalfour", "template-tokens"),
        ("<unk><unused17><unused3>", "template-tokens"),
        ("Ã©tÃ© Ã  la plage, trÃ¨s belle journÃ©e", "mojibake"),
        ("The answer is 42 and the unit is метр here.", "stray-script"),
        ("我们用печат函数打印日志。", "stray-script"),
        ("scalablytyped373ьallis gutterぼdiaeftry", "script-mixing"),
        ("Demp Шул γάμμα ぼた 한국 Fallon", "many-scripts"),
        (_salad(VOCABULARY, 60), "word-salad"),  # no function words
        (
            _salad(["one", "can", "use", "you", "a", "help", "message", "write", "response", "long"], 150),
            "word-salad",
        ),  # few words
        ('It began:\n"They\n"seem\n"mind\n"hard\n"ever\n"making\n"them\n"still\n"not\n"Just\n"how', "fragments"),
        ("When the\n.\n\nThe first\n\n.\n\nThe first\n\n.", "fragments"),
        ("The the answer answer to to the the question question is is yes yes", "stutter"),
        ("This  is  a  chat  between  the  two  of  us  about  the  weather  today.", "broken-spacing"),
        ("Thereareseveral,classesofthings.Eachhasitsown;purposeandstructure:thatiswhatmatters.", "broken-spacing"),
        ("(;?1 -**+0.9**\n\n<<>>~~##@@ %%^^&&** ((]]{{ }}|| ++==--__ //\\\\ ::;;", "punctuation-salad"),
        ("ok\x00\x01 then", "bad-characters"),
        # round 3
        ("ぬぬぬぬぬぬ…", "repetition-loop"),  # 18 bytes of one kana, most of the answer
        ("The operating system is One" + "#" * 24, "repetition-loop"),  # a mark run glued to a word
        ("Google¡¯s engine is fast and it¡¯s free.", "mojibake"),  # GBK quotes read as Latin-1
        (r"""\\\}#@)\// &#..\\\'\x,8\\, \""%$ ^{;}~ <\\>""", "punctuation-salad"),  # marks, few letters
        ("Here: k3#P!9@z(2%Q;7&m)1^X*4+w=6-J~0<f>5,T.8!r4$", "punctuation-salad"),  # characters, no words
        ("Well — — ( ( — ' —. … — — ' — ( — — — — — — — — — — ' — — —. — — …", "punctuation-salad"),
        ("Office:<unused6226><unused6226> a workspace.", "template-tokens"),
        ("Sure.\n" + "You are the best assistant and your name is Ada…\n" * 3, "repeated-lines"),
        # round 4 (general signals chosen by leave-one-round-out validation)
        ("Som at the G and Care Care Care Care and the m at the end", "stutter"),  # 4x in a row
        ("สาเหตุของน้ำป่า เป็็นสาเหตุ", "broken-marks"),  # a Thai mark written twice
        ("|s\n\n|- 1\n|  |\n|-2|\n|\n|3", "punctuation-salad"),  # short, marks and no letters
        ("Over Central Por Over Iz Iz Our Iz Iz Amb Our IB", "stutter"),  # two words said twice
        (
            "def " + "_".join(["main", "module", "rebind", "context", "freeze", "use", "order", "in", "fact"] * 3),
            "broken-spacing",
        ),
        ("It was all the days in the world-Europae4Ugqpg0oIuPzDK, to say nothing.", "broken-spacing"),
        # round 5 (general signals chosen on rounds 1 to 4 before round 5's outputs were read)
        ("The neighbour mo比亚 said det2间为准 to the branch, convention禁 aside.", "script-mixing"),
        ("The request of to the service, and description of to and get-request to to.", "broken-grammar"),
        ("The the of an the report, and and more", "broken-grammar"),
        (
            "conclusive request harbour entry wizard speculation screw February augmented transaction acetyl "
            "manually unique enzymes dirty",
            "word-salad",
        ),  # 15 words, no function word
        (
            "Notes.\n"
            + "I have added a new section in the readme with the capabilities of this project and its examples. "
            "Please review it.\n" * 2,
            "repeated-lines",
        ),
        (
            "# am. In this. assistant In. 3. On. # #. Open this assistant. #.\nNo. The assistant has no. Open it.",
            "fragments",
        ),
        ("(Statement).\n(Safe leaf).\n(Done).\n(Action).\n(Tool).\n(Replace).\n(Read).\n(Write).", "fragments"),
    ],
)
def test_each_new_detector_fires_on_its_failure(text: str, detector: str) -> None:
    assert detector in {f.detector for f in coherence.detect(text)}, coherence.detect(text)


@pytest.mark.parametrize(
    "text",
    [
        "使用 Python 的 requests 库发送 HTTP 请求，然后用 json() 方法解析返回的数据。",
        "함수 f(x) = 3x^3 + 2x^2 + 58의 미분을 구하면 f'(x) = 9x^2 + 4x 입니다.",
        "エンタルピー変化 ΔH は負なので、この反応は発熱反応です。",
        "Слово «東京» означает «восточная столица».",
        "คำตอบที่ถูกต้องคือ ข้อ C เพราะเป็นแนวทางที่สมดุล",
        "Use `<s>` for strikethrough:\n\n```html\n<s>old</s> new\n```",
        "The Greek letter π (pi) and the angle θ appear in the formula.",
        "- Cancel\n- Cancel all\n- Cancel\n- OK\n- Cancel",
        "Is it? Yes. Is it? Yes. Is it? Yes.",
        "x = 1  # 设置变量\ny = 2  # 第二个变量",
        "Title\n" + "=" * 60 + "\n\nSome text about the topic.",
        "The Russian word *привет* means hello, and **спасибо** means thank you.",
        # round 3
        "¡Hola! ¿Cómo estás? Muy bien, gracias. ¡Hasta luego!",
        "Use C# or F# for this, or #### for a level-4 heading.",
        "The SHA-256 is 9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08.",
        "Москва — столица России — и крупнейший город — страны.",
        "Chapter 1 ........................ 12\nChapter 2 ........................ 34",
        "$$x = \\frac{-b \\pm \\sqrt{b^2-4ac}}{2a}$$",
        # round 4
        "Is the bridge safe? No, no: it is very very old and the answer is to wait for the repair.",
        "नमस्ते दुनिया, यह एक परीक्षण है। हिन्दी में मात्राएँ एक बार लिखी जाती हैं।",
        "สวัสดีครับ ผมชื่อสมชาย เป็นสาเหตุของน้ำท่วม",
        "| Name | Score |\n|---|---:|\n| a | 1 |\n| b | 2 |",
        "3 + 4 = 7; 7 * 2 = 14",
        "The SHA-1 is 2fd4e1c67a2d28fced849ee1bb76e7391b93eb12 and the build id is 20240117.",
        "Call `test_user_can_log_in_with_valid_password_and_remember_me_checked_twice()` to check it.",
        "def test_user_can_log_in_with_valid_password_and_remember_me_checked_twice():\n    assert login()",
        "I love it ❤️❤️❤️ and so does she 👍🏽👍🏽.",
        # round 5
        "In Chinese, “中文” means the Chinese language, and “Python的” means Python's.",
        "使用Python的requests库和Flask框架，可以很快写出一个API服务。",
        "It works with or without a GPU; votes for and against were counted, to the end of the day.",
        "Swap a and b: assign a to temp, then b to a, and copy a to c when a in d is set.",  # a variable
        "We run these in production and those in staging: the in-place sort of in-memory lists.",
        "Put the join condition in the ON clause, filter rows in the WHERE clause, and use the IN operator for "
        "lists; the FROM clause names the tables.",
        "In Python, the for loop walks over any iterable. Inside the for loop, the in operator tests membership, "
        "and the with statement closes files for you.",
        "Open the About dialog from the Help menu, or the About page in Settings. "
        "Fill the To field and the From field.",
        "for x in in_list: check the in_place flag, log in in the corner of the page, and turn on on Monday.",
        "In Korean, particles attach to a loanword too: 'API를' (the API, as object) "
        "and 'Python을' (Python, as object).",
        "Pick a language, e.g. Rust. Or Go, i.e. Python's rival. See Fig. 3. Ask Dr. Smith. Or Mr. Jones. "
        "Cf. Eq. 2. Vol. 3 of the series, pp. 4-5, etc. Done.",
        "Kubernetes Docker Terraform Ansible Jenkins Prometheus Grafana Helm Istio Vault Consul Nomad",
        # 16 words with one function word (6%): above the 5% line
        "fast reliable secure deployment pipelines for modern teams shipping containerized services across regions "
        "clouds clusters daily",
        # a 70-letter line twice in a row: under the 80-letter line
        "Notes:\n" + "The quick brown fox jumps over the lazy dog near the quiet river bank every single day\n" * 2,
        "Keywords: machine learning, deep learning, neural networks, computer vision, natural language "
        "processing, reinforcement learning, robotics",
        "You need:\n- Flour.\n- Sugar.\n- Eggs.\n- Milk.\n- Butter.\n- Salt.\n1. Mix.\n2. Bake.\nEnjoy.",
        "Yes. It works on my machine. Run the tests first, then deploy to staging. Done? Check the logs "
        "and the metrics after the deploy. Good. Then tell the team what changed and why. Thanks for asking.",
        "Header line\n"
        + "- item\n" * 2
        + "A long explanation that is said once and only once, as healthy text does it.",
    ],
)
def test_new_detectors_stay_quiet_on_normal_multilingual_text(text: str) -> None:
    assert coherence.detect(text) == []
