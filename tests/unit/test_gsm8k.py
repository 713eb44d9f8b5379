"""The GSM8K subset and the A6000 profiles' known answers: the shipped subset is the one the profiles
pin (every line a GSM8K record with its `#### N`), it becomes 50 number answers checked by the smoke's
own rule, a changed subset is refused, and every known answer's expected value and code tests are
themselves right."""

from __future__ import annotations

import hashlib
import json
import math
import re
from collections.abc import Iterator
from decimal import Decimal
from fractions import Fraction
from pathlib import Path
from typing import Any

import pytest

from specdeploy.core.errors import InputFileError
from specdeploy.profile import KnownAnswer, Profile, load_profile
from specdeploy.smoke import answers, gsm8k

REPO = Path(__file__).resolve().parents[2]
DATA = REPO / "profiles" / "data"
SUBSET = DATA / "gsm8k-test-subset.jsonl"
PROFILES = ("a6000-dflash", "a6000-dflash-stock", "a6000-mtp")
# GSM8K writes the reference's final number after `####` at the end of its answer.
_FINAL_RE = re.compile(r"#### (-?[\d,]+(?:\.\d+)?)$")


def _records() -> list[dict[str, Any]]:
    return [json.loads(line) for line in SUBSET.read_text(encoding="utf-8").splitlines()]


def _reference_number(record: dict[str, Any]) -> Decimal:
    match = _FINAL_RE.search(record["answer"])
    assert match, f"no '#### N' at the end of {record['answer'][-40:]!r}"
    return Decimal(match.group(1).replace(",", ""))


@pytest.fixture
def fresh_loader() -> Iterator[None]:
    """The subset loader reads each (file, sha256) once per process: start and end with it cleared."""
    gsm8k._read.cache_clear()
    yield
    gsm8k._read.cache_clear()


@pytest.fixture(scope="module", params=PROFILES)
def profile(request: pytest.FixtureRequest) -> Profile:
    return load_profile(request.param)


# --------------------------------------------------------------------------- the subset


def test_the_subset_is_the_file_each_a6000_profile_pins_and_every_line_is_a_gsm8k_record(profile: Profile) -> None:
    spec = profile.smoke.gsm8k
    assert spec is not None and spec.file == SUBSET.name
    found = hashlib.sha256(SUBSET.read_bytes()).hexdigest()
    assert spec.sha256.resolved and spec.sha256.value.removeprefix("sha256:") == found
    assert found in (DATA / "README.md").read_text(encoding="utf-8")  # the README names the same file
    records = _records()
    assert len(records) == spec.questions == 50
    for record in records:
        assert set(record) == {"question", "answer"} and record["question"].strip()
        _reference_number(record)


def test_the_subset_becomes_50_number_answers_whose_values_are_the_references_final_numbers(
    profile: Profile, fresh_loader: None
) -> None:
    spec = profile.smoke.gsm8k
    assert spec is not None
    asked = gsm8k.questions(spec)
    records = _records()
    assert len(asked) == 50
    for answer, record in zip(asked, records, strict=True):
        assert isinstance(answer, KnownAnswer) and answer.expect == "number"
        assert Decimal(str(answer.value)) == _reference_number(record)
        assert answer.prompt.startswith(record["question"]) and answer.max_tokens == spec.max_tokens == 512
    assert len({a.name for a in asked}) == 50


def test_a_subset_whose_bytes_changed_is_refused_naming_its_sha256(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, fresh_loader: None
) -> None:
    spec = load_profile("a6000-mtp").smoke.gsm8k
    assert spec is not None
    gsm8k.questions(spec)  # the shipped subset is accepted, and cached under its name and sha256
    original = SUBSET.read_bytes()
    changed = original.replace(b"#### 18", b"#### 19", 1)  # one reference answer, still valid JSON
    assert changed != original
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / SUBSET.name).write_bytes(changed)
    monkeypatch.setenv("SPECDEPLOY_PROFILES", str(tmp_path))
    gsm8k._read.cache_clear()
    assert gsm8k.data_file(SUBSET.name) == tmp_path / "data" / SUBSET.name
    with pytest.raises(InputFileError) as refused:
        gsm8k.questions(spec)
    message = str(refused.value)
    assert hashlib.sha256(changed).hexdigest() in message and str(spec.sha256.value) in message
    assert "not the recorded subset" in message


def test_the_reference_solutions_are_right_and_another_final_number_is_wrong(fresh_loader: None) -> None:
    spec = load_profile("a6000-dflash").smoke.gsm8k
    assert spec is not None
    for answer, record in list(zip(gsm8k.questions(spec), _records(), strict=True))[:5]:
        solution = record["answer"]
        assert answers.check_answer(answer, solution) is None, solution[-60:]
        head, _, tail = solution.rpartition("####")
        other = Decimal(tail.strip().replace(",", "")) + 1
        problem = answers.check_answer(answer, f"{head}#### {other}")
        assert problem is not None and f"found {other}" in problem


# --------------------------------------------------------------------------- the known answers

FIRST_FOUR = ("arithmetic", "capital", "json", "code")
# What each number answer asks, computed here rather than copied from the profile.
NUMBERS: dict[str, Any] = {
    "add": 48 + 75,
    "subtract": 1000 - 387,
    "multiply": 36 * 24,
    "divide": Fraction(1764, 42),
    "square": 19**2,
    "power": 2**12,
    "square_root": math.isqrt(2025),
    "precedence": 7 + 8 * 6,
    "percent": Fraction(15, 100) * 240,
    "series": sum(range(1, 21)),
    "eggs": 12 * 15,
    "minutes": 7 * 60,
}
# A right implementation of each python_function answer; alternatives a model may equally write
# (case-folding palindromes, math.gcd) must pass too, and wrong ones must fail.
REFERENCES = {
    "reverse_string": "def reverse_string(s):\n    return s[::-1]\n",
    "factorial": "def factorial(n):\n    result = 1\n    for i in range(2, n + 1):\n        result *= i\n"
    "    return result\n",
    "count_vowels": "def count_vowels(s):\n    return sum(1 for c in s.lower() if c in 'aeiou')\n",
    "is_palindrome": "def is_palindrome(s):\n    return s == s[::-1]\n",
    "fizzbuzz": (
        "def fizzbuzz(n):\n    out = []\n    for i in range(1, n + 1):\n"
        "        if i % 15 == 0:\n            out.append('FizzBuzz')\n"
        "        elif i % 3 == 0:\n            out.append('Fizz')\n"
        "        elif i % 5 == 0:\n            out.append('Buzz')\n"
        "        else:\n            out.append(str(i))\n    return out\n"
    ),
    "gcd": "def gcd(a, b):\n    while b:\n        a, b = b, a % b\n    return a\n",
}
ALTERNATIVES = {
    "is_palindrome": "def is_palindrome(s: str) -> bool:\n    t = ''.join(c.lower() for c in s if c.isalnum())\n"
    "    return t == t[::-1]\n",
    "gcd": "import math\n\ndef gcd(a: int, b: int) -> int:\n    return math.gcd(a, b)\n",
    "factorial": "import math\n\ndef factorial(n):\n    return math.factorial(n)\n",
}
WRONG = {
    "reverse_string": "def reverse_string(s):\n    return s\n",
    "factorial": "def factorial(n):\n    return n * factorial(n - 1) if n > 1 else n\n",  # 0! = 0
    "count_vowels": "def count_vowels(s):\n    return sum(1 for c in s if c in 'aeiou')\n",  # lower case only
    "is_palindrome": "def is_palindrome(s):\n    return s[0] == s[-1]\n",
    "fizzbuzz": "def fizzbuzz(n):\n    return [str(i) for i in range(1, n + 1)]\n",
    "gcd": "def gcd(a, b):\n    return min(a, b)\n",
}


def _fenced(source: str) -> str:
    return f"```python\n{source}```"


def test_each_a6000_profile_has_at_least_30_known_answers_with_unique_names_the_same_list_in_each() -> None:
    lists = {name: load_profile(name).smoke.prompts.known_answers for name in PROFILES}
    for known in lists.values():
        names = [a.name for a in known]
        assert len(known) >= 30 and len(set(names)) == len(names)
        assert tuple(names[:4]) == FIRST_FOUR
        kinds = [a.expect for a in known]
        assert kinds.count("number") >= 10 and kinds.count("contains") >= 10 and kinds.count("python_function") >= 6
    first, *others = lists.values()
    assert all(other == first for other in others)


def test_every_number_and_fact_answer_expects_the_right_value() -> None:
    known = load_profile("a6000-mtp").smoke.prompts.known_answers
    numbers = {a.name: a for a in known if a.expect == "number"}
    assert set(numbers) == set(NUMBERS)
    for name, answer in numbers.items():
        assert Decimal(str(answer.value)) == Decimal(NUMBERS[name].numerator) / Decimal(NUMBERS[name].denominator)
        assert 16 <= answer.max_tokens <= 32
        assert answers.check_answer(answer, str(answer.value)) is None
    for answer in (a for a in known[len(FIRST_FOUR) :] if a.expect == "contains"):
        assert isinstance(answer.value, str) and answer.value == answer.value.lower() and answer.value.strip()
        assert answer.max_tokens <= 32


def test_every_python_function_answers_tests_pass_a_right_implementation_and_fail_a_wrong_one(
    profile: Profile,
) -> None:
    functions = [a for a in profile.smoke.prompts.known_answers if a.expect == "python_function"]
    assert {a.function for a in functions} == set(REFERENCES)
    for answer in functions:
        assert answer.function in answer.prompt and 2 <= len(answer.tests) <= 3 and answer.max_tokens == 256
        assert answers.check_answer(answer, _fenced(REFERENCES[answer.function])) is None, answer.name
        if answer.function in ALTERNATIVES:
            assert answers.check_answer(answer, _fenced(ALTERNATIVES[answer.function])) is None, answer.name
        assert answers.check_answer(answer, _fenced(WRONG[answer.function])) is not None, answer.name
