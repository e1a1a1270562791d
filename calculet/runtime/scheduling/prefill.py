"""PrefillScheduler (§6): prompt-length classes, weighted round robin, chunking only when allowed.

* Prompts are classed short (≤ ``short_prefill_max_tokens``, 512), medium (≤
  ``medium_prefill_max_tokens``, 4096) or long (beyond) (R6.2). Within a class, requests are
  served in WFQ virtual-finish order (§5.3); the later chunks of a chunked prompt rotate with
  the others by start-time fair queuing (:meth:`PrefillScheduler.requeue`).
* Service opportunities — one device job each — are shared by weighted round robin over
  decode:short:medium:long (default 8:4:2:1, from ``queues.*_weight``) (R6.3, R6.4). The
  arbiter is *smooth* WRR: a deterministic interleaving whose period is the sum of the
  weights, so any 15 consecutive opportunities with all four queues non-empty split exactly
  8/4/2/1, and a long prefill gets one opportunity in 15 however much decode there is
  (R5.3.5, R17.1.5). A queue that is empty is skipped and its credit is reset: an idle queue
  does not bank opportunities.
* Each sequence's prompt is submitted in one job (R6.1, R6.5) unless the capability contract
  declares incremental prefill *and* the profile names a chunk size; then a prompt goes in
  chunks whose boundaries are multiples of that size (§6). The long-task quota that bounds
  head-of-line blocking without chunking is admission's (R6.11).
* Deadline first for at-risk work (issue #13; §7.2 item 2 "prefer the earliest deadline", the
  rule the decode side already follows, applied to the prefill that precedes a decode): a
  request the ``on_time`` planner marks at risk (:meth:`PrefillScheduler.prioritise`) is queued
  ahead of its class by deadline, and :meth:`PrefillScheduler.deadline_first` gives it the
  next service opportunity, overriding the §6 WRR, unless an at-risk decode has an
  earlier deadline. §6 leaves the weights to load experiments ("e.g. 8:4:2:1") and bounds
  nothing about order within a class; the at-risk set is the EDF prefix the overload selection
  proved feasible, so what bypasses the WRR is bounded. Everyone else keeps WFQ order within
  the class and the WRR's shares; the long-task quota is admission's and is unchanged.
* A prefill gate (issue #13, latency SLOs): a prefill runs between two decode steps and every
  stream waiting in the rotation waits for it too. With an ITL target the ``on_time`` policy
  installs :attr:`PrefillScheduler.gate` (``OnTimePolicy.prefill_fits_itl``), and a class whose
  head prefill would push a decoding stream's next token past its target is not eligible for
  this opportunity (:meth:`PrefillScheduler.eligible`; nor is any other class meanwhile): decode
  takes it, and the prefill goes once the streams that waited for the previous one have had their
  token, or the rotation has shrunk enough for a longer prompt. The WRR credits are untouched (a
  held class is simply not a candidate, as if empty for one opportunity).
* Not kept: a prefill budget per decode step with no ITL target (stall-free batching in the
  spirit of Sarathi-Serve, to make a stream's time per token independent of later arrivals and
  the finish estimate more accurate). Issue #13 measured it on the load simulator (virtual time,
  reference costs): at most one prefill between two decode steps moved calculet-b16's estimate
  P90 by -1.4 to +1.9 points on steady and bursty (34.1 -> 32.7 % at load 1) and calculet-b4's by
  -1.8 to +2.0, with fewer requests on time at b4's heaviest loads (251 -> 245, 200 -> 193); a
  token bucket of 20 % / 35 % of device time for prefills while streams decode gave 35.3 / 33.3 %.
  Without incremental prefill a prompt is one job, so a budget only moves a stall, and a stream
  living ten seconds still sees the prefills of the prompts that arrive meanwhile: steady at
  load 1 with prefills a hundred times cheaper gave 14 %. The WRR's 8:7 split already alternates.
"""

from __future__ import annotations

import heapq
from collections import Counter
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable, Collection, Mapping

from calculet.config import QueuesConfig
from calculet.clock import Clock
from calculet.runtime.scheduling.kv import KvLease
from calculet.runtime.scheduling.registry import RequestRecord

if TYPE_CHECKING:
    from calculet.runtime.scheduling.decode import DecodeScheduler

PREFILL_QUEUES = ("short", "medium", "long")
QUEUES = ("decode", *PREFILL_QUEUES)


@dataclass(frozen=True)
class WrrStatistics:
    """§16 queue metrics: the configured weights and the opportunities each queue got."""

    weights: dict[str, int]
    picks: dict[str, int]


class SmoothWrr:
    """Smooth weighted round robin (nginx's): deterministic, evenly interleaved, exact per period."""

    def __init__(self, weights: Mapping[str, int]) -> None:
        for name, weight in weights.items():
            if weight < 1:
                raise ValueError(f"WRR weight of {name!r} must be >= 1, got {weight}")
        self._weights = dict(weights)
        self._current = {name: 0 for name in weights}
        self._picks: Counter[str] = Counter()
        self._only: str | None = None
        """The queue the last choice took as the only eligible one (its credit and every other at rest), or None."""

    def choose(self, eligible: Collection[str]) -> str | None:
        """The next service opportunity among the non-empty queues (None if all are empty)."""
        if len(eligible) == 1:
            for name in eligible:
                return self.alone(name)
        self._only = None
        total = 0
        best: str | None = None
        best_credit = 0
        current = self._current
        for name, weight in self._weights.items():
            if name in eligible:
                credit = current[name] + weight
                current[name] = credit
                total += weight
                if best is None or credit > best_credit:
                    best, best_credit = name, credit
            else:
                current[name] = 0
        if best is None:
            return None
        current[best] -= total
        self._picks[best] += 1
        return best

    def alone(self, name: str) -> str | None:
        """:meth:`choose` when ``name`` is the only eligible queue (every step of a decode rotation with nothing
        queued to prefill: the scheduler asks this without building a set, issue #20). Its credit gains its weight
        and gives it back (unchanged), every other queue's is reset to 0; an unknown queue is not served (every
        credit reset). Once so, the same choice alone again changes no credit: only its pick is counted."""
        if self._only != name:
            current = self._current
            known = name in current
            for other in current:
                if other != name:
                    current[other] = 0
            if not known:
                self._only = None
                return None
            self._only = name
        self._picks[name] += 1
        return name

    def picks(self) -> dict[str, int]:
        return {name: self._picks.get(name, 0) for name in self._weights}

    def statistics(self) -> WrrStatistics:
        return WrrStatistics(dict(self._weights), self.picks())


@dataclass(frozen=True, eq=False)
class PrefillWork:
    """One prefill job (B1): a whole prompt, or one chunk of it when chunking is allowed.

    ``request_job`` is the job id the request's machine holds for the whole prefill (the
    first chunk's id); the job's own id is ``job_id``.
    """

    job_id: int
    generation: int
    request_id: int
    seq_id: int
    kv_lane: int
    start_position: int
    tokens: int
    prompt_tokens: int
    last_chunk: bool
    queue: str
    request_job: int
    lease: KvLease = field(repr=False)
    record: RequestRecord = field(repr=False)


@dataclass(frozen=True)
class PrefillStatistics:
    """§16 queue metrics: depth and oldest wait by prefill class, WRR picks, chunks."""

    depth: dict[str, int]
    oldest_wait_s: dict[str, float]
    taken: dict[str, int]
    chunked_jobs: int
    deadline_first: int = 0
    """Opportunities given to an at-risk prefill ahead of the WRR (issue #13)."""
    itl_held: int = 0
    """Opportunities at which the queued prefills were held back so every stream kept its ITL target (issue #13)."""


_NORMAL = 1
_URGENT = 0
"""Rank of a queue entry's key: urgent (at-risk) entries sort by deadline ahead of every WFQ tag."""


class PrefillScheduler:
    """Three class queues of admitted requests waiting for their (next) prefill job.

    A queue entry is ``[key, seq, record, class]``; ``key`` is ``(1, WFQ tag)``, or
    ``(0, deadline)`` for a request at risk, so at-risk prompts lead their class by deadline.
    """

    def __init__(self, queues: QueuesConfig, *, chunk_tokens: int | None = None, clock: Clock | None = None,
                 chunk_cost: Callable[[str, int], int] | None = None) -> None:
        if chunk_tokens is not None and chunk_tokens < 1:
            raise ValueError("chunk_tokens must be >= 1")
        self._config = queues
        self._clock = clock
        self.chunk_tokens = chunk_tokens
        self._heaps: dict[str, list[list[Any]]] = {q: [] for q in PREFILL_QUEUES}
        self._since: dict[str, list[tuple[float, int, list[Any]]]] = {q: [] for q in PREFILL_QUEUES}
        self._depth: Counter[str] = Counter()
        self.depth = 0
        """Entries queued over every class (``_depth``'s sum): a scheduler step with none asks no class whether it
        is eligible (issue #20: a saturated decode rotation's steps)."""
        self._taken: Counter[str] = Counter()
        self._chunked = 0
        self._seq = 0
        self._chunk_cost = chunk_cost or (lambda tenant, tokens: tokens)
        self._vt: dict[str, int] = {q: 0 for q in PREFILL_QUEUES}
        """Per class, the largest tag taken so far: where a re-queued chunk starts (no banked credit)."""
        self.urgent = 0
        """Queued at-risk entries (a tick with none pays nothing for the deadline-first check)."""
        self._deadline_first = 0
        self.gate: Callable[[RequestRecord, int, float], bool] | None = None
        """``gate(head, tokens, now)``: may ``head``'s next prefill job of ``tokens`` run now? Installed by
        the ``on_time`` policy under an ITL target; None: every non-empty class is eligible."""
        self._held = 0

    def classify(self, tokens: int) -> str:
        """R6.2: the class of a prompt of ``tokens`` tokens."""
        return self._config.prefill_class(tokens)

    def next_chunk(self, remaining: int) -> int:
        """Tokens in the next job: the rest of the prompt, or one chunk when chunking is allowed."""
        if self.chunk_tokens is None or remaining <= self.chunk_tokens:
            return remaining
        return self.chunk_tokens

    def add(self, rec: RequestRecord, now: float) -> str:
        """Queue ``rec`` for its next prefill job (the whole prompt, or its next chunk); returns the class.

        The class is the *prompt's* (R6.2: "queues are classed by prompt length"), also for the
        chunks of a chunked prompt. Classing a chunk by its own size would put every chunk of a
        40K prompt in the short queue, where its early virtual finish wins each short
        opportunity until the whole prompt is done: the short prompts chunking is meant to
        protect would wait behind it as before.
        """
        rec.prefill_tag = rec.virtual_finish
        return self._push(rec, now)

    def requeue(self, rec: RequestRecord, now: float, tokens: int) -> str:
        """Queue ``rec`` for its next chunk of ``tokens`` tokens after one completed.

        Start-time fair queuing within the class, as decode rotates its sequences: the chunk's
        tag is where the request's last one left off, or the class's virtual time if that is
        later, plus the chunk's weighted cost. Kept at its first virtual finish, a chunked
        prompt would run all its chunks before any later request of its class starts, and a
        medium prompt arriving behind a 16K one would wait for all 32 of its chunks.
        """
        queue = self.classify(rec.prompt_tokens)
        rec.prefill_tag = max(rec.prefill_tag, self._vt[queue]) + self._chunk_cost(rec.tenant, tokens)
        return self._push(rec, now)

    def _push(self, rec: RequestRecord, now: float) -> str:
        queue = self.classify(rec.prompt_tokens)
        self._seq += 1
        if rec.at_risk:
            key: tuple[int, float] = (_URGENT, rec.deadline)
            self.urgent += 1
        else:
            key = (_NORMAL, rec.prefill_tag)
        entry = [key, self._seq, rec, queue]
        rec.entry = entry
        rec.ready_since = now
        heapq.heappush(self._heaps[queue], entry)
        heapq.heappush(self._since[queue], (now, self._seq, entry))
        self._depth[queue] += 1
        self.depth += 1
        return queue

    def discard(self, rec: RequestRecord) -> bool:
        entry = rec.entry
        if entry is None or entry[2] is not rec:
            return False
        entry[2] = None
        rec.entry = None
        self._depth[entry[3]] -= 1
        self.depth -= 1
        if entry[0][0] == _URGENT:
            self.urgent -= 1
        return True

    def prioritise(self, rec: RequestRecord) -> None:
        """The planner found ``rec`` at risk (issue #13): a queued prefill moves ahead of its class,
        by deadline (``rec.at_risk`` is set; a later :meth:`add`/:meth:`requeue` reads it)."""
        entry = rec.entry
        if not self.queued(rec) or entry is None or entry[0][0] == _URGENT or not rec.at_risk:
            return
        since = rec.ready_since
        self.discard(rec)
        self._push(rec, since)

    def urgent_head(self) -> tuple[float, str] | None:
        """(deadline, class) of the earliest at-risk queued prefill, or None."""
        if not self.urgent:
            return None
        best: tuple[float, str] | None = None
        for queue, heap in self._heaps.items():
            while heap and heap[0][2] is None:
                heapq.heappop(heap)
            if heap and heap[0][0][0] == _URGENT and (best is None or heap[0][0][1] < best[0]):
                best = (heap[0][0][1], queue)
        return best

    def deadline_first(self, eligible: Collection[str], decode: DecodeScheduler, generation: int) -> str | None:
        """The class whose at-risk prefill takes this opportunity ahead of the §6 WRR, or None (issue #13).

        §7.2 item 2 (prefer the earliest deadline) over the whole device: the at-risk set is the
        EDF prefix the ``on_time`` selection proved feasible, so its earliest deadline goes first,
        prefill or decode. When decode is due and its first ready sequence's priority (its deadline
        if at risk) is no later, decode keeps the opportunity and the WRR decides. The WRR's credits
        are left as they were, so everyone else keeps its share. (An at-risk *decode* does not take
        the opportunity from a prefill that is not at risk: tried in issue #13, it cut the admitted
        requests shed on B1 but starved the other tenants' prefills behind a noisy tenant's at-risk
        streams — Jain 0.53 on noisy-neighbour — while the admission margin alone sheds none.)
        """
        if not self.urgent:
            return None
        head = self.urgent_head()
        if head is None or head[1] not in eligible or (
                "decode" in eligible and decode.earliest_priority(generation) <= head[0]):
            return None
        self._deadline_first += 1
        return head[1]

    def queued(self, rec: RequestRecord) -> bool:
        entry = rec.entry
        return entry is not None and len(entry) == 4 and entry[2] is rec and isinstance(entry[3], str)

    def nonempty(self) -> set[str]:
        return {q for q, n in self._depth.items() if n > 0}

    def eligible(self, now: float) -> set[str]:
        """The classes that may take this service opportunity: every non-empty one, unless the
        :attr:`gate` holds the head of one of them (the entry :meth:`take` would pop, an at-risk one
        leading its class; its job charged at most one chunk) — then none. Held together: a head
        may wait for the decode rotation to shrink, and a prompt of another class slipping a new
        stream into it meanwhile would make that wait unbounded."""
        queues = {q for q, n in self._depth.items() if n > 0}
        gate = self.gate
        if gate is None or not queues:
            return queues
        for queue in queues:
            heap = self._heaps[queue]
            while heap and heap[0][2] is None:
                heapq.heappop(heap)
            head: RequestRecord = heap[0][2]
            if not gate(head, self.next_chunk(head.prompt_tokens), now):
                self._held += 1
                return set()
        return queues

    def take(self, queue: str) -> RequestRecord:
        """Pop the head (smallest tag) of ``queue``; it must be non-empty."""
        heap = self._heaps[queue]
        while True:
            entry = heapq.heappop(heap)
            rec: RequestRecord | None = entry[2]
            if rec is not None:
                entry[2] = None
                rec.entry = None
                self._depth[queue] -= 1
                self.depth -= 1
                self._taken[queue] += 1
                if entry[0][0] == _URGENT:
                    self.urgent -= 1
                if rec.prefill_tag > self._vt[queue]:
                    self._vt[queue] = rec.prefill_tag
                return rec

    def restore(self, rec: RequestRecord) -> None:
        """Put back a request whose job was not submitted; its place (its tag) is kept."""
        self._push(rec, rec.ready_since)

    def count_chunk(self) -> None:
        self._chunked += 1

    def statistics(self) -> PrefillStatistics:
        now = self._clock.now() if self._clock is not None else None
        oldest: dict[str, float] = {}
        for queue, since in self._since.items():
            while since and since[0][2][2] is None:
                heapq.heappop(since)
            oldest[queue] = now - since[0][0] if since and now is not None else 0.0
        return PrefillStatistics({q: self._depth.get(q, 0) for q in PREFILL_QUEUES}, oldest,
                                 {q: self._taken.get(q, 0) for q in PREFILL_QUEUES}, self._chunked,
                                 self._deadline_first, self._held)
