"""What request tracing costs (issue #19): HTTP throughput and server CPU with tracing on vs off (a benchmark).

Two ``python -m calculet.run --sim-cost instant`` servers on 127.0.0.1, started in the same run
with the same configuration except ``monitoring.tracing.otlp_endpoint``: the traced one exports
every request's spans (request, admission, queue wait, prefill, one per decode step) with the
OTLP/HTTP exporter through a batching processor to a sink in this process (an HTTP server that
accepts and discards ``POST /v1/traces``, as a collector would). With the device free
(``instant`` cost), the service's own work is all there is, so the tracing share is as large as it
can ever be. Rounds alternate between the servers (off, on, control, off, on, control, ...) so
that the shared machine's noise falls on all; the control is a second server with tracing off, so
its ratio to the first (an A/A comparison) shows how far two identical servers differ in the same
run — the noise floor the on/off ratio must be read against.

Reported per server: requests/s (wall) and server CPU seconds per request (user + system of the
server process from /proc, every thread, the OTLP exporter's included); and the ratios
on/off. The CPU-time ratio is the figure the issue's ≤ 5 % is judged on: on a 2-core machine
shared with the client and other work, wall throughput mostly measures the neighbours.

    python bench/tracing_overhead.py [--requests 200] [--rounds 6] [--tokens 16] [--concurrency 8]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import tempfile
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx

from service import Server  # bench/service.py: the real entry point as a subprocess (bench/ is sys.path[0])


class _Sink(BaseHTTPRequestHandler):
    """``POST /v1/traces`` → 200, body counted and discarded (an OTLP collector that keeps nothing)."""

    received = {"posts": 0, "bytes": 0}
    lock = threading.Lock()

    def do_POST(self) -> None:  # noqa: N802 - http.server's name
        size = int(self.headers.get("content-length") or 0)
        self.rfile.read(size)
        with self.lock:
            self.received["posts"] += 1
            self.received["bytes"] += size
        self.send_response(200)
        self.send_header("content-type", "application/x-protobuf")
        self.send_header("content-length", "0")
        self.end_headers()

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - the base class's name
        return


async def _round(url: str, requests: int, tokens: int, concurrency: int) -> float:
    """``requests`` completions, ``concurrency`` at a time; returns the wall seconds."""
    limits = httpx.Limits(max_connections=concurrency, max_keepalive_connections=concurrency)
    async with httpx.AsyncClient(base_url=url, timeout=60.0, limits=limits) as client:
        served = (await client.get("/v1/models")).json()["data"][0]["id"]
        body = {"model": served, "prompt": "tracing overhead benchmark", "max_tokens": tokens, "temperature": 0,
                "ignore_eos": True}
        queue: asyncio.Queue[int] = asyncio.Queue()
        for i in range(requests):
            queue.put_nowait(i)

        async def worker() -> None:
            while not queue.empty():
                queue.get_nowait()
                response = await client.post("/v1/completions", json=body)
                response.raise_for_status()

        started = time.perf_counter()
        await asyncio.gather(*(worker() for _ in range(concurrency)))
        return time.perf_counter() - started


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--requests", type=int, default=200, help="completions per round and server")
    parser.add_argument("--rounds", type=int, default=6, help="measured rounds per server (alternating)")
    parser.add_argument("--tokens", type=int, default=16, help="max_tokens per completion")
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--json", metavar="FILE", help="also write the figures as JSON")
    args = parser.parse_args(argv)

    sink = ThreadingHTTPServer(("127.0.0.1", 0), _Sink)
    threading.Thread(target=sink.serve_forever, daemon=True).start()
    endpoint = f"http://127.0.0.1:{sink.server_address[1]}/v1/traces"
    with tempfile.TemporaryDirectory(prefix="calculet-tracing-bench-") as tmp:
        home = Path(tmp)
        off_cfg, on_cfg = home / "off.yaml", home / "on.yaml"
        off_cfg.write_text("schema: calculet-scheduler/v1\n")
        on_cfg.write_text(f"schema: calculet-scheduler/v1\nmonitoring:\n  tracing:\n    otlp_endpoint: {endpoint}\n")
        servers = {"off": Server("instant", home, off_cfg), "on": Server("instant", home, on_cfg),
                   "control": Server("instant", home, off_cfg)}
        try:
            figures = _measure(servers, args)
        finally:
            for server in servers.values():
                server.stop()
    sink.shutdown()
    figures["otlp_posts"] = _Sink.received["posts"]
    figures["otlp_bytes"] = _Sink.received["bytes"]
    _report(figures, args)
    if args.json:
        Path(args.json).write_text(json.dumps(figures, indent=2))
    return 0


def _measure(servers: dict[str, Server], args: argparse.Namespace) -> dict[str, Any]:
    for server in servers.values():  # warm-up: imports, first JIT-less paths, connection setup
        asyncio.run(_round(server.url, max(10, args.requests // 10), args.tokens, args.concurrency))
    wall: dict[str, list[float]] = {name: [] for name in servers}
    cpu: dict[str, list[float]] = {name: [] for name in servers}
    for _ in range(args.rounds):
        for name, server in servers.items():
            before = server.cpu_s()
            wall[name].append(asyncio.run(_round(server.url, args.requests, args.tokens, args.concurrency)))
            cpu[name].append(server.cpu_s() - before)
    out: dict[str, Any] = {"requests_per_round": args.requests, "rounds": args.rounds, "tokens": args.tokens,
                           "concurrency": args.concurrency}
    for name in servers:
        out[name] = {"requests_per_s": args.requests * args.rounds / sum(wall[name]),
                     "requests_per_s_median_round": args.requests / statistics.median(wall[name]),
                     "cpu_ms_per_request": 1000 * sum(cpu[name]) / (args.requests * args.rounds),
                     "cpu_ms_per_request_median_round": 1000 * statistics.median(cpu[name]) / args.requests}
    out["cpu_ratio_on_off"] = out["on"]["cpu_ms_per_request"] / out["off"]["cpu_ms_per_request"]
    out["cpu_ratio_per_round"] = [on / off for on, off in zip(cpu["on"], cpu["off"])]
    out["cpu_ratio_median_round"] = statistics.median(out["cpu_ratio_per_round"])
    out["control_cpu_ratio"] = out["control"]["cpu_ms_per_request"] / out["off"]["cpu_ms_per_request"]
    out["control_cpu_ratio_per_round"] = [c / off for c, off in zip(cpu["control"], cpu["off"])]
    out["control_throughput_ratio"] = out["control"]["requests_per_s"] / out["off"]["requests_per_s"]
    out["throughput_ratio_on_off"] = out["on"]["requests_per_s"] / out["off"]["requests_per_s"]
    return out


def _report(f: dict[str, Any], args: argparse.Namespace) -> None:
    print(f"tracing overhead — {args.rounds} alternating rounds × {args.requests} completions of {args.tokens} "
          f"tokens per server, {args.concurrency} concurrent, --sim-cost instant, 127.0.0.1")
    print(f"{'':10}{'req/s':>10}{'req/s (median round)':>22}{'server CPU ms/req':>20}{'(median round)':>16}")
    for name in ("off", "on", "control"):
        s = f[name]
        label = "control" if name == "control" else f"tracing {name}"
        print(f"{label:10}{s['requests_per_s']:>10.1f}{s['requests_per_s_median_round']:>22.1f}"
              f"{s['cpu_ms_per_request']:>20.3f}{s['cpu_ms_per_request_median_round']:>16.3f}")
    rounds = ", ".join(f"{r:.3f}" for r in f["cpu_ratio_per_round"])
    print(f"CPU on/off per round (paired, in run order): {rounds}; median {f['cpu_ratio_median_round']:.3f}")
    print(f"CPU per request on/off: {f['cpu_ratio_on_off']:.3f} ({100 * (f['cpu_ratio_on_off'] - 1):+.1f} %); "
          f"throughput on/off: {f['throughput_ratio_on_off']:.3f}; OTLP posts {f['otlp_posts']} "
          f"({f['otlp_bytes'] / 1024:.0f} KiB)")
    rounds = ", ".join(f"{r:.3f}" for r in f["control_cpu_ratio_per_round"])
    print(f"A/A control (a second server, tracing off) / off: CPU per request {f['control_cpu_ratio']:.3f}, "
          f"throughput {f['control_throughput_ratio']:.3f}; per round: {rounds}")


if __name__ == "__main__":
    sys.exit(main())
