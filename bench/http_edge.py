"""The HTTP edge under large bodies (issue #14): a 40 MB chunked body, and four 7.5 MB bodies beside small requests.

Measured on ``python -m calculet.run --sim-cost tiny`` (the real entry point, a subprocess, 127.0.0.1, the
default ``server.max_body_bytes`` of 8 MiB), with httpx and raw-socket clients here:

Part 1 — one 40 MB body sent with ``Transfer-Encoding: chunked`` (64 KiB chunks, as fast as the socket takes
them), with an API key. Reported: the time from the client having written its first 8 MiB to the first byte of
the answer (target ≤ 1 s), the status, how much of the body the client had written by then, and the server's
RSS (``/proc/<pid>/status`` VmRSS, sampled every 5 ms) before, at its peak and after (target: growth ≤ 20 MB).

Part 2 — four clients (threads of a process of their own) each upload a 7.5 MB body (a completion whose prompt is 7.5 MB of text: read, parsed and
refused as beyond the context) ``--rounds`` times, while one client polls ``GET /health/live`` every 10 ms and another sends
1-token completions back to back. Reported: ``/health/live`` latency P50/P99/max and 1-token completion
latency P50/P99/max under the uploads, beside the same two probes with no upload (the baseline, measured in
the same run just before). Targets: ``/health/live`` P99 ≤ 100 ms; the completions' P99 not more than 100 ms
above the baseline's.

Figures, not a pass/fail test (DESIGN principle 10); the targets are printed beside them. Wall-clock figures
on a shared 2-core machine move with whatever else runs: compare each with its baseline from the same run.

Also reported: the server's CPU time during the uploads, and its event-loop thread's (the work the loop
itself does per body, load-independent), beside the loop's CPU over the same span with no traffic.

    python bench/http_edge.py [--rounds 4] [--baseline-s 3]
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import socket
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import httpx

from service import Server  # bench/service.py: the real entry point as a subprocess (bench/ is sys.path[0])

MIB = 1024 * 1024
LIMIT = 8 * MIB
CHUNK = 64 * 1024


def rss_bytes(pid: int) -> int:
    with open(f"/proc/{pid}/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    raise RuntimeError("no VmRSS")


def thread_cpu_s(pid: int, tid: int) -> float:
    """User + system CPU seconds of thread ``tid`` of process ``pid`` (``/proc/<pid>/task/<tid>/stat``)."""
    fields = Path(f"/proc/{pid}/task/{tid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _load() -> str:
    return " ".join(f"{x:.1f}" for x in os.getloadavg())


def _pct(values: Sequence[float], q: float) -> float:
    ordered = sorted(values)
    if not ordered:
        return float("nan")
    return ordered[min(len(ordered) - 1, int(round(q * (len(ordered) - 1))))]


@dataclass
class Latencies:
    name: str
    values: list[float]

    def row(self) -> str:
        ms = [v * 1000 for v in self.values]
        return (f"{self.name:<34} n={len(ms):>4}  P50 {_pct(ms, 0.5):7.1f} ms  P99 {_pct(ms, 0.99):7.1f} ms  "
                f"max {max(ms, default=float('nan')):7.1f} ms")


class Prober(threading.Thread):
    """Repeats ``call`` (a request timed here) until stopped; ``pause`` between calls."""

    def __init__(self, call: Callable[[httpx.Client], None], url: str, pause: float) -> None:
        super().__init__(daemon=True)
        self.call, self.url, self.pause = call, url, pause
        self.stop = threading.Event()
        self.latencies: list[float] = []
        self.failures = 0

    def run(self) -> None:
        with httpx.Client(base_url=self.url, timeout=60) as http:
            self.call(http)  # warm: the connection is open before timing
            while not self.stop.is_set():
                started = time.perf_counter()
                try:
                    self.call(http)
                except httpx.HTTPError:
                    self.failures += 1
                self.latencies.append(time.perf_counter() - started)
                self.stop.wait(self.pause)


def _health(http: httpx.Client) -> None:
    http.get("/health/live").raise_for_status()


def _one_token(model: str) -> Callable[[httpx.Client], None]:
    def call(http: httpx.Client) -> None:
        response = http.post("/v1/completions", json={"model": model, "prompt": "edge", "max_tokens": 1})
        response.raise_for_status()
    return call


def probed(url: str, model: str, during: Callable[[], None]) -> tuple[Latencies, Latencies, int]:
    """Run ``during`` while the two probers measure; their latencies and failures."""
    health = Prober(_health, url, 0.010)
    completions = Prober(_one_token(model), url, 0.0)
    health.start()
    completions.start()
    time.sleep(0.3)  # both warmed up
    health.latencies.clear()
    completions.latencies.clear()
    during()
    health.stop.set()
    completions.stop.set()
    health.join(60)
    completions.join(60)
    return (Latencies("/health/live", health.latencies), Latencies("1-token completion", completions.latencies),
            health.failures + completions.failures)


def uploads(url: str, model: str, clients: int, size: int, rounds: int) -> list[int]:
    """The uploads from a process of their own, so that the probes here never wait for this client's own work
    (building and sending 7.5 MB bodies holds the client's interpreter too)."""
    results: multiprocessing.Queue[list[int]] = multiprocessing.Queue()
    process = multiprocessing.Process(target=_upload_process, args=(url, model, clients, size, rounds, results))
    process.start()
    statuses = results.get(timeout=600)
    process.join(60)
    return statuses


def _upload_process(url: str, model: str, clients: int, size: int, rounds: int,
                    results: multiprocessing.Queue[list[int]]) -> None:
    results.put(_uploads(url, model, clients, size, rounds))


def _uploads(url: str, model: str, clients: int, size: int, rounds: int) -> list[int]:
    prompt = "a" * (size - 64)
    body = json.dumps({"model": model, "prompt": prompt, "max_tokens": 1}).encode()
    statuses: list[int] = []

    def client() -> None:
        with httpx.Client(base_url=url, timeout=120) as http:
            for _ in range(rounds):
                statuses.append(http.post("/v1/completions", content=body,
                                          headers={"Content-Type": "application/json"}).status_code)

    threads = [threading.Thread(target=client) for _ in range(clients)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(300)
    return statuses


@dataclass
class ChunkedResult:
    status: str
    refused_after_8mib_s: float | None
    written_at_answer: int
    rss_before: int
    rss_peak: int
    rss_after: int


def chunked_40mb(port: int, pid: int, total: int = 40 * 1000 * 1000) -> ChunkedResult:
    """One chunked body of ``total`` bytes on a raw socket; a reader thread notes when the answer arrives."""
    rss_before = rss_bytes(pid)
    peak = [rss_before]
    sampling = threading.Event()

    def sample() -> None:
        while not sampling.is_set():
            peak[0] = max(peak[0], rss_bytes(pid))
            time.sleep(0.005)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    answered: list[float] = []
    answer = bytearray()
    written = [0]
    at_answer = [0]
    sock = socket.create_connection(("127.0.0.1", port), timeout=60)

    def read() -> None:
        try:
            while True:
                data = sock.recv(65536)
                if not data:
                    return
                if not answered:
                    answered.append(time.perf_counter())
                    at_answer[0] = written[0]
                answer.extend(data)
        except OSError:
            return

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    head = (b"POST /v1/completions HTTP/1.1\r\nHost: bench\r\nContent-Type: application/json\r\n"
            b"Transfer-Encoding: chunked\r\n\r\n")
    chunk = b"%x\r\n" % CHUNK + b"a" * CHUNK + b"\r\n"
    at_8mib: float | None = None
    try:
        sock.sendall(head)
        first = b'{"model": "m", "prompt": "'
        sock.sendall(b"%x\r\n" % len(first) + first + b"\r\n")
        while written[0] < total and not answered:
            sock.sendall(chunk)
            written[0] += CHUNK
            if at_8mib is None and written[0] >= LIMIT:
                at_8mib = time.perf_counter()
    except OSError:
        pass  # the server closed while we were still sending: refused
    reader.join(30)
    sock.close()
    time.sleep(0.5)
    sampling.set()
    sampler.join(5)
    status = bytes(answer).split(b"\r\n", 1)[0].decode(errors="replace") or "(connection closed, no answer)"
    refused = answered[0] - at_8mib if answered and at_8mib is not None else None
    return ChunkedResult(status, refused, at_answer[0], rss_before, peak[0], rss_bytes(pid))


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=4, help="7.5 MB uploads per client (4 clients)")
    parser.add_argument("--baseline-s", type=float, default=3.0, help="seconds of probing with no upload")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="calculet-bench-edge-") as home:
        server = Server("tiny", Path(home))
        try:
            url = server.url
            port = int(url.rsplit(":", 1)[1])
            model = httpx.get(f"{url}/v1/models", timeout=60).json()["data"][0]["id"]
            print(f"machine load average (1/5/15 min) at the start: {_load()} on {os.cpu_count()} cores\n")
            print("Part 1 — one 40 MB chunked body (limit 8 MiB)")
            result = chunked_40mb(port, server.proc.pid)
            refused = (f"{result.refused_after_8mib_s * 1000:.0f} ms" if result.refused_after_8mib_s is not None
                       else "n/a")
            print(f"  answer: {result.status}; first answer byte {refused} after the client wrote its first 8 MiB "
                  f"(target <= 1000 ms); the client had written {result.written_at_answer / MIB:.1f} MiB by then")
            print(f"  server RSS: before {result.rss_before / MIB:.1f} MiB, peak {result.rss_peak / MIB:.1f} MiB "
                  f"(+{(result.rss_peak - result.rss_before) / 1e6:.1f} MB, target <= 20 MB), after "
                  f"{result.rss_after / MIB:.1f} MiB")
            print("\nPart 2 — four clients x 7.5 MB bodies, beside /health/live and 1-token completions")
            base_health, base_done, base_failed = probed(url, model, lambda: time.sleep(args.baseline_s))
            statuses: list[int] = []
            pid = server.proc.pid
            base_loop = thread_cpu_s(pid, pid)  # uvicorn's event loop runs in calculet.run's main thread
            time.sleep(args.baseline_s)  # the loop's CPU with no traffic at all, over the same span as the baseline
            idle_loop = thread_cpu_s(pid, pid) - base_loop
            cpu_before, wall_before, loop_before = server.cpu_s(), time.perf_counter(), thread_cpu_s(pid, pid)
            load_health, load_done, load_failed = probed(
                url, model, lambda: statuses.extend(uploads(url, model, 4, int(7.5e6), args.rounds)))
            cpu_s, wall_s = server.cpu_s() - cpu_before, time.perf_counter() - wall_before
            loop_s = thread_cpu_s(pid, pid) - loop_before
            print(f"  server CPU during the uploads {cpu_s:.2f} s over {wall_s:.2f} s wall "
                  f"({len(statuses)} bodies of 7.5 MB, probes included); its event-loop thread {loop_s:.2f} s "
                  f"({loop_s / max(1, len(statuses)) * 1000:.0f} ms per body, probes included; "
                  f"{idle_loop:.2f} s over {args.baseline_s:g} s idle)")
            print(f"  uploads answered: {sorted(statuses)} (400 = refused as beyond the context after parsing)")
            for name, latencies, failed in (("baseline (no upload)", (base_health, base_done), base_failed),
                                             ("during the uploads", (load_health, load_done), load_failed)):
                print(f"  {name}: probe failures {failed}")
                for lat in latencies:
                    print("    " + lat.row())
            health_p99 = _pct(load_health.values, 0.99) * 1000
            delay = (_pct(load_done.values, 0.99) - _pct(base_done.values, 0.99)) * 1000
            print(f"  /health/live P99 during uploads {health_p99:.1f} ms (target <= 100 ms; baseline "
                  f"{_pct(base_health.values, 0.99) * 1000:.1f} ms)")
            print(f"  1-token completion P99 delay vs baseline {delay:+.1f} ms (target <= 100 ms)")
            print(f"\nmachine load average (1/5/15 min) at the end: {_load()} on {os.cpu_count()} cores")
        finally:
            server.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
