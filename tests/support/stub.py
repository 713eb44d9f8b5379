"""Loopback stub servers for the tests that need an HTTP peer no real component can play (an
engine answering a body it never should, a hub that fails): on 127.0.0.1 and a free port only,
each in a daemon thread, all stopped when the test ends. A hub stand-in is served over https
(`tls=True`, a certificate from the rehearsal's site CA: `CA` verifies it), as every endpoint
specdeploy fetches weights from must be."""

from __future__ import annotations

import ssl
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

from specdeploy.core.cache import cache_dir
from specdeploy.rehearsal import site_ca


def certificate() -> site_ca.Issued:
    """The loopback certificate of every https stand-in (its `ca` is the file `--ca-file` takes)."""
    return site_ca.issue(cache_dir() / "test-tls", ips=["127.0.0.1"])


def ca() -> Path:
    return certificate().ca


class Stubs:
    def __init__(self) -> None:
        self.servers: list[ThreadingHTTPServer] = []

    def start(self, handler: type[BaseHTTPRequestHandler], *, tls: bool = False) -> str:
        """Serve `handler` on a loopback port (over https with `tls`); its base URL."""
        server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
        server.daemon_threads = True
        if tls:
            issued = certificate()
            context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
            context.load_cert_chain(issued.cert, issued.key)
            server.socket = context.wrap_socket(server.socket, server_side=True)
        threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()
        self.servers.append(server)
        return f"{'https' if tls else 'http'}://127.0.0.1:{server.server_address[1]}"


@contextmanager
def stubs() -> Iterator[Stubs]:
    """`with stubs() as s: url = s.start(Handler)` — every server started is shut down on exit."""
    started = Stubs()
    try:
        yield started
    finally:
        for server in started.servers:
            server.shutdown()
            server.server_close()
