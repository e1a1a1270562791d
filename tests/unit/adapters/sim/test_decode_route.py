"""Decode routes (issue #20): the simulated device checks a decode job's calbin, profile and buffer pair once per
configuration and each step's lanes and buffer binding every time. A routed step is accepted only where the full
checks accept it, and refused with the code and message the full checks give; whatever changes the configuration
(buffers freed, a reset) sends the next job through the full checks again."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from calculet.adapters.calrt import DecodeJob, JobKind, ReturnCode
from calculet.adapters.host_driver import HostDriver
from calculet.adapters.sim import CostModel, FaultRule, InjectedFault, SimConfig, SimSession, TimeMode, open_sim
from calculet.errors import CalculetError
from calculet.machines.job import JobEngine


@pytest.fixture(params=[TimeMode.VIRTUAL, TimeMode.REAL])
def rig(request: pytest.FixtureRequest) -> Iterator[tuple[SimSession, HostDriver, int, int]]:
    """The null device (B1), one sequence prefilled and decoded once: its decode route exists. In virtual time
    a routed step takes ``decode_step`` and the device's own submit; in real time, the null plan's step
    (:mod:`calculet.adapters.sim.null_plan`): each test holds both to the full checks."""
    with open_sim("current", config=SimConfig(time_mode=request.param, cost=CostModel.null())) as session:
        assert (session.device._null is not None) is (request.param is TimeMode.REAL)  # noqa: SLF001
        driver = HostDriver(session.device, session.calbin, session.kv, generation=1)
        seq = session.kv.allocate_sequence()
        token = driver.prefill(seq, [256, 72, 105]).lanes[0].greedy_token
        step = driver.decode(1, [(seq, token)])
        assert step.ok and len(session.device._gate.routes) == 1  # the route the later steps take
        yield session, driver, seq, step.lanes[0].greedy_token


def job(session: SimSession, driver: HostDriver, seq: int, token: int, position: int | None = None) -> DecodeJob:
    """A B1 decode step of ``seq`` on PING (at its committed length unless ``position`` says otherwise)."""
    at = session.kv.committed_length(seq) if position is None else position
    return DecodeJob.of_lanes(1, session.calbin.calbin_id, 1, JobEngine.PING, driver.buffers(JobKind.DECODE, 1),
                              (seq,), (token,), (at,), (1,))


def refusal(session: SimSession, spec: DecodeJob) -> tuple[str, str]:
    with pytest.raises(CalculetError) as caught:
        session.device.submit(spec)
    return caught.value.rc.name, str(caught.value)  # type: ignore[attr-defined]


def test_a_routed_step_is_accepted_and_commits(rig: tuple[SimSession, HostDriver, int, int]) -> None:
    session, driver, seq, token = rig
    before = session.kv.committed_length(seq)
    session.device.submit(job(session, driver, seq, token))
    assert [r.ok for r in session.device.poll()] == [True] and session.kv.committed_length(seq) == before + 1


@pytest.mark.parametrize("fault", ["position_behind", "position_ahead", "token_outside_vocab", "negative_token"])
def test_a_routed_step_is_refused_as_the_full_checks_refuse_it(rig: tuple[SimSession, HostDriver, int, int],
                                                               fault: str) -> None:
    """Mutant caught: ``decode_step`` accepting a lane the full checks refuse (its position or token check gone)."""
    session, driver, seq, token = rig
    at = session.kv.committed_length(seq)
    spec = {"position_behind": lambda: job(session, driver, seq, token, at - 1),
            "position_ahead": lambda: job(session, driver, seq, token, at + 1),
            "token_outside_vocab": lambda: job(session, driver, seq, session.calbin.vocab_size),
            "negative_token": lambda: job(session, driver, seq, -1)}[fault]()
    got = refusal(session, spec)
    session.device._gate.routes.clear()  # the same job through the full checks alone
    assert refusal(session, spec) == got and got[0] == "INVALID_ARGUMENT"
    assert session.kv.committed_length(seq) == at  # nothing was committed


def test_a_freed_sequence_is_refused_on_a_route(rig: tuple[SimSession, HostDriver, int, int]) -> None:
    session, driver, seq, token = rig
    spec = job(session, driver, seq, token)
    session.kv.free_sequence(seq)
    got = refusal(session, spec)
    session.device._gate.routes.clear()
    assert refusal(session, spec) == got


def test_freed_buffers_send_the_next_job_through_the_full_checks(rig: tuple[SimSession, HostDriver, int, int]) -> None:
    """Mutant caught: ``free_job_buffers`` not forgetting the routes (a job on freed buffers accepted)."""
    session, driver, seq, token = rig
    spec = job(session, driver, seq, token)
    session.device.free_job_buffers(driver.buffers(JobKind.DECODE, 1))
    assert not session.device._gate.routes
    assert refusal(session, spec)[0] == "NOT_FOUND"


def test_a_reset_forgets_every_route(rig: tuple[SimSession, HostDriver, int, int]) -> None:
    session, driver, seq, token = rig
    spec = job(session, driver, seq, token)
    session.device.reset_configuration()
    assert not session.device._gate.routes
    with pytest.raises(CalculetError):
        session.device.submit(spec)


def test_a_poisoned_device_refuses_a_routed_step(rig: tuple[SimSession, HostDriver, int, int]) -> None:
    """Mutant caught: the poison not forgetting the routes (§12): the route's step — ``decode_step`` in virtual
    time, the null plan's in real time — would accept the job a poisoned device must refuse."""
    session, driver, seq, token = rig
    device = session.device
    device.faults.add(FaultRule(InjectedFault.CCU_FAULT, job_kind=JobKind.DECODE))
    assert device.statistics().poisoned is None
    faulted = driver.decode(1, [(seq, token)])
    assert faulted.rc is ReturnCode.CCU_FAULT and device.statistics().poisoned is ReturnCode.CCU_FAULT
    device.faults.clear()  # nothing armed: the null device is back on its plan, the poison stays until a reset
    assert refusal(session, job(session, driver, seq, token))[0] == "INVALID_STATE"


def test_a_fault_armed_on_a_live_device_applies_from_the_next_step(rig: tuple[SimSession, HostDriver, int, int]
                                                                   ) -> None:
    """Mutant caught: the null plan's step not asking whether a fault is armed (or ``FaultInjector.armed`` not set
    by ``add``): the next routed step would skip the injector and complete OK."""
    session, driver, seq, token = rig
    device = session.device
    device.faults.add(FaultRule(InjectedFault.BAD_COUNTERS, job_kind=JobKind.DECODE))
    step = driver.decode(1, [(seq, token)])
    assert step.ok and step.counters.lanes_valid != 1  # corrupted counters: the injector decided this step
    assert device.statistics().faults.injected[InjectedFault.BAD_COUNTERS] == 1
    device.faults.clear()
    before = device.statistics().faults.decisions
    assert driver.decode(1, [(seq, step.lanes[0].greedy_token)]).ok
    assert device.statistics().faults.decisions == before + 1  # counted, with or without asking the injector


def test_a_job_left_on_the_device_sends_steps_to_the_full_checks(rig: tuple[SimSession, HostDriver, int, int]
                                                                  ) -> None:
    """Mutant caught: the null plan's step without its ``timeline.pending`` check — it would accept a step on the
    engine and buffers of a job that never completes (an injected TIMEOUT), which the full checks refuse."""
    session, driver, seq, token = rig
    device = session.device
    other = session.kv.allocate_sequence()
    first = driver.prefill(other, [256, 72]).lanes[0].greedy_token
    device.faults.add(FaultRule(InjectedFault.TIMEOUT, job_kind=JobKind.DECODE))
    device.submit(job(session, driver, seq, token))  # never completes: engine, buffers and sequence stay taken
    device.faults.clear()
    got = refusal(session, job(session, driver, other, first))
    assert got[0] in ("DEVICE_BUSY", "BUFFER_IN_USE")
    device._gate.routes.clear()  # noqa: SLF001 - the same job through the full checks alone
    assert refusal(session, job(session, driver, other, first)) == got
