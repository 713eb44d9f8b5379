"""Fetch the target and drafter at their pinned commits, and prove every byte.

huggingface_hub does the downloading (resumable `.incomplete` files, a site mirror through
`endpoint`/`HF_ENDPOINT`); this module decides *whether the result is right*: every file is
checked against the hub's own hash for the pinned commit (LFS sha256, or the git blob id
for small files), the per-file sha256 is recorded in the lock on the first fetch and must
match on every later fetch, mirror and migration, and a corrupted file is deleted — never
kept — with a message naming it. Re-runs skip files whose size and mtime are unchanged
since they were verified. The token is passed in memory only, never in argv or logs.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import os
import re
import ssl
import stat
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import quote, urlsplit

from specdeploy.core import atomic, files, hashcache, privilege
from specdeploy.core.errors import SpecdeployError, UnresolvedPinError, UsageError
from specdeploy.profile import ModelRef, Profile
from specdeploy.profile.lock import Lock, files_key, recorded_files, require

# The hub client's packages, imported in full before the fetch becomes its own account: they load
# parts lazily, and an install that account cannot read (a venv under /root) would fail half-way.
HUB_CLIENT_PACKAGES = ("huggingface_hub", "httpx2", "httpcore", "h11", "anyio", "filelock", "tqdm", "idna", "sniffio")
FETCH_HOME = ".specdeploy-fetch-home"  # under the models directory: the fetch account's home (hub client state)


def models_of(profile: Profile) -> list[tuple[str, ModelRef]]:
    """(role, model) for the profile's target and, when it has one, its drafter."""
    refs: list[tuple[str, ModelRef]] = [("target", profile.target)]
    if profile.drafter is not None:
        refs.append(("drafter", profile.drafter))
    return refs


class FetchError(SpecdeployError):
    """A download the hub refused, or a file that does not match the pinned commit."""


class TokenError(FetchError):
    """A token file or standard input that does not hold a token: bad input, exit 2."""

    exit_code = 2


ROLES = ("target", "drafter")
PUBLIC_HUB = "https://huggingface.co"
DEFAULT_TIMEOUT_S = 30.0  # per request (connect, and each read): a real hub answers in well under a second
DEFAULT_RETRIES = 3  # a refused connection, a timeout or a 5xx: tried again this many times
TOKEN_HINT = "write the hub token (one line, hf_...) into a file only you can read (chmod 600), or pass it on stdin"


@dataclass
class RepoResult:
    role: str
    repo: str
    revision: str
    directory: str
    files: int = 0
    verified: int = 0
    skipped_unchanged: int = 0
    recorded_in_lock: bool = False
    removed_corrupt: list[str] = field(default_factory=list)


# --------------------------------------------------------------------------- tokens


def _one_token(text: str, origin: str) -> str | None:
    """The token in `text` (surrounding whitespace dropped), None when empty; a text that is not
    one word is refused without showing it (it may be a token with a typo)."""
    token = text.strip()
    if len(token) > 4096:
        raise TokenError(
            f"{origin} holds {len(token)} characters: expected one hub token (hf_..., a few dozen); "
            "its content is not shown",
            hint=TOKEN_HINT,
        )
    if token and (len(token.split()) != 1 or any(ord(c) < 32 or ord(c) == 127 for c in token)):
        raise TokenError(
            f"{origin} holds more than one word or a control character: expected one hub token (hf_...); "
            "its content is not shown",
            hint=TOKEN_HINT,
        )
    return token or None


def read_token(token_file: Path | None, *, from_stdin: bool = False) -> str | None:
    """The HF token from standard input (how Ansible hands it over: never on a command line,
    in a task's environment or in a file; an empty line means none), a file (a regular file of
    at most 64 KiB, refused when others can read it or when it is empty), or $HF_TOKEN."""
    if from_stdin:
        try:
            line = sys.stdin.readline(files.LIMITS["key"])
        except (UnicodeDecodeError, ValueError):
            raise TokenError(
                "the token on standard input is not UTF-8 text: expected one hub token (hf_...)", hint=TOKEN_HINT
            ) from None
        return _one_token(line, "standard input")
    if token_file is not None:
        hint = f"pass --token-file the file holding the hub token; {TOKEN_HINT}"
        data = files.read_bytes(token_file, what="token file", limit=files.LIMITS["key"], hint=hint)
        mode = Path(token_file).stat().st_mode
        if mode & (stat.S_IRGRP | stat.S_IROTH | stat.S_IWGRP | stat.S_IWOTH):
            raise FetchError(
                f"token file {token_file} is readable by others (mode {oct(mode & 0o777)})",
                hint=f"chmod 600 {token_file}; a token in a world-readable file is a leaked token",
            )
        token = _one_token(files.decode(data, token_file, what="token file"), f"token file {token_file}")
        if token is None:
            raise TokenError(
                f"token file {token_file} is empty: expected the hub token (hf_...); nothing was fetched",
                hint="write the token into it (one line, chmod 600), or leave --token-file out for repositories "
                "that are not gated",
            )
        return token
    return os.environ.get("HF_TOKEN") or None


# --------------------------------------------------------------------------- hashing


def git_blob_id(path: Path) -> str:
    """git's blob id of a regular file (sha1 of "blob <size>\\0" + content), streamed: a file the hub
    lists as small may be large on disk."""
    with files.open_no_follow(path) as fh:
        digest = hashlib.sha1(b"blob %d\0" % os.fstat(fh.fileno()).st_size, usedforsecurity=False)
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def _remove_corrupt(directory: Path, relative: str) -> None:
    """Delete a file and huggingface_hub's record of it, so the next fetch downloads it again
    (`relative` checked again: only ever a file inside the revision directory, never through a link)."""
    origin = f"the file list of {directory}"
    for path in (
        files.inside(directory, relative, origin=origin),
        files.inside(directory, f".cache/huggingface/download/{relative}.metadata", origin=origin),
    ):
        path.unlink(missing_ok=True)


BOOKKEEPING = (hashcache.STATE_DIR, ".cache")  # specdeploy's hash cache and huggingface_hub's download records


def checked_tree(entries: list[Any], repo: str, revision: str) -> list[Any]:
    """The hub's file list for `repo@revision`, every name checked before any file operation: a
    relative path inside the revision directory (`files.relative_name`), listed once, and not in
    the bookkeeping directories (a listed `.specdeploy/verified.json` would replace the hash cache)."""
    origin = f"the hub's file list of {repo}@{revision}"
    seen: set[str] = set()
    for entry in entries:
        name = files.relative_name(getattr(entry, "path", None), origin=origin)
        if name.split("/")[0] in BOOKKEEPING:
            raise files.UnsafePathError(
                f"{origin} names the file {name!r}: expected a model file, found one inside specdeploy's or "
                "huggingface_hub's bookkeeping directory; refused before any file was opened, created or removed",
                hint=files.UNSAFE_NAME_HINT,
            )
        if name in seen:
            raise files.UnsafePathError(
                f"{origin} lists {name!r} twice: expected each file once; refused before any file operation",
                hint=files.UNSAFE_NAME_HINT,
            )
        seen.add(name)
    return entries


# --------------------------------------------------------------------------- the endpoint


def endpoint_url(endpoint: str | None, *, origin: str = "--endpoint") -> str:
    """The hub or mirror base URL to fetch from (the hub's when none is given), refused unless it
    is an http(s) URL with a host: "127.0.0.1:8090" or "hub.local" would otherwise reach
    huggingface_hub as a path and end in a traceback."""
    if endpoint is None or not endpoint.strip():
        from_env = os.environ.get("HF_ENDPOINT", "").strip()
        if origin != "$HF_ENDPOINT" and from_env:
            return endpoint_url(from_env, origin="$HF_ENDPOINT")
        return PUBLIC_HUB  # an empty $HF_ENDPOINT means the hub (huggingface_hub itself would take "" as the URL)
    try:
        parts = urlsplit(endpoint.strip())
        port_ok = parts.port is None or parts.port > 0  # urlsplit checks the port's range only when asked
    except ValueError as exc:  # "http://[", "http://h:port": not a URL at all
        raise UsageError(
            f"{origin} {endpoint!r}: expected the base URL of the hub or a mirror, found no URL ({exc}); "
            "nothing was fetched",
            hint=f"pass e.g. {origin} https://huggingface.co",
        ) from None
    if parts.scheme == "http" and parts.hostname:
        raise UsageError(
            f"{origin} {endpoint!r}: expected an https:// URL, found http://: the hub token and the weights' file "
            "list would cross the network in clear (anyone on the path reads the token, or answers with other "
            "files); nothing was fetched",
            hint=f"serve the mirror over TLS and pass {origin} https://{endpoint.strip()[len('http://') :]} "
            "(a certificate from the site CA: pass --ca-file with the CA when the host's trust store lacks it)",
        )
    if (
        parts.scheme != "https"
        or not parts.hostname
        or not port_ok
        or parts.query
        or parts.fragment
        or any(c.isspace() for c in endpoint.strip())
    ):
        bare = "://" not in endpoint
        if bare:
            found = "no scheme"
        elif parts.scheme != "https":
            found = f"the scheme {parts.scheme!r}"
        else:
            found = "no host, a bad port, a query or a space"
        raise UsageError(
            f"{origin} {endpoint!r}: expected the base URL of the hub or a mirror (https://, a host, "
            f"no query), found {found}; nothing was fetched",
            hint=f"pass e.g. {origin} https://{endpoint.strip()}"
            if bare
            else f"pass e.g. {origin} https://huggingface.co",
        )
    return endpoint.strip().rstrip("/")


def _transport_errors() -> tuple[type[Exception], ...]:
    from huggingface_hub.utils import httpx as hub_httpx  # the HTTP library huggingface_hub itself uses

    return (hub_httpx.TransportError, hub_httpx.InvalidURL, OSError)


def _network_reason(exc: Exception, timeout: float) -> str:
    """A transport failure as a person reads it."""
    from huggingface_hub.utils import httpx as hub_httpx

    if isinstance(exc, hub_httpx.TimeoutException):
        return f"no answer within {timeout:g} s"
    text = " ".join(str(exc).split()) or type(exc).__name__
    if "CERTIFICATE_VERIFY_FAILED" in text or "certificate verify failed" in text.lower():
        return (
            f"its TLS certificate is not trusted ({text}): pass --ca-file with the site CA that signed it "
            "(or add the CA to the host's trust store)"
        )
    if "refused" in text.lower():
        return f"connection refused ({text})"
    return text


def tls_context(ca_file: Path | None) -> ssl.SSLContext:
    """How the endpoint's certificate is checked: against `ca_file` (the site CA) when given, else the
    system's trust store ($SSL_CERT_FILE honoured). A CA file that cannot be read is refused by name."""
    if ca_file is None:
        cafile = os.environ.get("SSL_CERT_FILE") or None
        return ssl.create_default_context(cafile=cafile)
    data = files.read_bytes(ca_file, what="CA certificate file", limit=files.LIMITS["json"])
    try:
        return ssl.create_default_context(cadata=data.decode("ascii", errors="replace"))
    except (ssl.SSLError, ValueError) as exc:
        raise UsageError(
            f"--ca-file {ca_file}: expected PEM certificates (-----BEGIN CERTIFICATE-----), found none that load "
            f"({exc}); nothing was fetched",
            hint="pass the site CA's certificate in PEM (the one the registry's ca.crt holds)",
        ) from None


@contextmanager
def _bounded_requests(timeout: float, verify: ssl.SSLContext | None = None) -> Iterator[None]:
    """huggingface_hub's shared client with a timeout on every request while the fetch runs (its
    default client has none: a server that accepts and never answers held the fetch forever), and
    the endpoint's certificate checked with `verify` (the site CA)."""
    import huggingface_hub
    from huggingface_hub.utils import _http

    default = getattr(_http, "default_client_factory", None)
    if default is None:  # another huggingface_hub than the pinned one: keep its client as it is
        yield
        return

    def bounded() -> Any:
        if verify is None:
            client = default()
        else:  # the pinned huggingface_hub's default client, with the site's trust
            client = _http.httpx2.Client(
                event_hooks={"request": [_http.hf_request_event_hook]}, follow_redirects=True, verify=verify
            )
        client.timeout = timeout
        return client

    huggingface_hub.set_client_factory(bounded)
    try:
        yield
    finally:
        huggingface_hub.set_client_factory(default)


def probe(endpoint: str, repo: str, revision: str, *, token: str | None, timeout: float, retries: int) -> None:
    """Ask the endpoint for the revision's file list once — the request the download starts with —
    with `timeout` seconds per try and `retries` more tries on a network failure or a 5xx, so that
    an unreachable, hanging or failing endpoint is reported in seconds, naming it and the reason.
    4xx answers (gated, not found) are raised as huggingface_hub's own errors, for `_explain`."""
    from huggingface_hub.utils import build_hf_headers, hf_raise_for_status

    url = f"{endpoint}/api/models/{repo}/tree/{quote(revision, safe='')}"
    headers = build_hf_headers(token=token)
    reason, answered = "", False
    for attempt in range(retries + 1):
        if attempt:
            time.sleep(min(0.5 * 2 ** (attempt - 1), 4.0))
        try:
            response = _bounded_get(url, headers=headers, timeout=timeout)
        except _transport_errors() as exc:
            reason, answered = _network_reason(exc, timeout), False
            if "certificate is not trusted" in reason:
                retries = attempt  # another try meets the same certificate
                break
            continue
        if response is None:
            raise FetchError(
                f"{endpoint} answered the file list of {repo}@{revision} with more than "
                f"{PROBE_LIMIT // (1024 * 1024)} MiB (or for longer than {3 * timeout:g} s): not the hub API's "
                "(a page of it is a few hundred KB); nothing was downloaded",
                hint="point --endpoint (or $HF_ENDPOINT) at the base URL of the hub or a hub mirror "
                "(e.g. https://huggingface.co)",
            )
        if response.status_code >= 500 or response.status_code == 429:
            reason, answered = f"HTTP {response.status_code}: {_first_bytes(response.content)}", True
            continue
        if response.status_code >= 400:
            hf_raise_for_status(response)  # gated, not found, unauthorized: huggingface_hub's typed errors
        try:
            page = files.loads(response.content)
        except files.JSONTextError:
            page = None
        if not isinstance(page, list):
            raise FetchError(
                f"{endpoint} answered the file list of {repo}@{revision} with something that is not the hub API's "
                f"(HTTP {response.status_code}, {response.headers.get('content-type', 'no content type')}: "
                f"{_first_bytes(response.content)}); nothing was downloaded",
                hint="point --endpoint (or $HF_ENDPOINT) at the base URL of the hub or a hub mirror "
                "(e.g. https://huggingface.co), not at a web page or another API",
            )
        return
    tries = f"{retries + 1} tries" if retries else "1 try"
    if answered:
        raise FetchError(
            f"hub endpoint {endpoint} could not serve the file list of {repo}@{revision}: {reason} ({tries}); "
            "nothing was downloaded",
            hint="the pin may be wrong (a mirror answers an unknown commit so: check it with "
            "huggingface_hub.list_repo_commits), or the endpoint is failing: check its logs, then run the fetch again",
        )
    state = "did not answer" if reason.startswith("no answer") else "is unreachable"
    raise FetchError(
        f"hub endpoint {endpoint} {state}: {reason} ({tries}, {timeout:g} s each); nothing was downloaded",
        hint="check the endpoint URL and that this host reaches it (proxy, firewall, DNS); for a slow mirror pass "
        "a longer --timeout or more --retries",
    )


_BODY_HEADERS = ("content-encoding", "content-length", "transfer-encoding")
PROBE_LIMIT = 16 * 1024 * 1024  # a page of the hub's file list: at most 1000 entries, a few hundred KB


def _bounded_get(url: str, *, headers: dict[str, str], timeout: float) -> Any:
    """GET `url` through huggingface_hub's client, reading at most PROBE_LIMIT bytes for at most
    3 x `timeout` seconds; the response (its body read), or None when the answer is larger or slower."""
    from huggingface_hub.utils import get_session
    from huggingface_hub.utils import httpx as hub_httpx

    deadline = time.monotonic() + 3 * timeout
    params = {"recursive": False, "expand": False}
    with get_session().stream("GET", url, params=params, headers=headers, timeout=timeout) as streamed:
        body = bytearray()
        for chunk in streamed.iter_bytes():
            body += chunk
            if len(body) > PROBE_LIMIT or time.monotonic() > deadline:
                return None
        # the body is decoded already (gzip undone): the copy must not claim an encoding or a length
        kept = [(k, v) for k, v in streamed.headers.multi_items() if k.lower() not in _BODY_HEADERS]
        return hub_httpx.Response(streamed.status_code, headers=kept, content=bytes(body), request=streamed.request)


def _first_bytes(content: bytes, n: int = 120) -> str:
    text = " ".join(content[:n].decode("utf-8", errors="replace").split())
    return repr(text + ("..." if len(content) > n else "")) if text else "an empty body"


def _explain(exc: Exception, repo: str, revision: str, *, token: str | None) -> FetchError:
    from huggingface_hub import errors

    if isinstance(exc, errors.GatedRepoError):
        if token is None:
            return FetchError(
                f"{repo} is gated and no token was given: the hub lets only accounts that accepted its "
                "conditions download it",
                hint=f"accept the conditions at https://huggingface.co/{repo}, then provide that account's token "
                "(--token-file, --token-stdin or $HF_TOKEN; ansible-vault for a deploy; never argv)",
            )
        return FetchError(
            f"{repo} is gated and the token given may not download it",
            hint=f"accept the conditions at https://huggingface.co/{repo} with the account whose token you use, "
            "then provide the token through ansible-vault or $HF_TOKEN (never argv)",
        )
    if isinstance(exc, errors.RepositoryNotFoundError):
        visible = "to the token given" if token is not None else "without a token: none was given"
        return FetchError(
            f"{repo} not found at this endpoint (or not visible {visible})",
            hint="check the repository name in the profile and the endpoint; a private repository needs a token",
        )
    # RevisionNotFound from the hub; olah answers an unknown commit with 404/500 on the tree.
    status = getattr(getattr(exc, "response", None), "status_code", "?")
    return FetchError(
        f"{repo} has no revision {revision} at this endpoint (HTTP {status})"
        + (", or the endpoint is failing" if isinstance(status, int) and status >= 500 else ""),
        hint="the pin is wrong or the mirror lags: check the commit with huggingface_hub.list_repo_commits",
    )


def _download_failure(
    exc: Exception, repo: str, revision: str, directory: Path, *, token: str | None, timeout: float
) -> FetchError:
    """Whatever the hub client raised while listing or downloading, as a FetchError (never a traceback)."""
    from huggingface_hub import errors

    if isinstance(exc, errors.HfHubHTTPError):
        return _explain(exc, repo, revision, token=token)
    hub_side = (
        errors.EntryNotFoundError,
        errors.RevisionResolutionError,
        errors.FileMetadataError,
        errors.OfflineModeIsEnabled,
        errors.XetDownloadError,
    )
    if isinstance(exc, hub_side) or not isinstance(exc, OSError):
        if isinstance(exc, _transport_errors()[:2]):
            what = f"the endpoint stopped answering: {_network_reason(exc, timeout)}"
        elif isinstance(exc, ValueError | KeyError | TypeError | AttributeError):
            detail = " ".join(str(exc).split())[:200]
            what = f"the endpoint's answer is not the hub API's ({type(exc).__name__}: {detail})"
        else:
            what = " ".join(str(exc).split())[:300] or type(exc).__name__
        return FetchError(
            f"{repo}@{revision}: the download did not complete: {what}; files downloaded so far stay in {directory} "
            "and the next fetch resumes",
            hint="run the fetch again; if it repeats, check the endpoint (or pass a longer --timeout)",
        )
    cause = _cause(exc)
    return FetchError(
        f"{repo}@{revision}: could not write into {directory}: {cause}; files downloaded so far stay there",
        hint="free space on that filesystem (or remount it read-write, check ownership), then run the fetch again",
    )


# --------------------------------------------------------------------------- the destination


def _cause(exc: OSError) -> str:
    code = exc.errno or 0
    return f"{atomic.WRITE_CAUSES.get(code, exc.strerror or str(exc))} ({errno.errorcode.get(code, code)})"


def _prepare_destination(dest: Path) -> list[Path]:
    """Make sure `dest` is a directory this process can write into; return the directories it
    created (removed again when the fetch fails before writing anything)."""
    dest = Path(dest)
    created: list[Path] = []
    missing = []
    probe_path = dest
    while not os.path.lexists(probe_path) and probe_path != probe_path.parent:
        missing.append(probe_path)
        probe_path = probe_path.parent
    if os.path.lexists(probe_path) and not probe_path.is_dir():
        where = "is" if probe_path == dest else f"lies under {probe_path}, which is"
        raise UsageError(
            f"destination {dest} {where} a {'file' if probe_path.is_file() else 'path that is not a directory'}: "
            "expected a directory to download into; nothing was fetched",
            hint="pass DEST the directory the models go to (the host layout's models directory), not a file",
        )
    try:
        for directory in reversed(missing):
            directory.mkdir()
            created.append(directory)
        fd, name = tempfile.mkstemp(prefix=".specdeploy-write-test.", dir=dest)
        os.close(fd)
        os.unlink(name)
    except OSError as exc:
        _remove_created(created)
        cause = _cause(exc)
        raise FetchError(
            f"destination {dest} is not writable: {cause}; nothing was fetched",
            hint="pass a destination on a writable filesystem (remount it read-write, check ownership, "
            "free space), then run the fetch again",
        ) from None
    return created


def _owned_by(dest: Path, who: privilege.Account, created: list[Path]) -> None:
    """The destination the fetch account writes into: made here (then given to it) or already its own."""
    if Path(dest) in created:  # made by this run (its parents stay root's)
        os.chown(dest, who.uid, who.gid)
    owner = os.stat(dest).st_uid
    if owner != who.uid:
        raise UsageError(
            f"destination {dest} is owned by uid {owner}: the fetch runs as {who.name} (uid {who.uid}), which must "
            "own the models directory; nothing was fetched",
            hint=f"chown -R {who.name}: {dest} (the deploy's weights role does), or leave --as-user out",
        )


def _remove_created(created: list[Path]) -> None:
    for directory in reversed(created):
        with contextlib.suppress(OSError):
            directory.rmdir()  # only when still empty


# --------------------------------------------------------------------------- fetch


def _revision_name(revision: Any, role: str) -> str:
    """A revision as a directory name: a commit (hex) or a content revision, never a path."""
    if not isinstance(revision, str) or not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}", revision):
        raise UsageError(
            f"{role}.revision: expected a commit SHA (40 hex digits), found {str(revision)[:80]!r}; "
            "nothing was fetched",
            hint=f"pin {role}.revision to the full commit in the profile (or remove the wrong entry from the lock)",
        )
    return revision


def fetch_repo(
    role: str,
    ref: ModelRef,
    profile: Profile,
    dest: Path,
    *,
    lock: Lock,
    token: str | None,
    endpoint: str | None,
    timeout: float = DEFAULT_TIMEOUT_S,
    retries: int = DEFAULT_RETRIES,
    verify: ssl.SSLContext | None = None,
    as_user: privilege.Account | None = None,
) -> RepoResult:
    """Download and verify one repository at its pinned commit (as `as_user` when given: the
    network-facing part never runs as root), then compare with, or record in, the lock."""
    revision = _revision_name(require(profile, f"{role}.revision", lock), role)
    base = endpoint_url(endpoint)
    # one directory per revision (a rollback serves the old one); nothing on the way to it or in
    # it may be a link: the hashing, the removal of a corrupt file and the lock would follow it
    directory = files.inside(dest, f"{ref.repo}/{revision}", origin=f"profile {profile.name}: {role}")
    files.no_links_below(directory, origin=f"the revision directory of {ref.repo}@{revision}")
    key = files_key(role, revision)
    recorded = recorded_files(lock, profile.name, role, revision, consequence="the files cannot be compared with it")

    def download() -> dict[str, Any]:
        result, hashes = _download_and_verify(
            role, ref.repo, revision, directory, base=base, token=token, timeout=timeout, retries=retries, verify=verify
        )
        return {"result": result.__dict__, "hashes": hashes}

    if as_user is not None:  # the hub client loaded while this process can still read all of its install
        privilege.preload(HUB_CLIENT_PACKAGES)
    done = download() if as_user is None else privilege.run_as(as_user, download, home=dest / FETCH_HOME)
    result, hashes = RepoResult(**done["result"]), done["hashes"]
    # what the child sent is checked as any input from the network is
    for name in hashes:
        files.relative_name(name, origin=f"the verified file list of {ref.repo}@{revision}")
    if recorded is None:
        result.recorded_in_lock = lock.record(profile.name, key, hashes, by="fetch", detail={"revision": revision})
    else:
        drift = sorted(p for p in set(recorded) | set(hashes) if recorded.get(p) != hashes.get(p))
        if drift:
            raise FetchError(
                f"{ref.repo}@{revision}: files differ from those recorded in the lock {lock.path} at first fetch: "
                + ", ".join(drift[:10]),
                hint="a mirror or the hub serves other bytes for the same commit; do not deploy until explained",
            )
    return result


def _download_and_verify(
    role: str,
    repo: str,
    revision: str,
    directory: Path,
    *,
    base: str,
    token: str | None,
    timeout: float,
    retries: int,
    verify: ssl.SSLContext | None,
) -> tuple[RepoResult, dict[str, str]]:
    """The network-facing part: list, check every name, download, hash each file against the hub's
    hash for the commit (a mismatch removed). Touches only `directory`; returns the result and the
    verified sha256 of every file."""
    from huggingface_hub import HfApi, snapshot_download

    result = RepoResult(role, repo, revision, str(directory))
    try:
        with _bounded_requests(timeout, verify):
            probe(base, repo, revision, token=token, timeout=timeout, retries=retries)
    except SpecdeployError:
        raise
    except Exception as exc:  # huggingface_hub's typed HTTP errors for a 4xx
        raise _download_failure(exc, repo, revision, directory, token=token, timeout=timeout) from None
    api = HfApi(endpoint=base, token=token)
    try:
        with _bounded_requests(timeout, verify):
            listed = api.list_repo_tree(repo, revision=revision, recursive=True)
            tree = checked_tree([e for e in listed if hasattr(e, "blob_id")], repo, revision)
            snapshot_download(
                repo, revision=revision, local_dir=directory, token=token, endpoint=base, etag_timeout=timeout
            )
    except SpecdeployError:
        raise
    except Exception as exc:  # whatever the hub client raised: named, never a traceback
        raise _download_failure(exc, repo, revision, directory, token=token, timeout=timeout) from None

    state = hashcache.load(directory)
    hashes: dict[str, str] = {}
    problems: list[str] = []
    for entry in tree:
        path = files.inside(directory, entry.path, origin=f"the hub's file list of {repo}@{revision}")
        result.files += 1
        try:
            st = path.lstat()
            if not stat.S_ISREG(st.st_mode):
                raise OSError(f"not a regular file: {entry.path}")
        except OSError:
            problems.append(f"{entry.path}: listed by the hub for this commit, but not downloaded")
            continue
        cached = state.get(entry.path)
        if (
            cached
            and cached["size"] == st.st_size
            and cached["mtime_ns"] == st.st_mtime_ns
            and cached.get("revision") == revision
        ):
            hashes[entry.path] = cached["sha256"]
            result.skipped_unchanged += 1
            continue
        local_sha256 = files.sha256_file(path)
        if entry.lfs is not None:
            expected, found = entry.lfs.sha256, local_sha256
        else:
            expected, found = entry.blob_id, git_blob_id(path)
        if expected != found or st.st_size != entry.size:
            problems.append(
                f"{entry.path}: expected {expected} ({entry.size} bytes), found {found} ({st.st_size} bytes)"
            )
            _remove_corrupt(directory, entry.path)
            result.removed_corrupt.append(entry.path)
            continue
        hashes[entry.path] = local_sha256
        state[entry.path] = {
            "size": st.st_size,
            "mtime_ns": st.st_mtime_ns,
            "sha256": local_sha256,
            "revision": revision,
        }
        result.verified += 1
    hashcache.save(directory, state)
    if problems:
        raise FetchError(
            f"{repo}@{revision}: {len(problems)} file(s) do not match the hub's hashes and were removed:\n  "
            + "\n  ".join(problems),
            hint="run the fetch again to download them anew; if it repeats, the mirror or disk is corrupting data",
        )
    return result, hashes


def fetch(
    profile: Profile,
    dest: Path,
    *,
    lock: Lock,
    token: str | None = None,
    endpoint: str | None = None,
    only: str | None = None,
    timeout: float = DEFAULT_TIMEOUT_S,
    retries: int = DEFAULT_RETRIES,
    ca_file: Path | None = None,
    as_user: str | None = None,
) -> list[RepoResult]:
    """Fetch the profile's target and drafter (those that live on a hub) and verify them.

    Everything that can be refused without the network is refused first, before anything is
    created: `only` naming no model of the profile, an endpoint that is not a URL, a timeout or
    retry count out of range, an unresolved pin, a destination that is a file or not writable."""
    refs = models_of(profile)
    if only is not None:
        if only not in ROLES:
            raise UsageError(
                f"--only {only!r}: expected one of {', '.join(ROLES)}; nothing was fetched",
                hint="pass --only target or --only drafter, or leave --only out to fetch both",
            )
        refs = [(role, ref) for role, ref in refs if role == only]
        if not refs:
            raise UsageError(
                f"--only {only}: profile {profile.name} has no {only}; nothing was fetched",
                hint="leave --only out to fetch what the profile names ("
                + ", ".join(r for r, _ in models_of(profile))
                + ")",
            )
    if not (0 < timeout <= 3600):
        raise UsageError(
            f"--timeout {timeout:g}: expected seconds per request, more than 0 and at most 3600",
            hint=f"pass e.g. --timeout {DEFAULT_TIMEOUT_S:g}",
        )
    if not (0 <= retries <= 20):
        raise UsageError(
            f"--retries {retries}: expected 0 to 20 further tries", hint=f"pass e.g. --retries {DEFAULT_RETRIES}"
        )
    base = endpoint_url(endpoint)
    missing = [
        f"{role}.revision"
        for role, ref in refs
        if not ref.revision.resolved and lock.value(profile.name, f"{role}.revision") is None
    ]
    if missing:
        raise UnresolvedPinError(
            f"profile {profile.name}: refusing to fetch at an unresolved revision: {', '.join(missing)}",
            hint="pin the full commit SHA in the profile (huggingface_hub.list_repo_commits); a branch would drift",
        )
    for role, _ in refs:
        _revision_name(require(profile, f"{role}.revision", lock), role)
    verify = tls_context(ca_file)
    who = privilege.account(as_user) if as_user is not None else None
    created = _prepare_destination(dest)
    try:
        if who is not None:
            _owned_by(dest, who, created)
        return [
            fetch_repo(
                role, ref, profile, dest, lock=lock, token=token, endpoint=base, timeout=timeout, retries=retries,
                verify=verify, as_user=who,
            )
            for role, ref in refs
        ]  # fmt: skip
    finally:
        _remove_created(created)  # only directories still empty: a fetch that wrote nothing leaves nothing
