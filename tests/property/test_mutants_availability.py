"""Issue #17 class 6, the scheduler's availability: seeded faults in the runtime that set it by hand
again, rejected by the engine's per-tick monitor on the live engine (§10–§12, §15).

The availability is derived (``runtime/models/availability.py``: ``availability_of`` of the serving
generation's ModelMachine, handed over by ``sync_availability`` after every event the manager
fires) and the tick monitor (``ModelManager.counter_faults``) checks the scheduler's copy is
*equal* to the function. Each mutant replaces one recovery hook by a hand-set version of the kind
the runtime had before — the machine moves, the scheduler is told something else — and the same
run with the real hook passes. (B owns ``test_mutants.py``; these sit beside it.)
"""

from __future__ import annotations

import pytest

from calculet.invariants.checks import check_machine
from calculet.invariants.mutation import replace_row
from calculet.machines import ModelMachine
from calculet.machines.errors import InvariantViolation
from calculet.runtime.engine.types import EngineOptions
from calculet.runtime.models.recovery import GenerationRecovery
from calculet.runtime.scheduling.admission import Decision, ModelAvailability
from calculet.runtime.streams.writer import StreamWriter
from calculet.adapters.sim.faults import FaultRule, InjectedFault
from calculet.adapters.calrt import JobKind
from tests.integration.engine.support import engine_config, make_driver, request, submit_all

PREFILL_FIRST = {"decode_weight": 1, "short_prefill_weight": 64}  # as tests/integration/engine/test_e2e.py


def _hand_set_ready_on_fault(self: GenerationRecovery) -> None:
    """The fault: the machine goes Recovering, the scheduler is told READY by hand (a stale copy)."""
    gen = self._gens.serving
    if gen is not None and gen.machine.at("ready", "draining"):
        gen.machine.fire("fault")
    self._engine.scheduler.set_model(gen.id, ModelAvailability.READY)


def _hand_set_failed_on_give_up(self: GenerationRecovery, detail: str) -> None:
    """The fault (the pre-#17 hook): FAILED stated at once while the machine stays Recovering,
    because ``give_up`` was refused with a job still in flight."""
    gen = self._gens.serving
    if gen is not None and gen.machine.at("recovering") and gen.inflight() == 0:
        gen.machine.fire("give_up")
    self._engine.scheduler.set_model(self._engine.scheduler.generation, ModelAvailability.FAILED, detail=detail)


def _timeout_run(*, resets: int = 5, rounds: int = 1) -> tuple[object, str]:
    """A decode job times out (the device left in doubt) in each of ``rounds`` rounds under
    ping/pong, the other engine's job still in flight (so recovery waits for it over several ticks:
    a stale copy is there for the monitor to see); returns the driver and the scheduler's
    availability at the end."""
    config = engine_config(profiles=[1, 4], inflight=2, queues=PREFILL_FIRST,
                           recovery={"max_resets_per_10min": resets})
    driver, runtime = make_driver("future", config=config, numerics=False,
                                  options=EngineOptions(verify_golden=False, job_timeout_s=0.2, monitor_mode=None))
    rule = FaultRule(InjectedFault.TIMEOUT, job_kind=JobKind.DECODE, nth=2)
    for _ in range(rounds):
        runtime.device.faults.add(rule)
        submit_all(driver, [request(i, 6) for i in range(8)])
        driver.run_until_idle(max_time_s=5.0)
    return driver, driver.statistics().availability


@pytest.mark.req("R12.2", "R12.10", "R17.2.3")
@pytest.mark.parametrize("hook", [GenerationRecovery.on_fault, _hand_set_ready_on_fault], ids=["real", "hand_set"])
def test_a_stale_ready_while_recovering_is_rejected_by_the_tick_monitor(monkeypatch: pytest.MonkeyPatch, hook) -> None:
    """The serving generation is told of a fault (``on_fault``, as the engine calls it), then the
    engine ticks: with the real hook the next request is refused 503 (RECOVERING); with the
    hand-set one the scheduler still says READY while the machine is Recovering, and the tick's
    monitor raises (had a request come first, it would have been pinned to a Recovering generation).
    (A real timeout is recovered within the actor call that saw it, whose ``on_recovered`` syncs
    again; the hook is called directly so the stale copy outlives the call.)"""
    driver, _ = make_driver("future", config=engine_config(profiles=[1, 4], inflight=2, queues=PREFILL_FIRST),
                            numerics=False, options=EngineOptions(verify_golden=False, monitor_mode=None))
    first = submit_all(driver, [request(0, 4)])
    driver.run_until_idle()
    assert first[0].result(0).raw_tokens and driver.statistics().availability == "ready"
    monkeypatch.setattr(GenerationRecovery, "on_fault", hook)
    recovery = driver.core.models.recovery
    if hook is _hand_set_ready_on_fault:
        recovery.on_fault()
        with pytest.raises(InvariantViolation) as caught:
            driver.step()  # the engine's next tick, before any request could be pinned to it
        assert caught.value.invariant == "scheduler_availability_is_the_model_machines"
    else:
        recovery.on_fault()
        driver.step()
        late = driver.submit(request(1, 4), StreamWriter())
        driver.run_until_idle()
        assert late.outcome.decision is Decision.REJECT_UNAVAILABLE
        assert driver.statistics().availability == "recovering"


@pytest.mark.req("R15.16", "R12.10", "R17.2.3")
def test_failed_stated_by_hand_while_the_machine_is_recovering_is_rejected(monkeypatch: pytest.MonkeyPatch) -> None:
    driver, availability = _timeout_run(resets=1, rounds=2)
    assert driver.statistics().recovery.state == "failed" and availability == "failed"
    monkeypatch.setattr(GenerationRecovery, "on_give_up", _hand_set_failed_on_give_up)
    with pytest.raises(InvariantViolation) as caught:
        _timeout_run(resets=1, rounds=2)
    assert caught.value.invariant == "scheduler_availability_is_the_model_machines"


# ------------------------------------------------------------------------------------------------
# The declaration facts the function reads (model.py, #17): each seeded fault in the ModelMachine
# is rejected by verify's consecution proof, naming the invariant that states the fact.

def _model_mutant(name: str, edit):
    from calculet.invariants.mutation import derive

    return derive(ModelMachine, name, edit)


MODEL_MUTANTS = [
    ("RecoveredForgetsTheUnload", "recovery with an unload pending goes back to Ready (serving again)",
     lambda rows, d: replace_row(rows, "recovered@recovering->draining", target=d.states["ready"]),
     "unload_is_never_undone"),
    ("SecondDrainFlipsTheCause", "an unload asked again while one is pending overwrites its cause",
     lambda rows, d: replace_row(rows, "drain@recovering",
                                 effect=lambda v, replace: {"unload_pending": True, "replacing": replace}),
     "drain_cause_is_fixed"),
    ("DrainForgetsTheUnload", "drain leaves Ready without recording the unload",
     lambda rows, d: replace_row(rows, "drain@ready", effect=lambda v, replace: {"replacing": replace}),
     "unload_is_never_undone"),
    ("UnloadFailedWithJobsInFlight", "a Failed generation is cleaned up while jobs it gave up on are in flight",
     lambda rows, d: replace_row(rows, "unload_failed", guard=lambda v: v.active_requests == 0),
     "determinism:drain@failed"),  # the earlier drain@failed row masks it in consecution; the overlap is refused
    # (the jobs in doubt are no fact of the machine any more — the jobs table counts them, issue #20: a generation
    # Ready or unloading while they are on the device is rejected on the joint system, test_mutants.py
    # ReadyWithJobsInDoubt, GenResumesUnloadWithJobsInDoubt)
]


@pytest.mark.req("R12.2", "R11.5", "R12.3", "R12.10", "R17.2.3")
@pytest.mark.parametrize("name, description, edit, expected", MODEL_MUTANTS, ids=[m[0] for m in MODEL_MUTANTS])
def test_a_model_machine_that_loses_a_fact_the_availability_reads_is_rejected(name, description, edit, expected):
    mutant = _model_mutant(name, edit)
    failures = [r for r in check_machine(mutant.definition, include=["consecution", "determinism"]) if not r.ok]
    rejected = {n for r in failures for n in r.broken}
    rejected |= {f"determinism:{r.detail.split()[0]}" for r in failures if r.check == "determinism"}
    assert expected in rejected, f"{name} ({description}) was not rejected: {rejected}"


def test_the_real_model_machine_passes_the_same_proofs():
    assert all(r.ok for r in check_machine(ModelMachine.definition, include=["consecution", "determinism"]))
