"""Overload through HTTP: a refused burst, Retry-After honoured, and streams under an ITL target (issue #13).

Figures of issue #13's "What it must show" that only the real service can give, measured on
``python -m calculet.run --sim-cost reference`` (the simulated NPU in real time on the assumed
§13.1 cost shape: 40 ms + 2.5 ms/lane per B1 decode step, 5 ms + 0.6 ms/token prefill — not
an NPU measurement) on 127.0.0.1, a server subprocess per configuration, an httpx client here.
Each figure is printed beside its baseline measured in the same run.

Part 1 — a burst (default 300 concurrent non-streaming completions, 16 tokens each, a 5 s
deadline: on B1 only a handful can finish on time). Per ``batch.deadline_order``: ``on_time``
(the default: refuse at admission what the shared-device estimate cannot finish, 429 with a
computed Retry-After) against ``at_risk`` (the old behaviour: accept, then expire). Reported:
time to the 429 (client-side, from the send to the response) P50/P99, the share of 429s that
carry ``Retry-After``, the outcome of one retry per refused client (it sleeps its Retry-After —
capped at ``--max-retry-wait`` — and retries once: admitted means not refused again), and goodput
(completions within the deadline, first try or retry, per second of the run), the requests the
on_time selection shed and the wasted device share from /metrics. The connection pool is opened
before the burst and one request warms the server up (``on_time`` estimates from the *measured*
step time). Two references in the same run separate the HTTP stack from the 429 path: the same
number of concurrent ``GET /health/live`` (the floor of a burst on one uvicorn process, h11, and
one Python client on this machine), and 50 refusals sent one at a time behind a request that
fills the device (the 429 path without the burst's queue). The decomposition the target is judged
against: the server's CPU per request (from ``/proc/<pid>/task/*/schedstat``: the event-loop thread
— the main thread, which answers all HTTP — and every thread together) during the floor and during
the burst, and a **bare** floor: the same 300 ``GET`` s against uvicorn serving a ten-line ASGI app
(no FastAPI, no middleware) with h11 — and with httptools when it is installed — in a subprocess of
its own: what one Python process costs per request before calculet adds anything. The loop's CPU per
request × the burst is the least wall time the last 429 can take on one loop (it runs the
requests one after another), whatever the admission decides; the other threads' CPU (the engine's
actor deciding each admission, the device) is mostly serial with it too, under the one interpreter lock.

Part 2 — 16 concurrent streaming clients × 32 tokens under ``admission.itl_target_ms: 200``
against no ITL target (both ``on_time``). Reported: inter-token latency P50/P99 over every
admitted stream's gaps, the worst stream's own ITL P99, TTFT P50/P99, streams refused (429) /
completed / failed after admission, and the device's busy share
(Δ ``calculet_device_busy_seconds_total`` / wall time of the run).

Figures, not a pass/fail test (DESIGN principle 10): the targets are printed beside them.

The server's HTTP/1.1 implementation is ``--http`` (``CALCULET_HTTP`` of the server: httptools, the default
when installed, or h11); ``--http h11,httptools`` runs part 1 with each, side by side in the same run.

The burst's CPU per request is given over two windows: up to the last first-try 429 (the server's CPU read every
5 ms; what the refusals, and the admissions among them, cost) and up to the first retry (at least the 1 s of the
smallest ``Retry-After``: it includes the device decoding what was admitted — most of the "all threads" share).
The server's own clock places the first 429 the admission snapshot gave, and the last first-try 429, after the burst's
first arrival (access lines' ``ts`` minus ``duration_s``): before the first, requests wait for the engine to admit what
fits (no snapshot can refuse yet). A retry carries ``X-Request-Id: retry-<client>`` (:data:`RETRY_ID`), so its 429, if
it is refused again, is counted apart: the log is read after the retries, and such a retry (about 1 s after the burst
for ``Retry-After: 1``) once read as the burst's last 429 (session 19: "1 026 ms", its first tries' P99 46 ms).
``--orders`` picks the deadline orders of part 1; ``--tree PATH`` serves part 1 from another source tree too (a
worktree of a base commit), a row of its own before each of this tree's, once per ``--tree`` given (``--tree
/tmp/base --tree /tmp/base``: two interleaved pairs); ``--no-bare`` skips the bare floor.
``--prompt TEXT`` sets the burst's prompt (default :data:`PROMPT`, 27 characters; its length is printed in the
header). ``--distinct`` gives each burst client a prompt of its own (the prompt + its index, one token-length class), as real
traffic has: with one body for all (the default), the server's memo of the route's parsing (the refusal lane's
``PreparedMemo``) parses it once, a best case; a client's retry resends its first try's body either way.
``--switch-ms 1,5`` serves part 1 once per interpreter switch interval (the server's ``CALCULET_SWITCH_INTERVAL_MS``,
``calculet.run``'s ``--switch-interval-ms``), a row per interval named by it, the intervals alternating in the order of
the runs: how the HTTP loop's wait for the lock a busy engine thread holds moves the time to 429.

    python bench/overload_http.py [--burst 300] [--burst-tokens 16] [--deadline-ms 5000]
                                  [--streams 16] [--stream-tokens 32] [--itl-target-ms 200]
                                  [--http h11,httptools] [--part all|burst|itl|bare] [--orders on_time,at_risk]
                                  [--tree PATH ...] [--no-bare] [--distinct] [--switch-ms 1,5]
"""

from __future__ import annotations

import argparse
import asyncio
import datetime
import json
import math
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from queue import Empty
from typing import Any

import httpx
import numpy as np
from prometheus_client.parser import text_string_to_metric_families

from calculet.server.http_server import HTTP_ENV
from service import Server  # bench/service.py: the real entry point as a subprocess (bench/ is sys.path[0])

PROMPT = "Calculet overload benchmark"
STREAM_PROMPT = "stream 2"
"""Its 32 greedy tokens on the bundled byte-level model each render text, so the client sees one SSE
chunk per token (a token that renders none — a special id, part of a UTF-8 sequence — would merge
two gaps into one); the table counts such silent tokens, so a changed model shows up."""
MODEL = "tiny-random"
"""The bundled model's alias (#18: random weights and a BPE tokenizer; ``qwen3`` would name a real model)."""
COUNTERS = ("calculet_request_goodput", "calculet_device_busy_seconds", "calculet_request_wasted_device_seconds",
            "calculet_scheduler_on_time_shed", "calculet_scheduler_on_time_refused", "calculet_front_refused",
            "calculet_front_held", "calculet_front_lane_refused", "calculet_front_lane_declined",
            "calculet_front_lane_held", "calculet_front_lane_memo_hits")


def _pct(values: Sequence[float], q: float) -> float:
    return float(np.percentile(np.asarray(values, dtype=np.float64), q, method="linear")) if values else float("nan")


def _thread_cpu(pid: int) -> tuple[float, float]:
    """(event-loop thread, every live thread) CPU seconds of process ``pid`` so far, from schedstat (ns).

    The main thread (tid == pid) runs uvicorn's event loop: it parses, routes and answers every request."""
    main = total = 0.0
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            seconds = int(Path(f"/proc/{pid}/task/{tid}/schedstat").read_text().split()[0]) / 1e9
        except (OSError, ValueError, IndexError):
            continue  # the thread ended meanwhile
        total += seconds
        if int(tid) == pid:
            main = seconds
    return main, total


class CpuMeter:
    """The server's CPU per request over one phase of the bench (event loop, all threads), in ms."""

    def __init__(self, pid: int, requests: int = 1) -> None:
        self.pid = pid
        self.requests = requests
        self.start = _thread_cpu(pid)
        self.taken: tuple[float, float] | None = None

    def per_request(self, requests: int) -> tuple[float, float]:
        main, total = _thread_cpu(self.pid)
        return (main - self.start[0]) * 1e3 / requests, (total - self.start[1]) * 1e3 / requests

    async def sampling(self, every_s: float) -> None:
        """Read the server's CPU every ``every_s`` until the window closes (:meth:`until` picks one reading)."""
        self.samples: list[tuple[float, float, float]] = []
        while self.taken is None:
            self.samples.append((time.perf_counter(), *_thread_cpu(self.pid)))
            await asyncio.sleep(every_s)

    def until(self, at: float) -> tuple[float, float]:
        """:meth:`per_request` over ``requests`` as read at the first sample at or after ``at`` (``perf_counter``)."""
        for when, main, total in self.samples:
            if when >= at:
                return (main - self.start[0]) * 1e3 / self.requests, (total - self.start[1]) * 1e3 / self.requests
        return self.close()

    def close(self) -> tuple[float, float]:
        """:meth:`per_request` over ``requests``, measured at the first call and kept (the window closes once)."""
        if self.taken is None:
            self.taken = self.per_request(self.requests)
        return self.taken


BARE_APP = """
import json, socket, sys
import uvicorn

async def app(scope, receive, send):
    if scope["type"] != "http":
        return
    body = b'{"status":"live","detail":null}'
    await send({"type": "http.response.start", "status": 200,
                "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]})
    await send({"type": "http.response.body", "body": body})

sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP)
sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
sock.bind(("127.0.0.1", 0))
sock.listen(2048)
print(json.dumps({"msg": "listening", "port": sock.getsockname()[1]}), file=sys.stderr, flush=True)
uvicorn.Server(uvicorn.Config(app, http=sys.argv[1], log_config=None, access_log=False, lifespan="off")).run(
    sockets=[sock])
"""
"""A bare ASGI app on uvicorn (``sys.argv[1]``: ``h11`` or ``httptools``), printing its port as calculet's
``listening`` line does (so :class:`service.Server` can start it)."""


def _http_impls() -> list[str]:
    """uvicorn's HTTP/1.1 implementations this environment has (h11 always; httptools if installed)."""
    try:
        import httptools  # noqa: F401
    except ImportError:
        return ["h11"]
    return ["h11", "httptools"]


@dataclass(frozen=True)
class BareFloor:
    http: str
    floor_ms: tuple[float, float]
    loop_cpu_ms: float


def bare_floor(home: Path, requests: int) -> list[BareFloor]:
    """The burst's floor on a bare uvicorn app per HTTP implementation (same client, same connections)."""
    rows = []
    for impl in _http_impls():
        path = os.pathsep.join(p for p in (str(Path(__file__).resolve().parents[1]), os.environ.get("PYTHONPATH")) if p)
        server = Server("", home, command=[sys.executable, "-c", BARE_APP, impl], env={"PYTHONPATH": path})
        try:
            host, port = server.url.removeprefix("http://").rsplit(":", 1)

            async def run() -> BareFloor:
                conns = [RawConnection(host, int(port)) for _ in range(requests)]
                await asyncio.gather(*(c.open() for c in conns))
                await _floor(conns, host)  # warm: the first requests of a process are slower
                meter = CpuMeter(server.proc.pid)
                floor = await _floor(conns, host)
                cpu = meter.per_request(requests)[0]
                await asyncio.gather(*(c.close() for c in conns))
                return BareFloor(impl, floor, cpu)

            rows.append(asyncio.run(run()))
        finally:
            server.stop()
    return rows


def _write_config(directory: Path, name: str, *, order: str, deadline_ms: int | None = None,
                  itl_ms: int | None = None) -> Path:
    """A calculet-scheduler/v1 file (JSON is YAML) with the §15 defaults plus the bench's settings."""
    admission: dict[str, Any] = {}
    if deadline_ms is not None:
        admission["deadline_default_ms"] = deadline_ms
    if itl_ms is not None:
        admission["itl_target_ms"] = itl_ms
    document = {"schema": "calculet-scheduler/v1", "model_alias": MODEL, "admission": admission,
                "batch": {"deadline_order": order}}
    path = directory / f"{name}.yaml"
    path.write_text(json.dumps(document))
    return path


def _body(tokens: int, stream: bool, prompt: str = PROMPT) -> dict[str, Any]:
    body: dict[str, Any] = {"model": MODEL, "prompt": prompt, "max_tokens": tokens, "temperature": 0,
                            "ignore_eos": True, "stream": stream}
    if stream:
        body["stream_options"] = {"include_usage": True}
    return body


async def _counters(client: httpx.AsyncClient) -> dict[str, float]:
    """:data:`COUNTERS` and the decode-cap gauge from /metrics, each summed over its labels."""
    response = await client.get("/metrics")
    response.raise_for_status()
    values: dict[str, float] = {}
    for family in text_string_to_metric_families(response.text):
        if family.name in COUNTERS or family.name == "calculet_scheduler_decode_cap_streams":
            values[family.name] = sum(s.value for s in family.samples if not s.name.endswith("_created"))
        if family.name == "calculet_front_forwarded":
            values.update({f"fwd {s.labels['reason']}": s.value for s in family.samples if s.name.endswith("_total")})
    return values


def _delta(after: dict[str, float], before: dict[str, float]) -> dict[str, float]:
    return {name: value - before.get(name, 0.0) for name, value in after.items()}


async def _warm(client: httpx.AsyncClient, connections: int) -> None:
    """Open the connection pool and let the server measure a decode step (one short completion)."""
    (await client.post("/v1/completions", json=_body(4, False))).raise_for_status()
    await asyncio.gather(*(client.get("/health/live") for _ in range(connections)))


# ---------------------------------------------------------------------------------------------
# part 1: the burst
# ---------------------------------------------------------------------------------------------


class RawConnection:
    """One keep-alive HTTP/1.1 connection driven by hand (asyncio streams, pre-encoded requests).

    Why not httpx for the burst: one Python httpx client spends about 2 ms of CPU per request on
    this machine, so 300 concurrent requests measure the client's own queue (the 300
    ``GET /health/live`` floor was 2.2 s P99 with httpx). Writing pre-built bytes and reading the
    status line and ``Content-Length`` body costs tens of microseconds, so the figure is the
    server's. A connection the server closes is reopened on the next request."""

    def __init__(self, host: str, port: int) -> None:
        self.host, self.port = host, port
        self.reader: asyncio.StreamReader | None = None
        self.writer: asyncio.StreamWriter | None = None

    async def open(self) -> None:
        self.reader, self.writer = await asyncio.open_connection(self.host, self.port)

    async def request(self, data: bytes) -> tuple[int, dict[str, str], float]:
        """(status, headers, seconds from the write to the response head) of one request; a kept-alive
        connection the server closed while idle (uvicorn's keep-alive timeout) is reopened once."""
        if self.writer is not None and not self.writer.is_closing():
            try:
                return await self._exchange(data)
            except (asyncio.IncompleteReadError, ConnectionResetError, BrokenPipeError):
                await self.close()
        await self.open()
        return await self._exchange(data)

    async def _exchange(self, data: bytes) -> tuple[int, dict[str, str], float]:
        assert self.reader is not None and self.writer is not None
        start = time.perf_counter()
        self.writer.write(data)
        head = await self.reader.readuntil(b"\r\n\r\n")
        took = time.perf_counter() - start
        lines = head.decode("latin-1").split("\r\n")
        headers = {k.strip().lower(): v.strip() for k, v in (line.split(":", 1) for line in lines[1:] if ":" in line)}
        await self.reader.readexactly(int(headers.get("content-length", "0")))
        if headers.get("connection", "").lower() == "close":
            await self.close()
        return int(lines[0].split()[1]), headers, took

    async def close(self) -> None:
        if self.writer is not None:
            self.writer.close()
            try:
                await self.writer.wait_closed()
            except OSError:
                pass
            self.writer = self.reader = None


def _raw(method: str, path: str, host: str, body: dict[str, Any] | None = None,
         request_id: str | None = None) -> bytes:
    """A pre-encoded HTTP/1.1 request (``request_id``: its ``X-Request-Id``, the line's ``client_request_id``)."""
    payload = b"" if body is None else json.dumps(body).encode()
    head = f"{method} {path} HTTP/1.1\r\nHost: {host}\r\nContent-Length: {len(payload)}\r\n"
    if body is not None:
        head += "Content-Type: application/json\r\n"
    if request_id is not None:
        head += f"X-Request-Id: {request_id}\r\n"
    return (head + "\r\n").encode() + payload


RETRY_ID = "retry-"
"""The ``X-Request-Id`` prefix of a burst client's retry (its first try sends none, as before): the server's access
line names it (``client_request_id``), so the burst's first-try window is told from its retries'
(:func:`refusal_window`)."""


@dataclass(frozen=True)
class Refusal:
    """One 429 of the server's access log: its duration (app receive → response), its instant (``ts``, the server's
    wall clock, ms resolution), whether the front refused it from the snapshot, and whether it answered a retry."""

    took_s: float
    at: float
    front: bool
    retry: bool

    @property
    def arrival(self) -> float:
        return self.at - self.took_s


@dataclass(frozen=True)
class RefusalWindow:
    """The server's own view of a burst's 429s, first tries apart from retries (ms after the first first-try
    arrival, server clock). Why apart (issue #13, Q20): a retry refused again comes back ≥ 1 s after the burst (the
    smallest ``Retry-After``); counted with the first tries, one such retry read as a first try's 429 held ~1 s
    (session 19's "last 429 at 1 026 ms" in a row whose first tries' P99 was 46 ms)."""

    took_ms: tuple[float, float]
    """P50/P99 of the first tries' durations."""
    first_front_ms: float
    """The first 429 from the snapshot (a first try's)."""
    last_ms: float
    """The last first-try 429."""
    retries_refused: int
    last_retry_ms: float
    """The last retry's 429 (nan: none)."""


def refusal_window(refusals: Sequence[Refusal]) -> RefusalWindow:
    """:class:`RefusalWindow` of ``refusals`` (the burst's, first tries and retries)."""
    first = [r for r in refusals if not r.retry]
    retries = [r for r in refusals if r.retry]
    start = min((r.arrival for r in first), default=math.nan)
    took = [r.took_s for r in first]
    front = [r.at for r in first if r.front]
    return RefusalWindow((_pct(took, 50) * 1e3, _pct(took, 99) * 1e3),
                         (min(front) - start) * 1e3 if front else math.nan,
                         (max(r.at for r in first) - start) * 1e3 if first else math.nan, len(retries),
                         (max(r.at for r in retries) - start) * 1e3 if retries else math.nan)


def _server_refusals(server: Server) -> list[Refusal]:
    """The 429s of the completions route in the server's JSON log since the last call (:class:`Refusal`): the server's
    own time to refuse, without the accept queue, and when, so the first refusal the snapshot could make shows against
    the burst's first arrival."""
    found: list[Refusal] = []
    while True:
        try:
            line = server._drain.get_nowait()
        except Empty:
            return found
        try:
            record = json.loads(line)
        except json.JSONDecodeError:
            continue
        if record.get("status") == 429 and record.get("route") == "/v1/completions" and "duration_s" in record \
                and "ts" in record:
            at = datetime.datetime.fromisoformat(record["ts"].replace("Z", "+00:00")).timestamp()
            found.append(Refusal(float(record["duration_s"]), at, record.get("refused_by") == "front",
                                 str(record.get("client_request_id", "")).startswith(RETRY_ID)))


@dataclass
class Attempt:
    status: int
    latency_s: float
    retry_after: str | None
    at: float = 0.0
    """``perf_counter`` when its response head arrived."""


@dataclass
class BurstClient:
    first: Attempt
    retry: Attempt | None = None
    waited_s: float = 0.0


@dataclass(frozen=True)
class BurstRow:
    order: str
    statuses: dict[int, int]
    floor_ms: tuple[float, float]
    """P50/P99 of the same number of concurrent GET /health/live: the HTTP floor of a burst here."""
    refused_ms: tuple[float, float]
    probe_ms: tuple[float, float]
    """P50/P99 of refusals sent one at a time while the device is busy: the 429 path without a queue."""
    floor_cpu_ms: tuple[float, float]
    """Server CPU per GET /health/live of the floor: (event-loop thread, all threads), ms."""
    burst_cpu_ms: tuple[float, float]
    """Server CPU per request of the burst's first tries: (event-loop thread, all threads), ms, from the burst's start
    to its first retry (at least 1 s: it includes the device decoding what was admitted)."""
    window: RefusalWindow
    """Server clock (log ``ts``, ms resolution): the first 429 from the snapshot and the last first-try 429, in ms
    after the burst's first refused request reached the app (its line's ``ts`` minus its ``duration_s``), and the
    retries refused again, apart."""
    refused_max_ms: float
    """The slowest first-try 429, client side (the P99 leaves out the burst's three slowest)."""
    refusal_cpu_ms: tuple[float, float]
    """The same up to the last first-try 429 (read every 5 ms): the burst's refusals and the admissions among them."""
    retry_after_share: float
    retry_after_s: tuple[float, float]
    retries: int
    retries_admitted: int
    retries_capped: int
    on_time: int
    expired: int
    wall_s: float
    server: dict[str, float]
    load: tuple[float, float, float] = (math.nan, math.nan, math.nan)
    """The machine's load average (1, 5, 15 min) at the burst's start: other work beside the server's."""


@dataclass(frozen=True)
class Judgement:
    """A burst row's figures beside the same run's floor (:func:`judgement`): what to judge the time to 429 against on
    a shared machine, where the same requests' floor moved 2x between rows (session 21)."""

    label: str
    load_1m: float
    refused_p99_ms: float
    floor_p99_ms: float
    """The same count of concurrent ``GET /health/live`` on the same server, just before the burst."""
    loop_cpu_ms: float
    """The server's event-loop CPU per request of the burst, up to the last first-try 429."""
    floor_loop_cpu_ms: float
    """... per ``GET /health/live`` of the floor."""
    retries_admitted: float

    @property
    def over_floor_ms(self) -> float:
        """The 429's P99 beyond the floor's: what the refusal adds to a trivial request's queue here."""
        return self.refused_p99_ms - self.floor_p99_ms


def judgement(row: BurstRow) -> Judgement:
    """``row``'s time to 429 beside its own floor, its loop CPU per request beside the floor's, and its load."""
    return Judgement(row.order, row.load[0], row.refused_ms[1], row.floor_ms[1], row.refusal_cpu_ms[0],
                     row.floor_cpu_ms[0], row.retries_admitted / row.retries if row.retries else math.nan)


async def _attempt(conn: RawConnection, data: bytes) -> Attempt:
    """One completion; status 0 when the connection failed (counted, never retried silently)."""
    start = time.perf_counter()
    try:
        status, headers, took = await conn.request(data)
    except (OSError, asyncio.IncompleteReadError, ValueError):
        await conn.close()
        return Attempt(0, time.perf_counter() - start, None)
    return Attempt(status, took, headers.get("retry-after"), time.perf_counter())


async def _burst_client(conn: RawConnection, data: bytes, retry_data: bytes, max_wait_s: float,
                        meter: CpuMeter) -> BurstClient:
    """One client of the burst: it sleeps the Retry-After of a 429 (up to ``max_wait_s``) and retries once
    (``retry_data``: the same body, named a retry by its ``X-Request-Id``, :data:`RETRY_ID`).
    The first retry closes ``meter``'s window: the burst's CPU is that of the first tries."""
    one = BurstClient(await _attempt(conn, data))
    if one.first.status == 429 and one.first.retry_after is not None:
        one.waited_s = float(one.first.retry_after)
        if one.waited_s <= max_wait_s:
            await asyncio.sleep(one.waited_s)
            meter.close()
            one.retry = await _attempt(conn, retry_data)
    return one


async def _floor(conns: list[RawConnection], host: str) -> tuple[float, float]:
    data = _raw("GET", "/health/live", host)
    took = [t for _, _, t in await asyncio.gather(*(c.request(data) for c in conns))]
    return _pct(took, 50) * 1e3, _pct(took, 99) * 1e3


async def _probe(client: httpx.AsyncClient, conn: RawConnection, host: str, tokens: int, deadline_s: float,
                 count: int) -> tuple[float, float]:
    """One request that fills 60 % of the deadline, then ``count`` requests of the same size one at a
    time (two of them cannot both finish: each is refused)."""
    steps = max(tokens, min(200, int(0.6 * deadline_s / 0.0425)))  # at the reference B1 step
    backlog = asyncio.ensure_future(client.post("/v1/completions", json=_body(steps, False)))
    await asyncio.sleep(0.3)  # let it be admitted
    data = _raw("POST", "/v1/completions", host, _body(steps, False))
    took = []
    for _ in range(count):
        attempt = await _attempt(conn, data)
        if attempt.status == 429:
            took.append(attempt.latency_s)
    await backlog
    return _pct(took, 50) * 1e3, _pct(took, 99) * 1e3


def _burst_row(order: str, clients: list[BurstClient], deadline_s: float, wall_s: float, max_wait_s: float,
               measured: dict[str, Any]) -> BurstRow:
    attempts = [a for c in clients for a in (c.first, c.retry) if a is not None]
    statuses: dict[int, int] = {}
    for c in clients:
        statuses[c.first.status] = statuses.get(c.first.status, 0) + 1
    refused = [c.first for c in clients if c.first.status == 429]
    waits = [float(a.retry_after) for a in refused if a.retry_after is not None]
    retried = [c.retry for c in clients if c.retry is not None]
    latencies = [a.latency_s for a in refused]
    return BurstRow(
        order, dict(sorted(statuses.items())), measured["floor"], (_pct(latencies, 50) * 1e3, _pct(latencies, 99) * 1e3),
        measured["probe"], measured["floor_cpu"], measured["burst_cpu"], measured["window"],
        max(latencies, default=math.nan) * 1e3, measured["refusal_cpu"],
        len(waits) / len(refused) if refused else float("nan"),
        (_pct(waits, 50), max(waits, default=float("nan"))), len(retried), sum(1 for a in retried if a.status != 429),
        sum(1 for c in clients if c.first.status == 429 and c.retry is None and c.waited_s > max_wait_s),
        sum(1 for a in attempts if a.status == 200 and a.latency_s <= deadline_s),
        sum(1 for a in attempts if a.status == 504), wall_s, measured["server"],
        measured.get("load", (math.nan, math.nan, math.nan)))


def burst_prompts(requests: int, distinct: bool, prompt: str = PROMPT) -> list[str]:
    """Each burst client's prompt: one for all (the lane's ``prepare`` memo then parses one body; a benchmark's
    best case), or with ``distinct`` the prompt plus the client's zero-padded index, as real traffic brings a body
    the server has not seen per client, all of one token-length class (the index has the burst's width, the same
    characters per prompt). A client's retry sends its first try's bytes, as a real client does."""
    if not distinct:
        return [prompt] * requests
    width = len(str(max(requests - 1, 0)))
    return [f"{prompt} {index:0{width}d}" for index in range(requests)]


def burst(server: Server, order: str, requests: int, tokens: int, deadline_s: float,
          max_wait_s: float, distinct: bool = False, prompt: str = PROMPT) -> BurstRow:
    host, port = server.url.removeprefix("http://").rsplit(":", 1)

    async def run() -> BurstRow:
        async with httpx.AsyncClient(base_url=server.url, timeout=deadline_s + max_wait_s + 120) as client:
            (await client.post("/v1/completions", json=_body(4, False))).raise_for_status()  # measure a step
            conns = [RawConnection(host, int(port)) for _ in range(requests)]
            await asyncio.gather(*(c.open() for c in conns))
            meter = CpuMeter(server.proc.pid)
            measured: dict[str, Any] = {"floor": await _floor(conns, host)}
            measured["floor_cpu"] = meter.per_request(requests)
            before = await _counters(client)
            _server_refusals(server)  # drop the log lines so far
            prompts = burst_prompts(requests, distinct, prompt)
            bodies = [_raw("POST", "/v1/completions", host, _body(tokens, False, prompt)) for prompt in prompts]
            retries = [_raw("POST", "/v1/completions", host, _body(tokens, False, prompt), f"{RETRY_ID}{index}")
                       for index, prompt in enumerate(prompts)]
            measured["load"] = os.getloadavg()
            started = time.perf_counter()
            meter = CpuMeter(server.proc.pid, requests)
            sampler = asyncio.ensure_future(meter.sampling(0.005))
            clients = await asyncio.gather(*(_burst_client(c, data, again, max_wait_s, meter)
                                             for c, data, again in zip(conns, bodies, retries, strict=True)))
            wall = time.perf_counter() - started
            measured["burst_cpu"] = meter.close()
            await sampler
            last = max((c.first.at for c in clients if c.first.status == 429), default=started)
            measured["refusal_cpu"] = meter.until(last)
            measured["server"] = _delta(await _counters(client), before)
            await asyncio.sleep(0.5)  # the last access lines reach the log reader
            measured["window"] = refusal_window(_server_refusals(server))
            await asyncio.gather(*(c.close() for c in conns))
            probe = RawConnection(host, int(port))
            measured["probe"] = await _probe(client, probe, host, tokens, deadline_s, 50)
            await probe.close()
        return _burst_row(order, list(clients), deadline_s, wall, max_wait_s, measured)

    return asyncio.run(run())


# ---------------------------------------------------------------------------------------------
# part 2: streams under an ITL target
# ---------------------------------------------------------------------------------------------


STALL_S = 60.0
"""A stream with no byte for this long is counted failed (stalled), not waited for: at the reference B1 step
no admitted stream's gap comes near it, and a hung stream must not hang the run (nor lose its other tables)."""


@dataclass
class StreamResult:
    status: int = 0
    ttft_s: float | None = None
    gaps: list[float] = field(default_factory=list)
    completed: bool = False
    failed: bool = False
    stalled: bool = False
    tokens: int = 0


@dataclass(frozen=True)
class StreamRow:
    label: str
    refused: int
    completed: int
    failed: int
    stalled: int
    silent: int
    itl_ms: tuple[float, float]
    worst_stream_itl_p99_ms: float
    ttft_ms: tuple[float, float]
    busy_share: float
    wall_s: float
    decode_cap: float


async def _stream(client: httpx.AsyncClient, tokens: int) -> StreamResult:
    """One streaming client; a stream silent for :data:`STALL_S` ends as failed and stalled."""
    result = StreamResult()
    try:
        return await _read_stream(client, tokens, result)
    except httpx.ReadTimeout:
        result.failed = result.stalled = True
        return result


async def _read_stream(client: httpx.AsyncClient, tokens: int, result: StreamResult) -> StreamResult:
    start = time.perf_counter()
    last: float | None = None
    async with client.stream("POST", "/v1/completions", json=_body(tokens, True, STREAM_PROMPT)) as response:
        result.status = response.status_code
        if response.status_code != 200:
            await response.aread()
            return result
        async for line in response.aiter_lines():
            if not line.startswith("data: {"):
                continue
            now = time.perf_counter()
            payload = json.loads(line[6:])
            result.failed = result.failed or "error" in payload
            if payload.get("usage"):
                result.tokens = int(payload["usage"]["completion_tokens"])
            choices = payload.get("choices") or []
            if not choices or not choices[0].get("text"):
                result.completed = result.completed or bool(choices and choices[0].get("finish_reason"))
                continue
            if last is None:
                result.ttft_s = now - start
            else:
                result.gaps.append(now - last)
            last = now
    result.failed = result.failed or not result.completed
    return result


def _stream_row(label: str, results: list[StreamResult], server: dict[str, float], wall: float) -> StreamRow:
    admitted = [r for r in results if r.status == 200]
    gaps = [g for r in admitted for g in r.gaps]
    ttfts = [r.ttft_s for r in admitted if r.ttft_s is not None]
    worst = max((_pct(r.gaps, 99) for r in admitted if r.gaps), default=float("nan"))
    silent = sum(r.tokens - 1 - len(r.gaps) for r in admitted if r.completed)
    return StreamRow(label, sum(1 for r in results if r.status == 429), sum(1 for r in admitted if r.completed),
                     sum(1 for r in admitted if r.failed), sum(1 for r in admitted if r.stalled), silent,
                     (_pct(gaps, 50) * 1e3, _pct(gaps, 99) * 1e3),
                     worst * 1e3, (_pct(ttfts, 50) * 1e3, _pct(ttfts, 99) * 1e3),
                     server.get("calculet_device_busy_seconds", 0.0) / wall, wall,
                     server.get("calculet_scheduler_decode_cap_streams", 0.0))


def streams(url: str, label: str, count: int, tokens: int) -> StreamRow:
    async def run() -> StreamRow:
        async with httpx.AsyncClient(base_url=url, timeout=STALL_S,
                                     limits=httpx.Limits(max_connections=count + 4)) as client:
            await _warm(client, count)
            before = await _counters(client)
            started = time.perf_counter()
            results = await asyncio.gather(*(_stream(client, tokens) for _ in range(count)))
            wall = time.perf_counter() - started
            after = await _counters(client)
        server = _delta(after, before)
        server["calculet_scheduler_decode_cap_streams"] = after.get("calculet_scheduler_decode_cap_streams", 0.0)
        return _stream_row(label, list(results), server, wall)

    return asyncio.run(run())


# ---------------------------------------------------------------------------------------------
# the run and its tables
# ---------------------------------------------------------------------------------------------


def _pair(values: tuple[float, float], digits: int = 0) -> str:
    return f"{values[0]:.{digits}f}/{values[1]:.{digits}f}"


def _print_burst(rows: list[BurstRow], args: argparse.Namespace) -> None:
    print(f"Part 1 — burst: {args.burst} concurrent non-streaming completions × {args.burst_tokens} tokens, "
          f"deadline {args.deadline_ms} ms, B1 reference cost; each refused client sleeps Retry-After once "
          f"(≤ {args.max_retry_wait:.0f} s) and retries; prompt of {len(args.prompt)} characters; prompts: "
          + ("distinct, one per client (the prompt + its index, one token-length class; a retry resends its first "
             "try's body)" if args.distinct else "one body for every client (the server's memo of prepare sees one "
             "body; --distinct for a body per client)"))
    header = (f"{'deadline_order':<19} {'first try':<22} {'429 p50/p99':>12} {'server p50/p99':>14} {'floor p50/p99':>13} "
              f"{'1-by-1 p50/p99':>14} {'RA share':>8} {'RA p50/max':>10} {'retry admitted':>14} {'on time':>7} "
              f"{'504':>4} {'shed':>4} {'goodput/s':>9} {'server':>6} {'wasted':>6} {'wall s':>6}")
    print(header)
    print("-" * len(header))
    for r in rows:
        statuses = " ".join(f"{code}:{n}" for code, n in r.statuses.items())
        admitted = f"{r.retries_admitted}/{r.retries} {r.retries_admitted / r.retries:.0%}" if r.retries else "-"
        busy = r.server.get("calculet_device_busy_seconds", 0.0)
        wasted = r.server.get("calculet_request_wasted_device_seconds", 0.0) / busy if busy else float("nan")
        print(f"{r.order:<19} {statuses:<22} {_pair(r.refused_ms):>12} {_pair(r.window.took_ms, 1):>14} "
              f"{_pair(r.floor_ms):>13} "
              f"{_pair(r.probe_ms, 1):>14} {r.retry_after_share:>8.0%} {_pair(r.retry_after_s):>10} {admitted:>14} "
              f"{r.on_time:>7} {r.expired:>4} {r.server.get('calculet_scheduler_on_time_shed', 0.0):>4.0f} "
              f"{r.on_time / r.wall_s:>9.2f} {r.server.get('calculet_request_goodput', 0.0):>6.0f} {wasted:>6.0%} "
              f"{r.wall_s:>6.1f}")
        if r.retries_capped:
            print(f"{'':<19} ({r.retries_capped} refused clients were told to wait longer than the cap and did "
                  "not retry)")
        front = r.server.get("calculet_front_refused", 0.0)
        engine = r.server.get("calculet_scheduler_on_time_refused", 0.0)
        forwarded = ", ".join(f"{reason} {n:.0f}" for reason, n in r.server.items() if reason.startswith("fwd ") and n)
        print(f"{'':<19} no-prospect 429s answered by the HTTP front from the admission snapshot: {front:.0f}, by the "
              f"engine: {engine:.0f}; the front held {r.server.get('calculet_front_held', 0.0):.0f} and forwarded: "
              f"{forwarded or 'none'}; by the server's clock the first 429 from the snapshot came "
              f"{r.window.first_front_ms:.0f} ms after the first arrival, the last first-try 429 "
              f"{r.window.last_ms:.0f} ms (client side: the slowest {r.refused_max_ms:.0f} ms)"
              + (f"; {r.window.retries_refused} retries refused again, the last at {r.window.last_retry_ms:.0f} ms"
                 if r.window.retries_refused else ""))
        lane = [r.server.get(f"calculet_front_lane_{what}") for what in ("refused", "declined", "held", "memo_hits")]
        if lane[0] is not None:  # a tree without the refusal lane's families (before #13's lane) has no such line
            print(f"{'':<19} the refusal lane (in the protocol, no ASGI task) refused {lane[0]:.0f}, declined "
                  f"{lane[1]:.0f}, held {lane[2]:.0f}; its memo of prepare found {lane[3]:.0f} bodies parsed already")
        print(f"{'':<19} server CPU per request, event loop / all threads: floor {_pair(r.floor_cpu_ms, 3)} ms, "
              f"burst to the last 429 {_pair(r.refusal_cpu_ms, 3)} ms (to the first retry "
              f"{_pair(r.burst_cpu_ms, 3)} ms); the loop alone, run one after another, needs "
              f"{r.refusal_cpu_ms[0] * args.burst:.0f} ms for the burst (the last 429's least wait)")
    print("ms unless named. 429 p50/p99: time to the 429 in the burst (send → response head, client side, a "
          "hand-driven HTTP/1.1 client on one kept-alive connection per request); server: the server's own time to "
          "each of those 429s (app receive → response, its access log's duration_s; retries apart); floor: the "
          "same number of concurrent GET /health/live just before (the HTTP stack's own queue for a burst on this "
          "machine); 1-by-1: 50 refusals sent one at a time behind a request filling the device (the 429 path "
          "alone). RA: Retry-After (share of 429s carrying it; p50/max s). retry admitted: retries not refused "
          "again. on time: first tries and retries completed within the deadline; 504: ended deadline_exceeded; "
          "shed: admitted or waiting requests the on_time selection ended early; goodput/s = on time / wall; server: "
          "Δ calculet_request_goodput_total (on time by the engine's clock, which starts at submit, after the HTTP "
          "queue); "
          "wasted = Δ calculet_request_wasted_device_seconds / Δ calculet_device_busy_seconds. Targets (issue "
          "#13): 429 p99 ≤ 50 ms; a client that waits Retry-After is admitted on ≥ 80 % of retries.\n")
    _print_judgement(rows, args)


def _print_judgement(rows: list[BurstRow], args: argparse.Namespace) -> None:
    """Each row beside its own floor and load (:func:`judgement`): the figures to judge a row by on a shared machine."""
    print(f"Part 1 judged beside each row's own floor ({args.burst} concurrent GET /health/live on the same server just "
          "before its burst) and the load at its start")
    header = (f"{'row':<30} {'load 1m':>7} {'429 p99':>7} {'floor p99':>9} {'over floor':>10} {'loop CPU/req':>12} "
              f"{'floor CPU/req':>13} {'retry admitted':>14}")
    print(header)
    print("-" * len(header))
    for r in map(judgement, rows):
        print(f"{r.label:<30} {r.load_1m:>7.2f} {r.refused_p99_ms:>7.0f} {r.floor_p99_ms:>9.0f} {r.over_floor_ms:>10.0f} "
              f"{r.loop_cpu_ms:>9.3f} ms {r.floor_loop_cpu_ms:>10.3f} ms {r.retries_admitted:>14.0%}")
    print("ms; loop CPU/req: the server's event-loop thread per request of the burst up to its last first-try 429 "
          "(schedstat), floor CPU/req: per GET of the floor; over floor: the 429's P99 less the floor's.\n")


def _print_bare(rows: list[BareFloor], args: argparse.Namespace) -> None:
    print(f"Bare floor — the same {args.burst} concurrent GET through uvicorn serving a ten-line ASGI app (no "
          "FastAPI, no middleware), per HTTP implementation installed")
    header = f"{'http':<10} {'floor p50/p99':>13} {'loop CPU/request':>16} {'× burst':>8}"
    print(header)
    print("-" * len(header))
    for r in rows:
        print(f"{r.http:<10} {_pair(r.floor_ms):>13} {r.loop_cpu_ms:>13.3f} ms {r.loop_cpu_ms * args.burst:>5.0f} ms")
    print("ms; loop CPU/request: the server's event-loop thread (schedstat); × burst: that CPU for the whole burst, "
          "the least time one loop needs to answer its last request. The time-to-429 target (P99 ≤ 50 ms for "
          f"{args.burst} concurrent requests) needs at most {50 / args.burst:.3f} ms of loop CPU per request, "
          "client and kernel excluded.\n")


def _print_streams(rows: list[StreamRow], args: argparse.Namespace) -> None:
    print(f"Part 2 — {args.streams} concurrent streaming clients × {args.stream_tokens} tokens, B1 reference cost, "
          "deadline_order on_time")
    header = (f"{'ITL target':<12} {'429':>4} {'done':>5} {'failed':>6} {'silent':>6} {'ITL p50/p99':>12} "
              f"{'worst p99':>9} {'TTFT p50/p99':>13} {'busy':>5} {'cap':>4} {'wall s':>6}")
    print(header)
    print("-" * len(header))
    for r in rows:
        failed = f"{r.failed} ({r.stalled} stalled)" if r.stalled else str(r.failed)
        print(f"{r.label:<12} {r.refused:>4} {r.completed:>5} {failed:>6} {r.silent:>6} {_pair(r.itl_ms):>12} "
              f"{r.worst_stream_itl_p99_ms:>9.0f} {_pair(r.ttft_ms):>13} {r.busy_share:>5.0%} {r.decode_cap:>4.0f} "
              f"{r.wall_s:>6.1f}")
    print("ms; ITL over every admitted stream's gaps between SSE chunks; worst p99 = the largest per-stream ITL p99; "
          f"failed = admitted (200) and then ended with an error (stalled: no byte for {STALL_S:.0f} s, the client "
          "gave up); silent = tokens with no chunk of their own (each "
          "merges two gaps; 0 means the gaps are per token); busy = Δ calculet_device_busy_seconds_total / wall; "
          "cap = calculet_scheduler_decode_cap_streams (0: none). Targets (issue #13) with a "
          f"{args.itl_target_ms} ms ITL target: every admitted stream's ITL p99 ≤ the target, none failed, device "
          "≥ 90 % busy.")


TREE_RUN = ("import runpy, sys; sys.path.insert(0, sys.argv.pop(1)); import calculet; "
            "assert calculet.__file__.startswith(sys.path[0]), calculet.__file__; "
            "runpy.run_module('calculet.run', run_name='__main__', alter_sys=True)")
"""``python -m calculet.run`` from the source tree named by its first argument (the server's working directory is
this tree, which ``-m`` would put first on ``sys.path``)."""


def _server(home: Path, config: Path, impl: str, tree: str | None, switch_ms: str | None = None) -> Server:
    """The service on ``config`` with HTTP/1.1 implementation ``impl``, from this tree or from ``tree``, at the switch
    interval ``switch_ms`` (``calculet.run``'s default when None)."""
    env = {HTTP_ENV: impl} | ({"CALCULET_SWITCH_INTERVAL_MS": switch_ms} if switch_ms else {})
    if tree is None:
        return Server("reference", home, config, env=env)
    command = [sys.executable, "-c", TREE_RUN, str(Path(tree).resolve()), "--host", "127.0.0.1", "--port", "0",
               "--log-format", "json", "--log-level", "INFO", "--sim-cost", "reference", "--config", str(config)]
    return Server("reference", home, command=command, env={**env, "PYTHONPATH": str(Path(tree).resolve())})


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--burst", type=int, default=300, help="concurrent requests of part 1")
    parser.add_argument("--burst-tokens", type=int, default=16, help="max_tokens of part 1 requests")
    parser.add_argument("--deadline-ms", type=int, default=5000, help="admission.deadline_default_ms of part 1")
    parser.add_argument("--max-retry-wait", type=float, default=60.0, help="longest Retry-After a client honours (s)")
    parser.add_argument("--streams", type=int, default=16, help="concurrent streams of part 2")
    parser.add_argument("--stream-tokens", type=int, default=32, help="max_tokens of part 2 streams")
    parser.add_argument("--itl-target-ms", type=int, default=200, help="admission.itl_target_ms of part 2")
    parser.add_argument("--part", choices=("all", "burst", "itl", "bare"), default="all")
    parser.add_argument("--orders", default="on_time,at_risk", help="deadline orders of part 1, comma-separated")
    parser.add_argument("--no-bare", action="store_true", help="skip the bare floor")
    parser.add_argument("--prompt", default=PROMPT,
                        help="the burst's prompt (--distinct appends each client's index); a longer one weighs its "
                             "tokenisation as real prompts do")
    parser.add_argument("--distinct", action="store_true",
                        help="part 1: each burst client its own prompt (the prompt + its index), as real traffic; "
                             "its retry resends the same body")
    parser.add_argument("--tree", action="append", default=[],
                        help="also serve part 1 from this source tree (e.g. a worktree of a base commit), its rows "
                             "beside this tree's, interleaved; repeat for rounds (the same path again: another round)")
    parser.add_argument("--trees-only", action="store_true",
                        help="part 1 from the --tree source trees only, not from this tree too (an A/B of two worktrees "
                             "while this tree holds others' unfinished work)")
    parser.add_argument("--http", default="httptools",
                        help="calculet's HTTP/1.1 implementation(s), comma-separated (h11, httptools: the default when "
                             "installed); with two, part 1 runs each per deadline_order, side by side in one run")
    parser.add_argument("--switch-ms", default="",
                        help="part 1 at each of these interpreter switch intervals (ms, comma-separated), a row per "
                             "interval (default: calculet.run's own)")
    args = parser.parse_args(argv)
    intervals: list[str | None] = [ms.strip() for ms in args.switch_ms.split(",") if ms.strip()] or [None]
    impls = [impl.strip() for impl in args.http.split(",") if impl.strip()]
    burst_rows: list[BurstRow] = []
    stream_rows: list[StreamRow] = []
    bare_rows: list[BareFloor] = []
    with tempfile.TemporaryDirectory(prefix="calculet-bench-overload-") as tmp:
        home = Path(tmp)
        # (part, label, config, http, source tree, switch interval ms)
        runs: list[tuple[str, str, Path, str, str | None, str | None]] = []
        orders = [order.strip() for order in args.orders.split(",") if order.strip()]
        if args.part in ("all", "burst"):
            burst_runs = [(order + (f" {impl}" if len(impls) > 1 else ""),
                           _write_config(home, f"burst-{order}", order=order, deadline_ms=args.deadline_ms), impl)
                          for order in orders for impl in impls]
            for turn, tree in enumerate(args.tree or [None]):
                for ms in intervals if turn % 2 == 0 else intervals[::-1]:
                    at = f" {ms} ms" if ms else ""
                    if tree is not None:
                        runs += [("burst", f"{label}{at} [{Path(tree).name}]", config, impl, tree, ms)
                                 for label, config, impl in burst_runs]
                    if tree is None or not args.trees_only:
                        runs += [("burst", label + at, config, impl, None, ms) for label, config, impl in burst_runs]
        if args.part in ("all", "itl"):
            runs += [("itl", f"{args.itl_target_ms} ms", _write_config(home, "itl", order="on_time",
                                                                       itl_ms=args.itl_target_ms), impls[0], None,
                      None),
                     ("itl", "none", _write_config(home, "no-itl", order="on_time"), impls[0], None, None)]
        if args.part in ("all", "burst", "bare") and not args.no_bare:
            bare_rows = bare_floor(home, args.burst)
        for part, label, config, impl, tree, ms in runs:
            server = _server(home, config, impl, tree, ms)
            try:
                if part == "burst":
                    burst_rows.append(burst(server, label, args.burst, args.burst_tokens,
                                            args.deadline_ms / 1000, args.max_retry_wait, args.distinct,
                                            args.prompt))
                else:
                    stream_rows.append(streams(server.url, label, args.streams, args.stream_tokens))
            finally:
                try:
                    server.stop()
                except subprocess.TimeoutExpired:  # a server that does not drain in time: its rows are kept
                    server.proc.kill()
    if burst_rows:
        _print_burst(burst_rows, args)
    if bare_rows:
        _print_bare(bare_rows, args)
    if stream_rows:
        _print_streams(stream_rows, args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
