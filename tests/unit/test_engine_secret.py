"""The engine's API key on a host (GPU-host blocker 4), with a canary key and the real podman
of this machine: a root-only file, a podman secret created from standard input, the same key
read back for the gate and the rollback's proof, and clear refusals."""

from __future__ import annotations

import base64
import os
import secrets
import shutil
import subprocess
import threading
from pathlib import Path

import pytest

from specdeploy.core import layout
from specdeploy.engine import secret
from specdeploy.profile import load_profile
from specdeploy.rehearsal import variants


def _profile(name: str) -> object:
    base = load_profile("a6000-mtp")  # a container engine that serves with a key
    return variants.derive(base, "a6000-mtp-secret-test", {"engine": {"serve": {"api_key": {"secret": name}}}})


@pytest.fixture
def secret_name() -> object:
    if shutil.which("podman") is None:
        pytest.skip("podman is installed by scripts/system-deps.sh")
    name = f"specdeploy_test_{secrets.token_hex(4)}"
    yield name
    subprocess.run(["podman", "secret", "rm", name], capture_output=True)


def _podman_secret(name: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["podman", "secret", "inspect", name], capture_output=True, text=True)


def test_the_key_is_a_root_only_file_and_a_podman_secret_and_never_on_a_command_line(
    tmp_path: Path, secret_name: str
) -> None:
    host = layout.HostLayout(state=tmp_path / "state")
    canary = "sk-" + secrets.token_hex(24)
    profile = _profile(secret_name)
    seen: list[bytes] = []
    done = threading.Event()

    def watch() -> None:  # every process's command line, while podman runs
        while not done.is_set():
            for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
                try:
                    data = cmdline.read_bytes()
                except OSError:
                    continue
                if canary.encode() in data:
                    seen.append(data)

    watcher = threading.Thread(target=watch)
    watcher.start()
    try:
        first = secret.install(profile, host, canary + "\n")
    finally:
        done.set()
        watcher.join()
    assert seen == []
    path = host.secret_file(secret_name)
    assert (first.changed, first.podman) == (True, "created")
    assert path.read_text() == canary
    assert (path.stat().st_mode & 0o777, path.parent.stat().st_mode & 0o777) == (0o600, 0o700)
    assert _podman_secret(secret_name).returncode == 0
    assert canary not in _podman_secret(secret_name).stdout
    # podman's own copy (its file driver) is not readable by others either
    graph = subprocess.run(["podman", "info", "--format", "{{.Store.GraphRoot}}"], capture_output=True, text=True)
    store = Path(graph.stdout.strip()) / "secrets" / "filedriver" / "secretsdata.json"
    assert base64.b64encode(canary.encode()) in store.read_bytes() and store.stat().st_mode & 0o077 == 0
    # the same key again changes nothing; a rotated key replaces the file and the podman secret
    assert secret.install(profile, host, canary).changed is False
    rotated = secret.install(profile, host, canary[::-1])
    assert (rotated.changed, rotated.podman) == (True, "created") and path.read_text() == canary[::-1]
    # what the gate and the rollback's proof send
    os.environ.pop("SPECDEPLOY_API_KEY", None)
    assert secret.read(profile, host) == canary[::-1]


def test_a_missing_or_short_key_is_refused_before_anything_is_written(tmp_path: Path) -> None:
    host = layout.HostLayout(state=tmp_path / "state")
    profile = _profile("specdeploy_api_key")
    with pytest.raises(secret.SecretError, match="expected at least 16 characters, found 0") as info:
        secret.install(profile, host, "\n")
    assert "engine_api_key" in (info.value.hint or "")
    assert not host.secrets.exists()
    with pytest.raises(secret.SecretError, match="found other characters"):
        secret.install(profile, host, "a'quoted\\key-0123456789")  # repr would escape it past the mask
    assert not host.secrets.exists()
    with pytest.raises(secret.SecretError, match="cannot be read") as unread:
        secret.read(profile, host)
    assert "401" in unread.value.message
    assert secret.read(load_profile("cpu-rehearsal"), host) is None  # no key in the profile, none sent


def test_a_key_rotated_by_a_failed_run_is_put_back_by_its_rollback_podman_secret_included(
    tmp_path: Path, secret_name: str
) -> None:
    """Issue 35: a deploy that rotates the key and then fails its gate must leave the previous stack
    serving with the key its clients have. The run keeps the old key file (its keeper); the rollback
    puts it back and makes the podman secret from it again before the engine restarts (systemctl is
    a recorder here; podman and the files are real)."""
    from specdeploy.core.keeper import Keeper
    from specdeploy.rollback import restore

    host = layout.HostLayout(state=tmp_path / "state")
    profile = _profile(secret_name)
    old, new = "sk-" + secrets.token_hex(24), "sk-" + secrets.token_hex(24)
    secret.install(profile, host, old)
    rotated = secret.install(profile, host, new, keeper=Keeper(host.rollback, "run-rotate"))
    path = host.secret_file(secret_name)
    assert rotated.changed and path.read_text() == new
    graph = subprocess.run(["podman", "info", "--format", "{{.Store.GraphRoot}}"], capture_output=True, text=True)
    store = Path(graph.stdout.strip()) / "secrets" / "filedriver" / "secretsdata.json"
    assert base64.b64encode(new.encode()) in store.read_bytes()
    calls: list[list[str]] = []
    done = restore.restore(host.rollback, "run-rotate", unit="specdeploy-engine", run=calls.append,
                           unit_files=(tmp_path / "no-unit",), secrets=host.secrets)  # fmt: skip
    assert done.restored == [str(path)] and path.read_text() == old
    assert path.stat().st_mode & 0o777 == 0o600
    data = store.read_bytes()
    assert base64.b64encode(old.encode()) in data and base64.b64encode(new.encode()) not in data
    copies = list((host.rollback / "copies").glob("*")) if (host.rollback / "copies").exists() else []
    assert all(c.stat().st_mode & 0o077 == 0 for c in copies)  # a kept key is root's alone too


def test_the_light_gate_reads_the_key_from_the_copy_its_service_names(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The light gate's service runs as its own account, which cannot read the root-only key file:
    systemd copies it for one run into the run's own directory and $SPECDEPLOY_KEY_FILE names the copy
    (watch/units.py), read before the host's file; without it the host's file is read as before."""
    profile = _profile("specdeploy_api_key")
    host = layout.HostLayout(state=tmp_path / "state")
    copy = tmp_path / "run" / "specdeploy_api_key"
    copy.parent.mkdir()
    copy.write_text("handed-over-key-0123456789\n")
    monkeypatch.delenv("SPECDEPLOY_API_KEY", raising=False)
    monkeypatch.setenv("SPECDEPLOY_KEY_FILE", str(copy))
    assert secret.read(profile, host) == "handed-over-key-0123456789"  # no key file on this "host" at all
    copy.unlink()  # named but gone: said, naming the copy, never the host's file silently instead
    with pytest.raises(secret.SecretError, match=f"{copy} cannot be read"):
        secret.read(profile, host)
    monkeypatch.delenv("SPECDEPLOY_KEY_FILE")
    with pytest.raises(secret.SecretError, match="secrets/specdeploy_api_key cannot be read"):
        secret.read(profile, host)
