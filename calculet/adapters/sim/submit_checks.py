"""What the simulated NPU checks before it accepts a job (Submit), and the bytes it DMAs in.

A refused job raises :class:`~calculet.adapters.calrt.VendorError` with the CalRT code and
changes nothing. The rules are the device's side of the contract the runtime must keep: a valid
lane's position equals its sequence's committed length (§9.2, R9.2.4), an inactive lane carries
the profile's fill token and never token 0 (§7.3), a sequence is written by one job at a time, a
prefill chunk needs incremental prefill and starts on a chunk boundary (§6), and a job's buffers
fit it and are not bound to another job (§12, §14).
"""

from __future__ import annotations

import functools
import struct
from collections.abc import Callable, Mapping

from typing import NamedTuple

import numpy as np

from calculet.adapters.calrt import (
    NO_SEQUENCE,
    BufferKind,
    DecodeJob,
    JobBuffers,
    JobSpec,
    MaskContract,
    PrefillJob,
    ReturnCode,
    VendorError,
)
from calculet.adapters.sim.buffers import BufferTable, SimBuffer
from calculet.adapters.sim.calbin import SimCalbin
from calculet.adapters.sim.cost import CostModel
from calculet.adapters.sim.kv import SimKvManager, _Sequence
from calculet.machines.job import JobEngine


class Admitted(NamedTuple):
    """What an accepted job touches: its sequences, its valid lanes, and its modelled device time."""

    seqs: tuple[int, ...]
    valid_lanes: tuple[int, ...]
    duration_s: float
    held: tuple[_Sequence, ...]
    """The sequences ``seqs`` names, as the checks found them: the submit binds each to the job without a
    second lookup (issue #20)."""


_new_tuple = tuple.__new__


def payload(job: JobSpec) -> bytes:
    """The bytes the host DMAs into the job's InputBuf (tokens, positions, mask, sequences)."""
    # struct, not numpy: a decode job's few lanes pack in ~1 µs, where four small arrays cost ~10 (issue #20)
    if isinstance(job, DecodeJob):
        lanes = job.lanes
        b = len(lanes.tokens)
        return _pack(b)(*lanes.tokens, *lanes.positions, *lanes.valid, *lanes.seqs)  # ints (bools pack as 0/1)
    return np.asarray(job.tokens, dtype="<i4").tobytes()


@functools.lru_cache(maxsize=64)
def _pack(b: int) -> Callable[..., bytes]:
    """The packer of a B-lane decode payload (tokens, positions as int32; valid bits; sequence ids)."""
    return struct.Struct(f"<{b}i{b}i{b}B{b}i").pack


_BINARY = frozenset((0, 1))
"""The values a lane's ``valid`` flag may take (one set test per job, issue #20)."""


def check_target(job: JobSpec, calbins: Mapping[int, SimCalbin], poisoned: ReturnCode | None) -> SimCalbin:
    """The job's calbin: created on this device and configured, on a device no fault has poisoned (§12), and
    the job's engine one its capabilities offer (PONG needs ping/pong, §14)."""
    cb = calbins.get(job.calbin_id)
    if cb is None:
        raise VendorError(ReturnCode.NOT_FOUND, f"calbin {job.calbin_id} does not exist on this device")
    if not cb.configured_profiles:
        raise VendorError(ReturnCode.INVALID_STATE, f"calbin {cb.name!r} is not configured")
    if poisoned is not None:
        raise VendorError(ReturnCode.INVALID_STATE,
                          f"device faulted ({poisoned.name}); it accepts no job until reset (§12)")
    if job.engine is JobEngine.PONG and not cb.capabilities.ping_pong.value:
        raise VendorError(ReturnCode.NOT_SUPPORTED,
                          "engine PONG needs the ping/pong capability (§14, C1/C2), which this calbin does not offer")
    return cb


def check_decode(job: DecodeJob, cb: SimCalbin, kv: SimKvManager, cost: CostModel) -> Admitted:
    """A decode job's lanes against its profile and its sequences' committed lengths (§7.3, §9.2)."""
    b = job.compiled_batch
    if b not in cb.configured_profiles:
        raise VendorError(ReturnCode.INVALID_ARGUMENT,
                          f"profile B{b} is not configured (configured: {list(cb.configured_profiles)})")
    profile = cb.profile_of(b)
    policy = profile.inactive_policy
    # a handful of lanes: plain ints beat numpy scalars here, converted once per job (DecodeJob.lanes, issue #20)
    tokens, positions, valid, seq_ids, lanes = job.lanes
    if not _BINARY.issuperset(valid):
        raise VendorError(ReturnCode.INVALID_ARGUMENT, f"lane_valid must be 0/1, got {valid}")
    if not lanes:
        raise VendorError(ReturnCode.INVALID_ARGUMENT, "decode job with no valid lane")
    inactive = [i for i in range(b) if not valid[i]] if len(lanes) < b else ()
    if inactive and policy.mask is MaskContract.NONE:
        raise VendorError(ReturnCode.INVALID_ARGUMENT,
                          f"profile B{b} has no mask contract; lanes {inactive} cannot be inactive (§7.3)")
    for i in inactive:
        if tokens[i] != policy.fill_token:
            raise VendorError(ReturnCode.INVALID_ARGUMENT,
                              f"inactive lane {i} carries token {tokens[i]}; profile B{b} fills "
                              f"inactive lanes with {policy.fill_token} (§7.3: never pad with token 0)")
        sid = seq_ids[i]
        if sid != NO_SEQUENCE and not kv.exists(sid):
            raise VendorError(ReturnCode.NOT_FOUND, f"inactive lane {i} names unknown seq {sid}")
    held: list[_Sequence] = []
    vocab, max_seq = cb.vocab_size, profile.max_seq
    # one valid lane (every B1 job, once per token, issue #20) cannot repeat a sequence: no set to build
    seen: set[int] | None = set() if len(lanes) > 1 else None
    for i in lanes:
        sid = seq_ids[i]
        if sid == NO_SEQUENCE:
            raise VendorError(ReturnCode.INVALID_ARGUMENT, f"valid lane {i} has no sequence")
        if seen is not None:
            if sid in seen:
                raise VendorError(ReturnCode.INVALID_ARGUMENT,
                                  f"seq {sid} appears in two valid lanes (§9.2: one seq, one lane)")
            seen.add(sid)
        seq = kv.find(sid)  # one dictionary read; lookup() for the error when it is not there
        if seq is None:
            seq = kv.lookup(sid)
        tok, pos = tokens[i], positions[i]
        if not 0 <= tok < vocab:
            raise VendorError(ReturnCode.INVALID_ARGUMENT, f"lane {i} token {tok} outside vocab {cb.vocab_size}")
        if pos != seq.committed_len:
            raise VendorError(ReturnCode.INVALID_ARGUMENT,
                              f"lane {i} position {pos} != committed length {seq.committed_len} of seq {sid} "
                              "(§9.2: position equals committed_len)")
        if pos + 1 > max_seq:
            raise VendorError(ReturnCode.INVALID_ARGUMENT,
                              f"lane {i} position {pos} reaches max_seq {profile.max_seq} of profile B{b}")
        if seq.inflight_job is not None:
            raise VendorError(ReturnCode.INVALID_STATE, f"seq {sid} is being written by job {seq.inflight_job}")
        held.append(seq)
    # every lane valid (B1's one lane): the sequences are the job's own tuple, no comprehension to run
    seqs = seq_ids if len(lanes) == b else tuple([seq_ids[i] for i in lanes])
    return _new_tuple(Admitted, (seqs, lanes, cost.decode_s(b), tuple(held)))  # without the named tuple's frame


class DecodeRoute(NamedTuple):
    """What the submit checks established about the decode jobs of one buffer pair, valid until the device's
    configuration changes (a calbin, a profile, a KvManager or a buffer created, configured, reset or destroyed:
    the device forgets every route then).

    Why: the null device measures the host, and the vendor runtime makes these checks in C. Of a B1 decode step's
    contract only the lanes and the buffers' binding change from one step to the next; the job's calbin, its
    profile and its buffer pair (existence, kind, batch, calbin) are the same for every step of a configuration,
    so they are checked once, by the full checks, and :func:`decode_step` checks what changes (issue #20). Only
    jobs whose every lane is valid take a route (no inactive lane, no fill-token rule to apply per step)."""

    buffers: JobBuffers
    """The job's pair, by identity: a route is found by ``id(job.buffers)`` and kept only for that object."""
    calbin_id: int
    compiled_batch: int
    engine: JobEngine
    cb: SimCalbin
    kv: SimKvManager
    in_buf: SimBuffer
    out_buf: SimBuffer
    all_valid: tuple[int, ...]
    """``(1,) * compiled_batch``: the only ``lane_valid`` a routed job may carry."""
    vocab: int
    max_seq: int
    duration_s: float


def decode_route(job: DecodeJob, cb: SimCalbin, kv: SimKvManager, in_buf: SimBuffer, out_buf: SimBuffer,
                 cost: CostModel) -> DecodeRoute | None:
    """The route of a decode job that just passed every check of :func:`check_target`, :func:`check_decode` and
    :func:`check_buffers`, or None for a job with an inactive lane (those are checked in full each time)."""
    b = job.compiled_batch
    if len(job.lanes.active) != b:
        return None
    return DecodeRoute(job.buffers, job.calbin_id, b, job.engine, cb, kv, in_buf, out_buf, (1,) * b, cb.vocab_size,
                       cb.profile_of(b).max_seq, cost.decode_s(b))


def decode_step(job: DecodeJob, routes: Mapping[int, DecodeRoute]
                ) -> tuple[SimCalbin, SimKvManager, Admitted, SimBuffer, SimBuffer] | None:
    """A decode job that is a step of a known route (``routes``, by ``id`` of the job's buffer pair): what
    :meth:`SubmitGate.admit` returns for it when every check of :func:`check_decode` and :func:`check_buffers`
    passes, checking only what changes from one step to the next; None where any check might fail, or for a job
    of no route — the caller then runs the full checks, which raise the refusal each check names, in their order.
    The device checks the rest (closed, poisoned) before. The device's submit asks this first (issue #20: the
    gate's call and the route's lookup in one frame, once per token at B1)."""
    route = routes.get(id(job.buffers))
    if route is None:
        return None
    if (job.buffers is not route.buffers or job.calbin_id != route.calbin_id or job.engine is not route.engine
            or job.compiled_batch != route.compiled_batch):
        return None
    tokens, positions, valid, seq_ids, lanes = job.lanes
    if valid != route.all_valid or route.in_buf.bound_job is not None or route.out_buf.bound_job is not None:
        return None
    find = route.kv.find
    vocab, max_seq = route.vocab, route.max_seq
    held = []
    for i in lanes:
        seq = find(seq_ids[i])  # NO_SEQUENCE is never a sequence: None
        pos = positions[i]
        if (seq is None or not 0 <= tokens[i] < vocab or pos != seq.committed_len or pos >= max_seq
                or seq.inflight_job is not None):
            return None
        held.append(seq)
    if len(held) > 1 and len(set(seq_ids)) != len(held):
        return None  # a sequence in two lanes
    return (route.cb, route.kv, _new_tuple(Admitted, (seq_ids, lanes, route.duration_s, tuple(held))), route.in_buf,
            route.out_buf)


class SubmitGate:
    """What the device checks at submit (lock held), keeping the decode routes (:class:`DecodeRoute`) by ``id`` of
    their buffer pair. It reads the device's own tables — calbins, KvManagers, buffers — and is told to
    :meth:`forget` its routes whenever one of them, or a calbin's configured profiles, changes."""

    def __init__(self, calbins: Mapping[int, SimCalbin], kvs: Mapping[int, SimKvManager], buffers: BufferTable,
                 cost: CostModel) -> None:
        self._calbins = calbins
        self._kvs = kvs
        self._buffers = buffers
        self._cost = cost
        self.routes: dict[int, DecodeRoute] = {}
        """The routes by ``id`` of their buffer pair (read by the device's submit for a decode step; written here)."""

    def forget(self) -> None:
        """The configuration changed: every route is checked in full again at its next job."""
        self.routes.clear()

    def admit(self, job: JobSpec, decode: bool, poisoned: ReturnCode | None, epoch: int
              ) -> tuple[SimCalbin, SimKvManager, Admitted, SimBuffer, SimBuffer]:
        """The job's calbin, KvManager, what it touches and its buffers, or the refusal (VendorError) of the first
        check that fails, by the full checks — for a job that is not a step of a known route (the device tries
        :attr:`routes` with :func:`decode_step` first); a decode job that passes them opens its route. The
        engine-busy, in-flight and fault checks are the device's."""
        cb = check_target(job, self._calbins, poisoned)
        kv = self.kv_for(cb)
        cost = self._cost
        admitted = (check_decode(job, cb, kv, cost) if decode  # type: ignore[arg-type]
                    else check_prefill(job, cb, kv, cost))  # type: ignore[arg-type]
        in_buf, out_buf = check_buffers(job, cb, self._buffers, epoch)
        if decode:
            route = decode_route(job, cb, kv, in_buf, out_buf, cost)  # type: ignore[arg-type]
            if route is not None:
                self.routes[id(job.buffers)] = route
        return cb, kv, admitted, in_buf, out_buf

    def kv_for(self, cb: SimCalbin) -> SimKvManager:
        for kv in self._kvs.values():
            if kv.calbin_id == cb.calbin_id:
                return kv
        raise VendorError(ReturnCode.INVALID_STATE, f"calbin {cb.name!r} has no KvManager")


def check_prefill(job: PrefillJob, cb: SimCalbin, kv: SimKvManager, cost: CostModel) -> Admitted:
    """A prefill (or prefill chunk) against the B1 profile and its sequence (§6, §9.2)."""
    if 1 not in cb.configured_profiles:
        raise VendorError(ReturnCode.INVALID_ARGUMENT, "prefill needs the B1 profile configured")
    profile = cb.profile_of(1)
    seq = kv.lookup(job.seq_id)
    tokens = np.asarray(job.tokens)
    if tokens.dtype.kind not in "iu" or tokens.min() < 0 or tokens.max() >= cb.vocab_size:
        raise VendorError(ReturnCode.INVALID_ARGUMENT, f"prefill tokens must be integers in [0, {cb.vocab_size})")
    if job.start_position != seq.committed_len:
        raise VendorError(ReturnCode.INVALID_ARGUMENT,
                          f"prefill start {job.start_position} != committed length {seq.committed_len} of seq "
                          f"{job.seq_id} (§9.2)")
    if job.start_position > 0 and not cb.capabilities.incremental_prefill.value:
        raise VendorError(ReturnCode.NOT_SUPPORTED,
                          "prefill onto a non-empty sequence is incremental prefill, which this calbin does not "
                          "offer (§6: chunking only with explicit compiler/runtime support)")
    chunk = profile.prefill_chunk_tokens
    if job.start_position > 0 and chunk is not None and job.start_position % chunk:
        raise VendorError(ReturnCode.INVALID_ARGUMENT,
                          f"prefill chunk starts at {job.start_position}, not a multiple of the B1 profile's "
                          f"prefill_chunk_tokens {chunk} (§6)")
    if job.start_position + len(tokens) > profile.max_seq:
        raise VendorError(ReturnCode.INVALID_ARGUMENT,
                          f"prefill to {job.start_position + len(tokens)} tokens exceeds max_seq {profile.max_seq}")
    if seq.inflight_job is not None:
        raise VendorError(ReturnCode.INVALID_STATE, f"seq {job.seq_id} is being written by job {seq.inflight_job}")
    return Admitted((int(job.seq_id),), (0,), cost.prefill_s(len(tokens)), (seq,))


def check_buffers(job: JobSpec, cb: SimCalbin, table: BufferTable, epoch: int) -> tuple[SimBuffer, SimBuffer]:
    """The job's InputBuf/OutputBuf: live, of its calbin, kind and batch, and not bound (§12, §14).

    Once per job, so once per B1 token (issue #20): the pair is read in one call and, when both fit, accepted in
    one condition; anything else goes through :func:`_buffers_in_order`, which refuses as the checks are listed."""
    bufs = job.buffers
    in_buf, out_buf = table.live_pair(bufs.input.buffer_id, bufs.output.buffer_id, epoch)
    if in_buf is None or out_buf is None or in_buf is out_buf:
        return _buffers_in_order(job, cb, table, epoch)
    calbin_id, kind, batch = cb.calbin_id, job.kind, job.compiled_batch
    h_in, h_out = in_buf.handle, out_buf.handle
    if (in_buf.calbin_id == calbin_id and out_buf.calbin_id == calbin_id and h_in.kind is BufferKind.INPUT
            and h_out.kind is BufferKind.OUTPUT and h_in.job_kind is kind and h_out.job_kind is kind
            and h_in.compiled_batch == batch and h_out.compiled_batch == batch
            and in_buf.bound_job is None and out_buf.bound_job is None):
        return in_buf, out_buf
    return _buffers_in_order(job, cb, table, epoch)


def _buffers_in_order(job: JobSpec, cb: SimCalbin, table: BufferTable, epoch: int) -> tuple[SimBuffer, SimBuffer]:
    """:func:`check_buffers` one check after the other (the refusal's rc and message are the first that fails)."""
    bufs = job.buffers
    if bufs.input.buffer_id == bufs.output.buffer_id:
        raise VendorError(ReturnCode.INVALID_ARGUMENT, "input and output buffer are the same buffer")
    out: list[SimBuffer] = []
    calbin_id = cb.calbin_id
    for handle, want in ((bufs.input, BufferKind.INPUT), (bufs.output, BufferKind.OUTPUT)):
        b = table.lookup(handle, epoch)
        if b.calbin_id != calbin_id or b.handle.kind is not want or b.handle.job_kind is not job.kind \
                or b.handle.compiled_batch != job.compiled_batch:
            raise VendorError(ReturnCode.INVALID_ARGUMENT,
                              f"buffer {handle.buffer_id} ({b.handle.kind.value}, {b.handle.job_kind.value} "
                              f"B{b.handle.compiled_batch}) does not fit a {job.kind.value} B{job.compiled_batch} "
                              f"job's {want.value}")
        if b.bound_job is not None:
            raise VendorError(ReturnCode.BUFFER_IN_USE,
                              f"buffer {handle.buffer_id} is bound to job {b.bound_job}, which has not completed "
                              "(a timed-out job's buffers stay bound until reset, §12)")
        out.append(b)
    return out[0], out[1]
