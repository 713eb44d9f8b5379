"""The repository's shape: the package reads as the pipeline (imports run one way, down the
stages, with no cycle), each host fact is defined once, test-only code stays in tests/, and
nothing refers to files outside the repository."""

from __future__ import annotations

import ast
import re
import subprocess
from pathlib import Path

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


def test_no_test_imports_from_conftest_or_another_test_module() -> None:
    offenders = []
    for path in (ROOT / "tests").rglob("*.py"):
        for match in re.finditer(r"from tests\.(conftest|unit|integration)\b", path.read_text()):
            offenders.append(f"{path.relative_to(ROOT)}: {match.group(0)}")
    assert offenders == []


def test_no_two_test_modules_share_a_file_name() -> None:
    """pytest imports test modules by their bare name (the test folders are not packages): a second
    `test_bench.py` in another folder stops the collection of one of them (`import file mismatch`,
    CI 2026-12-05)."""
    seen: dict[str, list[str]] = {}
    for path in (ROOT / "tests").rglob("test_*.py"):
        seen.setdefault(path.name, []).append(str(path.relative_to(ROOT)))
    assert {name: paths for name, paths in seen.items() if len(paths) > 1} == {}


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
