"""Where the host's CPU per streamed token goes, by thread (issue #20): the measurement behind ``bench/host_path.py``'s
figure.

``bench/host_path.py`` reports the server's whole CPU per token beside a bare FastAPI SSE server. This splits it: each
server (``calculet.run --sim-cost null`` from this tree and from each ``--against TREE``, and the bare server) runs
under a launcher that names its OS threads after their Python names, so ``/proc/<pid>/task/*`` tells the HTTP event
loop (``MainThread``) from the engine's actor (``calculet-engine``) and the others. Per streamed token, for each
thread: CPU (``schedstat``, ns) with its user/system split (``stat``, clock ticks) and its voluntary/involuntary
context switches; for the process, write syscalls (socket sends, and the eventfd writes of ``call_soon_threadsafe``
under uvloop); for calculet, the stream wake-ups handed to a consumer loop (``calculet.runtime.streams.writer.
_call_soon``, counted by the launcher at one Python frame each). The window is :func:`host_path.stream_round`'s (its
warm-up completion per client counted); same client, same interleaved rounds as ``host_path``. Figures, not a
pass/fail test (DESIGN principle 10).

``--split`` also splits the actor thread's CPU per token into the engine core's turn and the work around it
(:data:`SPLIT`: the admission snapshot's publication, submits, the mailbox's waits and hand-offs, the stream
wake-ups' flush, garbage collections), timed on that thread in every calculet server of the run; ``--switch-ms 1,5``
runs this tree once per interpreter switch interval in the same rounds.

``--timeline`` instead follows one stream's completions in wall time (1 stream, 48 completions a round): the
launcher marks (:data:`TIMELINE`) when the loop reads a request, posts its submit, frames a wake-up's events and
sends them, and when the actor submits, turns, hands a token to the stream and closes it; :func:`completion_phases`
cuts each completion into :data:`PHASES` (head, hand-off, submit, first token, tokens, to client, client), with
the actor's turns within it, the loop's wake-ups, and each token's wait from the stream to its frames.

    python bench/host_threads.py [--rounds 3] [--streams 1,16,64] [--against /tmp/base_worktree ...] [--split]
                                 [--switch-ms 1,5] [--timeline]

Measured (session 13, calculet at 0dcb57b; 2 cores shared with three other helpers, load average 3-4; medians of 5
interleaved rounds; µs of CPU per streamed token, user/system in clock ticks)::

    streams   bare (one thread)   calculet: event loop + actor        writes/token   switches/token
       1        20.6 (u19/s6)       21.3 +  97.8 = 120.2 (s <= 3)      1.06 / 0.16    loop 0.19 vol., actor 0.18 invol.
      16        22.1 (u17/s5)       20.6 + 105.8 = 126.5               1.06 / 0.16    loop 0.18, actor 0.17
      64        21.8 (u18/s6)       22.7 + 100.3 = 123.1               1.06 / 0.16    loop 0.18, actor 0.13

What it says. The HTTP side of calculet — its event loop: parsing, routing, submits, the SSE framing and the socket
writes of 64-token streams — costs what the bare server's whole process costs (calculet sends 6 tokens per write
where the bare server sends one; stream wake-ups: 0.03 per token, the actor holds them up to 1 ms). The actor↔loop
handoffs cost a few µs per token at most: under 0.2 context switches per token on either thread, 0.03
``call_soon_threadsafe`` per token. The gap to the bare server is the actor thread, and most of it is the engine
core (``bench/actor_core.py``, same hour: 72-78 µs and ~315 Python calls per token, on one thread with a plain
``StreamWriter``); the rest (~20 µs) is not the service's work around the core — on one thread the ``TimedStream``
sinks and the service's request observer add 0-3 µs per token to the core's turns and the admission snapshot
published after each turn 0-2 µs (about 11 tokens a turn in the server as in ``actor_core``; garbage collection
under 1 µs) — but the core running beside the HTTP work (the loop-hosted experiment below, one thread, still pays
it). The loop thread's own profile (cProfile in its CPU time, 16 streams, after the warm-up): about half streaming
(the SSE generator, the frames of its text pieces, the ASGI send chain: one send per ~12 tokens), a third per
request (the front, body gate, routing, submit, one log line), the rest asyncio/anyio. Even with all of that at
zero, the core alone is 3.5× the bare server: the ≤ 3× target needs a cheaper core.

The experiment this measured for (issue #20, session 13): the engine hosted on the event loop's own thread (the
HTTP server served on the engine's loop, a turn a loop callback, submits on the loop run inline, streams woken on
their own thread, the admission snapshot taken when read instead of after every turn; branch ``h6-loop``). Its
whole process, this tool, same run as the table: 112.3 / 124.6 / 119.3 µs per token at 1 / 16 / 64 streams, 0.93 /
0.99 / 0.97 of the threaded engine's; ``bench/host_path.py --rounds 9 --against`` 0dcb57b: 0.91 / 0.97 / 0.91
(completions/s 1.14 / 0.94 / 1.08). That is the handoffs' and the snapshot's share, no clear margin at 16 streams,
so the threaded engine stays.

The split (session 14, ``--split --switch-ms 1,5 --rounds 5``, tree at 448ea5d plus other helpers' work in progress,
load average 6-9; µs of actor CPU per streamed token, calls per token in brackets; the wrappers cost ~1-2 µs a call,
in ``rest`` and the outer labels)::

    streams  actor  turn         publish      submit       mailbox      flush        next_wake  gc   rest
       1     105.7  93.3 (0.09)  3.3 (0.10)   4.3 (0.02)   1.5 (0.09)   0.7 (0.04)   0.3        0.6  1.7
      16     106.1  95.2 (0.09)  2.7 (0.10)   4.2 (0.02)   0.8 (0.09)   0.6 (0.04)   0.2        0.7  1.6
      64     101.3  91.8 (0.09)  2.4 (0.10)   3.4 (0.02)   0.9 (0.09)   0.6 (0.03)   0.2        0.6  1.3

What it says. The core's turn is 88-91 % of the actor; around it, 6-8 µs per token, of which the admission snapshot's
publication (one a turn, ~11 tokens a turn, ~25 µs each) 2.4-3.3 and the submits (core.submit, ~200 µs a request in
the server) 3-4.5; the completion thread costs under 1 µs per token (the null device completes at submit: it is
not in WaitAny). So the ~20 µs per token the actor spends beyond ``bench/actor_core.py``'s core alone (72-77 µs the
same hour) is inside the turn: the same core runs slower beside the HTTP loop. In these runs it went with the
actor's involuntary context switches (about one per socket write of the loop; the likely mechanism, not proven: the
loop taking the interpreter lock back after the switch interval — ``bench/actor_core.py``'s core beside a second
thread that only wakes every 0.2-0.5 ms was too noisy at load 8 to tell), which ``--switch-ms 1,5`` cuts from
0.16-0.19 to 0.07-0.11 per token: actor 105.7 / 106.1 / 101.3 µs at 1 ms against
101.5 / 92.9 / 102.4 at 5 ms, whole process 128.3 / 124.4 / 120.5 against 120.2 / 105.1 / 118.7 (1 / 16 / 64
streams, same rounds). A snapshot rebuilt only when its inputs change would save little: of 589 publications at 1
and 16 streams none equalled the previous one (the admission model moves with every measured decode step), and
26-38 % equalled it but for the model — the publication is ~2.5 % of the actor, its model part ~40 % of that.

One stream (session 16, ``--timeline --rounds 3``, a0dae5e, load average 5-6, 141 completions; median µs and share
of the median total): total 13 723 — head 803 (6 %), hand-off 33, submit 354 (3 %), first token 612 (4 %), tokens
8 928 (65 %), to client 537 (4 %), client 1 543 (11 %); 7 turns lasting 9 248 (67 %), 4 loop wake-ups, a token's wait
for its frames 1 321 (p90 2 595). The same marks at load 1: total ~9 000, tokens 6 130, client ~1 000.

What it says. One stream's completion is the actor's turns: they run back to back from the submit to the close (the
turns last as long as the first token and the tokens together), so nothing on that path waits for a timer, a
wake-up window or the mailbox. The ~4 hand-offs a completion to the loop (a token waits for its frames about the
window plus a switch interval) are latency, not throughput: the actor keeps turning, and the loop's frames and sends
take the interpreter lock from it in between — their CPU is in the completion either way. In series around the
turns: the loop's head (parsing, routing, preparing; httpx sends the body apart from the head), the core's submit,
the prefill's turn, and after the close the rest of that turn (the service's close bookkeeping ~45 µs, a last
scheduler step ~80 µs), the snapshot, the loop's wake-up, the last frames and the request's log line (~100 µs before
the last send); then the client's own ~1 ms. So one stream's completions/s is the server's CPU per completion:
#20's 0.36 of the bare server (5.7 ms a completion against ~8.3 on a quiet machine) needs about a third less CPU per
token, most of it in the core's turn. Tried the same session, interleaved against a0dae5e at load 2-8: every token
handed over at once (``wake_coalesce_s`` 0) 0.75x completions/s and 1.22x CPU per token at 1 stream (a lock hand-over
per token); a 3 ms window with turns still chained for at most 1 ms: CPU per token 0.91-1.03x at 1 stream and
0.88-1.17x at 64 over four runs, the same code at 1 ms moving as much in the same run — nothing to keep.

Session 24 (``--split --rounds 3``, 779d28b plus the admission pass's reads, load average 4.5; µs of CPU per token at
1 / 16 / 64 streams): the bare server 19.4 / 17.3 / 19.8; calculet 86.6 / 88.6 / 93.0 — its event loop 13.1 / 13.0 /
14.5 (HTTP, routing, submits, SSE frames, sends: 0.12 writes a token against the bare server's 1.06), the actor 73.9 /
75.5 / 78.4, of which the core's turn 68.5 / 70.1 / 71.5 and around it 5.4 / 5.4 / 6.9 (the admission snapshot's
publication 1.7-2.0, submits 1.4-1.6, mailbox 0.5-0.9, wake-ups' flush 0.3-0.5). The turn alone is 3.5-4.1x the bare
server: #20's <= 3x (52-59 µs here) is out of reach of the work outside the core even at zero (17-21 µs a token: the
loop, already below the bare server's whole process, and around the turn no piece above 2.5 % of the whole). Inside the turn, the stream hand-off per token (the engine's
sink, ``TimedStream``, ``StreamWriter``, the detokeniser; one event per token and one loop wake-up per 30-50 tokens)
reads ~4 µs in ``bench/actor_core.py --stages`` (wrapped calls, scaled) — the rest is the core's.

Session 25 (``--split --against`` 9e0b006 ``--rounds 3``, load average 2.5-3.5 from other helpers' runs; µs of CPU per
token at 1 / 16 / 64 streams, this tree against the base in the same rounds): calculet 97.8 / 88.4 / 110.0 against
100.3 / 91.0 / 111.9; the publication 0.8 / 0.8 / 0.7 against 2.3 / 1.7 / 2.5 (0.03-0.04 a token against 0.08-0.10:
a turn chained to the next publishes only when a reader found no snapshot, ``ThreadedEngine._turned``); the loop's
voluntary switches 0.10 / 0.16 / 0.16 a token against 0.17-0.18 (an admitted request's answer rides with the
stream wake-ups: ``writer.call_soon_held``). Where the server's engine thread spends beyond ``bench/actor_core.py``'s
core on one thread (``--parts`` the same morning, load ~0.5: core 57-65 µs a token, the service's sinks and observer
+0.8-1.5, the publications +1.3-3.7, the started engine beside a consumer loop +3.3-6.9, that loop busy +1.4-3.7): no
single piece of work; what grows is the same Python work run with the interpreter lock handed to and fro (the loop
wakes ~0.15 times a token, each a hand-over of the lock and of the caches; the actor is preempted 0.11-0.18 times a
token, the loop and the HTTP client sharing its two cores). ``bench/stream_loop.py`` showed the same for the loop
(its own work a third of its CPU beside the actor). Why a wake-up of the loop is several hand-overs: uvloop runs
libuv with the lock released and takes it back in each callback (the ``call_soon_threadsafe`` async handle, the ready
queue, the tasks the wake-up's futures woke, on the next pass, the queued writes), each after up to a switch
interval while the actor turns. Tried the same session, not kept: asyncio's own loop (the lock held for a whole pass):
fewer switches (loop 0.07-0.12 voluntary a token, actor 0.07-0.12 involuntary) but ``bench/host_path.py`` CPU per
token 1.23 / 1.00 / 1.18 of uvloop's (same tree, 3 rounds, load ~2.8). ``host_path.py --against`` 9e0b006 for the
changes above, two runs: CPU per token 0.946 / 0.972 / 0.918 and 1.000 / 0.939 / 1.023 (3 and 5 rounds).

Session 26 (route 3 of ``docs/host_path.md``, against 9563f44, load average 1.5-4.7 from three other helpers' runs).
Why the turn costs more in the server: the same engine beside a uvloop consumer doing ~11 µs of Python a token, in
one process (no HTTP, no client; a scratch probe alternating blocks), read 58-62 µs a token at load ~1.5 and 93-103
minutes later at ~2.5-3 — the machine's load moves the engine thread's CPU per token more than anything the
hand-overs do, and the actor's involuntary switches follow the load (0.03-0.16 a token), not the code. Tried, not
kept: the actor waiting (bound 1 ms) after handing its wake-ups over, for the loop to run their work in one stretch.
In-process it cut the actor's involuntary switches (0.09 -> 0.06, 0.13 -> 0.09, 0.16 -> 0.125 a token) at equal CPU;
in the server the futex calls per token stayed (``strace -c -f`` over 3 rounds at 16 streams: 0.42 against 0.43)
and the actor slept 2.7 ms a hand-off on average (363 hand-offs, 136 within the bound): the core it freed went to
the HTTP client, not the loop, and completions/s fell to 0.76x at 16 streams. Kept: the SSE parts written from the
stream's wake-up callback through the protocol (``calculet.server.sse.DIRECT_BODY``): the loop's Python calls per
token 15.37 -> 14.68 (cProfile of the loop thread, 16 streams, 9 216 tokens); this table, ``--split --rounds 3``
(load 3.4-3.7; this / base, µs a token at 1 / 16 / 64 streams): whole server 100.8 / 120.5 / 91.6 against 120.0 /
114.4 / 99.0, the event loop 18.1 / 20.2 / 15.6 against 22.8 / 21.5 / 17.6 (lower in all five comparisons of the
session: -1 to -5 µs), the actor's turn moving ±15 % with the load. The loop's CPU is per request more than per
token: ~940 Python calls a 64-token request, of which ~190 frame its texts (3 a token) and ~100 write its ~3 body
parts (~20 tokens a write at 16 streams); the rest is the request: parsing, the refusal lane, routing, submit,
its head, its last part, its log line and metrics.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from host_path import stream_round  # bench/ is sys.path[0]
from service import Server

TICK = os.sysconf("SC_CLK_TCK")


ACTOR = "calculet-engine"

SPLIT = (("calculet.runtime.engine.core", "EngineCore", "turn", "turn"),
         ("calculet.runtime.engine.core", "EngineCore", "submit", "submit"),
         ("calculet.runtime.engine.core", "EngineCore", "on_results", "results"),
         ("calculet.runtime.engine.core", "EngineCore", "next_wake", "next_wake"),
         ("calculet.runtime.engine.threaded", "ThreadedEngine", "_publish", "publish"),
         ("calculet.runtime.engine.threaded", None, "flush_wakeups", "flush"),
         ("calculet.runtime.actor", "Mailbox", "run_until", "mailbox"))
"""What ``--split`` times on the actor thread (module, class or None, attribute, label): each label's *own* CPU
(``time.thread_time``, the labelled calls it makes excluded; garbage collections apart, as ``gc0``-``gc2``). The
actor's CPU outside all of them (``rest``) is its loop, the mailbox's hand-off of a message (the submit message's
closure and its ``done`` callback) and the wrappers' own cost (about 1-2 µs a wrapped call)."""


def split_timers(acc: dict[str, float], split: Sequence[tuple[str, str | None, str, str]] = SPLIT,
                 clock: Callable[[], float] = time.thread_time) -> Callable[[], None]:
    """Wrap ``split``'s functions (:data:`SPLIT`) so that, on the actor thread only, each label accumulates its own
    CPU seconds (``clock``) into ``acc`` (``<label> n``: its calls); garbage collections on that thread apart. Returns
    the undo (the functions restored, the collector's callback removed)."""
    import gc
    import importlib
    import threading

    stack: list[float] = []
    """The CPU of the labelled calls made inside each open labelled call (subtracted from its own)."""

    def wrap(fn: Any, label: str) -> Any:
        calls = f"{label} n"

        def timed(*args: Any, **kwargs: Any) -> Any:
            if threading.current_thread().name != ACTOR:
                return fn(*args, **kwargs)
            stack.append(0.0)
            t0 = clock()
            try:
                return fn(*args, **kwargs)
            finally:
                spent = clock() - t0
                inner = stack.pop()
                acc[label] = acc.get(label, 0.0) + spent - inner
                acc[calls] = acc.get(calls, 0.0) + 1
                if stack:
                    stack[-1] += spent
        return timed

    undo: list[tuple[object, str, object]] = []
    for module_name, owner_name, attr, label in split:
        module = importlib.import_module(module_name)
        owner = module if owner_name is None else getattr(module, owner_name)
        original = getattr(owner, attr)
        undo.append((owner, attr, original))
        setattr(owner, attr, wrap(original, label))
    gc_started = [0.0]

    def collected(phase: str, info: dict[str, int]) -> None:
        """A garbage collection on the actor thread: its CPU (``gc<generation>``) out of the label it ran in."""
        if threading.current_thread().name != ACTOR:
            return
        if phase == "start":
            gc_started[0] = clock()
            return
        spent, label = clock() - gc_started[0], f"gc{info['generation']}"
        acc[label] = acc.get(label, 0.0) + spent
        acc[f"{label} n"] = acc.get(f"{label} n", 0.0) + 1
        if stack:
            stack[-1] += spent

    gc.callbacks.append(collected)

    def restore() -> None:
        for owner, attr, original in reversed(undo):
            setattr(owner, attr, original)
        gc.callbacks.remove(collected)
    return restore


TIMELINE = (("calculet.server.http_fast", "FastEdgeProtocol", "data_received", "read"),
            ("calculet.runtime.engine.threaded", "ThreadedEngine", "submit_then", "post"),
            ("calculet.runtime.engine.core", "EngineCore", "submit", "submit"),
            ("calculet.runtime.engine.core", "EngineCore", "turn", "turn"),
            ("calculet.server.timed_stream", "TimedStream", "token", "token"),
            ("calculet.server.timed_stream", "TimedStream", "close", "close"),
            ("calculet.server.sse", "Frames", "batch", "frames"),
            ("uvicorn.protocols.http.httptools_impl", "RequestResponseCycle", "send", "send"))
"""What ``--timeline`` marks (module, class, attribute, label): each call's wall-clock start and end (ns), on
whichever thread makes it — the loop reads a request, posts its submit, frames a wake-up's events and sends them;
the actor submits, turns, hands each token to the request's stream and closes it."""


def timeline_marks(events: list[tuple[str, int, int]]) -> None:
    """Wrap :data:`TIMELINE`'s functions so that every call appends (label, start ns, end ns) to ``events``."""
    import importlib
    import inspect

    clock = time.perf_counter_ns

    def wrap(fn: Any, label: str) -> Any:
        if inspect.iscoroutinefunction(fn):
            async def marked_async(*args: Any, **kwargs: Any) -> Any:
                t0 = clock()
                try:
                    return await fn(*args, **kwargs)
                finally:
                    events.append((label, t0, clock()))
            return marked_async

        def marked(*args: Any, **kwargs: Any) -> Any:
            t0 = clock()
            try:
                return fn(*args, **kwargs)
            finally:
                events.append((label, t0, clock()))
        return marked

    for module_name, owner_name, attr, label in TIMELINE:
        owner = getattr(importlib.import_module(module_name), owner_name)
        setattr(owner, attr, wrap(getattr(owner, attr), label))


PHASES = ("head", "hand-off", "submit", "first token", "tokens", "to client", "client", "total")
"""One completion of one stream, in wall time (:func:`completion_phases`): ``head`` its first bytes read to its
submit posted (the loop: parsing, routing, preparing); ``hand-off`` that post to the actor's submit; ``submit`` the
actor's admission; ``first token`` the submit's end to the first token; ``tokens`` the first token to the close;
``to client`` the close to the end of the last send (the actor's rest of the turn and its publication, the loop's
wake-up, the last frames, the request's log line); ``client`` that send's end to the next request's first bytes.
Beside them, ``in turns``: the actor's turns within the completion, end to end (its first token's turn included)."""


def completion_phases(events: Sequence[tuple[str, int, int]]) -> tuple[list[dict[str, float]], list[float]]:
    """The phases (µs, :data:`PHASES`) of each completion of one stream's sequential completions in ``events``
    (the first, a warm-up, and the last, with no next one, left out), and each token's wait from its hand-off to the
    stream to the start of the frames that carry it (µs)."""
    events = sorted(events, key=lambda e: e[1])
    posts = [i for i, e in enumerate(events) if e[0] == "post"]

    def arrival(post: int) -> int:
        """The first read of the request posted at ``post``: the run of reads right before it (head, body)."""
        i = max(j for j in range(post) if events[j][0] == "read")
        while i > 0 and events[i - 1][0] == "read":
            i -= 1
        return events[i][1]

    rows: list[dict[str, float]] = []
    waits: list[float] = []
    for k in range(1, len(posts) - 1):
        start, nxt = arrival(posts[k]), arrival(posts[k + 1])
        span = [e for e in events[posts[k]:posts[k + 1]] if e[1] < nxt]
        first = {label: next((e for e in span if e[0] == label), None) for label in ("submit", "token", "close")}
        tokens = [e for e in span if e[0] == "token"]
        sends = [e for e in span if e[0] == "send"]
        post, submit, close = events[posts[k]], first["submit"], first["close"]
        if submit is None or close is None or not tokens or not sends:
            continue
        rows.append({"head": post[1] - start, "hand-off": submit[1] - post[2], "submit": submit[2] - submit[1],
                     "first token": tokens[0][1] - submit[2], "tokens": close[2] - tokens[0][1],
                     "to client": sends[-1][2] - close[2], "client": nxt - sends[-1][2], "total": nxt - start,
                     "in turns": sum(e[2] - e[1] for e in span if e[0] == "turn"),
                     "wake-ups": sum(e[0] == "frames" for e in span), "turns": sum(e[0] == "turn" for e in span)})
        frames = [e[1] for e in span if e[0] == "frames"]
        waits += [min((f for f in frames if f >= t[2]), default=t[2]) - t[2] for t in tokens]
    return ([{k: v / 1e3 if k in PHASES or k == "in turns" else v for k, v in row.items()} for row in rows],
            [w / 1e3 for w in waits])


def launch(tree: str, mode: str, counts_path: str, argv: Sequence[str]) -> None:
    """(the server process) Name every OS thread after its Python thread (prctl PR_SET_NAME), count the stream
    wake-ups calculet hands to a consumer loop, dump the count to ``counts_path`` on SIGUSR2, then serve:
    ``calculet.run`` from ``tree`` (``mode`` "calc", "split": with the actor's split, :func:`split_timers`, or
    "timeline": with :func:`timeline_marks`, the marks since the last dump dumped with the counts) or
    the bare baseline."""
    import ctypes
    import runpy
    import threading

    sys.path.insert(0, tree)
    libc = ctypes.CDLL(None)

    def name_thread(name: str) -> None:
        libc.prctl(15, name.encode()[:15], 0, 0, 0)

    bootstrap = threading.Thread._bootstrap_inner  # type: ignore[attr-defined]

    def named(self: threading.Thread) -> None:
        name_thread(self.name)
        bootstrap(self)

    threading.Thread._bootstrap_inner = named  # type: ignore[attr-defined]
    name_thread("MainThread")
    wakes = [0]
    split: dict[str, float] = {}
    marks: list[tuple[str, int, int]] = []

    def dump(*_: object) -> None:
        taken = marks[:]
        del marks[:len(taken)]
        Path(counts_path).write_text(json.dumps({"wakes": wakes[0], "split": split, "timeline": taken}))

    signal.signal(signal.SIGUSR2, dump)
    if mode == "bare":
        import host_path
        host_path.serve_baseline()
        return
    import calculet
    assert calculet.__file__ is not None and calculet.__file__.startswith(tree), calculet.__file__
    from calculet.runtime.streams import writer

    call_soon = writer._call_soon

    def counted(loop: object, fn: object) -> None:
        wakes[0] += 1
        call_soon(loop, fn)  # type: ignore[arg-type]

    writer._call_soon = counted
    if mode == "split":
        split_timers(split)
    elif mode == "timeline":
        timeline_marks(marks)
    sys.argv = ["calculet.run", *argv]
    runpy.run_module("calculet.run", run_name="__main__", alter_sys=True)


def threads(pid: int) -> dict[str, list[int]]:
    """Thread name → [on-CPU ns, utime ticks, stime ticks, voluntary, involuntary switches] (same names summed)."""
    out: dict[str, list[int]] = {}
    for tid in os.listdir(f"/proc/{pid}/task"):
        base = f"/proc/{pid}/task/{tid}"
        try:
            stat = Path(f"{base}/stat").read_text()
            ns = int(Path(f"{base}/schedstat").read_text().split()[0])
            status = dict(line.split(":", 1) for line in Path(f"{base}/status").read_text().splitlines())
        except (FileNotFoundError, ProcessLookupError):
            continue  # a thread that ended meanwhile
        fields = stat.rsplit(")", 1)[1].split()
        row = out.setdefault(stat[stat.index("(") + 1: stat.rindex(")")], [0, 0, 0, 0, 0])
        for i, value in enumerate((ns, int(fields[11]), int(fields[12]), int(status["voluntary_ctxt_switches"]),
                                   int(status["nonvoluntary_ctxt_switches"]))):
            row[i] += value
    return out


def writes(pid: int) -> int:
    return int(next(line for line in Path(f"/proc/{pid}/io").read_text().splitlines()
                    if line.startswith("syscw")).split()[1])


def wakes(server: Server, path: Path) -> tuple[int, dict[str, float]]:
    """The server's stream wake-ups so far (0 for the bare server, which has none) and its actor's split so far
    (``--split``; else empty)."""
    counts = dumped(server, path)
    return int(counts["wakes"]), counts["split"]


def dumped(server: Server, path: Path) -> dict[str, Any]:
    """What the server's launcher dumps on SIGUSR2 (:func:`launch`)."""
    path.unlink(missing_ok=True)
    os.kill(server.proc.pid, signal.SIGUSR2)
    for _ in range(500):
        try:
            return json.loads(path.read_text())  # type: ignore[no-any-return]
        except (FileNotFoundError, json.JSONDecodeError):
            time.sleep(0.01)
    raise RuntimeError("the server did not answer SIGUSR2")


def start(label: str, tree: Path, mode: str, home: Path, switch_ms: str | None = None) -> tuple[str, Server, Path]:
    """Launch a server (``mode``: "calc", "split" or "bare"; ``switch_ms``: calculet's switch interval, else its
    default or the environment's ``CALCULET_SWITCH_INTERVAL_MS``)."""
    counts = home / f"counts-{label}.json"
    argv = ["--host", "127.0.0.1", "--port", "0", "--log-format", "json", "--log-level", "INFO", "--sim-cost", "null"]
    command = [sys.executable, str(Path(__file__).resolve()), "--launch", str(tree.resolve()), mode, str(counts),
               "--", *argv]
    return label, Server("" if mode == "bare" else "null", home, command=command,
                         env={"PYTHONPATH": str(tree.resolve()),
                              **({} if switch_ms is None else {"CALCULET_SWITCH_INTERVAL_MS": switch_ms})}), counts


def measure(servers: Sequence[tuple[str, Server, Path]], levels: Sequence[int], rounds: int,
            tokens: int) -> dict[tuple[str, int], list[dict[str, float]]]:
    """Per (server, streams): one dict per round of per-token figures (``<thread> cpu``/``user``/``sys``/``vcs``/
    ``ics``, ``writes``, ``wakes``, ``total``)."""
    got: dict[tuple[str, int], list[dict[str, float]]] = {}
    for n in levels:
        per_stream = max(2, 48 // n)
        for r in range(rounds):
            for label, server, counts in (servers if r % 2 == 0 else servers[::-1]):
                pid = server.proc.pid
                t0, w0, (k0, s0) = threads(pid), writes(pid), wakes(server, counts)
                done = stream_round(server, n, per_stream, tokens)
                t1, w1, (k1, s1) = threads(pid), writes(pid), wakes(server, counts)
                tok = done.tokens + n * tokens  # stream_round's own warm-up (one completion a client) is inside
                row: dict[str, float] = {"writes": (w1 - w0) / tok, "wakes": (k1 - k0) / tok}
                for key, value in s1.items():  # per token: µs of CPU, or calls (``<label> n``)
                    row[f"split {key}"] = (value - s0.get(key, 0.0)) * (1 if key.endswith(" n") else 1e6) / tok
                total = 0.0
                for name, after in t1.items():
                    before = t0.get(name, [0] * 5)
                    d = [a - b for a, b in zip(after, before)]
                    cpu = d[0] / 1e3 / tok
                    total += cpu
                    row.update({f"{name} cpu": cpu, f"{name} user": d[1] / TICK * 1e6 / tok,
                                f"{name} sys": d[2] / TICK * 1e6 / tok, f"{name} vcs": d[3] / tok,
                                f"{name} ics": d[4] / tok})
                row["total"] = total
                got.setdefault((label, n), []).append(row)
    return got


def report(got: dict[tuple[str, int], list[dict[str, float]]], tokens: int) -> None:
    print(f"Server CPU per streamed token by thread (µs, median of rounds; user/sys from clock ticks), context "
          f"switches (voluntary/involuntary) and write syscalls per token; {tokens}-token streams, null device")
    for (label, n), rows in got.items():
        def med(key: str) -> float:
            return statistics.median(row.get(key, 0.0) for row in rows)
        names = sorted({key[:-4] for row in rows for key in row if key.endswith(" cpu")})
        parts = [f"{name} {med(name + ' cpu'):.1f} (u{med(name + ' user'):.0f}/s{med(name + ' sys'):.0f}, "
                 f"cs {med(name + ' vcs'):.2f}/{med(name + ' ics'):.2f})" for name in names if med(name + " cpu") >= 1]
        print(f"{label:>12} {n:>3} streams: total {med('total'):6.1f}  writes/tok {med('writes'):.2f}  "
              f"wakes/tok {med('wakes'):.2f} | " + "; ".join(parts))
        labels = [key[6:] for key in rows[0] if key.startswith("split ") and not key.endswith(" n")]
        if labels:
            rest = med(f"{ACTOR} cpu") - sum(med(f"split {label}") for label in labels)
            print(f"{'':>12} {'':>3} actor split (µs/token, calls/token): " + "; ".join(
                f"{label} {med(f'split {label}'):.1f} ({med(f'split {label} n'):.2f})" for label in labels)
                + f"; rest {rest:.1f}")


def measure_timeline(servers: Sequence[tuple[str, Server, Path]], rounds: int,
                     tokens: int) -> dict[str, tuple[list[dict[str, float]], list[float]]]:
    """Per calculet server: :func:`completion_phases` of one stream's completions, ``rounds`` interleaved rounds."""
    got: dict[str, tuple[list[dict[str, float]], list[float]]] = {}
    for r in range(rounds):
        for label, server, counts in (servers if r % 2 == 0 else servers[::-1]):
            dumped(server, counts)  # the marks before this round (the other rounds', the first request's) dropped
            stream_round(server, 1, 48, tokens)
            rows, waits = completion_phases([tuple(e) for e in dumped(server, counts)["timeline"]])
            mine = got.setdefault(label, ([], []))
            mine[0].extend(rows)
            mine[1].extend(waits)
    return got


def report_timeline(got: dict[str, tuple[list[dict[str, float]], list[float]]], tokens: int) -> None:
    print(f"One stream's completions ({tokens} tokens) in wall time, µs, median over completions (share of the "
          f"median total); the marks cost a few µs each, so the figures are for where the time goes, not for speed")
    for label, (rows, waits) in got.items():
        med = {key: statistics.median(row[key] for row in rows) for key in rows[0]}
        spent = ", ".join(f"{key} {med[key]:.0f} ({med[key] / med['total']:.0%})" for key in PHASES[:-1])
        waits.sort()
        print(f"{label:>12}: {len(rows)} completions, total {med['total']:.0f}: {spent}; {med['turns']:.0f} turns "
              f"lasting {med['in turns']:.0f} ({med['in turns'] / med['total']:.0%}), {med['wake-ups']:.0f} loop "
              f"wake-ups; a token's wait for its frames median {waits[len(waits) // 2]:.0f} p90 "
              f"{waits[len(waits) * 9 // 10]:.0f}")


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["--launch"]:
        launch(argv[1], argv[2], argv[3], argv[5:])
        return 0
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument("--streams", default="1,16,64")
    parser.add_argument("--against", type=Path, action="append", default=[],
                        help="also run calculet from this source tree (a worktree; may be given more than once)")
    parser.add_argument("--split", action="store_true",
                        help="split the actor's CPU per token: the core's turn, the snapshot's publication, submits, "
                             "the mailbox's waits, ... (SPLIT; timers on the actor thread, every calculet server)")
    parser.add_argument("--switch-ms", default="",
                        help="comma-separated interpreter switch intervals (ms): this tree once per interval "
                             "(labelled this@<ms>), in the same interleaved rounds")
    parser.add_argument("--timeline", action="store_true",
                        help="one stream's completions in wall time, phase by phase (TIMELINE marks, PHASES), "
                             "instead of the CPU per token")
    args = parser.parse_args(argv)
    here = Path(__file__).resolve().parents[1]
    mode = "timeline" if args.timeline else "split" if args.split else "calc"
    with tempfile.TemporaryDirectory(prefix="calculet-bench-home-") as tmp:
        home = Path(tmp)
        intervals = [ms.strip() for ms in args.switch_ms.split(",") if ms.strip()]
        servers = ([start(f"this@{ms}", here, mode, home, ms) for ms in intervals] if intervals
                   else [start("this", here, mode, home)])
        if not args.timeline:
            servers.append(start("bare", here, "bare", home))
        servers += [start(tree.resolve().name, tree, mode, home) for tree in args.against]
        try:
            if args.timeline:
                report_timeline(measure_timeline(servers, args.rounds, args.tokens), args.tokens)
                return 0
            got = measure(servers, [int(n) for n in args.streams.split(",")], args.rounds, args.tokens)
        finally:
            for _, server, _ in servers:
                server.stop()
    report(got, args.tokens)
    return 0


if __name__ == "__main__":
    sys.exit(main())
