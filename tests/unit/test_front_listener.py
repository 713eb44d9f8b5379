"""The hop from the front to an engine host (issue 35, items 2 and 3): the engine host's listener
(mutual TLS, the front's certificate alone) in front of an engine on loopback.

What is real: two HAProxy processes — the front (`front/haproxy.py`'s config) and the engine host's
listener (`front/listener.py`'s) — their TLS, certificate checks and the certificates themselves
(a site CA and the certificates it issues, made with `cryptography` as the rehearsal's site CA makes
them; a second CA for a stranger); the packet capture reads this machine's loopback with a raw
socket. What is not: the engine, an echo stand-in on 127.0.0.1 (tests/support/front.py); the
"engine host" is the loopback address 127.0.0.2, as the front's own loopback is 127.0.0.1. The
same hop between real hosts, with vLLM's own route table, is tests/integration/test_migration.py's.
"""

from __future__ import annotations

import contextlib
import http.client
import json
import os
import shutil
import socket
import ssl
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from tests.support import front as support
from tests.support.capture import Capture, capturing

from specdeploy.core.errors import UsageError
from specdeploy.front import haproxy, listener
from specdeploy.front.balancer import HAProxyBalancer, cutover
from specdeploy.front.config import Backend, FrontConfig, parse_backend
from specdeploy.front.runtime import RuntimeApi
from specdeploy.profile.schema import FrontSpec
from specdeploy.rehearsal import site_ca

pytestmark = pytest.mark.timeout(90)

ENGINE_HOST = "127.0.0.2"  # the engine host's "internal address" here
NAME = "engine-a"  # its inventory name, which its listener's certificate carries
# engine routes tried from a stranger: vLLM's own (the chain reads them from the engine) and more
ROUTES = ["/v1/models", "/v1/chat/completions", "/metrics", "/tokenize", "/invocations", "/health", "/version"]


@dataclass
class Hop:
    front: support.Front
    engine: support.EchoEngine
    listener_log: Path
    certs: dict[str, site_ca.Issued]
    stranger_ca: Path

    def direct(self, path: str, *, client: str | None, ca: Path | None = None) -> str:
        """A request straight to the listener, as another host of the network would send it, with the
        client certificate `client` (None: none); what came back, or how it failed."""
        context = ssl.create_default_context(cafile=str(ca or self.certs["listener"].ca))
        context.check_hostname = False
        if client is not None:
            issued = self.certs[client]
            context.load_cert_chain(str(issued.cert), str(issued.key))
        conn = http.client.HTTPSConnection(ENGINE_HOST, self.engine.port, context=context, timeout=5)
        try:
            conn.request("GET", path, headers={"Authorization": f"Bearer {support.KEY}"})
            response = conn.getresponse()
            return f"HTTP {response.status}"
        except (ssl.SSLError, ConnectionError, http.client.HTTPException, OSError) as exc:
            return f"refused: {type(exc).__name__}: {exc}"
        finally:
            conn.close()


def _certificates(directory: Path) -> tuple[dict[str, site_ca.Issued], Path]:
    ca = directory / "site-ca"
    certs = {
        "listener": site_ca.issue(directory / "listener", ips=[ENGINE_HOST], dns=[NAME], ca_dir=ca),
        "front": site_ca.issue(directory / "front", ips=[], dns=["specdeploy-front"], ca_dir=ca, client=True),
        # signed by the same CA, but another host's (a registry's, a hub's)
        "neighbour": site_ca.issue(directory / "neighbour", ips=[], dns=["registry"], ca_dir=ca, client=True),
        # signed by a CA the listener does not trust, with the front's very name
        "stranger": site_ca.issue(
            directory / "stranger", ips=[], dns=["specdeploy-front"], ca_dir=directory / "other-ca", client=True
        ),
    }
    return certs, certs["stranger"].ca


def _spec(directory: Path, certs: dict[str, site_ca.Issued]) -> dict[str, Any]:
    return {
        "listener_cert_path": str(site_ca.pem_bundle(certs["listener"], directory / "listener.pem")),
        "listener_ca_path": str(certs["listener"].ca),
        "client_cert_path": str(site_ca.pem_bundle(certs["front"], directory / "front-client.pem")),
        "engine_ca_path": str(certs["listener"].ca),
    }


@contextlib.contextmanager
def _listener(spec: dict[str, Any], address: str, port: int, directory: Path) -> Iterator[Path]:
    """The real HAProxy as an engine host's listener on `address:port` (to 127.0.0.1:`port`); its log."""
    directory.mkdir(parents=True, exist_ok=True)
    cfg = directory / "listener.cfg"
    cfg.write_text(listener.render(FrontSpec(**spec), address=address, port=port))
    log = directory / "listener.log"
    with log.open("wb") as sink:
        process = subprocess.Popen(
            ["haproxy", "-db", "-f", str(cfg)], stdout=sink, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL
        )
    try:
        _wait_listening(address, port, process, log)
        yield log
    finally:
        process.terminate()
        process.wait(10)


@pytest.fixture
def hop(pem: Path, short_dir: Path, tmp_path: Path) -> Iterator[Hop]:
    """The front over TLS -> the engine host's listener over mutual TLS -> an engine stand-in on loopback."""
    certs, stranger_ca = _certificates(tmp_path)
    spec = _spec(tmp_path, certs)
    with support.engines("a") as engines, _listener(spec, ENGINE_HOST, engines["a"].port, tmp_path / "a") as log:
        backends = [Backend(name=NAME, address=ENGINE_HOST, port=engines["a"].port, tls=True)]
        config = support.front_config(short_dir, pem, backends, **spec)
        with support.running(config, short_dir, ready=(NAME,)) as front:
            yield Hop(front, engines["a"], log, certs, stranger_ca)


def _wait_listening(address: str, port: int, process: subprocess.Popen[bytes], log: Path) -> None:
    deadline = time.monotonic() + 15
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"the listener exited {process.returncode}: {log.read_text()[-2000:]}")
        try:
            with socket.create_connection((address, port), timeout=1):
                return
        except OSError:
            time.sleep(0.05)
    raise RuntimeError(f"the listener did not listen within 15 s: {log.read_text()[-2000:]}")


def test_through_the_front_the_api_reaches_the_engine_over_mutual_tls_with_the_key(hop: Hop) -> None:
    status, body = hop.front.request("GET", "/v1/models")
    assert status == 200, body
    assert hop.engine.requests()[-1] == ("GET", "/v1/models", f"Bearer {support.KEY}")
    # the front's health checks take the same hop: the engine answers them through the listener (HAProxy
    # deems a server up at start, before its first check: wait for one, every 100 ms here)
    deadline = time.monotonic() + 5
    while not any(path == "/health" for _, path, _ in hop.engine.seen) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert any(path == "/health" for _, path, _ in hop.engine.seen)


def test_no_engine_route_answers_another_host_whatever_certificate_it_shows(hop: Hop) -> None:
    """Every route, with the key, from a client without a certificate, with one of another CA bearing the
    front's own name, and with the site CA's certificate of another host: none gets an HTTP answer,
    and the engine sees none of them."""
    before = list(hop.engine.requests())
    for path in ROUTES:
        for client, ca in ((None, None), ("stranger", None), ("neighbour", None)):
            answer = hop.direct(path, client=client, ca=ca)
            assert answer.startswith("refused"), (path, client, answer)
        # and in plain HTTP, as a client of the engine's port used to talk to it
        with socket.create_connection((ENGINE_HOST, hop.engine.port), timeout=5) as plain:
            plain.sendall(f"GET {path} HTTP/1.1\r\nHost: x\r\n\r\n".encode())
            plain.settimeout(5)
            try:
                answer_bytes = plain.recv(4096)
            except (ConnectionError, TimeoutError):
                answer_bytes = b""
            assert not answer_bytes.startswith(b"HTTP/"), (path, answer_bytes[:200])
    assert hop.engine.requests() == before
    # the front's own certificate, straight to the listener, does get through (the test's control)
    assert hop.direct("/v1/models", client="front") == "HTTP 200"


@pytest.mark.skipif(os.geteuid() != 0, reason="a raw packet capture needs root (CI runs as root)")
def test_a_capture_of_the_hop_during_a_request_holds_no_byte_of_the_key(hop: Hop) -> None:
    """The capture sees the listener's plain hop to the engine on 127.0.0.1 carry the key (proof that it
    reads payloads), and the front's hop to the engine host (127.0.0.2) carry none of it."""
    with capturing("lo") as capture:
        status, _ = hop.front.request(
            "POST", "/v1/chat/completions", {"messages": [{"role": "user", "content": "capture me"}]}
        )
        time.sleep(0.3)
    assert status == 200
    hop_segments = capture.between(ENGINE_HOST, hop.engine.port)
    inner = [s for s in capture.between("127.0.0.1", hop.engine.port) if ENGINE_HOST not in (s.src, s.dst)]
    assert hop_segments, f"nothing captured on the front's hop ({capture.frames} frames)"
    assert Capture.holds(inner, support.KEY.encode()), "the capture did not see the plain inner hop's key"
    assert not Capture.holds(hop_segments, support.KEY.encode())
    assert not Capture.holds(hop_segments, b"capture me")


def test_the_listener_and_its_unit_pass_the_real_checks_and_take_only_the_internal_address(
    cli: Any, tmp_path: Path
) -> None:
    certs, _ = _certificates(tmp_path)
    spec = FrontSpec(**_spec(tmp_path, certs))
    report = haproxy.check(listener.render(spec, address="10.0.0.11", port=8000))
    assert "Configuration file is valid" in report
    text = listener.render(spec, address="10.0.0.11", port=8000)
    assert "bind 10.0.0.11:8000 ssl crt" in text and "verify required" in text
    assert "server engine 127.0.0.1:8000" in text
    assert "ssl_c_s_dn(CN) -m str specdeploy-front" in text
    unit = cli("front", "listener", "cpu-rehearsal-container", "--unit").stdout
    assert "Type=notify" in unit and "ExecReload=/usr/sbin/haproxy -Ws -f $CONFIG -c -q" in unit
    for address, found in (("0.0.0.0", "a wildcard"), ("127.0.0.1", "a loopback address"), ("my host", "IP")):
        with pytest.raises(UsageError) as refused:
            listener.require_address(address)
        assert found in refused.value.message and repr(address) in refused.value.message


def test_a_backend_across_the_network_is_tls_and_plain_http_is_refused_there() -> None:
    assert parse_backend("old=10.0.0.11:8000").tls is True
    assert parse_backend("local=127.0.0.1:8000").tls is False
    with pytest.raises(ValueError, match="cross the network in clear"):
        Backend(name="old", address="10.0.0.11", port=8000, tls=False)
    config = FrontConfig.of(FrontSpec(), [parse_backend("old=10.0.0.11:8000")])
    line = next(x for x in haproxy.render(config).splitlines() if x.strip().startswith("server old"))
    assert "ssl verify required ca-file /etc/haproxy/specdeploy-engine-ca.pem verifyhost old" in line
    assert "crt /etc/haproxy/specdeploy-front-client.pem check-ssl" in line


@contextlib.contextmanager
def _void(port: int) -> Iterator[None]:
    """Packets to 127.0.0.1:`port` dropped (iptables, root): a port forwarded into a container that no
    longer answers, as podman's is for a moment after the container is killed (seen on the migration
    chain: connections neither open nor fail)."""
    rule = ["OUTPUT", "-o", "lo", "-p", "tcp", "-d", "127.0.0.1", "--dport", str(port), "-j", "DROP"]
    subprocess.run(["iptables", "-I", *rule], check=True, capture_output=True, timeout=30)
    try:
        yield
    finally:
        subprocess.run(["iptables", "-D", *rule], check=False, capture_output=True, timeout=30)


VOID = pytest.param(
    "void",
    marks=pytest.mark.skipif(
        os.geteuid() != 0 or shutil.which("iptables") is None,
        reason="dropping a port's packets needs root and iptables",
    ),
)


@pytest.mark.parametrize("death", ["closed", VOID])
def test_after_a_cutover_new_s_engine_killed_every_later_request_is_served_by_old_kept_as_backup(
    pem: Path, short_dir: Path, tmp_path: Path, death: str
) -> None:
    """Issue 35, item 4: OLD kept as a backup server until `migrate finish`. Two engine hosts (127.0.0.2,
    127.0.0.3), each behind its listener; after the cutover (NEW in, OLD drained and out, OLD's backup
    twin in) NEW's engine dies: its listener refuses the front's connections at once, the front takes
    NEW out on the first refusal and sends the request again, to OLD's backup; every request after the
    kill is answered, by OLD. Before the kill, OLD's backup took none. The engine dies two ways: its port
    closed (connections refused), or its port swallowing connections (`void`: as podman's forwarded port
    does for a moment after the container is killed, which left the migration chain's first wave after
    the kill with 502s before the listener marked its engine down on the first failed connection)."""
    ca = tmp_path / "site-ca"
    certs = {
        "old": site_ca.issue(tmp_path / "old", ips=["127.0.0.2"], dns=["old"], ca_dir=ca),
        "new": site_ca.issue(tmp_path / "new", ips=["127.0.0.3"], dns=["new"], ca_dir=ca),
        "front": site_ca.issue(tmp_path / "front", ips=[], dns=["specdeploy-front"], ca_dir=ca, client=True),
    }
    spec = {
        "listener_ca_path": str(certs["old"].ca),
        "client_cert_path": str(site_ca.pem_bundle(certs["front"], tmp_path / "front-client.pem")),
        "engine_ca_path": str(certs["old"].ca),
    }
    with contextlib.ExitStack() as stack:
        engines = stack.enter_context(support.engines("old", "new"))
        for name, address in (("old", "127.0.0.2"), ("new", "127.0.0.3")):
            own = spec | {"listener_cert_path": str(site_ca.pem_bundle(certs[name], tmp_path / f"{name}.pem"))}
            stack.enter_context(_listener(own, address, engines[name].port, tmp_path / f"listener-{name}"))
        backends = [
            Backend(name="old", address="127.0.0.2", port=engines["old"].port, tls=True),
            Backend(name="new", address="127.0.0.3", port=engines["new"].port, state="maint", tls=True),
        ]
        # the profile's health-check interval (2 s, 3 failures): the front learns of NEW's death from its
        # requests long before its checks would tell it
        config = support.front_config(short_dir, pem, backends, **spec | {"check_interval_s": 2.0})
        front = stack.enter_context(support.running(config, short_dir, ready=("old",)))
        balancer = HAProxyBalancer(RuntimeApi(front.socket), drain_timeout_s=10, up_timeout_s=15, poll_s=0.05)
        cutover(balancer, new="new", old="old")
        served_before = len(engines["old"].requests())
        for _ in range(5):
            status, body = front.request("GET", "/v1/models")
            assert status == 200 and json.loads(body)["backend"] == "new"
        assert len(engines["old"].requests()) == served_before  # the backup takes nothing while NEW is up
        if death == "void":  # its port swallows connections: they neither open nor fail
            stack.enter_context(_void(engines["new"].port))
        engines["new"].kill()
        answers = [front.request("GET", "/v1/models", timeout=60) for _ in range(10)]
        assert [status for status, _ in answers] == [200] * 10, answers
        assert {json.loads(body)["backend"] for _, body in answers} == {"old"}
        states = {s.name: s.status for s in balancer.status()}
        assert states["new"].startswith("DOWN") and states["old--backup"].startswith("UP"), states
