"""The site's front door under test: the real HAProxy (Debian's, started as a local process on
loopback ports), a throwaway self-signed certificate made with the real `openssl`, and small
engine stand-ins behind it.

What is real and what is not: HAProxy, its TLS, its allow-list, its health checks, its runtime
API and its draining are the real program's, from the haproxy.cfg `specdeploy.front.haproxy`
renders. The engines are not: each stand-in (`EchoEngine`) is a Python HTTP server in a thread
that answers /health, echoes every other request's path and Authorization header back as JSON,
records everything it was sent (so a test can assert a path never reached an engine), and streams
a chunked answer that stays open until the test releases it (`"stream": true`).
"""

from __future__ import annotations

import contextlib
import http.client
import json
import os
import signal
import socket
import ssl
import subprocess
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from specdeploy.front import haproxy
from specdeploy.front.config import Backend, FrontConfig
from specdeploy.profile.schema import FrontSpec

KEY = "sk-front-test-9f3b2c"  # the client's API key in these tests: it must reach the engine, never a log


def make_certificate(directory: Path) -> Path:
    """A self-signed certificate for localhost and 127.0.0.1 (P-256, one day) and its key, in one
    PEM file as HAProxy's `crt` reads it; the file also serves the client as its CA."""
    key, cert = directory / "key.pem", directory / "cert.pem"
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
         "-subj", "/CN=localhost", "-addext", "subjectAltName=DNS:localhost,IP:127.0.0.1",
         "-days", "1", "-keyout", str(key), "-out", str(cert)],
        check=True, capture_output=True, timeout=60,
    )  # fmt: skip
    pem = directory / "site.pem"
    pem.write_bytes(cert.read_bytes() + key.read_bytes())
    pem.chmod(0o600)
    return pem


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


@dataclass
class EchoEngine:
    """An engine stand-in: /health 200; anything else echoed back (backend name, method, path,
    Authorization); a body with "stream": true streams one chunk, waits for `release`, then ends."""

    name: str
    seen: list[tuple[str, str, str | None]] = field(default_factory=list)  # (method, path, authorization)
    streaming: threading.Event = field(default_factory=threading.Event)
    release: threading.Event = field(default_factory=threading.Event)
    port: int = 0
    hold_s: float = 30.0  # how long a stream is held open at most (until `release`)
    token_s: float | None = None  # when set, a stream lasts max_tokens × token_s (as an engine's decode)
    open_streams: int = 0  # served on /metrics as vLLM's gauge of running requests
    gauges_served: list[int] = field(default_factory=list)  # open_streams at each /metrics answer
    server: Any = None  # its HTTP server (engines() sets it)

    def kill(self) -> None:
        """The engine gone: its port closed (connections refused from now on)."""
        self.release.set()
        self.server.shutdown()
        self.server.server_close()

    def requests(self) -> list[tuple[str, str, str | None]]:
        """What reached this engine, the front's health checks aside."""
        return [r for r in self.seen if r[1] != "/health"]


def _handler(engine: EchoEngine) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *args: Any) -> None:
            pass

        def _answer(self) -> None:
            length = int(self.headers.get("Content-Length") or 0)
            body = self.rfile.read(length) if length else b""
            engine.seen.append((self.command, self.path, self.headers.get("Authorization")))
            if self.path == "/health":
                self._send(200, b"")
                return
            if self.path == "/metrics":  # vLLM's names for the requests in flight (smoke.idle reads them)
                engine.gauges_served.append(engine.open_streams)
                gauges = (
                    f'vllm:num_requests_running{{model_name="m"}} {float(engine.open_streams)}\n'
                    'vllm:num_requests_waiting{model_name="m"} 0.0\n'
                )
                self._send(200, gauges.encode())
                return
            try:
                request = json.loads(body) if body else {}
            except ValueError:
                request = {}
            echo = {
                "backend": engine.name,
                "method": self.command,
                "path": self.path,
                "authorization": self.headers.get("Authorization"),
            }
            if isinstance(request, dict) and request.get("stream"):
                self.send_response(200)
                self.send_header("Content-Type", "text/event-stream")
                self.send_header("Transfer-Encoding", "chunked")
                self.end_headers()
                engine.open_streams += 1
                self._chunk(b"data: " + json.dumps(echo).encode() + b"\n\n")
                engine.streaming.set()
                hold = engine.hold_s
                if engine.token_s is not None and isinstance(request.get("max_tokens"), int):
                    hold = min(hold, request["max_tokens"] * engine.token_s)
                engine.release.wait(hold)
                engine.open_streams -= 1
                self._chunk(b"data: [DONE]\n\n")
                self.wfile.write(b"0\r\n\r\n")
                self.wfile.flush()
                return
            self._send(200, json.dumps(echo).encode(), "application/json")

        def _chunk(self, data: bytes) -> None:
            self.wfile.write(f"{len(data):x}\r\n".encode() + data + b"\r\n")
            self.wfile.flush()

        def _send(self, status: int, body: bytes, kind: str = "text/plain") -> None:
            self.send_response(status)
            self.send_header("Content-Type", kind)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        do_GET = do_POST = do_PUT = do_DELETE = do_OPTIONS = _answer

    return Handler


class _Server(ThreadingHTTPServer):
    daemon_threads = True

    def handle_error(self, request: Any, client_address: Any) -> None:
        """HAProxy closes a health check's connection once it has read the status: not an error."""


@contextlib.contextmanager
def engines(*names: str) -> Iterator[dict[str, EchoEngine]]:
    """Engine stand-ins on loopback ports, shut down on exit (a held stream is released first)."""
    started: dict[str, EchoEngine] = {}
    servers = []
    try:
        for name in names:
            engine = EchoEngine(name)
            server = _Server(("127.0.0.1", 0), _handler(engine))
            engine.port = server.server_address[1]
            engine.server = server
            threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()
            servers.append(server)
            started[name] = engine
        yield started
    finally:
        for engine in started.values():
            engine.release.set()
        for server in servers:
            server.shutdown()  # a second time for a killed one: returns at once
            server.server_close()


@dataclass
class Front:
    """A running HAProxy: its config, port, runtime socket, CA (the self-signed cert) and log."""

    config: FrontConfig
    cfg: Path
    log: Path
    process: subprocess.Popen[bytes]

    @property
    def port(self) -> int:
        return self.config.listen_port

    @property
    def socket(self) -> Path:
        return Path(self.config.runtime_socket)

    def request(
        self, method: str, path: str, body: Any = None, *, key: str | None = KEY, timeout: float = 10
    ) -> tuple[int, bytes]:
        """One request through the front over verified TLS, on a connection of its own; the path is
        sent exactly as given (http.client normalises nothing)."""
        conn = self.connection(timeout)
        try:
            conn.request(method, path, **self._payload(body, key))
            response = conn.getresponse()
            return response.status, response.read()
        finally:
            conn.close()

    def connection(self, timeout: float = 10) -> http.client.HTTPSConnection:
        context = ssl.create_default_context(cafile=self.config.cert_path)
        return http.client.HTTPSConnection("127.0.0.1", self.port, context=context, timeout=timeout)

    @staticmethod
    def _payload(body: Any, key: str | None) -> dict[str, Any]:
        headers = {"Authorization": f"Bearer {key}"} if key else {}
        if body is None:
            return {"headers": headers}
        return {"headers": headers | {"Content-Type": "application/json"}, "body": json.dumps(body).encode()}

    def worker_pid(self) -> int:
        """The pid of the HAProxy process serving requests (the worker; `show info` on its socket)."""
        from specdeploy.front.runtime import RuntimeApi

        info = RuntimeApi(self.config.runtime_socket).command("show info")
        return int(next(line.split(":", 1)[1] for line in info.splitlines() if line.startswith("Pid:")))

    def reload(self, timeout: float = 15) -> None:
        """What `systemctl reload` does to Debian's unit (`kill -USR2 $MAINPID` to the master of
        `haproxy -W`): a new worker reads haproxy.cfg (and the server-state file) again; returns once
        the new worker answers on the runtime socket with its servers' first checks done."""
        before = self.worker_pid()
        self.process.send_signal(signal.SIGUSR2)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                if self.worker_pid() != before:
                    time.sleep(4 * self.config.check_interval_s + 0.3)
                    return
            except Exception:
                pass
            time.sleep(0.05)
        raise RuntimeError(f"haproxy did not reload within {timeout} s: {self.log.read_text()[-2000:]}")

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(5)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(5)


def front_config(directory: Path, pem: Path, backends: list[Backend], **overrides: Any) -> FrontConfig:
    """The front on a free loopback port, its socket in `directory`, logging to its stderr, with
    health checks every 100 ms (the profile's defaults otherwise)."""
    settings = {
        "listen_address": "127.0.0.1",
        "listen_port": free_port(),
        "cert_path": str(pem),
        "runtime_socket": str(directory / "admin.sock"),
        "log": "stderr",
        "check_interval_s": 0.1,
        "server_state_file": str(directory / "server-state"),
        "metrics_port": free_port(),
    } | overrides
    return FrontConfig.of(FrontSpec(), backends, **settings)


@contextlib.contextmanager
def running(
    config: FrontConfig, directory: Path, *, ready: tuple[str, ...] = (), master: bool = False
) -> Iterator[Front]:
    """Start the real haproxy (foreground, `-db`; `master`: as Debian's unit does, a master and its
    worker, `-W`, so that `Front.reload` can reload it) on `config`'s rendered file; wait until it
    listens, its runtime socket answers and the servers named in `ready` are UP; stop it on exit
    (SIGTERM, then SIGKILL), whatever happened."""
    from specdeploy.front.runtime import RuntimeApi

    cfg = directory / "haproxy.cfg"
    cfg.write_text(haproxy.render(config))
    log = directory / "haproxy.log"
    # the master's own CLI: it answers once the master is in its loop, its reload signal handled
    # (a SIGUSR2 sent before that is lost)
    master_socket = directory / "master.sock"
    with log.open("wb") as sink:
        mode = ["-W", "-S", str(master_socket)] if master else []
        process = subprocess.Popen(
            ["haproxy", *mode, "-db", "-f", str(cfg)], stdout=sink, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL
        )
    front = Front(config, cfg, log, process)
    try:
        deadline = time.monotonic() + 15
        api = RuntimeApi(config.runtime_socket)
        while True:
            if process.poll() is not None:
                raise RuntimeError(f"haproxy exited {process.returncode}: {log.read_text()[-2000:]}")
            try:
                with socket.create_connection(("127.0.0.1", config.listen_port), timeout=1):
                    pass
                states = {s.name: s.status for s in api.status()}
                if master:
                    _master_answers(master_socket)
                if all(states.get(name, "").startswith("UP") for name in ready):
                    break
            except OSError:
                pass
            except Exception:
                if time.monotonic() > deadline:
                    raise
            if time.monotonic() > deadline:
                raise RuntimeError(f"haproxy not ready within 15 s: {log.read_text()[-2000:]}")
            time.sleep(0.05)
        yield front
    finally:
        front.stop()
        with contextlib.suppress(FileNotFoundError):
            os.unlink(config.runtime_socket)


def _master_answers(path: Path) -> None:
    """`show proc` on HAProxy's master CLI: an OSError until the master answers it."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as conn:
        conn.settimeout(2)
        conn.connect(str(path))
        conn.sendall(b"show proc\n")
        if b"master" not in conn.recv(65536):
            raise OSError("the master CLI has not answered yet")


def stream_in_background(port: int) -> threading.Thread:
    """A streaming chat request to the engine at `port` (straight to it, as an internal client's), read
    to its end on a thread of its own."""
    import httpx

    def read() -> None:
        url = f"http://127.0.0.1:{port}/v1/chat/completions"
        with httpx.stream("POST", url, json={"stream": True}, timeout=90) as response:
            for _ in response.iter_lines():
                pass

    thread = threading.Thread(target=read, daemon=True)
    thread.start()
    return thread
