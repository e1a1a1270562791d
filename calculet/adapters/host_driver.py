"""A synchronous host driver over any CalRT :class:`~calculet.adapters.calrt.VirtualDevice`.

The runtime's executor is asynchronous and transactional; some callers need far less: the golden
check of load step 9 (§11), device tests, and ``bench/device.py``. :class:`HostDriver` submits
one job at a time and waits for it, building jobs exactly as §7.1 says (positions from the
committed KV length, inactive lanes filled per the profile's policy — never token 0, §7.3). It
uses only the protocol, so it works unchanged against a real-CalRT adapter.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from calculet.adapters.calrt import (
    NO_SEQUENCE,
    Calbin,
    DecodeJob,
    GoldenVector,
    JobBuffers,
    JobKind,
    JobResult,
    KvManager,
    KvSeqId,
    PrefillJob,
    VirtualDevice,
    error_for,
)
from calculet.machines.job import JobEngine


@dataclass(frozen=True)
class GoldenOutcome:
    """Result of one golden check (§11 step 9)."""

    name: str
    ok: bool
    tokens: tuple[int, ...]
    expected_tokens: tuple[int, ...]
    logits_sum: float | None
    logits_l2: float | None
    detail: str


@dataclass(frozen=True)
class DriverStatistics:
    prefill_jobs: int
    decode_jobs: int
    buffers_held: int
    failed_jobs: int


class HostDriver:
    """Submit-and-wait over one configured calbin; owns one buffer pair per (kind, profile, engine)."""

    def __init__(self, device: VirtualDevice, calbin: Calbin, kv: KvManager, *, generation: int = 1,
                 timeout_s: float = 30.0) -> None:
        self.device = device
        self.calbin = calbin
        self.kv = kv
        self.generation = generation
        self.timeout_s = timeout_s
        self._buffers: dict[tuple[JobKind, int, JobEngine], JobBuffers] = {}
        self._prefills = 0
        self._decodes = 0
        self._failed = 0

    def buffers(self, kind: JobKind, compiled_batch: int, engine: JobEngine = JobEngine.PING) -> JobBuffers:
        key = (kind, compiled_batch, engine)
        if key not in self._buffers:
            self._buffers[key] = self.device.allocate_job_buffers(self.calbin, kind, compiled_batch)
        return self._buffers[key]

    def _run(self, job: PrefillJob | DecodeJob) -> JobResult:
        ticket = self.device.submit(job)
        result = self.device.wait(ticket.job_id, self.timeout_s)
        if not result.ok:
            self._failed += 1
        return result

    def prefill_job(self, seq_id: KvSeqId, tokens: Sequence[int], engine: JobEngine = JobEngine.PING) -> PrefillJob:
        """A prefill of ``tokens`` starting at the sequence's committed length."""
        return PrefillJob(generation=self.generation, calbin_id=self.calbin.calbin_id, engine=engine,
                          buffers=self.buffers(JobKind.PREFILL, 1, engine), seq_id=seq_id,
                          tokens=np.asarray(tokens, dtype=np.int32),
                          start_position=self.kv.committed_length(seq_id))

    def prefill(self, seq_id: KvSeqId, tokens: Sequence[int], engine: JobEngine = JobEngine.PING) -> JobResult:
        self._prefills += 1
        return self._run(self.prefill_job(seq_id, tokens, engine))

    def decode_job(self, compiled_batch: int, lanes: Sequence[tuple[KvSeqId, int] | None],
                   engine: JobEngine = JobEngine.PING, inactive_seqs: Sequence[int] | None = None) -> DecodeJob:
        """A decode job: ``lanes[i]`` is (seq, last token) or None for an inactive lane.

        ``inactive_seqs[i]`` may name a sequence parked in an inactive lane (its KV must not change).
        """
        if len(lanes) > compiled_batch:
            raise ValueError(f"{len(lanes)} lanes for profile B{compiled_batch}")
        policy = self.calbin.profile(compiled_batch).inactive_policy
        padded = list(lanes) + [None] * (compiled_batch - len(lanes))
        parked = list(inactive_seqs or []) + [NO_SEQUENCE] * compiled_batch
        seq_ids: list[int] = []
        tokens = np.full(compiled_batch, policy.fill_token, dtype=np.int32)
        positions = np.zeros(compiled_batch, dtype=np.int32)
        valid = np.zeros(compiled_batch, dtype=np.uint8)
        for i, lane in enumerate(padded):
            if lane is None:
                seq_ids.append(int(parked[i]))
                continue
            seq, token = lane
            seq_ids.append(int(seq))
            tokens[i] = token
            positions[i] = self.kv.committed_length(seq)
            valid[i] = 1
        return DecodeJob(generation=self.generation, calbin_id=self.calbin.calbin_id, compiled_batch=compiled_batch,
                         engine=engine, buffers=self.buffers(JobKind.DECODE, compiled_batch, engine),
                         seq_ids=tuple(seq_ids), token_ids=tokens, positions=positions, lane_valid=valid)

    def decode(self, compiled_batch: int, lanes: Sequence[tuple[KvSeqId, int] | None],
               engine: JobEngine = JobEngine.PING, inactive_seqs: Sequence[int] | None = None) -> JobResult:
        self._decodes += 1
        return self._run(self.decode_job(compiled_batch, lanes, engine, inactive_seqs))

    def greedy(self, prompt: Sequence[int], n_tokens: int) -> tuple[list[int], np.ndarray | None]:
        """Prefill ``prompt`` and decode ``n_tokens`` greedily on B1 in a fresh sequence."""
        seq = self.kv.allocate_sequence()
        try:
            first = self.prefill(seq, prompt)
            if not first.ok:
                raise error_for(first.rc, f"golden prefill failed: {first.message}")
            lane = first.lanes[0]
            token = lane.greedy_token if lane.logits is None else int(np.argmax(lane.logits))
            assert token is not None
            out = [token]
            while len(out) < n_tokens:
                res = self.decode(1, [(seq, out[-1])])
                if not res.ok:
                    raise error_for(res.rc, f"golden decode failed: {res.message}")
                lane = res.lanes[0]
                nxt = lane.greedy_token if lane.logits is None else int(np.argmax(lane.logits))
                assert nxt is not None
                out.append(nxt)
            return out, first.lanes[0].logits
        finally:
            self.kv.free_sequence(seq)

    def check_golden(self, vector: GoldenVector) -> GoldenOutcome:
        """Run one golden vector: greedy tokens must match and the prefill logits checksum agree."""
        tokens, logits = self.greedy(vector.prompt, len(vector.expected_tokens))
        if logits is None:
            return GoldenOutcome(vector.name, False, tuple(tokens), vector.expected_tokens, None, None,
                                 "the device returned no logits (numerics off): golden cannot be checked")
        s = float(np.sum(logits))
        l2 = float(np.sqrt(np.sum(logits * logits)))
        problems = []
        if tuple(tokens) != vector.expected_tokens:
            problems.append(f"tokens {tokens} != expected {list(vector.expected_tokens)}")
        if abs(s - vector.logits_sum) > vector.atol or abs(l2 - vector.logits_l2) > vector.atol:
            problems.append(f"logits checksum (sum {s:.9f}, l2 {l2:.9f}) != expected "
                            f"({vector.logits_sum:.9f}, {vector.logits_l2:.9f}) within {vector.atol}")
        return GoldenOutcome(vector.name, not problems, tuple(tokens), vector.expected_tokens, s, l2,
                             "; ".join(problems) or "ok")

    def close(self) -> None:
        """Free every buffer pair this driver allocated (fails BUFFER_IN_USE if a job is stuck)."""
        for key, bufs in list(self._buffers.items()):
            self.device.free_job_buffers(bufs)
            del self._buffers[key]

    def statistics(self) -> DriverStatistics:
        return DriverStatistics(self._prefills, self._decodes, len(self._buffers), self._failed)
