"""Two checkouts on one machine each test their own code (scripts/setup.sh, docs/locks-and-nix.md "Locks").

Two clones of this repository run setup.sh with the same cache: they share the heavy dependency
venv (built once from locks/dev.txt, reused here), and each gets its own `.venv` whose python
imports specdeploy from that clone, also after the other clone ran setup last, and whose bin
holds the programs the scripts call, running with that venv's python.

Prevents the shared editable install that pointed at whichever checkout ran setup last, so one
clone's tests ran the other's code. Needs no test host; on a warm cache it takes seconds.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PROGRAMS = ("ruff", "ansible-playbook", "ansible-vault", "ansible-lint", "hadolint", "specdeploy", "vllm", "pip")


def _setup(clone: Path) -> Path:
    env = {**os.environ, "SPECDEPLOY_CACHE": os.environ.get("SPECDEPLOY_CACHE", str(Path.home() / ".cache/specdeploy"))}
    done = subprocess.run(["bash", str(clone / "scripts" / "setup.sh")], capture_output=True, text=True, env=env)
    assert done.returncode == 0, done.stderr[-3000:]
    return Path(done.stdout.strip().splitlines()[-1])


def _imports_from(venv: Path) -> tuple[str, str]:
    done = subprocess.run(
        [str(venv / "bin" / "python"), "-c", "import specdeploy, sys; print(specdeploy.__file__); print(sys.prefix)"],
        capture_output=True, text=True, check=True, cwd="/",
    )  # fmt: skip
    module, prefix = done.stdout.split()
    return module, prefix


def _clone(dest: Path) -> Path:
    subprocess.run(["git", "clone", "--quiet", "--no-hardlinks", str(ROOT), str(dest)], check=True)
    # The working tree's setup (this test may run before it is committed): the clone gets it too.
    for name in ("scripts/setup.sh", "python/specdeploy/core/envlock.py", "pyproject.toml", "locks/dev.txt"):
        (dest / name).write_bytes((ROOT / name).read_bytes())
    return dest


def test_two_clones_each_import_their_own_code_whichever_ran_setup_last(tmp_path: Path) -> None:
    first, second = _clone(tmp_path / "first"), _clone(tmp_path / "second")
    venv_first = _setup(first)
    venv_second = _setup(second)
    assert venv_first == first / ".venv" and venv_second == second / ".venv"
    shared = {(v / ".specdeploy-shared").read_text() for v in (venv_first, venv_second)}
    assert len(shared) == 1, f"the clones built two dependency venvs: {shared}"

    for clone, venv in ((first, venv_first), (second, venv_second)):
        module, prefix = _imports_from(venv)
        assert Path(module) == clone / "python" / "specdeploy" / "__init__.py"
        assert Path(prefix) == venv
    _setup(first)  # the first clone ran setup last: the second still tests its own code
    assert Path(_imports_from(venv_second)[0]) == second / "python" / "specdeploy" / "__init__.py"

    for program in PROGRAMS:
        path = venv_second / "bin" / program
        assert os.access(path, os.X_OK), f"{path} is missing: the scripts call {program} from the venv's bin"
        head = path.read_bytes()[:200]
        if head.startswith(b"#!"):
            assert head.split(b"\n")[0].decode()[2:].startswith(str(venv_second / "bin" / "python")), (
                f"{program} runs with another venv's python: sys.executable would name that venv"
            )
    # ansible-playbook's python finds specdeploy beside it (the role's specdeploy_controller_cli).
    where = subprocess.run(
        [str(venv_second / "bin" / "python"), "-c", "import ansible, sys; print(sys.executable)"],
        capture_output=True, text=True, check=True,
    ).stdout.strip()  # fmt: skip
    assert (Path(where).parent / "specdeploy").is_file()
    ran = subprocess.run([str(venv_second / "bin" / "specdeploy"), "--help"], capture_output=True, text=True)
    assert ran.returncode == 0, ran.stderr
