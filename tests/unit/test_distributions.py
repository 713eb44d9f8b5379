"""The host package is the product (issue 37, item 2): every GPU host installed the whole package,
the rehearsal rig included (the hub, the gating proxy, the registry, the test hosts, the migration
rehearsal, CI's cache housekeeping: 14% of it). Now the repository builds two wheels: `specdeploy`,
which hosts install and which holds no rehearsal module, and `specdeploy-rehearsal` (packaging/rehearsal),
which holds exactly the rig and needs the host package at its own version. Both are built here for real
(pip wheel, as the wheelhouse builds the host's) and the host wheel is imported on its own."""

from __future__ import annotations

import ast
import json
import subprocess
import sys
import zipfile
from email.parser import Parser
from pathlib import Path

import pytest

import specdeploy

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "python" / "specdeploy"
RIG = ("specdeploy/rehearsal/", "specdeploy/cli/rehearsal.py")  # the rehearsal distribution's paths


def _rig(name: str) -> bool:
    return name.startswith(RIG[0]) or name == RIG[1]


@pytest.fixture(scope="module")
def wheels(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    out = tmp_path_factory.mktemp("wheels")
    for project in (ROOT, ROOT / "packaging" / "rehearsal"):
        done = subprocess.run(
            [sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation", "-w", str(out),
             str(project)],
            capture_output=True, text=True,
        )  # fmt: skip
        assert done.returncode == 0, done.stderr[-3000:]
    found = {w.name.split("-", 1)[0]: w for w in out.glob("*.whl")}
    assert set(found) == {"specdeploy", "specdeploy_rehearsal"}, found
    return found


def _modules() -> set[str]:
    return {
        p.relative_to(PACKAGE.parent).as_posix()
        for p in PACKAGE.rglob("*")
        if p.is_file() and "__pycache__" not in p.parts
    }


def _metadata(wheel: Path) -> dict[str, list[str]]:
    with zipfile.ZipFile(wheel) as z:
        text = z.read(next(n for n in z.namelist() if n.endswith(".dist-info/METADATA"))).decode()
    parsed = Parser().parsestr(text)
    return {key: parsed.get_all(key) or [] for key in ("Name", "Version", "Requires-Dist")}


def test_the_host_wheel_holds_every_module_of_the_package_but_no_rehearsal_module(wheels: dict[str, Path]) -> None:
    with zipfile.ZipFile(wheels["specdeploy"]) as z:
        names = {
            n
            for n in z.namelist()
            if n.startswith("specdeploy/") and not n.startswith(("specdeploy/profiles/", "specdeploy/locks/"))
        }
    assert not [n for n in names if _rig(n)], "the host wheel holds rehearsal modules"
    assert names == {m for m in _modules() if not _rig(m)}
    assert _metadata(wheels["specdeploy"])["Version"] == [specdeploy.__version__]


def test_the_rehearsal_wheel_holds_exactly_the_rig_and_needs_the_host_package_at_its_own_version(
    wheels: dict[str, Path],
) -> None:
    with zipfile.ZipFile(wheels["specdeploy_rehearsal"]) as z:
        names = {n for n in z.namelist() if not n.startswith("specdeploy_rehearsal-")}
    assert names == {m for m in _modules() if _rig(m)}
    meta = _metadata(wheels["specdeploy_rehearsal"])
    assert meta["Name"] == ["specdeploy-rehearsal"] and meta["Version"] == [specdeploy.__version__]
    assert meta["Requires-Dist"] == [f"specdeploy[controller,rehearsal]=={specdeploy.__version__}"]


def test_the_host_wheel_imports_and_runs_on_its_own_without_the_rehearsal_verb_group(
    wheels: dict[str, Path], tmp_path: Path
) -> None:
    """Every module of the host wheel, extracted alone (the checkout taken off the path), imports; its
    CLI lists every verb group but `rehearsal`."""
    with zipfile.ZipFile(wheels["specdeploy"]) as z:
        z.extractall(tmp_path)
    modules = sorted(
        p.relative_to(tmp_path).with_suffix("").as_posix().replace("/", ".").removesuffix(".__init__")
        for p in (tmp_path / "specdeploy").rglob("*.py")
        if p.name != "__main__.py"  # `python -m specdeploy`: importing it runs the CLI
    )
    script = f"""
import importlib, json, sys
sys.path = [{str(tmp_path)!r}] + [p for p in sys.path if not p.startswith({str(ROOT)!r})]
failed = {{}}
for name in {modules!r}:
    try:
        importlib.import_module(name)
    except Exception as exc:
        failed[name] = repr(exc)
import specdeploy
from specdeploy.cli.app import app
import typer.main
names = sorted(typer.main.get_command(app).commands)
print(json.dumps({{"failed": failed, "where": specdeploy.__file__, "commands": names,
                  "rig": importlib.util.find_spec("specdeploy.rehearsal") is not None}}))
"""
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    shown = json.loads(done.stdout.splitlines()[-1])
    assert shown["where"].startswith(str(tmp_path)) and shown["rig"] is False
    assert shown["failed"] == {}
    assert "rehearsal" not in shown["commands"] and {"gate", "migrate", "bench", "watch", "front"} <= set(
        shown["commands"]
    )


def test_no_host_module_imports_the_rehearsal_rig() -> None:
    """Lazily or not: an import inside a function would pass the import test above and fail on a host."""
    found = []
    for path in PACKAGE.rglob("*.py"):
        rel = path.relative_to(PACKAGE.parent).as_posix()
        if _rig(rel):
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            names = (
                [a.name for a in node.names] if isinstance(node, ast.Import)
                else [node.module or ""] if isinstance(node, ast.ImportFrom) else []
            )  # fmt: skip
            found += [
                f"{rel}:{node.lineno} {n}"
                for n in names
                if n == "specdeploy.rehearsal" or n.startswith("specdeploy.rehearsal.")
            ]
            if (
                isinstance(node, ast.ImportFrom)
                and node.module == "specdeploy"
                and any(a.name == "rehearsal" for a in node.names)
            ):
                found.append(f"{rel}:{node.lineno} from specdeploy import rehearsal")
            if (
                isinstance(node, ast.ImportFrom)
                and node.module == "specdeploy.cli"
                and any(a.name == "rehearsal" for a in node.names)
                and rel != "specdeploy/cli/app.py"  # its one guarded import (the test below)
            ):
                found.append(f"{rel}:{node.lineno} from specdeploy.cli import rehearsal")
    assert found == []


def test_the_cli_adds_the_rehearsal_verb_group_only_where_the_rig_is_installed() -> None:
    app = (PACKAGE / "cli" / "app.py").read_text()
    guarded = (
        'if importlib.util.find_spec("specdeploy.rehearsal") is not None:\n    from specdeploy.cli import rehearsal\n'
    )
    assert guarded in app
    assert app.count("from specdeploy.cli import rehearsal") == 1
