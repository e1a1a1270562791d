"""The decode tick's candidate selection (§7.1, §7.2 items 1–3): which Ready sequences take the lanes.

Split from :mod:`.decode` (issue #20, size limits): :class:`~.decode.DecodeScheduler` keeps the Ready
set in order and builds the batch; this module is the one pass over that order a tick makes — merge
the tenants' heads (a heap of at most T entries), take up to ``compiled_batch`` candidates under the
tenant lane cap, and sort each popped candidate into chosen (with its KV position, lease, input token
and :class:`LaneBinding`, built from the reads that chose it), expired or invalid. It reads and pops
the bucket's queues but owns no state: the scheduler's virtual time and cap-hit count come back in
the :class:`Selection`.

B1 (CalRT 0.7.6's only batch) is that pass's trivial case, :func:`first_lane`: the least head, taken when it is
the usual candidate, else left to the pass. What a usual candidate is — :func:`validate`'s accepting case and
``reserve_batch``'s per-lane check, from the reads that chose it — is :func:`clean_lane`, the one statement both
read (issue #20: it was an inlined copy in the pass).
"""

from __future__ import annotations

import heapq
import math
from heapq import heappop, heapreplace
from typing import Any, Iterable, NamedTuple

from calculet.runtime.scheduling.decode_ready import ReadyBucket
from calculet.runtime.scheduling.kv import OPEN_STATES as open_states
from calculet.runtime.scheduling.kv import KvLaneManager, KvLease
from calculet.runtime.scheduling.profiles import ProfileSpec
from calculet.runtime.scheduling.registry import RequestRecord

_new_tuple = tuple.__new__
_NO_ROWS = ((),) * 7
"""The columns of a selection that chose no lane."""


class LaneBinding(NamedTuple):
    """One active lane: the §2 ``SequenceState`` facts the device and completion need.

    A named tuple rather than a frozen dataclass: sixteen are built per B16 tick, and a tuple
    is four times cheaper to create (bench/scheduler.py). Built where its lane is chosen
    (:func:`select_candidates`), from the reads that chose it (issue #20: no second pass).
    """

    lane: int
    request_id: int
    seq_id: int
    generation: int
    kv_lane: int
    token: int
    position: int
    tenant: str
    deadline: float


class Selection(NamedTuple):
    """One tick's candidates, popped from Ready (none of them is queued any more).

    The chosen lanes come as columns, each a tuple in lane order (lane ``i`` is ``chosen[i]``): the pass
    keeps one row per lane and transposes them once per batch (issue #20: one append per lane, not one per
    column; the batch, its reservation and its records take the tuples as they are). The row carries the
    columns the batch reads of its bindings too (KV lane, token, position): one transposition, not a second
    over the bindings."""

    chosen: tuple[RequestRecord, ...]
    bindings: tuple[LaneBinding, ...]
    """Each chosen lane's binding."""
    leases: tuple[KvLease, ...]
    """Each chosen lane's KV lease."""
    kv_machines: tuple[Any, ...]
    """Each chosen lane's KV lane machine (read while checking it; meaningful where ``reservable``)."""
    kv_lanes: tuple[int, ...]
    """Each chosen lane's KV lane (its binding's ``kv_lane``)."""
    tokens: tuple[int, ...]
    """Each chosen lane's input token (its binding's ``token``)."""
    positions: tuple[int, ...]
    """Each chosen lane's position (its binding's ``position``)."""
    oldest: float
    """The earliest ``ready_since`` of the chosen lanes (the batch's wait is measured from it; +inf: none)."""
    expired: list[RequestRecord]
    invalid: list[tuple[RequestRecord, str]]
    vt: int
    """The decode virtual time after the tick: the largest tag served so far."""
    cap_hits: int
    """How often a tenant left the merge at its lane cap while lanes were still free."""
    reservable: bool
    """Every chosen lane was seen, in the same pass, to pass ``KvLaneManager.reserve_batch``'s per-lane check for
    one more token (its lease owns it, it is in ``OPEN_STATES``, it has room): the batch's reservation needs no
    second pass (``checked_reservation``). False: ``reserve_batch`` decides, lane by lane."""


def tenant_heads(bucket: ReadyBucket, names: Iterable[str]) -> list[list[Any]]:
    """A heap of the head entry of each named tenant that has one (dead entries dropped first); a tenant
    without one leaves the bucket's index.

    The heap holds the entries themselves — ``[priority, tag, virtual finish, arrival seq, record]``,
    compared as lists: the seq is unique, so the record is never compared — and a popped entry's tenant
    is its record's (issue #20: no key tuple built per lane, none unpacked).
    """
    if names is bucket.tenants and bucket.left >= 64 and bucket.left >= len(names):
        bucket.compact()  # as many tenants have left the index as remain: its dict's slots rebuilt
        names = bucket.tenants
    heads: list[list[Any]] = []
    tenants = bucket.tenants
    for tenant in tuple(names):
        queue = tenants[tenant]
        queue.taken = 0  # its lanes in this batch since it (re)joined the merge
        # TenantQueue.head inlined for the usual queue, as the merge below reads it: every entry arrived in order,
        # its first one live (once per tenant with work and tick, issue #20)
        fifo = queue.fifo
        head = fifo[0] if fifo and not queue.heap and fifo[0][4] is not None else queue.head()
        if head is not None:
            heads.append(head)
        else:  # the index holds tenants with work only (a tick costs O(tenants with work)); its queue parked
            bucket.parked[tenant] = tenants.pop(tenant)
            bucket.left += 1
    if len(heads) > 1:  # one tenant with work (a single-tenant rotation): already a heap
        heapq.heapify(heads)
    return heads


def select_candidates(bucket: ReadyBucket, kv: KvLaneManager, profile: ProfileSpec, generation: int,
                      size: int, now: float, share: float, vt: int) -> Selection:
    """Merge the tenants' heads (a heap of at most T entries) and take up to ``size`` lanes."""
    heads = tenant_heads(bucket, bucket.tenants)  # the live head entry of each tenant with work (index compacted)
    cap, tenants, max_seq = int(share * size) or 1, bucket.tenants, profile.max_seq  # floor, at least 1
    rows: list[tuple[LaneBinding, RequestRecord, KvLease, Any, int, int, int]] = []  # a chosen lane's Selection row
    expired: list[RequestRecord] = []
    invalid: list[tuple[RequestRecord, str]] = []
    capped: list[str] = []
    (owner, lane_machines), cap_hits, lanes, reservable, oldest = kv.lease_owners(), 0, 0, True, math.inf
    while lanes < size:
        if not heads:
            if not capped:  # §7.2 item 3: the cap holds only while another tenant has a candidate
                break
            heads, capped, cap = tenant_heads(bucket, capped), [], size  # (their counts restart: no cap now)
            continue
        rec: RequestRecord = (entry := heads[0])[4]
        tenant = rec.tenant
        fifo = (queue := tenants[tenant]).fifo
        if fifo and fifo[0] is entry:  # TenantQueue.take inlined (once per lane)
            fifo.popleft()
        else:
            heappop(queue.heap)
        entry[4] = rec.entry = None
        if rec.deadline <= now:
            expired.append(rec)
        else:  # the usual lane (clean_lane); anything else asks validate why not, and reserve_batch decides
            lease, token = rec.lease, rec.last_token
            if (lane_kv := clean_lane(rec, generation, max_seq, owner, lane_machines)) is not None:
                problem = lane_kv.committed_len
            else:
                problem, reservable = validate(kv, rec, profile, generation), False
            if problem.__class__ is int:  # chosen: its lane bound here, from the reads that chose it (#20)
                kv_lane = lease.lane
                rows.append((_new_tuple(LaneBinding, (lanes, rec.request_id, lease.seq_id, generation, kv_lane,
                                                      token, problem, tenant, rec.deadline)),
                             rec, lease, lane_kv, kv_lane, token, problem))
                lanes, queue.taken = lanes + 1, queue.taken + 1
                vt, oldest = max(vt, rec.decode_tag), min(oldest, rec.ready_since)
                if lanes == size:  # full: the merge's heads and caps are scratch; a queue it emptied leaves the
                    break  # index at the next tick (tenant_heads) unless refilled first
            else:
                invalid.append((rec, problem))  # type: ignore[arg-type]
        # TenantQueue.head inlined for the usual queue: every entry arrived in order, its first one live
        head = fifo[0] if fifo and not queue.heap and fifo[0][4] is not None else queue.head()
        if head is not None and queue.taken < cap:
            heapreplace(heads, head)
            continue
        cap_hits += _leave_merge(heads, bucket, tenant, head, capped)
    bucket.count -= lanes + len(expired) + len(invalid)  # every popped candidate is in one of them
    bindings, chosen, leases, kv_machines, kv_lanes, tokens, positions = zip(*rows) if rows else _NO_ROWS
    return _new_tuple(Selection, (chosen, bindings, leases, kv_machines, kv_lanes, tokens, positions, oldest, expired,
                                  invalid, vt, cap_hits, reservable))


def _leave_merge(heads: list[list[Any]], bucket: ReadyBucket, tenant: str,
                 head: list[Any] | None, capped: list[str]) -> int:
    """``tenant`` leaves the merge: out of the index if its queue is empty, else set aside at its lane
    cap (§7.2 item 3). Returns 1 for a cap hit that left lanes free, else 0 (once per tenant per tick)."""
    heapq.heappop(heads)
    if head is None:  # out of the index, its queue parked for its return (ReadyBucket.parked)
        bucket.parked[tenant] = bucket.tenants.pop(tenant)
        bucket.left += 1
        return 0
    capped.append(tenant)
    return 1  # lanes were still free: a full batch ends the merge before any tenant leaves it


def clean_lane(rec: RequestRecord, generation: int, max_seq: int, owner: list[int], lane_machines: list[Any]) -> Any:
    """The usual candidate's KV lane machine, else None: ``rec`` passes :func:`validate` (decode_ready, of
    ``generation``, its lease owning its lane — :meth:`KvLaneManager.owned_position` read from
    :meth:`KvLaneManager.lease_owners`' ``owner`` and ``lane_machines`` — at its ``kv_length``, room in ``max_seq``,
    an input token) and its lane passes ``reserve_batch``'s per-lane check for one more token (in ``OPEN_STATES``,
    within its reservation). None: :func:`validate` says why not, or accepts it and ``reserve_batch`` decides.

    The one statement of the accepting case, read by both selections (:func:`select_candidates` per lane,
    :func:`first_lane` for B1): one call per lane, not an inlined copy per path (issue #20)."""
    machine, lease = rec.machine, rec.lease
    if (machine.state != "decode_ready" or machine.generation != generation or lease is None
            or lease.generation != generation or owner[lease.lane] != lease.lease_id):
        return None
    lane_kv = lane_machines[lease.lane]
    position = lane_kv.committed_len
    if (position != machine.kv_length or position >= max_seq or rec.last_token is None
            or lane_kv.state not in open_states or position >= lane_kv.reserved_len):
        return None
    return lane_kv


def first_lane(bucket: ReadyBucket, generation: int, max_seq: int, now: float,
               owners: tuple[list[int], list[Any]]) -> tuple[RequestRecord, Any] | None:
    """B1's selection (issue #20: CalRT 0.7.6's only batch, so every decode step's): :func:`select_candidates` for
    one lane, in its trivial case. One lane is the least head of the tenants' queues (their merge's first pop), and
    the tenant lane cap — at least one lane — cannot bind before the batch is full. When that head is the usual
    candidate (not expired, :func:`clean_lane`) it is popped from Ready and returned with its KV lane's machine:
    the batch ``select_candidates`` would build. Anything else returns None with nothing popped, and
    ``select_candidates`` decides (it pops the same head first, and sorts it as expired or invalid or takes it
    for ``reserve_batch`` to check). No rows, columns, lists or heap built for the usual step. ``owners``: the KV
    pool's :meth:`~.KvLaneManager.lease_owners`, read once by the caller (the pool's own lists, never rebound)."""
    tenants = bucket.tenants
    if len(tenants) == 1:  # one tenant with work (a single-tenant rotation): its queue's head
        for queue in tenants.values():
            fifo = queue.fifo  # TenantQueue.head inlined for the usual queue, as the merge reads it
            entry = fifo[0] if fifo and not queue.heap and fifo[0][4] is not None else queue.head()
    else:
        heads = tenant_heads(bucket, tenants)  # a heap: the least head first (empty queues leave the index)
        if not heads:
            return None
        entry = heads[0]
        queue = bucket.tenants[entry[4].tenant]
        fifo = queue.fifo
    if entry is None:
        return None
    rec: RequestRecord = entry[4]
    if rec.deadline <= now:
        return None
    lane_kv = clean_lane(rec, generation, max_seq, owners[0], owners[1])
    if lane_kv is None:
        return None
    if fifo and fifo[0] is entry:  # TenantQueue.take inlined
        fifo.popleft()
    else:
        heappop(queue.heap)
    entry[4] = rec.entry = None
    bucket.count -= 1
    return rec, lane_kv


def validate(kv: KvLaneManager, rec: RequestRecord, profile: ProfileSpec, generation: int) -> int | str:
    """§7.1 ``validate_generation_and_length``: the lane's position, or why it may not run.

    An invalid lane never reaches the device (R7.4.4).
    """
    machine = rec.machine
    if machine.state != "decode_ready":
        return f"request is {machine.state}, not decode_ready"
    if machine.generation != generation:
        return f"generation {machine.generation} != batch generation {generation}"
    lease = rec.lease
    position = None if lease is None or lease.generation != generation else kv.owned_position(lease)
    if position is None:
        return "no KV lease of this generation"
    if position != machine.kv_length:
        return f"KV committed_len {position} != request kv_length {machine.kv_length}"
    if position + 1 > profile.max_seq:
        return f"position {position} leaves no room in max_seq {profile.max_seq}"
    if rec.last_token is None:
        return "no input token"
    return position
