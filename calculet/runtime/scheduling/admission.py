"""AdmissionController (§5.1–5.2, §5.3 limits, §6 long-task quota).

Admission answers every new request with an outcome value (DESIGN principle 4):

=====================  ======  =====================================================
outcome                status  when
=====================  ======  =====================================================
``ADMIT``              —       the generation is Ready and the budget has room now
``QUEUE``              —       it waits (budget full, model loading) until its deadline
``REJECT_INVALID``     400     prompt, or prompt + max_new_tokens, beyond the context;
                               a KV need beyond the whole KV budget; unknown tenant
``REJECT_CAPACITY``    429     waiting queue, waiting tokens, a tenant's waiting tokens
                               or QPS, or the long-task waiting quota is full
``REJECT_UNAVAILABLE`` 503     the model is draining, recovering or failed
=====================  ======  =====================================================

The service tracks tokens itself (§5.1: ``canAllocate`` is only a hint): active sequences,
KV tokens reserved (prompt + max_new_tokens per admitted request), waiting requests and
waiting prompt tokens, per tenant too. Waiting requests leave in WFQ order
(:class:`~calculet.runtime.scheduling.fairness.FairQueue`); a head that does not fit the *global*
budget blocks everything behind it (no overtaking, so a large request is never starved,
R5.3.4), while a head held back by its *own* tenant's active limit or by the long-task quota
is parked so it does not block other tenants (R5.3.6).

Decisions where the spec is silent (ambiguity 6): a request whose KV need exceeds the whole
KV budget can never be served, so it is RejectInvalid (400), like a context overflow; a
queued request whose deadline passes fails with reason DEADLINE (the machine's ``expire``).
"""

from __future__ import annotations

import enum
from collections import Counter, deque
from dataclasses import dataclass
from fractions import Fraction
from typing import Iterable

from calculet.config import CapacityBudget, LongPrefillQuota, QueuesConfig
from calculet.machines.monitor import MONITOR
from calculet.runtime.scheduling.budget_monitor import check_budget_drawn
from calculet.runtime.scheduling.fairness import FairQueue, TenantPolicy, TokenBucket, WeightedFairClock, wfq_cost
from calculet.runtime.scheduling.registry import RequestRecord
from calculet.runtime.request import InferenceRequest


BACKLOG_WINDOW_S = 60.0
"""How far back the §5.2 wait estimate looks at backlogged admissions."""
MIN_BACKLOG_SAMPLES = 8
MIN_BACKLOG_SPAN_S = 1.0


class Decision(enum.Enum):
    ADMIT = "admit"
    QUEUE = "queue"
    REJECT_INVALID = "reject_invalid"
    REJECT_CAPACITY = "reject_capacity"
    REJECT_UNAVAILABLE = "reject_unavailable"


_STATUS = {Decision.REJECT_INVALID: 400, Decision.REJECT_CAPACITY: 429, Decision.REJECT_UNAVAILABLE: 503}


@dataclass(frozen=True, slots=True)
class AdmissionOutcome:
    """§5.2 outcome, with the HTTP status hint of the rejections."""

    decision: Decision
    reason: str = ""
    retry_after_s: float | None = None
    """For a 429 whose cause has a duration (no prospect before the deadline): how long until a
    retry could fit, from the same estimate; None = the service's default."""

    @property
    def http_status(self) -> int | None:
        return _STATUS.get(self.decision)

    @property
    def rejected(self) -> bool:
        return self.decision in _STATUS


_MOVED = (-1, -1)
"""``AdmissionController._held_out`` once the budget a pass checks freed (:meth:`AdmissionController.released`:
active sequences and KV tokens): the next pass is made. The other moves need no mark: an admission from the queue
pops it and one at once finds it empty (its version moved since the blocked pass either way), and a freed
tenant-limit or long-quota slot matters only to a parked flow, which its unpark makes contend (the version moves)."""

ADMITTED = AdmissionOutcome(Decision.ADMIT)
"""The outcome of every admitted request (immutable: one value shared, none built per request, issue #20)."""
QUEUED = AdmissionOutcome(Decision.QUEUE)
"""The outcome of every queued request."""


class ModelAvailability(enum.Enum):
    """What admission needs to know of the model generation (from the ModelMachine's state)."""

    LOADING = "loading"
    READY = "ready"
    DRAINING = "draining"
    RECOVERING = "recovering"
    FAILED = "failed"
    UNLOADED = "unloaded"
    SHUTDOWN = "shutdown"

    @property
    def rejects(self) -> bool:
        """§5.2 RejectUnavailable: draining, recovering, failed (and the process shutting down)."""
        return self in (ModelAvailability.DRAINING, ModelAvailability.RECOVERING, ModelAvailability.FAILED,
                        ModelAvailability.SHUTDOWN)


_UNAVAILABLE = tuple(a for a in ModelAvailability if a.rejects)
"""The availabilities whose new requests get §5.2 RejectUnavailable (``ModelAvailability.rejects``)."""


@dataclass(frozen=True)
class TenantStatistics:
    waiting_tokens: int
    active_sequences: int
    service_tokens: int
    virtual_lag: float
    rejected_qps: int


@dataclass(frozen=True)
class AdmissionStatistics:
    """§16 admission metrics: waiting requests/tokens, outcomes, timeouts, tenant quotas."""

    waiting_requests: int
    waiting_prompt_tokens: int
    active_sequences: int
    active_kv_tokens: int
    long_admitted: int
    long_waiting: int
    outcomes: dict[str, int]
    timeouts: int
    no_prospect: int
    """§5.2: requests refused (429) because they had no prospect of service before their deadline."""
    blocked: dict[str, int]
    """Admission attempts that found the head of the queue blocked, by the limit that blocked it
    (``kv_lane`` is the §16 KV "lane wait")."""
    parked_flows: int
    tenants: dict[str, TenantStatistics]


class AdmissionController:
    """Budget accounting and the WFQ waiting queue; the scheduler fires the request events."""

    def __init__(self, budget: CapacityBudget, *, tenants: Iterable[TenantPolicy], queues: QueuesConfig,
                 long_quota: LongPrefillQuota, now: float = 0.0) -> None:
        self.budget = budget
        self.long_quota = long_quota
        self.tenants = {t.name: t for t in tenants}
        self.wfq = WeightedFairClock({t.name: t.weight for t in self.tenants.values()}, queues.wfq_decode_weight)
        self._buckets = {t.name: TokenBucket(t.qps, max(t.qps, Fraction(1)), now)
                         for t in self.tenants.values() if t.qps is not None}
        self._queue: FairQueue[RequestRecord] = FairQueue(self._head_tag)
        self._waiting = 0
        self._waiting_tokens = 0
        self._active = 0
        self._active_kv = 0
        self._long_admitted = 0
        self._long_waiting = 0
        self._tenant_waiting: Counter[str] = Counter()
        self._tenant_active: Counter[str] = Counter()
        self._qps_rejects: Counter[str] = Counter()
        self._outcomes: Counter[str] = Counter()
        self._timeouts = 0
        self._blocked: Counter[str] = Counter()
        self.blocked_by: str | None = None
        """The budget that kept the last :meth:`next_admissible`'s head out (None: it admitted one, or found none
        that was not held back): a pass that nothing could have changed since ends the same way
        (:meth:`blocked_again`, issue #20)."""
        self._held_out = _MOVED
        """(the queue's ``version``, free lanes) at which the last :meth:`next_admissible` ended on a head held out
        by :attr:`blocked_by`; :data:`_MOVED` once a counter the pass reads moved since."""
        self._tenant_parked: dict[str, set[object]] = {}
        self._long_parked: set[object] = set()
        self._queued_cost: Counter[str] = Counter()
        self._no_prospect = 0
        self._backlog_samples: deque[tuple[float, int]] = deque()

    # ------------------------------------------------------------------ §5.2 screening

    def screen(self, request: InferenceRequest, *, max_seq: int, availability: ModelAvailability, now: float,
               long: bool) -> AdmissionOutcome | None:
        """The rejection a new request gets, or None when it may wait/enter (checks in §5.2 order)."""
        prompt, new = request.prompt_tokens, request.max_new_tokens
        tenant = self.tenants.get(request.tenant)
        if tenant is None:
            return self._count(AdmissionOutcome(Decision.REJECT_INVALID, f"unknown tenant {request.tenant!r}"))
        if request.deadline_ms is not None and request.deadline_ms < 1:
            return self._count(AdmissionOutcome(Decision.REJECT_INVALID, "deadline_ms must be >= 1"))
        if prompt > max_seq:
            return self._count(AdmissionOutcome(
                Decision.REJECT_INVALID, f"prompt of {prompt} tokens exceeds the context of {max_seq}"))
        if prompt + new > max_seq:
            return self._count(AdmissionOutcome(
                Decision.REJECT_INVALID, f"prompt {prompt} + max_new_tokens {new} exceeds the context of {max_seq}"))
        if prompt + new > self.budget.max_kv_tokens:
            return self._count(AdmissionOutcome(
                Decision.REJECT_INVALID, f"needs {prompt + new} KV tokens; the KV budget is {self.budget.max_kv_tokens}"))
        if availability in _UNAVAILABLE:  # ``availability.rejects`` without the property's call
            return self._count(AdmissionOutcome(Decision.REJECT_UNAVAILABLE, f"model is {availability.value}"))
        budget = self.budget
        if self._waiting + 1 > budget.max_waiting_requests:
            return self._count(AdmissionOutcome(
                Decision.REJECT_CAPACITY, f"{self._waiting} requests already waiting (max {budget.max_waiting_requests})"))
        if self._waiting_tokens + prompt > budget.max_waiting_prompt_tokens:
            return self._count(AdmissionOutcome(
                Decision.REJECT_CAPACITY,
                f"waiting prompt tokens would exceed {budget.max_waiting_prompt_tokens}"))
        if tenant.max_waiting_tokens is not None and self._tenant_waiting[tenant.name] + prompt > tenant.max_waiting_tokens:
            return self._count(AdmissionOutcome(
                Decision.REJECT_CAPACITY, f"tenant {tenant.name} waiting tokens would exceed {tenant.max_waiting_tokens}"))
        if long and self._long_waiting + 1 > self.long_quota.max_waiting:
            return self._count(AdmissionOutcome(
                Decision.REJECT_CAPACITY, f"long-prefill waiting quota ({self.long_quota.max_waiting}) is full"))
        bucket = self._buckets.get(tenant.name)
        if bucket is not None and not bucket.try_take(now):
            self._qps_rejects[tenant.name] += 1
            return self._count(AdmissionOutcome(Decision.REJECT_CAPACITY, f"tenant {tenant.name} is over its QPS limit"))
        return None

    def reject_no_prospect(self, wait_s: float, service_s: float, left_s: float) -> AdmissionOutcome:
        """Count and return the §5.2 RejectCapacity of a request with no prospect before its deadline."""
        self._no_prospect += 1
        return self._count(AdmissionOutcome(
            Decision.REJECT_CAPACITY,
            f"no prospect of service before the deadline: estimated wait {wait_s:.1f} s + "
            f"{service_s:.1f} s of decode > {left_s:.1f} s left",
            retry_after_s=wait_s + service_s - left_s))

    def reject_unfit(self, reason: str, retry_after_s: float | None) -> AdmissionOutcome:
        """Count and return the §5.2 RejectCapacity of a request the finish estimate cannot fit
        (issue #13: the shared-device estimate, ``Retry-After`` when it would fit)."""
        self._no_prospect += 1
        return self._count(AdmissionOutcome(Decision.REJECT_CAPACITY, reason, retry_after_s=retry_after_s))

    def shed_waiting(self) -> None:
        """An accepted request was refused while it still waited: it had no prospect after all."""
        self._no_prospect += 1

    def tenants_present(self) -> list[str]:
        """Tenants with an active sequence or a waiting request."""
        return [name for name in self.tenants if self._tenant_active[name] or self._tenant_waiting[name]]

    def record(self, outcome: AdmissionOutcome) -> AdmissionOutcome:
        """Count an outcome decided by the caller (Admit / Queue)."""
        self._outcomes[outcome.decision._value_] += 1  # _count inlined (once per request)
        return outcome

    # ------------------------------------------------------------------ waiting

    def accept(self, rec: RequestRecord) -> None:
        """``rec`` passed screening: it now holds waiting budget and has its WFQ cost (§5.3).

        Its virtual finish is computed when it reaches the head of its flow and fixed when it
        is admitted (head-of-flow tagging, :mod:`calculet.runtime.scheduling.fairness`).
        """
        machine = rec.machine  # the record's properties read these; once per request, read directly
        prompt = machine.prompt_tokens
        self._waiting += 1
        self._waiting_tokens += prompt
        self._tenant_waiting[rec.tenant] += prompt
        if rec.prefill_class == "long":
            self._long_waiting += 1
        rec.cost = wfq_cost(prompt, machine.max_new_tokens, self.wfq.decode_weight)  # WeightedFairClock.cost
        if MONITOR.enabled and next(MONITOR.draws):  # check_budget, drawn inline
            check_budget_drawn(self.budget, self._waiting, self._waiting_tokens, self._active, self._active_kv,
                               "accept")

    def enqueue(self, rec: RequestRecord) -> None:
        """``rec`` is bound to a generation and waits for budget in WFQ order."""
        rec.entry = self._queue.push((rec.tenant, rec.prefill_class == "long"), rec)
        self._queued_cost[rec.tenant] += rec.cost

    def leave_waiting(self, rec: RequestRecord) -> None:
        """``rec`` left WaitingModel/WaitingAdmission (admitted, cancelled, expired, rejected)."""
        prompt = rec.machine.prompt_tokens
        self._waiting -= 1
        self._waiting_tokens -= prompt
        self._tenant_waiting[rec.tenant] -= prompt
        if rec.prefill_class == "long":
            self._long_waiting -= 1
        entry = rec.entry
        if entry is not None and len(entry) == 3 and entry[2] is rec:
            self._queue.discard(entry)
            self._queued_cost[rec.tenant] -= rec.cost
            rec.entry = None
        if MONITOR.enabled and next(MONITOR.draws):  # check_budget, drawn inline
            check_budget_drawn(self.budget, self._waiting, self._waiting_tokens, self._active, self._active_kv,
                               "leave_waiting")

    def _head_tag(self, flow: object, rec: RequestRecord) -> int:
        return self.wfq.tag(rec.tenant, rec.cost)

    def timed_out(self) -> None:
        self._timeouts += 1

    def admissible_at_once(self, rec: RequestRecord, free_lanes: int) -> bool:
        """Would ``rec``, screened just now and neither accepted nor queued, be the next request
        :meth:`next_admissible` pops, and fit the budget now? True only when nothing else waits (no
        queued or parked request) and its flow is not held back (tenant active limit, long quota); it
        then has its WFQ cost and the virtual finish the queue's head-of-flow tagging would give it now
        (§5.3), and goes to :meth:`admitted` without holding waiting budget (AdmissionBudgetMachine's
        ``admit_now``). Otherwise (False) nothing is counted: the caller accepts and queues it and
        :meth:`next_admissible` decides, parks and counts as usual.

        Why (issue #20): a request into a budget with room went through push, peek (tagging, heap
        entry) and pop of the fair queue only to come out at once — a third of ``submit()``; then
        through accept and leave_waiting, waiting budget taken and given back in the same call."""
        if self._queue.live or self._held_back(rec) is not None or self._blocker(rec, free_lanes) is not None:
            return False
        machine = rec.machine
        rec.cost = cost = wfq_cost(machine.prompt_tokens, machine.max_new_tokens, self.wfq.decode_weight)
        rec.virtual_finish = self.wfq.tag(rec.tenant, cost)
        return True

    def _held_back(self, rec: RequestRecord) -> str | None:
        """``"tenant"`` while ``rec``'s tenant is at its active-sequence limit, ``"long"`` while long prefills
        are at their quota (§6), else None: the one statement of both rules, for the queue and the fast path."""
        tenant = self.tenants[rec.tenant]
        if tenant.max_active_sequences is not None and self._tenant_active[rec.tenant] >= tenant.max_active_sequences:
            return "tenant"
        if rec.prefill_class == "long" and self._long_admitted >= self.long_quota.max_admitted:
            return "long"
        return None

    def _blocker(self, rec: RequestRecord, free_lanes: int) -> str | None:
        """Which budget keeps ``rec`` from being admitted now (a lane, §5.1's sequences or KV tokens), or None."""
        if free_lanes < 1:
            return "kv_lane"
        if self._active + 1 > self.budget.max_sequences:
            return "max_sequences"
        machine = rec.machine
        if self._active_kv + machine.prompt_tokens + machine.max_new_tokens > self.budget.max_kv_tokens:
            return "max_kv_tokens"
        return None

    def next_admissible(self, free_lanes: int) -> RequestRecord | None:
        """Pop the next waiting request the budget admits now, in WFQ order, or None.

        A pass that would end as the last one did is answered without one (counted as it counts): the last
        pass ended on a head held out by a budget, and since then neither the queue's head (``FairQueue.version``:
        a queued submit of a flow already waiting leaves it) nor the free lanes nor the counters the checks read
        (:data:`_MOVED`) moved. Why (issue #20): every queued ``submit()`` is followed by a pass, which peeked,
        checked and counted the same blocked head again."""
        queue = self._queue
        version, lanes = self._held_out
        if version == queue.version and lanes == free_lanes:
            self._blocked[self.blocked_by] += 1  # type: ignore[index]
            return None
        while True:
            head = queue.peek()
            if head is None:
                self.blocked_by = None
                return None
            flow, tag, rec = head
            held = self._held_back(rec)
            if held is not None:
                queue.park(flow)
                parked = self._long_parked if held == "long" else self._tenant_parked.setdefault(rec.tenant, set())
                parked.add(flow)
                continue
            blocker = self._blocker(rec, free_lanes)
            self.blocked_by = blocker
            if blocker is not None:
                self._blocked[blocker] += 1
                self._held_out = (queue.version, free_lanes)
                return None
            queue.pop()
            self._queued_cost[rec.tenant] -= rec.cost
            rec.entry = None
            rec.virtual_finish = tag
            return rec

    def blocked_again(self) -> None:
        """The pass :meth:`next_admissible` would make now is the last one again — the same head, held out by the same
        budget (the scheduler knows nothing it reads has moved since): counted as that pass counts it."""
        self._blocked[self.blocked_by] += 1  # type: ignore[index]

    # ------------------------------------------------------------------ active budget

    def admitted(self, rec: RequestRecord, now: float) -> None:
        """``rec`` got its KV lease and enters prefill: it now holds active budget."""
        self._active += 1
        self._active_kv += rec.machine.prompt_tokens + rec.machine.max_new_tokens
        self._tenant_active[rec.tenant] += 1
        if rec.prefill_class == "long":
            self._long_admitted += 1
        if MONITOR.enabled and next(MONITOR.draws):  # check_budget, drawn inline
            check_budget_drawn(self.budget, self._waiting, self._waiting_tokens, self._active, self._active_kv,
                               "admitted")
        self.wfq.served(rec.tenant, rec.virtual_finish, rec.cost)
        samples = self._backlog_samples
        if self._queue.live:
            samples.append((now, self.wfq.global_tag()))
            while len(samples) > 2 and samples[0][0] < now - BACKLOG_WINDOW_S:
                samples.popleft()
        else:
            samples.clear()

    # ------------------------------------------------------------------ §5.2 prospect

    def estimated_wait(self, tenant: str, now: float) -> float | None:
        """Seconds until a new request of ``tenant`` would start, if there is a backlog.

        None when nothing waits (it is admitted as soon as budget frees) or when too little
        backlogged service has been seen to estimate a rate. While a backlog lasts, global
        virtual time advances at (service rate) / (sum of backlogged weights); the request
        starts after its tenant's queued work, so the wait is the virtual distance to its
        *start* tag over the measured rate of virtual time (§5.2 "a prospect of obtaining
        resources before the deadline"). The start, not the finish: the request's own cost
        delays it only against other tenants' requests, and an estimate that refuses work is
        better optimistic than not.
        """
        samples = self._backlog_samples
        if not len(self._queue) or len(samples) < MIN_BACKLOG_SAMPLES:
            return None
        (t0, v0), (t1, v1) = samples[0], samples[-1]
        if t1 - t0 < MIN_BACKLOG_SPAN_S or v1 <= v0 or now - t1 > BACKLOG_WINDOW_S:
            return None
        rate = (v1 - v0) / (t1 - t0)
        start = self.wfq.tag(tenant, self._queued_cost[tenant])
        return max(0, start - self.wfq.global_tag()) / rate

    def without_prospect(self, rec: RequestRecord, now: float, *, decode_step_s: float) -> AdmissionOutcome | None:
        """§5.2: the 429 of a request that would queue with no prospect of service before its deadline.

        Only while others wait (:meth:`estimated_wait`). The service time counted is
        ``max_new_tokens`` decode steps of ``decode_step_s`` (the measured step time), so a
        request that would be admitted only to expire part-way is refused now, with nothing
        spent on it. A request that could not finish by its deadline even if admitted at once
        (an open-ended one: a chat request without ``max_tokens`` asks for the rest of the
        context) may still stop early, so for it only one step is counted: its prospect is to
        start.
        """
        wait = self.estimated_wait(rec.tenant, now)
        if wait is None:
            return None
        left = rec.deadline - now
        service = rec.max_new_tokens * decode_step_s
        if service > left:
            service = decode_step_s
        if wait + service <= left:
            return None
        return self.reject_no_prospect(wait, service, left)

    def prefill_left(self, rec: RequestRecord) -> None:
        """An admitted request left PrefillReady/PrefillRunning: its long-quota slot frees."""
        if rec.is_long:
            self._long_admitted -= 1
            if self._long_parked:
                self._queue.unpark(self._long_parked)
                self._long_parked.clear()

    def released(self, rec: RequestRecord) -> None:
        """An admitted request gave its KV lease back (finishing or ended)."""
        self._held_out = _MOVED
        self._active -= 1
        self._active_kv -= rec.prompt_tokens + rec.max_new_tokens
        self._tenant_active[rec.tenant] -= 1
        if MONITOR.enabled and next(MONITOR.draws):  # check_budget, drawn inline
            check_budget_drawn(self.budget, self._waiting, self._waiting_tokens, self._active, self._active_kv,
                               "released")
        parked = self._tenant_parked.pop(rec.tenant, None)
        if parked:
            self._queue.unpark(parked)

    # ------------------------------------------------------------------ statistics

    @property
    def waiting(self) -> int:
        return self._waiting

    @property
    def active(self) -> int:
        return self._active

    def counters(self) -> tuple[int, int, int, int]:
        """(waiting, waiting prompt tokens, active, active KV tokens): the budget's four counters, without
        :meth:`statistics`' per-tenant rows — the sampled budget check reads them inside a scheduler step,
        where an O(configured tenants) call is a tick that grows with idle tenants (issue #20)."""
        return self._waiting, self._waiting_tokens, self._active, self._active_kv

    def statistics(self) -> AdmissionStatistics:
        service = self.wfq.service()
        lag = self.wfq.lag()
        tenants = {name: TenantStatistics(self._tenant_waiting.get(name, 0), self._tenant_active.get(name, 0),
                                          service.get(name, 0), float(lag[name]), self._qps_rejects.get(name, 0))
                   for name in self.tenants}
        return AdmissionStatistics(self._waiting, self._waiting_tokens, self._active, self._active_kv,
                                   self._long_admitted, self._long_waiting, dict(self._outcomes), self._timeouts,
                                   self._no_prospect, dict(self._blocked), len(self._queue.parked()), tenants)

    def _count(self, outcome: AdmissionOutcome) -> AdmissionOutcome:
        self._outcomes[outcome.decision._value_] += 1  # the Enum's value property is a Python call
        return outcome
