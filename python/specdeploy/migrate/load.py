"""Bounded streaming load through the front, while cutover or rollback moves traffic.

Failure prevented: "zero failed requests" asserted by a step that sent none. The load keeps
`in_flight` streaming chat requests open (a new one starts as soon as one ends) until `total`
have been sent or it is told to stop, each long enough to outlast the drain, and counts every one:
sent, ok (a 200 whose stream sent JSON events and ended with `[DONE]`), failed (anything else, with
its reason). A client timeout far above a request's length keeps a slow CPU engine from reading as
a failure.

"At least 2 in flight at every moment" is measured, not assumed: `min_in_flight_while_running`
is the fewest requests open at any instant of the sustained window (from the moment `in_flight`
were first open to the last send, or the stop), swept from every request's start and end times —
an end counts before a start at the same instant, so the moment between a request's end and its
replacement's start is seen. Each of the `in_flight` slots is a loop of its own that starts its
next request in the same breath as its last one ends (no await between them), so ends that arrive
together — an engine decodes its batch step by step, and a busy client reads several last events
in one turn of its event loop — never open a gap wider than one request. (A single refill loop
woken after ends did: three streams ended in one turn on a loaded CI machine, and the count read 1.)
Each slot keeps a length of its own — `max_tokens`, then a sixteenth less per slot at four
(`tokens_for`) — so the drain meets streams at different stages. A stream is in flight at the front
only while its engine still decodes it: a slow reader does not keep it there (HAProxy takes a fast
engine's whole stream into the socket buffers and closes its side, and a drain finds the host idle).
"""

from __future__ import annotations

import asyncio
import json
import ssl
import threading
import time
from dataclasses import asdict, dataclass, field
from typing import Any

import httpx

from specdeploy.core import progress


@dataclass
class Request:
    index: int
    started: float
    slot: int = 0
    tokens: int = 0
    ended: float | None = None
    status: int | None = None
    ok: bool = False
    chunks: int = 0
    error: str | None = None


@dataclass
class LoadResult:
    requests: list[Request] = field(default_factory=list)
    max_in_flight: int = 0
    full_at: float | None = None  # when `in_flight` requests were first open
    sustained_until: float | None = None  # the last send, or the stop

    @property
    def min_in_flight_while_running(self) -> int | None:
        """The fewest requests open at any instant from `full_at` to `sustained_until` (None when
        the load never had `in_flight` open): swept from the requests' own start and end times."""
        if self.full_at is None or self.sustained_until is None:
            return None
        return min_open(self.requests, self.full_at, self.sustained_until)

    def open_at(self, when: float) -> int:
        """How many requests were open at `when` (this machine's monotonic clock): started, not ended."""
        return sum(1 for r in self.requests if r.started <= when and (r.ended is None or r.ended > when))

    @property
    def sent(self) -> int:
        return len(self.requests)

    @property
    def ok(self) -> int:
        return sum(1 for r in self.requests if r.ok)

    @property
    def failed(self) -> int:
        return self.sent - self.ok

    def to_json(self) -> dict[str, Any]:
        return {
            "sent": self.sent,
            "ok": self.ok,
            "failed": self.failed,
            "max_in_flight": self.max_in_flight,
            "min_in_flight_while_running": self.min_in_flight_while_running,
            "failures": [asdict(r) for r in self.requests if not r.ok][:20],
        }


def min_open(requests: list[Request], start: float, end: float) -> int:
    """The fewest of `requests` open at any instant of [start, end]: what was open at `start`,
    then the count right after each end inside the window (only an end lowers it; a request still
    running is open to the end; at one instant an end is counted before a start)."""
    events = [(r.started, 1) for r in requests] + [(r.ended, -1) for r in requests if r.ended is not None]
    events.sort(key=lambda e: (e[0], e[1]))  # -1 (an end) before +1 (a start) at the same instant
    count = sum(step for when, step in events if when <= start)
    low = count
    for when, step in events:
        if start < when <= end:
            count += step
            if step < 0:
                low = min(low, count)
    return low


def tokens_for(slot: int, spec: LoadSpec) -> int:
    """Slot `slot`'s request length: `max_tokens`, less `max_tokens / (4 × in_flight)` per slot."""
    return spec.max_tokens - slot * spec.max_tokens // (4 * spec.in_flight)


@dataclass
class LoadSpec:
    url: str  # the front's base URL, https://HOST:PORT
    api_key: str = field(repr=False)  # never in a repr, a log line or an assertion's message
    model: str
    total: int = 40
    in_flight: int = 4  # two ends may meet (in step, or by chance): 4 keeps at least 2 open then
    max_tokens: int = 256  # the longest request's; the shortest asks for a quarter less (`tokens_for`)
    timeout_s: float = 300.0
    ca_file: str | None = None  # the site CA that signed the front's certificate


class Load:
    """Runs in a thread of its own (its own event loop) so a step can move traffic meanwhile:
    `with Load(spec) as load: ...; result = load.stop()`."""

    def __init__(self, spec: LoadSpec) -> None:
        self.spec = spec
        self.result = LoadResult()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._main, name="specdeploy-load", daemon=True)
        self._in_flight = 0
        self._lock = threading.Lock()
        self.started = threading.Event()

    def __enter__(self) -> Load:
        self._thread.start()
        self.started.wait(timeout=self.spec.timeout_s)
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def stop(self) -> LoadResult:
        """Stop sending; wait for the requests in flight to end; the counts."""
        self._stop.set()
        self._join(None, "the load sends no more: its requests in flight finish")
        return self.result

    def finish(self, timeout_s: float) -> LoadResult:
        """Wait until all `total` requests were sent and ended (then stop, whatever is left)."""
        self._join(timeout_s, f"the load's {self.spec.total} requests are sent and finish")
        return self.stop()

    def now(self) -> str:
        """The load as it stands: `12 sent, 9 ok, 0 failed, 3 still streaming`."""
        requests = list(self.result.requests)  # one snapshot: the load's thread appends and ends them meanwhile
        ended = [r for r in requests if r.ended is not None]
        ok = sum(1 for r in ended if r.ok)
        return f"{len(requests)} sent, {ok} ok, {len(ended) - ok} failed, {len(requests) - len(ended)} still streaming"

    def _join(self, timeout_s: float | None, what: str) -> None:
        """Wait for the load's thread (at most `timeout_s`), inside a progress step: on a slow engine the
        last streams take a minute after a step ends, and `rehearsal migrate` went 61 s without a line
        there (issue 37). No line at all when it ends within the ticker's period."""
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        with progress.step(what, announce=False) as waiting:
            while self._thread.is_alive() and (deadline is None or time.monotonic() < deadline):
                waiting.observe(self.now())
                self._thread.join(timeout=0.5 if deadline is None else max(0.0, min(0.5, deadline - time.monotonic())))

    def wait_streaming(self, n: int, timeout_s: float) -> bool:
        """Wait until `n` requests are open and streaming (each has had an event from the engine): a
        request only sent may still be connecting, and a drain that came first would find none in flight
        on the host it drains (a cutover on a loaded machine did)."""
        deadline = time.monotonic() + timeout_s
        with progress.step(f"the load: {n} requests streaming", announce=False) as waiting:
            while time.monotonic() < deadline:
                if sum(1 for r in list(self.result.requests) if r.chunks > 0 and r.ended is None) >= n:
                    return True
                waiting.observe(self.now())
                time.sleep(0.1)
        return False

    def _main(self) -> None:
        asyncio.run(self._run())

    def _client(self) -> httpx.AsyncClient:
        verify: ssl.SSLContext | bool = True
        if self.spec.ca_file:
            verify = ssl.create_default_context(cafile=self.spec.ca_file)
        return httpx.AsyncClient(
            base_url=self.spec.url,
            verify=verify,
            timeout=httpx.Timeout(self.spec.timeout_s, connect=30.0),
            headers={"Authorization": f"Bearer {self.spec.api_key}"},
            limits=httpx.Limits(max_connections=self.spec.in_flight * 2, max_keepalive_connections=0),
        )

    async def _one(self, client: httpx.AsyncClient, request: Request) -> None:
        body = {
            "model": self.spec.model,
            "messages": [{"role": "user", "content": f"Tell a long story, number {request.index}."}],
            "max_tokens": request.tokens,
            "min_tokens": request.tokens,  # vLLM: no early stop, so each request outlasts the drain
            "temperature": 0,
            "stream": True,
        }
        done = False
        try:
            async with client.stream("POST", "/v1/chat/completions", json=body) as response:
                request.status = response.status_code
                if response.status_code != 200:
                    request.error = f"HTTP {response.status_code}: {(await response.aread())[:200]!r}"
                    return
                async for line in response.aiter_lines():
                    if not line.startswith("data: "):
                        continue
                    data = line[len("data: ") :]
                    if data == "[DONE]":
                        done = True
                        break
                    json.loads(data)  # every event must be JSON: a proxy's error page is not a stream
                    request.chunks += 1
            request.ok = done and request.chunks > 0
            if not request.ok:
                request.error = "the stream ended without [DONE]" if not done else "no event before [DONE]"
        except (httpx.HTTPError, json.JSONDecodeError, ssl.SSLError, OSError) as exc:
            request.error = f"{type(exc).__name__}: {exc}"
        finally:
            request.ended = time.monotonic()

    def _next(self, slot: int) -> Request | None:
        """Slot `slot`'s next request, started now; None once the load stops sending (told to, or
        `total` sent), which ends the sustained window at that moment if it had begun."""
        with self._lock:
            now = time.monotonic()
            if self._stop.is_set() or len(self.result.requests) >= self.spec.total:
                if self.result.full_at is not None and self.result.sustained_until is None:
                    self.result.sustained_until = now
                return None
            request = Request(len(self.result.requests), now, slot, tokens_for(slot, self.spec))
            self.result.requests.append(request)
            self._in_flight += 1
            self.result.max_in_flight = max(self.result.max_in_flight, self._in_flight)
            if self._in_flight == self.spec.in_flight and self.result.full_at is None:
                self.result.full_at = now
                self.started.set()
            return request

    async def _slot(self, client: httpx.AsyncClient, slot: int) -> None:
        while (request := self._next(slot)) is not None:
            await self._one(client, request)
            with self._lock:
                self._in_flight -= 1

    async def _run(self) -> None:
        try:
            async with self._client() as client:
                await asyncio.gather(*(self._slot(client, slot) for slot in range(self.spec.in_flight)))
        finally:
            self.started.set()  # a load that never filled its slots (total < in_flight) does not hang __enter__
