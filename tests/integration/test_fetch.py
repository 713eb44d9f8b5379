"""`specdeploy fetch` with the real huggingface_hub client against a real hub-compatible
server (olah) serving fixture git repos, plus a small stub for the one thing olah cannot
do: refuse a gated repo (HTTP 403 with `X-Error-Code: GatedRepo`, the hub's own shape).

Not testable here: resuming a partial download (olah ignores Range requests,
docs/sources.md#olah); huggingface_hub's resume path is exercised on real hosts only.
"""

from __future__ import annotations

import hashlib
import json
import os
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
from tests.support.hub import git, make_repo, olah

from specdeploy.profile import Profile, load_profile
from specdeploy.profile.lock import Lock
from specdeploy.rehearsal import variants
from specdeploy.weights.fetch import FetchError, fetch, read_token

pytestmark = pytest.mark.hub

TARGET, DRAFTER = "specdeploy-fixtures/tiny-target", "specdeploy-fixtures/tiny-drafter"
WEIGHTS = os.urandom(300_000)


@pytest.fixture(scope="module")
def hub(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    root = tmp_path_factory.mktemp("hub")
    mirrors = root / "mirrors"
    commits = {
        TARGET: make_repo(mirrors, TARGET, {"config.json": b'{"num_hidden_layers": 4}', "model.safetensors": WEIGHTS}),
        DRAFTER: make_repo(
            mirrors,
            DRAFTER,
            {"config.json": b'{"architectures": ["Qwen3ForCausalLM"]}', "model.safetensors": WEIGHTS[:1000]},
        ),
    }
    with olah(root) as url:
        yield {"url": url, "commits": commits, "mirrors": mirrors}


def _profile(commits: dict[str, str], name: str = "cpu-rehearsal-hub") -> Profile:
    def pin(sha: str) -> dict[str, str]:
        return {"value": sha, "provenance": "rehearsal", "source": "fixture repo served by olah"}

    patch = {
        "target": {"repo": TARGET, "revision": pin(commits[TARGET])},
        "drafter": {"repo": DRAFTER, "revision": pin(commits[DRAFTER])},
    }
    return variants.derive(load_profile("cpu-rehearsal"), name, patch)


def test_fetch_verifies_every_file_and_records_the_lock(hub: dict[str, Any], tmp_path: Path, cli: Any) -> None:
    profile_path = variants.materialize(_profile(hub["commits"]), tmp_path / "p")
    lock_path = tmp_path / "specdeploy.lock"
    args = (
        "fetch",
        tmp_path / "models",
        "--profile",
        profile_path,
        "--lock",
        lock_path,
        "--endpoint",
        hub["url"],
        "--json",
    )
    first = cli(*args)
    assert first.exit_code == 0, first.stderr
    results = {r["role"]: r for r in json.loads(first.stdout)}
    assert results["target"]["files"] == 3 and results["target"]["verified"] == 3  # .gitattributes too
    assert results["target"]["recorded_in_lock"] and results["drafter"]["recorded_in_lock"]
    revision = hub["commits"][TARGET]
    local = tmp_path / "models" / TARGET / revision / "model.safetensors"  # one directory per revision
    assert local.read_bytes() == WEIGHTS
    recorded = Lock(lock_path).value("cpu-rehearsal-hub", f"target.files@{revision}")
    assert recorded["model.safetensors"] == hashlib.sha256(WEIGHTS).hexdigest()

    again = {r["role"]: r for r in json.loads(cli(*args).stdout)}
    assert again["target"]["skipped_unchanged"] == 3 and again["target"]["verified"] == 0
    assert not again["target"]["recorded_in_lock"]


def test_corrupted_file_on_the_mirror_is_caught_and_not_kept(hub: dict[str, Any], tmp_path: Path) -> None:
    """Flip bytes in the mirror's LFS object (disk or mirror corruption): the file the client
    downloads no longer matches the commit's sha256, so it is removed and the fetch fails."""
    oid = hashlib.sha256(WEIGHTS).hexdigest()
    obj = hub["mirrors"] / "models" / TARGET / ".git" / "lfs" / "objects" / oid[:2] / oid[2:4] / oid
    original = obj.read_bytes()
    obj.write_bytes(original[:-8] + b"CORRUPT!")
    try:
        with pytest.raises(FetchError) as info:
            fetch(
                _profile(hub["commits"]),
                tmp_path / "models",
                lock=Lock(tmp_path / "l"),
                endpoint=hub["url"],
                only="target",
            )
    finally:
        obj.write_bytes(original)
    assert "model.safetensors: expected " + oid in str(info.value)
    assert not (tmp_path / "models" / TARGET / hub["commits"][TARGET] / "model.safetensors").exists()


def test_lock_drift_is_refused(hub: dict[str, Any], tmp_path: Path) -> None:
    """A later fetch of the same commit that yields other bytes than the lock recorded."""
    lock = Lock(tmp_path / "l")
    profile = _profile(hub["commits"])
    fetch(profile, tmp_path / "models", lock=lock, endpoint=hub["url"], only="drafter")
    entry = lock.data["profiles"][profile.name][f"drafter.files@{hub['commits'][DRAFTER]}"]
    entry["value"]["config.json"] = "0" * 64
    lock.path.write_text(json.dumps(lock.data))
    with pytest.raises(FetchError, match="differ from those recorded in the lock"):
        fetch(profile, tmp_path / "models2", lock=Lock(lock.path), endpoint=hub["url"], only="drafter")


def test_wrong_revision_is_named(hub: dict[str, Any], tmp_path: Path) -> None:
    other = git(hub["mirrors"] / "models" / DRAFTER, "rev-parse", "HEAD")  # a commit of another repo
    commits = dict(hub["commits"], **{TARGET: other})
    with pytest.raises(FetchError, match=f"{TARGET}.*{other}|{other}.*{TARGET}"):
        fetch(_profile(commits), tmp_path / "models", lock=Lock(tmp_path / "l"), endpoint=hub["url"], only="target")


def test_unresolved_revision_is_refused_before_any_download(tmp_path: Path) -> None:
    from specdeploy.core.errors import UnresolvedPinError

    with pytest.raises(UnresolvedPinError, match=r"target\.revision, drafter\.revision"):
        fetch(load_profile("a6000-dflash"), tmp_path, lock=Lock(tmp_path / "l"), endpoint="http://127.0.0.1:9")


class _Gated(BaseHTTPRequestHandler):
    """The hub's answer to a token that has not accepted a gated repo's conditions."""

    def log_message(self, *args: Any) -> None:
        pass

    def do_GET(self) -> None:  # noqa: N802
        body = (
            b'{"error": "Access to model z-lab/Qwen3.6-27B-DFlash is restricted. You must have access '
            b'to it and be authenticated to access it. Please log in."}'
        )
        self.send_response(401)
        self.send_header("X-Error-Code", "GatedRepo")
        self.send_header("X-Error-Message", "Access to model z-lab/Qwen3.6-27B-DFlash is restricted.")
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)


def test_gated_refusal_names_the_repo_and_the_fix(tmp_path: Path) -> None:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Gated)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    sha = "a" * 40
    profile = variants.derive(
        load_profile("a6000-dflash"),
        "a6000-dflash-pinned",
        {"drafter": {"revision": {"value": sha, "provenance": "reported", "source": "test"}}},
    )
    try:
        with pytest.raises(FetchError) as info:
            fetch(
                profile,
                tmp_path,
                lock=Lock(tmp_path / "l"),
                endpoint=f"http://127.0.0.1:{server.server_address[1]}",
                only="drafter",
                token="hf_x",
            )
    finally:
        server.shutdown()
    assert "z-lab/Qwen3.6-27B-DFlash is gated" in str(info.value)
    assert "https://huggingface.co/z-lab/Qwen3.6-27B-DFlash" in str(info.value.hint)


def test_token_file_must_be_private(tmp_path: Path) -> None:
    token = tmp_path / "token"
    token.write_text("hf_" + "x" * 34)
    token.chmod(0o644)
    with pytest.raises(FetchError, match="readable by others"):
        read_token(token)
    token.chmod(0o600)
    assert read_token(token) == "hf_" + "x" * 34
