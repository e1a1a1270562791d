"""The HTTP event loop's CPU per streamed token, in-process (issue #20): the service's ASGI app behind its real
uvicorn protocol on fake transports, the engine on the null device in the same process.

Why in-process: ``bench/host_threads.py`` splits the server's CPU by thread from ``/proc`` while an httpx client on
the same two cores drives it; a profile of the loop there sees the client's noise, and a change of a few µs per
token is lost in it. Here each request's bytes are handed to the edge's protocol (``calculet.server.http_server``'s
``edge_protocol``, httptools) as a socket read would, on a uvloop loop like uvicorn's, and the responses go to
transports that keep only what ends them (the chunked body's last chunk): the loop runs everything it runs for a
streamed completion — parsing, the ASGI stack, the route, the submit, the SSE frames, logging (the JSON formatter,
to a null stream), metrics — and nothing else. The engine's actor runs on its own thread as in the server.

``--streams`` connections each send ``--per-stream`` streamed completions of ``--tokens`` tokens one after the
other (keep-alive, as ``bench/host_path.py``'s clients). Reported per level: the loop thread's CPU per streamed
token (``time.thread_time``; its system part and voluntary switches from ``getrusage``) and the actor thread's
(``pthread_getcpuclockid``), medians of ``--rounds``, and the loop's CPU per request of ``--request-tokens``
(1) token completions (what is paid per request, whatever the length). With ``--against TREE`` each round also runs
calculet from ``TREE`` (a worktree of the base commit) in a child process, interleaved, and the ratio this/that is
reported per round; ``--tree`` runs "this" from another tree. ``--profile FILE`` writes a cProfile of the loop
thread (in its CPU time) of one more round at the first level. ``--replay N`` plays the engine's side on the loop
itself (:class:`ReplayEngine`): the loop's own work, without the interpreter lock shared with a busy actor.
``--switch-ms`` / ``--coalesce-ms``: the interpreter's switch interval and the actor's wake-up window. Figures,
not a pass/fail test.

    python bench/stream_loop.py [--streams 1,16,64] [--tokens 64] [--rounds 5] [--tree TREE] [--against TREE]
                                [--replay 14] [--profile FILE]

Measured (session 14, L8's changes on 448ea5d against 448ea5d, 5 interleaved rounds, 2 cores shared with four
other helpers, load 2-8), µs of loop CPU per streamed token at 1 / 16 / 64 streams:

* ``--replay 14`` (the loop's own work): 4.2 / 2.8 / 3.2 against 6.6 / 5.1 / 5.4 (ratios 0.59 / 0.53 / 0.56), per
  1-token request 124 against 292 µs (0.43);
* with the actor on its thread: 13.4 / 15.1 / 13.6 against 19.9 / 19.5 / 21.0 (0.73 / 0.89 / 0.68, rounds 0.58-0.99).

The loop's own work is a third of what it costs beside the busy actor: the rest moves with the machine's load
and the interpreter lock's hand-overs (switch interval 5 ms instead of 1 ms: a sixth less, a third of the
switches), not with the code the loop runs per token. Where the own work goes (cProfile, replay, 1-token
requests): the HTTP protocol and the refusal lane, the request's middleware and its log line and metrics, the
route's submit and stream, the SSE response (its client watch alone 5-8 µs a request), in shares of 10-25 % each.
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import gc
import io
import json
import os
import pstats
import resource
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from fake_transport import QuietTransport  # bench/ is the script's directory: sys.path[0]

MODEL = "tiny-random"
PROMPT = "Calculet streaming benchmark"
_END = b"0\r\n\r\n"


class SinkTransport(QuietTransport):
    """An asyncio transport that keeps nothing: it reports the end of each response (the last chunk of a chunked
    body, or a body of its ``content-length``) with its status, and counts the writes."""

    def __init__(self) -> None:
        self.writes = 0
        self.status = 0
        self.pending = -1
        """Body bytes still to come of a response with a content-length (-1: chunked, or between responses)."""
        self.done: asyncio.Future[int] | None = None

    def write(self, data: bytes) -> None:
        self.writes += 1
        if data.startswith(b"HTTP/1.1 "):
            self.status = int(data[9:12])
            head, _, body = data.partition(b"\r\n\r\n")
            lower = head.lower()
            at = lower.find(b"\r\ncontent-length:")
            if at >= 0:
                end = lower.find(b"\r\n", at + 2)
                self.pending = int(lower[at + 17: end if end > 0 else None]) - len(body)
                if self.pending <= 0:
                    self._ended()
                return
            self.pending = -1
            data = body
        if self.pending >= 0:
            self.pending -= len(data)
            if self.pending <= 0:
                self._ended()
        elif data.endswith(_END):
            self._ended()

    def _ended(self) -> None:
        self.pending = -1
        if self.done is not None and not self.done.done():
            self.done.set_result(self.status)


def request_bytes(tokens: int) -> bytes:
    """A streamed completion of ``tokens`` tokens (``ignore_eos``: every one is generated), as a client sends it."""
    body = json.dumps({"model": MODEL, "prompt": PROMPT, "max_tokens": tokens, "temperature": 0, "stream": True,
                       "ignore_eos": True}).encode()
    return (f"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: {len(body)}\r\n"
            "Content-Type: application/json\r\nAuthorization: Bearer sk-bench\r\n\r\n").encode() + body


def _service() -> tuple[Any, Any, Any]:
    from calculet.adapters.sim import CostModel, SimConfig, TimeMode
    from calculet.config import default_config
    from calculet.runtime.engine.types import EngineOptions
    from calculet.server.app import create_app
    from calculet.server.bringup import bring_up
    from calculet.server.logs import configure_logging
    from calculet.server.service import Service

    configure_logging("json", "INFO", stream=io.StringIO())  # the formatter's work, without a terminal
    brought = bring_up(default_config(), sim=SimConfig(time_mode=TimeMode.REAL, cost=CostModel.null()),
                       options=EngineOptions(verify_golden=False, **_coalesce()))
    service = Service(brought.config, brought.engine)
    service.start()
    return brought, service, create_app(service)


def _coalesce() -> dict[str, float]:
    """``--coalesce-ms`` (the actor's ``EngineOptions.wake_coalesce_s``), handed to the child in its environment."""
    value = os.environ.get("STREAM_LOOP_COALESCE_MS")
    return {"wake_coalesce_s": float(value) / 1000} if value else {}


class Connections:
    """Kept-alive connections of the edge protocol over :class:`SinkTransport`, for one app."""

    def __init__(self, app: Any, server_config: Any) -> None:
        from uvicorn.server import ServerState

        from calculet.server.http_server import edge_protocol, uvicorn_config

        self.config = uvicorn_config(app, server_config)
        self.config.http = edge_protocol(server_config.header_timeout_s, "httptools")
        self.config.timeout_keep_alive = 3600
        self.config.load()
        self.state = ServerState()
        self.open: list[tuple[Any, SinkTransport]] = []

    def take(self, count: int) -> list[tuple[Any, SinkTransport]]:
        loop = asyncio.get_running_loop()
        while len(self.open) < count:
            protocol = self.config.http_protocol_class(config=self.config, server_state=self.state, app_state={},
                                                       _loop=loop)
            transport = SinkTransport()
            protocol.connection_made(transport)
            self.open.append((protocol, transport))
        return self.open[:count]


async def _client(protocol: Any, transport: SinkTransport, data: bytes, count: int, statuses: dict[int, int]) -> None:
    loop = asyncio.get_running_loop()
    for _ in range(count):
        transport.done = loop.create_future()
        protocol.data_received(data)
        status = await transport.done
        statuses[status] = statuses.get(status, 0) + 1


class ReplayEngine:
    """``--replay``: the engine's side of each request played on the event loop itself, the actor left idle — the
    loop's own work per request and per token measured alone, without the interpreter lock shared with a busy
    actor (what moves the in-process figure by tens of percent from run to run on a loaded machine).

    ``submit_then`` admits at the next turn; every turn gives each open stream one token (one decode step of
    all lanes, as the engine's B-lane step does) and ``steps`` turns are handed over per wake-up of the loop
    (``batched_wakeups``: one ``call_soon_threadsafe`` per wake-up, as the actor's flush). The sinks' own work
    (``TimedStream.token``/``close``, the actor's in the server) is timed apart and reported as ``feed``."""

    def __init__(self, loop: asyncio.AbstractEventLoop, steps: int) -> None:
        self.loop = loop
        self.steps = steps
        self.open: list[list[Any]] = []
        self.pending: list[tuple[Any, Any, Any]] = []
        self.next_id = 1
        self.feed = 0.0
        self.armed = False

    def submit_then(self, request: Any, sink: Any, done: Any) -> None:
        self.pending.append((request, sink, done))
        self._arm()

    def _arm(self) -> None:
        if not self.armed:
            self.armed = True
            self.loop.call_soon(self._turn)

    def _turn(self) -> None:
        from calculet.machines.request import FinishReason
        from calculet.runtime.request import RequestOutcome
        from calculet.runtime.scheduling.admission import ADMITTED
        from calculet.runtime.scheduling.plan import Submission
        from calculet.runtime.streams.writer import batched_wakeups

        self.armed = False
        start = time.thread_time()
        pending, self.pending = self.pending, []
        for request, sink, done in pending:
            rid, self.next_id = self.next_id, self.next_id + 1
            self.open.append([rid, sink, request.max_new_tokens, 0])
            done(Submission(rid, ADMITTED), None)
        with batched_wakeups():
            for _ in range(self.steps):
                for lane in self.open:
                    rid, sink, limit, made = lane
                    if made < limit:
                        sink.token(rid, 32 + (rid * 7 + made * 13) % 90)  # printable ASCII, a byte each
                        lane[3] = made + 1
                        if made + 1 == limit:
                            sink.close(RequestOutcome(rid, "completed", FinishReason.LENGTH, limit, 200))
                self.open = [lane for lane in self.open if lane[3] < lane[2]]
        self.feed += time.thread_time() - start
        if self.open or self.pending:
            self._arm()


def _actor_clock() -> int | None:
    for thread in threading.enumerate():
        if thread.name == "calculet-engine" and thread.ident is not None:
            return time.pthread_getcpuclockid(thread.ident)
    return None


async def level(connections: Connections, streams: int, per_stream: int, tokens: int,
                profile: cProfile.Profile | None = None) -> dict[str, float]:
    """One round at ``streams`` connections: loop and actor CPU (µs) per streamed token, writes per token."""
    data = request_bytes(tokens)
    conns = connections.take(streams)
    statuses: dict[int, int] = {}
    await asyncio.gather(*(_client(p, t, data, 1, statuses) for p, t in conns))  # warm-up, one each
    statuses.clear()
    actor = _actor_clock()
    writes = sum(t.writes for _, t in conns)
    feed0 = connections.replay.feed if getattr(connections, "replay", None) is not None else 0.0
    a0 = time.clock_gettime(actor) if actor is not None else 0.0
    if profile is not None:
        profile.enable()
    r0 = resource.getrusage(resource.RUSAGE_THREAD)
    start = time.thread_time()
    await asyncio.gather(*(_client(p, t, data, per_stream, statuses) for p, t in conns))
    took = time.thread_time() - start
    r1 = resource.getrusage(resource.RUSAGE_THREAD)
    if profile is not None:
        profile.disable()
    a1 = time.clock_gettime(actor) if actor is not None else 0.0
    if set(statuses) != {200}:
        raise RuntimeError(f"statuses {statuses}")
    count = streams * per_stream * tokens
    replay = getattr(connections, "replay", None)
    if replay is not None:
        feed = replay.feed - feed0
        return {"loop": (took - feed) * 1e6 / count, "actor": feed * 1e6 / count,
                "writes": (sum(t.writes for _, t in conns) - writes) / count}
    return {"loop": took * 1e6 / count, "actor": (a1 - a0) * 1e6 / count,
            "writes": (sum(t.writes for _, t in conns) - writes) / count,
            "sys": (r1.ru_stime - r0.ru_stime) * 1e6 / count, "switches": (r1.ru_nvcsw - r0.ru_nvcsw) / count}


async def _run(levels: Sequence[int], tokens: int, per_request_tokens: int, profile: str | None,
               replay: int) -> dict[str, Any]:
    brought, service, app = _service()
    out: dict[str, Any] = {}
    try:
        connections = Connections(app, service.config.server)
        if replay:
            connections.replay = ReplayEngine(asyncio.get_running_loop(), replay)  # type: ignore[attr-defined]
            service.engine.submit_then = connections.replay.submit_then  # type: ignore[attr-defined]
        for n in levels:
            per_stream = max(2, 96 // n)
            out[f"{n}"] = await level(connections, n, per_stream, tokens)
        if per_request_tokens:
            one = await level(connections, 16, 12, per_request_tokens)
            out["request"] = {key: value * per_request_tokens for key, value in one.items()}
        if profile:
            prof = cProfile.Profile(time.thread_time)
            await level(connections, levels[0], max(2, 96 // levels[0]), tokens, prof)
            prof.dump_stats(profile)
    finally:
        service.stop(wait_s=5)
        brought.close()
    return out


def child(levels: Sequence[int], tokens: int, per_request_tokens: int, profile: str | None,
          replay: int = 0) -> dict[str, Any]:
    """One round in this process (the tree is whatever ``calculet`` imports from)."""
    import uvloop

    gc.freeze()
    sys.setswitchinterval(float(os.environ.get("STREAM_LOOP_SWITCH_MS", "1")) / 1000)  # 1 ms: as calculet.run
    with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
        return runner.run(_run(levels, tokens, per_request_tokens, profile, replay))


def _spawn(tree: Path, args: argparse.Namespace, profile: str | None = None) -> dict[str, Any]:
    command = [sys.executable, str(Path(__file__).resolve()), "--child", "--streams", args.streams,
               "--tokens", str(args.tokens), "--request-tokens", str(args.request_tokens), "--replay", str(args.replay)]
    if profile:
        command += ["--profile", profile]
    env = {**os.environ, "PYTHONPATH": str(tree.resolve()), "STREAM_LOOP_SWITCH_MS": str(args.switch_ms)}
    if args.coalesce_ms is not None:
        env["STREAM_LOOP_COALESCE_MS"] = str(args.coalesce_ms)
    done = subprocess.run(command, env=env, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"child in {tree} failed:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])  # type: ignore[no-any-return]


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--streams", default="1,16,64")
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument("--request-tokens", type=int, default=1, help="tokens of the per-request round (0: none)")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--against", type=Path, action="append", default=[])
    parser.add_argument("--tree", type=Path, default=None,
                        help="run 'this' from this source tree (default: the tree of this script)")
    parser.add_argument("--profile", default=None)
    parser.add_argument("--top", type=int, default=45)
    parser.add_argument("--replay", type=int, default=0,
                        help="play the engine's side on the loop (ReplayEngine), this many decode steps per wake-up")
    parser.add_argument("--switch-ms", type=float, default=1.0, help="the interpreter's switch interval (ms)")
    parser.add_argument("--coalesce-ms", type=float, default=None,
                        help="the actor's wake-up coalescing window (ms; default: EngineOptions')")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    levels = [int(n) for n in args.streams.split(",")]
    if args.child:
        print(json.dumps(child(levels, args.tokens, args.request_tokens, args.profile, args.replay)))
        return 0
    here = args.tree.resolve() if args.tree else Path(__file__).resolve().parents[1]
    trees = [("this", here)] + [(tree.resolve().name, tree) for tree in args.against]
    got: dict[str, list[dict[str, Any]]] = {label: [] for label, _ in trees}
    for r in range(args.rounds):
        for label, tree in (trees if r % 2 == 0 else trees[::-1]):
            got[label].append(_spawn(tree, args))
    print(f"Loop / actor thread CPU per streamed token (µs, median of {args.rounds} rounds), {args.tokens}-token "
          f"streams, null device, in-process; 'request': CPU per {args.request_tokens}-token request at 16 streams")
    keys = [str(n) for n in levels] + (["request"] if args.request_tokens else [])
    for key in keys:
        for label, _ in trees:
            rows = got[label]
            loop = statistics.median(row[key]["loop"] for row in rows)
            actor = statistics.median(row[key]["actor"] for row in rows)
            writes = statistics.median(row[key].get("writes", 0.0) for row in rows)
            sys_ = statistics.median(row[key].get("sys", 0.0) for row in rows)
            switches = statistics.median(row[key].get("switches", 0.0) for row in rows)
            line = (f"{key:>8} {label:>14}: loop {loop:7.1f} (sys {sys_:5.1f}, vol. switches {switches:.2f})  "
                    f"actor {actor:7.1f}  writes/token {writes:.3f}")
            if label != "this":
                ratios = [a[key]["loop"] / b[key]["loop"] for a, b in zip(got["this"], rows)]
                line += f"   this/that loop {statistics.median(ratios):.2f} (rounds {min(ratios):.2f}-{max(ratios):.2f})"
            print(line)
    if args.profile:
        _spawn(here, args, args.profile)
        stats = pstats.Stats(args.profile, stream=(out := io.StringIO()))
        stats.sort_stats("tottime").print_stats(args.top)
        stats.sort_stats("cumulative").print_stats(args.top)
        print(out.getvalue())
    return 0


if __name__ == "__main__":
    sys.exit(main())
