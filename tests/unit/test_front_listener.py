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
import signal
import socket
import ssl
import subprocess
import threading
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
from specdeploy.profile import load_profile
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


@dataclass
class Listener:
    process: subprocess.Popen[bytes]
    log: Path


@contextlib.contextmanager
def _listener(
    spec: dict[str, Any], address: str, port: int, directory: Path, *, drain_s: float = 10
) -> Iterator[Listener]:
    """The real HAProxy as an engine host's listener on `address:port` (to 127.0.0.1:`port`)."""
    directory.mkdir(parents=True, exist_ok=True)
    cfg = directory / "listener.cfg"
    cfg.write_text(listener.render(FrontSpec(**spec), address=address, port=port, drain_s=drain_s))
    log = directory / "listener.log"
    with log.open("wb") as sink:
        process = subprocess.Popen(
            ["haproxy", "-db", "-f", str(cfg)], stdout=sink, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL
        )
    try:
        _wait_listening(address, port, process, log)
        yield Listener(process, log)
    finally:
        if process.poll() is None:
            process.terminate()
            process.wait(10)


@pytest.fixture
def hop(pem: Path, short_dir: Path, tmp_path: Path) -> Iterator[Hop]:
    """The front over TLS -> the engine host's listener over mutual TLS -> an engine stand-in on loopback."""
    certs, stranger_ca = _certificates(tmp_path)
    spec = _spec(tmp_path, certs)
    with support.engines("a") as engines, _listener(spec, ENGINE_HOST, engines["a"].port, tmp_path / "a") as served:
        backends = [Backend(name=NAME, address=ENGINE_HOST, port=engines["a"].port, tls=True)]
        config = support.front_config(short_dir, pem, backends, **spec)
        with support.running(config, short_dir, ready=(NAME,)) as front:
            yield Hop(front, engines["a"], served.log, certs, stranger_ca)


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
    text = listener.render(spec, address="10.0.0.11", port=8000, drain_s=600)
    assert "Configuration file is valid" in haproxy.check(text)
    assert "hard-stop-after 600s" in text  # a stopped listener's requests in flight: 600 s at most
    assert "bind 10.0.0.11:8000 ssl crt" in text and "verify required" in text
    assert "server engine 127.0.0.1:8000" in text
    assert "ssl_c_s_dn(CN) -m str specdeploy-front" in text
    unit = cli("front", "listener", "cpu-rehearsal-container", "--unit").stdout
    assert "Type=notify" in unit and "ExecReload=/usr/sbin/haproxy -Ws -f $CONFIG -c -q" in unit
    # stopped with the engine, before it, softly; started with it (`systemctl stop` loses no request)
    drained = load_profile("cpu-rehearsal-container").migration.drain_timeout_s
    for line in ("PartOf=specdeploy-engine.service", "KillSignal=SIGUSR1", f"TimeoutStopSec={int(drained) + 10}"):
        assert line in unit.splitlines(), unit
    assert "After=network-online.target specdeploy-engine.service" in unit
    assert "WantedBy=multi-user.target specdeploy-engine.service" in unit
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


@dataclass
class Cutover:
    """Two engine hosts, OLD (127.0.0.2) and NEW (127.0.0.3), each behind its listener, after a cutover:
    NEW in, OLD drained and out, OLD's backup twin in."""

    engines: dict[str, support.EchoEngine]
    listeners: dict[str, Listener]
    front: support.Front
    balancer: HAProxyBalancer


@contextlib.contextmanager
def _after_cutover(pem: Path, short_dir: Path, tmp_path: Path, *, token_s: float | None = None) -> Iterator[Cutover]:
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
        listeners = {}
        for name, address in (("old", "127.0.0.2"), ("new", "127.0.0.3")):
            engines[name].token_s = token_s
            own = spec | {"listener_cert_path": str(site_ca.pem_bundle(certs[name], tmp_path / f"{name}.pem"))}
            listeners[name] = stack.enter_context(
                _listener(own, address, engines[name].port, tmp_path / f"listener-{name}")
            )
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
        yield Cutover(engines, listeners, front, balancer)


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
    with _after_cutover(pem, short_dir, tmp_path) as site, contextlib.ExitStack() as stack:
        engines, front = site.engines, site.front
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
        states = {s.name: s.status for s in site.balancer.status()}
        assert states["new"].startswith("DOWN") and states["old--backup"].startswith("UP"), states


@dataclass
class Answered:
    started: float
    ended: float
    backend: str | None  # the engine that answered; None: the request failed
    detail: str


def _streams(front: support.Front, stop: threading.Event, answered: list[Answered], max_tokens: int) -> None:
    """Streamed chat requests through the front, one after the other, until `stop`: each recorded with
    the engine that answered it, and counted as failed unless its stream ended with [DONE]."""
    while not stop.is_set():
        started = time.monotonic()
        try:
            status, body = front.request(
                "POST", "/v1/chat/completions", {"stream": True, "max_tokens": max_tokens}, timeout=60
            )
            done = status == 200 and body.rstrip().endswith(b"data: [DONE]")
            backend = json.loads(body.split(b"data: ", 2)[1])["backend"] if done else None
            detail = f"HTTP {status}, {len(body)} bytes"
        except (OSError, http.client.HTTPException, ValueError) as exc:
            backend, detail = None, f"{type(exc).__name__}: {exc}"
        answered.append(Answered(started, time.monotonic(), backend, detail))


def test_after_a_cutover_new_stopped_as_systemd_stops_it_loses_no_request_under_a_bounded_load(
    pem: Path, short_dir: Path, tmp_path: Path
) -> None:
    """Issue 35: `systemctl stop` of NEW's engine loses no request. What the listener's unit makes systemd
    do (front/listener.py `render_unit`: PartOf= and After= the engine, KillSignal=SIGUSR1) is done here
    to the real HAProxy: the listener soft-stopped first and waited for, then the engine stopped. Under
    a bounded load of streamed answers (4 clients, each stream about 1.5 s): the streams NEW was serving
    at the stop finish on NEW, every request started after it is answered by OLD's backup, none fails.
    The same stop by systemd itself, on real hosts: tests/integration/test_migration.py."""
    with _after_cutover(pem, short_dir, tmp_path, token_s=0.05) as site:
        stop, answered = threading.Event(), []
        clients = [threading.Thread(target=_streams, args=(site.front, stop, answered, 30)) for _ in range(4)]
        for client in clients:
            client.start()
        try:
            deadline = time.monotonic() + 30
            while site.engines["new"].open_streams < 3:
                assert time.monotonic() < deadline, answered
                time.sleep(0.02)
            stopped_at = time.monotonic()
            site.listeners["new"].process.send_signal(signal.SIGUSR1)  # systemd: the listener first ...
            site.listeners["new"].process.wait(15)
            listener_gone = time.monotonic() - stopped_at
            site.engines["new"].kill()  # ... then the engine
            time.sleep(3)  # the load goes on: about two streams per client, all after the stop
        finally:
            stop.set()
            for client in clients:
                client.join(90)
    in_flight = [a for a in answered if a.started < stopped_at < a.ended]
    later = [a for a in answered if a.started >= stopped_at]
    record = {
        "sent": len(answered),
        "in_flight_at_stop": len(in_flight),
        "started_after_stop": len(later),
        "listener_stopped_after_s": round(listener_gone, 2),
    }
    print(f"NEW stopped after cutover: {json.dumps(record)}")
    assert [a for a in answered if a.backend is None] == [], (record, answered)
    assert len(in_flight) >= 3 and {a.backend for a in in_flight} == {"new"}, (record, in_flight)
    assert len(later) >= 4 and {a.backend for a in later} == {"old"}, (record, later)
    # the listener waited for its streams (about 1.5 s), not for its bound (10 s)
    assert listener_gone < 8, record
