"""The repository's shape: the package reads as the pipeline (imports run one way, down the
stages, with no cycle), each host fact is defined once, test-only code stays in tests/, and
nothing refers to files outside the repository.

A dependency need not be an import: a module that spells the name of a file another stage
writes (the gate's `gate.json`), or copies another module's check (the lock's files entry),
depends on it as surely, and the import graph cannot see it (issue 37: weights/store.py and
migrate/steps.py spelled the gate report's name; weights/fetch.py and weights/store.py each
checked the lock's entry). Such facts have one home each (`FILE_FACTS`, `ONE_DEFINITION`), and
each checker is shown to catch its bad pair on a scratch file as well as to pass on the repository."""

from __future__ import annotations

import ast
import re
import subprocess
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "python" / "specdeploy"
# The pipeline, lowest first: a stage may import its own modules and any stage before it.
STAGES = (
    "core",
    "profile",
    "host",
    "images",
    "weights",
    "drafter",
    "engine",
    "smoke",
    "rollback",
    "gate",
    "watch",
    "front",
    "migrate",
    "bench",
    "rehearsal",
    "cli",
)


def _module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _modules() -> dict[str, Path]:
    return {_module_name(p): p for p in PACKAGE.rglob("*.py")}


def _imports(path: Path, modules: dict[str, Path]) -> set[str]:
    """specdeploy modules `path` imports, anywhere in it (function-level imports included);
    `from pkg import sub` counts as importing the submodule when `sub` is one."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names if a.name.startswith("specdeploy")}
        elif isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("specdeploy"):
            for alias in node.names:
                sub = f"{node.module}.{alias.name}"
                found.add(sub if sub in modules else node.module)
    return found & set(modules)


def _graph() -> dict[str, set[str]]:
    modules = _modules()
    return {name: _imports(path, modules) for name, path in modules.items()}


def _stage(module: str) -> int | None:
    parts = module.split(".")
    return STAGES.index(parts[1]) if len(parts) > 1 and parts[1] in STAGES else None


def test_every_module_belongs_to_a_stage_folder() -> None:
    loose = sorted(m for m in _modules() if _stage(m) is None and m not in ("specdeploy", "specdeploy.__main__"))
    assert loose == [], f"modules outside the stage folders {STAGES}: {loose}"
    for stage in STAGES:
        doc = ast.get_docstring(ast.parse((PACKAGE / stage / "__init__.py").read_text()))
        assert doc and len(doc) > 40, f"{stage}/__init__.py needs a docstring saying its stage's job"


def test_imports_run_down_the_pipeline() -> None:
    upward = []
    for module, imported in _graph().items():
        here = _stage(module)
        for other in imported:
            there = _stage(other)
            if here is not None and there is not None and there > here:
                upward.append(f"{module} ({STAGES[here]}) imports {other} ({STAGES[there]})")
    assert upward == [], "a lower stage imports a higher one:\n" + "\n".join(sorted(upward))


def test_the_import_graph_has_no_cycle() -> None:
    graph = _graph()
    state: dict[str, int] = {}
    cycles: list[list[str]] = []

    def visit(node: str, path: list[str]) -> None:
        state[node] = 1
        for nxt in sorted(graph[node]):
            if state.get(nxt) == 1:
                cycles.append([*path[path.index(nxt) :], nxt] if nxt in path else [node, nxt])
            elif nxt not in state:
                visit(nxt, [*path, nxt])
        state[node] = 2

    for node in sorted(graph):
        if node not in state:
            visit(node, [node])
    assert cycles == [], "import cycles: " + "; ".join(" -> ".join(c) for c in cycles)


def test_imports_are_absolute() -> None:
    """The graph reads `specdeploy.` imports; a relative import would slip past it."""
    relative = [
        f"{path.relative_to(ROOT)}:{node.lineno}"
        for path in PACKAGE.rglob("*.py")
        for node in ast.walk(ast.parse(path.read_text()))
        if isinstance(node, ast.ImportFrom) and node.level > 0
    ]
    assert relative == []


def test_the_graph_check_catches_an_upward_import(tmp_path: Path) -> None:
    """The checker itself: an engine module importing the gate is found."""
    bad = tmp_path / "bad.py"
    bad.write_text("def f():\n    import specdeploy.gate.run\n    from specdeploy.rollback import restore\n")
    assert _imports(bad, _modules()) == {"specdeploy.gate.run", "specdeploy.rollback.restore"}
    assert _stage("specdeploy.engine.units") < _stage("specdeploy.gate.run")


def _python_sources() -> str:
    return "\n".join(p.read_text() for p in PACKAGE.rglob("*.py"))


def test_host_names_and_paths_are_written_once_in_python() -> None:
    text = _python_sources()
    for fact in ('"specdeploy-engine"', '"/var/lib/specdeploy"', '"/opt/specdeploy"', '"/etc/systemd/system"'):
        assert text.count(fact) == 1, f"{fact} occurs {text.count(fact)} times in python/: define it once (core.layout)"
    assert "specdeploy-profile-file" in (PACKAGE / "core" / "layout.py").read_text()
    assert text.count("specdeploy-profile-file") == 1


def test_no_role_default_repeats_a_host_path_or_the_unit_name() -> None:
    for defaults in (ROOT / "ansible" / "roles").glob("*/defaults/main.yml"):
        values = yaml.safe_load(defaults.read_text()) or {}
        text = " ".join(str(v) for v in values.values())
        for fact in ("/var/lib/specdeploy", "/opt/specdeploy", "specdeploy-engine", "/etc/systemd", "/etc/containers"):
            assert fact not in text, f"{defaults.relative_to(ROOT)} repeats {fact}: read it from specdeploy_facts"


def test_known_bad_versions_are_matched_in_one_place() -> None:
    text = _python_sources()
    assert text.count("SpecifierSet(") == 2  # the schema's validation and KnownBad.matches
    assert "SpecifierSet(self.version_spec, prereleases=True)" in (PACKAGE / "profile" / "schema.py").read_text()


def test_test_only_code_is_not_in_the_package() -> None:
    text = _python_sources()
    for name in ("class Simulation", "def exec_argv", "def engine_version", 'kind = "vllm"', "dry_run: bool\n"):
        assert name not in text, name


# A test module imports shared code from tests/support/ only: `from tests.X` or `import tests.X` for
# any other X (a conftest, a folder of test modules, a test module) is refused (issue 37:
# tests/badinput/test_records.py imported four test modules, which the old pattern missed).
TEST_IMPORT = re.compile(r"^[ \t]*(from|import)[ \t]+tests\.(?!support\b)\w+", re.M)


def _test_imports(root: Path) -> list[str]:
    return [
        f"{path.relative_to(root)}: {match.group(0).strip()}"
        for path in sorted(root.rglob("*.py"))
        for match in TEST_IMPORT.finditer(path.read_text())
    ]


def test_no_test_imports_from_conftest_or_another_test_module() -> None:
    assert _test_imports(ROOT / "tests") == []


def test_the_test_import_check_catches_each_way_of_importing_a_test_module(tmp_path: Path) -> None:
    bad = {
        "from tests.badinput.conftest import Run": True,
        "from tests.badinput.test_drafter_config import download": True,
        "import tests.unit.test_cli": True,
        "    from tests.integration import test_fetch": True,
        "from tests.conftest import ROOT": True,
        "from tests.support.badinput import Run": False,
        "import tests.support.stub": False,
        "from tests.supporting import x": True,
    }
    for n, (line, refused) in enumerate(bad.items()):
        (tmp_path / f"case_{n}.py").write_text(f"{line}\n")
        assert bool(_test_imports(tmp_path)) == refused, line
        (tmp_path / f"case_{n}.py").unlink()


def _shared_test_names(tests: Path) -> dict[str, list[str]]:
    seen: dict[str, list[str]] = {}
    for path in sorted(tests.rglob("test_*.py")):
        seen.setdefault(path.name, []).append(str(path.relative_to(tests)))
    return {name: paths for name, paths in seen.items() if len(paths) > 1}


def test_no_two_test_modules_share_a_file_name(tmp_path: Path) -> None:
    """pytest imports test modules by their bare name (the test folders are not packages): a second
    `test_bench.py` in another folder stops the collection of one of them (`import file mismatch`,
    CI 2026-12-05)."""
    for folder in ("unit", "integration"):
        (tmp_path / folder).mkdir()
        (tmp_path / folder / "test_bench.py").write_text("")
    assert _shared_test_names(tmp_path) == {"test_bench.py": ["integration/test_bench.py", "unit/test_bench.py"]}
    assert _shared_test_names(ROOT / "tests") == {}


def _tracked() -> list[str]:
    return subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True, check=True).stdout.split()


def test_nothing_refers_to_files_outside_the_repository() -> None:
    """The workshop beside the checkout is not part of the project: code, profiles, docs and
    tests cite docs/sources.md and tests/data instead (CI's own scripts in .ci/ excepted)."""
    this = Path(__file__).relative_to(ROOT).as_posix()
    pattern = re.compile(r"\.\./shared|shared/(FACTS|fixtures|recorded|DESIGN)|FACTS|\"shared\"")
    offenders = []
    for name in _tracked():
        if name.startswith(".ci/") or name == this:
            continue
        path = ROOT / name
        if not path.is_file():
            continue
        try:
            text = path.read_text()
        except UnicodeDecodeError:
            continue
        offenders += [
            f"{name}:{n}: {line.strip()[:100]}" for n, line in enumerate(text.splitlines(), 1) if pattern.search(line)
        ]
    assert offenders == [], "\n".join(offenders)


def test_every_sources_anchor_cited_in_the_repository_exists() -> None:
    sources = (ROOT / "docs" / "sources.md").read_text()
    anchors = {
        re.sub(r"[^a-z0-9 -]", "", h.lower()).strip().replace(" ", "-") for h in re.findall(r"^#+ (.+)$", sources, re.M)
    }
    cited = set()
    for name in _tracked():
        path = ROOT / name
        if path.is_file() and path.suffix in (".py", ".yaml", ".yml", ".md", ".sh", ".toml"):
            cited |= set(re.findall(r"docs/sources\.md#([a-z0-9-]+)", path.read_text()))
    assert cited, "nothing cites docs/sources.md"
    assert cited <= anchors, f"cited anchors missing from docs/sources.md: {sorted(cited - anchors)}"


def test_every_test_cited_as_a_source_exists() -> None:
    """docs/sources.md cites measured facts as `tests/...py::test_name` (and `::other` for more
    tests of the same file): each must still exist."""
    cited = set()
    for line in (ROOT / "docs" / "sources.md").read_text().splitlines():
        path = None
        for match in re.finditer(r"(tests/[\w/]+\.py)::(\w+)|`::(\w+)`", line):
            path = match.group(1) or path
            if path:
                cited.add((path, match.group(2) or match.group(3)))
    missing = [f"{path}::{name}" for path, name in sorted(cited) if f"def {name}(" not in (ROOT / path).read_text()]
    assert len(cited) > 20 and missing == [], missing


# --------------------------------------------------------------------------- facts with one home

# A file name or lock key one stage writes and others read, by its spelling in code (docstrings
# aside): only its home spells it, every other module asks the home for it.
FILE_FACTS = {
    "the gate report's file name (layout.GATE_REPORT, HostLayout.gate_report)": (
        re.compile(r"(^|/)gate\.json($|/)"),
        "core/layout.py",
    ),
    "a revision's files entry in the lock (profile.lock.files_key)": (re.compile(r"\.files@"), "profile/lock.py"),
}
# Modules another change is rewriting now (issue 37's bench work), each with the fact it still spells
# and what it should ask instead; the test fails once one no longer spells it (remove the entry then).
PENDING: dict[str, str] = {}  # modules allowed to spell a fact for now (none)
# Checks and primitives defined once: a second `def` of one of these names is a copy.
ONE_DEFINITION = {
    "files_key": "profile/lock.py",
    "files_entry_fault": "profile/lock.py",
    "recorded_files": "profile/lock.py",
    "kind_of": "core/files.py",
    "regular_file": "core/files.py",
    "directory": "core/files.py",
    "sha256_file": "core/files.py",
    "new_run_id": "core/keeper.py",
    "check_run_id": "core/keeper.py",
}


def _code_strings(path: Path) -> list[tuple[int, str]]:
    """(line, text) of each string in `path`'s code: docstrings left out, the literal parts of
    f-strings in."""
    tree = ast.parse(path.read_text())
    docstrings = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef) and node.body:
            first = node.body[0]
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant):
                docstrings.add(id(first.value))
    return [
        (node.lineno, node.value)
        for node in ast.walk(tree)
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docstrings
    ]


def _spelled_outside(root: Path, pattern: re.Pattern[str], home: str) -> list[str]:
    return [
        f"{path.relative_to(root).as_posix()}:{line}"
        for path in sorted(root.rglob("*.py"))
        if path.relative_to(root).as_posix() != home
        for line, text in _code_strings(path)
        if pattern.search(text)
    ]


def _defined_outside(root: Path) -> list[str]:
    found = []
    for path in sorted(root.rglob("*.py")):
        where = path.relative_to(root).as_posix()
        for node in ast.walk(ast.parse(path.read_text())):
            if (
                isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef)
                and ONE_DEFINITION.get(node.name, where) != where
            ):
                found.append(f"{where}:{node.lineno}: def {node.name} (defined in {ONE_DEFINITION[node.name]})")
    return found


@pytest.mark.parametrize("fact", sorted(FILE_FACTS))
def test_a_file_another_stage_writes_is_named_by_its_home_only(fact: str) -> None:
    pattern, home = FILE_FACTS[fact]
    assert (PACKAGE / home).is_file()
    found = _spelled_outside(PACKAGE, pattern, home)
    pending = {where.split(":")[0] for where in found} & set(PENDING)
    assert [w for w in found if w.split(":")[0] not in pending] == [], f"{fact} spelled outside {home}"
    if "gate" in fact:  # an entry that no longer applies goes
        assert pending == set(PENDING), f"PENDING lists modules that no longer spell it: {set(PENDING) - pending}"


def test_each_check_and_file_primitive_is_defined_once() -> None:
    for name, home in ONE_DEFINITION.items():
        assert any(
            isinstance(n, ast.FunctionDef) and n.name == name for n in ast.walk(ast.parse((PACKAGE / home).read_text()))
        ), f"{name} is not in {home}"
    assert _defined_outside(PACKAGE) == []


def test_the_fact_checks_catch_a_spelled_file_name_and_a_copied_check(tmp_path: Path) -> None:
    """The checkers themselves, on a scratch package: a lower stage building the gate report's
    path by its name, and a second copy of the lock-entry check, are each found; a docstring
    naming the file, the home itself and a message about "a gate.json" are not."""
    gate, home = FILE_FACTS["the gate report's file name (layout.GATE_REPORT, HostLayout.gate_report)"]
    files_entry, lock_home = FILE_FACTS["a revision's files entry in the lock (profile.lock.files_key)"]
    (tmp_path / "core").mkdir()
    (tmp_path / "weights").mkdir()
    (tmp_path / "profile").mkdir()
    (tmp_path / "core" / "layout.py").write_text('GATE_REPORT = "gate.json"\n')
    (tmp_path / "profile" / "lock.py").write_text(
        'def files_key(role, rev):\n    return f"{role}.files@{rev}"\ndef recorded_files(lock):\n    return None\n'
    )
    store = tmp_path / "weights" / "store.py"
    store.write_text(
        '"""Prunes what no <state>/runs/<run-id>/gate.json names."""\n'
        'HINT = "expected a gate.json (an object)"\n'
        "def reports(runs):\n"
        '    return [run / "gate.json" for run in runs] + [f"{runs}/{1}/gate.json"]\n'
    )
    assert _spelled_outside(tmp_path, gate, home) == ["weights/store.py:4", "weights/store.py:4"]
    assert _spelled_outside(tmp_path, files_entry, lock_home) == []
    store.write_text(
        "def lock_key(role, rev):\n"
        '    return f"{role}.files@{rev}"\n'
        "def recorded_files(lock, profile, role, rev):\n"
        "    return lock.value(profile, lock_key(role, rev))\n"
        "def sha256_file(path):\n"
        "    return None\n"
    )
    assert _spelled_outside(tmp_path, files_entry, lock_home) == ["weights/store.py:2"]
    assert [w.split(" (")[0] for w in _defined_outside(tmp_path)] == [
        "weights/store.py:3: def recorded_files",
        "weights/store.py:5: def sha256_file",
    ]


def _names_every_stage(text: str) -> list[str]:
    return [stage for stage in STAGES if not re.search(rf"\b{stage}\b", text)]


@pytest.mark.parametrize("module", ["__init__.py", "cli/__init__.py"])
def test_the_package_and_cli_docstrings_name_every_stage(module: str) -> None:
    doc = ast.get_docstring(ast.parse((PACKAGE / module).read_text())) or ""
    assert _names_every_stage(doc) == [], f"specdeploy/{module}'s docstring leaves out these stages"
    assert _names_every_stage("core profile host images weights drafter engine smoke rollback gate rehearsal cli") == [
        "watch",
        "front",
        "migrate",
        "bench",
    ]
