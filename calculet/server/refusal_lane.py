"""The refusal lane: a generation request the admission snapshot refuses, answered 429 by the edge's protocol itself,
before any ASGI task exists (issue #13: time to 429 under a 300-request burst).

Why: under overload the refusal is the common case, and the event loop answers a burst one request after another,
so the loop's CPU per refusal bounds the last client's wait. Through the ASGI stack a refusal cost about 0.46 ms
of loop CPU in-process (``bench/loop_profile.py``): a task and a request/response cycle, the request context, the
body gate, the front, the route's parsing, the refusal raised and caught, the answer encoded into ASGI messages and
uvicorn's framing of them (a regex check per header), a log record through the stdlib's generic formatter. Here the
protocol hands the lane the request's scope and body once the whole request arrived in one read, and the lane
decides with the same functions the full path calls and writes the answer's bytes whole.

What it decides, in order; every step that cannot answer *as the full path would* declines, and the request goes
on to the ASGI app unchanged (its task started as uvicorn would, the body already in its cycle):

1. the credentials (:meth:`TenantDirectory.resolve`, as the body gate does before reading a body): a refusal (401)
   is the body gate's to answer;
2. the body: parsed, validated and tokenised by the route's own ``prepare`` (:data:`GENERATION_ROUTES`, on the loop
   as the front does for a body of at most :data:`~calculet.server.inference.INLINE_BODY` bytes). Choice: **an
   invalid request is never refused 429 here** — anything ``prepare`` refuses (400, 404, 503 for the model) declines,
   so it gets its answer from the full path as before. A cheap check without the validation would be sound for the
   429 itself (the decision is monotone: more prompt or more new tokens only finish later, so a lower bound on the
   prompt's tokens can only refuse what the exact count refuses) but it would answer 429 to a body the full path
   answers 400, and its ``Retry-After`` would come from a length the request does not have. Instead the result of
   ``prepare`` is remembered for the same bytes on the same route (:class:`PreparedMemo`): ``prepare`` is a pure
   function of the body, the process's tokenizer and context, except the model check, which is asked again;
3. the context and the service's state (400 ``context_length_exceeded``, 503 shutting down) decline as well;
4. the snapshot: :meth:`EarlyAdmission.decide`, the same call the full path makes
   (:func:`~calculet.server.inference._refuse_early`); with no snapshot while requests are on their way to the
   actor, the protocol holds the request as the full path does
   (:data:`~calculet.runtime.engine.admission_snapshot.HELD`) and asks again. A request it forwards is marked
   (``early_decided``), so the full path does not decide (and count) it twice, and carries its prepared
   generation (``prepared``), so it is not parsed twice.

One difference of timing the lane must make up for: the protocol decides every request of a socket read (a burst's
first read holds dozens) before any ASGI task runs, where the full path decided each in its own task, after the
task before it had sent its request to the actor. So a request the lane forwards counts as on its way to the engine
(:attr:`EarlyAdmission.unsent`, until the full path submits it or its request ends), and a request that fits a
snapshot but would not fit behind the requests forwarded on it is held too (``hold`` of
:meth:`EarlyAdmission.decide`): without both, the whole first read went to the actor, which refused all but the
first few (measured: 105 of a burst's 294 refusals answered by the engine, the burst's 429 P99 at 332 ms).

The answer is the full path's, byte for byte: the status line, uvicorn's default headers, ``retry-after``,
``content-length``, ``content-type``, ``x-request-id`` (server-generated), ``x-client-request-id`` when the client
sent a valid ``X-Request-Id``, ``connection: close`` when the connection does not stay open, and the body of
:func:`~calculet.server.errors.admission_error`, written from pieces encoded once (:class:`AnswerBytes`). The
request's one log line has the fields and order :class:`~calculet.server.app.RequestContext` writes
(:func:`~calculet.server.logs.log_lines`, which writes it without a record when the service's JSON handler is the
only one), and ``calculet_http_requests_total`` and the duration histogram count it as they count every request,
added once per turn of the event loop, when the turn's log lines are written, in one write
(:meth:`RefusalLane.flush`).
"""

from __future__ import annotations

import asyncio
import logging
import re
import time
from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from calculet.runtime.engine.admission_snapshot import HELD, HOLD_IN_FLIGHT
from calculet.runtime.engine.early_refusal import refusal_reason
from calculet.server.edge_answers import AnswerBytes, new_request_id
from calculet.server.errors import APIError
from calculet.server.inference import GENERATION_ROUTES, HOLD_ROUNDS, INLINE_BODY, ApiGeneration, on_loop
from calculet.server.lane_statistics import RefusalLaneStatistics
from calculet.server.logs import log_lines
from calculet.server.service import HOLD_S

log = logging.getLogger("calculet.server")

CLIENT_ID = re.compile(r"^[A-Za-z0-9._:-]{1,128}$")
"""A client's ``X-Request-Id`` kept as a correlation field (:class:`~calculet.server.app.RequestContext`'s rule)."""

HOLD_CAP_S = 1.0
"""The longest the lane holds a request past its last round while the engine has :data:`HOLD_IN_FLIGHT` requests on
their way: then it is decided whatever the snapshot. Why hold past the last round at all: at a burst's start the
lane holds nearly every request at once (it decides a whole read before any reaches the engine), and the last
rounds of all of them end together; decided then without a snapshot, all went to the engine at once (measured:
284 of a burst's 300 forwarded, 257 refused by the engine, the last 429 after 17 s, retries admitted 81 %)."""

SNAPSHOT_POLL_S = 0.002
"""How often held requests are decided again while the actor's next snapshot is pending (:class:`SnapshotWait`: in
a step, about a decode tick, under a millisecond of CPU, until it publishes)."""

SNAPSHOT_WAIT_S = 0.05
"""The longest a request waits for a pending snapshot (:class:`SnapshotWait`, each request from its own first wait):
past it, in a longer step (a model load, a host-driven job), it goes on as with none coming. A step under load on this
machine took over 20 ms of wall time."""

MEMO_ENTRIES = 256
"""Bodies whose prepared generation is remembered at most (each at most ``INLINE_BODY`` bytes: 2 MiB in all)."""


class PreparedMemo:
    """The prepared generation of the bodies seen last, per route: the same bytes give the same generation.

    Why sound: ``prepare`` reads only the body, the tokenizer and the context, fixed for the process (a published
    generation keeps the engine contract, §11 step 3), and the model check, which the lane asks again at each use.
    Only successes are kept; the oldest entry goes first when full."""

    def __init__(self, entries: int = MEMO_ENTRIES) -> None:
        self.entries = entries
        self._kept: dict[tuple[str, bytes], ApiGeneration] = {}
        self.hits = 0

    def get(self, path: str, body: bytes) -> ApiGeneration | None:
        found = self._kept.get((path, body))
        if found is not None:
            self.hits += 1
        return found

    def put(self, path: str, body: bytes, gen: ApiGeneration) -> None:
        kept = self._kept
        if len(kept) >= self.entries:
            del kept[next(iter(kept))]
        kept[(path, body)] = gen

    def __len__(self) -> int:
        return len(self._kept)


class SnapshotWait:
    """Whether a request should wait for the actor's next snapshot, by the engine's word (:attr:`~calculet.runtime
    .engine.threaded.ThreadedEngine.snapshot_pending`): no snapshot also says the engine cannot refuse from one (an idle
    lane on B>1, a stale plan, stopping), when a wait is for nothing (session 19 guessed it by a 50 ms recency rule).

    Each request waits at most :data:`SNAPSHOT_WAIT_S` of a pending spell from *its own* first wait (its scope's
    ``state[WAIT_SINCE]``, dropped when the spell ends). Why (issue #13, session 21): one instant per spell, as up to
    45eef29, forwarded every arrival after the first waiter's timeout at once, untracked by the front's count, to an
    actor that answers it only after the same step (it reads its mailbox between steps); a long step under load (the
    burst's loop and the actor share the interpreter lock) made the front blind for the rest of it. A stuck engine
    still holds each request :data:`SNAPSHOT_WAIT_S` at most (``docs/refusal_lane.md``)."""

    __slots__ = ("engine",)

    def __init__(self, engine: Any) -> None:
        self.engine = engine

    def __call__(self, snapshot: Any, now: float, state: dict[str, Any]) -> bool:
        """No usable snapshot (``snapshot`` None, or expired at ``now``, engine clock), the actor says one comes (in a
        step, results to apply, its timed wake-up due), and the request of ``state`` has waited less than
        :data:`SNAPSHOT_WAIT_S` for it."""
        if snapshot is not None and now < snapshot.valid_until or not self.engine.snapshot_pending:
            state.pop(WAIT_SINCE, None)  # its spell ended: a later one is waited for afresh
            return False
        since = state.setdefault(WAIT_SINCE, now)
        return bool(now - since < SNAPSHOT_WAIT_S)


WAIT_SINCE = "snapshot_wait_since"
"""The scope ``state``'s key of when (engine clock) the request first found a snapshot pending (:class:`SnapshotWait`)."""


@dataclass(slots=True)
class _Held:
    """A request held by :meth:`RefusalLane.hold`: its protocol, cycle, app, body and arrival, the round it is
    decided at whatever the snapshot."""

    edge: Any
    cycle: Any
    app: Any
    body: bytes
    started: float
    last_round: int

    def gone(self) -> bool:
        return bool(self.cycle.disconnected) or self.edge.transport.is_closing()


class RefusalLane:
    """The 429 of a generation POST from the admission snapshot, as whole response bytes (see the module)."""

    def __init__(self, service: Any, routes: Mapping[str, Any]) -> None:
        self.service = service
        self.routes = dict(routes)
        """path → the FastAPI route declaring it (its template names the log line and the metrics)."""
        self.memo = PreparedMemo()
        self._queue: deque[_Held] = deque()
        self._armed = False
        self._round = 0
        """Rounds ended so far (a held request is decided without holding at its ``last_round``): drains that found
        nothing on its way to the engine, or came :data:`~calculet.server.service.HOLD_S` after the last round."""
        self._round_at = 0.0
        self._polling = False
        self._awaited = SnapshotWait(service.engine)
        self._refused = 0
        self._declined = 0
        self._held = 0
        self.answers = AnswerBytes()
        self._templates: dict[str, str] = {}
        """path → its route's template (the log line's and the metrics' label)."""
        self._turn: list[tuple[Any, Any, Any, float]] | None = None
        """The requests of this turn of the event loop kept for its end (None: none arrived yet, :meth:`arrive`)."""
        self._batching = False
        """Whether this turn's lane answered a request already: the turn's next arrivals wait for its end."""
        self._pending: dict[str, list[float]] = {}
        """Refusals' durations by route template, not yet added to the service's families (:meth:`_count`)."""
        self._lines: list[tuple[float, dict[str, Any]]] = []
        """Refusals' log lines (their instant, their fields) not yet written (:meth:`_count`)."""
        # What is fixed for the service, decided once here rather than per request (issue #13, session 22): the
        # configuration, the engine and the tokenizer do not change while it serves
        engine = service.engine
        self._on_time = service.config.batch.deadline_order == "on_time"
        """Whether the engine refuses from a snapshot at all (none ever comes under another order)."""
        self._snapshots = hasattr(type(engine), "admission_snapshot")
        self._max_body = min(INLINE_BODY, service.config.server.max_body_bytes)
        self._served = on_loop(service)
        """The service as ``prepare`` sees it on the loop (the model check without the engine)."""
        self._read = lambda: engine.admission_snapshot
        """The actor's current snapshot (:meth:`EarlyAdmission.decide` reads it before and after deciding)."""

    def arrive(self, edge: Any, cycle: Any, app: Any, started: float) -> None:
        """A candidate request that arrived whole (``edge``'s read parsed): settled (``edge.settle``: answered,
        held or started) at once up to the first of this turn of the event loop the lane answers, the turn's
        others in arrival order once every read of the turn is parsed (:meth:`_end_turn`, the loop's next callback).

        Why a batch: a burst's reads come in one turn of the loop, and settling each between two reads' HTTP
        parsing ran the lane's code (JSON, validation, tokeniser, snapshot, answer, log line) interleaved with the
        parser's: settled one after another it runs warm. ``bench/overload_http.py --part burst --distinct`` against
        a6780ff, two interleaved pairs in one run: the loop's CPU per request up to the last 429 0.151 and 0.122 ms
        against 0.214 and 0.186, the 429 P99 50 and 39 ms against 70 and 58 (in-process, ``bench/loop_profile.py
        --distinct``, the same A/B in one process: from 2 % more to 22 % less, within its noise). The turn's first
        429 is not delayed (written as soon as it is parsed; at 6da513f only the turn's first request was settled at
        once, and a burst's first 429 came 3-27 ms after its first arrival against 0-14 ms before); the others wait
        at most for the turn's remaining reads to be parsed, tens of microseconds each."""
        turn = self._turn
        if turn is None:
            try:
                asyncio.get_running_loop().call_soon(self._end_turn)
            except RuntimeError:  # no loop (a direct call): settled at once, each
                edge.settle(cycle, app, started)
                return
            self._turn = turn = []
        if self._batching:
            turn.append((edge, cycle, app, started))
            return
        edge.settle(cycle, app, started)
        # settled at once until the turn's first answer (a 429) is written: requests forwarded to the engine at a
        # burst's start do not delay its first 429 to the turn's end
        self._batching = bool(cycle.response_complete)

    def _end_turn(self) -> None:
        """(the turn's reads parsed) Settle the requests :meth:`arrive` kept, in arrival order, stage by stage: every
        body screened (:meth:`screen`: parsed, validated, tokenised), then each request decided (``edge.settle``: its
        429 built, or held, or started), then the answers written (``edge.write_answer``).

        Why by stage: each stage's code and data stay warm across the turn's requests instead of the three taking
        turns per request (the same reasoning as the batch of :meth:`arrive`, one level down). The decisions are made
        in the same order, each from the snapshot of its moment: screening is a pure function of the body (the memo
        aside), and nothing the loop runs comes between a decision and its answer's write but the turn's other
        decisions. Measured against c651575 (this change alone on it), interleaved pairs in one run each, load 2-6:
        ``bench/overload_http.py --part burst --distinct``, six pairs in two runs, the loop's CPU per request up to
        the last 429 0.126/0.099/0.208/0.097/0.118/0.160 ms against 0.184/0.221/0.188/0.200/0.122/0.166 (medians
        0.122 and 0.186), the 429 P99 56/68/103/36/62/136 ms against 127/104/79/86/64/72 (the wall times move with
        the machine: the 136 ms run's loop spent 48 ms of CPU in the 212 ms to its last 429); ``bench/loop_profile.py
        --distinct``, four pairs: 0.140/0.119/0.138/0.144 ms a refusal against 0.163/0.158/0.160/0.181 with the device
        busy, 0.121/0.103/0.114/0.103 against 0.145/0.136/0.144/0.156 from a pinned snapshot. (Its ``--stages`` split
        cannot show this: its timers, two clock reads around each of ~20 calls a request, break the locality it
        measures.)"""
        turn, self._turn, self._batching = self._turn or [], None, False
        for edge, cycle, _app, _started in turn:
            try:
                body = edge.lane_body(cycle)
                if body is not None and "screened" not in cycle.scope["state"]:
                    self.screen(cycle.scope, body)
            except Exception:  # noqa: BLE001 - screened again at its decision, which answers it as before
                pass
        answers: list[tuple[Any, Any, bytes]] = []
        for edge, cycle, app, started in turn:
            try:
                edge.settle(cycle, app, started, answers)
            except Exception:  # noqa: BLE001 - as the loop reports a raising read; the turn's others still settled
                log.exception("settling a request of the turn failed")
        for edge, cycle, answer in answers:
            try:
                edge.write_answer(cycle, answer)
            except Exception:  # noqa: BLE001 - as above
                log.exception("writing an answer of the turn failed")

    def candidate(self, scope: Mapping[str, Any]) -> bool:
        """Whether the protocol should keep ``scope``'s request for :meth:`decide` (a POST to a generation route)."""
        return scope["method"] == "POST" and scope["path"] in self.routes

    def hold(self, edge: Any, cycle: Any, app: Any, body: bytes, started: float) -> None:
        """Hold a request :meth:`decide` answered :data:`~calculet.runtime.engine.admission_snapshot.HELD`
        until the engine's next answer (or the hold's timer), at most :data:`~calculet.server.inference.HOLD_ROUNDS`
        rounds, as the full path holds (:func:`~calculet.server.inference._refuse_early`); then it is decided whatever
        the snapshot — unless the engine has :data:`HOLD_IN_FLIGHT` requests on their way, up to :data:`HOLD_CAP_S`
        after its arrival. A round ends at an answer after which nothing is on its way to the engine (the actor is
        idle: its snapshot is there if it can give one), or :data:`~calculet.server.service.HOLD_S` after the last
        round; at an answer that leaves requests on their way the held ones wait while there is no snapshot
        (``patient``): the actor withdrew it to run the next of them.

        Why a queue and not a task per request: at a burst's start most of its requests are held, and each wait
        ends for all of them at once; a task and a wake-up each, per round, cost the loop more than the refusal
        itself. Here one callback per wait decides them in arrival order and stops at the first still held (what
        holds it — no snapshot, requests still on their way — holds the ones behind it too, until a later round).
        ``edge`` is the request's protocol: it writes an answer (``write_answer``) or starts the request's ASGI task
        (``start_app``), as it would have without the lane; held for a pending snapshot, also at its publication
        (:meth:`_watch`)."""
        self._held += 1
        self._queue.append(_Held(edge, cycle, app, body, started, self._round + HOLD_ROUNDS))
        self._arm()
        self._watch()

    def _watch(self) -> None:
        """Poll (every :data:`SNAPSHOT_POLL_S`) for the actor's next snapshot while requests are held and it is pending
        (:class:`SnapshotWait`); the answers' waits (:meth:`_arm`) decide them otherwise. Why (issue #13,
        ``bench/overload_http.py --part burst``, a trace per decision): the actor withdraws its snapshot while it
        decides the burst's first forwards. Requests met then were held for answers, whose drains met it withdrawn
        again (the actor on the next message); with fewer than :data:`HOLD_IN_FLIGHT` on their way they were forwarded
        untracked, so the front could not count what the engine holds and held every request fitting the next
        snapshot until the engine had answered all (first 429 at 40-80 ms). Now held (:meth:`_decide`), decided here."""
        engine = self.service.engine
        queue = self._queue
        if queue and self._awaited(engine.admission_snapshot, engine.clock.now(), queue[0].cycle.scope["state"]):
            self._poll_soon()  # the first held request waits for it (the ones behind it wait behind it)

    def holding(self) -> bool:
        """Whether requests are held: a new arrival that finds no snapshot waits behind them while anything is on its
        way to the engine (``patient`` of :meth:`decide`), as they do, rather than go to the engine before them."""
        return bool(self._queue)

    def _arm(self) -> None:
        if not self._armed and self._queue:
            self._armed = True
            self.service.next_answer.wait().add_done_callback(self._drain)

    def _drain(self, _done: Any) -> None:
        """(a wait ended) Decide the held requests in order, up to the first still held; then wait again."""
        self._armed = False
        early = self.service.early_admission
        now = time.perf_counter()
        # an answer that leaves requests on their way is no round: the actor is on the next of them (its snapshot
        # withdrawn), so a held request decided now found no snapshot and went to the engine too, one more each
        # answer, until the engine had answered them all; bench/loop_profile.py and overload_http.py at d515e2d:
        # 8-38 forwarded a burst for want of a snapshot, each through the ASGI path and the actor
        settled = early.in_flight + early.unsent == 0 or now - self._round_at >= HOLD_S
        if settled:
            self._round += 1
            self._round_at = now
        self._decide_held(now, patient=not settled)
        self._arm()

    def _poll(self) -> None:
        """(:meth:`_watch`'s) Decide the held requests again once the actor's next snapshot is published, or the engine
        says none comes (then as an arrival is decided: forwarded unless anything is on its way); no round ends."""
        self._polling = False
        engine, queue = self.service.engine, self._queue
        if not queue:
            return  # decided meanwhile (an answer's drain)
        if self._awaited(engine.admission_snapshot, engine.clock.now(), queue[0].cycle.scope["state"]):
            self._watch()  # still to come, and the first held request still waits for it
            return
        self._decide_held(time.perf_counter(), patient=True)

    def _decide_held(self, now: float, *, patient: bool) -> None:
        """Decide the held requests in order, up to the first still held. With no usable snapshot while the actor is
        about to publish one (:class:`SnapshotWait`), the requests wait for it (polled every :data:`SNAPSHOT_POLL_S`;
        past their last round too, up to :data:`HOLD_CAP_S` after their arrival) rather than go to the engine for want
        of one, where they would wait for the same step's end in the actor's mailbox. Measured at d515e2d with
        bench/loop_profile.py: 4-20 forwards a burst for want of a snapshot, most where a drain of ~290 held requests
        outlasted the snapshot it began with, or began in the actor's step."""
        early = self.service.early_admission
        queue = self._queue
        while queue:
            item = queue[0]
            # read per request: each forward of this drain is on its way too (``unsent``); read once per drain, a
            # drain that began with fewer than HOLD_IN_FLIGHT on their way forwarded every held request past its
            # last round at once (bench/overload_http.py at 6a06a11: 5 of 11 bursts with 53-201 of 294 refusals
            # answered by the engine, 240 forwarded for want of a snapshot in the worst)
            busy = early.in_flight + early.unsent >= HOLD_IN_FLIGHT
            try:
                if item.gone():
                    answer: Any = None  # the app's (its one log line says the client went)
                else:
                    hold = self._round < item.last_round or (busy and now - item.started < HOLD_CAP_S)
                    answer = self.decide(item.cycle.scope, item.body, default_headers=item.edge.default_headers(),
                                         keep_alive=item.cycle.keep_alive, started=item.started, hold=hold,
                                         patient=patient, wait=hold or now - item.started < HOLD_CAP_S)
                    if answer is HELD:
                        break
            except Exception:  # noqa: BLE001 - never in the loop's callback: the app answers it
                answer = None
            queue.popleft()
            if answer is None:
                item.edge.start_app(item.cycle, item.app)
            else:
                item.edge.write_answer(item.cycle, answer)
        self._watch()

    def _poll_soon(self) -> None:
        if not self._polling:
            self._polling = True
            asyncio.get_running_loop().call_later(SNAPSHOT_POLL_S, self._poll)

    def decide(self, scope: dict[str, Any], body: bytes, *, default_headers: list[tuple[bytes, bytes]],
               keep_alive: bool, started: float, hold: bool, patient: bool = False,
               wait: bool | None = None) -> bytes | str | None:
        """The whole 429 response to write, :data:`~calculet.runtime.engine.admission_snapshot.HELD` (``hold``
        allowed and the request should wait for the engine's next answer), or None: the ASGI app answers (``scope``'s
        state then says what was decided).
        ``started``: ``time.perf_counter()`` when the request reached the lane (its log line's duration).
        ``patient`` (with ``hold``): with no snapshot, wait while anything is on its way to the engine, not only
        :data:`~calculet.runtime.engine.admission_snapshot.HOLD_IN_FLIGHT` (a drain at an answer that is no round;
        an arrival behind held requests, :meth:`holding`). ``wait`` (default: ``hold``): held while the actor is about
        to publish a snapshot (:class:`SnapshotWait`)."""
        try:
            decided = self._decide(scope, body, hold, patient, hold if wait is None else wait)
        except Exception:  # noqa: BLE001 - the full path meets it again and answers it (a 500 with its log line)
            decided = None
        if decided is None or decided is HELD:
            self._declined += decided is None
            return decided
        refusal, gen, tenant = decided
        return self._answer(scope, refusal, gen, tenant, default_headers, keep_alive, started)

    def _decide(self, scope: dict[str, Any], body: bytes, hold: bool, patient: bool, wait: bool) -> Any:
        service = self.service
        state = scope["state"]
        screened = state.get("screened")
        if screened is None:
            screened = self.screen(scope, body)
        if not screened:
            return None
        tenant, gen = screened
        engine = service.engine
        early = service.early_admission
        on_time = self._on_time
        hold = hold and on_time
        snapshot, now = engine.admission_snapshot, engine.clock.now()
        if wait and on_time and self._awaited(snapshot, now, state) or hold and snapshot is None and (
                early.in_flight + early.unsent > 0 and (patient or early.should_hold(None))):
            return HELD  # the actor publishes its next snapshot soon (see _watch), or answers those on their way
        refusal = early.decide(self._read, prompt_tokens=len(gen.prompt), max_new_tokens=gen.max_tokens,
                               tenant=tenant, now=now, hold=hold)
        if refusal is HELD:
            return HELD
        if refusal is None:
            state["early_decided"] = True  # forwarded, and counted: the full path does not decide it again
            state["unsent"] = True  # on its way to the engine: ended by the full path's submit, or its request's end
            early.unsent += 1
            return None
        return refusal, gen, tenant

    def screen(self, scope: dict[str, Any], body: bytes) -> tuple[str, ApiGeneration] | bool:
        """The request's tenant and prepared generation (:meth:`_screen`), or False when the full path must answer it;
        kept in the scope's ``state`` (``screened``) for its decisions."""
        screened = self._screen(self.service, scope, body) or False
        scope["state"]["screened"] = screened
        return screened

    def _screen(self, service: Any, scope: dict[str, Any], body: bytes) -> tuple[str, ApiGeneration] | None:
        """The request's tenant and prepared generation, or None when the full path must answer it (steps 1-3 of
        the module). Kept in the scope's ``state`` (``screened``) by :meth:`screen`: a held request is screened
        once, at its arrival, as the full path prepares and checks it once before it holds
        (:func:`~calculet.server.inference._generate`); its re-decisions ask the snapshot only. Why: with a body
        per client the memo (:data:`MEMO_ENTRIES`) is smaller than a burst's held queue, so every held request was
        parsed and tokenised again at its drain (``bench/loop_profile.py --distinct``: ``prepare`` ran 596 times
        for 300 requests)."""
        if "protocol_error" in scope["state"] or not body or len(body) > self._max_body:
            return None
        authorization = None
        for name, value in scope["headers"]:
            if name == b"authorization":
                authorization = value.decode("latin-1")
                break
        try:
            tenant = service.tenants.resolve(authorization)
        except APIError:
            return None
        path = scope["path"]
        gen = self._prepared(service, path, body)
        if gen is None:
            return None
        scope["state"]["prepared"] = (body, gen)
        if len(gen.prompt) + gen.max_tokens > service.info.max_seq or not service.accepting or not self._snapshots:
            return None
        return tenant, gen

    def _prepared(self, service: Any, path: str, body: bytes) -> ApiGeneration | None:
        """The route's prepared generation of ``body``, or None when the full path must answer it (``prepare`` refused
        it, or its model check needs the engine)."""
        gen = self.memo.get(path, body)
        served = self._served
        if gen is not None:
            try:
                served.check_model(gen.model)
            except Exception:  # noqa: BLE001 - answered by the full path
                return None
            return gen
        if log.isEnabledFor(logging.DEBUG) and logging.getLogger("calculet.server.inference").isEnabledFor(
                logging.DEBUG):
            return None  # prepare logs ignored fields at DEBUG: the full path writes that line
        try:
            gen = GENERATION_ROUTES[path][0](served, body)  # type: ignore[arg-type]
        except Exception:  # noqa: BLE001 - an invalid body, or a model check for the engine: the full path's
            return None
        self.memo.put(path, body, gen)
        return gen

    def _answer(self, scope: dict[str, Any], refusal: Any, gen: ApiGeneration, tenant: str,
                default_headers: list[tuple[bytes, bytes]], keep_alive: bool, started: float) -> bytes:
        request_id = new_request_id()
        client_id = None
        for name, value in scope["headers"]:
            if name == b"x-request-id":
                given = value.decode("latin-1")
                client_id = given if CLIENT_ID.match(given) else None
                break
        fit_in = refusal.fit_in_s
        answer = self.answers.response(default_headers, fit_in, refusal.retry_after_s, request_id, client_id,
                                       keep_alive)
        self._refused += 1
        template = self._templates.get(scope["path"])
        if template is None:
            route = self.routes[scope["path"]]
            template = self._templates[scope["path"]] = str(getattr(route, "path", scope["path"]))
        took = time.perf_counter() - started
        fields: dict[str, Any] | None = None
        if log.isEnabledFor(logging.INFO):
            fields = {"request_id": request_id, "method": "POST", "route": template, "status": 429,
                      "duration_s": round(took, 6), "tenant": tenant}
            if client_id is not None:
                fields["client_request_id"] = client_id
            fields.update(code=self.answers.code, reason=refusal_reason(fit_in), refused_by="front",
                          generation=self.service.info.generation, model=gen.model)
        self._count(template, took, fields)
        return answer

    def _count(self, route: str, took: float, fields: dict[str, Any] | None) -> None:
        """One refusal's ``calculet_http_requests_total``, duration and log line (``fields``; None: INFO is off), kept
        for the end of this turn of the event loop (:meth:`flush`, scheduled at the turn's first): a burst's read of
        300 refusals increments the counter once and writes its 300 lines in one write. Exact at any scrape: a scrape
        is answered in a later turn of the loop (or calls :meth:`flush` first). A line keeps the instant it was
        decided (its ``ts``) and is written after the answers of its turn, before the loop reads the next sockets
        (issue #13: one flush of the log stream per refusal released the interpreter lock each time, see
        :func:`~calculet.server.logs.log_lines`)."""
        pending = self._pending
        first = not pending and not self._lines
        durations = pending.get(route)
        if durations is None:
            pending[route] = [took]
        else:
            durations.append(took)
        if fields is not None:
            self._lines.append((time.time(), fields))
        if first:
            try:
                asyncio.get_running_loop().call_soon(self.flush)
            except RuntimeError:  # no loop (a direct call): counted and written at once
                self.flush()

    def flush(self) -> None:
        """Write the log lines and add the refusals counted since the last flush to the service's HTTP families (see
        :meth:`_count`)."""
        lines, self._lines = self._lines, []
        if lines:
            log_lines(log, logging.INFO, "http", lines, plain=True)
        pending, self._pending = self._pending, {}
        metrics = self.service.metrics
        for route, durations in pending.items():
            metrics.http_requests.labels(route, "POST", "429").inc(len(durations))
            metrics.http_duration.labels(route).observe_many(durations)  # each touched bucket incremented once

    def statistics(self) -> RefusalLaneStatistics:
        return RefusalLaneStatistics(self._refused, self._declined, self._held, self.memo.hits, len(self.memo))


__all__ = ["AnswerBytes", "CLIENT_ID", "HOLD_CAP_S", "MEMO_ENTRIES", "PreparedMemo", "RefusalLane", "SnapshotWait",
           "RefusalLaneStatistics", "WAIT_SINCE"]
