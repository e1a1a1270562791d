"""The threaded engine (§3; DESIGN principle 2): the engine as the HTTP service uses it.

``start()`` spawns the actor thread (the tick loop over :class:`~calculet.runtime.engine.core.EngineCore`)
and a completion thread that blocks in CalRT ``WaitAny`` and *posts* results to the actor's
mailbox; HTTP handlers post ``submit``/``cancel`` and wait on the actor's
:class:`~calculet.runtime.actor.Reply`. Real time (``MonotonicClock``); nothing busy-waits. The
same core runs in virtual time under :class:`~calculet.runtime.engine.driver.EngineDriver`.
"""

from __future__ import annotations

import contextlib
import os
import threading
from collections.abc import Iterator, Mapping
from typing import Any, Callable, TypeVar

from calculet.adapters.calrt import CalRT, DeviceCapabilities, VirtualDevice
from calculet.clock import Clock, FakeClock, MonotonicClock
from calculet.config import SchedulerConfig
from calculet.errors import CalculetError, DefinitionError, Unavailable
from calculet.machines.monitor import MONITOR
from calculet.runtime.actor import Mailbox
from calculet.runtime.engine.admission_snapshot import AdmissionSnapshot, take_snapshot
from calculet.runtime.engine.core import EngineCore
from calculet.runtime.engine.types import (EngineOptions, EngineStatistics, ExecutionMode, GenerateRequest, ModelInfo,
                                           TokenProvenance)
from calculet.runtime.models.capacity import CapacityPlanner
from calculet.runtime.models.manager import ModelManager
from calculet.runtime.models.operations import Operation
from calculet.runtime.request import RequestSink
from calculet.runtime.scheduling.jobs import JobRecord
from calculet.runtime.scheduling.registry import Cancellation, RequestRecord
from calculet.runtime.scheduling.plan import Submission
from calculet.runtime.streams.writer import batched_wakeups, flush_wakeups, held_wakeups, hold_wakeups

__all__ = ["ThreadedEngine"]

T = TypeVar("T")


class ThreadedEngine:
    """The engine as the HTTP service uses it; every method may be called from any thread.

    ::

        engine = ThreadedEngine(config, runtime, package_dir)   # bring-up (§11 steps 7–9)
        engine.start()
        stream = StreamWriter(tokenizer=engine.tokenizer, stop=params.stop)
        submission = engine.submit(GenerateRequest(prompt, 64, sampling=params), stream)
        for event in stream.events(timeout=30): ...
        engine.cancel(submission.request_id)
        engine.stop(drain_timeout_s=30)
    """

    def __init__(self, config: SchedulerConfig, runtime: CalRT, package_dir: str | os.PathLike[str] | None = None, *,
                 clock: Clock | None = None, options: EngineOptions = EngineOptions(),
                 device: VirtualDevice | None = None, planner: CapacityPlanner | None = None,
                 provenance: Callable[[TokenProvenance], None] | None = None,
                 observer: Callable[[RequestRecord, str, str], None] | None = None) -> None:
        if isinstance(clock, FakeClock):
            raise DefinitionError("ThreadedEngine runs in real time; drive a FakeClock with EngineDriver")
        if options.mode is not ExecutionMode.ASYNC:
            raise DefinitionError("ThreadedEngine runs the async path; the sync baseline is EngineDriver's")
        self._core = EngineCore(config, runtime, package_dir, clock=clock or MonotonicClock(), options=options,
                                device=device, planner=planner, provenance=provenance, observer=observer)
        self.models: ModelManager = self._core.models
        """Load / unload / rollback / status, thread-safe and blocking with a timeout (§10–§13)."""
        self.models.bind_port(_ThreadPort(self))
        self._core.chain_ready_s = options.wake_coalesce_s  # a turn lasts at most as long as a wake-up is held
        self._mailbox = Mailbox()
        self._device_cv = threading.Condition()
        self._exclusive = False
        self._in_wait = False
        self._core.use_exclusive_device(self._exclusive_device)
        self._actor: threading.Thread | None = None
        self._completer: threading.Thread | None = None
        self._stop = threading.Event()
        self._stop_deadline: float | None = None
        self._published_wake: float | None = None
        """The actor's next wake-up as the last publication read it (:meth:`_publish`)."""
        self._lock = threading.Lock()
        self._final: EngineStatistics | None = None
        self.tokenizer = self._core.tokenizer
        self._snapshot: AdmissionSnapshot | None = None
        self._published = 0
        self._admitted: Mapping[str, int] = {}
        """Requests the engine admitted, by tenant: replaced (never changed) at each admission, since every
        snapshot published after it shares it."""
        self._results_posted = 0
        """Device results the completion thread posted (it alone writes this) ..."""
        self._results_applied = 0
        """... and those the actor applied (it alone writes this): while they differ, work may have ended that
        the snapshot still counts."""
        self._stepping = False
        """(the actor writes it) Inside a withdrawn-snapshot section (:meth:`_stepped`): a publication follows."""
        self._deferred = False
        """(the actor writes it) The last turn's publication was deferred (:meth:`_turned`): the snapshot stays
        withdrawn until the actor publishes again, after the next turn at the latest once a reader asks."""
        self._wanted = False
        """(a reader sets it, the actor clears it as it publishes) A reader found no snapshot: the actor publishes
        after its next turn even when it turns again at once (:meth:`_turned`)."""
        self._ended = False
        """(the actor writes it) The actor has left its loop: it publishes no snapshot again."""

    # ------------------------------------------------------------------ lifecycle

    def start(self) -> None:
        """Start the actor (tick loop) and the completion thread."""
        with self._lock:
            if self._actor is not None:
                raise DefinitionError("the engine was already started")
            mode = self._core.options.monitor_mode
            if mode is not None:
                monitoring = self._core.config.monitoring
                MONITOR.configure(enabled=monitoring.invariants, mode=mode, sample_every=monitoring.sample_every)
            self._actor = threading.Thread(target=self._run_actor, name="calculet-engine", daemon=True)
            self._completer = threading.Thread(target=self._run_completer, name="calculet-completion", daemon=True)
            self._actor.start()
            self._completer.start()

    def stop(self, drain_timeout_s: float = 30.0) -> EngineStatistics:
        """Stop admission, drain accepted requests up to ``drain_timeout_s``, then cancel what is
        left, wait for the device and unload. Every accepted request gets one terminal outcome."""
        with self._lock:
            actor = self._actor
            if actor is None:
                self._core.begin_stop()
                self._core.shutdown()
                self._core.teardown()
                self._final = self._core.statistics()
                return self._final
        deadline = self._core.clock.now() + drain_timeout_s
        self._mailbox.post(lambda: self._stepped(lambda: self._begin_stop(deadline)))
        actor.join()
        self._stop.set()
        if self._completer is not None:
            self._completer.join()
        assert self._final is not None
        return self._final

    # ------------------------------------------------------------------ requests

    def submit(self, request: GenerateRequest, sink: RequestSink, timeout: float | None = 30.0) -> Submission:
        """Admit a request; the §5.2 outcome comes back synchronously (the actor's Reply)."""
        return self._call(lambda: self._core.submit(request, sink), timeout)

    def submit_then(self, request: GenerateRequest, sink: RequestSink,
                    done: Callable[[Submission | None, BaseException | None], None]) -> None:
        """Post a submit and return at once; ``done(submission, None)`` — or ``done(None, error)`` — runs on the
        actor when it has decided. Why: an asyncio caller (the HTTP service) wakes its own loop from ``done``
        instead of parking a worker thread on :meth:`submit`'s reply — two thread hops fewer per request on the
        event loop's path (issue #13: time to 429)."""
        self._check_running()

        def message() -> None:
            try:
                submission = self._stepped(lambda: self._core.submit(request, sink))
            except BaseException as exc:
                done(None, exc)
                raise
            if not submission.outcome.rejected:
                self._admitted = {**self._admitted, request.tenant: self._admitted.get(request.tenant, 0) + 1}
            done(submission, None)

        self._mailbox.send(message)  # the answer goes to ``done``: no reply to build and set (#20)

    @property
    def admission_snapshot(self) -> AdmissionSnapshot | None:
        """(any thread) The actor's current admission snapshot (:mod:`.admission_snapshot`), or None while the
        actor is in a step, has deferred the publication after its last turn (a read that finds none asks for the
        next one: :meth:`_turned`), has device results to apply, or cannot refuse from a snapshot at all. A reader may
        refuse a request from it; it must never admit one."""
        if self._results_posted != self._results_applied:
            return None
        snapshot = self._snapshot
        if snapshot is None:
            self._wanted = True  # a deferred publication is wanted now (:meth:`_turned`)
        return snapshot

    @property
    def snapshot_pending(self) -> bool:
        """(any thread) Whether the actor publishes its next snapshot soon, without any message from the reader: it is
        in a step (:meth:`_stepped`, the snapshot withdrawn), deferred the publication after its last turn (it turns
        again at once: the publication comes after the next turn, asked for by this read, :meth:`_turned`), has
        device results to apply (it applies them in one), or
        the published snapshot's validity ended at the actor's timed wake-up, which has come (its turn, a step,
        follows). False when none comes of itself: the actor is idle with its snapshot, or published None (it cannot
        refuse from one), or is stopping or stopped (none but None is published then).

        Why (issue #13): :attr:`admission_snapshot` is None both while a step runs and when the engine cannot refuse
        from a snapshot at all; the refusal lane holds a request for the snapshot in the first case only (a request
        forwarded for want of one goes to the actor untracked by the front's count), and forwards it in the second."""
        if self._ended or self._stop_deadline is not None:
            return False
        if self._stepping or self._results_posted != self._results_applied:
            return True
        if self._deferred:  # withdrawn by chained turns: it comes after the next turn, now that it is asked for
            self._wanted = True
            return True
        wake = self._published_wake
        return self._snapshot is not None and wake is not None and wake <= self._core.clock.now()

    def _stepped(self, step: Callable[[], T]) -> T:
        """(actor) Run ``step`` with the snapshot withdrawn, then publish the one after it: a reader never sees a
        snapshot older than the actor's last step (see :mod:`.admission_snapshot`). :attr:`snapshot_pending` is True
        from before the withdrawal to after the publication: a reader that finds no snapshot and then no step has
        missed none (it reads the snapshot again when it decides)."""
        self._stepping = True
        self._snapshot = None
        try:
            return step()
        finally:
            try:
                self._publish()
            finally:
                self._stepping = False

    def _turned(self, turn: Callable[[], bool]) -> tuple[bool, float | None]:
        """(actor) One turn with the snapshot withdrawn (as :meth:`_stepped`); whether it turns again at once, and its
        next wake-up. The publication after it is deferred when the actor turns again at once and no reader has
        asked for a snapshot since the last one (:attr:`admission_snapshot` found none, :attr:`snapshot_pending`
        said one comes): the snapshot stays withdrawn — sound, a reader refuses nothing without one — and
        :attr:`snapshot_pending` stays True, so a reader that finds none waits for the publication its read asked
        for, after the next turn at the latest. A turn after which the actor may sleep always publishes.

        Why (issue #20): while tokens stream, the actor chains turns back to back (each ~1 ms, ~16 tokens) and is
        inside one nearly all the time, so the snapshot published between two of them was withdrawn again
        microseconds later, before the event loop could read it; requests arrive once per 64 tokens a stream, so
        most of those publications (one a turn, ~20 µs each, the whole admission model taken) were never read."""
        self._stepping = True
        self._snapshot = None
        ready = False
        try:
            ready = turn()
        finally:
            try:
                if ready and not self._wanted and self._stop_deadline is None:
                    self._deferred = True  # before the section ends: a reader sees a snapshot pending throughout
                    wake = self._core.next_wake()
                else:
                    self._publish()
                    wake = self._published_wake
            finally:
                self._stepping = False
        return ready, wake

    def _publish(self) -> None:
        core = self._core
        self._wanted = False  # before the snapshot is taken: a reader asking from now on gets this one or the next
        self._deferred = False
        self._published += 1
        self._published_wake = wake = core.next_wake()
        self._snapshot = take_snapshot(core.scheduler, accepting=core.accepting and self._stop_deadline is None,
                                       generation=self._published, now=core.clock.now(), wake=wake,
                                       admitted=self._admitted)

    def cancel(self, request_id: int, timeout: float | None = 30.0) -> Cancellation:
        """§4 cancel: idempotent; a running request drains. ``NotFound`` for an unknown id."""
        return self._call(lambda: self._core.cancel(request_id), timeout)

    # ------------------------------------------------------------------ reading

    def statistics(self, timeout: float | None = 30.0) -> EngineStatistics:
        """Every component's statistics, read on the actor (a consistent snapshot)."""
        if self._final is not None:
            return self._final
        if self._actor is None:
            return self._core.statistics(self._mailbox.statistics())
        return self._call(lambda: self._core.statistics(self._mailbox.statistics()), timeout)

    def set_observer(self, observer: Callable[[RequestRecord, str, str], None] | None, *,
                     decode_steps: bool = True) -> None:
        """Install the request-transition observer (called on the actor thread); before ``start()``. ``decode_steps``
        False: it is not told a decode step's moves (:meth:`EngineCore.set_observer`)."""
        self._core.set_observer(observer, decode_steps=decode_steps)

    @property
    def clock(self) -> Clock:
        """The engine's clock (request arrivals and every instant an observer sees are on it)."""
        return self._core.clock

    def job(self, job_id: int) -> JobRecord | None:
        """(the actor thread only, e.g. a request ``observer``) The scheduler's record of a planned job."""
        return self._core.scheduler.jobs.get(job_id)

    def capabilities(self) -> DeviceCapabilities:
        """The device capability contract, with evidence tier and source per answer (§1, §20)."""
        return self._core.capabilities

    def model_info(self) -> ModelInfo:
        return self._core.model_info()

    # ------------------------------------------------------------------ threads

    def _call(self, message: Callable[[], T], timeout: float | None) -> T:
        self._check_running()
        return self._mailbox.call(lambda: self._stepped(message), timeout)

    def _check_running(self) -> None:
        if self._actor is None:
            raise DefinitionError("the engine is not started")
        if self._final is not None:
            raise Unavailable("the engine has stopped")

    def _begin_stop(self, deadline: float) -> None:
        self._stop_deadline = deadline
        self._core.begin_stop()

    def _run_actor(self) -> None:
        core, mailbox = self._core, self._mailbox
        clock = core.clock
        ready = False
        coalesce = core.options.wake_coalesce_s
        held_since: float | None = None
        turn = core.turn  # bound once: one call per turn, no lambda frame around it (issue #20)
        hold_wakeups()  # stream wake-ups are handed to the consumer loops below, once per loop (issue #20)
        wake = core.next_wake()
        try:
            while True:
                now = clock.now()
                idle = core.options.actor_idle_s
                timeout = idle if wake is None else min(idle, max(0.0, wake - now))
                if self._stop_deadline is not None:
                    timeout = min(timeout, max(0.0, self._stop_deadline - now))
                if ready:
                    timeout = 0.0
                if held_since is not None and (timeout > 0 or now - held_since >= coalesce):
                    flush_wakeups()  # before sleeping, or when the oldest has waited long enough
                    held_since = None
                mailbox.run_until(timeout)
                # the actor's next wake-up as read after the turn: nothing has run since, so it is the one the next
                # iteration would ask for (issue #20: next_wake was asked twice per turn)
                ready, wake = self._turned(turn)
                if held_since is None and held_wakeups():
                    held_since = clock.now()
                deadline = self._stop_deadline
                if deadline is None:
                    continue
                if core.idle():
                    break
                if clock.now() >= deadline and core.accepting is False:
                    core.shutdown()
                    if core.executor.healthy_inflight() == 0 and not core.pending_frees:
                        break
                wake = core.next_wake()  # stopping: the shutdown may have changed it
        finally:
            self._ended = True  # before the withdrawal: a reader finding no snapshot waits for none
            self._snapshot = None  # stopped: every request goes to the engine, which answers 503
            core.shutdown()
            core.teardown()
            self._final = core.statistics(mailbox.statistics())
            mailbox.run_pending()
            flush_wakeups(release=True)

    @contextlib.contextmanager
    def _exclusive_device(self) -> Iterator[None]:
        """(actor) Pause the completion thread: host-driven jobs (golden, warm-up) Wait for their own
        results, which WaitAny must not collect first. Returns once WaitAny is not running."""
        cv = self._device_cv
        with cv:
            self._exclusive = True
            while self._in_wait:
                cv.wait()
        try:
            yield
        finally:
            with cv:
                self._exclusive = False
                cv.notify_all()

    def _run_completer(self) -> None:
        """Blocks in CalRT WaitAny and posts results to the actor (DESIGN principle 2)."""
        core = self._core
        cv = self._device_cv
        while not self._stop.is_set():
            device = core.device
            if getattr(device, "completes_at_submit", False):
                # every result is there when submit returns and the actor collects it right after its tick
                # (and at every tick's dispatch): a WaitAny here would only be woken to find it gone (#20)
                self._stop.wait(0.1)
                continue
            with cv:
                while self._exclusive and not self._stop.is_set():
                    cv.wait(0.5)
                self._in_wait = True
            try:
                results = device.wait_any(0.1)
            except CalculetError:
                results = None
            finally:
                with cv:
                    self._in_wait = False
                    cv.notify_all()
            if results is None:
                self._stop.wait(0.05)
                continue
            if results:
                self._results_posted += 1
                self._mailbox.post(lambda r=results: self._apply_results(r))  # type: ignore[misc]

    def _apply_results(self, results: Any) -> None:
        """(actor) One WaitAny's results, applied with the snapshot withdrawn (they may end work it counts)."""
        try:
            self._stepped(lambda: _apply_results(self._core, results))
        finally:
            self._results_applied += 1


def _apply_results(core: EngineCore, results: Any) -> None:
    """(actor) One WaitAny's results; the streams' consumers are woken once for all of them."""
    with batched_wakeups():
        core.on_results(results)


class _ThreadPort:
    """The model manager's way to the real-time actor: post a message, wait for the reply."""

    def __init__(self, engine: ThreadedEngine) -> None:
        self._engine = engine

    def call(self, fn: Callable[[], T], timeout: float | None) -> T:
        engine = self._engine
        if engine._final is not None:
            raise Unavailable("the engine has stopped")
        actor = engine._actor
        if actor is None or actor.ident == threading.get_ident():
            return fn()  # not started yet (the caller is the only thread), or already on the actor
        return engine._mailbox.call(lambda: engine._stepped(fn), timeout)

    def run(self, op: Operation, timeout: float | None) -> Any:
        engine = self._engine
        if engine._actor is None and not op.done:
            engine._core.models.poll()
            if not op.done:
                raise DefinitionError(f"start the engine first: {op.describe()}")
        return op.reply.wait(timeout)
