"""The simulated KvManager: per-sequence KV caches with a committed length (§5.1, §9).

Each KvManager sequence (seq_id) owns a K and a V store ``[layers, capacity, heads, head_dim]``
(float64, grown on demand up to the calbin's ``max_seq``) and a ``committed_len``. Only the
device writes KV, and only when a job completes OK (§9.2: committed_len grows only when device
and output succeed); a failed, timed-out or discarded job leaves the store byte-identical.

§9.3 context operations: append/decode is the job path; ``remove_tokens_at_end`` and
``do_shift`` are implemented as the SDK implements them (their *use* is gated by the capability
contract, R9.3.2/R9.3.8); copy prefix, keep one sequence, position add/div and save/load
session are the SDK's empty implementations and always fail with NOT_SUPPORTED — never a silent
success (R9.3.4–R9.3.7).

Seq ids start at 1 and are never reused within a KvManager, so a stale id fails NOT_FOUND instead
of touching someone else's sequence.
"""

from __future__ import annotations

import hashlib
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import NoReturn

import numpy as np

from calculet.adapters.calrt import KvSeqId, ReturnCode, VendorError, vendor_boundary


@dataclass(frozen=True)
class KvManagerStatistics:
    kv_manager_id: int
    calbin_id: int
    valid: bool
    max_sequences: int
    max_seq: int
    live_sequences: int
    allocated_total: int
    freed_total: int
    committed_tokens: int
    inflight_sequences: int
    not_supported_calls: int


@dataclass(frozen=True, eq=False)
class KvSequenceView:
    """A copy of one sequence's KV, for tests and golden checks (not a CalRT call).

    ``backing_sha256`` hashes the whole backing store (committed and uncommitted rows) and the
    committed length, so "byte-identical before and after" is one comparison.
    """

    seq_id: int
    committed_len: int
    k: np.ndarray | None
    v: np.ndarray | None
    backing_sha256: str


class _Sequence:
    __slots__ = ("seq_id", "committed_len", "k", "v", "inflight_job")

    def __init__(self, seq_id: int) -> None:
        self.seq_id = seq_id
        self.committed_len = 0
        self.k: np.ndarray | None = None
        self.v: np.ndarray | None = None
        self.inflight_job: int | None = None


class SimKvManager:
    """KvManager of one configured calbin on a :class:`~calculet.adapters.sim.device.SimVirtualDevice`.

    Shares the device's lock: KV is read and committed by job completion on the device's worker,
    so every access is serialised with it.
    """

    def __init__(self, *, kv_manager_id: int, calbin_id: int, lock: threading.RLock, max_sequences: int,
                 max_seq: int, shape: tuple[int, int, int] | None, on_invalid: Callable[[], str]) -> None:
        self.kv_manager_id = kv_manager_id
        self.calbin_id = calbin_id
        self._lock = lock
        self.max_sequences = max_sequences
        self.max_seq = max_seq
        self._shape = shape  # (layers, heads, head_dim); None in numerics-off mode
        self._seqs: dict[int, _Sequence] = {}
        self.find: Callable[[int], _Sequence | None] = self._seqs.get
        """The sequence, or None when it is not allocated (an invalidated manager holds none): ``exists`` and
        ``lookup`` in one dictionary read, for the submit checks and the commit of every job — the dictionary's
        own ``get``, no frame of this manager's per lane (issue #20; ``_seqs`` is cleared, never rebound)."""
        self._next_id = 1
        self._valid = True
        self._why_invalid = on_invalid
        self._allocated = 0
        self._freed = 0
        self._not_supported = 0

    # --- CalRT KvManager surface -----------------------------------------------------------

    @vendor_boundary("KvManager.canAllocate")
    def can_allocate(self, seq_num: int) -> bool:
        """A hint about free sequence slots only; token lengths are the service's job (§5.1)."""
        with self._lock:
            self._check_valid()
            if seq_num < 0:
                raise VendorError(ReturnCode.INVALID_ARGUMENT, f"seq_num {seq_num} < 0")
            return self.max_sequences - len(self._seqs) >= seq_num

    @vendor_boundary("KvManager.allocateSequence")
    def allocate_sequence(self) -> KvSeqId:
        with self._lock:
            self._check_valid()
            if len(self._seqs) >= self.max_sequences:
                raise VendorError(ReturnCode.OUT_OF_MEMORY,
                                  f"all {self.max_sequences} KV sequence slots are allocated")
            seq_id = self._next_id
            self._next_id += 1
            self._seqs[seq_id] = _Sequence(seq_id)
            self._allocated += 1
            return KvSeqId(seq_id)

    @vendor_boundary("KvManager.freeSequence")
    def free_sequence(self, seq_id: KvSeqId) -> None:
        """Refused while a job writes the sequence: a forced free is not a cancellation (§12)."""
        with self._lock:
            seq = self._idle(seq_id, "free")
            del self._seqs[seq.seq_id]
            self._freed += 1

    @vendor_boundary("KvManager.committedLength")
    def committed_length(self, seq_id: KvSeqId) -> int:
        with self._lock:
            return self._get(seq_id).committed_len

    @vendor_boundary("KvManager.RemoveTokensAtEnd")
    def remove_tokens_at_end(self, seq_id: KvSeqId, n_tokens: int) -> None:
        """Drop the last ``n_tokens`` committed tokens (the SDK's RemoveTokensAtEnd).

        Implemented for real so the boundary tests the spec requires (§9.3, R9.3.3) can run; the
        runtime enables it only through its capability gate (R9.3.2).
        """
        with self._lock:
            seq = self._idle(seq_id, "RemoveTokensAtEnd")
            if n_tokens < 0 or n_tokens > seq.committed_len:
                raise VendorError(ReturnCode.INVALID_ARGUMENT,
                                  f"cannot remove {n_tokens} tokens from seq {seq_id} of length {seq.committed_len}")
            seq.committed_len -= n_tokens

    @vendor_boundary("KvManager.DoShift")
    def do_shift(self, seq_id: KvSeqId, n_tokens: int) -> None:
        """Discard the first ``n_tokens`` and move the rest to the front (the SDK's DoShift).

        The kept keys retain the positions they were computed at while new tokens continue at the
        shorter committed length: exactly the "llama semantics not closed-loop" the spec warns
        about (§9.3, C1/C2), so the runtime keeps it disabled (R9.3.8).
        """
        with self._lock:
            seq = self._idle(seq_id, "DoShift")
            if n_tokens < 0 or n_tokens > seq.committed_len:
                raise VendorError(ReturnCode.INVALID_ARGUMENT,
                                  f"cannot shift {n_tokens} tokens out of seq {seq_id} of length {seq.committed_len}")
            keep = seq.committed_len - n_tokens
            if seq.k is not None and seq.v is not None and n_tokens:
                seq.k[:, :keep] = seq.k[:, n_tokens:seq.committed_len].copy()
                seq.v[:, :keep] = seq.v[:, n_tokens:seq.committed_len].copy()
            seq.committed_len = keep

    @vendor_boundary("KvManager.CopyPrefix")
    def copy_prefix(self, src: KvSeqId, dst: KvSeqId, n_tokens: int) -> None:
        self._empty("copy prefix/sequence")

    @vendor_boundary("KvManager.KeepOneSeq")
    def keep_one_sequence(self, seq_id: KvSeqId) -> None:
        self._empty("keep one seq")

    @vendor_boundary("KvManager.PositionAdd")
    def position_add(self, seq_id: KvSeqId, p0: int, p1: int, delta: int) -> None:
        self._empty("position add")

    @vendor_boundary("KvManager.PositionDiv")
    def position_div(self, seq_id: KvSeqId, p0: int, p1: int, divisor: int) -> None:
        self._empty("position div")

    @vendor_boundary("KvManager.SaveSession")
    def save_session(self, seq_id: KvSeqId) -> bytes:
        self._empty("save session KV")

    @vendor_boundary("KvManager.LoadSession")
    def load_session(self, seq_id: KvSeqId, data: bytes) -> None:
        self._empty("load session KV")

    def statistics(self) -> KvManagerStatistics:
        with self._lock:
            return KvManagerStatistics(
                kv_manager_id=self.kv_manager_id, calbin_id=self.calbin_id, valid=self._valid,
                max_sequences=self.max_sequences, max_seq=self.max_seq, live_sequences=len(self._seqs),
                allocated_total=self._allocated, freed_total=self._freed,
                committed_tokens=sum(s.committed_len for s in self._seqs.values()),
                inflight_sequences=sum(1 for s in self._seqs.values() if s.inflight_job is not None),
                not_supported_calls=self._not_supported)

    # --- simulator inspection (not part of CalRT) ------------------------------------------

    @vendor_boundary("SimKvManager.inspect")
    def inspect(self, seq_id: KvSeqId) -> KvSequenceView:
        with self._lock:
            seq = self._get(seq_id)
            digest = hashlib.sha256(str(seq.committed_len).encode())
            k: np.ndarray | None = None
            v: np.ndarray | None = None
            if seq.k is not None and seq.v is not None:
                digest.update(seq.k.tobytes())
                digest.update(seq.v.tobytes())
                k = seq.k[:, :seq.committed_len].copy()
                v = seq.v[:, :seq.committed_len].copy()
            return KvSequenceView(seq.seq_id, seq.committed_len, k, v, digest.hexdigest())

    # --- device-side helpers (called with the device lock held) -----------------------------

    @property
    def valid(self) -> bool:
        return self._valid

    def invalidate(self) -> None:
        """ResetConfiguration / destroy: every sequence and its KV are gone."""
        self._valid = False
        self._seqs.clear()

    def live_sequences(self) -> int:
        return len(self._seqs)

    def inflight_sequences(self) -> int:
        return sum(1 for s in self._seqs.values() if s.inflight_job is not None)

    def lookup(self, seq_id: int) -> _Sequence:
        return self._get(seq_id)

    def exists(self, seq_id: int) -> bool:
        return seq_id in self._seqs

    def past(self, seq: _Sequence) -> tuple[np.ndarray, np.ndarray]:
        """Views of the committed K/V ``[L, committed_len, H, Dh]`` (numerics on)."""
        if seq.k is None or seq.v is None:
            assert self._shape is not None
            layers, heads, dim = self._shape
            empty = np.empty((layers, 0, heads, dim))
            return empty, empty
        return seq.k[:, :seq.committed_len], seq.v[:, :seq.committed_len]

    def commit(self, seq: _Sequence, k_rows: np.ndarray | None, v_rows: np.ndarray | None, n_tokens: int) -> None:
        """Make a completed job's rows visible: write at committed_len and advance it."""
        start = seq.committed_len
        end = start + n_tokens
        if k_rows is not None and v_rows is not None and self._shape is not None:
            layers, heads, dim = self._shape
            cap = 0 if seq.k is None else seq.k.shape[1]
            if end > cap:
                new_cap = min(self.max_seq, max(end, 2 * cap, 16))
                k = np.zeros((layers, new_cap, heads, dim))
                v = np.zeros((layers, new_cap, heads, dim))
                if seq.k is not None and seq.v is not None:
                    k[:, :cap] = seq.k
                    v[:, :cap] = seq.v
                seq.k, seq.v = k, v
            assert seq.k is not None and seq.v is not None
            seq.k[:, start:end] = k_rows
            seq.v[:, start:end] = v_rows
        seq.committed_len = end

    # --- internals -------------------------------------------------------------------------

    def _check_valid(self) -> None:
        if not self._valid:
            raise VendorError(ReturnCode.INVALID_STATE,
                              f"KvManager {self.kv_manager_id} is no longer valid ({self._why_invalid()})")

    def _get(self, seq_id: int) -> _Sequence:
        self._check_valid()
        seq = self._seqs.get(int(seq_id))
        if seq is None:
            raise VendorError(ReturnCode.NOT_FOUND, f"KV sequence {seq_id} is not allocated in KvManager "
                                                    f"{self.kv_manager_id}")
        return seq

    def _idle(self, seq_id: int, what: str) -> _Sequence:
        seq = self._get(seq_id)
        if seq.inflight_job is not None:
            raise VendorError(ReturnCode.INVALID_STATE,
                              f"{what} on seq {seq_id} refused: job {seq.inflight_job} is writing it "
                              "(§12: a forced operation is not a cancellation)")
        return seq

    def _empty(self, what: str) -> NoReturn:
        with self._lock:
            self._not_supported += 1
        raise VendorError(ReturnCode.NOT_SUPPORTED,
                          f"{what} is an empty implementation in CalRT 0.7.6 (§9.3); it is disabled")
