"""The tracker records the finish estimate made at admission (issue #13; :mod:`calculet.loadsim.tracking`).

Why: the bench scores ``estimated_finish_s`` and the estimate-bound compares it between a run and its splices
(``calculet/bench/estimate_bound_runs.py``), both on the premise that it is the estimate made when the request was
admitted. Session 20 found the 5 of 560 steady b16 "mismatches" of session 19 were requests accepted into the
admission queue with an estimate and refused from it later in the splice, whose record dropped the estimate.

Mutants (each checked to fail here): the rejection record built without ``estimated_finish_s`` (the code before:
``test_a_request_refused_from_the_queue_keeps_its_estimate``, and the engine run below); the tracker keeping the
last estimate shown instead of the first (``test_the_first_estimate_shown_is_kept``); a transition to the same
state read (``test_the_first_estimate_shown_is_kept``).
"""

from __future__ import annotations

from dataclasses import dataclass

from calculet.adapters.sim import CostModel
from calculet.loadsim.policies import POLICIES, run_policy
from calculet.loadsim.tracking import RequestTracker
from calculet.loadsim.workload import SimRequest, generate_requests, load_preset
from calculet.machines.monitor import MONITOR
from calculet.machines.request import FinishReason
from calculet.runtime.request import RequestOutcome
from calculet.runtime.scheduling import on_time_planner


@dataclass
class _Record:
    """What the observer reads of a ``RequestRecord``."""

    request_id: int
    estimated_finish: float | None = None


def _request(arrival: float) -> SimRequest:
    return SimRequest(arrival_s=arrival, tenant="t", prompt_tokens=10, max_new_tokens=4, deadline_ms=10_000,
                      cancel_after_s=None, klass="short")


def test_a_request_refused_from_the_queue_keeps_its_estimate() -> None:
    clock = [1.0]
    tracker = RequestTracker(lambda: clock[0])
    queued, refused_at_submit = tracker.new_sink(), tracker.new_sink()
    tracker.bind(0, 7)
    tracker.bind(1, 8)
    rec = _Record(7, estimated_finish=12.5)
    tracker.observer(rec, "new", "waiting_admission")  # accepted into the queue by the §5.2 screen
    tracker.observer(_Record(8), "new", "rejected")  # refused at submit: no estimate
    clock[0] = 3.0
    tracker.observer(rec, "waiting_admission", "rejected")
    queued.close(RequestOutcome(7, "rejected", FinishReason.REJECTED, 0, 429, "no prospect of service"))
    refused_at_submit.close(RequestOutcome(8, "rejected", FinishReason.REJECTED, 0, 429, "no prospect of service"))
    first, second = tracker.records([_request(1.0), _request(1.0)])
    assert not first.admitted and first.finish_reason == "rejected" and first.estimated_finish_s == 12.5
    assert not second.admitted and second.estimated_finish_s is None


def test_the_first_estimate_shown_is_kept() -> None:
    tracker = RequestTracker(lambda: 2.0)
    sink = tracker.new_sink()
    tracker.bind(0, 3)
    rec = _Record(3, estimated_finish=5.0)
    tracker.observer(rec, "new", "new")  # not a transition: not read
    rec.estimated_finish = 9.0
    tracker.observer(rec, "new", "prefill_ready")
    rec.estimated_finish = 11.0  # a later revision is not the admission's estimate
    tracker.observer(rec, "prefill_ready", "prefill_running")
    sink.token(3, 5)
    sink.close(RequestOutcome(3, "completed", FinishReason.LENGTH, 1, 200))
    (record,) = tracker.records([_request(2.0)])
    assert record.estimated_finish_s == 9.0


def test_an_engine_run_records_every_estimate_as_admission_made_it(monkeypatch: object) -> None:
    """Steady at 4x on B16 for 200 s: requests wait for admission and some are refused from the queue."""
    made: dict[float, float | None] = {}
    admit = on_time_planner.OnTimePlanner.admit

    def wrapped(self: on_time_planner.OnTimePlanner, rec, now, model, records):  # type: ignore[no-untyped-def]
        fit = admit(self, rec, now, model, records)
        made[rec.arrival] = rec.estimated_finish
        return fit

    monkeypatch.setattr(on_time_planner.OnTimePlanner, "admit", wrapped)  # type: ignore[attr-defined]
    workload = load_preset("steady")
    monitor = MONITOR.statistics()
    MONITOR.configure(enabled=False)  # as the bench runs it
    try:
        requests = generate_requests(workload, 200.0, 4.0)
        run = run_policy(POLICIES["calculet-b16"], requests, workload, CostModel.reference())
    finally:
        MONITOR.configure(enabled=monitor.enabled, mode=monitor.mode)  # type: ignore[arg-type]
    estimated = [(r, made[r.arrival_s]) for r in run.requests if made.get(r.arrival_s) is not None]
    assert estimated and all(r.estimated_finish_s == value for r, value in estimated)
    assert any(r.finish_reason == "rejected" for r, _ in estimated)  # the case the bound's splices met
