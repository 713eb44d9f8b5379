"""`specdeploy engine venv`: an engine archive becomes its own venv, complete or absent, once
per archive; a new archive gets a new venv beside the old one (real venvs, real pip, a real
wheel built here)."""

from __future__ import annotations

import hashlib
import io
import json
import subprocess
import sys
import tarfile
from pathlib import Path
from typing import Any

import pytest

from specdeploy.engine import venv


def _wheel(tmp_path: Path, version: str) -> Path:
    """A real wheel of a one-module package `tinyengine` at `version`."""
    src = tmp_path / f"src-{version}"
    (src / "tinyengine").mkdir(parents=True)
    (src / "tinyengine" / "__init__.py").write_text(f"VERSION = {version!r}\n")
    (src / "pyproject.toml").write_text(
        '[build-system]\nrequires = ["hatchling"]\nbuild-backend = "hatchling.build"\n'
        f'[project]\nname = "tinyengine"\nversion = "{version}"\n'
    )
    out = tmp_path / f"dist-{version}"
    argv = [sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation", "-w", str(out), str(src)]
    subprocess.run(argv, check=True, capture_output=True)
    (wheel,) = out.glob("*.whl")
    return wheel


def _archive(tmp_path: Path, version: str, *, lock: bool = True) -> Path:
    wheel = _wheel(tmp_path, version)
    path = tmp_path / f"tinyengine-{version}.tar"
    with tarfile.open(path, "w") as tar:
        tar.add(wheel, arcname=wheel.name)
        if lock:
            data = f"tinyengine=={version} --hash=sha256:{hashlib.sha256(wheel.read_bytes()).hexdigest()}\n".encode()
            info = tarfile.TarInfo("requirements.lock")
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return path


def _engine_version(python: Path) -> str:
    return subprocess.run(
        [str(python), "-c", "import tinyengine; print(tinyengine.VERSION)"], capture_output=True, text=True, check=True
    ).stdout.strip()


def test_an_archive_becomes_one_complete_venv_once_and_a_new_one_goes_beside_it(tmp_path: Path, cli: Any) -> None:
    root = tmp_path / "engines"
    first = json.loads(cli("engine", "venv", "--archive", _archive(tmp_path, "1.0"), "--root", root,
                           "--name", "tinyengine-1.0").stdout)  # fmt: skip
    assert first["changed"] is True and _engine_version(Path(first["python"])) == "1.0"
    again = venv.install(tmp_path / "tinyengine-1.0.tar", root, "tinyengine-1.0")
    assert again.changed is False and str(again.path) == first["venv"]

    other = venv.install(_archive(tmp_path, "2.0"), root, "tinyengine-2.0")
    assert other.changed and _engine_version(other.python) == "2.0"
    # the previous engine's venv is untouched beside it: a rollback's unit still runs it
    assert _engine_version(Path(first["python"])) == "1.0"
    assert sorted(p.name for p in root.iterdir() if not p.name.startswith(".")) == sorted(
        [Path(first["venv"]).name, other.path.name]
    )


def test_an_install_that_died_half_way_is_rebuilt(tmp_path: Path) -> None:
    archive = _archive(tmp_path, "1.0")
    done = venv.install(archive, tmp_path / "engines", "tinyengine-1.0")
    (done.path / venv.COMPLETE).unlink()  # what a killed install leaves: no completion mark
    (done.path / "bin" / "python").unlink()
    again = venv.install(archive, tmp_path / "engines", "tinyengine-1.0")
    assert again.changed and _engine_version(again.python) == "1.0"


def test_a_bad_archive_is_refused_and_leaves_nothing(tmp_path: Path, cli: Any) -> None:
    root = tmp_path / "engines"
    no_lock = cli("engine", "venv", "--archive", _archive(tmp_path, "1.0", lock=False), "--root", root,
                  "--name", "x")  # fmt: skip
    assert no_lock.exit_code == 2 and "has no requirements.lock" in no_lock.stderr  # bad input (was 1)
    missing = cli("engine", "venv", "--archive", tmp_path / "none.tar", "--root", root, "--name", "x")
    assert missing.exit_code == 2 and "wheelhouse.sh DIR --engine" in missing.stderr
    evil = tmp_path / "evil.tar"
    with tarfile.open(evil, "w") as tar:
        info = tarfile.TarInfo("../escape.txt")
        tar.addfile(info, io.BytesIO(b""))
    with pytest.raises(venv.EngineVenvError, match="refusing member '../escape.txt'"):
        venv.install(evil, root, "x")
    assert not (tmp_path / "escape.txt").exists()
    assert not root.exists()  # refused before anything under --root was created


def test_a_wheel_changed_by_one_byte_stops_the_engine_install_with_a_hash_error(tmp_path: Path) -> None:
    """The archive's requirements.lock carries each wheel's sha256 and the venv is built with
    --require-hashes: a flipped byte in a wheel is refused and nothing is left behind."""
    good = _archive(tmp_path, "1.0")
    tampered = tmp_path / "tampered.tar"
    with tarfile.open(good) as src, tarfile.open(tampered, "w") as out:
        for member in src.getmembers():
            data = bytearray(src.extractfile(member).read())  # type: ignore[union-attr]
            if member.name.endswith(".whl"):
                data[len(data) // 2] ^= 0x01
            out.addfile(member, io.BytesIO(bytes(data)))
    root = tmp_path / "engines"
    with pytest.raises(venv.EngineVenvError) as refused:
        venv.install(tampered, root, "tinyengine-1.0")
    assert "the bytes of tinyengine==1.0 differ from the sha256 its requirements.lock names" in str(refused.value)
    assert "fix: copy the archive again" in str(refused.value)
    assert list(root.glob("tinyengine-1.0-*")) == []
