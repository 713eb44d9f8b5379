"""Bounded streaming load through the front, while cutover or rollback moves traffic.

Failure prevented: "zero failed requests" asserted by a step that sent none. The load keeps at
least `in_flight` streaming chat requests open at every moment (a new one starts as soon as one
ends) until `total` have been sent or it is told to stop, each long enough to outlast the drain,
and counts every one: sent, ok (a 200 whose stream sent JSON events and ended with `[DONE]`), failed
(anything else, with its reason). A client timeout far above a request's length keeps a slow CPU
engine from reading as a failure.
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


@dataclass
class Request:
    index: int
    started: float
    ended: float | None = None
    status: int | None = None
    ok: bool = False
    chunks: int = 0
    error: str | None = None


@dataclass
class LoadResult:
    requests: list[Request] = field(default_factory=list)
    max_in_flight: int = 0
    min_in_flight_while_running: int | None = None

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
            "failures": [asdict(r) for r in self.requests if not r.ok][:20],
        }


@dataclass
class LoadSpec:
    url: str  # the front's base URL, https://HOST:PORT
    api_key: str
    model: str
    total: int = 40
    in_flight: int = 2
    max_tokens: int = 256
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
        self._thread.join()
        return self.result

    def finish(self, timeout_s: float) -> LoadResult:
        """Wait until all `total` requests were sent and ended (then stop, whatever is left)."""
        self._thread.join(timeout_s)
        return self.stop()

    def wait_sent(self, n: int, timeout_s: float) -> bool:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.result.sent >= n:
                return True
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
            "max_tokens": self.spec.max_tokens,
            "min_tokens": self.spec.max_tokens,  # vLLM: no early stop, so every request outlasts the drain
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

    async def _run(self) -> None:
        async with self._client() as client:
            running: set[asyncio.Task[None]] = set()
            index = 0
            while True:
                while not self._stop.is_set() and len(running) < self.spec.in_flight and index < self.spec.total:
                    request = Request(index=index, started=time.monotonic())
                    self.result.requests.append(request)
                    running.add(asyncio.create_task(self._one(client, request)))
                    index += 1
                self.result.max_in_flight = max(self.result.max_in_flight, len(running))
                if len(running) == self.spec.in_flight:
                    self.started.set()
                if not running:
                    self.started.set()
                    return
                if not self._stop.is_set() and index < self.spec.total:
                    low = self.result.min_in_flight_while_running
                    self.result.min_in_flight_while_running = len(running) if low is None else min(low, len(running))
                _, running = await asyncio.wait(running, timeout=0.2, return_when=asyncio.FIRST_COMPLETED)
