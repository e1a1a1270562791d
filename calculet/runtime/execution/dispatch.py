"""From a verified result to the scheduler's completion (§7.4, R19.2): per-lane sampling.

**CompletionDispatcher** splits a result the executor verified (:mod:`.verification`) per
lane, samples each OK lane through its own request's sampler
(:mod:`calculet.runtime.execution.sampler`) and builds the scheduler's completion, carrying the
CalRT return code as the failed requests' error detail (R19.2). A result with a crosstalk or
counter anomaly delivers no token at all.
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
        """The scheduler's completion of a decode result: the usual step (job OK, every valid lane its bound lane's in
        the batch's order and generation, each sampled a token) as columns (:data:`DecodeTokens`); any other as a
        :class:`DecodeCompletion`, one :class:`LaneOutcome` per valid lane.
        One loop writes columns (#20: no object per lane, no second pass); outcomes are built from them off the usual
        step. A lane's binding is matched by the sequence bound there (R7.4.2: the columns' tag check)."""
        batch = job.work
        assert isinstance(batch, DecodeBatch)
        self._results += 1
        active = batch.active
        if anomalies:
            self._rejected += 1
            self._lanes_failed += len(active)
            return DecodeCompletion(batch.job_id, batch.generation, False, (), FaultKind.ERROR,
                                    _anomaly_detail(anomalies))
        rc = result.rc
        job_ok = rc is ReturnCode.OK  # read once: every lane below needs it (issue #20)
        self._failed += not job_ok
        seq_ids = job.spec.lanes.seqs  # type: ignore[union-attr]  # plain ints (DecodeJob.lanes)
        by_seq: dict[int, Any] = {}  # a loop, not a dict comprehension (a frame of its own on 3.11, issue #20)
        for b in active:
            by_seq[seq_ids[b.lane]] = b
        usable = job_ok or self.lane_isolation
        generation = result.generation
        sample_lane, ok = self.sampler.sample, ReturnCode.OK
        numbers: list[int] = []  # per valid lane: its number, its binding (None: unmatched), token and stop
        bindings: list[Any] = []
        tokens: list[Any] = []
        stops: list[bool] = []
        usual = job_ok  # while every lane so far is the next bound lane's, of this generation, with a token
        for lane in result.lanes:
            if not lane.valid:
                continue
            binding = by_seq.get(lane.seq_id)
            token, stop = None, False
            if binding is None:
                self._unmatched += 1
                usual = False
            else:
                if usable and lane.rc is ok:
                    sample = sample_lane(binding.request_id, lane.logits, lane.greedy_token)
                    if sample is not None:
                        self._sampled += 1
                        token, stop = sample
                if token is None:
                    self._lanes_failed += 1
                    usual = False
                elif usual:  # the next bound lane (k) is this binding, of the result's generation
                    usual = (k := len(tokens)) < len(active) and active[k] is binding and binding.generation == \
                        generation
            numbers.append(lane.lane)
            bindings.append(binding)
            tokens.append(token)
            stops.append(stop)
        if usual and len(tokens) == len(active):
            return batch.job_id, generation, tokens, stops
        return DecodeCompletion(batch.job_id, generation, job_ok,
                                _outcomes(generation, numbers, bindings, tokens, stops),
                                _FAULT_FOR_RC.get(rc, FaultKind.ERROR), "" if job_ok else _rc_detail(rc, result.message))

    def statistics(self) -> CompletionStatistics:
        return CompletionStatistics(self._results, self._failed, self._rejected, self._sampled, self._lanes_failed,
                                    self._unmatched)


def _outcomes(generation: int, numbers: list[int], bindings: list[Any], tokens: list[int | None], stops: list[bool]
              ) -> tuple[LaneOutcome, ...]:
    """The decode dispatch's columns as one outcome per valid lane (off the usual step): an unmatched lane names no
    request; a matched one its binding's request and sequence, ok when it sampled a token."""
    return tuple([LaneOutcome(number, 0, 0, generation, False, None) if binding is None else
                  LaneOutcome(number, binding.request_id, binding.seq_id, generation, token is not None, token, stop)
                  for number, binding, token, stop in zip(numbers, bindings, tokens, stops)])


def _rc_detail(rc: ReturnCode, message: str) -> str:
    return f"{rc.name}: {message}" if message else rc.name


def _anomaly_detail(anomalies: list[tuple[Anomaly, str]]) -> str:
    kind, text = anomalies[0]
    more = f" (+{len(anomalies) - 1} more)" if len(anomalies) > 1 else ""
    return f"result rejected, {kind.value}: {text}{more}"
