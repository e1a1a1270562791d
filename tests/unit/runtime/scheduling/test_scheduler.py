"""The scheduling core end to end on a fake clock: the plan protocol, model states, shutdown, stats."""

from __future__ import annotations

import dataclasses
import random

import pytest

from calculet.errors import DefinitionError
from calculet.machines.job import JobEngine
from calculet.machines.request import FinishReason
from calculet.runtime.scheduling.admission import ModelAvailability
from calculet.runtime.scheduling.prefill import PrefillWork
from calculet.runtime.scheduling.registry import CancelResult
from tests.unit.runtime.runtime_support import Harness, default_token


def test_one_request_flows_admission_prefill_decode_completion():
    h = Harness.build(sizes=(1,), lanes=2)
    sub = h.submit(prompt=12, new=3)
    plan = h.step()
    assert isinstance(plan.work, PrefillWork) and plan.engine is JobEngine.PING
    assert h.state(sub.request_id) == "prefill_ready"
    h.scheduler.submitted(plan.work.job_id)
    assert h.state(sub.request_id) == "prefill_running"
    h.complete(plan.work)
    assert h.state(sub.request_id) == "decode_ready"
    h.drive()
    sink = h.sinks[sub.request_id]
    assert sink.tokens == [default_token(sub.request_id, p) for p in (12, 13, 14)]
    assert sink.outcome.state == "completed" and sink.outcome.finish_reason is FinishReason.LENGTH
    assert h.scheduler.idle()


def test_the_plan_must_be_confirmed_before_anything_else():
    h = Harness.build(sizes=(1,), lanes=2)
    h.submit()
    plan = h.step()
    with pytest.raises(DefinitionError, match="planned"):
        h.submit()
    with pytest.raises(DefinitionError, match="planned"):
        h.step()
    with pytest.raises(DefinitionError):
        h.scheduler.submitted(plan.work.job_id + 1)
    h.scheduler.submit_failed(plan.work.job_id)   # refused by the device: nothing fired
    again = h.step()
    assert again.work.request_id == plan.work.request_id and again.work.job_id != plan.work.job_id
    assert h.scheduler.statistics().jobs.ended == {"submit_rejected@prepared": 1}


def test_two_jobs_in_flight_use_ping_and_pong():
    h = Harness.build(sizes=(1,), lanes=4, executor={"max_inflight": 2})
    h.submit()
    h.submit()
    first, second = h.step(), None
    h.scheduler.submitted(first.work.job_id)
    second = h.step()
    h.scheduler.submitted(second.work.job_id)
    assert {first.engine, second.engine} == {JobEngine.PING, JobEngine.PONG}
    assert h.step().reason == "no in-flight slot"
    h.complete(second.work)
    h.complete(first.work)
    h.drive()
    assert h.scheduler.idle()


@pytest.mark.req("R12.4", "R4.5")
def test_draining_cancels_waiting_requests_and_running_ones_drain():
    h = Harness.build(sizes=(1,), lanes=1)
    running = h.submit(prompt=8, new=3)
    waiting = h.submit(prompt=8, new=3)
    plan = h.step()
    h.scheduler.submitted(plan.work.job_id)
    h.scheduler.set_model(1, ModelAvailability.DRAINING)
    assert h.sinks[waiting.request_id].outcome.state == "cancelled"
    assert h.submit().outcome.http_status == 503
    h.complete(plan.work)
    h.drive()                                        # admitted requests still complete while draining
    assert h.sinks[running.request_id].outcome.state == "completed"
    assert h.scheduler.idle()


def test_recovering_model_holds_jobs_and_failed_model_ends_requests():
    h = Harness.build(sizes=(1,), lanes=2)
    a = h.submit(prompt=8, new=3)
    h.scheduler.set_model(1, ModelAvailability.RECOVERING)
    assert h.step().work is None and h.state(a.request_id) == "prefill_ready"
    h.scheduler.set_model(1, ModelAvailability.READY)
    h.run(h.step())
    h.scheduler.set_model(1, ModelAvailability.FAILED)
    assert h.sinks[a.request_id].outcome.state == "failed"
    h.confirm_all()
    assert h.scheduler.idle()


@pytest.mark.req("R4.4", "R4.5")
def test_shutdown_cancels_everything_and_running_jobs_drain():
    h = Harness.build(sizes=(1,), lanes=2)
    subs = [h.submit(prompt=8, new=5) for _ in range(4)]
    plan = h.step()
    h.scheduler.submitted(plan.work.job_id)
    h.scheduler.shutdown()
    assert h.submit().outcome.http_status == 503
    on_device = plan.work.request_id
    assert h.state(on_device) == "prefill_running"
    assert all(h.sinks[s.request_id].closes == 1 for s in subs if s.request_id != on_device)
    h.complete(plan.work)
    assert h.sinks[on_device].outcome.state == "cancelled"
    h.confirm_all()
    assert h.scheduler.idle()


def test_cancel_returns_the_spec_outcomes():
    h = Harness.build(sizes=(1,), lanes=2)
    a = h.submit(prompt=8, new=3)
    plan = h.step()
    h.scheduler.submitted(plan.work.job_id)
    assert h.scheduler.cancel(a.request_id).result is CancelResult.PENDING
    h.complete(plan.work)
    assert h.scheduler.cancel(a.request_id).result is CancelResult.ALREADY_TERMINAL
    assert h.sinks[a.request_id].closes == 1


def test_statistics_are_frozen_dataclasses_everywhere():
    h = Harness.build(sizes=(1, 4), lanes=4)
    h.submit()
    h.drive()
    stats = h.scheduler.statistics()
    for part in (stats, stats.registry, stats.admission, stats.prefill, stats.decode, stats.kv, stats.jobs):
        assert dataclasses.is_dataclass(part) and type(part).__dataclass_params__.frozen
    assert stats.wrr_picks["decode"] >= 1 and stats.registry.closes == 1


@pytest.mark.req("R4.3", "R4.6", "R4.7", "R17.3.3", "R17.3.5")
@pytest.mark.parametrize("seed", range(6))
def test_random_lives_keep_every_invariant(seed):
    """A seeded single-threaded soak: random cancels, deadlines, faults, timeouts, resets."""
    rng = random.Random(seed)
    h = Harness.build(sizes=(1, 4, 8), lanes=12, max_seq=8192, executor={"max_inflight": 2},
                      admission={"max_sequences": 12, "max_waiting_requests": 40,
                                 "long_prefill_quota": {"max_admitted": 2, "max_waiting": 4}},
                      batch={"batching_window_us": 2000})
    inflight: list = []
    for tick in range(600):
        h.clock.advance(rng.choice((0.0, 0.0005, 0.001, 0.004)))
        if rng.random() < 0.4 and tick < 450:
            h.submit(prompt=rng.choice((4, 40, 600, 5000)), new=rng.randint(1, 12),
                     deadline_ms=rng.choice((None, 30, 200, 2000)))
        if rng.random() < 0.1 and h.sinks:
            rid = rng.choice(list(h.sinks))
            if rid:
                h.scheduler.cancel(rid)
        plan = h.step()
        if plan.work is not None:
            if rng.random() < 0.05:
                h.scheduler.submit_failed(plan.work.job_id)
            else:
                h.scheduler.submitted(plan.work.job_id)
                inflight.append(plan.work)
        if inflight and rng.random() < 0.7:
            work = inflight.pop(rng.randrange(len(inflight)))
            roll = rng.random()
            if roll < 0.05:
                h.scheduler.job_timed_out(work.job_id)
                if rng.random() < 0.5:
                    h.complete(work)                      # late
            elif roll < 0.1:
                h.complete(work, ok=False)
                h.scheduler.recover_lanes()
            else:
                h.complete(work, stop=[r for r in h.sinks if rng.random() < 0.05])
        if rng.random() < 0.02:
            h.scheduler.device_reset()
            inflight.clear()
        h.confirm_all()
    h.scheduler.shutdown()
    for work in inflight:
        h.complete(work)
    h.scheduler.device_reset()
    h.confirm_all()
    assert h.scheduler.idle(), h.scheduler.statistics()
    for rid, sink in h.sinks.items():
        assert sink.closes == 1 and sink.late_tokens == 0, rid
        assert sink.outcome.generated_tokens == len(sink.tokens) or sink.outcome.state != "completed"
    kv = h.kv.statistics()
    assert kv.refused_double_releases == 0 and kv.releases == kv.confirmed_releases
    assert len(h.confirmed) == len(set(h.confirmed))      # no sequence freed twice
