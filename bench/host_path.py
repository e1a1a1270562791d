"""The host's CPU per streamed token, beside a bare SSE server (issue #20: the figure it is judged by).

``python -m calculet.run --sim-cost null`` (the null device: no device time and no numerics, so
all the server's CPU is host work; invariant monitors at their production default, README
"Monitors") beside a bare FastAPI/uvicorn endpoint (:func:`baseline_app`: the same
``text_completion`` SSE chunks, one per token, no scheduling, served as calculet serves), both
subprocesses on 127.0.0.1 (:class:`service.Server`), driven by the same httpx client at 1, 16 and
64 concurrent 64-token streams, rounds interleaved so machine noise hits both alike. Reported:
server CPU (utime + stime of every thread, from /proc, warm-up excluded) per streamed token and
completions/s, each with its ratio calculet / baseline (median of per-round ratios). Targets:
CPU ratio ≤ 3, completions/s ratio ≥ 1/3. A 429 under load is retried after its Retry-After and
counted. The interpreter's switch interval is ``calculet.run``'s (1 ms unless ``CALCULET_SWITCH_INTERVAL_MS``
says otherwise; the report names it). ``--profile FILE`` writes a cProfile of every calculet server thread in CPU time
(``time.thread_time``) — where the host's time goes. Figures, not a pass/fail test (DESIGN
principle 10); the baseline is measured in the same run.

``--against TREE`` runs a third server, calculet from the source tree ``TREE`` (a worktree of the base commit), in
the same interleaved rounds: its figures beside the bare server's, and this tree's CPU per token over that tree's
(median of per-round ratios) — a change's before/after in the same run, under the same machine noise.

``--switch-ms 1,5`` serves this tree once per interpreter switch interval (``CALCULET_SWITCH_INTERVAL_MS`` of the
server; the first is the main row), all in the same interleaved rounds: a row per interval, and each one's CPU per
token and completions/s over the first's (median of per-round ratios) — how ``calculet.run``'s default was chosen.

``--server-cpu N`` runs every server (calculet's and the bare one) on CPU ``N`` alone and the client on the other
CPUs: on this 2-core machine the client otherwise shares a core with calculet's threads at times (they hand the
interpreter lock to each other and gain nothing from a second core), while the bare server's one thread leaves it a
core. A measurement setting, not the service's: :mod:`calculet.run` pins nothing. Only on a quiet machine: the
servers then share one CPU with whatever else runs there (session 16, load 6: the bare server's completions/s at 1
stream fell from 114 to 88 pinned, calculet's from 28-62 to 55-62, so the ratio rose from 0.39 to 0.71).

    python bench/host_path.py [--rounds 3] [--streams 1,16,64] [--tokens 64] [--profile FILE] [--against TREE]
                              [--switch-ms 1,5] [--server-cpu 1]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import sys
import tempfile
import threading
import time
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import numpy as np
from fastapi import FastAPI, Request
from fastapi.responses import StreamingResponse

from service import Server, completion_body  # bench/service.py (bench/ is sys.path[0])


def baseline_app() -> Any:
    """The bare baseline: FastAPI streaming the same OpenAI-style ``text_completion`` SSE chunks
    as calculet (one per token, a finish chunk, ``[DONE]``), with no scheduling, model or engine —
    what any Python SSE endpoint on this stack costs per token."""
    app = FastAPI()

    @app.post("/v1/completions")
    async def completions(request: Request) -> StreamingResponse:
        body = await request.json()
        n = int(body.get("max_tokens", 16))
        head = {"id": "cmpl-" + os.urandom(16).hex(), "created": int(time.time()), "model": body["model"],
                "system_fingerprint": "baseline", "object": "text_completion"}

        async def events() -> AsyncIterator[str]:
            token = 17
            for i in range(n):
                token = (token * 131 + i * 71 + 17) % 95 + 32  # printable ASCII, one per token
                choice = {"index": 0, "text": chr(token), "finish_reason": None, "logprobs": None}
                yield f"data: {json.dumps({**head, 'choices': [choice]}, separators=(',', ':'))}\n\n"
                await asyncio.sleep(0)  # one token per loop turn, as a stream fed by a device would
            choice = {"index": 0, "text": "", "finish_reason": "length", "logprobs": None}
            yield f"data: {json.dumps({**head, 'choices': [choice]}, separators=(',', ':'))}\n\n"
            yield "data: [DONE]\n\n"

        return StreamingResponse(events(), media_type="text/event-stream",
                                 headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})

    return app


def profiled_server(out: str, argv: Sequence[str]) -> None:
    """``calculet.run`` with cProfile on in every thread (the engine's actor, the device worker and
    the HTTP loop), merged into ``out`` when the server stops."""
    import cProfile
    import pstats

    from calculet import run
    profiles: list[cProfile.Profile] = []

    def start(*_: object) -> None:
        profile = cProfile.Profile(time.thread_time)  # CPU time of the thread it profiles
        profiles.append(profile)
        profile.enable()

    threading.setprofile(start)
    start()
    try:
        run.main(argv)
    finally:
        stats = pstats.Stats(profiles[0])
        for other in profiles[1:]:
            with contextlib.suppress(TypeError):  # a thread that never ran Python code
                stats.add(other)
        stats.dump_stats(out)


PROFILE_GROUPS = (
    ("scheduler (runtime/scheduling)", "calculet/runtime/scheduling/"),
    ("machines + monitors (machines/, logic/, generated fire)", ("calculet/machines/", "calculet/logic/",
                                                                 "<calculet fire")),
    ("model manager (runtime/models)", "calculet/runtime/models/"),
    ("executor, sampler, completion (runtime/execution)", "calculet/runtime/execution/"),
    ("engine actor, requests, jobs (runtime/engine, actor, clock)", ("calculet/runtime/engine/", "calculet/runtime/actor",
                                                                     "calculet/clock.py", "calculet/runtime/distribution")),
    ("null device (adapters/sim, adapters/calrt)", ("calculet/adapters/",)),
    ("streams + detokeniser (runtime/streams)", "calculet/runtime/streams/"),
    ("service, routes, metrics (calculet/server)", "calculet/server/"),
    ("ASGI/HTTP (starlette, fastapi, uvicorn, h11, anyio)", ("/starlette/", "/fastapi/", "/uvicorn/", "/h11/", "/anyio/")),
    ("asyncio + threading + queue (stdlib)", ("/asyncio/", "threading.py", "queue.py", "selectors.py")),
    ("other stdlib (contextlib, typing, enum, dataclasses)", ("contextlib.py", "typing.py", "enum.py", "dataclasses.py")),
    ("numpy", "/numpy/"),
    ("logging + json", ("/logging/", "/json/", "calculet/server/logs")),
)


def profile_breakdown(path: Path) -> list[tuple[str, float]]:
    """Own time (cProfile ``tottime``, CPU time of every thread) per part of the host path, as shares of the
    total: where the server's CPU goes, each function counted once. A builtin's time (``isinstance``, a socket
    send, a lock) is charged to the parts that called it, in proportion; start-up (imports, class building) is
    its own line."""
    import pstats
    stats = pstats.Stats(str(path)).stats  # type: ignore[attr-defined]

    def group_of(filename: str) -> str:
        if "importlib" in filename or filename.startswith("<frozen"):
            return "start-up (imports)"
        return next((label for label, keys in PROFILE_GROUPS
                     if any(k in filename for k in ((keys,) if isinstance(keys, str) else keys))), "other")

    totals: dict[str, float] = {}
    for (filename, _line, _name), (_cc, _nc, tottime, _ct, callers) in stats.items():
        if filename == "~" and callers:  # a builtin: charged to its callers
            weights = {caller: entry[2] for caller, entry in callers.items()}
            whole = sum(weights.values()) or 1.0
            for caller, weight in weights.items():
                group = group_of(caller[0])
                totals[group] = totals.get(group, 0.0) + tottime * weight / whole
            continue
        group = group_of(filename)
        totals[group] = totals.get(group, 0.0) + tottime
    whole = sum(totals.values()) or 1.0
    return sorted(((g, t / whole) for g, t in totals.items()), key=lambda x: -x[1])


def serve_baseline() -> None:
    """Serve :func:`baseline_app` on 127.0.0.1 (a free port, named in a JSON ``listening`` line on
    stderr as ``calculet.run`` does) with calculet's uvicorn settings and its listening socket."""
    import uvicorn

    from calculet.run import _listen
    sock = _listen("127.0.0.1", 0)
    print(json.dumps({"msg": "listening", "port": sock.getsockname()[1]}), file=sys.stderr, flush=True)
    server = uvicorn.Server(uvicorn.Config(baseline_app(), log_config=None, access_log=False, lifespan="off"))
    server.run(sockets=[sock])


@dataclass(frozen=True)
class HostRound:
    """One round of one server: server CPU and client-seen tokens and completions."""

    cpu_s: float
    wall_s: float
    tokens: int
    completions: int
    refused: int = 0
    """429s (retried after their Retry-After; their CPU is in ``cpu_s``)."""

    cpu_per_token_ms = property(lambda self: self.cpu_s / max(self.tokens, 1) * 1e3)
    completions_per_s = property(lambda self: self.completions / self.wall_s)


@dataclass(frozen=True)
class HostRow:
    streams: int
    calculet: list[HostRound]
    baseline: list[HostRound]
    against: list[HostRound] | None = None
    """The rounds of calculet from ``--against``'s tree, when given."""
    switched: dict[str, list[HostRound]] | None = None
    """``--switch-ms`` beyond the first: the rounds of this tree at each further switch interval (ms), when given."""

    def ratio(self, figure: str, of: list[HostRound] | None = None, to: list[HostRound] | None = None) -> float:
        """Median over rounds of ``of`` / ``to`` ``figure`` (a HostRound property); calculet / baseline by default."""
        of, to = of or self.calculet, to or self.baseline
        return float(np.median([getattr(c, figure) / getattr(b, figure) for c, b in zip(of, to)]))


def stream_round(server: Server, streams: int, per_stream: int, tokens: int) -> HostRound:
    """``streams`` concurrent clients each stream ``per_stream`` completions of ``tokens`` tokens."""
    counted = [0, 0, 0]

    async def run() -> float:
        limits = httpx.Limits(max_connections=streams, max_keepalive_connections=streams)
        async with httpx.AsyncClient(base_url=server.url, timeout=120, limits=limits) as client:
            async def one() -> None:
                stale = 0
                while True:
                    try:
                        opened = client.stream("POST", "/v1/completions", json=completion_body(tokens, True))
                        response = await opened.__aenter__()
                    except (httpx.ReadError, httpx.RemoteProtocolError):
                        # a pooled keep-alive connection the server closed while this client slept on a
                        # Retry-After: nothing was answered, so the request is sent again on a new one
                        stale += 1
                        if stale > 3:
                            raise
                        continue
                    try:
                        if response.status_code == 429:  # refused under load: retry when told, counted
                            counted[2] += 1
                            await response.aread()
                            await asyncio.sleep(float(response.headers.get("retry-after", "1")))
                            continue
                        response.raise_for_status()
                        async for line in response.aiter_lines():
                            if line.startswith("data: {") and '"finish_reason":"length"' in line:
                                counted[0] += tokens  # ignore_eos: every completion streams max_tokens
                    finally:
                        await opened.__aexit__(None, None, None)
                    counted[1] += 1
                    return

            async def worker() -> None:
                for _ in range(per_stream):
                    await one()

            await asyncio.gather(*(one() for _ in range(streams)))  # warm the connections
            counted[0] = counted[1] = counted[2] = 0
            cpu[0] = server.cpu_s()  # after the warm-up: its tokens are not counted either
            started = time.perf_counter()
            await asyncio.gather(*(worker() for _ in range(streams)))
            return time.perf_counter() - started

    cpu = [0.0]
    wall = asyncio.run(run())
    return HostRound(server.cpu_s() - cpu[0], wall, counted[0], counted[1], counted[2])


TREE_RUN = ("import runpy, sys; sys.path.insert(0, sys.argv.pop(1)); import calculet; "
            "assert calculet.__file__.startswith(sys.path[0]), calculet.__file__; "
            "runpy.run_module('calculet.run', run_name='__main__', alter_sys=True)")
"""``python -m calculet.run`` from the source tree named by its first argument (as ``bench/overload_http.py``)."""


def tree_server(home: Path, tree: Path, prefix: Sequence[str] = ()) -> Server:
    """``calculet.run --sim-cost null`` from the source tree ``tree``."""
    command = [sys.executable, "-c", TREE_RUN, str(tree.resolve()), "--host", "127.0.0.1", "--port", "0",
               "--log-format", "json", "--log-level", "INFO", "--sim-cost", "null"]
    return Server("null", home, command=command, env={"PYTHONPATH": str(tree.resolve())}, prefix=prefix)


def measure(home: Path, rounds: int, tokens: int, levels: Sequence[int], profile: Path | None,
            against: Path | None = None, switch_ms: Sequence[str] = (), server_cpu: int | None = None
            ) -> list[HostRow]:
    """calculet on the null device beside the bare baseline (and calculet from ``against``'s tree, and this tree at
    each switch interval of ``switch_ms`` after the first, which the main server gets), the rounds interleaved so
    machine noise hits all alike; ``profile``: write the calculet server's cProfile there; ``server_cpu``: every
    server runs on that CPU alone (``taskset``; the caller keeps the client off it)."""
    pin = ("taskset", "-c", str(server_cpu)) if server_cpu is not None else ()
    command = None
    if profile is not None:
        command = [sys.executable, str(Path(__file__).resolve()), "--profile-server", str(profile), "--",
                   "--host", "127.0.0.1", "--port", "0", "--log-format", "json", "--log-level", "INFO",
                   "--sim-cost", "null"]
    first = {"CALCULET_SWITCH_INTERVAL_MS": switch_ms[0]} if switch_ms else None
    calc = Server("null", home, command=command, env=first, prefix=pin)
    base = Server("", home, command=[sys.executable, str(Path(__file__).resolve()), "--serve-baseline"], prefix=pin)
    prev = tree_server(home, against, pin) if against is not None else None
    switched = {ms: Server("null", home, env={"CALCULET_SWITCH_INTERVAL_MS": ms}, prefix=pin) for ms in switch_ms[1:]}
    servers = [calc, base] + ([prev] if prev is not None else []) + list(switched.values())
    rows = []
    try:
        for streams in levels:
            per_stream = max(2, 48 // streams)
            got: dict[int, list[HostRound]] = {id(server): [] for server in servers}
            for r in range(rounds):
                for server in (servers if r % 2 == 0 else servers[::-1]):
                    got[id(server)].append(stream_round(server, streams, per_stream, tokens))
            rows.append(HostRow(streams, got[id(calc)], got[id(base)], got[id(prev)] if prev is not None else None,
                                {ms: got[id(server)] for ms, server in switched.items()} or None))
    finally:
        for server in servers:
            server.stop()
    return rows


def report(rows: Sequence[HostRow], tokens: int, switch_ms: Sequence[str] = ()) -> None:
    # calculet.run's --switch-interval-ms (#13)
    interval = switch_ms[0] if switch_ms else os.environ.get("CALCULET_SWITCH_INTERVAL_MS")
    print(f"Server CPU per streamed token, calculet --sim-cost null (monitors at the production default, switch "
          f"interval {interval + ' ms' if interval else 'calculet.run default'}) beside a bare FastAPI/uvicorn SSE "
          f"server streaming the same chunks; {tokens}-token streams, same httpx client, rounds interleaved; ratios "
          f"are medians of per-round ratios")
    header = (f"{'streams':>7} {'calc CPU/tok ms':>15} {'base CPU/tok ms':>15} {'CPU ratio':>9} "
              f"{'calc compl/s':>12} {'base compl/s':>12} {'compl/s ratio':>13}")
    print(header)
    print("-" * len(header))
    def med(rounds: list[HostRound], figure: str) -> float:
        return float(np.median([getattr(x, figure) for x in rounds]))

    for row in rows:
        further = [(f" at {ms} ms", rounds) for ms, rounds in (row.switched or {}).items()]
        for label, rounds in [("", row.calculet), (" against", row.against), *further]:
            if rounds is None:
                continue
            c, b = med(rounds, "cpu_per_token_ms"), med(row.baseline, "cpu_per_token_ms")
            cr, br = med(rounds, "completions_per_s"), med(row.baseline, "completions_per_s")
            refused = sum(x.refused for x in rounds)
            print(f"{row.streams:>7} {c:>15.3f} {b:>15.3f} {row.ratio('cpu_per_token_ms', rounds):>9.2f} {cr:>12.1f} "
                  f"{br:>12.1f} {row.ratio('completions_per_s', rounds):>13.2f}{label}"
                  + (f"   ({refused} refused with 429 and retried)" if refused else ""))
    print("targets (#20): CPU ratio <= 3, completions/s ratio >= 0.33\n")
    if any(row.against for row in rows):
        print("this tree / --against tree (median of per-round ratios): " + ", ".join(
            f"{row.streams} streams CPU/token {row.ratio('cpu_per_token_ms', row.calculet, row.against):.3f}"
            f" completions/s {row.ratio('completions_per_s', row.calculet, row.against):.3f}"
            for row in rows if row.against) + "\n")
    if any(row.switched for row in rows):
        print(f"switch interval / {interval} ms (median of per-round ratios): " + "; ".join(
            f"{row.streams} streams " + ", ".join(
                f"{ms} ms CPU/token {row.ratio('cpu_per_token_ms', rounds, row.calculet):.3f} completions/s "
                f"{row.ratio('completions_per_s', rounds, row.calculet):.3f}" for ms, rounds in row.switched.items())
            for row in rows if row.switched) + "\n")


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["--serve-baseline"]:
        serve_baseline()
        return 0
    if argv[:1] == ["--profile-server"]:
        profiled_server(argv[1], argv[3:])
        return 0
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--rounds", type=int, default=3, help="interleaved rounds per level")
    parser.add_argument("--tokens", type=int, default=64, help="tokens per stream")
    parser.add_argument("--streams", default="1,16,64", help="concurrent streams per level")
    parser.add_argument("--profile", type=Path, default=None,
                        help="write a cProfile of the calculet server (every thread, CPU time) to this file")
    parser.add_argument("--against", type=Path, default=None,
                        help="also run calculet from this source tree (a base worktree) in the same rounds")
    parser.add_argument("--switch-ms", default="",
                        help="interpreter switch intervals (ms, comma-separated) to serve this tree at, each a server "
                             "in the same rounds (default: calculet.run's own, or CALCULET_SWITCH_INTERVAL_MS)")
    parser.add_argument("--server-cpu", type=int, default=None,
                        help="run every server on this CPU alone (taskset) and the client on the others")
    args = parser.parse_args(argv)
    switch_ms = [ms.strip() for ms in args.switch_ms.split(",") if ms.strip()]
    if args.server_cpu is not None:  # the client's threads (this process) off the servers' CPU
        os.sched_setaffinity(0, set(os.sched_getaffinity(0)) - {args.server_cpu})
        print(f"servers on CPU {args.server_cpu}, the client on CPUs {sorted(os.sched_getaffinity(0))}")
    with tempfile.TemporaryDirectory(prefix="calculet-bench-home-") as home:
        levels = [int(n) for n in args.streams.split(",")]
        report(measure(Path(home), args.rounds, args.tokens, levels, args.profile, args.against, switch_ms,
                       args.server_cpu), args.tokens, switch_ms)
    if args.profile is not None:
        print(f"calculet server CPU by part (cProfile own time, every thread; {args.profile}):")
        for group, share in profile_breakdown(args.profile):
            print(f"  {share * 100:5.1f} %  {group}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
