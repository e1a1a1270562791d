"""The scheduler's availability as a function of the ModelMachine (#17; §10–§12, §15).

Each test drives a real :class:`~calculet.machines.model.ModelMachine` through its declared events
to one state and checks :func:`~calculet.runtime.models.availability.availability_of` there; then
``sync_availability`` (the manager's one way to tell the scheduler) and the per-tick check
``availability_faults`` (equality with the function) on a scheduler stand-in.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from calculet.machines import ModelMachine
from calculet.runtime.models.availability import availability_faults, availability_of, sync_availability
from calculet.runtime.models.generations import Generations
from calculet.runtime.scheduling.admission import ModelAvailability as A

NOT_SERVING = (A.UNLOADED, A.LOADING, A.FAILED)


def machine(*events: str | tuple[str, dict]) -> ModelMachine:
    """A generation's machine after ``events`` (an event with arguments as ``(name, args)``)."""
    m = ModelMachine.create(generation=1)
    for event in events:
        name, args = event if isinstance(event, tuple) else (event, {})
        m.fire(name, **args)
    return m


LOADED = ("load", "validated", "configured", "warmed")
PLAIN = ("drain", {"replace": False, "inflight": 0})
REPLACE = ("drain", {"replace": True, "inflight": 0})
# With one job on the device (the jobs table's count, handed to the events that read it, issue #20):
PLAIN_BUSY = ("drain", {"replace": False, "inflight": 1})
REPLACE_BUSY = ("drain", {"replace": True, "inflight": 1})
DRAINED = ("drained", {"inflight": 0})
DEADLINE = ("drain_deadline", {"inflight": 1})
RECOVERED = ("recovered", {"inflight": 0})  # the reset ended the job: none left in doubt


@pytest.mark.req("R10.4", "R12.9")
@pytest.mark.parametrize("events", [(), ("load",), ("load", "validated"), ("load", "validated", "configured"),
                                    (*LOADED, PLAIN, DRAINED), (*LOADED, PLAIN, DRAINED, "freed", "verified")],
                         ids=["unloaded", "validating", "configuring", "warming", "unloading", "unloaded_again"])
def test_a_generation_that_does_not_serve_is_what_the_alias_is_without_one(events) -> None:
    """Loading, cleaning up or unloaded: the generation says nothing; the lifecycle's ``unserved`` does."""
    m = machine(*events)
    for unserved in NOT_SERVING:
        assert availability_of(m, unserved=unserved) is unserved
        assert availability_of(m, unserved=unserved, held=True) is unserved


@pytest.mark.req("R10.4", "R12.2")
def test_ready_is_ready_and_the_only_state_new_requests_are_pinned_in_unheld() -> None:
    m = machine(*LOADED)
    assert availability_of(m) is A.READY
    assert availability_of(m, held=True) is A.READY  # a replacement at step 5: the hold decides, not this


@pytest.mark.req("R12.2", "R11.5")
def test_draining_is_draining_for_an_unload_and_ready_held_for_a_replacement() -> None:
    unload = machine(*LOADED, PLAIN)
    assert unload.state == "draining" and unload.unload_pending and not unload.replacing
    assert availability_of(unload) is A.DRAINING
    assert availability_of(unload, held=True) is A.DRAINING  # a plain unload never serves new requests
    replace = machine(*LOADED, REPLACE)
    assert replace.replacing
    assert availability_of(replace, held=True) is A.READY  # pinned ones served, new ones wait (§11 step 5)
    assert availability_of(replace, held=False) is A.DRAINING  # the replacement ended without the hold


@pytest.mark.req("R12.10", "R15.16")
@pytest.mark.parametrize("events", [
    (*LOADED, "fault"),
    (*LOADED, PLAIN_BUSY, DEADLINE),
    (*LOADED, REPLACE_BUSY, DEADLINE),
    (*LOADED, "fault", PLAIN_BUSY),
], ids=["fault", "unload_deadline", "replacement_deadline", "unload_asked_while_recovering"])
def test_recovering_is_recovering_whatever_is_pending(events) -> None:
    m = machine(*events)
    assert m.state == "recovering"
    assert availability_of(m) is A.RECOVERING
    # READY while Recovering only for a replacement's drain while it holds new requests (they wait, not 503)
    assert availability_of(m, held=True) is (A.READY if m.replacing else A.RECOVERING)


@pytest.mark.req("R12.10", "R12.2")
def test_recovery_with_an_unload_pending_goes_on_draining_never_ready() -> None:
    plain = machine(*LOADED, PLAIN_BUSY, DEADLINE, RECOVERED)
    assert plain.state == "draining"
    assert availability_of(plain, held=True) is A.DRAINING
    replace = machine(*LOADED, REPLACE_BUSY, DEADLINE, RECOVERED)
    assert replace.state == "draining" and availability_of(replace, held=True) is A.READY
    asked_during = machine(*LOADED, "fault", PLAIN_BUSY, RECOVERED)
    assert asked_during.state == "draining" and availability_of(asked_during) is A.DRAINING
    nothing_pending = machine(*LOADED, "fault", RECOVERED)
    assert nothing_pending.state == "ready" and availability_of(nothing_pending) is A.READY


@pytest.mark.req("R15.16", "R12.10", "R12.11")
def test_give_up_is_failed_at_once_even_with_jobs_in_flight() -> None:
    m = machine(*LOADED, "fault", "give_up")  # with a job still on the device: nothing waits for it
    assert m.state == "failed" and m.buffers
    assert availability_of(m) is A.FAILED
    # the job in doubt keeps the generation's buffers: an unload waits for the jobs table to hold none of it
    assert m.fire("drain", replace=False, inflight=1) == "failed" and m.buffers
    assert availability_of(m) is A.DRAINING
    assert m.fire("drain", replace=False, inflight=0) == "unloading"  # it ended late: now the unload goes on


@pytest.mark.req("R12.2", "R12.3")
def test_failed_is_draining_once_a_plain_unload_is_pending() -> None:
    busy = machine(*LOADED, "acquire", "fault", "give_up", PLAIN)
    assert busy.state == "failed" and busy.unload_pending
    assert availability_of(busy) is A.DRAINING
    busy.fire("release_request")
    busy.fire("drain", replace=False, inflight=0)  # unload_failed: idle now
    assert busy.state == "unloading"
    replaced = machine(*LOADED, "acquire", "fault", "give_up", REPLACE)
    assert replaced.state == "failed" and availability_of(replaced) is A.FAILED


@pytest.mark.req("R12.2")
def test_shutdown_is_the_process_s_and_wins_over_every_state() -> None:
    for m in (machine(), machine(*LOADED), machine(*LOADED, PLAIN), machine(*LOADED, "fault"),
              machine(*LOADED, "fault", "give_up")):
        assert availability_of(m, shutdown=True, held=True, unserved=A.LOADING) is A.SHUTDOWN
    assert availability_of(None, shutdown=True) is A.SHUTDOWN
    assert availability_of(None, unserved=A.LOADING) is A.LOADING


# ------------------------------------------------------------------------------------------------
# the manager's one way to tell the scheduler, and the per-tick check


class _Scheduler:
    """The SchedulerView the manager steers; records each ``set_model``."""

    def __init__(self) -> None:
        self.generation = 0
        self.availability = A.UNLOADED
        self.holding_new_requests = False
        self.calls: list[tuple[int, A]] = []

    def set_model(self, generation, availability, profiles=None, detail=""):
        self.generation, self.availability = generation, availability
        self.calls.append((generation, availability))


def _serving() -> tuple[Generations, _Scheduler]:
    gens = Generations("m", 7)
    gen = gens.new("m", Path("pkg"), 0.0)
    for event in ("validated", "configured", "warmed"):
        gen.machine.fire(event)
    gens.serving = gen
    return gens, _Scheduler()


@pytest.mark.req("R12.2", "R10.4")
def test_sync_tells_the_scheduler_only_what_changed_and_the_check_is_equality() -> None:
    gens, scheduler = _serving()
    assert availability_faults(gens, scheduler) == [("scheduler_names_the_serving_generation", "R10.4"),
                                                    ("scheduler_availability_is_the_model_machines", "R12.2")]
    assert sync_availability(gens, scheduler) is A.READY
    assert scheduler.calls == [(7, A.READY)] and availability_faults(gens, scheduler) == []
    sync_availability(gens, scheduler)
    assert len(scheduler.calls) == 1  # unchanged: set_model (which acts on requests) is not repeated
    m = gens.serving.machine
    m.fire("fault")
    assert availability_faults(gens, scheduler) == [("scheduler_availability_is_the_model_machines", "R12.2")]
    sync_availability(gens, scheduler)
    assert scheduler.availability is A.RECOVERING and availability_faults(gens, scheduler) == []
    scheduler.availability = A.SHUTDOWN  # the process shuts down: nothing the manager syncs leaves it
    m.fire("give_up")
    assert sync_availability(gens, scheduler) is A.SHUTDOWN and scheduler.availability is A.SHUTDOWN
    assert availability_faults(gens, scheduler) == []


@pytest.mark.req("R12.2", "R11.5")
def test_the_hold_released_under_a_replacement_drain_is_seen_as_a_stale_ready() -> None:
    """A draining generation stated READY after the hold is gone would pin new requests to it."""
    gens, scheduler = _serving()
    sync_availability(gens, scheduler)
    scheduler.holding_new_requests = True
    gens.serving.machine.fire("drain", replace=True, inflight=0)
    assert sync_availability(gens, scheduler) is A.READY
    scheduler.holding_new_requests = False  # the load failed and released the hold, nothing synced
    assert availability_faults(gens, scheduler) == [("scheduler_availability_is_the_model_machines", "R12.2")]
    assert sync_availability(gens, scheduler) is A.DRAINING


@pytest.mark.req("R12.9")
def test_no_generation_serving_is_the_lifecycle_s_unserved_value() -> None:
    gens, scheduler = _serving()
    sync_availability(gens, scheduler)
    gens.serving = None
    gens.unserved = A.LOADING
    assert availability_faults(gens, scheduler) == [("scheduler_availability_is_the_model_machines", "R12.2")]
    assert sync_availability(gens, scheduler) is A.LOADING
    assert scheduler.generation == 7  # the scheduler keeps naming the last generation
