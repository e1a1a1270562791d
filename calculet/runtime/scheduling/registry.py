"""RequestRegistry (§4): the one owner of every request's lifecycle.

Each request is a compiled :class:`~calculet.machines.RequestMachine` instance; every change
of its state goes through ``fire`` (never a field write), and the registry keeps no second
copy of that state. What it adds is what the machine does not model: the sink, the tenant and
deadline, and a listener that the scheduler uses to reclaim resources after each transition.

Rules (§4):

* not thread-safe by design — the engine's actor serialises every call
  (:mod:`calculet.runtime.actor`), so HTTP, completion and sampler threads never touch a field;
* ``cancel`` is idempotent: on a terminal request it returns the stored outcome without firing;
  in New/Waiting*/Ready/Finishing it completes at once; in Running it only sets the machine's
  flag and the job drains;
* a terminal state is entered once (the machine has no way out of one), so the sink is closed
  once — on the transition into the terminal state and nowhere else;
* every callback names (generation, job id); one that does not match the request's current
  job is *stale*: it is dropped and reported as such, and the caller still reclaims the job's
  resources (:meth:`RequestRegistry.on_decode_complete`).
"""

from __future__ import annotations

import enum
import logging
from collections import Counter, OrderedDict
from dataclasses import dataclass
from typing import Any, Callable, NamedTuple, Sequence

from calculet.errors import BadRequest, NotFound
from calculet.machines import RequestMachine, TransitionNotAllowed
from calculet.machines.request import DECODING, HOLDING, RUNNING, TERMINAL, WAITING, FinishReason
from calculet.runtime.request import InferenceRequest, RequestId, RequestOutcome, RequestSink

log = logging.getLogger("calculet.runtime.scheduling.registry")

# The request machine's state groups (derived from its declaration, never restated here).
TERMINAL_STATES = TERMINAL
WAITING_STATES = WAITING - {RequestMachine.definition.initial}  # routed or queued, not yet admitted
RUNNING_STATES = RUNNING
PREFILL_STATES = HOLDING - DECODING  # holding a KV lane, prompt not yet prefilled: prefill_ready, prefill_running
_INSTANCE = RequestMachine.Instance
"""Its ``fire_each`` is read per call: the monitor installs the variant its configuration needs."""


class RequestRecord:
    """A request's machine plus the non-lifecycle facts the scheduler needs.

    The lifecycle (state, generation, job id, lengths, flags) is read from ``machine``; the
    attributes here are inputs (tenant, deadline), scheduling keys (virtual finish, decode
    tag) and resource handles (KV lease, queue entry). None of them mirrors the machine.
    """

    __slots__ = ("request_id", "tenant", "machine", "sink", "arrival", "deadline", "prefill_class",
                 "virtual_finish", "decode_tag", "cost", "last_token", "lease", "entry",
                 "ready_since", "reject_status", "detail", "at_risk", "prefill_tag", "estimated_finish")

    def __init__(self, request_id: RequestId, request: InferenceRequest, machine: Any,
                 sink: RequestSink, arrival: float, deadline: float) -> None:
        self.request_id = request_id
        self.tenant = request.tenant
        self.machine = machine
        self.sink = sink
        self.arrival = arrival
        self.deadline = deadline
        self.prefill_class = ""
        self.virtual_finish = 0
        self.decode_tag = 0
        self.cost = 0
        self.last_token: int | None = None
        self.lease: Any = None
        self.entry: list[Any] | None = None
        self.ready_since = 0.0
        self.reject_status = 0
        self.detail = ""
        self.at_risk = False
        """Decode order (§7.2): its deadline came at risk; it keeps deadline priority from then on."""
        self.prefill_tag = 0
        """Prefill order within its class (§6): its virtual finish, then rotated per chunk."""
        self.estimated_finish: float | None = None
        """Issue #13: when admission accepted it, the shared-device estimate of its finish
        (absolute, scheduler clock seconds); None when there was no estimate."""

    @property
    def state(self) -> str:
        return self.machine.state  # type: ignore[no-any-return]

    @property
    def prompt_tokens(self) -> int:
        return self.machine.prompt_tokens  # type: ignore[no-any-return]

    @property
    def max_new_tokens(self) -> int:
        return self.machine.max_new_tokens  # type: ignore[no-any-return]

    @property
    def generation(self) -> int:
        return self.machine.generation  # type: ignore[no-any-return]

    @property
    def job_id(self) -> int:
        return self.machine.job_id  # type: ignore[no-any-return]

    @property
    def is_long(self) -> bool:
        return self.prefill_class == "long"

    def __repr__(self) -> str:
        return f"<Request {self.request_id} {self.tenant} {self.machine.state}>"


TransitionListener = Callable[[RequestRecord, str, str], None]
"""Called after every transition with (record, source state, target state)."""
QuietListener = Callable[[Sequence[RequestRecord], str, Sequence[str]], None]
"""Called once per per-step batch call with its quiet moves: (records, their common source, each one's target)."""


def one_by_one(listener: TransitionListener) -> QuietListener:
    """A quiet listener that tells ``listener`` each record's move in turn (for an observer without a step hook)."""
    def tell(recs: Sequence[RequestRecord], source: str, targets: Sequence[str]) -> None:
        for rec, target in zip(recs, targets):
            listener(rec, source, target)
    return tell


class CancelResult(enum.Enum):
    """What ``cancel`` did (§4)."""

    CANCELLED = "cancelled"
    """The request was New/Waiting/Ready/Finishing and is now Cancelled."""
    PENDING = "pending"
    """A job of the request is on the device; the flag is set and the job drains."""
    ALREADY_TERMINAL = "already_terminal"
    """Nothing fired: the request had already ended (its outcome is returned)."""


@dataclass(frozen=True, slots=True)
class Cancellation:
    result: CancelResult
    outcome: RequestOutcome | None


class CallbackResult(enum.Enum):
    APPLIED = "applied"
    STALE = "stale"


class Callback(NamedTuple):
    """The result of a completion callback on one request (one per lane per tick: a tuple)."""

    result: CallbackResult
    source: str
    target: str
    reason: str = ""


@dataclass(frozen=True)
class RegistryStatistics:
    """§16: requests by state and terminal outcomes (bounded label sets only)."""

    created: int
    live: int
    by_state: dict[str, int]
    terminal_by_reason: dict[str, int]
    closes: int
    stale_callbacks: int
    sink_errors: int


_STATUS = {"completed": 200, "cancelled": 499}
_FAILED_STATUS = {FinishReason.DEADLINE: 504, FinishReason.ERROR: 500}


class RequestRegistry:
    """Creates requests and fires their events; the sole writer of request lifecycle state."""

    def __init__(self, *, listener: TransitionListener | None = None, retain_terminal: int = 65_536) -> None:
        self._live: dict[RequestId, RequestRecord] = {}
        self._ended: OrderedDict[RequestId, RequestOutcome] = OrderedDict()
        self._retain = retain_terminal
        self._next_id = 1
        self._listener = listener
        self.quiet: frozenset[str] = frozenset()
        """States between which a move is not told to the listener: the listener's owner declares that it
        ignores them (the scheduler: a decode step's submit and result reclaim nothing, issue #20). Only the
        per-step batch paths (:meth:`fire_all`, :meth:`decode_done_each`) read it; :meth:`fire` tells all."""
        self.quiet_listener: QuietListener | None = None
        """Told the quiet moves of one per-step batch call at once — (records, their source, each one's
        target) — instead of one listener call per record and move (issue #20: a decode step's moves are one
        unit; the engine's observers take them so). None: the quiet moves are told to nobody."""
        self._terminal: Counter[str] = Counter()
        self._created = 0
        self._closes = 0
        self._stale = 0
        self._sink_errors = 0

    # ------------------------------------------------------------------ lookups

    def get(self, request_id: RequestId) -> RequestRecord | None:
        return self._live.get(request_id)

    def outcome(self, request_id: RequestId) -> RequestOutcome | None:
        """The terminal outcome of an ended request (kept for the last ``retain_terminal``)."""
        return self._ended.get(request_id)

    def live(self) -> list[RequestRecord]:
        return list(self._live.values())

    def __len__(self) -> int:
        return len(self._live)

    # ------------------------------------------------------------------ §4 interface

    def create(self, request: InferenceRequest, sink: RequestSink, *, max_seq: int, arrival: float,
               deadline: float) -> RequestRecord:
        """A new request in state New (§4 ``create``).

        Raises ``BadRequest`` (400) when the token counts cannot even form a request (below 1,
        or non-integers); everything else (context, capacity, availability) is admission's
        decision and is answered with an outcome, not an exception.
        """
        try:  # the machine's parameter check (Int(ge=1)) is the one check of the counts (issue #20: not two)
            machine = _INSTANCE(prompt_tokens=request.prompt_tokens, max_new_tokens=request.max_new_tokens,
                                max_seq=max_seq)
        except (TypeError, ValueError):
            for name in ("prompt_tokens", "max_new_tokens"):  # the client's fault: say which count, and why
                value = getattr(request, name)
                if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                    raise BadRequest(f"{name} must be an integer >= 1, got {value!r}", field=name) from None
            raise
        request_id = self._next_id
        self._next_id += 1
        rec = RequestRecord(request_id, request, machine, sink, arrival, deadline)
        self._live[request_id] = rec
        self._created += 1
        return rec

    @property
    def created(self) -> int:
        """Requests created so far (every ``submit`` decided, bar one refused before its record): the HTTP front reads
        which of its forwards an admission snapshot holds from it (issue #13,
        :class:`calculet.runtime.engine.admission_snapshot._Epoch`)."""
        return self._created

    def cancel(self, request_id: RequestId) -> Cancellation:
        """§4 ``cancel``: idempotent; immediate unless a job is running (then it drains)."""
        rec = self._live.get(request_id)
        if rec is None:
            ended = self._ended.get(request_id)
            if ended is None:
                raise NotFound(f"request {request_id} is unknown", request_id=request_id)
            return Cancellation(CancelResult.ALREADY_TERMINAL, ended)
        if rec.machine.state in RUNNING_STATES:
            if not rec.machine.cancel_requested:
                self.fire(rec, "cancel")
            return Cancellation(CancelResult.PENDING, None)
        self.fire(rec, "cancel")
        return Cancellation(CancelResult.CANCELLED, self._ended.get(request_id))

    def on_prefill_complete(self, request_id: RequestId, *, generation: int, job_id: int, ok: bool,
                            stop: bool, token: int | None, detail: str = "") -> Callback:
        """§4 ``on_prefill_complete``: apply the prefill job's result, or report it stale.

        ``detail`` (the CalRT return code and message of a failure) becomes the request's error
        detail if this result ends it (R19.2)."""
        return self.on_done(request_id, "prefill_running", "prefill_done", generation, job_id, ok, stop, token,
                            detail)

    def on_decode_complete(self, request_id: RequestId, *, generation: int, job_id: int, ok: bool,
                           stop: bool, token: int | None, detail: str = "") -> Callback:
        """§4 ``on_decode_complete``: apply one lane's decode result, or report it stale."""
        return self.on_done(request_id, "decode_running", "decode_done", generation, job_id, ok, stop, token,
                            detail)

    def fail(self, rec: RequestRecord, detail: str) -> str:
        """End a request that has no job in flight as Failed (ERROR) with ``detail`` (R19.2)."""
        if detail:
            rec.detail = detail
        return self.fire(rec, "fail")

    def finish(self, request_id: RequestId, reason: FinishReason | None = None) -> RequestOutcome:
        """§4 ``finish``: close a Finishing request's stream, or end a request for ``reason``.

        * Finishing → Completed (the machine already chose STOP or LENGTH);
        * ``CANCELLED`` behaves as :meth:`cancel`; ``ERROR`` fails a request that has no job
          in flight (a running one must drain first: ``TransitionNotAllowed``);
        * on an ended request it returns the stored outcome and fires nothing.
        """
        rec = self._live.get(request_id)
        if rec is None:
            ended = self._ended.get(request_id)
            if ended is None:
                raise NotFound(f"request {request_id} is unknown", request_id=request_id)
            return ended
        if rec.machine.state == "finishing" and reason in (None, rec.machine.finish_reason):
            self.fire(rec, "close")
        elif reason is FinishReason.CANCELLED:
            self.cancel(request_id)
        elif reason is FinishReason.ERROR:
            self.fire(rec, "fail")
        else:
            raise TransitionNotAllowed("RequestMachine", rec.machine.state, "finish",
                                       f"cannot finish with reason {reason!r} in this state")
        ended = self._ended.get(request_id)
        if ended is None:  # a running request that only got its cancel flag
            raise TransitionNotAllowed("RequestMachine", rec.machine.state, "finish",
                                       "a job is running; the request ends when it drains")
        return ended

    # ------------------------------------------------------------------ transitions

    def fire_all(self, recs: Sequence[RequestRecord], event: str, **args: Any) -> None:
        """:meth:`fire` of ``event`` on each of ``recs``, with the same arguments (one call per decode
        step for its lanes, issue #20): the machines fire in one generated loop
        (``RequestMachine.Instance.fire_each``: each still executes its declared transition, the monitor
        draws as for single events), then the listener and the close run per record in order — but the quiet
        moves go to :attr:`quiet_listener`, in one call when every record made the same one (a decode step's
        submit). A refusal raises after the records that moved before it were told."""
        quiet = self.quiet
        if len(recs) == 1:  # a B1 step: the one machine's own ``fire`` (the same transition, the same draw)
            rec = recs[0]
            source = rec.machine.state
            target = rec.machine.fire(event, **args)
            if source in quiet and target in quiet and target not in TERMINAL_STATES:
                if self.quiet_listener is not None:
                    self.quiet_listener(recs, source, (target,))
            else:
                self._moved(rec, source, target)
            return
        machines = [rec.machine for rec in recs]
        sources = [m.state for m in machines]
        n = len(machines)
        try:
            targets = _INSTANCE.fire_each(machines, event, **{name: [value] * n for name, value in args.items()})
        except Exception:
            for rec, machine, source in zip(recs, machines, sources):
                if machine.state != source:
                    self.tell(rec, source, machine.state)
            raise
        if n and sources.count(sources[0]) == n and targets.count(targets[0]) == n and sources[0] in quiet \
                and targets[0] in quiet and targets[0] not in TERMINAL_STATES:
            if self.quiet_listener is not None:  # one quiet move for every record (a decode step's submit)
                self.quiet_listener(recs, sources[0], targets)
            return
        for rec, source, target in zip(recs, sources, targets):
            self.tell(rec, source, target)

    def tell(self, rec: RequestRecord, source: str, target: str) -> None:
        """One move of a batch call, told as it is: a quiet one to the quiet listener, any other by :meth:`_moved`."""
        quiet = self.quiet
        if source in quiet and target in quiet and target not in TERMINAL_STATES:
            if self.quiet_listener is not None:
                self.quiet_listener((rec,), source, (target,))
        else:
            self._moved(rec, source, target)

    def _moved(self, rec: RequestRecord, source: str, target: str) -> None:
        """After a transition of ``rec`` that is not quiet: the listener (reclaim), and the close on entering a
        terminal state."""
        listener = self._listener
        if listener is not None:
            listener(rec, source, target)
        if target in TERMINAL_STATES and source not in TERMINAL_STATES:
            self._close(rec)

    def fire(self, rec: RequestRecord, event: str, **args: Any) -> str:
        """Fire one event; count it, reclaim through the listener, close on a terminal state."""
        machine = rec.machine
        source = machine.state
        target: str = machine.fire(event, **args)
        listener = self._listener
        if listener is not None:
            listener(rec, source, target)
        if target in TERMINAL_STATES and source not in TERMINAL_STATES:
            self._close(rec)
        return target

    def reject(self, rec: RequestRecord, http_status: int, detail: str) -> RequestOutcome:
        """Admission refused the request (§5.2 400/429/503): Failed with reason REJECTED."""
        rec.reject_status = http_status
        rec.detail = detail
        self.fire(rec, "reject")
        outcome = self._ended[rec.request_id]
        return outcome

    def deliver(self, rec: RequestRecord, token: int) -> None:
        """Hand one token to the request's sink (before any close; the machine orders them)."""
        try:
            rec.sink.token(rec.request_id, token)
        except Exception:  # a broken client must not break the actor
            self._sink_errors += 1
            log.exception("sink.token failed", extra={"request_id": rec.request_id})

    def on_done(self, request_id: RequestId, running: str, event: str, generation: int, job_id: int,
                ok: bool, stop: bool, token: int | None, detail: str = "") -> Callback:
        """``on_prefill_complete``/``on_decode_complete`` with positional arguments: the running state
        the result is for and the event it fires (the completion path calls it once per lane)."""
        rec = self._live.get(request_id)
        if rec is None:
            self._stale += 1
            return Callback(CallbackResult.STALE, "", "", "request already ended")
        machine = rec.machine
        state = machine.state
        if state != running or machine.generation != generation or machine.job_id != job_id:
            self._stale += 1
            return Callback(CallbackResult.STALE, state, state,
                            f"request is {state} on generation {machine.generation} job {machine.job_id}")
        produced = ok and token is not None
        if not produced and detail and not rec.detail:
            rec.detail = detail
        # ``fire`` inlined: one fire per lane per decode step, the arguments passed by name
        target = machine.fire(event, job=job_id, ok=produced, stop=stop)
        listener = self._listener
        if listener is not None:
            listener(rec, state, target)
        if target in TERMINAL_STATES and state not in TERMINAL_STATES:
            self._close(rec)
        if target in ("decode_ready", "finishing"):
            assert token is not None
            rec.last_token = token
            self.deliver(rec, token)
        return Callback(CallbackResult.APPLIED, state, target)

    def decode_done_each(self, recs: Sequence[RequestRecord], generation: int, job_id: int,
                         produced: Sequence[bool], stops: Sequence[bool], tokens: Sequence[int | None],
                         details: Sequence[str]) -> Sequence[str | None]:
        """:meth:`on_decode_complete` for every lane of one decode job, in lane order: the target each record
        reached, or None where the result is stale (counted, nothing fired; :meth:`_decode_done_fresh`).
        ``produced[i]``: the lane's device run and output succeeded (its token is delivered). One call per step (#20):
        the machines fire ``decode_done`` in one generated loop (``fire_each``), the quiet moves (back to Ready) are
        told to :attr:`quiet_listener` in one call, then per record the listener, close and delivery as in
        :meth:`on_done`. No listener reads another lane's request: firing first changes no outcome."""
        machines: list[Any] = []
        add = machines.append
        for rec in recs:  # the usual case: every result is current (one pass, the machines to fire)
            machine = rec.machine
            # running ⇒ live: a record leaves ``_live`` only when it enters a terminal state (``_close``)
            if machine.state != "decode_running" or machine.job_id != job_id or machine.generation != generation:
                return self._decode_done_fresh(recs, generation, job_id, produced, stops, tokens, details)
            add(machine)
        if False in produced:  # every result current from here (the step's body, no frame of its own: #20)
            for rec, ok, detail in zip(recs, produced, details):
                if not ok and detail and not rec.detail:
                    rec.detail = detail
        targets: list[str] = _INSTANCE.fire_each(machines, "decode_done", job=[job_id] * len(machines),
                                                 ok=produced, stop=stops)
        self.decode_told(recs, targets, tokens)
        return targets

    def decode_told(self, recs: Sequence[RequestRecord], targets: Sequence[str], tokens: Sequence[int | None]) -> None:
        """After every record of ``recs`` fired ``decode_done`` (a step's lanes, current): the quiet moves (back to
        Ready) told to :attr:`quiet_listener` in one call, then per record the listener, the close of an ended one
        and the delivery of its token to its sink (``deliver``, inline). The one place these rules live: the batch
        (:meth:`decode_done_each`) and the B1 step whose events fired as one composite
        (:mod:`calculet.runtime.scheduling.step_done`, issue #20) both end here."""
        listener, quiet = self._listener, self.quiet
        running_quiet = "decode_running" in quiet
        # whether a token's move is quiet (told to the quiet listener, once for the step), decided once per step
        ready_quiet = running_quiet and "decode_ready" in quiet
        quiet_listener = self.quiet_listener
        if ready_quiet and len(recs) == 1 and targets[0] == "decode_ready":  # B1's usual token: the loop below, unrolled
            rec, token = recs[0], tokens[0]
            if quiet_listener is not None:
                quiet_listener(recs, "decode_running", targets)
            rec.last_token = token
            try:
                rec.sink.token(rec.request_id, token)  # type: ignore[arg-type]
            except Exception:  # a broken client must not break the actor
                self._sink_errors += 1
                log.exception("sink.token failed", extra={"request_id": rec.request_id})
            return
        finishing_quiet = running_quiet and "finishing" in quiet
        if quiet_listener is not None and ready_quiet:
            if targets.count("decode_ready") == len(targets):  # the usual step: every lane is Ready again
                quiet_listener(recs, "decode_running", targets)
            else:
                ready = [i for i, target in enumerate(targets) if target == "decode_ready"]
                if ready:
                    quiet_listener([recs[i] for i in ready], "decode_running", [targets[i] for i in ready])
        for rec, target, token in zip(recs, targets, tokens):
            if target == "decode_ready":
                if listener is not None and not ready_quiet:
                    listener(rec, "decode_running", target)
            elif target == "finishing":
                if finishing_quiet:
                    if quiet_listener is not None:
                        quiet_listener((rec,), "decode_running", (target,))
                elif listener is not None:
                    listener(rec, "decode_running", target)
            else:  # ended without a token
                if listener is not None:
                    listener(rec, "decode_running", target)  # type: ignore[arg-type]
                if target in TERMINAL_STATES:
                    self._close(rec)
                continue
            assert token is not None
            rec.last_token = token
            try:  # ``deliver``, inlined: once per lane per decode step
                rec.sink.token(rec.request_id, token)
            except Exception:  # a broken client must not break the actor
                self._sink_errors += 1
                log.exception("sink.token failed", extra={"request_id": rec.request_id})

    def _decode_done_fresh(self, recs: Sequence[RequestRecord], generation: int, job_id: int,
                           produced: Sequence[bool], stops: Sequence[bool], tokens: Sequence[int | None],
                           details: Sequence[str]) -> list[str | None]:
        """:meth:`decode_done_each` of a step with a stale lane (its request moved on): the stale ones counted and
        given None, the others applied by :meth:`decode_done_each` (every one current then)."""
        live = self._live
        stale = {i for i, rec in enumerate(recs)
                 if (rec.machine.state != "decode_running" or rec.machine.job_id != job_id
                     or rec.machine.generation != generation or live.get(rec.request_id) is not rec)}
        self._stale += len(stale)
        fresh = [i for i in range(len(recs)) if i not in stale]
        out: list[str | None] = [None] * len(recs)
        targets = self.decode_done_each([recs[i] for i in fresh], generation, job_id, [produced[i] for i in fresh],
                                        [stops[i] for i in fresh], [tokens[i] for i in fresh],
                                        [details[i] for i in fresh])
        for i, target in zip(fresh, targets):
            out[i] = target
        return out

    def _close(self, rec: RequestRecord) -> None:
        machine = rec.machine
        state = machine.state
        reason = machine.finish_reason
        if state == "failed":
            status = rec.reject_status if reason is FinishReason.REJECTED else _FAILED_STATUS.get(reason, 500)
        else:
            status = _STATUS[state]
        outcome = RequestOutcome(rec.request_id, state, reason, machine.generated_tokens, status, rec.detail)
        del self._live[rec.request_id]
        self._terminal[reason.name] += 1
        self._ended[rec.request_id] = outcome
        if len(self._ended) > self._retain:
            self._ended.popitem(last=False)
        self._closes += 1
        try:
            rec.sink.close(outcome)
        except Exception:
            self._sink_errors += 1
            log.exception("sink.close failed", extra={"request_id": rec.request_id})

    # ------------------------------------------------------------------ statistics

    def statistics(self) -> RegistryStatistics:
        """Live requests by state are read from their machines (O(live), off the hot path)."""
        by_state = Counter(rec.machine.state for rec in self._live.values())
        return RegistryStatistics(
            created=self._created, live=len(self._live), by_state=dict(by_state),
            terminal_by_reason=dict(self._terminal), closes=self._closes,
            stale_callbacks=self._stale, sink_errors=self._sink_errors)
