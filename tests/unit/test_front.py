"""The site's front door (issue 23): HAProxy in front of the engine hosts.

What is real: HAProxy (Debian's haproxy, started as a local process on loopback ports from the
haproxy.cfg `specdeploy.front.haproxy` renders; `haproxy -c` checks it), its TLS (a throwaway
self-signed certificate made by the real openssl, verified by the client), its allow-list, health
checks, runtime API and draining; the hook is a real executable script. What is not: the engines
— Python HTTP stand-ins in threads that echo the path and the Authorization header and record
every request they get (tests/support/front.py). Each test starts its own HAProxy and stops it
when it ends, whatever happened."""

from __future__ import annotations

import json
import os
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from tests.support import front as support

from specdeploy.core.errors import ProfileError, UsageError
from specdeploy.front import haproxy
from specdeploy.front.balancer import Balancer, HAProxyBalancer, HookBalancer, HookError, cutover
from specdeploy.front.config import BACKUP_SUFFIX, Backend, FrontConfig, parse_backend
from specdeploy.front.runtime import RuntimeApi, SocketError, UnknownServerError
from specdeploy.profile import load_profile
from specdeploy.profile.load import parse_profile, read_profile_data, resolve_profile_path
from specdeploy.profile.schema import DEFAULT_FRONT_PATHS, FrontSpec

pytestmark = pytest.mark.timeout(60)


@pytest.fixture
def two(pem: Path, short_dir: Path) -> Iterator[tuple[support.Front, dict[str, support.EchoEngine]]]:
    """The real HAProxy over TLS in front of two engine stand-ins, a and b, both ready and UP."""
    with support.engines("a", "b") as engines:
        backends = [Backend(name=n, address="127.0.0.1", port=e.port) for n, e in engines.items()]
        config = support.front_config(short_dir, pem, backends)
        with support.running(config, short_dir, ready=("a", "b")) as front:
            yield front, engines


def _echo(body: bytes) -> dict[str, Any]:
    return json.loads(body)


# --------------------------------------------------------------------------- the profile's front: section


def test_the_profile_s_front_section_defaults_serve_only_the_v1_routes_and_health() -> None:
    front = load_profile("a6000-dflash").front  # the rehearsals move the port to 8443
    assert front.allow_paths == list(DEFAULT_FRONT_PATHS)
    assert front.allow_paths == ["/v1/chat/completions", "/v1/completions", "/v1/models", "/health"]
    assert front.timeout_server_s >= 600 and front.timeout_client_s >= 600
    assert front.runtime_socket == "/run/haproxy/admin.sock" and front.listen_port == 443


@pytest.mark.parametrize(
    ("section", "expected"),
    [
        (
            {"allow_paths": ["/v1/models", "/metrics"]},
            "expected only the engine's /v1/... routes, /health or /version, found '/metrics'",
        ),
        ({"allow_paths": ["/v1/../metrics"]}, "expected exact paths like /v1/chat/completions"),
        ({"allow_paths": ["/v1/models", "/v1/models"]}, "expected each path once, found ['/v1/models']"),
        ({"allow_paths": ["/tokenize"]}, "found '/tokenize'"),
        ({"timeout_server_s": 5}, "front.timeout_server_s: expected seconds between 30 and 86400, found 5"),
        ({"listen_address": "front.example"}, "front.listen_address: expected an IP address"),
        ({"listen_port": 0}, "greater than or equal to 1"),
        ({"runtime_socket": "admin.sock"}, "front.runtime_socket: expected an absolute path"),
        ({"cert_path": "/etc/haproxy/my cert.pem"}, "front.cert_path: expected an absolute path to a PEM file"),
        ({"deny_status": 200}, "Input should be 403 or 404"),
        ({"user": "root"}, "front.user: expected an unprivileged account (like haproxy), found 'root'"),
        ({"group": "Wheel Group"}, "front.group: expected a system account's name"),
        ({"chroot": "var/lib/haproxy"}, "front.chroot: expected an absolute path"),
        ({"server_state_file": "/var/lib/../../etc/passwd"}, "front.server_state_file: expected an absolute path"),
        ({"maxconn": 0}, "greater than or equal to 16"),
        ({"metrics_port": 443}, "front.metrics_port: expected a port other than listen_port (443), found 443"),
        ({"metrics_address": "localhost"}, "front.metrics_address: expected an IP address"),
        ({"backends": [{"name": "a"}]}, "Extra inputs are not permitted"),
    ],
)
def test_a_bad_front_section_is_refused_naming_the_field_what_was_expected_and_found(
    tmp_path: Path, section: dict[str, Any], expected: str
) -> None:
    data = read_profile_data(resolve_profile_path("cpu-rehearsal"))
    data["front"] = section
    path = tmp_path / "cpu-rehearsal.yaml"
    path.write_text(yaml.safe_dump(data))
    with pytest.raises(ProfileError) as info:
        parse_profile(read_profile_data(path), str(path))
    message = str(info.value)
    field = next(iter(section))
    assert f"field front.{field}" in message and expected in message, message
    assert str(path) in message


def test_a_backend_option_is_read_or_refused_with_its_expected_form() -> None:
    assert parse_backend("old=10.0.0.11:8000") == Backend(name="old", address="10.0.0.11", port=8000)
    assert parse_backend("new=[fd00::12]:8000@maint") == Backend(
        name="new", address="fd00::12", port=8000, state="maint"
    )
    for bad, says in [
        ("old=10.0.0.11", "expected NAME=ADDRESS:PORT[@ready|drain|maint], found 'old=10.0.0.11'"),
        ("old=10.0.0.11:8000@gone", "expected a state of ['ready', 'drain', 'maint'] after @, found 'gone'"),
        ("o/ld=10.0.0.11:8000", "backend name: expected letters"),
        ("old=10.0.0.11:70000", "less than or equal to 65535"),
    ]:
        with pytest.raises(UsageError) as info:
            parse_backend(bad)
        assert says in str(info.value), info.value
    with pytest.raises(UsageError, match=r"expected each server name once, found \['a'\]"):
        FrontConfig.of(
            FrontSpec(), [Backend(name="a", address="10.0.0.1", port=1), Backend(name="a", address="10.0.0.2", port=1)]
        )


# --------------------------------------------------------------------------- haproxy.cfg


def test_the_rendered_config_passes_the_real_haproxy_check_and_keeps_the_key_unlogged(
    pem: Path, tmp_path: Path
) -> None:
    """`haproxy -c` (the real one) accepts the file; the file never deletes or rewrites a header,
    captures none (the key is never logged), and its admin socket is root's only."""
    backends = [
        Backend(name="old", address="10.0.0.11", port=8000),
        Backend(name="new", address="fd00::12", port=8000, state="maint"),
        Backend(name="spare", address="localhost", port=8000, state="drain"),
    ]
    # the PEM file stands in for the engine CA and the front's client certificate too (tests/unit/test_front_listener.py
    # runs the mutual TLS itself)
    config = FrontConfig.of(
        load_profile("cpu-rehearsal").front, backends, cert_path=str(pem), engine_ca_path=str(pem),
        client_cert_path=str(pem),
    )  # fmt: skip
    text = haproxy.render(config)
    assert "Configuration file is valid" in haproxy.check(text)
    assert "acl allowed_path path -m str /v1/chat/completions /v1/completions /v1/models /health" in text
    assert "unless allowed_path" in text and "option httplog" in text
    assert f"stats socket {config.runtime_socket} mode 600 level admin" in text
    assert "server new [fd00::12]:8000 weight 100 ssl verify required" in text and text.count(" disabled\n") == 4
    assert "server old--backup 10.0.0.11:8000 backup weight 100 ssl verify required" in text  # each host's twin, out
    assert "server spare localhost:8000 weight 0\n" in text  # the front's own loopback: plain
    assert "timeout server 600s" in text and "timeout client 600s" in text
    lowered = "\n".join(line for line in text.lower().splitlines() if not line.lstrip().startswith("#"))
    assert "authorization" not in lowered and "capture" not in lowered and "del-header" not in lowered


def test_haproxy_check_refuses_a_config_whose_certificate_is_missing_with_a_clear_error(tmp_path: Path) -> None:
    config = FrontConfig.of(
        FrontSpec(), [Backend(name="a", address="127.0.0.1", port=8000)], cert_path=str(tmp_path / "none.pem")
    )
    with pytest.raises(haproxy.HaproxyConfigError) as info:
        haproxy.check(haproxy.render(config))
    message = str(info.value)
    assert "haproxy -c refused the rendered haproxy.cfg" in message and "none.pem" in message
    assert "the certificate is one PEM file holding the chain and the private key" in message


def test_front_render_writes_a_checked_config_and_refuses_a_bad_backend(cli: Any, pem: Path, tmp_path: Path) -> None:
    out = tmp_path / "haproxy.cfg"
    args = [
        "front",
        "render",
        "cpu-rehearsal",
        "--backend",
        "old=10.0.0.11:8100",
        "--backend",
        "new=10.0.0.12:8100@maint",
    ]
    result = cli(*args, "--cert", pem, "--engine-ca", pem, "--client-cert", pem, "-o", out, "--json")
    assert result.exit_code == 0, result.output
    data = json.loads(result.output)
    assert data["changed"] is True and data["validated"] is True and data["file"] == str(out)
    assert [b["state"] for b in data["backends"]] == ["ready", "maint"]
    assert "server new 10.0.0.12:8100 weight 100 ssl verify required" in out.read_text()
    again = cli(*args, "--cert", pem, "--engine-ca", pem, "--client-cert", pem, "-o", out, "--json")
    assert json.loads(again.output)["changed"] is False
    bad = cli("front", "render", "cpu-rehearsal", "--backend", "old:10.0.0.11", "--cert", pem)
    assert bad.exit_code == 2 and "expected NAME=ADDRESS:PORT" in bad.output


# --------------------------------------------------------------------------- through the real HAProxy


def test_through_the_front_over_tls_the_v1_routes_reach_an_engine_with_the_authorization_header_intact(
    two: tuple[support.Front, dict[str, support.EchoEngine]],
) -> None:
    front, engines = two
    status, body = front.request("GET", "/v1/models")
    assert status == 200 and _echo(body)["authorization"] == f"Bearer {support.KEY}"
    status, body = front.request("POST", "/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}]})
    echo = _echo(body)
    assert status == 200 and echo["path"] == "/v1/chat/completions" and echo["method"] == "POST"
    assert echo["authorization"] == f"Bearer {support.KEY}"
    status, body = front.request("GET", "/v1/models?limit=1")  # a query string does not change the path
    assert status == 200 and _echo(body)["path"] == "/v1/models?limit=1"
    status, _ = front.request("GET", "/health", key=None)
    assert status == 200
    seen = [r for e in engines.values() for r in e.requests()]
    assert len(seen) == 3 and all(auth == f"Bearer {support.KEY}" for _, _, auth in seen)
    time.sleep(0.2)  # HAProxy writes its log line when the request ends
    log = front.log.read_text()
    assert "/v1/chat/completions" in log, log[-2000:]  # requests are logged ...
    assert support.KEY not in log  # ... the key never


FORBIDDEN = [
    "/metrics",
    "/tokenize",
    "/detokenize",
    "/invocations",
    "/v1/../metrics",
    "/v1/models/../../metrics",
    "/health/../invocations",
    "//metrics",
    "/v1/%2e%2e/metrics",
    "/v1/chat%2Fcompletions",
    "/v1/models/",
    "/V1/MODELS",
    "/v1/models;x",
    "/v1/embeddings",
    "/version",
    "/docs",
    "/",
    "http://127.0.0.1/metrics",
]


def test_metrics_tokenize_invocations_path_tricks_and_unknown_paths_never_reach_an_engine(
    two: tuple[support.Front, dict[str, support.EchoEngine]],
) -> None:
    front, engines = two
    for path in FORBIDDEN:
        for method in ("GET", "POST"):
            status, body = front.request(method, path, {"prompt": "x"} if method == "POST" else None)
            assert status == 403, (method, path, status, body)
            assert body.decode() == haproxy.DENY_BODY
    reached = [r for e in engines.values() for r in e.requests()]
    assert reached == []  # the engines never saw one of them


def test_draining_lets_an_in_flight_stream_finish_while_new_requests_go_to_the_other_engine(
    two: tuple[support.Front, dict[str, support.EchoEngine]],
) -> None:
    front, engines = two
    streamed: dict[str, Any] = {}

    def stream() -> None:
        conn = front.connection(timeout=30)
        try:
            conn.request("POST", "/v1/completions", **front._payload({"prompt": "x", "stream": True}, support.KEY))
            response = conn.getresponse()
            streamed["status"], streamed["body"] = response.status, response.read()
        finally:
            conn.close()

    client = threading.Thread(target=stream)
    client.start()
    deadline = time.monotonic() + 10
    while not any(e.streaming.is_set() for e in engines.values()):
        assert time.monotonic() < deadline, "the stream reached no engine"
        time.sleep(0.02)
    busy = next(name for name, e in engines.items() if e.streaming.is_set())
    other = next(name for name in engines if name != busy)

    api = RuntimeApi(front.socket)
    progress: list[tuple[str, int]] = []
    balancer = HAProxyBalancer(
        api, drain_timeout_s=20, poll_s=0.1, progress=lambda s, left, _: progress.append((s, left))
    )
    assert isinstance(balancer, Balancer)
    drained = threading.Thread(target=balancer.drain, args=(busy,))
    drained.start()
    deadline = time.monotonic() + 5
    while {s.name: s.state for s in api.status()}[busy] != "drain":
        assert time.monotonic() < deadline
        time.sleep(0.02)
    assert api.sessions(busy) == 1
    for _ in range(6):  # new requests: all to the other engine
        status, body = front.request("GET", "/v1/models")
        assert status == 200 and _echo(body)["backend"] == other
    assert drained.is_alive() and client.is_alive()  # the drain waits for the stream, the stream goes on
    engines[busy].release.set()
    client.join(10)
    drained.join(10)
    assert not drained.is_alive() and not client.is_alive()
    assert streamed["status"] == 200 and streamed["body"].endswith(b"data: [DONE]\n\n")
    assert f'"backend": "{busy}"'.encode() in streamed["body"]
    assert progress and progress[0] == (busy, 1)  # the wait reported the request in flight
    assert api.sessions(busy) == 0 and [r for r in engines[busy].requests() if r[1] == "/v1/models"] == []


def test_maint_takes_a_server_out_and_ready_puts_it_back(
    two: tuple[support.Front, dict[str, support.EchoEngine]],
) -> None:
    front, engines = two
    api = RuntimeApi(front.socket)
    api.set_state("a", "maint")
    status = {s.name: s for s in api.status()}
    assert status["a"].state == "maint" and status["a"].status == "MAINT" and status["b"].status.startswith("UP")
    for _ in range(6):
        assert _echo(front.request("GET", "/v1/models")[1])["backend"] == "b"
    api.set_state("a", "ready")
    api.set_state("b", "maint")
    api.wait_up("a", 10, poll_s=0.05)
    for _ in range(3):
        assert _echo(front.request("GET", "/v1/models")[1])["backend"] == "a"
    assert [path for _, path, _ in engines["a"].requests()] == ["/v1/models"] * 3  # nothing while it was out


def test_the_cutover_through_haproxy_brings_new_in_and_takes_old_out(pem: Path, short_dir: Path) -> None:
    """Outside a migration the front serves one host; the cutover adds the new host (rendered in
    maint), drains the old one and takes it out — the order issue 23 names."""
    with support.engines("old", "new") as engines:
        backends = [
            Backend(name="old", address="127.0.0.1", port=engines["old"].port),
            Backend(name="new", address="127.0.0.1", port=engines["new"].port, state="maint"),
        ]
        config = support.front_config(short_dir, pem, backends)
        with support.running(config, short_dir, ready=("old",)) as front:
            assert _echo(front.request("GET", "/v1/models")[1])["backend"] == "old"
            balancer = HAProxyBalancer(RuntimeApi(front.socket), drain_timeout_s=10, up_timeout_s=10, poll_s=0.05)
            steps = cutover(balancer, new="new", old="old")
            assert [(s["step"], s["server"]) for s in steps] == [
                ("add", "new"), ("drain", "old"), ("remove", "old"), ("backup", "old"),
            ]  # fmt: skip
            states = {s.name: (s.state, s.status) for s in balancer.status()}
            assert states["old"] == ("maint", "MAINT") and states["new"][0] == "ready"
            assert states["old--backup"][0] == "ready" and states["new--backup"][0] == "maint"
            raw = {row["srv_name"]: row["srv_admin_state"] for row in balancer.api.servers_state()}
            # FMAINT; CMAINT left over from `disabled`, yet ready (the twin as well)
            assert raw == {"old": "1", "new": "4", "old--backup": "4", "new--backup": "5"}
            for _ in range(3):  # the backup takes nothing while NEW is up
                assert _echo(front.request("GET", "/v1/models")[1])["backend"] == "new"


def test_haproxy_parses_requests_as_its_own_unprivileged_account_jailed_with_a_connection_limit(
    two: tuple[support.Front, dict[str, support.EchoEngine]],
) -> None:
    """The real HAProxy, started as root (as its service is) on the rendered file: the process that
    serves requests runs as Debian's `haproxy` account in its chroot, holding at most `maxconn`."""
    import pwd

    front, _ = two
    assert front.request("GET", "/v1/models")[0] == 200
    pid = front.worker_pid()
    status = dict(line.split(":", 1) for line in Path(f"/proc/{pid}/status").read_text().splitlines() if ":" in line)
    haproxy_uid = pwd.getpwnam("haproxy").pw_uid
    assert [int(u) for u in status["Uid"].split()] == [haproxy_uid] * 4, status["Uid"]
    assert os.readlink(f"/proc/{pid}/root") == "/var/lib/haproxy"
    info = RuntimeApi(front.socket).command("show info")
    assert "Maxconn: 4096" in info


def test_the_exporter_names_each_engine_host_s_state_as_the_alert_reads_it(
    two: tuple[support.Front, dict[str, support.EchoEngine]],
) -> None:
    """HAProxy's own Prometheus exporter (rendered on the front host's loopback): the series
    monitoring/alerts.yml's SpecdeployFrontServerOutOfService reads, parsed with prometheus_client's
    parser — 1 for the state each server is in, DRAIN for a drained one, MAINT for one taken out."""
    import httpx
    from prometheus_client.parser import text_string_to_metric_families

    front, _ = two
    api = RuntimeApi(front.socket)
    api.set_state("a", "drain")
    api.set_state("b", "maint")
    base = f"http://127.0.0.1:{front.config.metrics_port}"
    text = httpx.get(f"{base}/metrics", timeout=10).text
    states = {
        (s.labels["server"], s.labels["state"]): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
        if s.name == haproxy.SERVER_STATE_SERIES and s.labels.get("proxy") == "engines"
    }
    # each host's backup twin is in maint until a cutover: the alert leaves the twins out (monitoring/alerts.yml)
    assert {k for k, v in states.items() if v == 1} == {
        ("a", "DRAIN"), ("b", "MAINT"), ("a--backup", "MAINT"), ("b--backup", "MAINT"),
    }, states  # fmt: skip
    assert httpx.get(f"{base}/stats", timeout=10).status_code == 404  # /metrics only


def test_save_state_on_a_haproxy_still_running_debian_s_own_config_saves_no_server(cli: Any, short_dir: Path) -> None:
    """The front's first reload: HAProxy still runs the package's own haproxy.cfg (a stats socket, no
    `engines` backend) when the service's drop-in saves the states. The save must succeed with no
    server, or that first reload fails and the front is never installed (seen on the migration chain)."""
    import subprocess

    sock = short_dir / "admin.sock"
    cfg = short_dir / "debian.cfg"
    cfg.write_text(f"global\n    stats socket {sock} mode 660 level admin\ndefaults\n    mode http\n")
    process = subprocess.Popen(["haproxy", "-db", "-f", str(cfg)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 10
        while not sock.exists():
            assert time.monotonic() < deadline and process.poll() is None
            time.sleep(0.05)
        done = cli("front", "save-state", "--socket", sock, "--file", short_dir / "state", "--json")
        assert done.exit_code == 0, done.output
        assert json.loads(done.output)["servers_saved"] == 0
        assert (short_dir / "state").read_text().startswith("1\n# be_id ")
    finally:
        process.terminate()
        process.wait(10)


def test_a_reload_keeps_a_drained_server_drained_and_one_in_maint_out_once_the_states_are_saved(
    cli: Any, pem: Path, short_dir: Path
) -> None:
    """The real HAProxy in master-worker mode, reloaded as Debian's unit reloads it (SIGUSR2 to the
    master). First the failure this prevents: reloaded without saving, a drained server and one in
    maint come back ready and take requests. Then `specdeploy front save-state` (what the front's
    service runs before each reload): the same reload keeps both out, and only the third serves."""
    with support.engines("a", "b", "c") as engines:
        backends = [Backend(name=n, address="127.0.0.1", port=e.port) for n, e in engines.items()]
        config = support.front_config(short_dir, pem, backends)
        with support.running(config, short_dir, ready=("a", "b", "c"), master=True) as front:
            api = RuntimeApi(front.socket)

            def states() -> dict[str, str]:  # the hosts (their backup twins stay in maint throughout)
                return {s.name: s.state for s in api.status() if not s.name.endswith(BACKUP_SUFFIX)}

            api.set_state("a", "drain")
            api.set_state("b", "maint")
            front.reload()
            assert states() == {"a": "ready", "b": "ready", "c": "ready"}  # what happened before save-state

            api.set_state("a", "drain")
            api.set_state("b", "maint")
            saved = cli("front", "save-state", "--socket", front.socket, "--file", config.server_state_file, "--json")
            assert saved.exit_code == 0, saved.output
            assert json.loads(saved.output)["servers_saved"] == 6  # three hosts and their twins
            assert oct(os.stat(config.server_state_file).st_mode & 0o777) == "0o600"
            front.reload()
            assert states() == {"a": "drain", "b": "maint", "c": "ready"}
            before = {name: len(engine.requests()) for name, engine in engines.items()}
            for _ in range(6):
                assert _echo(front.request("GET", "/v1/models")[1])["backend"] == "c"
            assert {name: len(engine.requests()) for name, engine in engines.items()} == before | {"c": before["c"] + 6}


def test_the_front_commands_show_and_change_server_states_through_the_runtime_api(
    cli: Any, two: tuple[support.Front, dict[str, support.EchoEngine]]
) -> None:
    front, _ = two
    shown = cli("front", "status", "--socket", front.socket, "--json")
    assert shown.exit_code == 0, shown.output
    assert {s["name"]: s["state"] for s in json.loads(shown.output)["servers"]} == {
        "a": "ready", "b": "ready", "a--backup": "maint", "b--backup": "maint",
    }  # fmt: skip
    drained = cli("front", "drain", "a", "--socket", front.socket, "--wait", "--timeout", "5", "--json")
    assert drained.exit_code == 0, drained.output
    data = json.loads(drained.output)
    assert data["state"] == "drain" and data["waited_s"] is not None
    assert {s["name"]: s["state"] for s in data["servers"]}["a"] == "drain"
    assert data["in_flight_before"] == 0  # each server's sessions, idle (the backup twins' too)
    assert data["sessions_before"] == {"a": 0, "b": 0, "a--backup": 0, "b--backup": 0}
    out = cli("front", "disable", "b", "--socket", front.socket)
    assert out.exit_code == 0 and "front disable: b is now maint" in out.output and "MAINT" in out.output
    back = cli("front", "enable", "b", "--socket", front.socket, "--wait", "--timeout", "10")
    assert back.exit_code == 0, back.output
    unknown = cli("front", "drain", "c", "--socket", front.socket)
    assert unknown.exit_code == 2
    assert "HAProxy has no server engines/c: its servers are ['a', 'b', 'a--backup', 'b--backup']" in unknown.output


# --------------------------------------------------------------------------- runtime API errors


def test_a_missing_socket_a_stale_socket_and_a_file_are_clear_errors(tmp_path: Path, short_dir: Path) -> None:
    with pytest.raises(SocketError) as info:
        RuntimeApi(tmp_path / "none.sock").status()
    assert "no such socket" in str(info.value) and "fix: start HAProxy" in str(info.value)
    assert info.value.exit_code == 2
    regular = tmp_path / "file.sock"
    regular.write_text("")
    with pytest.raises(SocketError, match="not a socket: expected HAProxy's unix socket"):
        RuntimeApi(regular).status()
    stale = short_dir / "stale.sock"
    left_over = socket.socket(socket.AF_UNIX)
    left_over.bind(str(stale))
    left_over.close()  # bound, never listening: what a dead HAProxy leaves behind
    with pytest.raises(SocketError, match="connection refused: the socket is left over"):
        RuntimeApi(stale).set_state("a", "drain")


def test_an_unknown_server_names_the_servers_haproxy_has(
    two: tuple[support.Front, dict[str, support.EchoEngine]],
) -> None:
    front, _ = two
    api = RuntimeApi(front.socket)
    for call in (lambda: api.set_state("nope", "drain"), lambda: api.sessions("nope")):
        with pytest.raises(UnknownServerError) as info:
            call()
        assert "HAProxy has no server engines/nope: its servers are ['a', 'b', 'a--backup', 'b--backup']" in str(
            info.value
        )


# --------------------------------------------------------------------------- the site's own balancer


def _hook(directory: Path, body: str) -> Path:
    hook = directory / "balancer-hook"
    hook.write_text(f"#!/bin/sh\n{body}\n")
    hook.chmod(0o755)
    return hook


def test_the_hook_balancer_calls_its_hook_with_verb_and_server_and_nothing_of_our_environment(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("SPECDEPLOY_API_KEY", support.KEY)
    calls = tmp_path / "calls"
    hook = _hook(
        tmp_path,
        f'echo "$*" >> {calls}\nenv | grep -c SPECDEPLOY_API_KEY >> {calls}\n'
        'if [ "$1" = status ]; then echo \'[{"name": "old", "state": "maint"}, {"name": "new", "state": "ready", '
        '"sessions": 2}]\'; fi',
    )
    balancer = HookBalancer(hook)
    assert isinstance(balancer, Balancer)
    steps = cutover(balancer, new="new", old="old")
    assert [s["step"] for s in steps] == ["add", "drain", "remove"]
    status = balancer.status()
    assert [(s.name, s.state, s.sessions) for s in status] == [("old", "maint", 0), ("new", "ready", 2)]
    lines = calls.read_text().splitlines()
    assert lines[0::2] == ["add new", "drain old", "remove old", "status"]
    assert set(lines[1::2]) == {"0"}  # the key in our environment never reached the hook


def test_a_failing_hook_is_a_clear_error_and_stops_the_cutover(tmp_path: Path) -> None:
    calls = tmp_path / "calls"
    hook = _hook(tmp_path, f'echo "$*" >> {calls}\nif [ "$1" = drain ]; then echo "pool busy" >&2; exit 3; fi')
    with pytest.raises(HookError) as info:
        cutover(HookBalancer(hook), new="new", old="old")
    message = str(info.value)
    assert (
        f"balancer hook `{hook} drain old` exited 3: pool busy" in message
        and "fix: the site's balancer did not drain old" in message
    )
    assert calls.read_text().splitlines() == ["add new", "drain old"]  # nothing after the failed step
    bad_status = _hook(tmp_path, "echo not json")
    with pytest.raises(HookError, match="printed no JSON"):
        HookBalancer(bad_status).status()
    not_executable = tmp_path / "plain"
    not_executable.write_text("#!/bin/sh\n")
    with pytest.raises(HookError, match="is a file that is not executable: expected an executable file"):
        HookBalancer(not_executable)
    with pytest.raises(HookError, match="expected an absolute path"):
        HookBalancer("balancer-hook")


def test_front_drain_with_a_hook_calls_it_and_refuses_a_socket_beside_it(cli: Any, tmp_path: Path) -> None:
    calls = tmp_path / "calls"
    hook = _hook(tmp_path, f'echo "$*" >> {calls}\nif [ "$1" = status ]; then echo \'[]\'; fi')
    result = cli("front", "drain", "old", "--hook", hook, "--json")
    assert result.exit_code == 0, result.output
    assert calls.read_text().splitlines() == ["drain old", "status"]
    both = cli("front", "status", "--hook", hook, "--socket", tmp_path / "s")
    assert both.exit_code == 2 and "name two balancers: expected one" in both.output


def test_no_unix_socket_path_the_front_renders_is_too_long_for_the_kernel() -> None:
    assert len(FrontSpec().runtime_socket.encode()) <= 107
    assert os.path.isabs(FrontSpec().cert_path)
