"""Execution of one job on the simulated NPU: the numerics, and the commit of its KV and outputs.

A job's numerics are computed from the model and the committed KV (outside the device lock, so a
real-time device's worker does not block the host), then committed under the lock when the job
completes. Commit is the §9.2 transaction: only a lane whose return code is OK writes its KV
rows; a failed lane, and every lane of a failed job, leaves its sequence byte-identical. Inactive
lanes never write KV and return NaN logits only when the profile says so (§7.3). With numerics
off the device returns the deterministic pseudo-tokens of :func:`pseudo_next_token` and no logits.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from dataclasses import dataclass
from typing import NamedTuple

import numpy as np

from calculet.adapters.calrt import NO_SEQUENCE, DecodeJob, JobSpec, JobTicket, LaneResult, PrefillJob, ReturnCode
from calculet.adapters.sim.calbin import SimCalbin
from calculet.adapters.sim.fault_effects import discards_numerics
from calculet.adapters.sim.faults import FaultDecision
from calculet.adapters.sim.kv import SimKvManager
from calculet.adapters.sim.model import pseudo_next_token


@dataclass
class SimJob:
    """A job the device accepted: on its engine until it completes or a reset discards it."""

    ticket: JobTicket
    spec: JobSpec
    calbin: SimCalbin
    kv: SimKvManager
    fault: FaultDecision | None
    finish: float | None
    """Completion instant; None for a job that never completes (an injected TIMEOUT)."""
    epoch: int
    seqs: tuple[int, ...]
    executing: bool = False


@dataclass
class Computed:
    """Numerics of a job, computed outside the lock and committed under it."""

    k_rows: list[np.ndarray | None]
    v_rows: list[np.ndarray | None]
    logits: list[np.ndarray | None]
    tokens: list[int | None]


class _Ones(dict[int, tuple[int, ...]]):
    """``(1,) * b`` per compiled batch, built once (a decode lane processes one token)."""

    def __missing__(self, b: int) -> tuple[int, ...]:
        self[b] = ones = (1,) * b
        return ones


_ONES = _Ones()


class _Flags(dict[tuple[int, ...], tuple[bool, ...]]):
    """A decode job's 0/1 ``lane_valid`` as bools, built once per pattern: a step's lanes repeat the same few
    patterns (the first ``n`` of ``B`` lanes), and converting per job cost a call per lane (issue #20)."""

    def __missing__(self, valid: tuple[int, ...]) -> tuple[bool, ...]:
        flags = tuple(map(bool, valid))
        if len(self) < 4096:  # bounded: arbitrary masks of a wide profile must not grow it without end
            self[valid] = flags
        return flags


_FLAGS = _Flags()


class LaneLayout(NamedTuple):
    """A job's lanes as the device sees them: a prefill is one valid lane of its prompt's tokens.

    A named tuple, built once per job on the completion path (issue #20: a frozen dataclass cost a third more);
    ``n_valid`` and ``valid_tokens`` are what the status counters report (§14)."""

    valid: tuple[bool, ...]
    seq_ids: tuple[int, ...]
    positions: tuple[int, ...]
    n_tokens: tuple[int, ...]
    n_valid: int
    valid_tokens: int

    @classmethod
    def of(cls, spec: JobSpec) -> LaneLayout:
        if isinstance(spec, DecodeJob):
            lanes = spec.lanes  # plain Python values, converted once per job (issue #20)
            n = len(lanes.active)
            return cls(_FLAGS[lanes.valid], lanes.seqs, lanes.positions, _ONES[spec.compiled_batch], n, n)
        n = len(spec.tokens)
        return cls((True,), (int(spec.seq_id),), (spec.start_position,), (n,), 1, n)


def compute(job: SimJob, lock: threading.RLock) -> Computed | None:
    """Numerics of a job, or None when a whole-job fault means nothing will be committed."""
    if discards_numerics(job.fault, job.calbin.capabilities.lane_failure_isolation.value):
        return None
    spec = job.spec
    if isinstance(spec, DecodeJob):
        return _compute_decode(job, spec, lock)
    assert isinstance(spec, PrefillJob)
    model, kv = job.calbin.model, job.kv
    toks = np.asarray(spec.tokens)
    if model is None:
        last = pseudo_next_token(int(toks[-1]), spec.start_position + len(toks) - 1)
        return Computed([None], [None], [None], [last])
    with lock:
        past_k, past_v = kv.past(kv.lookup(spec.seq_id))
    k, v, lg = model.prefill(toks, spec.start_position, past_k, past_v)
    return Computed([k], [v], [lg], [int(np.argmax(lg))])


def _compute_decode(job: SimJob, spec: DecodeJob, lock: threading.RLock) -> Computed:
    model, kv = job.calbin.model, job.kv
    b = spec.compiled_batch
    lanes = spec.lanes.active
    k_rows: list[np.ndarray | None] = [None] * b
    v_rows: list[np.ndarray | None] = [None] * b
    logits: list[np.ndarray | None] = [None] * b
    tokens: list[int | None] = [None] * b
    if model is None:
        token_ids, positions = spec.lanes.tokens, spec.lanes.positions
        for i in lanes:
            tokens[i] = pseudo_next_token(token_ids[i], positions[i])
        return Computed(k_rows, v_rows, logits, tokens)
    with lock:
        pasts = [kv.past(kv.lookup(spec.lanes.seqs[i])) for i in lanes]
    nk, nv, lg = model.decode(np.asarray(spec.token_ids)[list(lanes)], np.asarray(spec.positions)[list(lanes)],
                              pasts)
    for j, i in enumerate(lanes):
        k_rows[i], v_rows[i], logits[i] = nk[j][:, None], nv[j][:, None], lg[j]
        tokens[i] = int(np.argmax(lg[j]))
    return Computed(k_rows, v_rows, logits, tokens)


def commit(job: SimJob, computed: Computed | None, layout: LaneLayout, lane_rc: Sequence[ReturnCode],
           output: np.ndarray | None, numerics: bool) -> tuple[list[LaneResult], int]:
    """Commit the OK lanes' KV and logits (device lock held); the lane results and KV tokens written.

    Every sequence the job held is released for the next job, whatever the outcome: the valid lanes' sequences,
    released as their lanes are committed (they are the job's ``seqs``, in lane order).
    """
    kv = job.kv
    find = kv.find
    lanes: list[LaneResult] = []
    append = lanes.append
    kv_written = 0
    ok = ReturnCode.OK
    released = 0
    valid, positions, n_tokens = layout.valid, layout.positions, layout.n_tokens
    for i, sid in enumerate(layout.seq_ids):
        seq = find(sid) if sid != NO_SEQUENCE else None
        if not valid[i]:
            policy = job.calbin.profile_of(job.spec.compiled_batch).inactive_policy
            row = np.full(job.calbin.vocab_size, np.nan) if policy.inactive_logits_returned and numerics else None
            if row is not None and output is not None:
                output[i] = row
            append(LaneResult(i, sid, False, ok, positions[i], seq.committed_len if seq else 0, row, None))
            continue
        assert seq is not None
        rc = lane_rc[i]
        logits = token = None
        if rc is ok and computed is not None:
            logits, token = computed.logits[i], computed.tokens[i]
            kv.commit(seq, computed.k_rows[i], computed.v_rows[i], n_tokens[i])
            kv_written += n_tokens[i]
            if logits is not None:
                if output is not None:
                    output[i] = logits
                logits = logits.copy()
        seq.inflight_job = None
        released += 1
        append(LaneResult(i, sid, True, rc, positions[i], seq.committed_len, logits, token))
    if released != len(job.seqs):  # not the valid lanes' sequences after all: release each one it held
        for sid in job.seqs:
            held = find(sid)
            if held is not None:
                held.inflight_job = None
    return lanes, kv_written
