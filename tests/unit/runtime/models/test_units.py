"""Unit tests of the ModelManager's pure parts: the capacity plan (§11 step 4, §13.1), the map of
load steps to ModelMachine states (ambiguity 14), operations on the actor, what step 3 and step 8
compare (ModelFacts, EngineContract, plan_session) and the scheduler's replacement hold (§11 step 5).
"""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest

from calculet.adapters.calrt import DeviceCapabilities, MemoryFootprint
from calculet.packages.manifest import CalbinManifest
from calculet.adapters.sim import package_dir
from calculet.adapters.sim.memory import (
    GIB,
    MIB,
    REFERENCE_KV_BYTES,
    REFERENCE_PARAMETER_BYTES,
    REFERENCE_RESERVED_BYTES,
)
from calculet.errors import ConfigError, DefinitionError
from calculet.machines import ModelMachine, TransitionNotAllowed
from calculet.runtime.scheduling.admission import Decision, ModelAvailability
from calculet.clock import FakeClock
from calculet.runtime.models.capacity import CapacityPlanner, ChipMemory, ResidentModel
from calculet.runtime.models.operations import Operation, Wait
from calculet.runtime.models.reports import LoadStep, UnloadStep
from calculet.runtime.execution.model_facts import ModelFacts
from calculet.runtime.execution.session_plan import plan_session
from tests.unit.runtime.runtime_support import Harness, make_config

REFERENCE = MemoryFootprint(REFERENCE_PARAMETER_BYTES, REFERENCE_KV_BYTES, REFERENCE_RESERVED_BYTES, "bf16", (0, 1))
BOARD = (ChipMemory(0, 16 * GIB, 0), ChipMemory(1, 16 * GIB, 0))


def _loaded(board: tuple[ChipMemory, ...], footprint: MemoryFootprint) -> tuple[ChipMemory, ...]:
    share = -(-footprint.reserved_bytes // len(footprint.chiplets))
    return tuple(dataclasses.replace(c, used_bytes=c.used_bytes + share) if c.chip in footprint.chiplets else c
                 for c in board)


# ---------------------------------------------------------------------------------------------
# capacity plan
# ---------------------------------------------------------------------------------------------


@pytest.mark.req("R13.1.5", "R11.4")
def test_the_planner_fits_one_reference_model_and_refuses_a_second_resident_one() -> None:
    """Fed the §13.1 figures: one reference model (28.150 GiB over two 16 GiB chiplets) fits on an
    empty board; a second one beside it does not, and the refusal states every figure."""
    planner = CapacityPlanner()
    first = planner.plan(REFERENCE, 1 * MIB, BOARD, [])
    assert first.feasible and first.need_bytes[0] > 14 * GIB
    second = planner.plan(REFERENCE, 1 * MIB, _loaded(BOARD, REFERENCE), [ResidentModel(1, REFERENCE, stays=True)])
    assert not second.feasible
    for figure in ("28.150 GiB", "16.938 GiB", "3.750 GiB", "7.462 GiB", "short on chiplet(s) [0, 1]",
                   "second large model", "staying resident: generation 1"):
        assert figure in second.detail, (figure, second.detail)


@pytest.mark.req("R13.1.2", "R11.6")
def test_a_model_drained_first_gives_its_reservation_back_to_the_plan() -> None:
    """Time-switching (no co-residency): the old generation is drained before step 7, so the plan
    counts its reservation as free again."""
    plan = CapacityPlanner().plan(REFERENCE, 1 * MIB, _loaded(BOARD, REFERENCE),
                                  [ResidentModel(1, REFERENCE, stays=False)])
    assert plan.feasible and "drained first" in plan.detail


def test_the_planner_refuses_a_chiplet_the_board_does_not_have() -> None:
    footprint = dataclasses.replace(REFERENCE, chiplets=(0, 5))
    plan = CapacityPlanner().plan(footprint, 0, BOARD, [])
    assert not plan.feasible and "chiplet(s) [5] do not exist" in plan.detail


def test_job_pools_go_to_the_chiplet_with_the_most_room() -> None:
    small = MemoryFootprint(10 * MIB, 10 * MIB, 30 * MIB, "fp64", (0,))
    board = (ChipMemory(0, 64 * MIB, 0), ChipMemory(1, 64 * MIB, 0))
    plan = CapacityPlanner().plan(small, 5 * MIB, board, [])
    assert plan.need_bytes == (30 * MIB, 5 * MIB) and plan.feasible


# ---------------------------------------------------------------------------------------------
# steps and states
# ---------------------------------------------------------------------------------------------


@pytest.mark.req("R10.1", "R11.9")
def test_load_steps_map_to_the_declared_model_states_in_order() -> None:
    """Ambiguity 14, decided: steps 1–4 Validating, 5–7 Configuring, 8–9 Warming, 10–11 Ready —
    and the ModelMachine walks exactly that order (Ready only after warming, i.e. golden/warm-up)."""
    assert [s.state for s in LoadStep] == ["validating"] * 4 + ["configuring"] * 3 + ["warming"] * 2 + ["ready"] * 2
    machine = ModelMachine.create(generation=1)
    seen = [machine.fire("load")]
    for event in ("validated", "configured", "warmed"):
        seen.append(machine.fire(event))
    assert seen == ["validating", "configuring", "warming", "ready"]
    assert [s.title for s in UnloadStep][0].startswith("Ready -> Draining") and len(UnloadStep) == 7
    assert ModelMachine.definition.states.keys() >= {"unloaded", "validating", "configuring", "warming", "ready",
                                                     "draining", "unloading", "recovering", "failed"}


# ---------------------------------------------------------------------------------------------
# operations
# ---------------------------------------------------------------------------------------------


def test_an_operation_runs_until_it_waits_and_resumes_when_ready_or_at_its_deadline() -> None:
    clock = FakeClock()
    flag = {"ready": False}
    trail: list[Any] = []

    def body() -> Any:
        trail.append("start")
        got = yield Wait(lambda: flag["ready"], None, "the flag")
        trail.append(("flag", got))
        got = yield Wait(lambda: False, clock.now() + 5.0, "a deadline")
        trail.append(("deadline", got))
        return "done"

    op = Operation("load", "qwen3", 2, clock).start(body())
    assert not op.advance() and op.waiting_for == "the flag" and op.deadline is None
    flag["ready"] = True
    assert not op.advance() and op.deadline == 5.0
    clock.advance(4.9)
    assert not op.advance()
    clock.advance(0.1)
    assert op.advance() and op.done and op.reply.wait(0) == "done"
    assert trail == ["start", ("flag", True), ("deadline", False)]


def test_an_operation_delivers_its_error_and_an_aborted_one_fails_its_caller() -> None:
    clock = FakeClock()

    def failing() -> Any:
        yield Wait(lambda: True, None, "nothing")
        raise DefinitionError("step failed")

    op = Operation("load", "qwen3", 2, clock).start(failing())
    assert op.advance()
    with pytest.raises(DefinitionError, match="step failed"):
        op.reply.wait(0)

    def waiting() -> Any:
        yield Wait(lambda: False, None, "forever")

    stuck = Operation("unload", "qwen3", 1, clock).start(waiting())
    assert not stuck.advance()
    stuck.abort(RuntimeError("engine stopped"))
    with pytest.raises(RuntimeError, match="engine stopped"):
        stuck.reply.wait(0)


# ---------------------------------------------------------------------------------------------
# step 3 and step 8
# ---------------------------------------------------------------------------------------------


def _facts(variant: str = "current") -> ModelFacts:
    path = package_dir(variant)  # type: ignore[arg-type]
    raw = (path / "manifest.json").read_bytes()
    return ModelFacts.from_manifest(CalbinManifest.parse(raw), "0" * 64)


@pytest.mark.req("R11.8")
def test_step_8_names_every_difference_between_manifest_and_device() -> None:
    facts = _facts()
    b1 = facts.profiles[0]
    tensors = tuple(dataclasses.replace(t, shape=(1, 999)) if t.name == "logits" else t for t in b1.tensors)
    device = dataclasses.replace(facts, profiles=(dataclasses.replace(b1, tensors=tensors),),
                                 package_sha256="1" * 64, max_sequences=None)
    problems = facts.differences(device)
    assert any("tensor 'logits': manifest [1, 260] fp64 output, device [1, 999] fp64 output" in p for p in problems)
    assert any(p.startswith("package_sha256:") for p in problems) and len(problems) == 2
    assert facts.differences(dataclasses.replace(facts, max_sequences=None)) == []


@pytest.mark.req("R15.19", "R15.18", "R8.4")
def test_plan_session_refuses_what_the_manifest_or_contract_cannot_serve() -> None:
    facts = _facts()
    with pytest.raises(ConfigError, match="B8"):
        plan_session(facts, make_config(batch={"profiles": [1, 8], "select_thresholds": {8: 2}}))
    with pytest.raises(DefinitionError, match="exceeds the 64 KV sequences"):
        plan_session(facts, make_config(admission={"max_sequences": 65}))
    plan = plan_session(facts, make_config())
    assert plan.configured == (1,) and plan.max_seq == 256 and plan.pool_bytes() > 0
    future = plan_session(_facts("future"), make_config(batch={"profiles": [1, 4], "select_thresholds": {4: 2}}))
    assert future.configured == (1, 4)
    problems = plan.contract().differences(future.contract())
    assert any(p.startswith("incremental_prefill") for p in problems)
    assert any(p.startswith("reset_configuration_verified") for p in problems)
    assert plan.contract().differences(plan.contract()) == []
    assert isinstance(plan.capabilities, DeviceCapabilities)


# ---------------------------------------------------------------------------------------------
# the scheduler's hold (§11 step 5)
# ---------------------------------------------------------------------------------------------


@pytest.mark.req("R11.5", "R10.3")
def test_while_held_new_requests_wait_unbound_and_are_pinned_when_the_hold_ends() -> None:
    """Step 5: a new request is not pinned to the serving generation while a replacement runs; the
    ones already pinned keep their generation; releasing the hold pins the waiting ones to the
    generation that is Ready then."""
    h = Harness.build()
    before = h.submit().request_id
    h.scheduler.hold_new_requests(True)
    during = h.submit()
    assert during.outcome.decision is Decision.QUEUE and h.state(during.request_id) == "waiting_model"
    assert h.rec(during.request_id).generation == 0 and h.rec(before).generation == 1
    h.scheduler.set_model(2, ModelAvailability.READY, h.scheduler.profiles)
    assert h.state(during.request_id) == "waiting_model", "still held after the switch until released"
    h.scheduler.hold_new_requests(False)
    assert h.rec(during.request_id).generation == 2 and h.scheduler.holding_new_requests is False


@pytest.mark.req("R12.2", "R5.2.5")
def test_held_requests_end_with_503_when_no_generation_will_come() -> None:
    h = Harness.build()
    h.scheduler.hold_new_requests(True)
    rid = h.submit().request_id
    assert h.scheduler.reject_waiting_model("no model") == 1
    outcome = h.scheduler.registry.outcome(rid)
    assert outcome.state == "failed" and outcome.http_status == 503 and outcome.detail == "no model"


# ---------------------------------------------------------------------------------------------
# a generation's jobs on the device: counted in the jobs table, not fired into its machine (issue #20)
# ---------------------------------------------------------------------------------------------


def test_a_generation_counts_its_jobs_on_the_device_in_the_jobs_table() -> None:
    """``Generation.inflight`` (the ``inflight`` argument of drained/drain_deadline/recovered/...) is the number of
    the table's jobs of that generation the device may still write: submitted, timed out or quarantined. Catches a
    count that takes a prepared job (``state not in ("completed", "failed")``: 4 here, checked) and one that forgets
    the generation (4, checked); the machine refuses ``drained`` while the table holds a job of it."""
    from types import SimpleNamespace

    from calculet.machines import DeviceJobMachine
    from calculet.machines.job import JobEngine
    from calculet.runtime.models.manager import ModelManager

    table: list[Any] = []
    engine: Any = SimpleNamespace(config=make_config(), clock=FakeClock(), run_commands=lambda: None,
                                  scheduler=SimpleNamespace(jobs=table))
    manager = ModelManager(engine)
    gen = manager._gens.new(manager.alias, package_dir(), 0.0)  # noqa: SLF001 - a generation without a load
    assert not manager.may_submit(gen.id) and not manager.may_submit(99)
    for event in ("validated", "configured", "warmed"):
        gen.machine.fire(event)
    assert manager.may_submit(gen.id) and gen.inflight() == 0 and gen.idle()

    def job(job_id: int, generation: int, *events: str) -> Any:
        machine = DeviceJobMachine.create(job_id=job_id, generation=generation, engine=JobEngine.PING, lanes=1)
        for event in events:
            machine.fire(event, **({"ok": True} if event == "complete" else {}))
        return SimpleNamespace(generation=generation, state=machine.state)

    table += [job(1, gen.id, "submit"), job(2, gen.id, "submit", "timeout"),
              job(3, gen.id, "submit", "timeout", "quarantine"), job(4, gen.id), job(5, gen.id + 1, "submit"),
              job(6, gen.id, "submit", "complete")]
    assert gen.inflight() == 3 and not gen.idle()
    assert manager.status_now().generations[0].inflight_jobs == 3
    gen.machine.fire("drain", replace=False, inflight=gen.inflight())
    with pytest.raises(TransitionNotAllowed):
        gen.machine.fire("drained", inflight=gen.inflight())
    del table[:3]
    assert gen.inflight() == 0 and gen.idle()
    assert gen.machine.fire("drained", inflight=gen.inflight()) == "unloading"
    assert not manager.may_submit(gen.id)


def test_the_tick_monitor_holds_the_tables_jobs_on_the_device_to_the_executors() -> None:
    """``counter_faults``' R10.2 job equality: the jobs the table has on the device, less those quarantined by a
    fault their own result reported (the executor handed that result over), are the executor's jobs in flight —
    except while a recovery is pending or given up (the executor forgot its jobs; the table keeps them until a
    reset ends them). Catches a table that keeps an ended job (one too many), an executor that forgets a job the
    table still waits on, a count that takes the fault-quarantined job (one too many: checked by dropping the
    subtraction), and the recovery condition dropped (a fault reported after a failed reset: checked)."""
    from types import SimpleNamespace

    from calculet.runtime.models.manager import ModelManager
    from calculet.runtime.scheduling.jobs import DECODE, InflightTable

    table = InflightTable(max_inflight=2)
    state = SimpleNamespace(executor=0, pending=False, failed=False)
    scheduler = SimpleNamespace(jobs=table, holding_new_requests=False, availability=ModelAvailability.UNLOADED,
                                generation=0)
    engine: Any = SimpleNamespace(config=make_config(), clock=FakeClock(), run_commands=lambda: None,
                                  scheduler=scheduler, inflight_jobs=lambda: state.executor,
                                  recovery_pending=lambda: state.pending, recovery_failed=lambda: state.failed)
    manager = ModelManager(engine)
    gen = manager._gens.new(manager.alias, package_dir(), 0.0)  # noqa: SLF001 - a generation without a load
    for event in ("validated", "configured", "warmed"):
        gen.machine.fire(event)

    def job_fault() -> bool:
        return ("inflight_jobs_are_the_executors_jobs_on_the_device", "R10.2") in manager.counter_faults([])

    running = table.plan(1, DECODE, gen.id, 1, None)
    table.fire(running, "submit")
    assert job_fault()  # the executor does not have the job the table waits on
    state.executor = 1
    assert not job_fault()
    faulted = table.plan(2, DECODE, gen.id, 1, None)
    table.fire(faulted, "submit")
    table.fire(faulted, "fault")  # its result reported a CCU fault: the executor handed it over
    assert faulted.state == "quarantined" and gen.inflight() == 2 and not job_fault()
    state.executor = 0  # a reset that failed: the executor forgot its jobs, the table keeps them
    assert job_fault()
    state.pending = True
    assert not job_fault()
    state.pending, state.failed = False, True
    assert not job_fault()
