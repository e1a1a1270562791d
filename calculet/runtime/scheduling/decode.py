"""DecodeScheduler (§7.1–7.3): which sequences share the next decode batch, and its host tensors.

Ready sequences live in one queue per (generation, tenant) (:mod:`.ready_queue`: a heap's order, an O(1)
pop for the entries that arrive in key order, as the rotation's do), ordered by
``(priority, decode tag, virtual finish, arrival)``. The priority is the deadline for a
sequence whose deadline is *at risk* and +inf for the others, so the ones at risk go first,
earliest deadline first (§7.2 item 2), and the rest share "the same deadline" and rotate by
the *decode tag* (start-time fair queuing over output tokens): a sequence entering decode
starts at the decode virtual time (the largest tag served so far, so an idle sequence banks
no credit), and each step it is served pushes its tag back by its tenant's weighted cost of
one token (``wfq_decode_weight / weight``). Equal tags fall back to the request's WFQ
virtual finish (§5.3). Sequences therefore rotate fairly, in proportion to their tenants'
weights (R7.2.3), until a deadline needs them.

Why not strict EDF on every candidate (``batch.deadline_order: strict``, kept for the
literal reading): every request gets a deadline (120 s by default), so distinct arrivals
always have distinct deadlines and strict EDF serves concurrent streams one after another
whenever they outnumber the lanes (B1 today: 4 streams measured an inter-token P99 of 2.3 s
instead of ~170 ms). A deadline is at risk when it is within ``deadline_slack`` × the time
the sequence's remaining tokens need at the measured step time; a sequence not yet at risk
is watched (a heap by the instant it becomes at risk) and promoted at the first tick after;
once at risk it stays so (running every step gains it slack, and dropping back would make it
oscillate on the edge of its deadline).

A tick (``build_decode_batch``) merges the tenants' heads in a heap of at most T entries and
pops at most ``compiled_batch`` candidates: O(T + B log n), never a sort of everything, where T
counts only tenants with ready work (a tenant's heap leaves the index once found empty, so
configured or formerly busy tenants cost nothing, issue #20). A
tenant that reaches its lane cap (``batch.max_tenant_lane_share``) drops out of the merge,
and comes back only if no other tenant has a candidate (§7.2 item 3). Removal (cancel,
deadline, failure) marks the heap entry dead in O(1).

``on_time`` (the default, issue #13) keeps the same two-level order but does not decide "at risk"
itself: the goodput planner (:mod:`.on_time_planner`) marks a sequence at risk when its *shared-device*
fair-share finish is past its deadline (:meth:`DecodeScheduler.prioritise`), on events rather
than per tick, and sheds under overload what cannot finish; there is no watch heap.

Candidates whose deadline has passed, or that fail validation (generation, KV position,
context room, input token), are skipped and reported; the scheduler ends them (§7.2 item 1,
R7.4.4). The batch is reserved in KV (``reserve_batch``); a refusal is a returned value and
no batch is produced (R7.1.5).

Batching window (§7.2 items 4–5): with fewer candidates than lanes the tick may wait up to
``batching_window_us`` from the oldest candidate's arrival in Ready — never past the earliest
deadline minus the expected step time — and then sends the partial batch.

The per-generation containers (tenant queues, arrivals, side heaps) are :mod:`.decode_ready`'s; the
tick's pass over them (merge, lane cap, validation) is :mod:`.decode_select`'s; the batch record and its build
(the B1 case among them) are :mod:`.decode_build`'s, a mixin of :class:`DecodeScheduler`.
"""

from __future__ import annotations

import heapq
import math
from dataclasses import dataclass
from typing import Callable, Sequence

from calculet.runtime.distribution import BATCH_WAIT_BOUNDS, Distribution, DistributionSnapshot
from calculet.runtime.scheduling.asked_once import AskedOnce
from calculet.runtime.scheduling.decode_ready import ReadyBucket, push_compacting
from calculet.runtime.scheduling.decode_build import BatchBuilder, DecodeBatch, NoBatch, NoBatchReason
from calculet.runtime.scheduling.decode_select import LaneBinding
from calculet.runtime.scheduling.estimates import StepTimer
from calculet.runtime.scheduling.kv import KvLaneManager
from calculet.runtime.scheduling.profiles import ProfileSet, ProfileSpec
from calculet.runtime.scheduling.ready_queue import TenantQueue
from calculet.runtime.scheduling.registry import RequestRecord

__all__ = ["DecodeBatch", "DecodeScheduler", "DecodeStatistics", "LaneBinding", "NoBatch", "NoBatchReason"]


@dataclass(frozen=True)
class DecodeStatistics:
    """§16 batch metrics."""

    ready: int
    batches: int
    active_lanes: int
    compiled_lanes: int
    fill_ratio: float
    lane_waste: int
    last_compiled_batch: int
    last_active_lanes: int
    batch_wait_avg_s: float
    batch_wait_max_s: float
    window_waits: int
    skipped_expired: int
    skipped_invalid: int
    tenant_cap_hits: int
    kv_refusals: int
    batch_wait: DistributionSnapshot | None = None
    """Every dispatched batch's wait (§16 batch wait as a histogram)."""
    oldest_wait_s: float = 0.0
    """Age of the oldest sequence in decode Ready, any generation (§16 queues; 0 when empty)."""


class DecodeScheduler(BatchBuilder):
    """Holds Ready sequences and builds decode batches (§7)."""

    def __init__(self, kv: KvLaneManager, *, batching_window_us: int = 0, max_tenant_lane_share: float = 1.0,
                 step_times: StepTimer | None = None, step_cost: Callable[[str], int] | None = None,
                 deadline_order: str = "strict", deadline_slack: float = 2.0) -> None:
        if not 0 < max_tenant_lane_share <= 1:
            raise ValueError("max_tenant_lane_share must be in (0, 1]")
        if deadline_order not in ("strict", "at_risk", "on_time"):
            raise ValueError(f"deadline_order must be 'on_time', 'strict' or 'at_risk', got {deadline_order!r}")
        if deadline_slack < 1:
            raise ValueError("deadline_slack must be >= 1")
        self.kv = kv
        self._owners = kv.lease_owners()  # the pool's lists (lease id, machine per lane), never rebound: read once
        self.strict = deadline_order == "strict"
        self.planned = deadline_order == "on_time"
        """At risk is decided by the goodput planner (:meth:`prioritise`), not by own tokens × step."""
        self.deadline_first = False
        """``on_time`` with no latency target: every candidate by deadline (§7.2 item 2, R7.2.2), the
        order the planner's EDF schedule proves feasible; set by the on_time policy. With an ITL target
        the capped decode set rotates instead, since that cap is sized for a rotation."""
        self.slack = deadline_slack
        self.window_s = batching_window_us / 1_000_000
        self.share = max_tenant_lane_share
        self._step_times = step_times if step_times is not None else StepTimer()
        # a tenant's decode step cost (wfq_decode_weight / weight, scaled) is fixed by its configured weight (§5.3)
        # and read once per lane per step: asked once per tenant (issue #20)
        self._step_cost: AskedOnce[str, int] = AskedOnce(step_cost or (lambda tenant: 1))
        self._buckets: dict[int, ReadyBucket] = {}
        self._vt = 0
        self._seq = 0
        self._batches = 0
        self._active = 0
        self._compiled = 0
        self._last = (0, 0)
        self._wait = Distribution(BATCH_WAIT_BOUNDS)
        self._window_waits = 0
        self._expired = 0
        self._invalid = 0
        self._cap_hits = 0
        self._kv_refusals = 0

    @property
    def step_estimate_s(self) -> float:
        """The scheduler's measured decode step time (one owner: its :class:`StepTimer`)."""
        return self._step_times.decode_step_s

    # ------------------------------------------------------------------ the ready set

    def add_back(self, recs: Sequence[RequestRecord], now: float) -> None:
        """The requests of one decode step that are Ready again, in lane order: :meth:`add` for each
        (stepped when it has generated more than its prefill token), one call per step (issue #20).

        The planned order (``on_time``) without a batching window — the default — is :meth:`_push` inlined:
        its priority (the deadline when at risk or when every candidate goes by deadline, else +inf) and
        its tenant's queue, no arrivals kept (no window); a lane of another generation, and any other
        order or a window, take :meth:`_push`."""
        step_cost, vt = self._step_cost, self._vt
        if not self.planned or self.window_s > 0 or not recs:
            push = self._push
            for rec in recs:
                if rec.machine.generated_tokens > 1:
                    rec.decode_tag += step_cost[rec.tenant]
                else:
                    rec.decode_tag = vt
                push(rec, now)
            return
        generation = recs[0].machine.generation  # one batch, one generation (any other takes _push)
        bucket = self._buckets.get(generation)
        if bucket is None:
            bucket = self._buckets[generation] = ReadyBucket()
        tenants = bucket.tenants  # no batching window here: no arrivals to keep (oldest_wait)
        inf, deadline_first = math.inf, self.deadline_first
        seq = self._seq
        pushed = 0
        for rec in recs:
            tenant, machine = rec.tenant, rec.machine
            if machine.generated_tokens > 1:
                tag = rec.decode_tag = rec.decode_tag + step_cost[tenant]
            else:
                tag = rec.decode_tag = vt
            if machine.generation != generation:
                self._seq = seq
                self._push(rec, now)  # counts itself in its bucket
                seq = self._seq
                pushed += 1
                continue
            seq += 1
            entry = [rec.deadline if rec.at_risk or deadline_first else inf, tag, rec.virtual_finish, seq, rec]
            rec.entry = entry
            rec.ready_since = now
            queue = tenants.get(tenant)
            if queue is None:  # ReadyBucket.rejoin inlined: a one-stream rotation's tenant, every step
                queue = bucket.parked.pop(tenant, None)
                if queue is None:
                    queue = TenantQueue()
                tenants[tenant] = queue
            fifo = queue.fifo  # TenantQueue.push inlined (once per lane per step), its three places
            if not fifo or entry > fifo[-1]:
                fifo.append(entry)
            elif entry < fifo[0]:  # below every entry (the one served by deadline comes back first): the front
                fifo.appendleft(entry)
            else:  # behind the FIFO's last (a rotation's equal tags, by virtual finish): the heap part
                heapq.heappush(queue.heap, entry)
        bucket.count += len(recs) - pushed
        self._seq = seq

    def add(self, rec: RequestRecord, now: float, *, stepped: bool = False) -> None:
        """``rec`` entered DecodeReady at ``now``: from prefill, or after a decode step (``stepped``)."""
        if stepped:
            rec.decode_tag += self._step_cost(rec.tenant)
        else:
            rec.decode_tag = self._vt
        self._push(rec, now)

    def discard(self, rec: RequestRecord) -> bool:
        """``rec`` left DecodeReady other than into a batch (cancel, deadline, failure)."""
        entry = rec.entry
        if entry is None or len(entry) != 5 or entry[4] is not rec:
            return False
        entry[4] = None
        rec.entry = None
        self._buckets[rec.generation].count -= 1
        return True

    def restore(self, records: tuple[RequestRecord, ...]) -> None:
        """Put a built batch's candidates back (KV refusal, submit refused); arrival kept."""
        for rec in records:
            self._push(rec, rec.ready_since)

    def ready_count(self, generation: int) -> int:
        bucket = self._buckets.get(generation)
        return bucket.count if bucket is not None else 0

    def total_ready(self) -> int:
        total = 0
        for bucket in self._buckets.values():  # no generator frame: read once or twice per decode step
            total += bucket.count
        return total

    def ready_records(self) -> list[RequestRecord]:
        """Every Ready sequence's record, in no particular order (O(entries); the ITL prefill gate's
        streams, issue #13)."""
        return [entry[4] for bucket in self._buckets.values() if bucket.count
                for queue in bucket.tenants.values() for entry in queue if entry[4] is not None]

    def generations(self) -> list[int]:
        return [g for g, b in self._buckets.items() if b.count]

    def oldest_wait(self, generation: int, now: float) -> float:
        """How long the oldest Ready sequence of ``generation`` has waited at ``now`` (0 with none).

        The arrivals in time order are kept only with a batching window, their one reader per tick
        (:meth:`due`); without one this walks the Ready entries (O(ready): tests and metrics)."""
        bucket = self._buckets.get(generation)
        if bucket is None or not bucket.count:
            return 0.0
        if self.window_s > 0:
            return now - bucket.oldest_since()
        return now - min(entry[4].ready_since for queue in bucket.tenants.values() for entry in queue
                         if entry[4] is not None)

    def _earliest_deadline(self, generation: int) -> float | None:
        """The earliest candidate deadline, for the batching window's bound (§7.2 item 4).

        Under ``at_risk`` the deadlines are kept in their own heap only while a batching window
        is configured (the only reader), so a tick without one pays nothing for it.
        """
        bucket = self._buckets.get(generation)
        if bucket is None or not bucket.count:
            return None
        if not self.strict:
            deadlines = bucket.deadlines
            while deadlines and deadlines[0][2][4] is None:
                heapq.heappop(deadlines)
            return deadlines[0][0] if deadlines else None
        best: float | None = None
        for queue in bucket.tenants.values():
            head = queue.head()
            if head is not None and (best is None or head[0] < best):
                best = head[0]
        return best

    # ------------------------------------------------------------------ §7.2 items 4–5

    def due(self, generation: int, profiles: ProfileSet, now: float) -> tuple[ProfileSpec | None, float | None]:
        """The decode step's decision before any prefill is weighed (§8, §7.2 items 4–5), in one stage: the
        profile the Ready count selects when its batch should go now, else (None, the instant it must go at the
        latest), (None, None) with nothing Ready.

        A full batch goes at once; a partial one after the batching window, measured from the oldest
        candidate's entry into Ready, but never later than the earliest candidate deadline minus the expected
        step time (§7.2 item 4). With the default window of 0 every partial batch goes at the first tick
        (§7.2 item 5, R15.13). The profile is the set's for this count (``ProfileSet.by_ready``: decided once
        per count, issue #20).
        """
        bucket = self._buckets.get(generation)
        if bucket is None or not bucket.count:
            return None, None
        profile = profiles.by_ready[bucket.count]  # oldest_wait never changes the choice (profiles: ambiguity 13)
        if self.window_s <= 0 or bucket.count >= profile.compiled_batch:
            return profile, None
        fire_at = bucket.oldest_since() + self.window_s
        deadline = self._earliest_deadline(generation)
        step_s = self._step_times.decode_step_s
        if deadline is not None and deadline - step_s < fire_at:
            fire_at = deadline - step_s
        if now >= fire_at:
            return profile, None
        self._window_waits += 1
        return None, fire_at

    # ------------------------------------------------------------------ §7.1 tick

    def submitted(self, batch: DecodeBatch) -> None:
        """The batch went to the device: count it in the §16 batch metrics."""
        size, count, wait = batch.profile.compiled_batch, len(batch.active), batch.wait_s
        self._batches += 1
        self._active += count
        self._compiled += size
        self._last = (size, count)
        self._wait.add(wait)

    # ------------------------------------------------------------------ statistics

    def statistics(self, now: float | None = None) -> DecodeStatistics:
        """With ``now``, the oldest Ready sequence's age too."""
        compiled = self._compiled
        since = min((e[4].ready_since for b in self._buckets.values() for queue in b.tenants.values() for e in queue
                     if e[4] is not None), default=None)  # O(ready), at scrape time only
        oldest = max(0.0, now - since) if now is not None and since is not None else 0.0
        return DecodeStatistics(
            ready=self.total_ready(), batches=self._batches, active_lanes=self._active,
            compiled_lanes=compiled, fill_ratio=self._active / compiled if compiled else 0.0,
            lane_waste=compiled - self._active, last_compiled_batch=self._last[0],
            last_active_lanes=self._last[1],
            batch_wait_avg_s=self._wait.avg, batch_wait_max_s=self._wait.max, window_waits=self._window_waits,
            skipped_expired=self._expired, skipped_invalid=self._invalid, tenant_cap_hits=self._cap_hits,
            kv_refusals=self._kv_refusals, batch_wait=self._wait.snapshot(), oldest_wait_s=oldest)

    # ------------------------------------------------------------------ internals

    def _push(self, rec: RequestRecord, since: float) -> None:
        bucket = self._buckets.get(rec.generation)
        if bucket is None:
            bucket = self._buckets[rec.generation] = ReadyBucket()
        self._seq += 1
        deadline = rec.deadline
        priority = deadline
        if self.planned:
            if not (rec.at_risk or self.deadline_first):
                priority = math.inf
        elif not (self.strict or rec.at_risk):
            machine = rec.machine
            remaining = machine.max_new_tokens - machine.generated_tokens
            at_risk_from = deadline - self.slack * remaining * self._step_times.decode_step_s
            if at_risk_from > since:
                priority = math.inf
            else:
                rec.at_risk = True
        entry = [priority, rec.decode_tag, rec.virtual_finish, self._seq, rec]
        rec.entry = entry
        rec.ready_since = since
        queue = bucket.tenants.get(rec.tenant)
        if queue is None:
            queue = bucket.rejoin(rec.tenant)
        queue.push(entry)
        if priority == math.inf and not self.planned:
            bucket.watch = push_compacting(bucket.watch, (at_risk_from, self._seq, entry), bucket.count)
        if self.window_s > 0:  # the batching window's reads (oldest_since, its deadline bound)
            if since >= bucket.last_arrival:
                bucket.arrive(since)
                bucket.arrivals.append((since, entry))
            else:
                bucket.since = push_compacting(bucket.since, (since, self._seq, entry), bucket.count)
            if not self.strict:
                bucket.deadlines = push_compacting(bucket.deadlines, (deadline, self._seq, entry), bucket.count)
        bucket.count += 1

    def earliest_priority(self, generation: int) -> float:
        """The first ready sequence's priority: its deadline if at risk, +inf if none is (O(tenants))."""
        bucket = self._buckets.get(generation)
        if bucket is None or not bucket.count:
            return math.inf
        best = math.inf
        for queue in bucket.tenants.values():
            head = queue.head()
            if head is not None and head[0] < best:
                best = head[0]
        return best

    def order_by_deadline(self, on: bool) -> None:
        """Set :attr:`deadline_first` (the on_time policy, each replan). Turned on, every queued entry
        keyed +inf (queued under rotation) takes its deadline as priority now: an entry's key is fixed
        when it is queued, so one left at +inf would sit behind every entry queued by deadline after
        it — starved for as long as any other sequence decodes (issue #13: a B1 burst's 8-token request
        with 8 s of slack waited 7.8 s and was shed). Turned off, entries keyed by deadline keep it
        until they are served once; none waits behind them for longer than that."""
        if on == self.deadline_first:
            return
        self.deadline_first = on
        if not on:
            return
        for bucket in self._buckets.values():
            stale = [entry for queue in bucket.tenants.values() for entry in queue
                     if entry[4] is not None and entry[0] == math.inf]
            for entry in stale:
                rec = entry[4]
                entry[4] = None
                bucket.count -= 1
                self._push_by_deadline(bucket, rec)

    def prioritise(self, rec: RequestRecord) -> None:
        """The planner found ``rec`` at risk (issue #13): a queued entry takes its deadline as priority
        now; one on the device takes it when it comes back (``rec.at_risk`` is read by ``_push``)."""
        entry = rec.entry
        if entry is None or len(entry) != 5 or entry[4] is not rec or entry[0] != math.inf:
            return
        entry[4] = None
        bucket = self._buckets[rec.generation]
        bucket.count -= 1
        self._push_at_risk(bucket, rec)

    def _promote(self, bucket: ReadyBucket, now: float) -> None:
        """Entries whose deadline came at risk by ``now`` take their deadline as priority."""
        watch = bucket.watch
        while watch and watch[0][0] <= now:
            _, _, entry = heapq.heappop(watch)
            rec: RequestRecord | None = entry[4]
            if rec is None:
                continue
            entry[4] = None
            bucket.count -= 1
            self._push_at_risk(bucket, rec)

    def _push_at_risk(self, bucket: ReadyBucket, rec: RequestRecord) -> None:
        # Sticky: running it every step gains slack, and dropping back would make it
        # oscillate on the edge of its deadline.
        rec.at_risk = True
        self._push_by_deadline(bucket, rec)

    def _push_by_deadline(self, bucket: ReadyBucket, rec: RequestRecord) -> None:
        """Queue ``rec`` again (its old entry already dead) with its deadline as priority, keeping its
        tag and the time it became Ready."""
        self._seq += 1
        entry = [rec.deadline, rec.decode_tag, rec.virtual_finish, self._seq, rec]
        rec.entry = entry
        queue = bucket.tenants.get(rec.tenant)
        if queue is None:
            queue = bucket.rejoin(rec.tenant)
        queue.push(entry)
        if self.window_s > 0:  # the batching window's reads, as in _push
            bucket.since = push_compacting(bucket.since, (rec.ready_since, self._seq, entry), bucket.count)
            heapq.heappush(bucket.deadlines, (rec.deadline, self._seq, entry))
        bucket.count += 1
