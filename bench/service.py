"""Cost of the HTTP layer, and streaming latency at a realistic device cost (a benchmark).

Part 0, the host's CPU per streamed token beside a bare SSE server (issue #20), is
``bench/host_path.py``; it starts its servers with :class:`Server` from here.

Part 1 — the HTTP layer at zero device cost (``CostModel.instant()``): the same requests go
(a) straight into an in-process ``ThreadedEngine`` (submit + wait for the stream to close) and (b)
through ``python -m calculet.run`` over HTTP (a subprocess on 127.0.0.1; an httpx client in
this process). With the device free, the difference is what the service adds: routing,
validation, tokenisation, JSON/SSE encoding, the thread hop to the engine's actor, the client's
own HTTP work and loopback TCP. Reported: requests/s and latency p50/p99 per path, and the
added latency (HTTP p50 − engine p50).

Part 2 — streaming at a realistic cost (``CostModel.reference()``: 5 ms + 0.6 ms/token
prefill, 40 ms + 2.5 ms/lane decode steps — the assumed shape of the §13.1 reference model on
B1, not an NPU measurement): time to first token and inter-token latency seen by the client,
next to what the device model alone would take, at 1 and 4 concurrent streams. On B1, 4
streams share the one device (software multi-slot, not NPU batch — R1.1). With the default
``batch.deadline_order: at_risk`` no stream's deadline is at risk, so they rotate and each
sees about 4 device steps between tokens (measured 2026-11-29: ITL p50 175 ms, p99 350 ms).
Under ``strict`` earliest-deadline order the earliest stream ran first, most gaps were one step
and a waiting stream saw one long gap (ITL p99 2.3 s measured the session before).

Part 3 (``--part loop``) — the event loop's own CPU per streamed token (issue #20): ``calculet.run
--sim-cost null`` beside ``bench/host_path.py``'s bare SSE server, 64-token streams at 1, 16 and 64
concurrent clients, rounds interleaved; the CPU of each server's main thread (``/proc/<pid>/task/<pid>/
schedstat``: the thread that runs uvicorn's loop — HTTP parsing, routing, SSE framing and socket writes)
and of the whole process, per token, after a warm-up completion per client. ``bench/host_path.py`` gives
the whole process's figure the issue is judged by; this one separates what the HTTP side costs from the
engine's actor and device threads.

Figures, not a pass/fail test (DESIGN principle 10). Service logging at WARNING so the figures
are not log-bound.

    python bench/service.py [--requests 192] [--tokens 16] [--stream-tokens 24]
    python bench/service.py --part loop [--rounds 3] [--streams 1,16,64]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from queue import Empty, Queue

import httpx
import numpy as np

from calculet.adapters.sim import CostModel, SimCalRT, SimConfig, TimeMode, package_dir
from calculet.config import default_config
from calculet.runtime.engine.threaded import ThreadedEngine
from calculet.runtime.engine.types import EngineOptions, GenerateRequest
from calculet.runtime.execution.sampler import SamplingParams
from calculet.runtime.streams.writer import StreamWriter

ROOT = Path(__file__).resolve().parents[1]
PROMPT = "Calculet NPU benchmark prompt"


@dataclass(frozen=True)
class Row:
    path: str
    concurrency: int
    requests: int
    req_per_s: float
    p50_ms: float
    p99_ms: float


def _pct(values: Sequence[float], q: float) -> float:
    return float(np.percentile(np.asarray(values, dtype=np.float64), q, method="linear")) if values else float("nan")


def _row(path: str, concurrency: int, latencies: list[float], wall: float) -> Row:
    return Row(path, concurrency, len(latencies), len(latencies) / wall, _pct(latencies, 50) * 1e3,
               _pct(latencies, 99) * 1e3)


# ---------------------------------------------------------------------------------------------
# the server under test (the real entry point, as a subprocess)
# ---------------------------------------------------------------------------------------------


class Server:
    """``python -m calculet.run --port 0`` in a subprocess; the port comes from its log line.

    ``config``: a calculet-scheduler/v1 file (default: the §15 defaults); ``prefix``: what the command runs under
    (``taskset -c 1``). Also used by ``bench/overload_http.py``."""

    def __init__(self, cost: str, home: Path, config: Path | None = None, *,
                 command: Sequence[str] | None = None, env: dict[str, str] | None = None,
                 prefix: Sequence[str] = ()) -> None:
        env = {**os.environ, "CALCULET_HOME": str(home), "PYTHONPATH": str(ROOT), **(env or {})}
        extra = ["--config", str(config)] if config is not None else []
        argv = [*prefix, *(list(command) if command is not None else [
            sys.executable, "-m", "calculet.run", "--host", "127.0.0.1", "--port", "0", "--log-format", "json",
            "--log-level", "INFO", "--sim-cost", cost, *extra])]
        self.proc = subprocess.Popen(argv, cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                                     text=True)
        lines: Queue[str] = Queue()
        threading.Thread(target=lambda: [lines.put(line) for line in self.proc.stderr or ()], daemon=True).start()
        while True:
            try:
                line = lines.get(timeout=60)
            except Empty:
                self.stop()
                raise RuntimeError("the server did not start within 60 s") from None
            try:
                record = json.loads(line)
            except json.JSONDecodeError:
                continue
            if record.get("msg") == "listening":
                self.url = f"http://127.0.0.1:{record['port']}"
                break
        self._drain = lines
        if cost:  # calculet (not the baseline): ask for the served model's id (the bundled default changes)
            global SERVED_MODEL
            SERVED_MODEL = httpx.get(f"{self.url}/v1/models", timeout=60).json()["data"][0]["id"]

    def cpu_s(self) -> float:
        """CPU time (user + system, all threads) the server process has used so far."""
        return process_cpu_s(self.proc.pid)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            self.proc.wait(60)


def process_cpu_s(pid: int) -> float:
    """User + system CPU seconds of process ``pid`` (every thread, finished ones included)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


# ---------------------------------------------------------------------------------------------
# part 1: the HTTP layer at zero device cost
# ---------------------------------------------------------------------------------------------


class DirectEngine:
    """The engine alone, in this process (same package, config and cost model as the server)."""

    def __init__(self) -> None:
        self.engine = ThreadedEngine(default_config(),
                             SimCalRT(SimConfig(time_mode=TimeMode.REAL, cost=CostModel.instant())),
                             package_dir("current"), options=EngineOptions(monitor_mode="count"))
        self.engine.start()
        self.prompt = tuple(self.engine.tokenizer.encode(PROMPT))
        self.params = SamplingParams(temperature=0.0, ignore_eos=True)

    def one(self, tokens: int) -> float:
        """Submit and wait for the close; the latency in seconds."""
        start = time.perf_counter()
        stream = StreamWriter(tokenizer=self.engine.tokenizer)
        self.engine.submit(GenerateRequest(self.prompt, tokens, sampling=self.params), stream)
        stream.result(30)
        return time.perf_counter() - start

    def concurrent(self, requests: int, tokens: int, concurrency: int) -> Row:
        latencies: list[float] = []
        lock = threading.Lock()

        def worker(n: int) -> None:
            for _ in range(n):
                took = self.one(tokens)
                with lock:
                    latencies.append(took)

        started = time.perf_counter()
        threads = [threading.Thread(target=worker, args=(requests // concurrency,)) for _ in range(concurrency)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        return _row("engine (in-process)", concurrency, latencies, time.perf_counter() - started)

    def stop(self) -> None:
        self.engine.stop(5)


SERVED_MODEL = "qwen3"
"""The model id the last calculet server started here serves (the baseline takes any)."""


def completion_body(tokens: int, stream: bool) -> dict[str, object]:
    return {"model": SERVED_MODEL, "prompt": PROMPT, "max_tokens": tokens, "temperature": 0, "ignore_eos": True,
            "stream": stream}


def paired(url: str, direct: DirectEngine, requests: int, tokens: int) -> tuple[list[Row], dict[str, float]]:
    """Concurrency 1, the paths interleaved request by request so machine noise hits all alike;
    the added latency is the median of the per-round differences."""
    samples: dict[str, list[float]] = {"engine (in-process)": [], "HTTP GET /health/live": [],
                                       "HTTP /v1/completions": [], "HTTP /v1/completions SSE": []}
    with httpx.Client(base_url=url, timeout=60) as http:
        def live() -> float:
            start = time.perf_counter()
            http.get("/health/live").raise_for_status()
            return time.perf_counter() - start

        def plain() -> float:
            start = time.perf_counter()
            http.post("/v1/completions", json=completion_body(tokens, False)).raise_for_status()
            return time.perf_counter() - start

        def streamed() -> float:
            start = time.perf_counter()
            with http.stream("POST", "/v1/completions", json=completion_body(tokens, True)) as response:
                response.raise_for_status()
                for _ in response.iter_lines():
                    pass
            return time.perf_counter() - start

        paths: list[tuple[str, Callable[[], float]]] = [
            ("engine (in-process)", lambda: direct.one(tokens)), ("HTTP GET /health/live", live),
            ("HTTP /v1/completions", plain), ("HTTP /v1/completions SSE", streamed)]
        for _ in range(10):
            for _, fn in paths:
                fn()
        for _ in range(requests):
            for name, fn in paths:
                samples[name].append(fn())
    rows = [Row(name, 1, len(v), 1.0 / float(np.mean(v)), _pct(v, 50) * 1e3, _pct(v, 99) * 1e3)
            for name, v in samples.items()]
    base = np.asarray(samples["engine (in-process)"])
    added = {name: float(np.median(np.asarray(v) - base)) * 1e3 for name, v in samples.items()
             if "completions" in name}
    return rows, added


def http_concurrent(url: str, label: str, requests: int, concurrency: int,
                    send: Callable[[httpx.AsyncClient], Awaitable[None]]) -> Row:
    latencies: list[float] = []

    async def run() -> float:
        limits = httpx.Limits(max_connections=concurrency, max_keepalive_connections=concurrency)
        async with httpx.AsyncClient(base_url=url, timeout=60, limits=limits) as client:
            for _ in range(10):
                await send(client)

            async def worker(n: int) -> None:
                for _ in range(n):
                    start = time.perf_counter()
                    await send(client)
                    latencies.append(time.perf_counter() - start)

            started = time.perf_counter()
            await asyncio.gather(*(worker(requests // concurrency) for _ in range(concurrency)))
            return time.perf_counter() - started

    wall = asyncio.run(run())
    return _row(label, concurrency, latencies, wall)


def part1(url: str, requests: int, tokens: int) -> tuple[list[Row], dict[tuple[str, int], float]]:
    async def plain(client: httpx.AsyncClient) -> None:
        (await client.post("/v1/completions", json=completion_body(tokens, False))).raise_for_status()

    async def streamed(client: httpx.AsyncClient) -> None:
        async with client.stream("POST", "/v1/completions", json=completion_body(tokens, True)) as response:
            response.raise_for_status()
            async for _ in response.aiter_lines():
                pass

    direct = DirectEngine()
    try:
        rows, added1 = paired(url, direct, requests, tokens)
        added = {(name, 1): value for name, value in added1.items()}
        base = direct.concurrent(requests, tokens, 16)
    finally:
        direct.stop()
    rows.append(base)
    for label, send in (("HTTP /v1/completions", plain), ("HTTP /v1/completions SSE", streamed)):
        row = http_concurrent(url, label, requests, 16, send)
        rows.append(row)
        added[(label, 16)] = row.p50_ms - base.p50_ms
    return rows, added


# ---------------------------------------------------------------------------------------------
# part 2: streaming latency at a realistic cost
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class StreamRow:
    concurrency: int
    streams: int
    ttft_p50_ms: float
    ttft_p99_ms: float
    itl_p50_ms: float
    itl_p99_ms: float
    device_ttft_ms: float
    device_itl_ms: float


def part2(url: str, tokens: int, prompt_tokens: int) -> list[StreamRow]:
    cost = CostModel.reference()
    rows = []
    for concurrency in (1, 4):
        ttfts: list[float] = []
        itls: list[float] = []

        async def one(client: httpx.AsyncClient) -> None:
            start = time.perf_counter()
            last: float | None = None
            async with client.stream("POST", "/v1/completions", json=completion_body(tokens, True)) as response:
                response.raise_for_status()
                async for line in response.aiter_lines():
                    if not line.startswith("data: {"):
                        continue
                    now = time.perf_counter()
                    payload = json.loads(line[6:])
                    if not payload.get("choices") or payload["choices"][0].get("finish_reason"):
                        continue
                    if last is None:
                        ttfts.append(now - start)
                    else:
                        itls.append(now - last)
                    last = now

        async def run() -> None:
            async with httpx.AsyncClient(base_url=url, timeout=120) as client:
                await one(client)  # warm-up
                ttfts.clear()
                itls.clear()
                for _ in range(2):
                    await asyncio.gather(*(one(client) for _ in range(concurrency)))

        asyncio.run(run())
        step = cost.decode_s(1)
        rows.append(StreamRow(concurrency, 2 * concurrency, _pct(ttfts, 50) * 1e3, _pct(ttfts, 99) * 1e3,
                              _pct(itls, 50) * 1e3, _pct(itls, 99) * 1e3,
                              cost.prefill_s(prompt_tokens) * 1e3, step * concurrency * 1e3))
    return rows


# ---------------------------------------------------------------------------------------------
# part 3 (--part loop): the event loop's own CPU per streamed token (issue #20)
# ---------------------------------------------------------------------------------------------


def thread_cpu_s(pid: int, tid: int | None = None) -> float:
    """CPU seconds one thread of process ``pid`` has run so far (schedstat, ns; ``tid`` None: the main thread,
    which runs uvicorn's event loop in ``calculet.run`` and in the baseline)."""
    return int(Path(f"/proc/{pid}/task/{tid or pid}/schedstat").read_text().split()[0]) / 1e9


@dataclass(frozen=True)
class LoopRound:
    """One round against one server: its event-loop thread's and whole process's CPU, and the tokens streamed."""

    loop_s: float
    process_s: float
    tokens: int


RETRY_CAP_S = 5.0
"""Longest wait of a refused stream before it retries (the server's Retry-After when shorter): the figure is CPU per
token, and a Retry-After of minutes would only stretch the run."""


def loop_round(server: Server, streams: int, per_stream: int, tokens: int) -> LoopRound:
    """``streams`` concurrent clients each stream ``per_stream`` completions of ``tokens`` tokens (ignore_eos: every
    completion streams them all); the server's CPU is read after a warm-up completion per client, so connection
    set-up is not counted."""
    counted = [0]

    async def one(client: httpx.AsyncClient) -> int:
        stale = 0
        while True:
            try:
                async with client.stream("POST", "/v1/completions", json=completion_body(tokens, True)) as response:
                    if response.status_code == 429:  # refused under load: retried (its CPU is counted)
                        await response.aread()
                        await asyncio.sleep(min(RETRY_CAP_S, float(response.headers.get("retry-after", "1"))))
                        continue
                    response.raise_for_status()
                    chunks = 0
                    async for line in response.aiter_lines():
                        chunks += line.startswith("data: {")
                    return chunks
            except (httpx.ReadError, httpx.RemoteProtocolError):
                # a pooled keep-alive connection the server closed while this client waited: nothing was
                # answered, so the request is sent again on a new one
                stale += 1
                if stale > 3:
                    raise

    async def run() -> tuple[float, float]:
        limits = httpx.Limits(max_connections=streams, max_keepalive_connections=streams)
        async with httpx.AsyncClient(base_url=server.url, timeout=120, limits=limits) as client:
            await asyncio.gather(*(one(client) for _ in range(streams)))
            start = thread_cpu_s(server.proc.pid), server.cpu_s()

            async def worker() -> None:
                for _ in range(per_stream):
                    await one(client)
                    counted[0] += tokens

            await asyncio.gather(*(worker() for _ in range(streams)))
            return start

    loop0, process0 = asyncio.run(run())
    return LoopRound(thread_cpu_s(server.proc.pid) - loop0, server.cpu_s() - process0, counted[0])


def loop_part(home: Path, rounds: int, tokens: int, levels: Sequence[int]) -> list[tuple[int, list[LoopRound],
                                                                                          list[LoopRound]]]:
    """calculet on the null device beside ``bench/host_path.py``'s bare SSE server, rounds interleaved: the
    event-loop thread's CPU per streamed token of each (the loop encodes and writes every SSE frame)."""
    calc = Server("null", home)
    base = Server("", home, command=[sys.executable, str(ROOT / "bench" / "host_path.py"), "--serve-baseline"])
    rows = []
    try:
        for streams in levels:
            per_stream = max(2, 48 // streams)
            got: dict[Server, list[LoopRound]] = {calc: [], base: []}
            for r in range(rounds):
                for server in ((calc, base) if r % 2 == 0 else (base, calc)):
                    got[server].append(loop_round(server, streams, per_stream, tokens))
            rows.append((streams, got[calc], got[base]))
    finally:
        calc.stop()
        base.stop()
    return rows


def print_loop(rows: Sequence[tuple[int, list[LoopRound], list[LoopRound]]], tokens: int) -> None:
    print(f"Event-loop thread CPU per streamed token (schedstat of the main thread, which runs uvicorn's loop: "
          f"routing, SSE encoding, socket writes), calculet --sim-cost null beside bench/host_path.py's bare SSE "
          f"server, {tokens}-token streams, rounds interleaved; medians over rounds, ratio = median of per-round "
          f"ratios")
    header = (f"{'streams':>7} {'calc loop us/tok':>16} {'base loop us/tok':>16} {'loop ratio':>10} "
              f"{'calc proc us/tok':>16} {'base proc us/tok':>16}")
    print(header)
    print("-" * len(header))
    for streams, calc, base in rows:
        def med(values: Sequence[LoopRound], what: str) -> float:
            return float(np.median([getattr(v, what) / max(v.tokens, 1) * 1e6 for v in values]))
        ratio = float(np.median([c.loop_s / max(c.tokens, 1) / (b.loop_s / max(b.tokens, 1))
                                 for c, b in zip(calc, base)]))
        print(f"{streams:>7} {med(calc, 'loop_s'):>16.1f} {med(base, 'loop_s'):>16.1f} {ratio:>10.2f} "
              f"{med(calc, 'process_s'):>16.1f} {med(base, 'process_s'):>16.1f}")


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--requests", type=int, default=192, help="requests per row of part 1")
    parser.add_argument("--tokens", type=int, default=16, help="max_tokens of part 1 requests")
    parser.add_argument("--stream-tokens", type=int, default=24, help="max_tokens of part 2 streams")
    parser.add_argument("--part", choices=("http", "loop"), default="http",
                        help="http: parts 1 and 2; loop: the event loop's CPU per streamed token (part 3)")
    parser.add_argument("--rounds", type=int, default=3, help="interleaved rounds per level of part 3")
    parser.add_argument("--streams", default="1,16,64", help="concurrent streams per level of part 3")
    args = parser.parse_args(argv)
    if args.part == "loop":
        with tempfile.TemporaryDirectory(prefix="calculet-bench-home-") as home:
            levels = [int(n) for n in args.streams.split(",")]
            print_loop(loop_part(Path(home), args.rounds, 64, levels), 64)
        return 0
    with tempfile.TemporaryDirectory(prefix="calculet-bench-home-") as home:
        server = Server("instant", Path(home))
        try:
            rows, added = part1(server.url, args.requests, args.tokens)
        finally:
            server.stop()
        server = Server("reference", Path(home))
        try:
            stream_rows = part2(server.url, args.stream_tokens, len(PROMPT.encode()) + 1)
        finally:
            server.stop()

    print(f"Part 1 — HTTP layer at zero device cost (CostModel.instant), max_tokens={args.tokens}, "
          f"{args.requests} requests per row; client and server on one machine")
    header = f"{'path':<28} {'conc':>4} {'req/s':>8} {'p50 ms':>8} {'p99 ms':>8} {'added p50 ms':>12}"
    print(header)
    print("-" * len(header))
    for r in rows:
        extra = added.get((r.path, r.concurrency))
        shown = f"{extra:12.2f}" if extra is not None else ""
        print(f"{r.path:<28} {r.concurrency:>4} {r.req_per_s:>8.0f} {r.p50_ms:>8.2f} {r.p99_ms:>8.2f} {shown:>12}")
    print(f"\nPart 2 — streaming at the reference cost model (an assumption, not an NPU measurement), "
          f"{args.stream_tokens} tokens per stream, B1")
    header = (f"{'conc':>4} {'streams':>7} {'TTFT p50':>9} {'TTFT p99':>9} {'ITL p50':>8} {'ITL p99':>8} "
              f"{'device TTFT':>11} {'device ITL':>10}   (ms)")
    print(header)
    print("-" * len(header))
    for s in stream_rows:
        print(f"{s.concurrency:>4} {s.streams:>7} {s.ttft_p50_ms:>9.1f} {s.ttft_p99_ms:>9.1f} {s.itl_p50_ms:>8.1f} "
              f"{s.itl_p99_ms:>8.1f} {s.device_ttft_ms:>11.1f} {s.device_itl_ms:>10.1f}")
    print("\nadded p50: at concurrency 1 the median of per-round differences HTTP − engine (the paths interleaved "
          "request by request); at 16, the difference of p50s. Client-side HTTP work is included; GET /health/live "
          "is the HTTP floor.")
    print("device TTFT = modelled prefill of the prompt; device ITL = one B1 decode step × streams sharing the "
          "device round-robin (software multi-slot, not NPU batch). With batch.deadline_order 'at_risk' (default) "
          "streams whose deadline is not at risk rotate, so ITL is about streams × one step; under 'strict' the "
          "earliest stream runs first and a waiting stream sees one long gap (ITL p99).")
    return 0


if __name__ == "__main__":
    sys.exit(main())
