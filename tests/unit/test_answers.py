"""Known answers are judged by what they say (smoke.answers): the final number, a JSON object, code
that parses, and code that runs its tests — the last in a sandboxed child, never in this process."""

from __future__ import annotations

import os
import time

import pytest

from specdeploy.profile import KnownAnswer
from specdeploy.smoke import answers


def _number(value: object) -> KnownAnswer:
    return KnownAnswer(name="n", prompt="?", expect="number", value=value)


def _function(*tests: tuple[str, str]) -> KnownAnswer:
    return KnownAnswer(
        name="f",
        prompt="?",
        expect="python_function",
        function="sum_list",
        tests=[{"call": c, "equals": e} for c, e in tests],
    )


SUM = "```python\ndef sum_list(items):\n    return sum(items)\n```\nThis adds the numbers."


@pytest.mark.parametrize(
    ("text", "value", "right"),
    [
        ("12 + 30 = 42", 42, True),
        ("12 + 30 = 32", 42, False),  # SmolLM2-135M's real answer: a wrong number is wrong
        ("The answer is 1,234.", 1234, True),
        ("She pays 3 dollars, so 18 in total.\n#### 18", "18", True),
        ("#### 18\nand 3 more", 18, True),  # GSM8K's marker: the number right after it
        ("-7 degrees", -7, True),
        ("It is 2.50 dollars.", 2.5, True),
        ("no number here", 4, False),
    ],
)
def test_a_number_answer_is_right_when_its_final_number_is_the_value(text: str, value: object, right: bool) -> None:
    assert (answers.check_answer(_number(value), text) is None) is right


def test_code_that_defines_the_function_and_passes_its_tests_is_right() -> None:
    answer = _function(("sum_list([1, 2, 3])", "6"), ("sum_list([])", "0"))
    assert answers.check_answer(answer, SUM) is None


def test_code_whose_function_computes_the_wrong_value_names_the_call_and_what_it_gave() -> None:
    wrong = SUM.replace("return sum(items)", "return max(items)")
    problem = answers.check_answer(_function(("sum_list([1, 2, 3])", "6")), wrong)
    assert problem is not None and "sum_list([1, 2, 3]) gave 3, expected 6" in problem


def test_code_without_the_function_or_that_does_not_parse_is_wrong() -> None:
    answer = _function(("sum_list([1])", "1"))
    assert "expected a function sum_list()" in str(answers.check_answer(answer, "def total(x):\n    return 1"))
    assert "does not parse" in str(answers.check_answer(answer, "def sum_list(:"))


@pytest.mark.parametrize(
    ("body", "named"),
    [
        ("import os\ndef sum_list(x):\n    return os.system('id')", "imports 'os'"),
        ("def sum_list(x):\n    return __import__('os')", "'__import__'"),
        ("def sum_list(x):\n    return x.__class__.__bases__", "'__bases__'"),
        ("def sum_list(x):\n    return open('/etc/passwd').read()", "'open'"),
        ("def sum_list(x):\n    return eval('1')", "'eval'"),
        ("from subprocess import run\ndef sum_list(x):\n    return 1", "imports 'subprocess'"),
    ],
)
def test_code_that_reaches_outside_its_sandbox_is_refused_before_it_runs(body: str, named: str) -> None:
    problem = answers.check_answer(_function(("sum_list([1])", "1")), body)
    assert problem is not None and named in problem and "not run" in problem


def test_code_that_never_ends_is_stopped_and_reported() -> None:
    looping = "def sum_list(x):\n    while True:\n        pass"
    started = time.monotonic()
    problem = answers.check_answer(_function(("sum_list([1])", "1")), looping)
    assert problem is not None and "did not run" in problem
    assert time.monotonic() - started < answers.RUN_TIMEOUT_S + 5


def test_the_sandbox_child_runs_unprivileged_and_can_open_no_file() -> None:
    """The runner itself (below the screen): as nobody when the gate runs as root, and no file writes."""
    probe = (
        "import os\ndef who():\n    return os.geteuid()\n"
        "def write():\n    open('/tmp/specdeploy-sandbox-probe', 'w').write('x')\n    return 1\n"
    )
    result = answers.run_function_tests(probe, [("who()", "0"), ("write()", "1")])
    assert "results" in result, result
    (uid_ok, uid), (wrote, detail) = result["results"]
    if os.geteuid() == 0:
        assert uid == str(answers.NOBODY)
    assert not wrote and ("Error" in detail or "error" in detail)
    assert not os.path.exists("/tmp/specdeploy-sandbox-probe")  # not even created: no descriptor to open it with


def test_a_profile_answer_of_kind_python_function_needs_its_name_and_tests() -> None:
    with pytest.raises(ValueError, match="needs `function`"):
        KnownAnswer(name="f", prompt="?", expect="python_function", function="f")
    with pytest.raises(ValueError, match="only for it"):
        KnownAnswer(name="f", prompt="?", expect="python", function="f")
    with pytest.raises(ValueError, match="must be a number"):
        KnownAnswer(name="n", prompt="?", expect="number", value="forty-two")
