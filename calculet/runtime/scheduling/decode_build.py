"""The decode batch a tick builds (§7.1, §7.3): its records and the build, split from :mod:`.decode` (issue #20).

Why its own module: :class:`~.decode.DecodeScheduler` keeps the Ready set in order (priorities, tags, at risk:
§7.2's rules stay there); this is the step that turns the head of that order into a job — the selection's pass
(:mod:`.decode_select`), the KV reservation, the host tensors and the :class:`DecodeBatch` record — as a mixin of
the scheduler (:class:`BatchBuilder`), so the build reads the scheduler's state with no extra frame per step.

B1 (CalRT 0.7.6's only batch, so every decode step of the service, issue #20) is the build's trivial case: one
lane, the Ready order's least head (:func:`.decode_select.first_lane`). When that head is the usual candidate the
batch is built from the reads that chose it — one binding, one-lane columns, the reservation of an already checked
lane — with no rows, columns, lists or heap of the general pass (it cost ~40 % of the plan side's CPU per token at
16 streams). Any other head (expired, invalid, a lane ``reserve_batch`` must judge) goes through the general pass,
which sorts it as it always did: the two paths cannot disagree on the usual lane (the same ``clean_lane`` rule),
and ``tests/unit/runtime/scheduling/test_decode_b1.py`` holds them to the same batches.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import Any, Callable, NamedTuple

import numpy as np

from calculet.errors import DefinitionError
from calculet.runtime.scheduling.decode_ready import ReadyBucket
from calculet.runtime.scheduling.decode_select import LaneBinding, first_lane, select_candidates
from calculet.runtime.scheduling.kv import KvBatchReservation, KvLaneManager, KvReservationFailure
from calculet.runtime.scheduling.profiles import ProfileSpec
from calculet.runtime.scheduling.registry import RequestRecord

_new_tuple = tuple.__new__
_ONE_LANE = (1,)
"""The lane flags of a one-lane batch (B1): one active lane."""


class DecodeBatch(NamedTuple):
    """§2 ``DecodeBatch``: generation, profile, active lanes, host tensors and KV reservation.

    Built once per tick, so a named tuple (immutable, its fields read by C descriptors): built with
    ``tuple.__new__`` it costs a third of the frozen dataclass it was, even with ``quick_init`` (issue #20: one
    object a token on B1). Compared and hashed by identity, as that dataclass (``eq=False``) was: two batches are
    two jobs, whatever they carry.

    The host tensors are kept as the Python ints the tick chose them as (``lane_tokens``,
    ``lane_positions``, ``lane_flags``, each of length ``profile.compiled_batch``; lanes
    ``0..len(active)-1`` are active and ``lane_positions[i]`` is that lane's KV ``committed_len``,
    §9.2): the device job takes them as they are. ``token_ids``, ``positions`` (int32) and
    ``lane_valid`` (uint8) are the same lanes as numpy arrays, built when read (issue #20: the
    executor path reads none of them, and building them cost two ``np.array`` per step).
    """

    job_id: int
    generation: int
    profile: ProfileSpec
    active: tuple[LaneBinding, ...]
    lane_tokens: tuple[int, ...]
    """Each lane's input token (inactive lanes: the profile's fill token, never a default 0, §7.3)."""
    lane_positions: tuple[int, ...]
    """Each lane's position (inactive lanes: the fill position)."""
    lane_flags: tuple[int, ...]
    """1 for an active lane, 0 for an inactive one."""
    kv: KvBatchReservation
    built_at: float
    wait_s: float
    records: tuple[RequestRecord, ...]
    expired: tuple[RequestRecord, ...] = ()
    invalid: tuple[tuple[RequestRecord, str], ...] = ()

    __eq__ = object.__eq__  # identity, not the fields' values (a tuple's)
    __ne__ = object.__ne__
    __hash__ = object.__hash__

    def __repr__(self) -> str:  # as the dataclass's was: the records left out
        return "DecodeBatch(" + ", ".join(f"{name}={value!r}" for name, value in zip(self._fields[:10], self)) + ")"

    @property
    def token_ids(self) -> np.ndarray:
        """``lane_tokens`` as an int32 array (built when read: tests and tools, not the executor path)."""
        return np.array(self.lane_tokens, dtype=np.int32)

    @property
    def positions(self) -> np.ndarray:
        """``lane_positions`` as an int32 array (built when read)."""
        return np.array(self.lane_positions, dtype=np.int32)

    @property
    def lane_valid(self) -> np.ndarray:
        """``lane_flags`` as a uint8 array (built when read)."""
        return np.array(self.lane_flags, dtype=np.uint8)


class NoBatchReason(enum.Enum):
    EMPTY = "empty"
    """No eligible candidate."""
    WINDOW = "window"
    """Candidates exist but the batching window is still open (see ``wake_at``)."""
    KV_RESERVATION = "kv_reservation"
    """``reserve_batch`` refused (see ``failure``); the candidates are back in Ready."""


@dataclass(frozen=True, eq=False)
class NoBatch:
    reason: NoBatchReason
    wake_at: float | None = None
    failure: KvReservationFailure | None = None
    refused: tuple[RequestRecord, ...] = field(default=(), repr=False)
    expired: tuple[RequestRecord, ...] = field(default=(), repr=False)
    invalid: tuple[tuple[RequestRecord, str], ...] = field(default=(), repr=False)


class BatchBuilder:
    """The decode scheduler's build of a batch (§7.1), a mixin of :class:`~.decode.DecodeScheduler` (see the
    module doc): it reads the Ready buckets and the counters the scheduler owns."""

    kv: KvLaneManager
    _owners: tuple[list[int], list[Any]]
    share: float
    _buckets: dict[int, ReadyBucket]
    _vt: int
    _cap_hits: int
    _expired: int
    _invalid: int
    _kv_refusals: int

    _promote: Callable[[ReadyBucket, float], None]  # DecodeScheduler's methods, which the build asks
    restore: Callable[[tuple[RequestRecord, ...]], None]

    def build_decode_batch(self, profile: ProfileSpec, generation: int, now: float,
                           job_id: int) -> DecodeBatch | NoBatch:
        """§7.1: take at most ``compiled_batch`` eligible candidates and build the batch."""
        size = profile.compiled_batch
        bucket = self._buckets.get(generation)
        if bucket is None or not bucket.count:
            return NoBatch(NoBatchReason.EMPTY)
        if bucket.watch:
            self._promote(bucket, now)
        if size == 1:  # B1, the selection's trivial case: its usual lane built here, without the general pass
            one = first_lane(bucket, generation, profile.max_seq, now, self._owners)
            if one is not None:  # what the general build makes of a one-lane selection, from the reads that chose it
                rec, lane_kv = one
                lease, token, position, tag = rec.lease, rec.last_token, lane_kv.committed_len, rec.decode_tag
                assert lease is not None and token is not None  # clean_lane read both
                if tag > self._vt:
                    self._vt = tag  # the largest tag served so far (select_candidates' vt)
                lane = lease.lane  # the reservation: checked_reservation's, which a single lane always passes
                reservation = self.kv.checked_reservation((lease,), (lane_kv,), (lane,), 1)
                binding = _new_tuple(LaneBinding, (0, rec.request_id, lease.seq_id, generation, lane, token, position,
                                                   rec.tenant, rec.deadline))
                return _new_tuple(DecodeBatch, (job_id, generation, profile, (binding,), (token,), (position,),
                                                _ONE_LANE, reservation, now, now - rec.ready_since, (rec,), (), ()))
        return self._build(bucket, profile, generation, size, now, job_id)

    def _build(self, bucket: ReadyBucket, profile: ProfileSpec, generation: int, size: int, now: float,
               job_id: int) -> DecodeBatch | NoBatch:
        """The general build: :func:`.select_candidates`' pass, the KV reservation, the padded host tensors."""
        chosen, bindings, leases, kv_machines, kv_lanes, tokens, positions, oldest, expired, invalid, self._vt, \
            cap_hits, reservable = select_candidates(bucket, self.kv, profile, generation, size, now, self.share,
                                                     self._vt)
        if cap_hits:
            self._cap_hits += cap_hits
        expired_lanes: tuple[RequestRecord, ...] = ()  # none turned away (the usual tick): no tuple built (#20)
        invalid_lanes: tuple[tuple[RequestRecord, str], ...] = ()
        if expired or invalid:
            self._expired += len(expired)
            self._invalid += len(invalid)
            expired_lanes, invalid_lanes = tuple(expired), tuple(invalid)
        if not chosen:
            return NoBatch(NoBatchReason.EMPTY, expired=expired_lanes, invalid=invalid_lanes)
        # the selection's pass checked each lane as reserve_batch would: only the batch-wide rule is left (#20)
        reservation = (self.kv.checked_reservation(leases, kv_machines, kv_lanes, 1) if reservable
                       else self.kv.reserve_batch(leases, 1))
        if isinstance(reservation, KvReservationFailure):
            self._kv_refusals += 1
            self.restore(chosen)
            bad = {lease.lease_id for lease, _ in reservation.problems}
            refused = tuple(rec for rec, lease in zip(chosen, leases) if lease.lease_id in bad)
            return NoBatch(NoBatchReason.KV_RESERVATION, failure=reservation, refused=refused, expired=expired_lanes,
                           invalid=invalid_lanes)
        count = len(chosen)
        if count < size and profile.lane_fill is None:
            self.restore(chosen)
            raise DefinitionError(f"B{size} has no inactive-lane policy; a partial batch cannot be built and "
                                  "token 0 is never a default (§7.3)")
        pad = size - count
        flags = (1,) * count
        if pad:
            fill = profile.lane_fill
            assert fill is not None
            tokens += (fill.fill_token,) * pad
            positions += (fill.fill_position,) * pad
            flags += (0,) * pad
        return _new_tuple(DecodeBatch, (job_id, generation, profile, bindings, tokens, positions, flags, reservation,
                                        now, now - oldest, chosen, expired_lanes, invalid_lanes))  # no __new__ frame
