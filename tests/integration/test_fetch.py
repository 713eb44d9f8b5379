"""`specdeploy fetch` with the real huggingface_hub client against a real hub-compatible
server (olah) serving fixture git repos, plus a small stub for the one thing olah cannot
do: refuse a gated repo (HTTP 403 with `X-Error-Code: GatedRepo`, the hub's own shape).

The repos are the tiny fixtures: the fetch's plumbing (names, hashes, containment, the account it
runs as) needs files, not a model that speaks.

Not testable here: resuming a partial download (olah ignores Range requests,
docs/sources.md#olah); huggingface_hub's resume path is exercised on real hosts only.
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler
from pathlib import Path
from typing import Any

import pytest
from tests.support.hub import git, make_repo, olah
from tests.support.stub import ca, stubs

from specdeploy.core.errors import UsageError
from specdeploy.core.files import UnsafePathError
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
    with olah(root) as (url, ca):
        yield {"url": url, "ca": ca, "commits": commits, "mirrors": mirrors}


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
        "--ca-file",
        hub["ca"],
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
                ca_file=hub["ca"],
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
    fetch(profile, tmp_path / "models", lock=lock, endpoint=hub["url"], ca_file=hub["ca"], only="drafter")
    entry = lock.data["profiles"][profile.name][f"drafter.files@{hub['commits'][DRAFTER]}"]
    entry["value"]["config.json"] = "0" * 64
    lock.path.write_text(json.dumps(lock.data))
    with pytest.raises(FetchError, match="differ from those recorded in the lock"):
        fetch(
            profile, tmp_path / "models2", lock=Lock(lock.path), endpoint=hub["url"], ca_file=hub["ca"], only="drafter"
        )


def test_wrong_revision_is_named(hub: dict[str, Any], tmp_path: Path) -> None:
    other = git(hub["mirrors"] / "models" / DRAFTER, "rev-parse", "HEAD")  # a commit of another repo
    commits = dict(hub["commits"], **{TARGET: other})
    with pytest.raises(FetchError, match=f"{TARGET}.*{other}|{other}.*{TARGET}"):
        fetch(
            _profile(commits),
            tmp_path / "models",
            lock=Lock(tmp_path / "l"),
            endpoint=hub["url"],
            ca_file=hub["ca"],
            only="target",
        )


def test_unresolved_revision_is_refused_before_any_download(tmp_path: Path) -> None:
    from specdeploy.core.errors import UnresolvedPinError

    with pytest.raises(UnresolvedPinError, match=r"target\.revision, drafter\.revision"):
        fetch(load_profile("a6000-dflash"), tmp_path, lock=Lock(tmp_path / "l"), endpoint="https://127.0.0.1:9")


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
    sha = "a" * 40
    profile = variants.derive(
        load_profile("a6000-dflash"),
        "a6000-dflash-pinned",
        {"drafter": {"revision": {"value": sha, "provenance": "reported", "source": "test"}}},
    )
    with stubs() as started, pytest.raises(FetchError) as info:
        fetch(
            profile, tmp_path, lock=Lock(tmp_path / "l"), endpoint=started.start(_Gated, tls=True), ca_file=ca(),
            only="drafter", token="hf_x",
        )  # fmt: skip
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


# --------------------------------------------------------------------------- containment (issue 35)


@pytest.fixture
def opened() -> Iterator[list[str]]:
    """Every path this process opens while the test runs (Python's audit hook on `open`, which
    every file open of Python code and of huggingface_hub passes through)."""
    seen: list[str] = []
    _AUDIT.append(seen)
    try:
        yield seen
    finally:
        _AUDIT.remove(seen)


_AUDIT: list[list[str]] = []


def _audit(event: str, args: tuple[Any, ...]) -> None:
    if _AUDIT and event in ("open", "os.remove", "os.unlink", "os.rename", "os.replace") and args:
        for seen in _AUDIT:
            seen.append(os.fsdecode(args[0]) if isinstance(args[0], str | bytes | os.PathLike) else str(args[0]))


sys.addaudithook(_audit)


class _HostileTree(BaseHTTPRequestHandler):
    """A mirror whose recursive file list (the one the fetch reads to verify and record) names
    `NAME`, while the first, flat page (what a client starts with) lists an ordinary file.
    Every request is recorded: a download (`/resolve/`) must never be asked for."""

    NAME = ""
    requests: list[str] = []

    def log_message(self, *args: Any) -> None:
        pass

    def do_GET(self) -> None:  # noqa: N802
        type(self).requests.append(self.path)
        if "/tree/" not in self.path:
            self.send_response(404)
            self.end_headers()
            return
        entries = [{"type": "file", "oid": "0" * 40, "size": 2, "path": "config.json"}]
        if "recursive=True" in self.path or "recursive=true" in self.path:
            entries.append({"type": "file", "oid": "1" * 40, "size": 5, "path": type(self).NAME})
        body = json.dumps(entries).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)


def _canaries(tmp_path: Path) -> dict[Path, bytes]:
    """Files outside the models directory (tmp_path/models) where hostile names would lead."""
    made = {tmp_path / "outside": b"canary outside\n", tmp_path / "models" / "outside": b"canary beside\n"}
    for path, content in made.items():
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(content)
    return made


@pytest.mark.parametrize(
    "name",
    [
        "/etc/passwd",
        "../../outside",
        "../../../../outside",
        "..\\..\\..\\..\\outside",
        "ok/../../../../../outside",
        "config.json\x00x",
        ".specdeploy/verified.json",
    ],
)
def test_a_mirror_listing_a_name_outside_the_revision_directory_is_refused_before_any_file_operation(
    name: str, tmp_path: Path, opened: list[str]
) -> None:
    """The fetch's own listing names an absolute path, a `..` path, a backslash path, a NUL or the
    hash cache: refused naming the path, nothing downloaded, no canary (nor /etc/passwd) opened,
    changed or removed (checked by content and by the audit of every file this process opens)."""
    canaries = _canaries(tmp_path)
    passwd = Path("/etc/passwd").read_bytes()
    _HostileTree.NAME, _HostileTree.requests = name, []
    commits = {TARGET: "a" * 40, DRAFTER: "b" * 40}
    with stubs() as started:
        url = started.start(_HostileTree, tls=True)
        opened.clear()
        with pytest.raises(UnsafePathError) as info:
            fetch(
                _profile(commits), tmp_path / "models", lock=Lock(tmp_path / "l"), endpoint=url, ca_file=ca(),
                only="target",
            )  # fmt: skip
    assert repr(name)[:60] in str(info.value) and "refused before any file" in str(info.value), info.value
    assert not any("/resolve/" in r for r in _HostileTree.requests), _HostileTree.requests
    touched = {str(p) for p in canaries} | {"/etc/passwd"}
    assert not [p for p in opened if os.path.normpath(p) in touched or p.endswith("outside")], opened
    assert all(path.read_bytes() == content for path, content in canaries.items())
    assert Path("/etc/passwd").read_bytes() == passwd
    assert not (tmp_path / "models" / TARGET / commits[TARGET] / "config.json").exists()


def test_a_revision_directory_holding_a_link_to_outside_is_refused_before_anything_is_read(
    hub: dict[str, Any], tmp_path: Path, opened: list[str]
) -> None:
    """A planted `config.json -> canary` in the revision directory (and, separately, the revision
    directory itself a link): refused naming the link; the canary unread, unchanged, not removed."""
    canaries = _canaries(tmp_path)
    canary = tmp_path / "outside"
    revision = hub["commits"][TARGET]
    directory = tmp_path / "models" / TARGET / revision
    directory.mkdir(parents=True)
    (directory / "config.json").symlink_to(canary)
    opened.clear()
    with pytest.raises(UnsafePathError) as info:
        fetch(
            _profile(hub["commits"]),
            tmp_path / "models",
            lock=Lock(tmp_path / "l"),
            endpoint=hub["url"],
            ca_file=hub["ca"],
            only="target",
        )
    assert f"{directory / 'config.json'} (" in str(info.value) and "symbolic link" in str(info.value), info.value
    assert str(canary) not in [os.path.normpath(p) for p in opened], opened
    assert (directory / "config.json").is_symlink()  # left for a person to look at, not followed or removed

    (directory / "config.json").unlink()
    directory.rmdir()
    (tmp_path / "elsewhere").mkdir()
    directory.symlink_to(tmp_path / "elsewhere")
    with pytest.raises(UnsafePathError, match="is a symbolic link"):
        fetch(
            _profile(hub["commits"]),
            tmp_path / "models",
            lock=Lock(tmp_path / "l"),
            endpoint=hub["url"],
            ca_file=hub["ca"],
            only="target",
        )
    assert list((tmp_path / "elsewhere").iterdir()) == []
    assert all(path.read_bytes() == content for path, content in canaries.items())


def test_an_http_endpoint_is_refused_before_anything_is_sent(tmp_path: Path) -> None:
    """http:// would send the token and take the file list in clear: refused, naming the fix."""
    with pytest.raises(UsageError) as info:
        fetch(_profile({TARGET: "a" * 40, DRAFTER: "b" * 40}), tmp_path / "m", lock=Lock(tmp_path / "l"),
              endpoint="http://127.0.0.1:9", token="hf_x")  # fmt: skip
    assert "expected an https:// URL, found http://" in str(info.value) and "in clear" in str(info.value)
    assert "https://127.0.0.1:9" in str(info.value.hint) and not (tmp_path / "m").exists()


def test_a_mirror_whose_certificate_the_site_ca_did_not_sign_is_refused(hub: dict[str, Any], tmp_path: Path) -> None:
    """The system's trust store (no --ca-file) does not know the site CA: refused, naming --ca-file."""
    with pytest.raises(FetchError) as info:
        fetch(_profile(hub["commits"]), tmp_path / "m", lock=Lock(tmp_path / "l"), endpoint=hub["url"],
              only="target", retries=0)  # fmt: skip
    assert "TLS certificate is not trusted" in str(info.value) and "--ca-file" in str(info.value)
    assert not (tmp_path / "m" / TARGET).exists()


@pytest.fixture
def traversable() -> Iterator[Path]:
    """A directory every account can pass through (pytest's own are root's alone, 0700)."""
    import shutil
    import tempfile

    directory = Path(tempfile.mkdtemp(prefix="specdeploy-as-user-", dir="/tmp"))
    directory.chmod(0o755)
    yield directory
    shutil.rmtree(directory, ignore_errors=True)


def test_as_an_unprivileged_account_the_fetch_writes_only_what_it_owns_and_the_lock_stays_roots(
    hub: dict[str, Any], tmp_path: Path, traversable: Path
) -> None:
    """`--as-user`: the download and its verification run as `nobody` (no groups); every file and
    directory it made is nobody's, the lock (written by the root caller) records the hashes; a
    destination that account does not own is refused before anything is fetched."""
    import pwd

    nobody = pwd.getpwnam("nobody")
    refused = tmp_path / "root-owned"
    refused.mkdir()
    with pytest.raises(UsageError, match="owned by uid 0: the fetch runs as nobody"):
        fetch(_profile(hub["commits"]), refused, lock=Lock(tmp_path / "l"), endpoint=hub["url"], ca_file=hub["ca"],
              as_user="nobody")  # fmt: skip
    assert list(refused.iterdir()) == []
    models = traversable / "models"
    models.mkdir(mode=0o750)
    os.chown(models, nobody.pw_uid, nobody.pw_gid)
    lock = Lock(tmp_path / "l")
    results = fetch(
        _profile(hub["commits"]), models, lock=lock, endpoint=hub["url"], ca_file=hub["ca"], as_user="nobody"
    )
    assert [r.verified for r in results] == [3, 3] and all(r.recorded_in_lock for r in results)
    revision = models / TARGET / hub["commits"][TARGET]
    assert (revision / "model.safetensors").read_bytes() == WEIGHTS
    owners = {p.lstat().st_uid for p in models.rglob("*")}
    assert owners == {nobody.pw_uid}, owners
    assert (revision / "model.safetensors").stat().st_mode & 0o007 == 0  # its umask: nothing for others
    assert lock.path.stat().st_uid == 0 and lock.value("cpu-rehearsal-hub", f"target.files@{revision.name}")


def test_a_hostile_listing_fetched_as_an_unprivileged_account_is_refused_with_the_same_message(
    tmp_path: Path, traversable: Path
) -> None:
    """The child's refusal comes back to the caller as the same error (class, message, exit code)."""
    import pwd

    nobody = pwd.getpwnam("nobody")
    models = traversable / "models"
    models.mkdir()
    os.chown(models, nobody.pw_uid, nobody.pw_gid)
    _HostileTree.NAME, _HostileTree.requests = "../../../../outside", []
    with stubs() as started, pytest.raises(UnsafePathError) as info:
        url = started.start(_HostileTree, tls=True)
        fetch(_profile({TARGET: "a" * 40, DRAFTER: "b" * 40}), models, lock=Lock(tmp_path / "l"), endpoint=url,
              ca_file=ca(), only="target", as_user="nobody")  # fmt: skip
    assert "'../../../../outside'" in str(info.value) and info.value.exit_code == 2
