"""A result that arrives after its job's Wait deadline (§12): nothing is checked or delivered, the job's slot and lanes
are reclaimed (issue #20: the executor takes and checks a result in one call, ``DeviceExecutor.complete``, and the job
path delivers a clean step itself; the late branch of each is kept apart and held here).

With the engine's own recovery a late result is rare (a reset usually discards the job first), so both halves are
driven directly: the executor on the simulated device, the job path with the collaborators it calls recorded."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any, cast

from calculet.adapters.calrt import JobResult, StatusCounters
from calculet.clock import FakeClock
from calculet.machines.job import JobEngine
from calculet.runtime.engine.jobs import JobPath
from calculet.runtime.execution.inflight import InflightJob
from calculet.runtime.scheduling.completion import DecodeCompletion, FaultKind, PrefillCompletion
from calculet.runtime.scheduling.decode import DecodeBatch
from calculet.runtime.scheduling.prefill import PrefillWork
from tests.unit.runtime.execution.test_executor_resync import Rig, rig  # noqa: F401 - the fixture


def test_a_late_result_is_not_checked_and_moves_no_anchor(rig: Rig) -> None:  # noqa: F811
    """Mutant caught: ``complete`` checking a timed-out job's result (its anomalies counted, the engine's expected
    ``engine_sequence`` moved by a result the engine no longer trusts)."""
    job = rig.submit()
    rig.executor.mark_timed_out(job)
    result = rig.executor.wait(job)
    assert result is not None
    wrong = result._replace(counters=StatusCounters(99, 7, 7, 7))  # a check would name these
    taken, found = rig.executor.complete(wrong)
    assert taken is job and found == []
    assert rig.executor.statistics().anomalies == {}
    assert rig.complete(rig.submit()) == []  # the next result is checked against the last trusted one


class _Recorded:
    """The job path's collaborators, recording what reaches them; a dispatcher must not be reached."""

    def __init__(self, job: InflightJob) -> None:
        self.completions: list[object] = []
        self.executor = SimpleNamespace(complete=lambda result: (job, []), degrade=SimpleNamespace())
        self.scheduler = SimpleNamespace(on_decode_complete=self.completions.append,
                                         on_prefill_complete=self.completions.append)
        self.models = SimpleNamespace()  # the job path counts nothing into the models (a1a14d3)
        self.desk = SimpleNamespace(tracks_provenance=False, on_job_done=lambda work, result: None)

    def path(self) -> JobPath:
        def unreachable(*_a: object) -> None:
            raise AssertionError("a late result reached the dispatcher")

        dispatcher = SimpleNamespace(decode=unreachable, prefill=unreachable)
        return JobPath(cast(Any, self.scheduler), cast(Any, self.executor), cast(Any, dispatcher), cast(Any, None),
                       cast(Any, self.models), cast(Any, self.desk), FakeClock(), trace=None,
                       enter_recovery=unreachable, back_off=unreachable, recover=unreachable)


def _late(work: object) -> tuple[InflightJob, JobResult]:
    job = InflightJob(4, cast(Any, None), cast(Any, work), cast(Any, SimpleNamespace(engine=JobEngine.PING)), 1.0,
                      False, timed_out=True)
    result = cast(JobResult, SimpleNamespace(generation=2, rc=None, calbin_id=1))
    return job, result


def test_a_late_decode_result_only_reclaims_its_slot_and_lanes() -> None:
    """Mutant caught: the job path delivering a timed-out job's result (the dispatcher reached, tokens sampled)."""
    work = DecodeBatch(4, 2, None, (), (), (), (), None, 0.0, 0.0, ())  # type: ignore[arg-type]
    job, result = _late(work)
    seen = _Recorded(job)
    seen.path().handle_result(result)
    assert seen.completions == [DecodeCompletion(4, 2, False, (), FaultKind.ERROR, "late completion")]


def test_a_late_prefill_result_only_reclaims_its_slot() -> None:
    work = object.__new__(PrefillWork)
    work.__dict__.update(job_id=4, generation=2, request_id=9, seq_id=3)
    job, result = _late(work)
    seen = _Recorded(job)
    seen.path().handle_result(result)
    assert seen.completions == [PrefillCompletion(4, 2, 9, 3, False, None)]


def test_after_a_counter_anomaly_the_next_result_sets_the_anchor_again(rig: Rig) -> None:  # noqa: F811
    """§14: counters the device got wrong are no anchor for the next job. Mutant caught: ``complete`` keeping the
    wrong result's ``engine_sequence`` as the anchor (the next, correct, result then looks like an anomaly)."""
    assert rig.complete(rig.submit()) == []  # the anchor: each later result on PING must follow by one
    job = rig.submit()
    result = rig.executor.wait(job)
    assert result is not None
    c = result.counters
    wrong = result._replace(counters=StatusCounters(c.engine_sequence + 40, c.lanes_valid,
                                                                c.tokens_processed, c.kv_tokens_written))
    taken, found = rig.executor.complete(wrong)
    assert taken is job and [kind.value for kind, _ in found] == ["counters"]
    assert rig.complete(rig.submit()) == []
