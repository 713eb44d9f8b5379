"""The host migration runbook end to end (`specdeploy migrate`, docs/migration.md), on disposable
test hosts over real SSH, with real engines and a real balancer:

- OLD: the container rehearsal's trixie host (tests/support/container_rig.py), as
  test_container_rehearsal.py leaves it — cpu-rehearsal-container under quadlet, its image pulled
  by digest from the site registry, weights from the gated hub, an API key;
- NEW: a second trixie host of the same image, on the same test network, empty;
- FRONT: a bookworm host with Debian's HAProxy (`deploy.yml` installs the front there: TLS with a
  site certificate, the /v1 allow-list, the runtime socket), its port 8443 published on the
  controller's loopback, where the load client stands.

One chain, each test starting from what the previous left:
1. the front is deployed and OLD re-deployed through it (its engine on loopback, its listener on its
   internal address, mutual TLS), behind it; NEW is in the front in maint; the front refuses /metrics,
   /tokenize and /invocations (which OLD's engine serves) and passes the client's key through to the
   engine; from NEW, every route of OLD's engine is refused, and a capture of the network shows no key;
2. `migrate plan` reads OLD's verified gate, golden, profile and identity, and runs deploy.yml's
   preflight stage on NEW for OLD's profile (first refused: a program holds the engine's port);
3. `migrate prepare` is interrupted (a seeded file's path on NEW taken by a directory, as a full
   disk would stop it), then resumed: the files already verified are not copied again;
4. NEW made to serve another engine version — its image rebuilt on NEW with vLLM's version
   string changed to 0.31.0, so its `/version` really differs — stops at `migrate verify` with a
   report naming both versions, and the front never sent NEW a request;
5. NEW fixed by `migrate prepare --image-from-old` (NEW stripped of the profile's image name first:
   OLD's image saved on OLD, seeded to NEW, loaded by the images role), `migrate verify` passes;
6. `migrate cutover` under load through the front (bounded streaming requests, at least 2 in
   flight at every instant — measured from the requests' own start and end times —, eight at a
   time, each decoding longer than the step takes to reach its drain): failed = 0, OLD had requests
   in flight when drained;
7. `migrate rollback` under load: failed = 0; then `migrate cutover` again (OLD kept as a backup server);
   NEW's engine killed under load: every request started after the kill is served, by OLD's backup;
8. a rolling deploy of both hosts (`serial: 1`, a change that restarts each engine) through the
   front under the same load: failed = 0;
9. `migrate finish --stop-old` after the soak: OLD's engine stopped by decommission.yml, its
   weights and state kept;
10. NEW, serving alone, switched to the main job's profile (cpu-rehearsal-smollm2: the real model and its
   drafter, the gated hub, the same play): CI's one deploy of the real model and its gate.
Traffic stays on the test hosts' own network and the controller's loopback.
Steps 1-9 serve the tiny fixtures (cpu-rehearsal-container): they prove the plumbing — drains, moves,
seeding, the front — at a speed a CI run allows, not what the answers say; step 10 judges a model that
speaks.
"""

from __future__ import annotations

import json
import re
import secrets
import shlex
import ssl
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest
from tests.support import container_rig
from tests.support.container_rig import API_KEY, PROFILE, Rig

from specdeploy.core import layout, progress
from specdeploy.core.keeper import new_run_id
from specdeploy.front import haproxy
from specdeploy.images.build import image_tag
from specdeploy.migrate import load
from specdeploy.profile import load_profile
from specdeploy.profile.lock import Lock
from specdeploy.rehearsal import deploy, engine_image, hosts, hub, migration, variants
from specdeploy.smoke.transcript import golden_tokens

pytestmark = [
    pytest.mark.testhost,
    pytest.mark.vllm,
    pytest.mark.podman,
    pytest.mark.hub,
]
OLD_IP = container_rig.HOST_IP
NEW_NAME = migration.NEW_NAME
# a loaded move sends at most LOAD_REQUESTS, stops when the step ends, and must have sent LOAD_MIN_SENT
LOAD_REQUESTS, LOAD_MIN_SENT = migration.LOAD_MAX_REQUESTS, migration.LOAD_IN_FLIGHT + 4  # more than the first wave
ROLLING_MIN_SENT = 48  # a rolling deploy of two hosts takes minutes: hundreds of streams go through the front
# The rolling deploy's load only has to keep streams going through the front for the whole play. With the
# chain's 16 streams of up to 448 tokens, each host's drain waited about 2 min for its streams, and 16
# streams decoded for 12 min slowed both workers' engines (issue 37, item 5: the test took 730 s).
ROLLING_LOAD = {"in_flight": 4, "max_tokens": 128}
OTHER_IMAGE = "localhost/specdeploy-test/vllm-other:0.31"
TAG = image_tag(load_profile(PROFILE))  # the engine image's name the profile gives it on every host


@dataclass
class Site(migration.Move):
    rig: Rig | None = None
    pem: Path | None = None

    def play(self, limit: str, *extra: str, **_: object) -> progress.Timed:
        """deploy.yml as the site runs it, with the rig's pinned profile."""
        assert self.rig is not None
        return super().play(limit, *extra, profile=PROFILE, profiles=self.rig.profiles)

    def migrate(self, step: str, *extra: str) -> tuple[int, dict]:
        return self.step(step, *extra)

    def load_spec(self, total: int = LOAD_REQUESTS, **shape: int) -> load.LoadSpec:
        """The chain's load through the front; `shape` (in_flight, max_tokens) as migration.load_spec."""
        assert self.pem is not None
        return migration.load_spec(load_profile(PROFILE), api_key=API_KEY, ca_file=self.pem, total=total, **shape)

    def load(self, total: int = LOAD_REQUESTS, **shape: int) -> load.Load:
        return load.Load(self.load_spec(total, **shape))


@pytest.fixture(scope="module")
def site(container_rig: Rig, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Site]:
    work = tmp_path_factory.mktemp("migration")
    new, front = migration.start_hosts(work, hub.NETWORK)
    try:
        pem = migration.front_certificate(work, ("127.0.0.1", migration.FRONT_IP))
        # the site directory of the container rehearsal's plays: its lock (the image's digest) and vault
        inventory = migration.write_inventory(
            container_rig.logs.parent, old=container_rig.host, old_ip=OLD_IP, new=new, front=front,
            profile=PROFILE, cert=pem,
        )  # fmt: skip
        args = migration.site_deploy_args(
            wheels=container_rig.wheels, registry=container_rig.site.address, ca=container_rig.site.ca,
            hub_endpoint=container_rig.served.endpoint_in_network,
        )  # fmt: skip
        yield Site(
            inventory, container_rig.host, new, front, container_rig.vault.password_file, args, work / "logs",
            rig=container_rig, pem=pem,
        )  # fmt: skip
    finally:
        hosts.stop(migration.FRONT_NAME)
        hosts.stop(migration.NEW_NAME)
        container_rig.host.ssh(f"systemctl stop {layout.UNIT_NAME}", check=False)


def test_the_front_is_deployed_and_old_serves_through_it_with_new_kept_out(site: Site) -> None:
    front = site.play(migration.FRONT_NAME)
    assert front.returncode == 0, front.stdout[-5000:]
    old = site.play(site.old.name)  # OLD now publishes on its internal address, drained and put back
    assert old.returncode == 0, old.stdout[-5000:]
    servers = site.front_status()
    assert servers[site.old.name]["state"] == "ready" and servers[site.new.name]["state"] == "maint"
    with site.load(total=4) as running:
        result = running.finish(300)
    assert result.failed == 0 and result.ok == 4, result.to_json()
    # the master (root: it binds 443 and reads the key) and its worker, which parses every request, as haproxy
    ps = site.front.ssh("ps -o user=,ppid=,pid= -C haproxy").stdout.split("\n")
    rows = [line.split() for line in ps if line.strip()]
    master = next(r for r in rows if r[0] == "root")
    assert [r[0] for r in rows if r[1] == master[2]] == ["haproxy"], rows


def test_the_deployed_front_serves_only_v1_and_health_and_passes_the_client_s_key_to_the_engine(
    site: Site,
) -> None:
    """The front deploy.yml installed, not a local HAProxy: /metrics, /tokenize and /invocations,
    which OLD's engine itself answers on OLD's loopback, are refused at the front (403, its
    own body); /v1/models answers with the client's key and is refused by the
    engine (401) without one, so the key passes through the front unchanged, and /health answers."""
    profile = load_profile(PROFILE)
    port = profile.engine.serve.port  # the engine on OLD's loopback; its listener on OLD_IP
    direct = site.old.ssh(
        "python3 -c 'import urllib.request as u; "
        f'print(u.urlopen("http://127.0.0.1:{port}/metrics", timeout=30).status)\''
    )
    assert direct.stdout.strip() == "200", direct.stderr  # the engine serves /metrics itself ...
    with httpx.Client(
        base_url=f"https://127.0.0.1:{profile.front.listen_port}",
        verify=ssl.create_default_context(cafile=site.pem),
        timeout=60,
    ) as client:
        for method, path in (("GET", "/metrics"), ("POST", "/tokenize"), ("POST", "/invocations")):
            refused = client.request(method, path, headers={"Authorization": f"Bearer {API_KEY}"}, json={})
            assert refused.status_code == 403 and refused.text == haproxy.DENY_BODY, (path, refused.text)
        keyed = client.get("/v1/models", headers={"Authorization": f"Bearer {API_KEY}"})
        assert keyed.status_code == 200 and keyed.json()["data"], keyed.text
        assert client.get("/v1/models").status_code == 401  # ... the engine, not the front, checks the key
        wrong = client.get("/v1/models", headers={"Authorization": "Bearer not-the-key"})
        assert wrong.status_code == 401
        assert client.get("/health").status_code == 200


# From another host of the internal network: each route of the engine's own table (read from the engine,
# on its host's loopback), tried in plain HTTP and over TLS without a client certificate; prints one line
# per route and try: "ROUTE KIND refused|answered ...".
_TRY_ROUTES = r"""
import http.client, json, socket, ssl, sys
host, port, routes = sys.argv[1], int(sys.argv[2]), json.loads(sys.argv[3])
def plain(path):
    with socket.create_connection((host, port), timeout=10) as s:
        s.sendall(("GET %s HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer stolen\r\n\r\n" % path).encode())
        s.settimeout(10)
        try:
            data = s.recv(4096)
        except OSError as e:
            return "refused " + type(e).__name__
        return ("answered " + data[:40].decode(errors="replace")) if data.startswith(b"HTTP/") else "refused no HTTP"
def tls(path):
    c = ssl.create_default_context(); c.check_hostname = False; c.verify_mode = ssl.CERT_NONE
    conn = http.client.HTTPSConnection(host, port, context=c, timeout=10)
    try:
        conn.request("GET", path); return "answered %d" % conn.getresponse().status
    except (OSError, ssl.SSLError, http.client.HTTPException) as e:
        return "refused " + type(e).__name__
    finally:
        conn.close()
for route in routes:
    path = route.replace("{", "").replace("}", "")
    print(route, "plain", plain(path)); print(route, "tls", tls(path))
"""


def _bridge(network: str) -> str:
    """The podman network's bridge on this machine, which carries the test hosts' traffic."""
    shown = subprocess.run(
        ["podman", "network", "inspect", network, "--format", "{{.NetworkInterface}}"],
        capture_output=True, text=True, check=True,
    )  # fmt: skip
    return shown.stdout.strip()


def test_from_another_host_every_engine_route_is_refused_and_the_key_crosses_the_network_only_encrypted(
    site: Site,
) -> None:
    """Issue 35, items 2 and 3. OLD's engine listens on OLD's loopback; its listener takes OLD_IP for
    the front alone (mutual TLS). From NEW, another host of the internal network (not the front), every
    route of the engine's own table — read from the engine's OpenAPI document on OLD's loopback,
    /invocations, /tokenize and /metrics among them — is refused, in plain HTTP and over TLS without the
    front's certificate. Through the front with the key the API works, and a capture of the network's
    bridge during that request holds no byte of the key between the front and OLD; the same capture
    does see a marker NEW sends OLD in clear (proof that it reads what the bridge forwards between two
    hosts)."""
    from tests.support.capture import Capture, capturing

    port = load_profile(PROFILE).engine.serve.port
    openapi = f"http://127.0.0.1:{port}/openapi.json"
    table = site.old.ssh(
        "python3 -c 'import json, urllib.request as u; "
        f'print(json.dumps(sorted(json.load(u.urlopen("{openapi}", timeout=30))["paths"])))\''
    )
    # the schema's routes, and the documentation routes FastAPI keeps out of it
    routes = sorted(set(json.loads(table.stdout)) | {"/openapi.json", "/docs", "/redoc"})
    assert {"/invocations", "/tokenize", "/metrics", "/v1/chat/completions"} <= set(routes), routes
    tried = site.new.ssh(f"python3 -c {shlex.quote(_TRY_ROUTES)} {OLD_IP} {port} {shlex.quote(json.dumps(routes))}")
    lines = tried.stdout.splitlines()
    assert len(lines) == 2 * len(routes), tried.stdout[-3000:] + tried.stderr[-2000:]
    answered = [line for line in lines if " answered" in line]
    assert answered == [], answered
    # the engine port on OLD_IP is its listener's (HAProxy's process)
    listening = site.old.ssh(f"ss -Hltnp 'sport = :{port}'").stdout
    assert f"{OLD_IP}:{port}" in listening and "haproxy" in listening, listening
    marker = f"clear-marker-{secrets.token_hex(8)}".encode()
    with capturing(_bridge(hub.NETWORK)) as capture:
        with httpx.Client(
            base_url=f"https://127.0.0.1:{load_profile(PROFILE).front.listen_port}",
            verify=ssl.create_default_context(cafile=site.pem),
            timeout=120,
        ) as client:
            answer = client.post(
                "/v1/chat/completions",
                headers={"Authorization": f"Bearer {API_KEY}"},
                json={"model": load_profile(PROFILE).engine.serve.served_model_name,
                      "messages": [{"role": "user", "content": "capture"}], "max_tokens": 4},
            )  # fmt: skip
        # from NEW to OLD, in clear (the discard port): a frame the bridge forwards between two of its
        # hosts, as it forwards the front's to OLD
        site.new.ssh(
            "python3 -c 'import socket; "
            f'socket.socket(socket.AF_INET, socket.SOCK_DGRAM).sendto(b"{marker.decode()}", ("{OLD_IP}", 9))\''
        )
        time.sleep(0.5)
    assert answer.status_code == 200, answer.text
    hop = [s for s in capture.between(migration.FRONT_IP) if OLD_IP in (s.src, s.dst)]
    assert hop, f"nothing captured between the front and OLD ({capture.frames} frames)"
    assert Capture.holds(capture.between(OLD_IP), marker), "the capture did not see NEW's marker sent in clear"
    assert not Capture.holds(hop, API_KEY.encode())
    assert not Capture.holds(hop, b"capture")


def test_plan_reads_old_s_verified_gate_golden_and_identity_and_preflights_new(site: Site) -> None:
    """NEW is checked against OLD's profile by deploy.yml's own preflight stage: with another program
    on the engine's port there, plan stops naming the check and the program; once it is gone, plan
    passes and records NEW's preflight. OLD's golden transcript is put aside first (as on a host
    whose verified run predates goldens): plan records one from OLD's own engine, which answers as
    the one its gate kept (verify later compares NEW with it)."""
    port = load_profile(PROFILE).engine.serve.port
    site.new.ssh(f"systemd-run --unit=squatter python3 -m http.server {port} --bind 0.0.0.0")
    try:
        code, out = site.migrate("plan")
    finally:
        site.new.ssh("systemctl stop squatter", check=False)
    assert code == 1 and f"{NEW_NAME} cannot run {PROFILE}" in out["stderr"], out
    assert f"port: {port} in use by pid" in out["stderr"] and "http.server" in out["stderr"], out["stderr"][-2000:]
    assert site.record()["steps"]["plan"]["status"] == "failed"
    host = layout.HostLayout()
    key = json.loads(site.old.ssh(f"cat {host.verified}/gate.json").stdout)["golden"]["key"]
    goldens = host.golden
    site.old.ssh(f"mkdir -p /root/golden-aside && mv {goldens}/{key}.json /root/golden-aside/")
    code, out = site.migrate("plan")
    assert code == 0, out
    details = out["details"]
    assert details["identity_key"] == key and details["golden_recorded"] == f"{goldens}/{key}.json", details
    recorded, kept = (json.loads(site.old.ssh(f"cat {d}/{key}.json").stdout) for d in (goldens, "/root/golden-aside"))
    assert recorded["identity_key"] == kept["identity_key"] == key
    prefix = kept["prefix_tokens"]  # the gate's own comparison: each prompt's first tokens
    assert recorded["outputs"].keys() == kept["outputs"].keys()
    assert {p: golden_tokens(text)[:prefix] for p, text in recorded["outputs"].items()} == {
        p: golden_tokens(text)[:prefix] for p, text in kept["outputs"].items()
    }
    assert details["new_preflight"]["passed"] is True
    assert details["profile"] == PROFILE and details["files"] >= 4 and details["bytes_to_copy"] > 0
    assert set(details["revisions"]) == {"target", "drafter"} and details["expected_downtime"].startswith("none")


def test_an_interrupted_prepare_resumes_without_copying_verified_files_again(site: Site) -> None:
    plan = site.record()["steps"]["plan"]["details"]
    # the path of the drafter's config.json's partial copy on NEW, taken by a directory
    drafter_rev = plan["revisions"]["drafter"]
    drafter = load_profile(PROFILE).drafter
    assert drafter is not None
    blocked = f"{plan['models_new']}/{drafter.repo}/{drafter_rev}/config.json.seed-part"
    site.new.ssh(f"mkdir -p {blocked}")
    code, out = site.migrate("prepare")
    assert code == 1 and "config.json" in out["stderr"] and "are in place and verified" in out["stderr"], out
    first = site.record()["steps"]["prepare"]
    assert first["status"] == "failed"
    site.new.ssh(f"rmdir {blocked}")
    code, out = site.migrate("prepare")
    assert code == 0, out
    # no silent minutes (issue 37): the seed's copies and NEW's play said at least every 30 s what they did
    assert site.silences["prepare"] < progress.MAX_SILENCE_S, out["stderr"][-3000:]
    # one line per period for the whole step, naming what runs inside it (here NEW's play and its task)
    ticked = re.search(r"migrate prepare: (\d+m)?\d+s, last: deploy\.yml -l [\w-]+: ", out["stderr"])
    assert ticked, out["stderr"][-3000:]
    seeded = out["details"]["seed"]
    assert seeded["already_verified"] >= 1 and seeded["copied"] >= 1, seeded
    # the target's files, all in place before the interruption, are only verified again: no byte copied
    target = [f for f in seeded["files"] if "tiny-qwen3/" in f["path"]]
    assert target and all(f["action"] == "already verified" and f["bytes_copied"] == 0 for f in target), seeded
    assert site.front_status()[site.new.name]["state"] == "maint"


def test_new_serving_another_engine_version_stops_at_verify_and_gets_no_traffic(site: Site) -> None:
    """NEW's engine image rebuilt on NEW from the one it runs, with vLLM's version string changed to
    0.31.0 (vllm/_version.py): its `/version` really says 0.31.0. The quadlet is pointed at it and the
    engine restarted, as a hand-patched host would be."""
    unit = layout.UNIT_FILES["container"]
    image = next(
        line.split("=", 1)[1] for line in site.new.ssh(f"cat {unit}").stdout.splitlines() if line.startswith("Image=")
    )
    patch = (
        "import importlib.util as u, pathlib; p = pathlib.Path(u.find_spec('vllm').origin).parent / '_version.py'; "
        "p.write_text(p.read_text().replace(\"'0.32.0'\", \"'0.31.0'\").replace('(0, 32, 0)', '(0, 31, 0)'))"
    )
    containerfile = f"FROM {image}\nUSER 0\nRUN {json.dumps(['python3', '-c', patch])}\n"  # exec form: no shell quoting
    built = subprocess.run(
        ["podman", "exec", "-i", NEW_NAME, "podman", "build", "-t", OTHER_IMAGE, "-f", "-", "/tmp"],
        input=containerfile, capture_output=True, text=True,
    )  # fmt: skip
    assert built.returncode == 0, built.stderr[-3000:]
    site.new.ssh(
        f"sed -i 's|^Image=.*|Image={OTHER_IMAGE}|' {unit} && systemctl daemon-reload "
        f"&& systemctl restart {layout.UNIT_NAME}"
    )
    code, out = site.migrate("verify")
    assert code == 1, out
    assert "served engine and version: OLD vllm 0.32.0, NEW vllm 0.31.0" in out["stderr"], out["stderr"][-3000:]
    assert "traffic stays on OLD" in out["stderr"]
    assert site.record()["traffic_on"] == "old" and site.front_status()[site.new.name]["served_total"] == 0
    code, out = site.migrate("cutover")
    assert code == 2 and "migrate verify" in out["stderr"]  # never before verify passed


def test_new_fixed_by_prepare_again_passes_verify(site: Site) -> None:
    """This time NEW gets OLD's image as an archive saved on OLD (`--image-from-old`, as a site with no
    registry would). NEW first loses the profile's tag (every name of the image, as on a host that
    never had it), so the images role must load the archive to serve the profile again."""
    image_id = site.old.ssh(f"podman image inspect --format '{{{{.Id}}}}' {TAG}").stdout.strip()
    site.new.ssh(f"podman untag {image_id}")
    assert site.new.ssh(f"podman image exists {TAG}", check=False).returncode != 0
    code, out = site.migrate("prepare", "--image-from-old")
    assert code == 0, out
    assert out["details"]["seed"]["copied"] == 0  # every file already verified
    image = out["details"]["image"]
    assert image["image_id"] == f"sha256:{image_id}" and image["copied"] == 1 and image["bytes_copied"] > 10**8
    assert out["details"]["images_source"] == "archive from OLD (instead of pull)"
    assert site.new.ssh(f"podman image inspect --format '{{{{.Id}}}}' {TAG}").stdout.strip() == image_id
    assert site.old.ssh(f"test -e {image['saved_on_old']}", check=False).returncode == 1  # OLD's disk given back
    code, out = site.migrate("verify")
    assert code == 0, out
    lines = {line["what"]: line for line in out["details"]["comparison"]["lines"]}
    assert lines["golden transcript"]["same"] is True and lines["identity: image_id"]["same"] is True
    digest = lines["identity: image_digest"]  # the registry's digest NEW pulled by, as the site's lock has it
    assert digest["same"] is True and str(digest["old"]).startswith("sha256:"), digest
    assert out["details"]["comparison"]["same"] is True


def test_cutover_and_rollback_under_load_fail_no_request(site: Site) -> None:
    """Three moves under a streaming load through the front (cutover, rollback, cutover again): none
    fails a request, and each direction drains its host with requests in flight at least once. (A drain
    can find the host empty: with leastconn the streams move to the host just put in, and on a quiet
    machine the last ones on the other host end before its drain begins. A CI run's second cutover
    drained OLD with none left, 16 open at the client; such a move proves only that nothing failed.)"""
    # through prepare (twice), two verifies and the failed one, nothing reached NEW through the front
    assert site.front_status()[NEW_NAME]["served_total"] == 0
    unix_minus_monotonic = time.time() - time.monotonic()  # the move's times are wall-clock, the load's monotonic
    drained_busy: dict[str, list[int]] = {"cutover": [], "rollback": []}  # per direction: each drain's requests
    for step, serving in (("cutover", NEW_NAME), ("rollback", site.old.name), ("cutover", NEW_NAME)):
        code, out, result = site.under_load(step, site.load_spec())
        assert code == 0, out
        assert result.failed == 0 and result.sent >= LOAD_MIN_SENT, result.to_json()
        assert (result.min_in_flight_while_running or 0) >= 2
        drain = next(s for s in out["details"]["steps"] if s["step"] == "drain")
        drained_at = drain["at_unix"] - unix_minus_monotonic
        seen = {
            "step": step,
            "move": out["details"],
            "load": result.to_json(),
            "client_open": result.open_at(drained_at),
        }
        # the load still sent when the drain began (it did not run out of requests first)
        assert result.sustained_until is not None and result.sustained_until > drained_at, seen
        drained_busy[step].append(drain["in_flight_before"])
        print(f"{step} under load: {json.dumps(seen)}")  # the chain's record
        assert out["details"]["failed_requests_at_front"] == 0
        servers = site.front_status()
        assert servers[serving]["state"] == "ready", servers
    # each direction drained a host that had requests in flight at least once
    assert all(max(found) >= 1 for found in drained_busy.values()), drained_busy
    assert site.record()["traffic_on"] == "new"


# Run on an engine host: wait (at most 60 s) until nothing takes a connection on 127.0.0.1:PORT.
_WAIT_REFUSED = """
import socket, sys, time
port, deadline = int(sys.argv[1]), time.monotonic() + 60
while time.monotonic() < deadline:
    try:
        socket.create_connection(("127.0.0.1", port), timeout=0.5).close()
    except OSError:
        sys.exit(0)
    time.sleep(0.05)
sys.exit("the killed engine's port still takes connections after 60 s")
"""


def test_new_s_engine_killed_after_cutover_every_later_request_is_served_by_old_kept_as_backup(site: Site) -> None:
    """Issue 35, item 4: after the cutover OLD stays in the front as a backup server (its twin
    `OLD--backup`, put in by the cutover) until `migrate finish`. NEW's engine killed (SIGKILL to its
    container) under a bounded streaming load through the front: NEW's listener refuses the front at
    once, the front takes NEW out and sends each request again to OLD's backup, so every request
    started once the killed engine takes no more connections is answered; the streams NEW was serving
    at the kill, and those started while its processes were still exiting (a socket that takes a
    connection and then resets it: the front's retries may all land there), are cut, counted and
    reported. systemd restarts NEW's engine and the front's checks put it back (the chain goes on)."""
    servers = site.front_status()
    assert servers[f"{site.old.name}--backup"]["state"] == "ready", servers
    assert servers[NEW_NAME]["state"] == "ready" and servers[site.old.name]["state"] == "maint", servers
    # the kill needs NEW's engine serving, not between restarts (the load would go to OLD's backup): the
    # front calls it up, and its container runs (the front's checks lag a restart by up to three checks)
    _wait_new_up(site)
    is_running = "podman container inspect --format '{{.State.Running}}' " + layout.UNIT_NAME
    deadline = time.monotonic() + 600
    while (seen := site.new.ssh(is_running, check=False)).stdout.strip() != "true":
        assert time.monotonic() < deadline, _engine_state(site, seen)
        time.sleep(2)
    with site.load(total=4 * migration.LOAD_IN_FLIGHT) as running:  # four waves: most start after the kill
        assert running.wait_streaming(migration.LOAD_IN_FLIGHT // 2, 120)
        killed_at = time.monotonic()
        killed = site.new.ssh(f"podman kill --signal KILL {layout.UNIT_NAME}", check=False)
        assert killed.returncode == 0, _engine_state(site, killed)
        # a killed engine is not gone at once: until its last process has exited, its listening
        # socket still takes connections and then resets them (each one the front tries again on NEW,
        # which its listener still calls up). Requests started in that window count as in flight.
        site.new.ssh(f"python3 -c {shlex.quote(_WAIT_REFUSED)} {load_profile(PROFILE).engine.serve.port}")
        dead_at = time.monotonic()
        result = running.finish(900)
    in_flight = [r for r in result.requests if r.started < dead_at and (r.ended is None or r.ended > killed_at)]
    later = [r for r in result.requests if r.started >= dead_at]
    report = {
        "sent": result.sent,
        "in_flight_at_kill": len(in_flight),
        "in_flight_at_kill_failed": sum(1 for r in in_flight if not r.ok),
        "engine_gone_after_s": round(dead_at - killed_at, 2),
        "started_after_kill": len(later),
        "started_after_kill_failed": sum(1 for r in later if not r.ok),
    }
    print(f"NEW killed after cutover: {json.dumps(report)}")  # the chain's record of what the kill cost
    assert len(later) >= 4 and all(r.ok for r in later), (report, result.to_json())
    servers = site.front_status()
    assert servers[f"{site.old.name}--backup"]["served_total"] >= 1, servers  # OLD answered them
    _wait_new_up(site)  # systemd restarts NEW's engine (Restart=always); the front's checks put NEW back in


def _wait_new_up(site: Site, timeout_s: float = 600) -> None:
    """Until the front's checks call NEW up (its engine serves through its listener)."""
    deadline = time.monotonic() + timeout_s
    while not site.front_status()[NEW_NAME]["status"].startswith("UP"):
        assert time.monotonic() < deadline, site.front_status()
        time.sleep(5)


def _engine_state(site: Site, failed: subprocess.CompletedProcess[str]) -> str:
    """What a failed command against NEW's engine container printed, with the container's and the
    unit's state and the unit's last journal lines: enough to read the cause from a CI log."""
    looks = (
        "podman ps -a --format '{{.Names}} {{.Status}}'",
        f"systemctl status --no-pager --lines=0 {layout.UNIT_NAME}",
        f"journalctl --no-pager -n 30 -u {layout.UNIT_NAME}",
    )
    seen = [str(hosts.RemoteCommandFailed(site.new.name, failed))]
    seen += [f"$ {look}\n{site.new.ssh(look, check=False).stdout.strip()}" for look in looks]
    return "\n".join(seen)


def test_new_stopped_by_systemctl_after_cutover_loses_no_request_under_a_bounded_load(site: Site) -> None:
    """Issue 35: `systemctl stop` of NEW's engine loses no request. NEW's listener is PartOf= and After=
    the engine's unit and stops softly (SIGUSR1; front/listener.py `render_unit`): systemd stops it
    first, it stops listening at once (the front sends new requests to OLD's backup) and lets the
    streams in flight finish on the engine, which still runs; only then does the engine stop. Under a
    streaming load through the front, stopped once it has sent a few requests after the stop returned:
    no request fails, those in flight at the stop finish, those started after both units stopped are
    answered by OLD. (Requests started while the stop runs may still reach NEW: the command takes a
    moment to reach systemd on a loaded machine, and a CI run had 11 of them. That the listener's
    SIGUSR1 alone sends every later request to OLD is shown with the real HAProxy in
    tests/unit/test_front_listener.py.) `systemctl start` of the engine starts its listener again
    (WantedBy=), and the front's checks put NEW back in (the chain goes on)."""
    _wait_new_up(site)  # the kill before: systemd restarted NEW's engine
    backup = f"{site.old.name}--backup"
    served_by_old = site.front_status()[backup]["served_total"]
    try:
        with site.load(total=100_000) as running:
            assert running.wait_streaming(migration.LOAD_IN_FLIGHT // 2, 120)
            stopped_at = time.monotonic()
            site.new.ssh(f"systemctl stop {layout.UNIT_NAME}")  # returns once both units are stopped
            down_at = time.monotonic()
            assert _started_since(running, down_at, AFTER_DOWN, 300), running.now()
            result = running.stop()
        in_flight = [r for r in result.requests if r.started < stopped_at and (r.ended is None or r.ended > stopped_at)]
        later = [r for r in result.requests if r.started >= down_at]
        report = {
            "sent": result.sent,
            "failed": result.failed,
            "in_flight_at_stop": len(in_flight),
            "started_while_stopping": sum(1 for r in result.requests if stopped_at <= r.started < down_at),
            "started_after_stop": len(later),
            "systemctl_stop_s": round(down_at - stopped_at, 1),
            "drain_timeout_s": load_profile(PROFILE).migration.drain_timeout_s,  # the listener's hard-stop-after
        }
        print(f"NEW stopped by systemctl after cutover: {json.dumps(report)}")  # the chain's record
        assert result.failed == 0, (report, result.to_json())
        assert len(in_flight) >= 2 and len(later) >= AFTER_DOWN, report
        assert site.front_status()[backup]["served_total"] - served_by_old >= len(later), (report, site.front_status())
        inactive = site.new.ssh(f"systemctl is-active {layout.LISTENER_UNIT_NAME}", check=False).stdout.strip()
        assert inactive != "active", inactive  # stopped with the engine (PartOf=)
    finally:  # the chain goes on with NEW serving, whatever this test found (a failure here must not cascade)
        site.new.ssh(f"systemctl start {layout.UNIT_NAME}")
    _wait_new_up(site)  # its listener started with it


AFTER_DOWN = 4  # requests the load sends after NEW's engine and listener have stopped


def _started_since(running: load.Load, since: float, n: int, timeout_s: float) -> bool:
    """Wait until the load has started `n` requests at or after `since` (time.monotonic())."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if sum(1 for r in list(running.result.requests) if r.started >= since) >= n:
            return True
        time.sleep(0.1)
    return False


# what a rolling deploy does on each host, in order (task-name prefixes of deploy.yml's roles)
ROLLING_STAGES = {
    "drained": "front : Drain this host from the site's front door",
    "restarted": "engine : Restart the engine",
    "gated": "smoke_gate : Gate the new stack",
    "put back": "front : Put this host back in the site's front door",
}


def _rolling_order(output: str) -> list[tuple[str, str]]:
    """(host, stage) for each result line of a ROLLING_STAGES task, in the play's order (a stage a task
    reports as skipped did not happen)."""
    return [
        (host, stage)
        for task, status, host in deploy.task_events(output)
        for stage, prefix in ROLLING_STAGES.items()
        if task.startswith(prefix) and status in ("ok", "changed")
    ]


# two deploys one after the other, each with its gate, under the load: ~15 min on a loaded 2-core VM
@pytest.mark.timeout(2400)
def test_a_rolling_deploy_of_both_hosts_through_the_front_fails_no_request(site: Site, tmp_path: Path) -> None:
    """An upgrade of both hosts (an engine environment variable added: each engine restarts), one at
    a time: each is drained from the front before its engine is replaced and put back after its gate."""
    pinned = load_profile(site.rig.profiles / f"{PROFILE}.yaml")
    changed = variants.derive(pinned, PROFILE, {"engine": {"env": {"VLLM_LOGGING_LEVEL": "INFO"}}})
    profiles = variants.materialize(changed, tmp_path / "profiles").parent

    def invocations() -> list[str]:  # systemd's ID of each engine unit's current run: new at every start
        return [
            host.ssh(f"systemctl show --property=InvocationID --value {layout.UNIT_NAME}").stdout.strip()
            for host in (site.old, site.new)
        ]

    before = invocations()
    # the load lasts as long as the play (bounded: it stops when the play ends), so both engines are
    # replaced while streams go through the front
    with site.load(total=100_000, **ROLLING_LOAD) as running:
        assert running.wait_streaming(migration.LOAD_BEFORE, 120)
        run = site.play(f"{site.old.name},{site.new.name}", "-e", f"specdeploy_profiles_src={profiles}")
        result = running.stop()
    assert run.returncode == 0, run.stdout[-5000:]
    after = invocations()
    assert all(before) and all(a != b for a, b in zip(before, after, strict=True)), (before, after)  # both restarted
    assert result.failed == 0 and result.sent >= ROLLING_MIN_SENT, result.to_json()
    assert (result.min_in_flight_while_running or 0) >= 2
    servers = site.front_status()
    assert servers[site.old.name]["state"] == servers[site.new.name]["state"] == "ready", servers
    # one host at a time, from the play's own output: drained, its engine restarted, gated, put back,
    # all before the next host is drained
    assert _rolling_order(run.stdout) == [
        (host, stage) for host in (site.old.name, site.new.name) for stage in ROLLING_STAGES
    ], run.stdout[-5000:]


def test_finish_stops_old_after_the_soak_and_keeps_its_weights_and_state(site: Site) -> None:
    """finish's light gate on NEW judges acceptance over the interval since the last light gate: one
    light gate closes the load's interval first, as the host's timer would during a soak
    (migration.Move.finish_after_soak, which `specdeploy rehearsal migrate --finish` runs too)."""
    code, out = site.migrate("finish")
    assert code == 1 and "--stop-old" in out["stderr"]
    code, out = site.finish_after_soak(load_profile(PROFILE).migration.soak_s)
    assert code == 0, out
    assert site.old.ssh(f"systemctl is-active {layout.UNIT_NAME}", check=False).stdout.strip() != "active"
    # its listener too: nothing of OLD answers on its internal address any more
    assert site.old.ssh(f"systemctl is-active {layout.LISTENER_UNIT_NAME}", check=False).stdout.strip() != "active"
    assert site.old.ssh(f"test -e {layout.LISTENER_CONFIG}", check=False).returncode != 0
    assert (
        site.old.ssh(
            f"test -d {layout.HostLayout().models} && test -e {layout.HostLayout().verified}", check=False
        ).returncode
        == 0
    )
    assert site.front_status()[site.old.name]["state"] == "maint"
    # OLD is rendered ready in haproxy.cfg and out only at runtime: a reload (and a restart) keeps it out
    for action in ("reload", "restart"):
        site.front.ssh(f"systemctl {action} haproxy")
        assert site.front_status()[site.old.name]["state"] == "maint", action
    with site.load(total=4) as running:
        result = running.finish(300)
    assert result.failed == 0 and result.ok == 4
    # no silent minutes (issue 37): every `migrate` step of this chain, each run as a person runs it
    # (`specdeploy rehearsal migrate`'s steps), never went 30 s without a line of output
    assert {"plan", "prepare", "verify", "cutover", "rollback", "finish"} <= set(site.silences), site.silences
    assert max(site.silences.values()) < progress.MAX_SILENCE_S, site.silences


# a real model built into its own engine image, deployed and gated on NEW: 442 s and 794 s in two CI runs, over
# 900 s (the suite's default limit) in one where the other worker's real-model engines shared the two cores
@pytest.mark.timeout(1800)
def test_new_switches_to_the_main_job_s_real_model_and_its_gate_shows_the_model_s_answers(
    site: Site, tmp_path: Path
) -> None:
    """CI's deploy of the real model (issue 34): cpu-rehearsal-smollm2, SmolLM2-135M-Instruct drafted by its
    own 4-bit copy, pinned at the hub's commits and deployed to NEW by the same play a site runs (drained
    from the front, the drafter fetched from the gated hub with the token, verify-config and write-config,
    the engine under quadlet with the key, the gate, put back). Its gate passes on the model's own answers:
    the accuracy against the profile's floor, the lossless check with its tolerance, a prefix-cache hit
    proven, and a mean acceptance length that is neither ~1 (a collapse) nor k+1 (a loop)."""
    assert site.rig is not None
    real = load_profile(deploy.PROFILE)
    registry = site.rig.site
    base = engine_image.base_in_registry(real, registry=registry.address, cert_dir=registry.cert_dir)
    profiles = deploy.pinned_profile(real, site.rig.served.commits, tmp_path / "profiles", base=base).parent
    run_id = new_run_id()
    # the profile's own engine image (its label names the profile), built once on the controller and
    # given to NEW as an archive: the site's lock records no registry digest for this profile (the main
    # job pushes one; this chain never does)
    image = engine_image.archive_on_controller(
        load_profile(profiles / f"{deploy.PROFILE}.yaml"), context=deploy.checkout(), wheels=site.rig.wheels,
        lock=Lock(tmp_path / "builder.lock"), cert_dir=registry.cert_dir,
    )  # fmt: skip
    archive = ("-e", "images_source=archive", "-e", f"images_archive_src={image}")
    played = migration.Move.play(
        site, site.new.name, "-e", f"specdeploy_run_id={run_id}", *archive, profile=deploy.PROFILE, profiles=profiles
    )
    report = deploy.gate_report(site.new, run_id)
    assert played.returncode == 0, played.stdout[-5000:]
    assert report is not None and report["verdict"] == "pass", report
    stages = {s["name"]: s for s in report["smoke"]["stages"]}
    known = stages["accuracy"]["details"]["known answers"]
    assert known["asked"] >= 30 and known["accuracy"] >= real.smoke.accuracy.min.value  # type: ignore[union-attr]
    assert stages["coherence"]["details"]["outputs"]["What is the capital of France? Answer in one word."]
    # the healthy half of tests/integration/test_real_model.py's faults, on the whole prompt set: lossless
    # alone and at concurrency, with real (partial) drafting during the answers, and answers alike from the
    # prefix cache
    checked = stages["lossless"]["details"]
    assert stages["lossless"]["status"] == "pass" and checked["divergences"] == [], stages["lossless"]["summary"]
    assert checked["at_concurrency"] == [1, real.smoke.concurrency] and checked["distribution"]["tokens"] > 100
    assert checked["speculation_during_answers"]["drafts"] > 0 and checked["speculation_during_answers"]["accepted"] > 0
    assert stages["concurrency"]["status"] == "pass", stages["concurrency"]["summary"]
    assert stages["prefix_cache"]["status"] == "pass", stages["prefix_cache"]["summary"]
    assert stages["prefix_cache"]["details"]["context_hit_tokens"] >= 256  # two 128-token CPU blocks
    mean = stages["acceptance"]["details"]["mean_acceptance_length"]
    k = real.engine.speculative.num_speculative_tokens
    assert 1.3 < mean < k + 1 - 0.3, mean  # real, partial acceptance
    assert report["served_config"]["ok"] and not report["served_config"]["skipped"]
    assert site.front_status()[site.new.name]["state"] == "ready"
