"""Baseline policies: what the scheduler must beat, simulated in virtual time on the same cost model.

§1 lists two things that exist today and must not be mistaken for NPU batching:

* **B1 serial FCFS** — the current product: one request at a time on the B1 graph, its prefill
  then all its decode steps, first come first served;
* **software multi-slot** (llama.cpp-style) — N slots share the B1 device: each decode step
  serves one slot's sequence in round robin and prefills of new requests are interleaved with
  the decode steps, first come first served. It improves time-to-first-token under load but
  not throughput: every step still computes one lane.

Both are small discrete-event simulators charging every job the device time of
:class:`calculet.adapters.sim.cost.CostModel` — the same class the simulated NPU uses, so
baseline and scheduler figures are comparable in one run (DESIGN principle 10). They emit the
records of :mod:`calculet.loadsim.analysis`.

Rules shared by both (and by the scheduler, §7.2 item 1):

* a request expires at ``arrival + min(cancel_after_s, deadline_ms/1000)`` (reason
  ``cancelled`` or ``deadline``); a waiting request leaves the queue at that instant; a running
  one ends at the first job boundary at or after it, and the output of a job that ends at or
  after the expiry is discarded (the request was no longer clean while its job ran);
* the prefill yields the first token; each decode step yields one token; a request finishes
  with ``length`` after ``max_new_tokens`` tokens (there is no stop token in simulation);
* at a job boundary, arrivals up to that instant are queued before the next job is chosen;
* with ``max_waiting_requests`` set, an arrival that finds that many requests waiting is
  rejected with ``reject_capacity`` (§5.2); by default the queue is unbounded, as today.

The serial simulator computes each request's service in closed form (one pass, cumulative
sums); the multi-slot one steps job by job. With one slot the two policies coincide, which the
tests use to check one implementation against the other.
"""

from __future__ import annotations

import heapq
import math
from collections import deque
from dataclasses import dataclass
from typing import Callable, Mapping, Sequence

import numpy as np

from calculet.adapters.sim.cost import CostModel
from calculet.errors import DefinitionError
from calculet.loadsim.analysis import RunSummary, SimBatchRecord, SimRequestRecord, summarize
from calculet.loadsim.workload import SimRequest

__all__ = ["BaselineRun", "simulate_serial_fcfs", "simulate_multi_slot", "device_bound_limit", "BASELINES"]

REJECT_CAPACITY = "reject_capacity"


@dataclass(frozen=True)
class BaselineRun:
    """Records of one baseline run; ``requests`` are in ``request_id`` order (the input order)."""

    policy_name: str
    requests: tuple[SimRequestRecord, ...]
    batches: tuple[SimBatchRecord, ...]
    end_s: float
    """When the last job ended (or the last request was dealt with)."""

    def summary(self, **kwargs: object) -> RunSummary:
        """:func:`~calculet.loadsim.analysis.summarize` of this run (keyword arguments passed on)."""
        return summarize(self.requests, self.batches, **kwargs)  # type: ignore[arg-type]


def device_bound_limit(cost_model: CostModel, max_profile: int) -> float:
    """Output tokens/s if every lane of the largest profile were always busy and the host cost nothing.

    One engine running back-to-back ``B = max_profile`` decode steps. Ping/pong overlap is not
    counted: §14 says two in-flight jobs do not automatically mean 2B lanes computing, and a
    bound that assumed it would be a claim the hardware has not proved.
    """
    if isinstance(max_profile, bool) or not isinstance(max_profile, int) or max_profile < 1:
        raise DefinitionError(f"max_profile must be an integer >= 1, got {max_profile!r}")
    return cost_model.device_bound_tokens_per_s(max_profile)


def _expiry(req: SimRequest, enforce_deadlines: bool) -> tuple[float, str | None]:
    """When and why the request stops being worth serving (``inf, None``: never)."""
    cancel = math.inf if req.cancel_after_s is None else req.arrival_s + req.cancel_after_s
    deadline = (math.inf if req.deadline_ms is None or not enforce_deadlines
                else req.arrival_s + req.deadline_ms / 1000.0)
    if cancel == math.inf and deadline == math.inf:
        return math.inf, None
    return (cancel, "cancelled") if cancel <= deadline else (deadline, "deadline")


def _check(requests: Sequence[SimRequest], host_overhead_s: float, max_waiting_requests: int | None) -> list[int]:
    if host_overhead_s < 0:
        raise DefinitionError(f"host_overhead_s must be >= 0, got {host_overhead_s}")
    if max_waiting_requests is not None and max_waiting_requests < 0:
        raise DefinitionError(f"max_waiting_requests must be >= 0, got {max_waiting_requests}")
    for i, r in enumerate(requests):
        if r.max_new_tokens < 1 or r.prompt_tokens < 1:
            raise DefinitionError(f"request {i}: prompt_tokens and max_new_tokens must be >= 1")
    return sorted(range(len(requests)), key=lambda i: requests[i].arrival_s)


def simulate_serial_fcfs(requests: Sequence[SimRequest], cost: CostModel, *, host_overhead_s: float = 0.0,
                         max_waiting_requests: int | None = None, enforce_deadlines: bool = True) -> BaselineRun:
    """B1 serial FCFS (§1, the current product): one request owns the device from prefill to last token.

    ``host_overhead_s`` is added to every job (prefill or decode step) to model host time.
    """
    order = _check(requests, host_overhead_s, max_waiting_requests)
    step = host_overhead_s + cost.decode_s(1)
    records: dict[int, SimRequestRecord] = {}
    batches: list[SimBatchRecord] = []
    free = 0.0
    # wait-end markers of admitted requests, to count the queue an arrival finds:
    # (wait_end, still_waiting_at_equal_time) — a request starting at t is still queued when an
    # arrival at t is processed (arrivals first), one expiring at t has already left.
    waiting: list[tuple[float, bool]] = []
    for i in order:
        req = requests[i]
        a = req.arrival_s
        while waiting and (waiting[0][0] < a or (waiting[0][0] == a and not waiting[0][1])):
            heapq.heappop(waiting)
        if max_waiting_requests is not None and len(waiting) >= max_waiting_requests:
            records[i] = SimRequestRecord.for_request(i, req, admitted=False, rejection_reason=REJECT_CAPACITY,
                                                      finish_s=a, finish_reason="rejected")
            continue
        expiry, why = _expiry(req, enforce_deadlines)
        start = max(a, free)
        if expiry <= start:
            heapq.heappush(waiting, (expiry, False))
            records[i] = SimRequestRecord.for_request(i, req, admitted=True, finish_s=expiry, finish_reason=why)
            continue
        heapq.heappush(waiting, (start, True))
        prefill_end = start + host_overhead_s + cost.prefill_s(req.prompt_tokens)
        times = np.cumsum(np.concatenate(([prefill_end], np.full(req.max_new_tokens - 1, step))))
        delivered = int(np.searchsorted(times, expiry, side="left"))  # tokens strictly before expiry
        decode_jobs = min(delivered, req.max_new_tokens) - 1 + (1 if 0 < delivered < req.max_new_tokens else 0)
        for k in range(max(decode_jobs, 0)):
            batches.append(SimBatchRecord(start_s=float(times[k]), compiled_batch=1, active_lanes=1, wait_s=0.0))
        if delivered == req.max_new_tokens:
            finish, reason = float(times[-1]), "length"
        else:
            finish, reason = float(times[delivered]), why
        tokens = tuple(times[:delivered].tolist())
        records[i] = SimRequestRecord.for_request(
            i, req, admitted=True, service_start_s=start, first_token_s=tokens[0] if tokens else None,
            token_times_s=tokens, finish_s=finish, finish_reason=reason)
        free = finish
    end = max([free] + [r.finish_s for r in records.values() if r.finish_s is not None])
    return BaselineRun("b1-serial-fcfs", tuple(records[i] for i in range(len(requests))), tuple(batches), end)


@dataclass
class _Seq:
    """A request in a slot (mutable simulation state, never exposed)."""

    index: int
    expiry: float
    reason: str | None
    service_start: float
    tokens: list[float]
    ready_since: float


def simulate_multi_slot(requests: Sequence[SimRequest], cost: CostModel, slots: int = 4, *,
                        host_overhead_s: float = 0.0, max_waiting_requests: int | None = None,
                        enforce_deadlines: bool = True) -> BaselineRun:
    """Software multi-slot round robin on the B1 device (§1, llama.cpp-style).

    At each job boundary: if a slot is free and a request waits, its prefill runs next (FCFS) —
    unless the previous job was a prefill and some slot is decoding, in which case one decode
    step runs first, so prefills and decode steps alternate under load. A decode step serves
    the next decoding slot after the last one served (round robin), one token, compiled B1.
    """
    if isinstance(slots, bool) or not isinstance(slots, int) or slots < 1:
        raise DefinitionError(f"slots must be an integer >= 1, got {slots!r}")
    order = _check(requests, host_overhead_s, max_waiting_requests)
    sim = _MultiSlot(requests, cost, slots, order, host_overhead_s=host_overhead_s,
                     max_waiting_requests=max_waiting_requests, enforce_deadlines=enforce_deadlines)
    while sim.turn():
        pass
    records = sim.records
    end = max([sim.t] + [r.finish_s for r in records.values() if r.finish_s is not None])
    return BaselineRun(f"multi-slot-rr-{slots}", tuple(records[i] for i in range(len(requests))),
                       tuple(sim.batches), end)


class _MultiSlot:
    """The state of one multi-slot round-robin simulation: slots, the FCFS queue, the records."""

    def __init__(self, requests: Sequence[SimRequest], cost: CostModel, slots: int, order: list[int], *,
                 host_overhead_s: float, max_waiting_requests: int | None, enforce_deadlines: bool) -> None:
        self.requests = requests
        self.cost = cost
        self.slots = slots
        self.order = order
        self.host_overhead_s = host_overhead_s
        self.max_waiting_requests = max_waiting_requests
        self.step = host_overhead_s + cost.decode_s(1)
        self.records: dict[int, SimRequestRecord] = {}
        self.batches: list[SimBatchRecord] = []
        self.slot: list[_Seq | None] = [None] * slots
        self.queue: deque[int] = deque()
        self.queued: set[int] = set()
        self.expiries: list[tuple[float, int]] = []   # heap over queued requests (lazy deletion)
        self.info = {i: _expiry(requests[i], enforce_deadlines) for i in order}
        self.t = 0.0
        self.nxt = 0
        self.rr = slots - 1
        self.last_kind = ""

    def turn(self) -> bool:
        """One job boundary: arrivals, expiries, then a prefill, a decode step or an idle jump.
        False once nothing is left to do."""
        self._arrivals()
        self._expire_waiting(self.t)
        for s in range(self.slots):  # §7.2 item 1: expired sequences leave before the next job
            seq = self.slot[s]
            if seq is not None and seq.expiry <= self.t:
                self._finish(s, self.t, seq.reason)
        while self.queue and self.queue[0] not in self.queued:
            self.queue.popleft()
        decoding = [s for s in range(self.slots) if self.slot[s] is not None]
        free_slot = next((s for s in range(self.slots) if self.slot[s] is None), None)
        if self.queue and free_slot is not None and (not decoding or self.last_kind != "prefill"):
            self._prefill(free_slot)
        elif decoding:
            self._decode()
        elif self.nxt < len(self.order):
            self.t = max(self.t, self.requests[self.order[self.nxt]].arrival_s)
            self.last_kind = ""
        else:
            self._expire_waiting(math.inf)
            return False
        return True

    def _arrivals(self) -> None:
        """Queue every request that has arrived by now (or reject it when the queue is full)."""
        requests, order = self.requests, self.order
        while self.nxt < len(order) and requests[order[self.nxt]].arrival_s <= self.t:
            i = order[self.nxt]
            self.nxt += 1
            a = requests[i].arrival_s
            self._expire_waiting(a)
            if self.max_waiting_requests is not None and len(self.queued) >= self.max_waiting_requests:
                self.records[i] = SimRequestRecord.for_request(i, requests[i], admitted=False,
                                                               rejection_reason=REJECT_CAPACITY, finish_s=a,
                                                               finish_reason="rejected")
                continue
            self.queue.append(i)
            self.queued.add(i)
            heapq.heappush(self.expiries, (self.info[i][0], i))

    def _prefill(self, free_slot: int) -> None:
        i = self.queue.popleft()
        self.queued.discard(i)
        expiry, reason = self.info[i]
        t = self.t
        self.slot[free_slot] = _Seq(i, expiry, reason, t, [], t)
        self.t = t + self.host_overhead_s + self.cost.prefill_s(self.requests[i].prompt_tokens)
        self._complete(free_slot, self.t)
        self.last_kind = "prefill"

    def _decode(self) -> None:
        slots = self.slots
        s = next(k % slots for k in range(self.rr + 1, self.rr + 1 + slots) if self.slot[k % slots] is not None)
        self.rr = s
        seq = self.slot[s]
        assert seq is not None
        t = self.t
        self.batches.append(SimBatchRecord(start_s=t, compiled_batch=1, active_lanes=1, wait_s=t - seq.ready_since))
        self.t = t + self.step
        self._complete(s, self.t)
        self.last_kind = "decode"

    def _expire_waiting(self, upto: float) -> None:
        while self.expiries and self.expiries[0][0] <= upto:
            when, i = heapq.heappop(self.expiries)
            if i in self.queued:
                self.queued.discard(i)
                self.records[i] = SimRequestRecord.for_request(i, self.requests[i], admitted=True, finish_s=when,
                                                               finish_reason=self.info[i][1])

    def _finish(self, s: int, when: float, reason: str | None) -> None:
        seq = self.slot[s]
        assert seq is not None
        tokens = tuple(seq.tokens)
        self.records[seq.index] = SimRequestRecord.for_request(
            seq.index, self.requests[seq.index], admitted=True, service_start_s=seq.service_start,
            first_token_s=tokens[0] if tokens else None, token_times_s=tokens, finish_s=when,
            finish_reason=reason)
        self.slot[s] = None

    def _complete(self, s: int, end: float) -> None:
        """A job of slot ``s`` ended at ``end``: deliver its token unless the request expired."""
        seq = self.slot[s]
        assert seq is not None
        if seq.expiry <= end:
            self._finish(s, end, seq.reason)
            return
        seq.tokens.append(end)
        seq.ready_since = end
        if len(seq.tokens) == self.requests[seq.index].max_new_tokens:
            self._finish(s, end, "length")


BASELINES: Mapping[str, Callable[..., BaselineRun]] = {
    "b1-serial-fcfs": simulate_serial_fcfs,
    "multi-slot-rr": simulate_multi_slot,
}
"""The baseline policies by name (``multi-slot-rr`` takes a ``slots`` argument)."""
