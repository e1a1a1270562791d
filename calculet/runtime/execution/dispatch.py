"""From a verified result to the scheduler's completion (§7.4, R19.2): per-lane sampling.

**CompletionDispatcher** splits a result the executor verified (:mod:`.verification`) per
lane, samples each OK lane through its own request's sampler
(:mod:`calculet.runtime.execution.sampler`) and builds the scheduler's completion, carrying the
CalRT return code as the failed requests' error detail (R19.2). A result with a crosstalk or
counter anomaly delivers no token at all. The usual decode step — every lane its bound lane's, each
with a token — goes to the scheduler as columns (:data:`~calculet.runtime.scheduling.completion.DecodeTokens`),
with no object per lane (issue #20); any other as one outcome per lane.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from calculet.adapters.calrt import Anomaly, JobResult, ReturnCode
from calculet.runtime.execution.inflight import InflightJob
from calculet.runtime.execution.sampler import SamplerPool
from calculet.runtime.scheduling.completion import (DecodeCompletion, DecodeTokens, FaultKind, LaneOutcome,
                                                    PrefillCompletion)
from calculet.runtime.scheduling.decode import DecodeBatch
from calculet.runtime.scheduling.prefill import PrefillWork

_FAULT_FOR_RC = {ReturnCode.OK: FaultKind.NONE, ReturnCode.TIMEOUT: FaultKind.TIMEOUT,
                 ReturnCode.CCU_FAULT: FaultKind.CCU_FAULT, ReturnCode.DMA_UNKNOWN: FaultKind.DMA_UNKNOWN}


def fault_kind(rc: ReturnCode) -> FaultKind:
    """The completion's fault for a job return code (every other failure is a known ERROR)."""
    return _FAULT_FOR_RC.get(rc, FaultKind.ERROR)


@dataclass(frozen=True)
class CompletionStatistics:
    results: int
    failed_results: int
    rejected_results: int
    lanes_sampled: int
    lanes_failed: int
    lanes_unmatched: int


class CompletionDispatcher:
    """§7.4: a verified result → per-lane sampling → the scheduler's completion."""

    def __init__(self, sampler: SamplerPool, *, lane_isolation: bool) -> None:
        self.sampler = sampler
        self.lane_isolation = lane_isolation
        self._results = 0
        self._failed = 0
        self._rejected = 0
        self._sampled = 0
        self._lanes_failed = 0
        self._unmatched = 0

    def prefill(self, job: InflightJob, result: JobResult, anomalies: list[tuple[Anomaly, str]]
                ) -> PrefillCompletion:
        work = job.work
        assert isinstance(work, PrefillWork)
        self._results += 1
        if anomalies:
            self._rejected += 1
            return PrefillCompletion(work.job_id, work.generation, work.request_id, work.seq_id, False, None,
                                     False, FaultKind.ERROR, _anomaly_detail(anomalies))
        lane = result.lanes[0] if result.lanes else None
        if not result.ok or lane is None or lane.rc is not ReturnCode.OK:
            self._failed += 1
            rc = result.rc if not result.ok else (lane.rc if lane is not None else ReturnCode.INTERNAL)
            return PrefillCompletion(work.job_id, result.generation, work.request_id, work.seq_id, False, None,
                                     False, fault_kind(rc), _rc_detail(rc, result.message))
        token: int | None = None
        stop = False
        if work.last_chunk:
            sample = self.sampler.sample(work.request_id, lane.logits, lane.greedy_token)
            if sample is not None:
                self._sampled += 1
                token, stop = sample
        return PrefillCompletion(work.job_id, result.generation, work.request_id, work.seq_id, True, token, stop,
                                 FaultKind.NONE, "" if token is not None or not work.last_chunk
                                 else "no usable output token")

    def decode(self, job: InflightJob, result: JobResult, anomalies: list[tuple[Anomaly, str]]
               ) -> DecodeTokens | DecodeCompletion:
        """The scheduler's completion of a decode result: the usual step as columns (:data:`DecodeTokens`), any other
        as a :class:`DecodeCompletion` with one :class:`LaneOutcome` per valid lane (:meth:`_decode_lanes`).

        Usual (issue #20: no object per lane, no table by sequence): the job OK and its valid lanes, in order, the
        bound lanes in the batch's order, each naming its binding's lane and the sequence bound there, of the
        result's generation — what :meth:`_decode_lanes` would match each of them to by its sequence (a sequence is
        bound to one lane), so its tags are the binding's (R7.4.2: the columns' tag check is this match). Every lane
        then is sampled; one that yields no token makes the step's outcomes, from the same samples."""
        batch = job.work
        assert isinstance(batch, DecodeBatch)
        self._results += 1
        active = batch.active
        if anomalies:
            self._rejected += 1
            self._lanes_failed += len(active)
            return DecodeCompletion(batch.job_id, batch.generation, False, (), FaultKind.ERROR,
                                    _anomaly_detail(anomalies))
        ok = ReturnCode.OK
        if result.rc is not ok:
            return self._decode_lanes(job, batch, result)
        seq_ids = job.spec.lanes.seqs  # type: ignore[union-attr]  # plain ints (DecodeJob.lanes)
        generation = result.generation
        valid: Any = result.lanes
        if len(valid) != len(active):  # inactive lanes (a batch not full): the valid ones, a loop (no frame)
            valid = []
            for lane in result.lanes:
                if lane.valid:
                    valid.append(lane)
            if len(valid) != len(active):
                return self._decode_lanes(job, batch, result)
        for lane, b in zip(valid, active):
            if (not lane.valid or lane.lane != b.lane or lane.seq_id != seq_ids[b.lane] or lane.rc is not ok
                    or b.generation != generation):
                return self._decode_lanes(job, batch, result)
        sample_lane = self.sampler.sample
        tokens: list[Any] = []
        stops: list[bool] = []
        for lane, b in zip(valid, active):
            sample = sample_lane(b.request_id, lane.logits, lane.greedy_token)
            if sample is None:
                self._lanes_failed += 1
                tokens.append(None)
                stops.append(False)
            else:
                self._sampled += 1
                tokens.append(sample[0])
                stops.append(sample[1])
        if None not in tokens:
            return batch.job_id, generation, tokens, stops
        return DecodeCompletion(batch.job_id, generation, True, tuple([
            LaneOutcome(b.lane, b.request_id, b.seq_id, generation, token is not None, token, stop)
            for b, token, stop in zip(active, tokens, stops)]))

    def _decode_lanes(self, job: InflightJob, batch: DecodeBatch, result: JobResult) -> DecodeCompletion:
        """:meth:`decode` of any result but the usual step: each valid lane matched to its binding by the sequence
        bound there (an unmatched one names no request), sampled when usable (the job OK, or lane isolation)."""
        rc = result.rc
        job_ok = rc is ReturnCode.OK  # read once: every lane below needs it (issue #20)
        if not job_ok:
            self._failed += 1
        seq_ids = job.spec.lanes.seqs  # type: ignore[union-attr]  # plain ints (DecodeJob.lanes)
        by_seq: dict[int, Any] = {}
        for b in batch.active:
            by_seq[seq_ids[b.lane]] = b
        usable = job_ok or self.lane_isolation
        generation = result.generation
        sample_lane = self.sampler.sample
        lanes: list[LaneOutcome] = []
        for lane in result.lanes:
            if not lane.valid:
                continue
            binding = by_seq.get(lane.seq_id)
            if binding is None:
                self._unmatched += 1
                lanes.append(LaneOutcome(lane.lane, 0, 0, generation, False, None))
                continue
            token: int | None = None
            stop = False
            if usable and lane.rc is ReturnCode.OK:
                sample = sample_lane(binding.request_id, lane.logits, lane.greedy_token)
                if sample is not None:
                    self._sampled += 1
                    token, stop = sample
            if token is None:
                self._lanes_failed += 1
            lanes.append(LaneOutcome(lane.lane, binding.request_id, binding.seq_id, generation,
                                     token is not None, token, stop))
        detail = "" if job_ok else _rc_detail(rc, result.message)
        return DecodeCompletion(batch.job_id, generation, job_ok, tuple(lanes), _FAULT_FOR_RC.get(rc, FaultKind.ERROR),
                                detail)

    def statistics(self) -> CompletionStatistics:
        return CompletionStatistics(self._results, self._failed, self._rejected, self._sampled, self._lanes_failed,
                                    self._unmatched)


def _rc_detail(rc: ReturnCode, message: str) -> str:
    return f"{rc.name}: {message}" if message else rc.name


def _anomaly_detail(anomalies: list[tuple[Anomaly, str]]) -> str:
    kind, text = anomalies[0]
    more = f" (+{len(anomalies) - 1} more)" if len(anomalies) > 1 else ""
    return f"result rejected, {kind.value}: {text}{more}"
