"""The engine core's CPU per streamed token on the null device, on one thread (issue #20: the actor's work alone).

``bench/actor_path.py`` runs the threaded engine with asyncio consumers; on this shared 2-core machine its figures
move ±15 % round to round, mostly from the threads' contention, more than a change of a few per cent. This drives
:meth:`EngineCore.turn` itself on the calling thread — the same bring-up (``calculet.run --sim-cost null``: bundled
package, §15 default config, monitors at their production default), the same turn and chaining (1 ms), no mailbox,
no snapshot publication, no consumer — and reports the thread's CPU (``time.thread_time``) and Python calls per
streamed token. With ``--against TREE`` it runs a second copy of itself on the tree ``TREE`` (a worktree of the
base commit) and alternates blocks between the two, reporting per-block ratios: the before/after figure of a change
to the actor path, measured in the same run (DESIGN principle 10); given twice or more, every tree runs in the same
rounds and each gets its ratio. Figures, not a pass/fail test.

``--parts core,service,stepped,threaded,loaded`` (:data:`PARTS`) runs the same core as the service runs it, part by
part, each in its own process and all in the same alternated blocks: each part's own cost is the per-block
difference from the part before it (``threaded`` and ``loaded`` read the engine thread's own CPU clock and count no
calls). What it measured (session 18 at 5fa611d, load average 3-8, 4-12 blocks a run, four runs; µs of CPU per token at
1 / 16 / 64 streams, calls per token in brackets): the core alone 76-111 / 85-116 / 84-96 (239 / 244-249 / 263-265);
the service's sinks and request observer +2-9 (+13 / +8 / +13; +8 / +4 / +6 once the observer no longer takes a
decode step's moves, 01b8bcc); the actor's publications after turns and submits +3-12 at 1-16 streams (+8-10); the
started engine with a consumer loop on a second thread +5-15; that loop busy with ~30 µs of Python work a token +0-6
more. Each part moves ±10 µs from run to run. The server's engine thread the same hour (``bench/host_threads.py``, the
base tree): 96 / 104 / 122, the core plus these parts. So the engine thread's CPU is the core's, and the service adds
~10-25 µs a token around it, in no single large piece. Per request (1 stream, requests of 8 against 64 tokens): about
490 µs of actor CPU on one thread (``stepped``), 880 on the started engine (its mailbox and the loop's wake-ups:
``call_soon_threadsafe`` writes).

``--stages`` reads the core alone piece by piece (:data:`STAGES`, :func:`stages`). What it read (session 21 at
45eef29, load average ~1, µs of CPU per token at 16 streams, 64.3 unwrapped; 1 and 64 streams within ±15 %): the
scheduler's step 12.9 (its batch built 5.8, on_time's tick 2.1, the job's record 1.0, its own 4.1); the submit 17.9
(the executor's DecodeJob and InflightJob 3.1, the null device 6.0 of which its plan's step 4.3, the scheduler's
``submitted`` 6.7: the job's, the KV lanes' and the requests' ``submit``); the poll 0.9; the result 32.6 (the
executor's checks 2.7, the desk's work 1.8, the dispatcher's completion 2.9, the scheduler's decode completion 21.8:
the lanes' checks 1.1, the KV commit 2.2, the step timer 1.9, the requests' ``decode_done`` with the sinks 8.6 of
which the sinks 3.7, the ready queue 1.1, the job's ``complete`` and the rest 5.7). No piece above 9 % of the token:
B1 (CalRT 0.7.6's only batch) makes every step one token, so a step that repeats the last one saves nothing past one
stream, and halving the token means removing pieces, not one of them.

The submit side's floor (session 25, #20; 16 streams, load average 2-3): after the null device's Submit became one
frame and the jobs table's submit took the batch's lanes, ``job_path.submit`` read 13.9-15.3 µs/token (this morning's
base, quiet: 15.2-15.3; 14.4-15.4 again at load 0.1-0.5) and ``--against`` the base 0.976 / 0.950 / 0.952 at
1 / 16 / 64 streams (12 blocks, load 0.5; 8-block runs 0.88-1.04: within the noise), ~5 calls/token fewer. A
scratch fusion of every frame of a B1 submit into one function (the same checks, draws, records and counts; not
kept, it would be a second copy of each rule) saved another 1.6-2.3 µs of ~62 (four alternated rounds, twice). So
with today's records the submit side cannot go much under ~11 µs by removing layers: the rest is the per-job
records (the DecodeJob, the device's ticket and result with its lane and counters, the InflightJob: ~2.5 µs by
``timeit``) and the checks, counts and monitor draws each piece owes.

    python bench/actor_core.py [--streams 1,16,64] [--blocks 12] [--against /tmp/base_worktree [--against ...]]
                               [--parts core,service,stepped,threaded] [--stages]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence

PROMPT = "Calculet NPU benchmark prompt"

PARTS = ("core", "service", "stepped", "threaded", "loaded")
"""What runs around the core, each part adding to the one before (``--parts``): ``core`` the core alone, plain
``StreamWriter`` sinks; ``service`` + the service's own sinks (``Service.open_stream``'s ``TimedStream``) and request
observer (its phases; tracing as configured, off); ``stepped`` + the actor's publication after every submit and turn as the actor
publishes (``ThreadedEngine._stepped``; ``_turned`` where the tree has it: deferred between chained turns no reader
asked about, and none reads here), the 1 ms switch interval; ``threaded`` the started engine: its own actor thread
(mailbox, wake-up holding), submits posted by an asyncio loop on a second thread that consumes the streams (no HTTP);
``loaded`` + that loop doing Python work per token (:data:`LOOP_WORK` JSON chunks, about what the server's loop spends
on a token: framing, sending), so the engine runs beside a busy neighbour as in the server. The difference from
``loaded`` to the server's engine thread (``bench/host_threads.py``) is the rest of the HTTP work beside it."""

LOOP_WORK = 8
"""JSON chunks the ``loaded`` part's loop encodes per token (each ~4 µs here: ~30-35 µs of loop CPU per token, the
server's loop spends 29-35)."""


def _chunk(text: str) -> str:
    import json

    return json.dumps({"id": "cmpl-0123456789abcdef", "object": "text_completion", "created": 1700000000,
                       "model": "tiny-random", "choices": [{"index": 0, "text": text, "finish_reason": None,
                                                            "logprobs": None}]}, separators=(",", ":"))


class Core:
    """A brought-up engine core on the null device, never started: its turns run on the caller's thread."""

    def __init__(self, part: str = "core") -> None:
        from calculet.adapters.sim import CostModel, SimConfig, TimeMode
        from calculet.config import default_config
        from calculet.runtime.engine.types import EngineOptions
        from calculet.server.bringup import bring_up

        cost = CostModel.null()
        self.brought = bring_up(default_config(), sim=SimConfig(time_mode=TimeMode.REAL, cost=cost),
                                options=EngineOptions(verify_golden=cost.numerics))
        self.core = self.brought.engine._core  # noqa: SLF001 - driven here, on this thread
        # the monitors as the started engine sets them (ThreadedEngine.start): the production default, sampled
        from calculet.machines.monitor import MONITOR
        monitoring = self.core.config.monitoring
        MONITOR.configure(enabled=monitoring.invariants, mode=self.core.options.monitor_mode or "count",
                          sample_every=monitoring.sample_every)
        self.core.chain_ready_s = self.core.options.wake_coalesce_s  # as ThreadedEngine sets it
        self.tokenizer = self.brought.engine.tokenizer
        self.prompt = tuple(self.tokenizer.encode(PROMPT))
        self.calls = 0
        turn = getattr(self.core, "turn", None)
        if turn is None:  # a tree before EngineCore.turn (the base of #20's session 11): its actor's turn function
            from calculet.runtime.engine.threaded import _turn  # type: ignore[attr-defined]

            core = self.core
            turn = lambda: _turn(core)  # noqa: E731
        self.turn = turn
        self.part = part
        self.service = None
        if part != "core":  # the service's own sinks and request observer, as ``calculet.run`` builds them
            from calculet.server.service import Service

            self.service = Service(self.brought.config, self.brought.engine)
        if part in ("stepped", "threaded", "loaded"):
            sys.setswitchinterval(0.001)  # as calculet.run (SWITCH_INTERVAL_MS)
        if part in ("threaded", "loaded"):
            self.service.start()  # type: ignore[union-attr]

    def _writer(self, streams: int) -> list:
        """``streams`` sinks: plain StreamWriters (core), else the service's TimedStreams (``Service.open_stream``)."""
        from calculet.runtime.streams.writer import StreamWriter

        if self.service is None:
            return [StreamWriter(tokenizer=self.tokenizer) for _ in range(streams)]
        return [self.service.open_stream(tenant="default", stop=()) for _ in range(streams)]

    def _hook(self, _frame: object, event: str, _arg: object) -> None:
        if event == "call" or event == "c_call":
            self.calls += 1

    def block(self, streams: int, tokens: int, count_calls: bool = False) -> tuple[float, int, int]:
        """``streams`` requests of ``tokens`` tokens run to the end: (thread CPU seconds, tokens, Python calls)."""
        from calculet.runtime.engine.types import GenerateRequest
        from calculet.runtime.execution.sampler import SamplingParams

        core, turn = self.core, self.turn
        writers = self._writer(streams)
        requests = [GenerateRequest(self.prompt, tokens, sampling=SamplingParams(ignore_eos=True)) for _ in writers]
        if self.part in ("threaded", "loaded"):
            return self._threaded(requests, writers)
        self.calls = 0
        if self.part == "stepped":  # the actor's loop body: submits and turns each followed by a publication
            engine = self.brought.engine
            stepped = engine._stepped  # noqa: SLF001
            for request, writer in zip(requests, writers):
                stepped(lambda r=request, w=writer: core.submit(r, w))  # type: ignore[misc]
            turned = getattr(engine, "_turned", None)  # the actor's turn with its publication (a base tree: none)
            turn = ((lambda: turned(self.turn)[0]) if turned is not None  # noqa: E731
                    else (lambda: stepped(self.turn)))
        else:
            for request, writer in zip(requests, writers):
                core.submit(request, writer)
        if count_calls:
            sys.setprofile(self._hook)
        started = time.thread_time()
        while not core.idle():
            turn()
        took = time.thread_time() - started
        sys.setprofile(None)
        return took, sum(len(w.result(0).raw_tokens) for w in writers), self.calls

    def _threaded(self, requests: list, writers: list) -> tuple[float, int, int]:
        """The started engine: submits posted (``submit_then``) and streams consumed by an asyncio loop on this
        thread, as the service's routes do; the engine thread's CPU (its own clock) over the block."""
        import asyncio

        engine = self.brought.engine
        loaded = self.part == "loaded"
        clock = time.pthread_getcpuclockid(engine._actor.ident)  # noqa: SLF001

        async def run() -> None:
            loop = asyncio.get_running_loop()

            async def one(request: object, writer: object) -> None:
                answered = loop.create_future()
                engine.submit_then(request, writer,  # type: ignore[arg-type]
                                   lambda s, e: loop.call_soon_threadsafe(answered.set_result, s))
                await answered
                async for batch in writer.abatches():  # type: ignore[attr-defined]
                    if loaded:  # the loop's own work per token beside the engine (``loaded``): a chunk's JSON
                        frames = [_chunk(event.text) for event in batch for _ in range(LOOP_WORK)]
                        del frames

            await asyncio.gather(*(one(r, w) for r, w in zip(requests, writers)))

        started = time.clock_gettime(clock)
        asyncio.run(run())
        took = time.clock_gettime(clock) - started
        return took, sum(len(w.result(0).raw_tokens) for w in writers), 0


STAGES: tuple[tuple[str, str, str], ...] = (
    ("scheduler.step", "scheduler", "step"),
    ("decode.build_decode_batch", "scheduler.decode", "build_decode_batch"),
    ("on_time.tick", "scheduler.on_time", "tick"),
    ("jobs.plan", "scheduler.jobs", "plan"),
    ("job_path.submit", "jobs", "submit"),
    ("executor.submit", "executor", "submit"),
    ("device.submit", "executor.session.device", "submit"),
    ("scheduler.submitted", "scheduler", "submitted"),
    ("step_done.decode_step_submitted", "calculet.runtime.scheduling.scheduler:", "decode_step_submitted"),
    ("composite.decode_submit", "calculet.runtime.scheduling.step_done:SUBMIT", "fire_sampled"),
    ("jobs.submit", "scheduler.jobs", "submit"),
    ("jobs.fire", "scheduler.jobs", "fire"),
    ("kv.submit_batch", "scheduler.kv", "submit_batch"),
    ("registry.tell", "scheduler.registry", "tell"),
    ("registry.fire_all", "scheduler.registry", "fire_all"),
    ("executor.collect", "executor", "collect"),
    ("job_path.apply", "jobs", "apply"),
    ("executor.complete", "executor", "complete"),
    ("desk.on_job_done", "jobs._desk", "on_job_done"),
    ("dispatcher.decode", "jobs.dispatcher", "decode"),
    ("scheduler.on_decode_complete", "scheduler", "on_decode_complete"),
    ("clean_decode_lanes", "calculet.runtime.scheduling.apply:", "clean_decode_lanes"),
    ("step_done.decode_step_done", "calculet.runtime.scheduling.apply:", "decode_step_done"),
    ("composite.decode_step", "calculet.runtime.scheduling.step_done:COMPOSITE", "fire_sampled"),
    ("kv.checked", "scheduler.kv", "_checked"),
    ("kv.commit_batch", "scheduler.kv", "commit_batch"),
    ("applier.observe_step", "scheduler.completions", "observe_step"),
    ("step_times.observe", "scheduler.step_times", "observe"),
    ("registry.decode_done_each", "scheduler.registry", "decode_done_each"),
    ("registry.decode_told", "scheduler.registry", "decode_told"),
    ("request_sink.token", "calculet.runtime.engine.requests:_Sink", "token"),
    ("stream_writer.token", "calculet.runtime.streams.writer:StreamWriter", "token"),
    ("applier.after_decode", "scheduler.completions", "after_decode"),
    ("decode.add_back", "scheduler.decode", "add_back"),
)
"""The pieces ``--stages`` times, in the order a decode step runs them: (name, owner, method). The owner is a
dotted path from the engine core, ``module:Class`` for a sink's class (every instance of it is timed), or
``module:`` for a module's function as that module calls it (a function another module imported by name is timed
under its caller's name: ``decode_step_done`` as ``apply`` calls it, ``decode_step_submitted`` as ``scheduler``).
A B1 decode step (CalRT 0.7.6's only batch) goes through the composites of
:mod:`calculet.runtime.scheduling.step_done` (session 26, #20): on the submit side ``decode_step_submitted`` (the
job's and the request's ``submit`` as one composite, the lane's step opened, ``kv.checked``, ``registry.tell``), on
the completion side ``decode_step_done`` (the composite, ``observe_step``, ``kv.checked``, ``decode_told`` with the
sinks, ``after_decode``); ``composite.*`` are the generated composites themselves. ``jobs.submit``, ``jobs.fire``,
``registry.fire_all``, ``kv.submit_batch``, ``kv.commit_batch`` and ``registry.decode_done_each`` are the layered
path a B1 step no longer takes: kept because a prefill, a wider batch or a step a composite declines (module doc of
``step_done``) still goes through them; a piece no call reached is not printed."""


def stages(streams_list: Sequence[int], tokens: int, blocks: int) -> int:
    """``--stages``: where the core's CPU per token goes, piece by piece (:data:`STAGES`), on this tree only.

    Each piece's method is wrapped to read a clock around it; its inclusive time has the wrappers'
    own cost taken out (an empty function's reading, and each wrapped piece nested inside it), and its own time is
    the inclusive less the wrapped pieces it called. Why not cProfile: it charges ~0.5 us to every call, which
    inflates a piece in proportion to its calls, not its CPU (a third of the figures it gave were that charge). The
    unwrapped figure of the same blocks is printed first: the wrapped run is slower by the wrappers' cost, the
    pieces are corrected for it, and what the calibration (a tight loop, warm caches) missed is shared out: every
    piece is scaled so that the outermost ones add up to the unwrapped figure. The pieces read the monotonic clock (the thread's CPU clock is a system call, as
    dear as a small piece), so a block the machine preempted counts its wait: read the median of a few runs. A
    reading, not a test; it moves ±10 % with the machine's load like the others."""
    import importlib

    core = Core("core")
    core.block(16, tokens)  # warm-up
    tick = time.perf_counter_ns  # the thread's CPU clock is a system call here (~0.4 us a reading), this is not
    inclusive: dict[str, int] = {}
    own: dict[str, int] = {}
    count: dict[str, int] = {}
    stack: list[list[int]] = []  # per active wrapped call: [children's corrected time, wrappers nested inside]
    overhead = [0.0, 0.0]  # an empty call's reading; the full cost of one wrapper to the call around it
    top = [0.0]

    def wrapped(label: str, fn: object, bound: bool) -> object:
        def timed(*args: object, **kwargs: object) -> object:
            frame = [0, 0]
            stack.append(frame)
            started = tick()
            try:
                return fn(*args, **kwargs)  # type: ignore[operator]
            finally:
                took = tick() - started
                stack.pop()
                corrected = took - overhead[0] - frame[1] * overhead[1]
                if label:
                    inclusive[label] = inclusive.get(label, 0) + corrected
                    own[label] = own.get(label, 0) + corrected - frame[0]
                    count[label] = count.get(label, 0) + 1
                if stack:
                    stack[-1][0] += corrected
                    stack[-1][1] += frame[1] + 1
                elif label:
                    top[0] += corrected  # a piece no other piece called: the pieces' cover of the token

        def method(self: object, *args: object, **kwargs: object) -> object:
            return timed(self, *args, **kwargs)

        return method if bound else timed

    def nop() -> None:
        return None

    # the calibration: what an empty wrapped call reads of itself, and what a wrapper costs the call around it
    probe = wrapped("", nop, False)
    reps = 200_000
    reads, costs = [], []
    for _ in range(5):
        stack.append([0, 0])
        for _ in range(reps):
            probe()  # type: ignore[operator]
        reads.append(stack.pop()[0] / reps)
        started = tick()
        for _ in range(reps):
            nop()
        plain = tick() - started
        stack.append([0, 0])
        started = tick()
        for _ in range(reps):
            probe()  # type: ignore[operator]
        costs.append((tick() - started - plain) / reps)
        stack.pop()
    overhead[:] = [min(reads), min(costs)]

    def unwrapped(streams: int) -> float:
        runs = [core.block(streams, tokens) for _ in range(blocks)]
        return statistics.median(t / n for t, n, _ in runs) * 1e6

    base = {streams: unwrapped(streams) for streams in streams_list}
    for label, owner, name in STAGES:
        if ":" in owner:
            module, _, cls_name = owner.partition(":")
            target: object = importlib.import_module(module)
            target = getattr(target, cls_name) if cls_name else target
        else:
            target = core.core
            for part in owner.split("."):
                target = getattr(target, part, None)
        if target is None:
            continue  # a piece this configuration does not have (no on_time policy, no null device)
        if isinstance(target, type) or "__slots__" in type(target).__dict__:
            cls = target if isinstance(target, type) else type(target)
            setattr(cls, name, wrapped(label, cls.__dict__[name], True))
        else:
            setattr(target, name, wrapped(label, getattr(target, name), False))
    print(f"where the core's CPU per token goes (this tree; {tokens}-token streams, {blocks} blocks; an empty wrapped "
          f"call reads {overhead[0]:.0f} ns and costs its caller {overhead[1]:.0f} ns, both taken out)")
    for streams in streams_list:
        inclusive.clear(); own.clear(); count.clear()  # noqa: E702
        top[0] = 0.0
        n = sum(core.block(streams, tokens)[1] for _ in range(blocks))
        cover = top[0] / n / 1e3
        scale = base[streams] / cover if cover > 0 else 1.0  # the wrappers' cost the calibration missed, shared out
        print(f"{streams:>3} streams: {base[streams]:.1f} us/tok unwrapped; the outermost pieces read {cover:.1f}, "
              f"so every piece below is scaled by {scale:.2f} (the turn's loop around them is in neither)")
        for label, _, _ in STAGES:
            if label in count:
                print(f"      {label:30s} {inclusive[label] / n / 1e3 * scale:6.1f} us/tok inclusive, "
                      f"{own[label] / n / 1e3 * scale:6.1f} own  ({count[label] / n:.2f} calls/tok)")
    return 0


def serve(part: str) -> int:
    """``--serve``: answer ``STREAMS TOKENS REPS [c]`` lines with ``us_per_token calls_per_token`` (for --against)."""
    core = Core(part)
    core.block(4, 64)  # warm-up
    print("ready", flush=True)
    for line in sys.stdin:
        streams, tokens, reps, *calls = line.split()
        cpu = n = counted = 0
        for _ in range(int(reps)):
            took, got, c = core.block(int(streams), int(tokens), bool(calls))
            cpu, n, counted = cpu + took, n + got, counted + c
        print(f"{cpu / n * 1e6:.3f} {counted / n:.2f}", flush=True)
    return 0


def _spawn(tree: str, part: str = "core") -> subprocess.Popen[str]:
    env = dict(os.environ, PYTHONPATH=tree)
    # this script, importing calculet from ``tree`` (a base worktree need not have the script)
    errors = tempfile.TemporaryFile("w+")  # the child's stderr, shown if it dies before it is ready
    proc = subprocess.Popen([sys.executable, os.path.abspath(__file__), "--serve", "--parts", part], cwd=tree,
                            env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=errors, text=True)
    assert proc.stdout is not None
    while (line := proc.stdout.readline()).strip() != "ready":
        if not line:  # EOF: the child exited (an import error in ``tree``, a crash) and will never say ready
            proc.wait()
            errors.seek(0)
            raise SystemExit(f"actor_core: the core from {tree} exited ({proc.returncode}) before it was ready:\n"
                             + errors.read()[-4000:])
    return proc


def _ask(proc: subprocess.Popen[str], streams: int, tokens: int, reps: int, calls: bool) -> tuple[float, float]:
    assert proc.stdin is not None and proc.stdout is not None
    proc.stdin.write(f"{streams} {tokens} {reps}{' c' if calls else ''}\n")
    proc.stdin.flush()
    us, per = proc.stdout.readline().split()
    return float(us), float(per)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--streams", default="1,16,64")
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument("--blocks", type=int, default=12, help="alternated blocks per level and tree")
    parser.add_argument("--against", action="append", default=[],
                        help="a worktree of a base commit, run beside this tree (repeatable)")
    parser.add_argument("--parts", default="core", help=f"comma-separated, of {', '.join(PARTS)} (see PARTS)")
    parser.add_argument("--stages", action="store_true",
                        help="this tree only: CPU per token piece by piece (see STAGES), not the alternated blocks")
    parser.add_argument("--serve", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    parts = args.parts.split(",")
    if unknown := [p for p in parts if p not in PARTS]:
        parser.error(f"unknown parts {unknown}: the parts are {', '.join(PARTS)}")
    if args.serve:
        return serve(parts[0])
    if args.stages:
        return stages([int(x) for x in args.streams.split(",")], args.tokens, max(1, args.blocks))
    here = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    bases = {("base" if k == 0 else f"base{k + 1}"): tree for k, tree in enumerate(args.against)}
    for name, tree in bases.items():
        print(f"{name}: {tree}")
    # one process per tree and part; ``this`` alone when one part is run (the figures' names of earlier sessions)
    procs: dict[str, subprocess.Popen[str]] = {}
    for part in parts:
        suffix = "" if len(parts) == 1 else f"/{part}"
        procs[f"this{suffix}"] = _spawn(here, part)
        procs.update({f"{name}{suffix}": _spawn(tree, part) for name, tree in bases.items()})
    print(f"engine CPU per streamed token on the null device, parts {', '.join(parts)}; {args.tokens}-token streams, "
          f"{args.blocks} alternated blocks (median, min; ratio: median of per-block this/base)")
    for streams in (int(s) for s in args.streams.split(",")):
        reps = max(1, 16 // streams)
        calls = {name: _ask(proc, streams, args.tokens, 1, True)[1] for name, proc in procs.items()}
        cpu: dict[str, list[float]] = {name: [] for name in procs}
        for block in range(args.blocks):
            for name in (list(procs) if block % 2 == 0 else list(reversed(procs))):
                cpu[name].append(_ask(procs[name], streams, args.tokens, reps, False)[0])
        line = " | ".join(f"{name} {statistics.median(v):.1f} us/tok (min {min(v):.1f}), {calls[name]:.1f} calls/tok"
                          for name, v in cpu.items())
        for name in procs:
            tree, _, part = name.partition("/")
            if tree != "this":
                ratios = [a / b for a, b in zip(cpu["this" + name[len(tree):]], cpu[name])]
                line += f" | ratio to {name} {statistics.median(ratios):.3f}"
        print(f"{streams:>3} streams: {line}", flush=True)
        if len(parts) > 1:  # each part's own share: the per-block difference from the part before it
            for tree in ["this", *bases]:
                steps = [f"{p} +{statistics.median(a - b for a, b in zip(cpu[f'{tree}/{p}'], cpu[f'{tree}/{q}'])):.1f}"
                         for q, p in zip(parts, parts[1:])]
                print(f"      {tree}: {parts[0]} {statistics.median(cpu[f'{tree}/{parts[0]}']):.1f}, "
                      + ", ".join(steps) + " us/tok", flush=True)
    for proc in procs.values():
        assert proc.stdin is not None
        proc.stdin.close()
        proc.wait()
    return 0


if __name__ == "__main__":
    sys.exit(main())
