"""Known answers: prompts whose answer a rule can check, and the checks.

Failure prevented: a gate judged only by the form of the text passes fluent word salad, one wrong
word, a wrong answer. A known answer is judged by what it says:

| expect | right when |
|---|---|
| contains | the answer contains `value` (case-insensitive) |
| number | the answer's final number (after `####` if there is one, as GSM8K writes it) equals `value` |
| json_object | the answer (inside a code fence, if any) holds a JSON object |
| python | the answer's code parses |
| python_function | the answer's code defines `function` and every test (`call` == `equals`) holds when run |

Code from a model is never run in this process: `python_function` screens it (only a few standard
modules, no dunder names, no open/exec/eval/getattr...), then runs it with the tests in a separate
`python3 -I -S` as an unprivileged user (nobody, when the gate runs as root), in an empty
environment, with limits on CPU time, memory, file size and wall time, and no file descriptor
beyond its standard streams. What is not right names the answer's first bytes and what was wrong,
never a traceback.
"""

from __future__ import annotations

import ast
import json
import os
import re
import shutil
import subprocess
import sys
from decimal import Decimal, InvalidOperation
from typing import Any

from specdeploy.core import files
from specdeploy.profile import KnownAnswer

RUN_TIMEOUT_S = 10.0
CPU_SECONDS = 5
MEMORY_BYTES = 512 * 2**20
NOBODY = 65534
# Modules the code of an answer may import; anything else (os, sys, socket, subprocess...) refuses it.
ALLOWED_MODULES = frozenset(
    {"math", "itertools", "functools", "collections", "re", "string", "operator", "heapq", "bisect", "statistics",
     "typing", "dataclasses", "fractions", "decimal"}
)  # fmt: skip
FORBIDDEN_CALLS = frozenset(
    {"open", "exec", "eval", "compile", "input", "globals", "locals", "vars", "getattr", "setattr", "delattr",
     "breakpoint", "help", "exit", "quit", "memoryview", "__import__"}
)  # fmt: skip
_NUMBER_RE = re.compile(r"-?\d[\d,]*(?:\.\d+)?")


def strip_fences(text: str) -> str:
    match = re.search(r"```[a-zA-Z0-9_+-]*\n(.*?)```", text, re.S)
    return match.group(1) if match else text.strip()


def final_number(text: str) -> Decimal | None:
    """The answer's final number: the first one after `####` where the text has it, else the last."""
    head, marker, tail = text.rpartition("####")
    found = _NUMBER_RE.findall(tail if marker else head or tail)
    if marker and found:
        found = found[:1]
    for raw in reversed(found):
        try:
            return Decimal(raw.replace(",", ""))
        except InvalidOperation:
            continue
    return None


def check_answer(answer: KnownAnswer, text: str) -> str | None:
    """None if the answer is right, else what is wrong with it."""
    shown = repr(text[:80])
    if answer.expect == "contains":
        return None if str(answer.value).lower() in text.lower() else f"expected {answer.value!r} in {shown}"
    if answer.expect == "number":
        found = final_number(text)
        want = Decimal(str(answer.value))
        if found is None:
            return f"expected the number {answer.value}, found no number in {shown}"
        return None if found == want else f"expected the number {answer.value}, found {found} in {shown}"
    body = strip_fences(text)
    if answer.expect == "json_object":
        start, end = body.find("{"), body.rfind("}")
        try:
            parsed = files.loads(body[start : end + 1]) if start >= 0 < end else None
        except files.JSONTextError as exc:  # the model's answer: a wrong answer, never a crash
            return f"not a JSON object ({exc.detail}): {shown}"
        return None if isinstance(parsed, dict) else f"no JSON object in {shown}"
    try:
        tree = ast.parse(body)
    except SyntaxError as exc:
        return f"code does not parse ({exc.msg}, line {exc.lineno}): {shown}"
    except (ValueError, RecursionError, MemoryError) as exc:  # null bytes, nesting past the parser's limits
        return f"code does not parse ({type(exc).__name__}): {shown}"
    if answer.expect == "python":
        return None
    return _check_function(answer, body, tree, shown)


# --------------------------------------------------------------------------- code that runs


def screen(tree: ast.AST) -> str | None:
    """Why the code of an answer may not run, or None: an import outside ALLOWED_MODULES, a dunder
    name or attribute, a call of FORBIDDEN_CALLS."""
    for node in ast.walk(tree):
        if isinstance(node, ast.Import | ast.ImportFrom):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else [node.module or ""]
            bad = [n for n in names if n.split(".")[0] not in ALLOWED_MODULES]
            if bad:
                return f"imports {bad[0]!r} (only {', '.join(sorted(ALLOWED_MODULES))} may be imported)"
        elif isinstance(node, ast.Attribute) and node.attr.startswith("__"):
            return f"uses the attribute {node.attr!r}"
        elif isinstance(node, ast.Name) and (node.id.startswith("__") or node.id in FORBIDDEN_CALLS):
            return f"uses {node.id!r}"
    return None


_RUNNER = r"""
import json, resource, sys
source, tests, limits, allowed = json.loads(sys.stdin.read())
for module in allowed:  # imported while files may still be opened: the answer's imports find them loaded
    __import__(module)
for name, value in limits.items():  # before any code of the answer runs
    resource.setrlimit(getattr(resource, name), (value, value))
results = []
scope = {}
try:
    exec(compile(source, "<answer>", "exec"), scope)
except BaseException as exc:
    print(json.dumps({"defined": False, "error": type(exc).__name__ + ": " + str(exc)[:200]}))
    raise SystemExit(0)
for call, equals in tests:
    try:
        got = eval(call, scope)
        want = eval(equals, {})
        results.append([got == want, repr(got)[:120]])
    except BaseException as exc:
        results.append([False, type(exc).__name__ + ": " + str(exc)[:120]])
print(json.dumps({"defined": True, "results": results}))
"""


def _interpreter() -> str:
    """A Python with only the standard library that an unprivileged user can run: the system's
    (hosts have it for Ansible), else this one."""
    return shutil.which("python3", path="/usr/bin:/bin") or sys.executable


# Set by the runner itself before the answer's code runs (no preexec_fn: the smoke has threads): no
# file can be opened (standard input, output and error are the only descriptors) or grown.
LIMITS = {
    "RLIMIT_CPU": CPU_SECONDS,
    "RLIMIT_AS": MEMORY_BYTES,
    "RLIMIT_FSIZE": 0,
    "RLIMIT_CORE": 0,
    "RLIMIT_NOFILE": 3,
}


def run_function_tests(source: str, tests: list[tuple[str, str]]) -> dict[str, Any]:
    """Run `source` and then each (call, equals) pair in a sandboxed child; its JSON result, or
    {"error": ...} when the child did not answer (a timeout, a limit hit, a crash)."""
    root = os.geteuid() == 0
    try:
        done = subprocess.run(
            [_interpreter(), "-I", "-S", "-c", _RUNNER],
            input=json.dumps([source, tests, LIMITS, sorted(ALLOWED_MODULES)]),
            capture_output=True,
            text=True,
            timeout=RUN_TIMEOUT_S,
            env={},
            cwd="/",
            start_new_session=True,
            user=NOBODY if root else None,
            group=NOBODY if root else None,
            extra_groups=[] if root else None,
        )
    except subprocess.TimeoutExpired:
        return {"error": f"did not finish in {RUN_TIMEOUT_S:g} s"}
    lines = done.stdout.strip().splitlines()
    try:
        return json.loads(lines[-1]) if lines else {"error": f"no result (exit {done.returncode})"}
    except ValueError:
        return {"error": f"no result (exit {done.returncode}): {lines[-1][:120]!r}"}


def _check_function(answer: KnownAnswer, body: str, tree: ast.Module, shown: str) -> str | None:
    defined = {n.name for n in tree.body if isinstance(n, ast.FunctionDef)}
    if answer.function not in defined:
        return f"expected a function {answer.function}(), found {sorted(defined) or 'none'} in {shown}"
    if problem := screen(tree):
        return f"the code {problem}: not run ({shown})"
    result = run_function_tests(body, [(t.call, t.equals) for t in answer.tests])
    if "error" in result:
        return f"the code did not run: {result['error']} ({shown})"
    for test, (ok, got) in zip(answer.tests, result["results"], strict=True):
        if not ok:
            return f"{test.call} gave {got}, expected {test.equals} ({shown})"
    return None
