"""A small client of HAProxy's runtime API over its unix socket (`stats socket PATH mode 600 level
admin`, haproxy.render writes it): one command per connection, HAProxy answers and closes.

- `set_state(server, ready|drain|maint)`: `set server <backend>/<server> state ...` (ready also
  sets the weight back, since a server rendered in `drain` has weight 0);
- `servers_state()`: `show servers state <backend>`, parsed by its header line;
- `save_state(path)`: every server's state, written (atomically) where `server-state-file` reads it
  back at the next start: a reload keeps a drained server drained;
- `stat()` and `sessions(server)`: `show stat` (CSV, parsed with `csv`), its `scur` column the
  server's current sessions — the requests still in flight on it;
- `wait_drained(server, timeout_s)`: polls `scur` down to 0, reporting progress;
- `status()`: one `ServerStatus` per server, what `specdeploy front status` prints.

Every failure is a `RuntimeApiError` with a hint: the socket missing, not a socket, not
permitted (the socket is root's), refused (HAProxy not running), an unknown server or backend.
Facts: docs/sources.md#front.
"""

from __future__ import annotations

import csv
import errno
import io
import socket
import stat as stat_module
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from specdeploy.core.errors import SpecdeployError
from specdeploy.front.config import BACKEND, STATES, WEIGHT

DEFAULT_TIMEOUT_S = 10.0
REPLY_LIMIT = 16 * 1024 * 1024
# srv_admin_state bits (HAProxy's enum srv_admin, include/haproxy/server-t.h): maintenance is
# SRV_ADMF_MAINT = 0x23 (forced, inherited, DNS resolution) — not CMAINT (0x04), which stays set on a
# server rendered `disabled` after it was put back to ready; drain is SRV_ADMF_DRAIN = 0x18
_MAINT_BITS = 0x23
_DRAIN_BITS = 0x18


class RuntimeApiError(SpecdeployError):
    """HAProxy's runtime API refused a command or could not be reached."""

    exit_code = 1


class SocketError(RuntimeApiError):
    """The runtime API's socket is missing, not a socket, not permitted or refused: bad input (exit 2)."""

    exit_code = 2


class UnknownServerError(RuntimeApiError):
    """No such server (or backend) in the running HAProxy: bad input (exit 2)."""

    exit_code = 2


class DrainTimeoutError(RuntimeApiError):
    """A draining server still had requests in flight when the wait ended."""

    exit_code = 1


@dataclass(frozen=True)
class ServerStatus:
    """One server as the running HAProxy sees it."""

    name: str
    address: str
    state: str  # the admin state: ready, drain or maint
    status: str  # show stat's status: UP, DOWN, DRAIN, MAINT, "UP 1/3", no check, ...
    sessions: int  # requests in flight (scur)
    weight: int
    served_total: int  # requests it has taken since HAProxy started (stot): 0 for a host no traffic reached
    check: str  # the last health check's status (L7OK, L4CON, ...) and its description

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def admin_state(bits: int) -> str:
    """ready, drain or maint, from `show servers state`'s srv_admin_state."""
    if bits & _MAINT_BITS:
        return "maint"
    return "drain" if bits & _DRAIN_BITS else "ready"


class RuntimeApi:
    """The runtime API of one HAProxy, at `socket_path`, for the servers of `backend`."""

    def __init__(self, socket_path: str | Path, *, backend: str = BACKEND, timeout_s: float = DEFAULT_TIMEOUT_S):
        self.socket_path = Path(socket_path)
        self.backend = backend
        self.timeout_s = timeout_s

    # ------------------------------------------------------------------ the wire

    def _socket_problem(self, exc: OSError | None = None) -> SocketError:
        path = self.socket_path
        hint = (
            "start HAProxy with the front's haproxy.cfg (its `stats socket` line names this path), or pass the "
            "--socket it names"
        )
        if exc is not None and exc.errno in (errno.EACCES, errno.EPERM):
            return SocketError(
                f"HAProxy runtime API {path}: permission denied (the socket is mode 600, its owner's only)",
                hint="run this as root (or as the user HAProxy created the socket for)",
            )
        if not path.exists() and not path.is_symlink():
            return SocketError(f"HAProxy runtime API {path}: no such socket", hint=hint)
        mode = path.stat().st_mode if path.exists() else 0
        if path.exists() and not stat_module.S_ISSOCK(mode):
            kind = "a directory" if stat_module.S_ISDIR(mode) else "not a socket"
            return SocketError(f"HAProxy runtime API {path}: {kind}: expected HAProxy's unix socket", hint=hint)
        if exc is not None and exc.errno == errno.ECONNREFUSED:
            return SocketError(
                f"HAProxy runtime API {path}: connection refused: the socket is left over from a HAProxy that is "
                "no longer running",
                hint="start (or restart) HAProxy, then run this again",
            )
        reason = exc.strerror if exc is not None else "cannot be reached"
        return SocketError(f"HAProxy runtime API {path}: {reason}", hint=hint)

    def command(self, line: str) -> str:
        """Send one command, return HAProxy's whole answer."""
        if "\n" in line or ";" in line:
            raise RuntimeApiError(f"one runtime API command at a time, found {line!r}")
        conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        conn.settimeout(self.timeout_s)
        try:
            try:
                conn.connect(str(self.socket_path))
            except OSError as exc:
                raise self._socket_problem(exc) from None
            conn.sendall(line.encode() + b"\n")
            chunks: list[bytes] = []
            size = 0
            while True:
                data = conn.recv(65536)
                if not data:
                    break
                chunks.append(data)
                size += len(data)
                if size > REPLY_LIMIT:
                    raise RuntimeApiError(f"`{line}`: the answer passed {REPLY_LIMIT} bytes")
        except TimeoutError:
            raise RuntimeApiError(
                f"HAProxy runtime API {self.socket_path}: no answer to `{line}` within {self.timeout_s:g} s",
                hint="check that HAProxy is running and not overloaded",
            ) from None
        except OSError as exc:
            raise RuntimeApiError(f"HAProxy runtime API {self.socket_path}: `{line}`: {exc.strerror or exc}") from None
        finally:
            conn.close()
        return b"".join(chunks).decode("utf-8", errors="replace")

    def _checked(self, line: str, server: str | None = None) -> str:
        reply = self.command(line)
        text = reply.strip()
        if text.startswith(("No such server", "No such backend")):
            raise self._unknown(server or "?")
        if text.startswith(("Permission denied", "Unknown command")):
            raise RuntimeApiError(
                f"HAProxy runtime API {self.socket_path}: `{line}`: {text.splitlines()[0]}",
                hint="the socket needs `level admin` (haproxy.render writes it so)",
            )
        return reply

    def _unknown(self, server: str) -> UnknownServerError:
        try:
            known = [row["srv_name"] for row in self.servers_state()]
        except RuntimeApiError:
            known = []
        return UnknownServerError(
            f"HAProxy has no server {self.backend}/{server}: its servers are {known}",
            hint="name one of the servers the front's haproxy.cfg renders (`specdeploy front status` lists them)",
        )

    # ------------------------------------------------------------------ commands

    def set_state(self, server: str, state: str) -> None:
        """`set server <backend>/<server> state <state>`; ready also sets the weight back to the
        rendered one (a server rendered in drain has weight 0)."""
        if state not in STATES:
            raise RuntimeApiError(f"server state: expected one of {list(STATES)}, found {state!r}")
        self._require_name(server)
        reply = self._checked(f"set server {self.backend}/{server} state {state}", server).strip()
        if reply:
            raise RuntimeApiError(f"HAProxy refused `set server {self.backend}/{server} state {state}`: {reply}")
        if state == "ready":
            reply = self._checked(f"set weight {self.backend}/{server} {WEIGHT}", server).strip()
            if reply:
                raise RuntimeApiError(f"HAProxy refused `set weight {self.backend}/{server} {WEIGHT}`: {reply}")

    def servers_state(self) -> list[dict[str, str]]:
        """`show servers state <backend>`: one dict per server, keyed by the header's names."""
        reply = self._checked(f"show servers state {self.backend}")
        lines = [line for line in reply.splitlines() if line.strip()]
        header = next((line for line in lines if line.startswith("# ")), None)
        if header is None:
            raise RuntimeApiError(f"`show servers state {self.backend}`: no header line in the answer: {reply[:200]!r}")
        names = header[2:].split()
        rows = []
        for line in lines[lines.index(header) + 1 :]:
            values = line.split()
            rows.append(dict(zip(names, values, strict=False)))
        return rows

    def save_state(self, path: str | Path) -> int:
        """Write `show servers state` (every backend's servers: admin state, weight) to `path`,
        atomically: the file HAProxy's `server-state-file` reads back at its next start, so a reload
        or restart keeps a drained or maintained server so. Returns the servers saved."""
        from specdeploy.core import atomic

        reply = self._checked("show servers state")
        lines = [line for line in reply.splitlines() if line.strip()]
        if not lines or not lines[0].strip().isdigit() or not any(line.startswith("# ") for line in lines):
            raise RuntimeApiError(
                f"`show servers state`: expected a version line and a header, found {reply[:200]!r}",
                hint="is this HAProxy 1.6 or later, and the socket its runtime API (level admin)?",
            )
        servers = len(lines) - 2
        atomic.write_bytes(Path(path), ("\n".join(lines) + "\n").encode(), mode=0o600)
        return servers

    def stat(self) -> list[dict[str, str]]:
        """`show stat`: the CSV rows of this backend's servers (not its FRONTEND/BACKEND summaries)."""
        reply = self._checked("show stat")
        text = reply.lstrip()
        if not text.startswith("# "):
            raise RuntimeApiError(f"`show stat`: expected CSV with a `# pxname,...` header, found {reply[:200]!r}")
        rows = csv.DictReader(io.StringIO(text[2:]))
        return [
            row
            for row in rows
            if row.get("pxname") == self.backend and row.get("svname") not in ("FRONTEND", "BACKEND")
        ]

    def failures(self) -> dict[str, int]:
        """The front's own count of requests that failed behind it since HAProxy started: the backend's
        5xx answers (its own 503 when no server could take a request included), connection errors and
        response errors (`show stat`'s hrsp_5xx, econ, eresp on the BACKEND row). A step reads it before
        and after moving traffic: the difference is what its clients saw fail."""
        reply = self._checked("show stat")
        rows = csv.DictReader(io.StringIO(reply.lstrip()[2:]))
        for row in rows:
            if row.get("pxname") == self.backend and row.get("svname") == "BACKEND":
                return {k: int(row.get(k) or 0) for k in ("hrsp_5xx", "econ", "eresp")}
        raise RuntimeApiError(f"`show stat`: no BACKEND row for {self.backend}")

    def _require_name(self, server: str) -> None:
        if not server or any(c.isspace() or c in "/;" for c in server):
            raise UnknownServerError(
                f"server name: expected a name without spaces, '/' or ';', found {server!r}",
                hint="name one of the servers `specdeploy front status` lists",
            )

    def sessions(self, server: str) -> int:
        """The server's current sessions (`show stat`'s scur): its requests in flight."""
        self._require_name(server)
        for row in self.stat():
            if row["svname"] == server:
                try:
                    return int(row.get("scur") or 0)
                except ValueError:
                    raise RuntimeApiError(f"`show stat`: scur of {server} is {row.get('scur')!r}") from None
        raise self._unknown(server)

    def status(self) -> list[ServerStatus]:
        """Every server of the backend: admin state, health, sessions, weight."""
        states = {row["srv_name"]: row for row in self.servers_state()}
        found = []
        for row in self.stat():
            state = states.get(row["svname"], {})
            try:
                admin = admin_state(int(state.get("srv_admin_state", "0")))
            except ValueError:
                admin = "?"
            check = " ".join(p for p in (row.get("check_status", ""), row.get("check_desc", "")) if p)
            found.append(
                ServerStatus(
                    name=row["svname"],
                    address=row.get("addr", ""),
                    state=admin,
                    status=row.get("status", ""),
                    sessions=int(row.get("scur") or 0),
                    weight=int(row.get("weight") or 0),
                    served_total=int(row.get("stot") or 0),
                    check=check,
                )
            )
        return found

    def wait_drained(
        self,
        server: str,
        timeout_s: float,
        *,
        poll_s: float = 0.5,
        progress: Callable[[int, float], None] | None = None,
    ) -> float:
        """Wait until `server` has no session left (its in-flight requests finished); the seconds
        it took. `progress(sessions, elapsed_s)` is called at each poll while some remain;
        DrainTimeoutError when `timeout_s` passes first."""
        started = time.monotonic()
        while True:
            left = self.sessions(server)
            elapsed = time.monotonic() - started
            if left == 0:
                return elapsed
            if elapsed >= timeout_s:
                raise DrainTimeoutError(
                    f"{self.backend}/{server} still has {left} request(s) in flight after {timeout_s:g} s",
                    hint="wait longer (--timeout), or take it out anyway with `specdeploy front disable` (its "
                    "in-flight requests are then cut when its engine stops)",
                )
            if progress is not None:
                progress(left, elapsed)
            time.sleep(min(poll_s, max(0.01, timeout_s - elapsed)))

    def wait_up(self, server: str, timeout_s: float, *, poll_s: float = 0.5) -> float:
        """Wait until the server's health check reports it UP (after `set_state(server, "ready")`)."""
        started = time.monotonic()
        while True:
            row = next((r for r in self.stat() if r["svname"] == server), None)
            if row is None:
                raise self._unknown(server)
            elapsed = time.monotonic() - started
            if row.get("status", "").startswith("UP"):
                return elapsed
            if elapsed >= timeout_s:
                raise RuntimeApiError(
                    f"{self.backend}/{server} is {row.get('status')!r}, not UP, after {timeout_s:g} s "
                    f"(last check: {row.get('check_status')} {row.get('check_desc')})",
                    hint="check that its engine is running and answers its health path on the address the front names",
                )
            time.sleep(poll_s)
