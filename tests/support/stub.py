"""Loopback stub servers for the tests that need an HTTP peer no real component can play (an
engine answering a body it never should, a hub that fails): on 127.0.0.1 and a free port only,
each in a daemon thread, all stopped when the test ends."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


class Stubs:
    def __init__(self) -> None:
        self.servers: list[ThreadingHTTPServer] = []

    def start(self, handler: type[BaseHTTPRequestHandler]) -> str:
        """Serve `handler` on a loopback port; its base URL."""
        server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
        server.daemon_threads = True
        threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()
        self.servers.append(server)
        return f"http://127.0.0.1:{server.server_address[1]}"


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
