"""Streaming load through the balancer, with each request's outcome and the board that served it.

Why: what the fleet must show (spec §3 scale-out behind a balancer; §10–§12 rolling upgrade) is
about *requests*: none failed or refused while a board drains and reloads, the only failures after
a ``kill -9`` are the killed board's own streams (each a clean error or a closed stream, never a
hang), the load spread evenly, and every response after a rollout naming the new generation
(``system_fingerprint``). So each request is recorded whole — status, ``X-Calculet-Board`` (set by
the shipped HAProxy configuration), fingerprint, tokens, how it ended — by a closed loop of
concurrent OpenAI-style streaming clients (``/v1/completions``, ``stream: true``), bounded in count
or stopped by an event, never unbounded.
"""

from __future__ import annotations

import asyncio
import json
import threading
import time
from collections import Counter
from dataclasses import dataclass, field

import httpx


@dataclass(frozen=True)
class LoadSpec:
    clients: int = 16
    requests: int | None = 100
    """Total requests (None: until stopped)."""
    max_tokens: int = 8
    prompt: str = "calculet on many boards"
    model: str = "qwen3"
    timeout_s: float = 60.0
    """A request still running after this is a hang, recorded as a failure."""


@dataclass
class Outcome:
    index: int
    started: float
    ended: float
    status: int | None = None
    board: str | None = None
    fingerprint: str | None = None
    tokens: int = 0
    ok: bool = False
    error: str = ""
    ttft_s: float | None = None


@dataclass
class LoadResult:
    outcomes: list[Outcome]
    started: float
    ended: float
    notes: dict[str, object] = field(default_factory=dict)

    @property
    def wall_s(self) -> float:
        return self.ended - self.started

    @property
    def failed(self) -> list[Outcome]:
        return [o for o in self.outcomes if not o.ok]

    def by_board(self) -> dict[str, int]:
        return dict(sorted(Counter(o.board or "?" for o in self.outcomes if o.ok).items()))

    def summary(self) -> dict[str, object]:
        ok = [o for o in self.outcomes if o.ok]
        tokens = sum(o.tokens for o in ok)
        ttfts = sorted(o.ttft_s for o in ok if o.ttft_s is not None)
        return {"requests": len(self.outcomes), "ok": len(ok), "failed": len(self.failed),
                "statuses": dict(Counter(str(o.status) for o in self.failed)),
                "by_board": self.by_board(), "wall_s": round(self.wall_s, 3),
                "requests_per_s": round(len(ok) / self.wall_s, 3) if self.wall_s > 0 else 0.0,
                "tokens_per_s": round(tokens / self.wall_s, 3) if self.wall_s > 0 else 0.0,
                "ttft_p50_s": _quantile(ttfts, 0.5), "ttft_p99_s": _quantile(ttfts, 0.99)}


def _quantile(values: list[float], q: float) -> float | None:
    if not values:
        return None
    return round(values[min(len(values) - 1, int(q * len(values)))], 4)


async def _one(client: httpx.AsyncClient, spec: LoadSpec, index: int) -> Outcome:
    outcome = Outcome(index, time.perf_counter(), 0.0)
    body = {"model": spec.model, "prompt": spec.prompt, "max_tokens": spec.max_tokens, "stream": True,
            "temperature": 0, "ignore_eos": True}
    try:
        async with asyncio.timeout(spec.timeout_s):
            async with client.stream("POST", "/v1/completions", json=body) as response:
                outcome.status = response.status_code
                outcome.board = response.headers.get("x-calculet-board")
                if response.status_code != 200:
                    outcome.error = (await response.aread()).decode("utf-8", "replace")[:200]
                    return outcome
                await _read_stream(response, outcome)
    except TimeoutError:
        outcome.error = f"hang: no end within {spec.timeout_s:g} s"
    except httpx.HTTPError as exc:
        outcome.error = f"{type(exc).__name__}: {exc}"
    finally:
        outcome.ended = time.perf_counter()
    return outcome


async def _read_stream(response: httpx.Response, outcome: Outcome) -> None:
    finished = done = False
    async for line in response.aiter_lines():
        if not line.startswith("data: "):
            continue
        data = line[6:]
        if data == "[DONE]":
            done = True
            break
        payload = json.loads(data)
        if "error" in payload:
            outcome.error = str(payload["error"].get("message", payload["error"]))[:200]
            continue
        outcome.fingerprint = payload.get("system_fingerprint", outcome.fingerprint)
        for choice in payload.get("choices", ()):
            if choice.get("text"):
                outcome.tokens += 1
                if outcome.ttft_s is None:
                    outcome.ttft_s = time.perf_counter() - outcome.started
            finished = finished or choice.get("finish_reason") is not None
    outcome.ok = done and finished and not outcome.error
    if not outcome.ok and not outcome.error:
        outcome.error = "stream closed before its end"


async def run_load(url: str, spec: LoadSpec, stop: threading.Event | None = None,
                   outcomes: list[Outcome] | None = None) -> LoadResult:
    """``spec.clients`` concurrent clients until ``spec.requests`` were sent or ``stop`` is set;
    each finished request is appended to ``outcomes`` as it ends (readable from another thread)."""
    outcomes = [] if outcomes is None else outcomes
    counter = iter(range(10**9))
    limits = httpx.Limits(max_connections=spec.clients, max_keepalive_connections=spec.clients)

    async def client_loop(client: httpx.AsyncClient) -> None:
        while stop is None or not stop.is_set():
            index = next(counter)
            if spec.requests is not None and index >= spec.requests:
                return
            outcomes.append(await _one(client, spec, index))

    started = time.perf_counter()
    async with httpx.AsyncClient(base_url=url, limits=limits, timeout=spec.timeout_s) as client:
        await asyncio.gather(*(client_loop(client) for _ in range(spec.clients)))
    return LoadResult(sorted(outcomes, key=lambda o: o.index), started, time.perf_counter())


def drive(url: str, spec: LoadSpec) -> LoadResult:
    """:func:`run_load` to its end, from synchronous code."""
    return asyncio.run(run_load(url, spec))


class BackgroundLoad:
    """Steady load in a thread while the caller does something else (a rollout, a ``kill -9``)."""

    def __init__(self, url: str, spec: LoadSpec) -> None:
        self.url = url
        self.spec = spec
        self.stop_event = threading.Event()
        self.result: LoadResult | None = None
        self.outcomes: list[Outcome] = []
        """The requests that ended so far (appended as they end)."""
        self._thread = threading.Thread(target=self._run, name="fleet-load", daemon=True)

    def _run(self) -> None:
        self.result = asyncio.run(run_load(self.url, self.spec, self.stop_event, self.outcomes))

    def started_after(self, mark: float) -> list[Outcome]:
        """The ended requests that started after ``mark`` (``time.perf_counter``)."""
        return [o for o in list(self.outcomes) if o.started > mark]

    def __enter__(self) -> BackgroundLoad:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.finish()

    def finish(self, timeout_s: float | None = None) -> LoadResult:
        """Stop sending, wait for the requests in flight to end, return every outcome."""
        self.stop_event.set()
        self._thread.join(timeout_s if timeout_s is not None else self.spec.timeout_s + 30)
        if self.result is None:
            raise RuntimeError("the load thread did not finish")
        return self.result


__all__ = ["BackgroundLoad", "LoadResult", "LoadSpec", "Outcome", "drive", "run_load"]
