"""A token-checking reverse proxy in front of olah: it stands in for the hub's gating, which
olah has none of (docs/sources.md#olah). Without it the rehearsal would fetch gated weights
with no token at all and never meet the refusal production meets: an expired token or one
that has not accepted a repository's conditions would first fail on a real host.

Every request is forwarded to olah unchanged (method, body, Range, ETag and X-Repo-Commit /
X-Linked-* headers both ways; bodies streamed; a Location pointing at olah's own address
rewritten to the address the client used), except that a request naming a gated repository
needs `Authorization: Bearer <token>` with the configured token. Any other request is
answered as huggingface.co answers it: 401 with `X-Error-Code: GatedRepo`, which
huggingface_hub raises as GatedRepoError. The token comes from a file, never from argv; the
Authorization header is not passed on to olah, and only request lines are logged.

Standard library only: it runs with a bare `python3` in the hub's container.

    python3 gating.py --listen HOST:PORT --upstream http://HOST:PORT --token-file PATH --gated REPO [--gated REPO]
        [--tls-cert CERT --tls-key KEY]

With a certificate (the rehearsal always gives one, from its site CA) it serves https: the token
and the weights' file list never cross the test network in clear, as production demands.
"""

from __future__ import annotations

import argparse
import hmac
import http.client
import json
import socket
import ssl
import sys
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlsplit, urlunsplit

CHUNK = 1 << 16
# Hop-by-hop headers (RFC 9110 section 7.6.1) belong to one connection and are never forwarded.
HOP_BY_HOP = frozenset(
    ("connection", "keep-alive", "proxy-authenticate", "proxy-authorization", "te", "trailer", "transfer-encoding",
     "upgrade")
)  # fmt: skip


def gated_repo(path: str, gated: tuple[str, ...]) -> str | None:
    """The gated repository a request path names, if any.

    A path names a repository when the repository's two segments appear in it consecutively
    (after percent-decoding): /api/models/{repo}[/revision|tree|paths-info/...],
    /{repo}/resolve/..., /api/resolve-cache/models/{repo}/... — failing closed on any other
    route that names it. Compared case-insensitively, as the hub compares repository names.
    """
    segments = [s.lower() for s in unquote(urlsplit(path).path).split("/") if s]
    pairs = {"/".join(segments[i : i + 2]) for i in range(len(segments) - 1)}
    return next((repo for repo in gated if repo.lower() in pairs), None)


def refusal(repo: str) -> tuple[dict[str, str], bytes]:
    """huggingface.co's answer to an unauthenticated request for a gated repository."""
    message = (
        f"Access to model {repo} is restricted. You must have access to it and be authenticated to access it. "
        "Please log in."
    )
    body = json.dumps({"error": message}).encode()
    headers = {"X-Error-Code": "GatedRepo", "X-Error-Message": message, "Content-Type": "application/json"}
    return headers, body


class GatingProxy(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(
        self,
        listen: tuple[str, int],
        upstream: str,
        token: str,
        gated: tuple[str, ...],
        tls: ssl.SSLContext | None = None,
    ) -> None:
        super().__init__(listen, Handler)
        self.upstream = urlsplit(upstream)
        self.token = token
        self.gated = gated
        self.tls = tls
        self.scheme = "https" if tls is not None else "http"

    def get_request(self) -> tuple[socket.socket, Any]:
        """Each connection wrapped in TLS; its handshake runs in the connection's own thread (on the
        first read), so a client that stalls in it holds no one else up."""
        sock, address = super().get_request()
        if self.tls is not None:
            sock = self.tls.wrap_socket(sock, server_side=True, do_handshake_on_connect=False)
        return sock, address

    def handle_error(self, request: Any, client_address: Any) -> None:
        """A failed handshake (a client that does not trust the CA) is one line, not a traceback."""
        exc = sys.exc_info()[1]
        if isinstance(exc, ssl.SSLError | ConnectionError):
            sys.stderr.write(f"{client_address[0]}: TLS: {exc}\n")
            sys.stderr.flush()
            return
        super().handle_error(request, client_address)


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: GatingProxy

    def do_GET(self) -> None:  # noqa: N802
        self._handle()

    def do_HEAD(self) -> None:  # noqa: N802
        self._handle()

    def do_POST(self) -> None:  # noqa: N802 - huggingface_hub's get_paths_info
        self._handle()

    def log_message(self, format: str, *args: object) -> None:  # noqa: A002 - the base class's name
        """Request lines and status codes only: headers (the token's) are never logged."""
        sys.stderr.write(f"{self.address_string()} [{self.log_date_time_string()}] {format % args}\n")
        sys.stderr.flush()

    def _authorized(self) -> bool:
        scheme, _, credential = (self.headers.get("Authorization") or "").partition(" ")
        return scheme.lower() == "bearer" and hmac.compare_digest(
            credential.strip().encode(), self.server.token.encode()
        )

    def _handle(self) -> None:
        body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        repo = gated_repo(self.path, self.server.gated)
        if repo is not None and not self._authorized():
            headers, payload = refusal(repo)
            self._answer(401, headers, payload)
            return
        self._forward(body)

    def _answer(self, status: int, headers: dict[str, str], payload: bytes) -> None:
        self.send_response(status)
        for name, value in headers.items():
            self.send_header(name, value)
        self.send_header("Content-Length", str(len(payload)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(payload)

    def _forward(self, body: bytes) -> None:
        upstream = self.server.upstream
        headers = {
            name: value
            for name, value in self.headers.items()
            if name.lower() not in HOP_BY_HOP and name.lower() not in ("host", "authorization", "content-length")
        }
        if body:
            headers["Content-Length"] = str(len(body))
        connection = http.client.HTTPConnection(upstream.hostname or "", upstream.port or 80, timeout=300)
        try:
            try:
                connection.request(self.command, self.path, body=body or None, headers=headers)
                response = connection.getresponse()
            except OSError as exc:
                self._answer(502, {"Content-Type": "text/plain"}, f"upstream {upstream.netloc}: {exc}\n".encode())
                return
            self._relay(response)
        finally:
            connection.close()

    def _relay(self, response: http.client.HTTPResponse) -> None:
        self.send_response(response.status, response.reason)
        length = response.getheader("Content-Length")
        for name, value in response.getheaders():
            if name.lower() in HOP_BY_HOP or name.lower() in ("content-length", "date", "server"):
                continue  # framing is ours; send_response wrote Date and Server
            self.send_header(name, self._client_location(value) if name.lower() == "location" else value)
        has_body = self.command != "HEAD" and response.status not in (204, 304)
        chunked = has_body and length is None
        if length is not None:
            self.send_header("Content-Length", length)  # a HEAD's too: the client reads the file size from it
        elif chunked:
            self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        if not has_body:
            return
        while chunk := response.read(CHUNK):
            self.wfile.write(b"%x\r\n%s\r\n" % (len(chunk), chunk) if chunked else chunk)
        if chunked:
            self.wfile.write(b"0\r\n\r\n")

    def _client_location(self, location: str) -> str:
        """A redirect to olah's own address, rewritten to the address the client reached us at."""
        parts = urlsplit(location)
        client = self.headers.get("Host")
        if parts.netloc != self.server.upstream.netloc or not client:
            return location
        return urlunsplit(parts._replace(scheme=self.server.scheme, netloc=client))


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--listen", required=True, help="HOST:PORT to listen on")
    parser.add_argument("--upstream", required=True, help="olah's URL, http://HOST:PORT")
    parser.add_argument("--token-file", required=True, type=Path, help="file holding the one accepted token")
    parser.add_argument("--gated", action="append", default=[], help="a gated repository id (repeatable)")
    parser.add_argument("--tls-cert", type=Path, help="serve https with this certificate (PEM, the site CA's)")
    parser.add_argument("--tls-key", type=Path, help="the certificate's private key (PEM)")
    args = parser.parse_args(argv)
    tls = None
    if args.tls_cert is not None:
        tls = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        tls.minimum_version = ssl.TLSVersion.TLSv1_2
        tls.load_cert_chain(args.tls_cert, args.tls_key)
    token = args.token_file.read_text().strip()
    if not token:
        parser.error(f"{args.token_file} holds no token")
    host, _, port = args.listen.rpartition(":")
    server = GatingProxy((host, int(port)), args.upstream, token, tuple(args.gated), tls)
    scheme = "https" if tls is not None else "http"
    sys.stderr.write(f"gating {', '.join(args.gated) or 'nothing'} on {scheme}://{args.listen} -> {args.upstream}\n")
    sys.stderr.flush()
    server.serve_forever()


if __name__ == "__main__":
    main()
