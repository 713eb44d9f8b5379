"""A real hub-compatible server for the weights tests: olah (PyPI) serving local git repos
(LFS objects built by Debian's git-lfs) to the real huggingface_hub client, offline
(docs/sources.md#olah). olah runs from its own venv in the cache: its pins differ from vLLM's."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx

from specdeploy.core.cache import cache_dir

OLAH_VERSION = "0.5.4"
_GIT_ENV = {
    "GIT_AUTHOR_NAME": "fixture",
    "GIT_AUTHOR_EMAIL": "f@x",
    "GIT_COMMITTER_NAME": "fixture",
    "GIT_COMMITTER_EMAIL": "f@x",
}


def olah_cli() -> Path:
    venv = cache_dir() / f"olah-{OLAH_VERSION}"
    cli = venv / "bin" / "olah-cli"
    if not (venv / ".complete").exists():
        subprocess.run([sys.executable, "-m", "venv", "--clear", str(venv)], check=True)
        subprocess.run([str(venv / "bin" / "pip"), "install", "-q", f"olah=={OLAH_VERSION}"], check=True)
        (venv / ".complete").touch()
    return cli


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


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@contextmanager
def olah(root: Path) -> Iterator[str]:
    """Serve `root/mirrors` with olah on a free loopback port; yields the endpoint URL."""
    port = _free_port()
    (root / "repos").mkdir(parents=True, exist_ok=True)
    config = root / "olah.toml"
    config.write_text(
        "[basic]\n"
        f'host = "127.0.0.1"\nport = {port}\n'
        f'repos-path = "{root / "repos"}"\n'
        'hf-scheme = "http"\nhf-netloc = "127.0.0.1:9"\nhf-lfs-netloc = "127.0.0.1:9"\n'
        f'mirror-scheme = "http"\nmirror-netloc = "127.0.0.1:{port}"\nmirror-lfs-netloc = "127.0.0.1:{port}"\n'
        f'mirrors-path = ["{root / "mirrors"}"]\n'
        "[accessibility]\noffline = true\n"
    )
    logs = root / "logs"
    logs.mkdir(exist_ok=True)
    with open(logs / "stdout.log", "wb") as out:
        process = subprocess.Popen(
            [str(olah_cli()), "-c", str(config), "--log-path", str(logs)], stdout=out, stderr=subprocess.STDOUT
        )
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            try:
                httpx.get(f"{url}/api/models", timeout=1)
                break
            except httpx.HTTPError:
                if process.poll() is not None:
                    raise RuntimeError((logs / "stdout.log").read_text()[-2000:]) from None
                time.sleep(0.3)
        yield url
    finally:
        process.terminate()
        process.wait(timeout=10)
