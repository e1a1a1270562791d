"""The event loop's CPU per request, in-process: the service's ASGI app behind its real uvicorn protocol on a fake
transport (issue #13, time to 429 under a burst).

Why in-process: ``bench/overload_http.py`` measures the loop's CPU per request from ``/proc`` while a client on
the same two cores drives it, so one figure moves with the load and a profile of it sees the client's noise.
Here the bytes of a request are handed to the edge's protocol (``calculet.server.http_server.edge_protocol``,
httptools or h11) as a socket read would, on a uvloop loop like uvicorn's, and the response is collected from a
transport that only keeps bytes: everything the loop runs for a request — parsing, the ASGI stack, the route,
logging (to a null stream, the JSON formatter), metrics — and nothing else.

Phases, each ``--requests`` requests on as many connections, all fed at once (a burst):

* ``live``: ``GET /health/live`` (what every request pays: the stack);
* ``refuse idle``: the same completions sent to an idle device (no snapshot until the engine admitted the first
  few: most are held for its answers), with the wall time and the loop's CPU up to the last 429 (the engine's
  answers in the same process: a wall time here moves with the machine's load);
* ``refuse``: ``POST /v1/completions`` that the admission refuses (the device is kept busy by a long request
  submitted before each round, 80 tokens within the default 5 s deadline at the reference B1 step: a burst of
  16-token completions with the same deadline, as ``overload_http.py --part burst``, finds the device busy).

Reported per phase: the loop thread's CPU per request (``time.thread_time`` over the phase, the engine's threads
excluded), median of ``--rounds``, beside a bare ASGI app on the same protocol and harness (the floor), and the
statuses. ``--profile`` writes a cProfile of one more round of each phase (``--profile-out``) and prints the top
functions by own time and by cumulative time. ``--stages`` runs ``--rounds`` more rounds of the refusal phases with
the lane's stages timed (:class:`Stages`: each function's own loop-thread CPU, the stages it calls excluded) and
prints the CPU per request of each stage: what a profiler's per-call overhead would distort (cProfile triples the
loop's CPU and moves the snapshot's timing, so a third of a profiled round's requests went to the engine).

With ``--distinct`` every completion has a prompt of its own (no body is seen twice: the refusal lane's memo of
prepared bodies never hits, :mod:`calculet.server.refusal_lane`).

With ``--tree PATH`` (a worktree of a base commit) the phases run in processes of both trees, alternately (``--blocks``
each, ``--rounds`` split between them), and the medians are printed side by side: a before/after in one run.

    python bench/loop_profile.py [--requests 300] [--rounds 5] [--http httptools|h11] [--distinct] [--profile]
                                 [--stages] [--tree PATH [--blocks 3]]
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import gc
import io
import json
import logging
import math
import os
import pstats
import re
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import uvloop

from calculet.adapters.sim import CostModel, SimConfig, TimeMode
from calculet.config import SchedulerConfig
from calculet.runtime.engine.types import GenerateRequest
from calculet.runtime.streams.writer import StreamWriter
from fake_transport import QuietTransport  # bench/ is the script's directory: sys.path[0]

MODEL = "tiny-random"
PROMPT = "Calculet overload benchmark"


class FakeTransport(QuietTransport):
    """An asyncio transport that keeps nothing: it reads each response's status and ``content-length`` (the
    service's and uvicorn's header names are lower case) and reports every complete response."""

    def __init__(self) -> None:
        self.pending = 0
        """Body bytes of the current response still to come."""
        self.status = 0
        self.on_response: Callable[[int], None] = lambda status: None

    def write(self, data: bytes) -> None:
        if self.pending == 0 and data.startswith(b"HTTP/1.1 "):  # a head (uvicorn writes a head in one piece)
            self.status = int(data[9:12])
            head, _, body = data.partition(b"\r\n\r\n")
            found = _LENGTH.search(head)
            self.pending = (int(found.group(1)) if found else 0) - len(body)
        else:
            self.pending -= len(data)
        if self.pending <= 0:
            self.pending = 0
            self.on_response(self.status)


_LENGTH = re.compile(rb"\r\ncontent-length: *(\d+)")


BARE_APP_BODY = b'{"status":"live","detail":null}'


async def bare_app(scope: Any, receive: Any, send: Any) -> None:
    """The floor: a ten-line ASGI app (as ``overload_http.py``'s bare server)."""
    if scope["type"] != "http":
        return
    await send({"type": "http.response.start", "status": 200,
                "headers": [(b"content-type", b"application/json"), (b"content-length", b"31")]})
    await send({"type": "http.response.body", "body": BARE_APP_BODY})


@dataclass
class Harness:
    """Connections of the edge protocol over fake transports, for one app."""

    app: Any
    server_config: Any
    http: str
    requests: int

    def __post_init__(self) -> None:
        from uvicorn.server import ServerState

        from calculet.server.http_server import uvicorn_config

        self.config = uvicorn_config(self.app, self.server_config)
        self.config.http = __import__("calculet.server.http_server", fromlist=["edge_protocol"]).edge_protocol(
            self.server_config.header_timeout_s, self.http)
        self.config.timeout_keep_alive = 3600  # the connections stay open between bursts, as the bench's clients'
        self.config.load()
        self.state = ServerState()
        self.connections: list[tuple[Any, FakeTransport]] = []

    async def burst(self, data: bytes | list[bytes], count: int) -> tuple[float, dict[int, int]]:
        """``count`` kept-alive connections (opened at the first burst, as the bench's clients open theirs before
        the burst) each send ``data`` at once; (loop thread CPU seconds, statuses) until all are answered."""
        loop = asyncio.get_running_loop()
        done = loop.create_future()
        statuses: dict[int, int] = {}
        left = [count]

        def answered(status: int) -> None:
            statuses[status] = statuses.get(status, 0) + 1
            if status == 429:
                self.last_refusal = (time.perf_counter() - wall, time.thread_time() - start)
            left[0] -= 1
            if left[0] == 0 and not done.done():
                done.set_result(None)

        while len(self.connections) < count:
            protocol = self.config.http_protocol_class(config=self.config, server_state=self.state, app_state={},
                                                       _loop=loop)
            transport = FakeTransport()
            protocol.connection_made(transport)
            self.connections.append((protocol, transport))
        # made before the clock starts: a --distinct round's bodies (json.dumps each) are the client's work, not the
        # loop's (they were counted in the phase's CPU per request before R7)
        each = list(data) if isinstance(data, list) else [data] * count
        self.last_refusal = (math.nan, math.nan)
        wall = time.perf_counter()
        start = time.thread_time()
        for (protocol, transport), request in zip(self.connections[:count], each):
            transport.on_response = answered
            protocol.data_received(request)
        await asyncio.wait_for(done, 60)
        return time.thread_time() - start, statuses


def _raw(method: str, path: str, body: dict[str, Any] | None = None) -> bytes:
    payload = b"" if body is None else json.dumps(body).encode()
    head = f"{method} {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: {len(payload)}\r\n"
    if body is not None:
        head += "Content-Type: application/json\r\n"
    return (head + "\r\n").encode() + payload


def _config(deadline_ms: int) -> SchedulerConfig:
    from calculet.config import load_config

    import tempfile
    from pathlib import Path

    document = {"schema": "calculet-scheduler/v1", "model_alias": MODEL,
                "admission": {"deadline_default_ms": deadline_ms}, "batch": {"deadline_order": "on_time"}}
    path = Path(tempfile.mkdtemp(prefix="calculet-loop-profile-")) / "config.yaml"
    path.write_text(json.dumps(document))
    return load_config(str(path))


def _service(deadline_ms: int) -> Any:
    from calculet.server.app import create_app
    from calculet.server.bringup import bring_up
    from calculet.server.logs import configure_logging
    from calculet.server.service import Service

    configure_logging("json", "INFO", stream=io.StringIO())  # the formatter's work, without a terminal
    config = _config(deadline_ms)
    brought = bring_up(config, sim=SimConfig(time_mode=TimeMode.REAL, cost=CostModel.reference()))
    service = Service(brought.config, brought.engine)
    service.start()
    return brought, service, create_app(service)


BACKLOG_TOKENS = 80
"""The backlog's length: 3.4 s at the reference B1 step (42.5 ms), within the 5 s default deadline with the
admission's margin."""


def _backlog(service: Any, tokens: int) -> StreamWriter | None:
    """A long request submitted straight to the engine: the device stays busy, later requests have no prospect
    (None when it was refused: the retry slots of earlier bursts' refusals hold the device, as busy)."""
    stream = StreamWriter()
    submission = service.engine.submit(GenerateRequest(service.tokenizer.encode(PROMPT), tokens, tenant="default"),
                                       stream)
    return None if submission.outcome.rejected else stream


def _print_profile(profile: cProfile.Profile, title: str, top: int) -> None:
    out = io.StringIO()
    stats = pstats.Stats(profile, stream=out)
    stats.sort_stats("tottime").print_stats(top)
    stats.sort_stats("cumulative").print_stats(top)
    print(f"=== profile: {title}\n{out.getvalue()}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--requests", type=int, default=300)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--http", default="httptools", choices=("httptools", "h11"))
    parser.add_argument("--deadline-ms", type=int, default=5000)
    parser.add_argument("--tokens", type=int, default=16)
    parser.add_argument("--gc-threshold", type=int, default=0, help="gc.set_threshold's first value (0: as is)")
    parser.add_argument("--distinct", action="store_true", help="a prompt of its own for every refused request")
    parser.add_argument("--profile", action="store_true")
    parser.add_argument("--profile-out", default="/tmp/loop_profile")
    parser.add_argument("--top", type=int, default=40)
    parser.add_argument("--stages", action="store_true", help="the refusal phases' CPU per request by stage")
    parser.add_argument("--tree", default=None,
                        help="a base source tree (a worktree of a base commit): the phases run in a process of each "
                             "tree, alternately, --blocks times each, and the figures are printed side by side")
    parser.add_argument("--blocks", type=int, default=3, help="with --tree: processes per tree, interleaved")
    parser.add_argument("--json", action="store_true", help=argparse.SUPPRESS)  # a child of --tree
    args = parser.parse_args(argv)
    if args.tree is not None:
        return _against(args, sys.argv[1:] if argv is None else list(argv))
    logging.getLogger("calculet.server.inference").setLevel(logging.INFO)
    brought, service, app = _service(args.deadline_ms)
    gc.freeze()  # as calculet.run does before serving
    if args.gc_threshold:
        gc.set_threshold(args.gc_threshold, *gc.get_threshold()[1:])
    try:
        with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:  # uvicorn's loop ("auto": uvloop)
            return runner.run(_run(args, service, app))
    finally:
        service.stop(wait_s=5)
        brought.close()


class _Pinned:
    """An admission snapshot pinned for one burst, every lane busy far beyond any deadline: every request is
    refused by the front from it, none goes to the engine — the refusal path alone, without the actor's
    answers, the requests it admits or their tokens on the loop."""

    def __init__(self, engine: Any, snapshot: Any) -> None:
        self.engine_type = type(engine)
        self.saved = self.engine_type.__dict__["admission_snapshot"]
        self.pinned = snapshot._replace(valid_until=math.inf, free=tuple(free + PINNED_BUSY_S for free in snapshot.free),
                                        kept=max(1, snapshot.kept))  # kept work: the engine would refuse too

    def __enter__(self) -> None:
        pinned = self.pinned
        self.engine_type.admission_snapshot = property(lambda engine: pinned)  # type: ignore[attr-defined]

    def __exit__(self, *exc: object) -> None:
        self.engine_type.admission_snapshot = self.saved  # type: ignore[attr-defined]


PINNED_BUSY_S = 3600.0


async def _phase(name: str, harness: Harness, data: bytes, service: Any, state: dict[str, Any],
                 profile: cProfile.Profile | None = None) -> tuple[float, dict[int, int]]:
    """One burst of phase ``name`` (the refusal phase first makes sure the device is busy; the pinned one uses the
    first snapshot the engine published in a refusal phase)."""
    if name == "refuse idle":  # the device idle, as at a burst after a quiet spell (no snapshot to refuse from)
        while state["backlog"] is not None and not state["backlog"].closed:
            await asyncio.sleep(0.05)
        state["backlog"] = None
        await asyncio.sleep(0.3)
    if name == "refuse" and (state["backlog"] is None or state["backlog"].closed):
        state["backlog"] = _backlog(service, BACKLOG_TOKENS)
        await asyncio.sleep(0.3)
    pinned = None
    if name == "refuse pinned":
        pinned = _Pinned(service.engine, state["snapshot"])
        pinned.__enter__()
    watch = asyncio.ensure_future(_catch_snapshot(service, state)) if "snapshot" not in state else None
    try:
        if profile is not None:
            profile.enable()
        try:
            return await harness.burst(data, harness.requests)
        finally:
            if profile is not None:
                profile.disable()
    finally:
        if pinned is not None:
            pinned.__exit__()
        if watch is not None:
            watch.cancel()


async def _catch_snapshot(service: Any, state: dict[str, Any]) -> None:
    while "snapshot" not in state:
        snapshot = service.engine.admission_snapshot
        if snapshot is not None:
            state["snapshot"] = snapshot
        await asyncio.sleep(0.0005)


class Stages:
    """Loop-thread CPU per stage of a request: each instrumented function's own time, the instrumented functions it
    calls excluded (a stack of open stages, each paused while a nested one runs). The rest of a phase's CPU (the
    loop, asyncio, the ASGI path of the requests the lane forwards) is ``other``. The wrappers cost about a
    microsecond a call: the total is printed beside the uninstrumented rounds' figure."""

    def __init__(self) -> None:
        self.spent: dict[str, float] = {}
        self._open: list[list[Any]] = []
        self._undo: list[tuple[Any, str, Any]] = []

    def wrap(self, stage: str, fn: Callable[..., Any]) -> Callable[..., Any]:
        spent, opened, clock = self.spent, self._open, time.thread_time

        def timed(*args: Any, **kwargs: Any) -> Any:
            now = clock()
            if opened:
                outer = opened[-1]
                spent[outer[0]] = spent.get(outer[0], 0.0) + now - outer[1]
            mine = [stage, now]
            opened.append(mine)
            try:
                return fn(*args, **kwargs)
            finally:
                end = clock()
                opened.pop()
                spent[stage] = spent.get(stage, 0.0) + end - mine[1]
                if opened:
                    opened[-1][1] = end
        return timed

    def patch(self, owner: Any, name: str, stage: str) -> None:
        """``owner.name`` (a class's method or a module's function) timed as ``stage`` until :meth:`restore`."""
        original = owner.__dict__[name] if isinstance(owner, type) else getattr(owner, name)
        self._undo.append((owner, name, original))
        setattr(owner, name, self.wrap(stage, original))

    def restore(self) -> None:
        for owner, name, original in reversed(self._undo):
            if isinstance(owner, dict):
                owner[name] = original
            else:
                setattr(owner, name, original)
        self._undo.clear()


def _stage_targets(stages: Stages) -> None:
    """What the lane's path runs, by stage (see :class:`Stages`)."""
    import calculet.server.inference as inference
    import calculet.server.refusal_lane as lane
    import calculet.server.request_parsing as parsing
    from calculet.runtime.engine.admission_snapshot import EarlyAdmission
    from calculet.runtime.scheduling.on_time_retry import RetrySlots
    from calculet.server.http_fast import FastEdgeProtocol

    for name in ("_parse",):
        stages.patch(FastEdgeProtocol, name, "http read+parse")
    for name in ("settle", "write_answer"):
        stages.patch(FastEdgeProtocol, name, "lane glue+write")
    for name in ("arrive", "_end_turn", "decide", "_decide", "_drain", "_decide_held"):
        stages.patch(lane.RefusalLane, name, "lane glue+write")
    stages.patch(parsing, "parse_body", "json+validate")
    stages.patch(parsing, "completion_prompt", "tokenize")
    stages.patch(parsing, "chat_prompt", "tokenize")
    for path, (prepare, param) in list(inference.GENERATION_ROUTES.items()):
        stages._undo.append((inference.GENERATION_ROUTES, path, (prepare, param)))
        inference.GENERATION_ROUTES[path] = (stages.wrap("prepare other", prepare), param)
    for name in ("_screen", "_prepared"):
        stages.patch(lane.RefusalLane, name, "screen")
    for name in ("decide", "_refusal", "should_hold", "engine_refused"):
        stages.patch(EarlyAdmission, name, "snapshot decide")
    for name in ("reserve", "admitted", "expire"):
        stages.patch(RetrySlots, name, "retry slots")
    stages.patch(lane.RefusalLane, "_answer", "429 answer")
    stages.patch(lane.AnswerBytes, "response", "429 answer")
    stages.patch(lane, "log_lines", "log line")
    for name in ("_count", "flush"):
        stages.patch(lane.RefusalLane, name, "metrics")


class _Distinct(list):  # type: ignore[type-arg]
    """Requests made afresh for each burst (``--distinct``): a list the harness reads, refilled at each read."""

    def __init__(self, make: Callable[[], bytes], count: int) -> None:
        super().__init__()
        self.make, self.count = make, count

    def __iter__(self) -> Any:
        return iter([self.make() for _ in range(self.count)])


async def _run(args: argparse.Namespace, service: Any, app: Any) -> int:
    server = service.config.server
    completion: bytes | list[bytes] = _raw("POST", "/v1/completions", {
        "model": MODEL, "prompt": PROMPT, "max_tokens": args.tokens, "temperature": 0, "ignore_eos": True})
    if args.distinct:  # every request of every round its own prompt: no body is seen twice (no memo hit)
        bodies = iter(range(10**9))
        completion = _Distinct(lambda: _raw("POST", "/v1/completions", {
            "model": MODEL, "prompt": f"{PROMPT} {next(bodies):09d}", "max_tokens": args.tokens, "temperature": 0,
            "ignore_eos": True}), args.requests)
    phases = {"bare live": (Harness(bare_app, server, args.http, args.requests), _raw("GET", "/health/live")),
              "live": (Harness(app, server, args.http, args.requests), _raw("GET", "/health/live")),
              "refuse": (Harness(app, server, args.http, args.requests), completion),
              "refuse pinned": (Harness(app, server, args.http, args.requests), completion),
              "refuse idle": (Harness(app, server, args.http, args.requests), completion)}
    warm = _backlog(service, 4)
    while warm is not None and not warm.closed:  # a measured decode step: the on_time admission plans from it
        await asyncio.sleep(0.01)
    state = {"backlog": warm}
    figures: dict[str, list[float]] = {name: [] for name in phases}
    idle: list[tuple[float, float]] = []
    seen: dict[str, dict[int, int]] = {}
    forwards: list[dict[str, int]] = []
    for _ in range(args.rounds):
        for name, (harness, data) in phases.items():
            before = service.early_admission.statistics().forwarded
            took, statuses = await _phase(name, harness, data, service, state)
            figures[name].append(took * 1e3 / args.requests)
            if name == "refuse idle":
                last_wall, last_cpu = phases[name][0].last_refusal
                idle.append((last_wall * 1e3, last_cpu * 1e3 / args.requests))
                after = service.early_admission.statistics().forwarded
                forwards.append({why: n - before[why] for why, n in after.items() if n > before[why]})
            seen[name] = statuses
    if args.profile:
        for name, (harness, data) in phases.items():
            profile = cProfile.Profile(time.thread_time)  # CPU: not the waits for the lock the engine holds
            await _phase(name, harness, data, service, state, profile)
            profile.dump_stats(f"{args.profile_out}-{name.replace(' ', '_')}.prof")
            _print_profile(profile, name, args.top)
    if args.stages:
        await _stage_rounds(args, phases, service, state)
    if args.json:  # a child of --tree: its rounds' figures for the parent
        print(CHILD_MARK + json.dumps({"figures": figures, "statuses": {name: {str(code): n for code, n in seen[name].items()}
                                                                       for name in seen}}))
        return 0
    print(f"loop thread CPU per request, {args.requests} requests fed at once, {args.rounds} rounds ({args.http}):")
    for name, values in figures.items():
        print(f"  {name:<14} median {statistics.median(values):.3f} ms, min {min(values):.3f}, max {max(values):.3f}"
              f"  statuses {seen[name]}")
    if idle:
        print("  refuse idle, up to the last 429: wall ms / loop CPU per request ms: "
              + ", ".join(f"{w:.0f}/{c:.3f}" for w, c in idle))
        print("  refuse idle, the front's forwards of each round: " + "; ".join(
            ", ".join(f"{why} {n}" for why, n in round_.items()) or "none" for round_ in forwards))
    front = service.early_admission.statistics()
    print(f"  front: refused {front.refused}, forwarded {front.forwarded}, held {front.held}")
    return 0


CHILD_MARK = "loop_profile figures: "
"""The line a child of ``--tree`` prints its rounds' figures on (JSON after it)."""

TREE_RUN = ("import os, runpy, sys; tree = sys.argv.pop(1); sys.argv.pop(0); script = sys.argv[0]; "
            "sys.path[:0] = [tree, os.path.dirname(script)]; import calculet; "
            "assert calculet.__file__.startswith(tree + os.sep), calculet.__file__; "
            "runpy.run_path(script, run_name='__main__')")
"""This script in a process importing ``calculet`` from the tree named by its first argument (checked), the script's
second (``bench/``'s ``fake_transport`` beside it)."""


def _against(args: argparse.Namespace, argv: list[str]) -> int:
    """``--tree``: the phases in a process of the base tree and one of this tree, alternately, ``--blocks`` times each
    (``--rounds`` split between the blocks), every process on the same harness (this script); per phase, the median
    of every round of each tree and their ratio. Why processes of both trees, interleaved: on a shared machine the
    CPU per request moves with the load between minutes (``docs/refusal_lane.md``); a base measured in the same run,
    block by block, moves with it."""
    from pathlib import Path

    import subprocess

    here = Path(__file__).resolve()
    trees = {"base": str(Path(args.tree).resolve()), "this": str(here.parent.parent)}
    drop = {"--tree", "--blocks"}
    child: list[str] = []
    skip = False
    for arg in argv:
        if skip:
            skip = False
            continue
        name = arg.split("=", 1)[0]
        if name in drop or name == "--rounds":
            skip = "=" not in arg
            continue
        child.append(arg)
    per_block = max(1, math.ceil(args.rounds / args.blocks))
    figures: dict[str, dict[str, list[float]]] = {"base": {}, "this": {}}
    statuses: dict[str, dict[str, Any]] = {"base": {}, "this": {}}
    for block in range(args.blocks):
        for label in (("base", "this") if block % 2 == 0 else ("this", "base")):
            command = [sys.executable, "-c", TREE_RUN, trees[label], str(here), "--json", "--rounds", str(per_block),
                       *child]
            done = subprocess.run(command, capture_output=True, text=True, check=False)
            line = next((ln for ln in done.stdout.splitlines() if ln.startswith(CHILD_MARK)), None)
            if done.returncode != 0 or line is None:
                print(done.stdout[-2000:], done.stderr[-4000:], file=sys.stderr)
                raise SystemExit(f"the {label} tree's process failed ({trees[label]})")
            found = json.loads(line[len(CHILD_MARK):])
            for name, values in found["figures"].items():
                figures[label].setdefault(name, []).extend(values)
            statuses[label] = found["statuses"]
    rounds = per_block * args.blocks
    print(f"loop thread CPU per request, {args.requests} requests fed at once, {rounds} rounds per tree in "
          f"{args.blocks} interleaved processes each ({args.http}{', distinct prompts' if args.distinct else ''}); "
          f"base {trees['base']}, this {trees['this']}:")
    print(f"  {'phase':<14} {'base median':>11} {'this median':>11} {'this/base':>9}   base min-max / this min-max")
    for name, base in figures["base"].items():
        this = figures["this"].get(name, [])
        if not this:
            continue
        b, t = statistics.median(base), statistics.median(this)
        print(f"  {name:<14} {b:>8.3f} ms {t:>8.3f} ms {t / b:>9.2f}   {min(base):.3f}-{max(base):.3f} / "
              f"{min(this):.3f}-{max(this):.3f}  statuses {statuses['base'].get(name)} / {statuses['this'].get(name)}")
    load = os.getloadavg()
    print(f"  load average at the end: {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}")
    return 0


async def _stage_rounds(args: argparse.Namespace, phases: dict[str, Any], service: Any, state: dict[str, Any]) -> None:
    """``--stages``: ``--rounds`` more rounds of the refusal phases, their stages timed (:class:`Stages`)."""
    for name in ("refuse", "refuse pinned", "refuse idle"):
        harness, data = phases[name]
        stages = Stages()
        _stage_targets(stages)
        total = 0.0
        try:
            for _ in range(args.rounds):
                took, _statuses = await _phase(name, harness, data, service, state)
                total += took
        finally:
            stages.restore()
        count = args.requests * args.rounds
        spent = dict(stages.spent)
        spent["other (loop, ASGI path)"] = total - sum(spent.values())
        print(f"=== stages: {name}, loop CPU per request (instrumented) {total * 1e3 / count:.3f} ms")
        for stage, seconds in sorted(spent.items(), key=lambda item: -item[1]):
            print(f"  {stage:<26} {seconds * 1e6 / count:7.1f} us  {100 * seconds / total:5.1f} %")


if __name__ == "__main__":
    sys.exit(main())
