"""§17.3: 1000 requests on real threads with random cancel, deadline and shutdown.

Producer threads play HTTP handlers: they post ``submit`` to the actor and wait for the
admission outcome, and post random cancels. A device thread plays CalRT: it takes the jobs
the actor submits, holds them and completes them in random order — errors, CCU faults,
timeouts with late completions, duplicate (stale) completions and crossed lanes included —
and confirms KV frees late. The actor thread owns the scheduler; it alone calls it, advances
the fake clock (virtual time, no sleeps) and runs recovery.

At the end: every request closed exactly once (no double completion, no promise set twice),
every delivered token belongs to its own request at its own position (completions matched to
request/generation/job), no lease freed twice, and nothing left in any queue, table or pool.
Seeds are fixed; a failure names its seed.
"""

from __future__ import annotations

import queue
import random
import threading
from dataclasses import dataclass, field
from typing import Any

import pytest

from calculet.errors import NotFound
from calculet.runtime.actor import Mailbox
from calculet.runtime.scheduling.admission import ModelAvailability
from calculet.clock import FakeClock
from calculet.runtime.scheduling.completion import DecodeCompletion, FaultKind, LaneOutcome, PrefillCompletion
from calculet.runtime.scheduling.decode import DecodeBatch
from calculet.runtime.scheduling.kv import FreeSequence, KvLaneManager
from calculet.runtime.scheduling.prefill import PrefillWork
from calculet.runtime.request import InferenceRequest, RequestOutcome
from calculet.runtime.scheduling.plan import SchedulingCapabilities
from calculet.runtime.scheduling.scheduler import Scheduler
from tests.unit.runtime.runtime_support import make_config, profile_set

REQUESTS = 1000
PRODUCERS = 4
STREAMS = 9          # concurrent streams per producer, like an HTTP client's connection pool
TENANTS = [{"name": "gold", "weight": 3.0, "api_key_sha256": "a" * 64},
           {"name": "silver", "weight": 2.0, "api_key_sha256": "b" * 64, "max_active_sequences": 8},
           {"name": "bronze", "weight": 1.0, "qps": 2000.0}]


def model_token(request_id: int, position: int) -> int:
    return (request_id * 7919 + position * 31) % 30000 + 1


class CheckingSink:
    """Counts closes and checks each token against (its own request, its position)."""

    def __init__(self, prompt: int) -> None:
        self.prompt = prompt
        self.request_id = 0
        self.tokens: list[int] = []
        self.outcomes: list[RequestOutcome] = []
        self.errors: list[str] = []
        self.closed = threading.Event()

    def token(self, request_id: int, token: int) -> None:
        if self.outcomes:
            self.errors.append("token after close")
        if self.request_id and request_id != self.request_id:
            self.errors.append(f"token of request {request_id} delivered to {self.request_id}")
        expected = model_token(request_id, self.prompt + len(self.tokens))
        if token != expected:
            self.errors.append(f"token {token} at step {len(self.tokens)} != {expected}")
        self.tokens.append(token)

    def close(self, outcome: RequestOutcome) -> None:
        self.outcomes.append(outcome)
        self.closed.set()


@dataclass
class Device:
    """The simulated runtime: completes jobs out of order, with faults, on its own thread."""

    mailbox: Mailbox
    scheduler: Scheduler
    rng: random.Random
    inbox: queue.SimpleQueue[Any] = field(default_factory=queue.SimpleQueue)
    held: list[tuple[str, Any]] = field(default_factory=list)
    freed: set[tuple[int, int]] = field(default_factory=set)
    errors: list[str] = field(default_factory=list)
    outstanding: int = 0
    lock: threading.Lock = field(default_factory=threading.Lock)
    stop: threading.Event = field(default_factory=threading.Event)

    def put(self, item: Any) -> None:
        with self.lock:
            self.outstanding += 1
        self.inbox.put(item)

    def busy(self) -> bool:
        with self.lock:
            return self.outstanding > 0

    def run(self) -> None:
        while not self.stop.is_set():
            try:
                item = self.inbox.get(timeout=0.0005)
            except queue.Empty:
                item = None
            if item is not None:
                self.held.append(("free" if isinstance(item, FreeSequence) else "job", item))
            if self.held and (item is None or len(self.held) >= 3 or self.rng.random() < 0.3):
                kind, thing = self.held.pop(self.rng.randrange(len(self.held)))
                self._deliver(kind, thing)

    def _done(self) -> None:
        with self.lock:
            self.outstanding -= 1

    def _deliver(self, kind: str, thing: Any) -> None:
        s, rng = self.scheduler, self.rng
        if kind == "free":
            key = (thing.lane, thing.seq_id)
            if key in self.freed:
                self.errors.append(f"sequence {key} freed twice")
            self.freed.add(key)
            self.mailbox.post(lambda: s.confirm_release(thing.lane, thing.seq_id))
            self._done()
            return
        if kind == "late":
            self.mailbox.post(lambda: self._apply(thing, ok=True))
            self._done()
            return
        if kind == "dup":
            self.mailbox.post(lambda: self._apply(thing, ok=True))
            return
        roll = rng.random()
        if roll < 0.03:                                   # Wait timed out; maybe a late completion
            self.mailbox.post(lambda: s.job_timed_out(thing.job_id))
            if rng.random() < 0.6:
                self.held.append(("late", thing))
                return
        elif roll < 0.06:
            self.mailbox.post(lambda: self._apply(thing, ok=False, fault=FaultKind.ERROR))
        elif roll < 0.08:
            self.mailbox.post(lambda: self._apply(thing, ok=False, fault=FaultKind.CCU_FAULT))
        elif roll < 0.14 and isinstance(thing, DecodeBatch) and len(thing.active) >= 2:
            self.mailbox.post(lambda: self._apply(thing, ok=True, cross=True))
        else:
            self.mailbox.post(lambda: self._apply(thing, ok=True))
            if rng.random() < 0.05:
                self.mailbox.post(lambda: self._apply(thing, ok=True))  # duplicate: stale
        self._done()

    def _apply(self, work: Any, *, ok: bool, fault: FaultKind = FaultKind.NONE, cross: bool = False) -> Any:
        s = self.scheduler
        if isinstance(work, PrefillWork):
            position = work.start_position + work.tokens
            return s.on_prefill_complete(PrefillCompletion(
                work.job_id, work.generation, work.request_id, work.seq_id, ok,
                model_token(work.request_id, position) if ok else None, False, fault))
        lanes = [LaneOutcome(b.lane, b.request_id, b.seq_id, b.generation, ok,
                             model_token(b.request_id, b.position + 1) if ok else None,
                             ok and (b.request_id + b.position) % 23 == 0) for b in work.active]
        if cross:  # lanes 0 and 1 come back with each other's tags
            a, b = lanes[0], lanes[1]
            lanes[0] = LaneOutcome(a.lane, b.request_id, b.seq_id, a.generation, a.ok, a.token, a.stop)
            lanes[1] = LaneOutcome(b.lane, a.request_id, a.seq_id, b.generation, b.ok, b.token, b.stop)
        return s.on_decode_complete(DecodeCompletion(work.job_id, work.generation, ok, tuple(lanes), fault))


def build(seed: int, chunk: int | None) -> tuple[Scheduler, FakeClock]:
    config = make_config(
        tenants=TENANTS, executor={"max_inflight": 2},
        admission={"max_sequences": 24, "max_waiting_requests": 256,
                   "long_prefill_quota": {"max_admitted": 2, "max_waiting": 6}},
        batch={"profiles": [1, 4, 8], "batching_window_us": 1000})
    clock = FakeClock()
    kv = KvLaneManager(24, 8192, clock=clock)
    scheduler = Scheduler(config, clock=clock, kv=kv, device_kv_tokens=120_000, max_seq=8192,
                          capabilities=SchedulingCapabilities(incremental_prefill=chunk is not None,
                                                              vocab_size=30_001))
    scheduler.set_model(1, ModelAvailability.READY, profile_set((1, 4, 8), config, chunk=chunk))
    return scheduler, clock


def run(seed: int, chunk: int | None) -> None:
    master = random.Random(seed)
    scheduler, clock = build(seed, chunk)
    mailbox = Mailbox()
    device = Device(mailbox, scheduler, random.Random(master.random()))
    sinks: list[CheckingSink] = []
    sinks_lock = threading.Lock()
    submitted = [0]
    shutdown_at = master.randint(REQUESTS * 6 // 10, REQUESTS * 9 // 10)
    shutdown_due = threading.Event()
    producers_done = threading.Event()
    problems: list[str] = []

    def producer(index: int, rng: random.Random) -> None:
        mine: list[int] = []
        open_streams: list[CheckingSink] = []
        for _ in range(REQUESTS // PRODUCERS):
            while len(open_streams) >= STREAMS:  # wait (on the stream, not a sleep) for one to end
                oldest = open_streams.pop(0)
                if not oldest.closed.wait(timeout=30):
                    problems.append(f"request {oldest.request_id} never closed")
                    return
            prompt = rng.choice((rng.randint(1, 64), rng.randint(1, 64), rng.randint(65, 700),
                                 rng.randint(65, 700), rng.randint(4097, 6000)))
            request = InferenceRequest(prompt, rng.randint(1, 12), rng.choice(["gold", "silver", "bronze"]),
                                       rng.choice((None, None, rng.randint(5, 400))))
            sink = CheckingSink(prompt)
            sub = mailbox.call(lambda: scheduler.submit(request, sink), timeout=30)
            sink.request_id = sub.request_id
            open_streams.append(sink)
            with sinks_lock:
                sinks.append(sink)
                submitted[0] += 1
                if submitted[0] >= shutdown_at:
                    shutdown_due.set()
            if sub.request_id:
                mine.append(sub.request_id)
            if mine and rng.random() < 0.08:
                victim = rng.choice(mine[-STREAMS:])
                mailbox.post(lambda: cancel(victim))

    def cancel(request_id: int) -> None:
        try:
            scheduler.cancel(request_id)
        except NotFound:   # ended long ago and no longer retained: fine
            pass

    def actor(rng: random.Random) -> None:
        shut = False
        loops = 0
        while True:
            loops += 1
            mailbox.run_until(0.0005)
            if shutdown_due.is_set() and not shut:
                scheduler.shutdown()
                shut = True
            while True:
                plan = scheduler.step()
                if plan.work is None:
                    break
                scheduler.submitted(plan.work.job_id)
                device.put(plan.work)
            for command in scheduler.take_commands():
                device.put(command)
            clock.advance(rng.choice((0.0, 0.0005, 0.001, 0.002)))
            if loops % 40 == 0:
                scheduler.recover_lanes()
            stuck = [j for j in scheduler.jobs if j.state in ("timed_out", "quarantined")]
            if stuck and (loops % 150 == 0 or (shut and len(scheduler.registry) == 0)):
                scheduler.device_reset()
            if shut and len(scheduler.registry) == 0 and scheduler.kv.statistics().unknown:
                scheduler.recover_lanes()
            if (shut and producers_done.is_set() and not device.busy() and mailbox.statistics().pending == 0
                    and scheduler.idle()):
                return
            if loops > 400_000:
                problems.append("actor did not converge")
                return

    threads = [threading.Thread(target=producer, args=(i, random.Random(master.random())), daemon=True)
               for i in range(PRODUCERS)]
    owner = threading.Thread(target=actor, args=(random.Random(master.random()),), daemon=True)
    completer = threading.Thread(target=device.run, daemon=True)
    completer.start()
    owner.start()
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    producers_done.set()
    owner.join(timeout=60)
    device.stop.set()
    completer.join(timeout=10)
    assert not owner.is_alive(), f"seed {seed}: actor still running"
    assert not problems, f"seed {seed}: {problems}"

    stats = scheduler.statistics()
    assert len(sinks) == REQUESTS
    assert mailbox.statistics().failed == 0, f"seed {seed}: a message raised"
    for sink in sinks:
        assert len(sink.outcomes) == 1, f"seed {seed}: request {sink.request_id} closed {len(sink.outcomes)} times"
        assert not sink.errors, f"seed {seed}: request {sink.request_id}: {sink.errors}"
        outcome = sink.outcomes[0]
        if outcome.state == "completed":
            assert outcome.generated_tokens == len(sink.tokens), f"seed {seed}: {outcome}"
    assert not device.errors, f"seed {seed}: {device.errors}"
    assert scheduler.idle(), f"seed {seed}: left over {stats}"
    assert stats.kv.refused_double_releases == 0 and stats.kv.releases == stats.kv.confirmed_releases
    assert stats.registry.closes == REQUESTS - sum(1 for s in sinks if s.request_id == 0)
    states = {o.state for s in sinks for o in s.outcomes}
    assert {"completed", "cancelled", "failed"} <= states, f"seed {seed}: only {states}"
    assert stats.anomalies > 0 and stats.stale_completions > 0, f"seed {seed}: faults were not exercised"


@pytest.mark.req("R17.3.1", "R17.3.2", "R17.3.3", "R17.3.4", "R17.3.5", "R17.3.6", "R4.2", "R4.3", "R4.6",
                 "R4.7", "R4.9")
@pytest.mark.parametrize("seed,chunk", [(20260802, None), (7, 256)])
def test_thousand_requests_on_real_threads(seed, chunk):
    try:
        run(seed, chunk)
    except BaseException:
        print(f"concurrency test failed with seed {seed}")
        raise
