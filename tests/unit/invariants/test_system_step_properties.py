"""Step properties of coupled systems (#20): declared, proved for every size, witnessed, evaluated live.

The system under test is session 17's prototype of the KV lane with one event per step (V12, branch
``v12-proto``): a lane without Updating whose open step is its *binding* to a device job. Its invariants
alone let two wrong runtimes through — a lane committing, or its step closing, while its job is still on
the device: both states of such a step satisfy every invariant. Only a property of the step can say it.
"""

from __future__ import annotations

from typing import Any

import pytest

from calculet.invariants.strength import check_system_witnesses
from calculet.invariants.system_bmc import check_system_bmc
from calculet.invariants.system_document import system_document
from calculet.invariants.system_induction import check_system_induction
from calculet.logic.expr import And, If, Implies, Not
from calculet.logic.types import Int
from calculet.machines.core import Machine
from calculet.machines.definition import Event, Invariant, Param, State, T, Var
from calculet.machines.errors import InvalidDefinition
from calculet.machines.job import DeviceJobMachine
from calculet.machines.system import (NONE, Coupled, CoupledSystem, SystemInvariant, SystemStep, SystemStepProperty,
                                      SystemView)


class OneEventLane(Machine):
    """A KV lane whose step ends with one event: commit(tokens) on success, fault when unknown, none on abort."""

    spec = "§9"
    examples = [dict(max_seq=4, lane=0)]
    max_seq = Param(Int(ge=1))
    lane = Param(Int(ge=0))
    seq_id = Var(Int(ge=0))
    generation = Var(Int(ge=0))
    committed_len = Var(Int(ge=0))
    reserved_len = Var(Int(ge=0))
    free = State(initial=True)
    reserved = State()
    active = State()
    unknown = State()
    releasing = State()
    reserve = Event("a sequence takes the lane", seq=Int(ge=1), gen=Int(ge=1), tokens=Int(ge=1))
    commit = Event("the lane's step succeeded: `tokens` positions kept", tokens=Int(ge=1))
    fault = Event("the lane's device state is unknown")
    release = Event("its sequence ended")
    recover = Event("its job ended: the Unknown lane can go")
    confirm_release = Event("the sequence is freed")
    transitions = [
        T(free, reserve, reserved, guard=lambda v, tokens: tokens <= v.max_seq,
          effect=lambda v, seq, gen, tokens: {"seq_id": seq, "generation": gen, "reserved_len": tokens,
                                              "committed_len": 0}),
        T((reserved, active), commit, active, guard=lambda v, tokens: v.committed_len + tokens <= v.reserved_len,
          effect=lambda v, tokens: {"committed_len": v.committed_len + tokens}),
        T((reserved, active), fault, unknown),
        T((reserved, active), release, releasing),
        T(unknown, recover, releasing),
        T(releasing, confirm_release, free,
          effect=lambda v: {"seq_id": 0, "generation": 0, "reserved_len": 0, "committed_len": 0}),
    ]
    invariants = [
        Invariant("R9.2.3", name="lengths_ordered",
                  predicate=lambda v: And(v.committed_len <= v.reserved_len, v.reserved_len <= v.max_seq)),
        Invariant("R9.2.2", name="free_is_empty", predicate=lambda v: Implies(v.at("free"), And(
            v.seq_id == 0, v.generation == 0, v.reserved_len == 0, v.committed_len == 0))),
        Invariant("R9.2.1", name="held_lane_has_owner", predicate=lambda v: Implies(Not(v.at("free")), And(
            v.seq_id >= 1, v.generation >= 1, v.reserved_len >= 1))),
        Invariant("R9.2.4", name="reserved_has_nothing_committed", predicate=lambda v: And(
            Implies(v.at("reserved"), v.committed_len == 0), Implies(v.at("active"), v.committed_len >= 1))),
    ]


_IN_DOUBT = ("timed_out", "quarantined")
_ENDED = ("completed", "failed")
MAX_INFLIGHT = 2


def _on_device(sys: Any, jobs: Any) -> Any:
    total = sys.beyond("jobs holding a device slot")
    for k in jobs:
        total = total + If(sys.lanes[k].at("submitted", *_IN_DOUBT), 1, 0)
    return total


def _of_job(sys: Any, i: int, j: int, *states: str) -> Any:
    return And(sys.bound(i, j), sys.lanes[j].at(*states))


def _job_steps() -> list[Coupled]:
    ok = dict(DeviceJobMachine.definition.events["complete"].args)
    steps = []
    for t in DeviceJobMachine.definition.transitions:
        args = ok if t.event == "complete" else {}
        if t.event == "submit":
            guard = lambda sys, i, j: _on_device(sys, (k for k in range(len(sys.lanes)) if k != j)) < MAX_INFLIGHT
        elif t.source in _IN_DOUBT and t.target in _ENDED:  # buffers reclaimed once no lane's step is open
            guard = lambda sys, i, j: And(*[Not(And(sys.bound(k, j), sys.requests[k].at("reserved", "active")))
                                            for k in range(len(sys.requests))])
        else:
            guard = None
        steps.append(Coupled(f"job:{t.name}", lane=(t.name,), args=args, guard=guard))
    return steps


_OPEN = {"state": "active", "seq_id": 1, "generation": 1, "reserved_len": 3, "committed_len": 1}

STEP_PROPERTIES = [
    SystemStepProperty(
        "R14.4", "lane_commits_only_after_its_job_completed",
        predicate=lambda pre, post, step: And(
            pre.all_pairs(lambda i, j: Implies(And(pre.bound(i, j), post.requests[i].committed_len
                                                    > pre.requests[i].committed_len), pre.lanes[j].at("completed"))),
            pre.all_requests(lambda i: Implies(post.requests[i].committed_len > pre.requests[i].committed_len,
                                               Not(pre.unbound(i))))),
        doc="a lane keeps new positions only in a step of the job it is bound to, once that job has completed",
        rejects=({"pre": {"requests": [_OPEN], "lanes": [{"state": "submitted"}], "binding": [0]},
                  "post": {"requests": [{"committed_len": 2}], "binding": [NONE]}, "step": "commit"},)),
    SystemStepProperty(
        "R14.4", "open_step_closes_only_after_its_job_ended",
        predicate=lambda pre, post, step: pre.all_pairs(lambda i, j: Implies(
            And(pre.bound(i, j), post.unbound(i)), pre.lanes[j].at(*_ENDED))),
        doc="a lane's step (its binding to a job) closes only once the job has completed or failed: while the "
            "device may write the lane, the lane is neither settled nor released",
        rejects=({"pre": {"requests": [_OPEN], "lanes": [{"state": "submitted"}], "binding": [0]},
                  "post": {"binding": [NONE]}, "step": "abort"},)),
    SystemStepProperty(
        "R14.4", "steps_open_only_by_enlist",
        predicate=lambda pre, post, step: pre.all_requests(lambda i: Implies(
            And(pre.unbound(i), Not(post.unbound(i))), step.name == "enlist")),
        doc="only the device accepting a job opens a lane's step (the property reads the step taken)",
        rejects=({"pre": {"requests": [_OPEN], "lanes": [{"state": "submitted"}]},
                  "post": {"binding": [0]}, "step": "commit"},)),
]


class OneEventJobLanes(CoupledSystem):
    """Lanes (request role) × device jobs (lane role); ``binding[i] = j``: lane i's step is job j's, open until settled."""

    spec = "§9.2, §14"
    bmc_size = (3, 2)
    request = OneEventLane
    lane = DeviceJobMachine
    steps = [
        *_job_steps(),
        Coupled("enlist", binding="bind", involves="both",
                guard=lambda sys, i, j: And(sys.unbound(i), sys.requests[i].at("reserved", "active"),
                                            sys.lanes[j].at("submitted")),
                doc="the device accepted job j with lane i in its batch: no lane event, the binding is the open step"),
        Coupled("commit", request=("commit",), binding="unbind", involves="both", args={"tokens": Int(ge=1)},
                guard=lambda sys, i, j: _of_job(sys, i, j, "completed")),
        Coupled("abort", binding="unbind", involves="both",
                guard=lambda sys, i, j: And(_of_job(sys, i, j, *_ENDED), sys.requests[i].at("reserved", "active"))),
        Coupled("fault", request=("fault",), involves="both",
                guard=lambda sys, i, j: _of_job(sys, i, j, *_IN_DOUBT, *_ENDED)),
        Coupled("recover", request=("recover",), binding="unbind", involves="both",
                guard=lambda sys, i, j: _of_job(sys, i, j, *_ENDED)),
        Coupled("reserve", request=("reserve",), args={"seq": Int(ge=1), "gen": Int(ge=1), "tokens": Int(ge=1)}),
        Coupled("release", request=("release",), guard=lambda sys, i, j: sys.unbound(i)),
        Coupled("confirm_release", request=("confirm_release",)),
    ]
    invariants = [
        SystemInvariant("R14.4", "open_step_lane_is_held", predicate=lambda sys: sys.all_requests(lambda i: Implies(
            Not(sys.unbound(i)), sys.requests[i].at("reserved", "active", "unknown"))),
            rejects=({"requests": [{**_OPEN, "state": "releasing"}], "lanes": [{"state": "submitted"}], "binding": [0]},)),
        SystemInvariant("R14.4", "lanes_name_only_submitted_jobs", predicate=lambda sys: sys.all_pairs(
            lambda i, j: Implies(sys.bound(i, j), Not(sys.lanes[j].at("prepared")))),
            rejects=({"requests": [_OPEN], "binding": [0]},)),
        SystemInvariant("R14.4", "unknown_lane_names_its_job", predicate=lambda sys: sys.all_requests(lambda i: Implies(
            sys.requests[i].at("unknown"), And(Not(sys.unbound(i)), *[
                Implies(sys.bound(i, j), Not(sys.lanes[j].at("submitted"))) for j in range(len(sys.lanes))]))),
            rejects=({"requests": [{**_OPEN, "state": "unknown"}], "binding": [NONE]},)),
        SystemInvariant("R5.1.2", "inflight_jobs_within_budget", counts=True,
                        predicate=lambda sys: _on_device(sys, range(len(sys.lanes))) <= MAX_INFLIGHT,
                        rejects=({"lanes": [{"state": "submitted"}, {"state": "timed_out"}, {"state": "quarantined"}]},)),
    ]
    step_properties = STEP_PROPERTIES


def _without_step_properties(system: type[CoupledSystem]) -> type[CoupledSystem]:
    d = system.definition
    return type(f"{d.name}NoSteps", (CoupledSystem,), {
        "spec": d.spec, "request": d.request, "lane": d.lane, "steps": list(d.steps),
        "invariants": list(d.invariants), "bmc_size": d.bmc_size})


def _induction(system: type[CoupledSystem], step: str) -> list[Any]:
    return check_system_induction(system.definition, steps=[step])


def test_step_properties_are_proved_for_every_size() -> None:
    results = check_system_induction(OneEventJobLanes.definition)
    assert results and all(r.ok for r in results), [r.detail for r in results if not r.ok]
    assert all("every R, L" in r.detail for r in results)
    # the step properties are goals of every variant (counted with the invariants)
    commit = next(r for r in results if r.subject.startswith("commit"))
    only = check_system_induction(OneEventJobLanes.definition, steps=["commit"],
                                  goals=[sp.name for sp in STEP_PROPERTIES])
    assert all(r.ok and f"{len(STEP_PROPERTIES)} properties preserved" in r.detail for r in only), commit.detail


@pytest.mark.parametrize("step, guard, caught_by", [
    # Mutant (V12's proto_mut.py): a lane commits while its job is still on the device.
    ("commit", lambda sys, i, j: _of_job(sys, i, j, "completed", "submitted"), "lane_commits_only_after_its_job_completed"),
    # Mutant: a lane's step closes (abort, nothing kept) while its job may still write it.
    ("abort", lambda sys, i, j: And(_of_job(sys, i, j, *_ENDED, "submitted"), sys.requests[i].at("reserved", "active")),
     "open_step_closes_only_after_its_job_ended"),
])
def test_a_wrong_step_the_invariants_let_through_is_caught(step: str, guard: Any, caught_by: str) -> None:
    original = next(s for s in OneEventJobLanes.definition.steps if s.name == step)
    mutant = OneEventJobLanes.derive(f"Mutant_{step}", replace={step: Coupled(
        step, request=original.request, binding=original.binding, involves="both", args=original.args, guard=guard)})
    # The invariants alone do not see it: every variant of the mutant step preserves them.
    escaped = _induction(_without_step_properties(mutant), step)
    assert escaped and all(r.ok for r in escaped)
    # The step property does, and names itself.
    caught = check_system_induction(mutant.definition, steps=[step], goals=[caught_by])
    assert any(not r.ok and r.broken == [caught_by] for r in caught), [r.detail for r in caught]
    # Bounded model checking finds it as a run from the initial system (reserve, submit, enlist, the wrong step),
    # and finds nothing in the system without it.
    found = check_system_bmc(mutant.definition, 1, 1, 5)
    assert not found.ok and caught_by in found.broken, found.detail
    assert found.counterexample.trace[-1]["transition"].startswith(step)
    assert check_system_bmc(_without_step_properties(mutant).definition, 1, 1, 5).ok


def test_a_step_aware_property_reads_the_step_taken() -> None:
    """Mutant: commit also (re)binds the lane — a step opened by a commit, not by the device taking a job."""
    original = next(s for s in OneEventJobLanes.definition.steps if s.name == "commit")
    mutant = OneEventJobLanes.derive("RebindingCommit", replace={"commit": Coupled(
        "commit", request=original.request, binding="bind", involves="both", args=original.args,
        guard=lambda sys, i, j: And(sys.unbound(i), sys.requests[i].at("reserved", "active"),
                                    sys.lanes[j].at("completed")))})
    caught = check_system_induction(mutant.definition, steps=["commit"], goals=["steps_open_only_by_enlist"])
    assert any(not r.ok and r.broken == ["steps_open_only_by_enlist"] for r in caught)
    found = check_system_bmc(mutant.definition, 1, 1, 6)  # read per move, under its selector
    assert not found.ok and "steps_open_only_by_enlist" in found.broken, found.detail


def test_bounded_model_checking_holds_on_the_declared_system() -> None:
    """No false alarm: the step properties hold on every run of the declared system (3 lanes, 2 jobs)."""
    result = check_system_bmc(OneEventJobLanes.definition, 3, 2, 6)
    assert result.ok, result.detail


def test_negative_witnesses_of_step_properties() -> None:
    assert check_system_witnesses(OneEventJobLanes.definition).ok
    # Mutant: a property that accepts everything is reported as accepting its witness.
    weak = [SystemStepProperty(sp.rid, sp.name, lambda pre, post, step: True, sp.doc, sp.rejects)
            for sp in STEP_PROPERTIES]
    d = OneEventJobLanes.definition
    system = type("Weak", (CoupledSystem,), {"request": d.request, "lane": d.lane, "steps": list(d.steps),
                                            "invariants": list(d.invariants), "step_properties": weak})
    result = check_system_witnesses(system.definition)
    assert not result.ok
    assert all(f"{sp.name}: accepts its negative witness" in result.detail for sp in STEP_PROPERTIES), result.detail


def test_declaration_errors() -> None:
    d = OneEventJobLanes.definition
    base = {"request": d.request, "lane": d.lane, "steps": list(d.steps), "invariants": list(d.invariants)}
    with pytest.raises(InvalidDefinition, match="step property typo"):
        type("Typo", (CoupledSystem,), {**base, "step_properties": [
            SystemStepProperty("R1", "typo", lambda pre, post, step: post.requests[0].comitted_len >= 0)]})
    with pytest.raises(InvalidDefinition, match="share a name"):
        type("Twice", (CoupledSystem,), {**base, "step_properties": [
            SystemStepProperty("R1", "open_step_lane_is_held", lambda pre, post, step: True)]})
    with pytest.raises(InvalidDefinition, match="fires nothing"):  # a step must fire a row or move the binding
        type("Idle", (CoupledSystem,), {**base, "steps": [*d.steps, Coupled("idle", involves="both")]})


def test_runtime_form_on_live_instances() -> None:
    """``broken_steps`` evaluates the declared predicates on live machines (the monitor's form)."""
    lane = OneEventLane.create(max_seq=4, lane=0)
    lane.fire("reserve", seq=1, gen=1, tokens=3)
    job = DeviceJobMachine.create(**DeviceJobMachine.definition.examples[0])
    job.fire("submit")
    before = (lane.state, lane.committed_len)
    pre = SystemView([_Frozen(lane)], [_Frozen(job)], [0], [1])
    lane.fire("commit", tokens=1)  # the runtime commits while the job is still submitted: the escaped mutant
    post = SystemView([lane], [job], [NONE], [1])
    broken = OneEventJobLanes.definition.broken_steps(pre, post, SystemStep("commit"))
    assert before == ("reserved", 0)
    assert broken == ["lane_commits_only_after_its_job_completed", "open_step_closes_only_after_its_job_ended"]
    job.fire("complete", ok=True)
    pre_ok = SystemView([_Frozen(lane)], [_Frozen(job)], [0], [1])
    lane.fire("commit", tokens=1)
    assert OneEventJobLanes.definition.broken_steps(pre_ok, SystemView([lane], [job], [NONE], [1]),
                                                    SystemStep("commit")) == []


def test_document_lists_step_properties() -> None:
    text = system_document(OneEventJobLanes.definition)
    assert "## Step properties" in text
    assert all(f"`{sp.name}`" in text for sp in STEP_PROPERTIES)


class _Frozen:
    """A snapshot of a live instance's state and values (what a monitor keeps of the pre-state)."""

    def __init__(self, machine: Any) -> None:
        d = machine.definition
        self.state = machine.state
        for name in (*d.params, *d.vars):
            setattr(self, name, getattr(machine, name))

    def at(self, *states: str) -> bool:
        return self.state in states

