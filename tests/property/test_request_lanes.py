"""The requests × lanes joint model against the running scheduler, and its declaration's shape.

The invariants of :class:`RequestLaneSystem` are proved on the declaration; here the *same*
predicates are evaluated on the live objects (request machines, the KV manager's lanes, each
record's lease as the binding) after every call into a real ``Scheduler`` driven through random
lives — admissions, chunked and plain prefill, decode, cancels, deadlines, invalid output,
device faults, timeouts, late completions, resets. A failure names the invariant and prints
the system; it means the runtime's coupling is not the one the model proves.
"""

from __future__ import annotations

import random

import pytest

from calculet.logic.expr import And
from calculet.machines.request_lanes import RequestLaneSystem
from calculet.machines.errors import InvalidDefinition
from calculet.machines.system import Coupled
from calculet.runtime.scheduling.admission import ModelAvailability
from calculet.clock import FakeClock
from calculet.runtime.scheduling.joint_checks import JointMonitor
from calculet.runtime.scheduling.kv import KvLaneManager
from calculet.runtime.scheduling.plan import SchedulingCapabilities
from calculet.runtime.scheduling.scheduler import Scheduler
from tests.unit.runtime.runtime_support import Harness, make_config, profile_set

SYSTEM = RequestLaneSystem.definition


Coupling = JointMonitor  # the runtime's own monitor of the coupling (calculet/runtime/scheduling/joint_checks.py)


def build(*, lanes: int, chunk: int | None, max_inflight: int = 2) -> tuple[Harness, Coupling]:
    coupling = Coupling()
    config = make_config(batch={"profiles": [1, 4], "batching_window_us": 2000},
                         executor={"max_inflight": max_inflight},
                         admission={"max_sequences": lanes, "max_waiting_requests": 40,
                                    "long_prefill_quota": {"max_admitted": 2, "max_waiting": 4}})
    clock = FakeClock()
    kv = KvLaneManager(lanes, 8192, clock=clock)
    scheduler = Scheduler(config, clock=clock, kv=kv, device_kv_tokens=10**7, max_seq=8192,
                          capabilities=SchedulingCapabilities(incremental_prefill=chunk is not None),
                          observer=coupling.observe)
    scheduler.set_model(1, ModelAvailability.READY, profile_set((1, 4), config, max_seq=8192, chunk=chunk))
    return Harness(scheduler, clock, kv), coupling


def check(h: Harness, coupling: Coupling, after: str) -> None:
    view, recs = coupling.view(h.kv)
    broken = [inv.name for inv in SYSTEM.invariants if not inv.predicate(view)]
    if broken:
        requests = {rec.request_id: (rec.machine.state, rec.machine.kv_length,
                                     rec.lease.lane if rec.lease else None) for rec in recs}
        lanes = [(h.kv.lane(j).state, h.kv.lane(j).seq_id, h.kv.lane(j).committed_len) for j in range(h.kv.lanes)]
        pytest.fail(f"after {after}: {broken}\n  requests {requests}\n  lanes {lanes}")


@pytest.mark.req("R9.2.1", "R9.2.2", "R9.2.4", "R9.2.6", "R17.2.4")
@pytest.mark.parametrize("chunk", [None, 16], ids=["whole-prefill", "chunked-prefill"])
@pytest.mark.parametrize("seed", range(3))
def test_the_running_scheduler_keeps_the_joint_invariants(seed, chunk):
    rng = random.Random(seed)
    h, coupling = build(lanes=3, chunk=chunk)
    s = h.scheduler
    inflight: list = []
    calls = 0

    def after(what: str) -> None:
        nonlocal calls
        calls += 1
        check(h, coupling, what)

    for tick in range(300):
        h.clock.advance(rng.choice((0.0, 0.0005, 0.001, 0.004)))
        if rng.random() < 0.3 and tick < 220:
            h.submit(prompt=rng.choice((3, 20, 40, 90)), new=rng.randint(1, 6),
                     deadline_ms=rng.choice((None, 15, 80, 2000)))
            after("submit")
        if rng.random() < 0.08 and h.sinks:
            s.cancel(rng.choice(list(h.sinks)))
            after("cancel")
        plan = h.step()
        after("step")
        if plan.work is not None:
            if rng.random() < 0.05:
                s.submit_failed(plan.work.job_id)
                after("submit_failed")
            else:
                s.submitted(plan.work.job_id)
                after("submitted")
                inflight.append(plan.work)
        if inflight and rng.random() < 0.7:
            work = inflight.pop(rng.randrange(len(inflight)))
            roll = rng.random()
            if roll < 0.05:
                s.job_timed_out(work.job_id)
                after("job_timed_out")
                if rng.random() < 0.5:
                    h.complete(work)
                    after("late completion")
            elif roll < 0.1:
                h.complete(work, ok=False)
                after("failed completion")
                s.recover_lanes()
                after("recover_lanes")
            elif roll < 0.14:
                h.complete(work, token=lambda rid, pos: None)
                after("completion with invalid output")
            else:
                h.complete(work, stop=[r for r in h.sinks if rng.random() < 0.1])
                after("completion")
        if rng.random() < 0.02:
            s.device_reset()
            inflight.clear()
            after("device_reset")
        for command in s.take_commands():
            s.confirm_release(command.lane, command.seq_id)
            after("confirm_release")
    s.shutdown()
    after("shutdown")
    for work in inflight:
        h.complete(work)
        after("drain")
    s.device_reset()
    h.confirm_all()
    after("final reset")
    assert s.idle(), s.statistics()
    assert calls > 600


def test_a_view_of_live_objects_is_what_the_predicates_read():
    """The concrete view is the proof's view: a decoding request and its lane, by hand."""
    h, coupling = build(lanes=2, chunk=None)
    rid = h.submit(prompt=5, new=3).request_id
    h.run(h.step())                                  # prefill: decode_ready, lane Active
    view, recs = coupling.view(h.kv)
    assert [rec.request_id for rec in recs] == [rid]
    lane = recs[0].lease.lane
    assert view.bound(0, lane) and view.requests[0].kv_length == view.lanes[lane].committed_len == 5
    assert And(*[inv.predicate(view) for inv in SYSTEM.invariants])
    assert view.requests[0] is recs[0].machine       # the live objects, not copies


def test_the_declaration_takes_every_row_but_the_ones_it_explains():
    """Adding a row to either machine forces a decision here: a step that takes it, or a reason."""
    assert sorted(SYSTEM.untaken_rows()) == sorted(row for row, _ in SYSTEM.omitted)


def test_the_declaration_shape_is_pinned():
    """A silent change of the model (steps, row chains, local steps, invariants) is noticed."""
    # 60 steps, 92 variants: admit_now (issue #20) is one step and one variant; a later prefill chunk is no step
    # (no lane event, #20: its job moves) and a fault may leave Reserved or Active (two rows, no Updating)
    assert (len(SYSTEM.steps), len(SYSTEM.variants), len(SYSTEM.invariants)) == (60, 92, 9)
    assert SYSTEM.local == {s.name for s in SYSTEM.steps}  # the induction's cutoff argument needs it
    asked = [inv.name for inv in SYSTEM.invariants if not inv.strengthening]
    assert asked == ["holding_request_owns_one_lane", "lane_bound_at_most_once", "decode_position_is_committed_len",
                     "ended_request_holds_no_lane", "unknown_lane_unbound", "free_lane_unbound"]


@pytest.mark.parametrize("step, fault", [
    (Coupled("x", request=("admit@nowhere",)), "neither a transition nor an event"),
    (Coupled("x", request=("cancel@new",), binding="unbind"), "must involve a request and a lane"),
    (Coupled("x", lane=("reserve",)), "lane rows need"),
    (Coupled("x", lane=("commit",), guard=lambda sys, i, j, tokens: sys.bound(i, j)), "undeclared step argument"),
    (Coupled("x", request=("admit@waiting_admission",), lane=("commit", "reserve")), "can follow"),
], ids=["unknown-row", "binding-without-lane", "missing-arguments", "undeclared-argument", "broken-chain"])
def test_a_faulty_coupled_step_is_refused_at_declaration(step, fault):
    with pytest.raises(InvalidDefinition, match=fault):
        RequestLaneSystem.derive("Faulty", add=[step])


@pytest.mark.req("R9.2.1", "R17.2.4")
def test_the_engine_monitor_catches_a_lease_dropped_without_its_lane():
    """The runtime's joint monitor (on in every test, checked by the engine each tick) raises when
    a holding request silently loses its lease — state outside the machines drifting (#17)."""
    from calculet.machines.errors import InvariantViolation

    h, monitor = build(lanes=2, chunk=None)
    h.submit(prompt=3, new=2)
    recs = [rec for rec in h.scheduler.registry.live() if rec.lease is not None]
    assert recs, "a request was admitted"
    monitor.check(h.kv, "after admission")  # the real coupling holds
    recs[0].lease = None                   # the fault: the lease is dropped, the lane still reserved for it
    with pytest.raises(InvariantViolation) as caught:
        monitor.check(h.kv, "after the silent drop")
    assert caught.value.invariant in {"holding_request_owns_one_lane", "bound_exactly_while_holding"}
