"""A Hugging Face-compatible hub for the rehearsal, reached with a token as production reaches
huggingface.co: olah (PyPI) serving local git repos (LFS objects built by git-lfs) offline to
the real huggingface_hub client (docs/sources.md#olah), behind gating.py, which refuses a
gated repository without the token. Without it the rehearsal would take its weights from an
archive and never run the token hand-over, the gated refusal or the hub's hashes that a
production fetch depends on.

- `olah(root)`: olah alone, as a local process on a free loopback port (the weights tests).
- `start_hub` / `serve_hub`: olah and the gating proxy as a test host of their own, podman
  container `specdeploy-hub` at HUB_IP:HUB_PORT on network NETWORK (where the rehearsal's
  hosts reach it), also published on 127.0.0.1 for the controller. It runs on a Debian image
  built once from wheels downloaded here: the controller's olah venv is built on another
  Python and would not run in it, and the test hosts have no internet.
- `hub(token=...)`: the fixture models served that way for a `with` block (the rehearsal).
- `mirror_fixtures`: the rehearsal's fixture models as mirror repos, with fixed commit dates
  so that the same files give the same commits on every machine and run.
"""

from __future__ import annotations

import hashlib
import json
import os
import platform
import shlex
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Collection, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import httpx

from specdeploy.core import envlock, progress
from specdeploy.core.cache import cache_dir, exclusive
from specdeploy.core.errors import SpecdeployError
from specdeploy.core.files import sha256_file
from specdeploy.profile import load_profile
from specdeploy.rehearsal import archive, gating, hosts, real_model, site_ca, variants
from specdeploy.weights.fetch import models_of

# olah and every dependency as locks/hub-olah.txt pins them (exact versions, each file's sha256).
OLAH_LOCK = envlock.ENVIRONMENTS["hub-olah"].lock
OLAH_VERSION = envlock.OLAH.split("==")[1]
NETWORK = "specdeploy-rehearsal"
SUBNET = "10.89.64.0/24"
HUB_IP = "10.89.64.10"
HUB_PORT = 8090
HUB_NAME = "specdeploy-hub"
IMAGE = "localhost/specdeploy-test/hub"
# Debian bookworm with git (GitPython, which olah reads repos with, runs it) and Python 3.11;
# the image tests' build base is this image too (tests/support/local_images.build_base).
BASE_PACKAGES = ("ca-certificates", "git", "python3-minimal", "python3-pip", "python3-venv")
BASE_NAME = "localhost/specdeploy-test/buildbase"
# Bookworm's glibc is 2.36: pip takes wheels for it and every older glibc only when told each.
WHEEL_PLATFORMS = (*(f"manylinux_2_{minor}_{platform.machine()}" for minor in range(36, 16, -1)),
                   f"manylinux2014_{platform.machine()}")  # fmt: skip
FIXTURE_DATE = "2026-01-01T00:00:00Z"
_GIT_ENV = {
    "GIT_AUTHOR_NAME": "fixture",
    "GIT_AUTHOR_EMAIL": "f@x",
    "GIT_AUTHOR_DATE": FIXTURE_DATE,
    "GIT_COMMITTER_NAME": "fixture",
    "GIT_COMMITTER_EMAIL": "f@x",
    "GIT_COMMITTER_DATE": FIXTURE_DATE,
    # A signing or hook setting of the user's would change the commits.
    "GIT_CONFIG_GLOBAL": os.devnull,
    "GIT_CONFIG_NOSYSTEM": "1",
}
STAMP = "specdeploy-fixture.json"  # in .git: the files (name -> sha256) a mirror repo was made from

# Inside the hub's container.
_OLAH_PORT = 8091
_MIRRORS = "/srv/hub/mirrors"
_TOKEN = "/run/secrets/hub-token"
_CONFIG = "/etc/olah/olah.toml"
_GATING = "/opt/hub/gating.py"
_TLS_CERT, _TLS_KEY = "/opt/hub/tls/server.crt", "/opt/hub/tls/server.key"
_LOGS = "/var/log/olah"
_REPOS = "/var/lib/olah"
_LABEL = "specdeploy.hub"


class HubError(SpecdeployError):
    """The rehearsal's hub could not be built or started."""


# --------------------------------------------------------------------------- mirror repos


def git(repo: Path, *args: str) -> str:
    done = subprocess.run(
        ["git", "-C", str(repo), *args], check=True, capture_output=True, text=True, env={**os.environ, **_GIT_ENV}
    )
    return done.stdout.strip()


def make_repo(mirrors: Path, repo_id: str, files: dict[str, bytes]) -> str:
    """Create (or add a commit to) a model repo; *.safetensors go to LFS. Returns the commit."""
    repo = mirrors / "models" / repo_id
    if not (repo / ".git").exists():
        repo.mkdir(parents=True)
        git(repo, "init", "-q", "-b", "main")
        git(repo, "lfs", "install", "--local")
        git(repo, "lfs", "track", "*.safetensors")
        git(repo, "add", ".gitattributes")
    for name, data in files.items():
        (repo / name).write_bytes(data)
        git(repo, "add", name)
    git(repo, "commit", "-qm", f"add {', '.join(files)}")
    return git(repo, "rev-parse", "HEAD")


def fixture_repositories(repos: Collection[str] | None = None) -> dict[str, Path]:
    """Repository -> fixture directory for the models of the cpu-rehearsal profile and the real model
    with its drafter (cpu-rehearsal-smollm2), built or reused; with `repos`, only those (the others are
    not built: the main job needs the real model alone, not the tiny ones trained for the chains)."""
    tiny_repos = [ref.repo for _, ref in models_of(load_profile(variants.BASE))]
    wanted = None if repos is None else set(repos)
    found: dict[str, Path] = {}
    if wanted is None or wanted & set(tiny_repos):
        built = archive.repositories(archive.build_all())
        found |= {repo: built[repo] for repo in tiny_repos}
    if wanted is None or wanted - set(tiny_repos):
        found |= real_model.repositories()
    if wanted is None:
        return found
    if unknown := sorted(wanted - found.keys()):
        raise HubError(
            f"no fixture model is served as {', '.join(unknown)}: the rehearsal's hub serves "
            f"{', '.join(sorted(found))}",
            hint="name a repository of the cpu-rehearsal or cpu-rehearsal-smollm2 profile",
        )
    return {repo: path for repo, path in found.items() if repo in wanted}


def mirror_fixtures(dest: Path, repos: Collection[str] | None = None) -> dict[str, str]:
    """Make `dest` an olah mirrors-path holding the rehearsal's fixture models (with `repos`, only
    those), one commit each (repos already made from the same files are kept); returns repository ->
    commit."""
    return {repo: _mirror(dest, repo, source) for repo, source in fixture_repositories(repos).items()}


def _mirror(mirrors: Path, repo_id: str, source: Path) -> str:
    files = {
        path.name: path.read_bytes()
        for path in sorted(source.iterdir())
        if path.is_file() and path.name not in archive.CACHE_FILES
    }
    stamp = json.dumps({name: hashlib.sha256(data).hexdigest() for name, data in files.items()}, sort_keys=True)
    final = mirrors / "models" / repo_id
    if (final / ".git" / STAMP).is_file() and (final / ".git" / STAMP).read_text() == stamp:
        return git(final, "rev-parse", "HEAD")
    mirrors.mkdir(parents=True, exist_ok=True)
    building = Path(tempfile.mkdtemp(prefix=".building-", dir=mirrors))  # outside models/: olah never sees it
    try:
        commit = make_repo(building, repo_id, files)
        (building / "models" / repo_id / ".git" / STAMP).write_text(stamp)
        shutil.rmtree(final, ignore_errors=True)
        final.parent.mkdir(parents=True, exist_ok=True)
        os.rename(building / "models" / repo_id, final)
    finally:
        shutil.rmtree(building, ignore_errors=True)
    return commit


def served_commits(mirrors: Path) -> dict[str, str]:
    """Repository -> the commit its main branch is at, for every repo under `mirrors`."""
    return {
        f"{repo.parent.name}/{repo.name}": git(repo, "rev-parse", "HEAD")
        for repo in sorted((mirrors / "models").glob("*/*"))
        if (repo / ".git").is_dir()
    }


# --------------------------------------------------------------------------- olah


def olah_config(*, host: str, port: int, repos: str, mirrors: str, tls: bool = False) -> str:
    """olah.toml serving `mirrors` offline (an unused address for the hub it would proxy); `tls`:
    olah itself serves https (its redirects say so), else a TLS proxy stands in front of it."""
    return (
        "[basic]\n"
        f'host = "{host}"\nport = {port}\n'
        f'repos-path = "{repos}"\n'
        'hf-scheme = "http"\nhf-netloc = "127.0.0.1:9"\nhf-lfs-netloc = "127.0.0.1:9"\n'
        f'mirror-scheme = "{"https" if tls else "http"}"\n'
        f'mirror-netloc = "{host}:{port}"\nmirror-lfs-netloc = "{host}:{port}"\n'
        f'mirrors-path = ["{mirrors}"]\n'
        "[accessibility]\noffline = true\n"
    )


def olah_cli() -> Path:
    """olah in its own venv in the cache (its pins differ from vLLM's), installed from its hash
    lock and the wheels `olah_wheels` downloaded with it: nothing resolved, every byte checked."""
    wheels = olah_wheels()
    venv = cache_dir() / f"olah-{OLAH_VERSION}-{wheels.name.rsplit('-', 1)[-1]}"
    cli = venv / "bin" / "olah-cli"
    with exclusive(venv.name):  # another run on this machine may be installing it now
        _install_olah(venv, wheels)
    return cli


def _install_olah(venv: Path, wheels: Path) -> None:
    if not (venv / ".complete").exists():
        subprocess.run([sys.executable, "-m", "venv", "--clear", str(venv)], check=True)
        _pip_locked(
            [str(venv / "bin" / "pip"), "install", "-q", "--require-hashes", "--no-index", "--no-deps",
             "--find-links", str(wheels), "--requirement", str(wheels / "requirements.lock")],
            what=f"installing olah {OLAH_VERSION} into {venv}",
        )  # fmt: skip
        (venv / ".complete").touch()


def _pip_locked(argv: list[str], *, what: str) -> None:
    """Run pip on the hub's lock; a HubError naming the step (a hash mismatch names the wheel)."""
    progress.observe(what)
    done = progress.run(argv, check=False)
    if done.returncode != 0:
        mismatched = envlock.hash_errors(done.stdout + done.stderr)
        raise HubError(
            f"{what} failed: "
            + (
                f"the bytes of {', '.join('=='.join(m) for m in mismatched)} differ from {OLAH_LOCK.name}'s sha256"
                if mismatched
                else (done.stderr or done.stdout).strip()[-2000:]
            ),
            hint="delete the cached wheels (the path above) and run again; if PyPI's files changed deliberately, "
            "refresh the lock with scripts/lock.sh",
        )


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@contextmanager
def olah(root: Path) -> Iterator[tuple[str, Path]]:
    """Serve `root/mirrors` with olah over https (a certificate from the site CA) on a free loopback
    port; yields the endpoint URL and the CA file that verifies it."""
    port = _free_port()
    (root / "repos").mkdir(parents=True, exist_ok=True)
    tls = site_ca.issue(root / "tls", ips=["127.0.0.1"])
    config = root / "olah.toml"
    config.write_text(
        olah_config(host="127.0.0.1", port=port, repos=str(root / "repos"), mirrors=str(root / "mirrors"), tls=True)
    )
    logs = root / "logs"
    logs.mkdir(exist_ok=True)
    argv = [str(olah_cli()), "-c", str(config), "--log-path", str(logs), "--ssl-key", str(tls.key)]
    with open(logs / "stdout.log", "wb") as out:
        process = subprocess.Popen([*argv, "--ssl-cert", str(tls.cert)], stdout=out, stderr=subprocess.STDOUT)
    url = f"https://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            try:
                httpx.get(f"{url}/api/models", timeout=1, verify=site_ca.trust(tls.ca))
                break
            except httpx.HTTPError:
                if process.poll() is not None:
                    raise HubError(f"olah exited: {(logs / 'stdout.log').read_text()[-2000:]}") from None
                time.sleep(0.3)
        yield url, tls.ca
    finally:
        process.terminate()
        process.wait(timeout=10)


# --------------------------------------------------------------------------- the hub's image


def _podman(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    done = progress.run([*hosts.PODMAN.split(), *args], check=False)  # its lines feed the current step
    if check and done.returncode != 0:
        raise HubError(f"podman {args[0]} failed: {done.stderr.strip()[-2000:]}")
    return done


def olah_wheels() -> Path:
    """olah and its dependencies as wheels for the image's Python (cp311, bookworm's glibc),
    exactly locks/hub-olah.txt's (hashes checked), downloaded once into the cache with that lock
    beside them as requirements.lock: the hub's image is built without network."""
    lock_key = sha256_file(OLAH_LOCK, follow=True)[:12]
    wheels = cache_dir() / f"olah-{OLAH_VERSION}-wheels-cp311-{WHEEL_PLATFORMS[0]}-{lock_key}"
    with exclusive(wheels.name):  # another run on this machine may be downloading them now
        _download_olah_wheels(wheels)
    return wheels


def _download_olah_wheels(wheels: Path) -> None:
    if (wheels / ".complete").exists():
        return
    tmp = Path(tempfile.mkdtemp(prefix=f".{wheels.name}-", dir=wheels.parent))
    try:
        _pip_locked(
            [sys.executable, "-m", "pip", "download", "-q", "--require-hashes", "--no-deps", "--only-binary=:all:",
             "--python-version", "3.11", "--implementation", "cp", "--abi", "cp311",
             *(a for p in WHEEL_PLATFORMS for a in ("--platform", p)), "-d", str(tmp),
             "--requirement", str(OLAH_LOCK)],
            what=f"downloading olah {OLAH_VERSION}'s locked wheels (the hub's image is built from them, once; "
            "PyPI must be reachable)",
        )  # fmt: skip
        shutil.copyfile(OLAH_LOCK, tmp / "requirements.lock")
        (tmp / ".complete").touch()
        shutil.rmtree(wheels, ignore_errors=True)
        os.rename(tmp, wheels)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def hub_image() -> str:
    """The hub's image, `IMAGE:<key>`: the Debian base with olah in /opt/olah, built once per
    base image and set of wheels (offline, `--network none`) and reused afterwards."""
    base = hosts.debootstrap_image("bookworm", BASE_PACKAGES, BASE_NAME)
    wheels = olah_wheels()
    names = sorted(p.name for p in wheels.glob("*.whl"))
    locked = sha256_file(wheels / "requirements.lock", follow=True)
    key = hashlib.sha256(json.dumps([base, names, locked]).encode()).hexdigest()[:10]
    image = f"{IMAGE}:{key}"
    if hosts.image_exists(image):
        return image
    builder = f"specdeploy-hub-build-{key}"
    _podman("rm", "-f", "-t", "0", builder, check=False)
    try:
        progress.observe(f"installing olah {OLAH_VERSION} into {base} (offline, from its locked wheels)")
        _podman(
            "run", "--name", builder, "--network", "none", *hosts.RUN_FLAGS, "-v", f"{wheels}:/wheels:ro", base,
            "sh", "-c",
            "python3 -m venv /opt/olah && /opt/olah/bin/pip install -q --require-hashes --no-index --no-deps "
            "--find-links /wheels --requirement /wheels/requirements.lock",
        )  # fmt: skip
        _podman("commit", "-q", builder, image)
    finally:
        _podman("rm", "-f", "-t", "0", builder, check=False)
    return image


# --------------------------------------------------------------------------- the hub


def ensure_network() -> None:
    """Podman network NETWORK on SUBNET, created when missing (one with another subnet is refused)."""
    if _podman("network", "exists", NETWORK, check=False).returncode != 0:
        _podman("network", "create", "--subnet", SUBNET, NETWORK)
        return
    subnets = _podman("network", "inspect", "--format", "{{range .Subnets}}{{.Subnet}} {{end}}", NETWORK).stdout
    if SUBNET not in subnets.split():
        raise HubError(
            f"podman network {NETWORK} exists with subnet {subnets.strip() or '?'}, not {SUBNET}",
            hint=f"remove it (podman network rm {NETWORK}) once no container uses it; it is recreated as needed",
        )


@dataclass(frozen=True)
class Hub:
    name: str
    endpoint_in_network: str  # for the rehearsal's hosts on NETWORK
    endpoint_local: str  # for the controller
    commits: dict[str, str]  # repository -> the commit its main branch is at
    workdir: Path
    ca: Path  # the site CA that signed the hub's certificate (both endpoints are https://)

    def logs(self) -> str:
        """The proxy's request lines and olah's output (`podman logs`), then olah's log files."""
        done = _podman("logs", self.name, check=False)
        files = sorted(p for p in (self.workdir / "logs").rglob("*") if p.is_file())
        return "\n".join([done.stdout + done.stderr, *(p.read_text(errors="replace") for p in files)])


def _fingerprint(
    image: str, mirrors: Path, token_file: Path, workdir: Path, gated: Sequence[str], port: int, cert: bytes
) -> str:
    """What makes two hubs the same: the token file by identity, not content (no value
    derived from the token is ever stored in the container's metadata)."""
    token = token_file.stat()
    parts = [
        image, str(mirrors), str(token_file), token.st_ino, token.st_mtime_ns, token.st_size, str(workdir),
        sorted(gated), port, hashlib.sha256(Path(gating.__file__).read_bytes()).hexdigest(),
        hashlib.sha256(cert).hexdigest(),
    ]  # fmt: skip
    return hashlib.sha256(json.dumps(parts).encode()).hexdigest()[:16]


def start_hub(
    mirrors: Path,
    token_file: Path,
    workdir: Path,
    *,
    gated: Sequence[str],
    name: str = HUB_NAME,
    port: int = HUB_PORT,
) -> Hub:
    """Serve `mirrors` with olah behind the gating proxy (`gated` repositories need the token in
    `token_file`) in container `name`; a running one with the same settings is reused."""
    mirrors, token_file, workdir = mirrors.resolve(), token_file.resolve(), workdir.resolve()
    image = hub_image()
    ensure_network()
    tls = site_ca.issue(workdir / "tls", ips=[HUB_IP, "127.0.0.1"])
    fingerprint = _fingerprint(image, mirrors, token_file, workdir, gated, port, tls.cert.read_bytes())
    served = Hub(
        name, f"https://{HUB_IP}:{HUB_PORT}", f"https://127.0.0.1:{port}", served_commits(mirrors), workdir, tls.ca
    )
    if not served.commits:
        raise HubError(f"{mirrors} holds no repository under models/<org>/<name>", hint="run mirror_fixtures first")
    token = token_file.read_text().strip()
    state = _podman(
        "inspect", "--format", f'{{{{index .Config.Labels "{_LABEL}"}}}} {{{{.State.Running}}}}', name, check=False
    )
    if state.stdout.split() == [fingerprint, "true"] and _ready(served, token, timeout=5):
        return served
    _podman("rm", "-f", "-t", "0", name, check=False)
    (workdir / "logs").mkdir(parents=True, exist_ok=True)
    (workdir / "olah.toml").write_text(olah_config(host="127.0.0.1", port=_OLAH_PORT, repos=_REPOS, mirrors=_MIRRORS))
    proxy = [
        "python3", _GATING, "--listen", f"0.0.0.0:{HUB_PORT}", "--upstream", f"http://127.0.0.1:{_OLAH_PORT}",
        "--token-file", _TOKEN, *(arg for repo in gated for arg in ("--gated", repo)),
        "--tls-cert", _TLS_CERT, "--tls-key", _TLS_KEY,
    ]  # fmt: skip
    script = f"/opt/olah/bin/olah-cli -c {_CONFIG} --log-path {_LOGS} & exec {shlex.join(proxy)}"
    started = _podman(
        "run", "-d", "--name", name, "--hostname", name, "--label", f"{_LABEL}={fingerprint}",
        *hosts.Network(NETWORK, HUB_IP).run_flags(), "-p", f"127.0.0.1:{port}:{HUB_PORT}", *hosts.RUN_FLAGS,
        "--tmpfs", _REPOS,
        "-v", f"{mirrors}:{_MIRRORS}:ro", "-v", f"{token_file}:{_TOKEN}:ro",
        "-v", f"{workdir / 'olah.toml'}:{_CONFIG}:ro", "-v", f"{gating.__file__}:{_GATING}:ro",
        "-v", f"{tls.cert}:{_TLS_CERT}:ro", "-v", f"{tls.key}:{_TLS_KEY}:ro",
        "-v", f"{workdir / 'logs'}:{_LOGS}",
        image, "sh", "-c", script,
        check=False,
    )  # fmt: skip
    if started.returncode != 0:
        raise HubError(
            f"could not start hub {name}: {started.stderr.strip()[-2000:]}",
            hint=f"is 127.0.0.1:{port}, or {HUB_IP} on network {NETWORK}, held by another container?",
        )
    with progress.step(f"hub {name}: waiting until it serves"):
        ready = _ready(served, token, timeout=60)
    if not ready:
        logs = served.logs()
        stop_hub(name)
        raise HubError(
            f"hub {name} did not serve {next(iter(served.commits))} on {served.endpoint_local} within 60s:\n"
            + logs[-3000:],
            hint="the output above is the proxy's and olah's: a mirror olah cannot read (no commit, a missing "
            "LFS object) is named there",
        )
    return served


def _ready(served: Hub, token: str, *, timeout: float) -> bool:
    """Whether the proxy answers with olah's view of the first repository (token sent, in case it is gated)."""
    repo, commit = next(iter(served.commits.items()))
    url = f"{served.endpoint_local}/api/models/{repo}/revision/{commit}"
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            bearer = {"Authorization": f"Bearer {token}"}
            answer = httpx.get(url, headers=bearer, timeout=2, verify=site_ca.trust(served.ca))
            if answer.status_code == 200:
                return True
            progress.observe(f"{url}: HTTP {answer.status_code}")
        except httpx.HTTPError as exc:
            progress.observe(f"{url}: {type(exc).__name__}")
        if _podman("inspect", "--format", "{{.State.Running}}", served.name, check=False).stdout.strip() != "true":
            return False
        time.sleep(0.3)
    return False


def stop_hub(name: str = HUB_NAME) -> None:
    """Remove the hub's container (the network stays: the rehearsal's hosts may be on it)."""
    _podman("rm", "-f", "-t", "0", name, check=False)


@contextmanager
def serve_hub(
    mirrors: Path,
    token_file: Path,
    workdir: Path,
    *,
    gated: Sequence[str],
    name: str = HUB_NAME,
    port: int = HUB_PORT,
) -> Iterator[Hub]:
    """start_hub for the duration of a `with` block; the container is removed at its end."""
    try:
        yield start_hub(mirrors, token_file, workdir, gated=gated, name=name, port=port)
    finally:
        stop_hub(name)


def mirrors() -> Path:
    """Where the hub's fixture repositories are kept (in the cache, across runs)."""
    return cache_dir() / "hub" / "mirrors"


@contextmanager
def hub(
    *,
    token: str,
    gated: Sequence[str] | None = None,
    repos: Collection[str] | None = None,
    name: str = HUB_NAME,
    port: int = HUB_PORT,
) -> Iterator[Hub]:
    """The rehearsal's hub for the duration of a `with` block: the fixture models (mirror_fixtures,
    kept in the cache across runs; `repos`: at least those, the others not built), all gated unless
    `gated` names others, served to holders of `token` — written to a private temporary file,
    removed at the end."""
    root = cache_dir() / "hub"
    commits = mirror_fixtures(mirrors(), repos)
    with tempfile.TemporaryDirectory(prefix="specdeploy-hub-token-") as secrets:
        token_file = Path(secrets) / "token"
        token_file.touch(mode=0o600)
        token_file.write_text(token + "\n")
        chosen = list(commits) if gated is None else gated
        with serve_hub(mirrors(), token_file, root / name, gated=chosen, name=name, port=port) as served:
            yield served
