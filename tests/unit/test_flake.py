"""flake.nix and flake.lock, checked without evaluating (no binary cache is reachable here):
Debian's nix-bin parses the flake, the lock pins every input by rev and narHash (the
nixpkgs values are the ones published in numtide/treefmt-nix's flake.lock at commit
002612d0304eae829499ca9ba2c881ca06aa0611), and the smoke-test app runs the CLI's smoke."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def parsed() -> str:
    nix = shutil.which("nix-instantiate")
    if nix is None:
        pytest.skip("nix-instantiate missing: scripts/system-deps.sh installs nix-bin")
    done = subprocess.run([nix, "--parse", str(ROOT / "flake.nix")], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    return done.stdout


def test_flake_parses_and_has_every_output(parsed: str) -> None:
    for output in ("packages", "apps", "devShells", "checks"):
        assert re.search(rf"\b{output} = ", parsed), output
    assert "smoke-test = " in parsed and 'type = "app"' in parsed


def test_smoke_test_app_runs_the_clis_smoke(parsed: str) -> None:
    scripts = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"]
    assert scripts["specdeploy"] == "specdeploy.cli:main"
    # nix-instantiate --parse renders the script as: ("exec " + cli + "/bin/specdeploy smoke \"\$@\"\n")
    assert '("exec " + cli + "/bin/specdeploy smoke \\"\\$@\\"\\n")' in parsed, "smoke-test must exec the CLI's smoke"
    assert "cli = (self).packages" in parsed  # the app's binary is the flake's own package
    from specdeploy.cli import app

    assert "smoke" in {c.name or c.callback.__name__ for c in app.registered_commands}


def test_dev_shell_has_the_tools(parsed: str) -> None:
    for tool in ("ansible", "ansible-lint", "hadolint", "podman"):
        assert f"(pkgs).{tool}" in parsed, tool


def test_lock_pins_every_input_by_rev_and_nar_hash() -> None:
    lock = json.loads((ROOT / "flake.lock").read_text())
    root_inputs = lock["nodes"][lock["root"]]["inputs"]
    flake_inputs = re.findall(r"inputs\.(\w+)\.url", (ROOT / "flake.nix").read_text())
    assert set(root_inputs) == set(flake_inputs) == {"nixpkgs"}
    for name, node in root_inputs.items():
        locked = lock["nodes"][node]["locked"]
        assert re.fullmatch(r"[0-9a-f]{40}", locked["rev"]), name
        assert re.fullmatch(r"sha256-[A-Za-z0-9+/]{43}=", locked["narHash"]), name
    nixpkgs = lock["nodes"]["nixpkgs"]["locked"]
    assert (nixpkgs["rev"], nixpkgs["narHash"]) == (
        "cbb5cf358f50aa6acc9efd6113b7bcfbc352cd73",
        "sha256-IX7G1dlKrOqPOImfbo7ADDfV5yU1+j+MRChI3TL4tAA=",
    )


def test_the_nix_docs_name_each_flake_dependency_with_its_locked_version_and_the_nixpkgs_revision() -> None:
    """The flake builds from nixpkgs' versions, not locks/host-cli.txt (Nix cannot fetch here):
    the table in docs/locks-and-nix.md ("Nix") says so for every runtime dependency, with the lock's
    version of each and the flake.lock revision, and must change when a pin, a dependency or the
    revision does."""
    from specdeploy.core import envlock

    page = (ROOT / "docs" / "locks-and-nix.md").read_text()
    table = page.split("<!-- flake-versions:", 1)[1].split("<!-- /flake-versions -->", 1)[0]
    rows = re.findall(r"^\| (\S+) \| (\S+) \| nixpkgs', unverified \|$", table, flags=re.MULTILINE)
    runtime = re.search(r"runtimeDeps = ps: with ps; \[(.*?)\];", (ROOT / "flake.nix").read_text(), re.DOTALL)
    assert runtime
    in_flake = sorted(envlock.normalize(name) for name in runtime[1].split())
    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    assert in_flake == sorted(envlock.normalize(req.split("==")[0]) for req in pyproject)
    locked = envlock.read(envlock.ENVIRONMENTS["host-cli"])
    assert sorted(rows) == sorted((name, locked[name].version) for name in in_flake)
    rev = json.loads((ROOT / "flake.lock").read_text())["nodes"]["nixpkgs"]["locked"]["rev"]
    assert f"the flake (nixpkgs `{rev[:12]}`)" in table and f"nixpkgs revision `{rev[:12]}`" in page
