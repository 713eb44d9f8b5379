"""`specdeploy fetch` with a token, as production fetches: the real CLI in its own process
(the token on its standard input, as Ansible hands it over) and the real huggingface_hub
client, against the rehearsal's hub — olah in its own podman container on the rehearsal's
network, serving the fixture models as git repos with LFS, behind the gating proxy.

Real: the container, the network, olah, every HTTP exchange, the client's GatedRepoError and
the CLI's error boundary. A stand-in: the gating (olah has none), a proxy answering as
huggingface.co answers (401, `X-Error-Code: GatedRepo`) — what would otherwise first fail on
a real host with an expired token or one that has not accepted the repository's conditions.
"""

from __future__ import annotations

import json
import os
import re
import secrets
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from specdeploy.profile import load_profile
from specdeploy.rehearsal import hosts, site_ca, variants
from specdeploy.rehearsal import hub as rehearsal_hub

pytestmark = [pytest.mark.hub, pytest.mark.podman]

BASE = load_profile(variants.BASE)
TARGET = BASE.target.repo
DRAFTER = BASE.drafter.repo if BASE.drafter else ""
CANARY = f"hf_canary{secrets.token_hex(12)}"  # a new one each run: found anywhere, it leaked


@pytest.fixture(scope="module")
def hub(tmp_path_factory: pytest.TempPathFactory) -> Iterator[rehearsal_hub.Hub]:
    root = tmp_path_factory.mktemp("gated-hub")
    token = root / "token"
    token.write_text(CANARY + "\n")
    token.chmod(0o600)
    rehearsal_hub.mirror_fixtures(root / "mirrors")
    with rehearsal_hub.serve_hub(root / "mirrors", token, root / "hub", gated=[DRAFTER]) as served:
        yield served


def _fetch(hub: rehearsal_hub.Hub, tmp_path: Path, *extra: str, stdin: str = "") -> subprocess.CompletedProcess[str]:
    """The installed CLI fetching cpu-rehearsal pinned to the hub's commits, its drafter gated."""

    def pin(sha: str) -> dict[str, str]:
        return {"value": sha, "provenance": "rehearsal", "source": "fixture repo served by the rehearsal's hub"}

    patch = {
        "target": {"revision": pin(hub.commits[TARGET])},
        "drafter": {"revision": pin(hub.commits[DRAFTER]), "gated": True},
    }
    profile = variants.materialize(variants.derive(BASE, "cpu-rehearsal-gated", patch), tmp_path / "p")
    env = {k: v for k, v in os.environ.items() if k != "HF_TOKEN"} | {"HF_HOME": str(tmp_path / "hf-home")}
    return subprocess.run(
        [sys.executable, "-m", "specdeploy", "fetch", str(tmp_path / "models"), "--profile", str(profile),
         "--lock", str(tmp_path / "specdeploy.lock"), "--endpoint", hub.endpoint_local, "--ca-file", str(hub.ca),
         *extra],
        input=stdin, capture_output=True, text=True, env=env, timeout=300,
    )  # fmt: skip


def test_without_a_token_the_gated_drafter_is_refused_with_a_message(hub: rehearsal_hub.Hub, tmp_path: Path) -> None:
    """No token (none in the environment or HF_HOME either): the proxy's 401 `GatedRepo` becomes
    the client's GatedRepoError and the CLI's refusal naming the repository, exit 1."""
    done = _fetch(hub, tmp_path)
    assert done.returncode == 1, done.stdout + done.stderr
    assert f"{DRAFTER} is gated" in done.stderr
    assert "Traceback" not in done.stdout + done.stderr
    assert re.search(rf'"(GET|HEAD) /api/models/{DRAFTER}/\S+ HTTP/1.1" 401', hub.logs())


def test_with_the_token_on_stdin_the_fetch_succeeds_and_verifies_every_file(
    hub: rehearsal_hub.Hub, tmp_path: Path
) -> None:
    """The token on standard input, as Ansible passes it: both repos come through the proxy and
    every file is checked against the commit's hashes (LFS sha256, git blob ids)."""
    done = _fetch(hub, tmp_path, "--token-stdin", "--json", stdin=CANARY + "\n")
    assert done.returncode == 0, done.stderr
    results = {r["repo"]: r for r in json.loads(done.stdout)}
    assert set(results) == {TARGET, DRAFTER}
    for repo, result in results.items():
        assert result["files"] > 2 and result["verified"] == result["files"], result
        assert result["revision"] == hub.commits[repo] and result["recorded_in_lock"]
        assert (Path(result["directory"]) / "model.safetensors").is_file()


def test_the_rehearsals_hosts_reach_the_hub_at_its_address_on_their_network(hub: rehearsal_hub.Hub) -> None:
    """From another container on the rehearsal's network (where its hosts are): the target is
    served and the gated drafter refused, at endpoint_in_network."""
    probe = (
        "import ssl, sys, urllib.error, urllib.request\n"
        "trusted = ssl.create_default_context(cafile='/ca.crt')\n"
        "for url in sys.argv[1:]:\n"
        "    try: print(urllib.request.urlopen(url, timeout=10, context=trusted).status)\n"
        "    except urllib.error.HTTPError as e: print(e.code, e.headers['X-Error-Code'])\n"
        "    except Exception as e: print('refused', type(e).__name__)\n"
        "try: urllib.request.urlopen(sys.argv[1], timeout=10); print('served without the CA')\n"
        "except Exception as e: print('untrusted', type(e).__name__)\n"
    )
    assert hub.endpoint_in_network.startswith("https://")
    urls = [f"{hub.endpoint_in_network}/api/models/{repo}/revision/{hub.commits[repo]}" for repo in (TARGET, DRAFTER)]
    plain = urls[0].replace("https://", "http://")  # the same port in clear: no answer in clear
    done = subprocess.run(
        [*hosts.PODMAN.split(), "run", "--rm", "--network", rehearsal_hub.NETWORK, *hosts.RUN_FLAGS,
         "-v", f"{hub.ca}:/ca.crt:ro", rehearsal_hub.hub_image(), "python3", "-c", probe, *urls, plain],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    lines = done.stdout.split("\n")
    assert lines[:2] == ["200", "401 GatedRepo"] and lines[2].startswith("refused"), done.stdout + done.stderr
    assert lines[3].startswith("untrusted"), done.stdout  # a client without the site CA gets nothing


def test_the_same_fixtures_give_the_same_commits(hub: rehearsal_hub.Hub, tmp_path: Path) -> None:
    """Built anew elsewhere, and again where they already are: fixed dates, no history."""
    fresh = rehearsal_hub.mirror_fixtures(tmp_path / "mirrors")
    assert fresh == rehearsal_hub.mirror_fixtures(tmp_path / "mirrors") == hub.commits
    history = rehearsal_hub.git(tmp_path / "mirrors" / "models" / TARGET, "log", "--format=%aI %cI")
    assert history == "2026-01-01T00:00:00+00:00 2026-01-01T00:00:00+00:00"  # one commit, at the fixed date


def test_the_token_is_in_no_log_and_not_in_the_containers_settings(hub: rehearsal_hub.Hub) -> None:
    """After a refused and an accepted request for the gated drafter (besides the fetches above)."""
    url = f"{hub.endpoint_local}/api/models/{DRAFTER}/revision/{hub.commits[DRAFTER]}"
    trusted = site_ca.trust(hub.ca)
    assert httpx.get(url, headers={"Authorization": "Bearer hf_wrong"}, verify=trusted).status_code == 401
    assert httpx.get(url, headers={"Authorization": f"Bearer {CANARY}"}, verify=trusted).status_code == 200
    logs = hub.logs()
    assert f'/api/models/{DRAFTER}/revision/{hub.commits[DRAFTER]} HTTP/1.1" 200' in logs
    assert CANARY not in logs
    inspect = subprocess.run(["podman", "inspect", hub.name], capture_output=True, text=True, check=True).stdout
    assert json.loads(inspect)[0]["Config"]["Cmd"] and CANARY not in inspect
