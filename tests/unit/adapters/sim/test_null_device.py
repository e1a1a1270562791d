"""The null device (issue #20): ``CostModel.null()`` / ``--sim-cost null`` — no device time and no
numerics, tokens from the cheap deterministic rule, so a benchmark measures the host alone."""

from __future__ import annotations

from calculet.adapters.sim import CostModel, SimConfig, TimeMode, open_sim
from calculet.adapters.sim.model import pseudo_continuation
from calculet.adapters.host_driver import HostDriver
from calculet.run import COSTS, build_parser


def test_the_null_cost_turns_numerics_off_and_charges_nothing() -> None:
    cost = CostModel.null()
    assert cost.numerics is False and cost.prefill_s(500) == 0 and cost.decode_s(16) == 0
    assert SimConfig(cost=cost).numerics is False
    assert SimConfig(time_mode=TimeMode.REAL, cost=cost).numerics is False
    assert SimConfig(cost=CostModel.instant()).numerics is True  # instant keeps the model


def test_the_null_device_answers_the_deterministic_pseudo_tokens() -> None:
    session = open_sim("current", config=SimConfig(cost=CostModel.null()))
    driver = HostDriver(session.device, session.calbin, session.kv, generation=1)
    seq = session.kv.allocate_sequence()
    prompt = [256, 72, 105]
    first = driver.prefill(seq, prompt)
    assert first.ok and first.lanes[0].logits is None
    tokens = [first.lanes[0].greedy_token]
    for _ in range(4):
        step = driver.decode(1, [(seq, tokens[-1])])
        assert step.ok
        tokens.append(step.lanes[0].greedy_token)
    assert tokens == pseudo_continuation(prompt, 5)


def test_sim_cost_null_is_a_command_line_choice() -> None:
    assert build_parser().parse_args(["--sim-cost", "null"]).sim_cost == "null"
    assert COSTS["null"]() == CostModel.null()


def test_in_real_time_the_null_device_completes_a_job_inside_submit_without_its_worker() -> None:
    """Issue #20: zero device time and no numerics leave nothing for the worker thread to do, so the result is
    there when submit returns (poll has it, the sequence is committed) and the worker is never woken for it;
    a WaitAny caller is still answered at once."""
    session = open_sim("current", config=SimConfig(time_mode=TimeMode.REAL, cost=CostModel.null()))
    device = session.device
    try:
        assert device.completes_at_submit
        driver = HostDriver(device, session.calbin, session.kv, generation=1)
        seq = session.kv.allocate_sequence()
        woken = []
        real_notify = device._worker_cond.notify_all
        device._worker_cond.notify_all = lambda: woken.append(1) or real_notify()  # type: ignore[method-assign]
        ticket = device.submit(driver.prefill_job(seq, [256, 72, 105]))
        results = device.poll()
        assert [r.job_id for r in results] == [ticket.job_id] and results[0].ok
        assert session.kv.committed_length(seq) == 3 and not device.inflight()
        assert woken == []
        ticket = device.submit(driver.decode_job(1, [(seq, results[0].lanes[0].greedy_token)]))
        assert [r.job_id for r in device.wait_any(0.0)] == [ticket.job_id] and woken == []
    finally:
        device.close()


def test_in_real_time_a_device_with_cost_still_completes_on_its_worker() -> None:
    session = open_sim("current", config=SimConfig(time_mode=TimeMode.REAL, numerics=False,
                                                   cost=CostModel(0.0, 0.0, 0.02, 0.0, 1.0)))
    device = session.device
    try:
        assert not device.completes_at_submit
        driver = HostDriver(device, session.calbin, session.kv, generation=1)
        seq = session.kv.allocate_sequence()
        first = driver.prefill(seq, [256, 72])
        ticket = device.submit(driver.decode_job(1, [(seq, first.lanes[0].greedy_token)]))
        assert device.poll() == [] and len(device.inflight()) == 1  # 20 ms of device time: not done yet
        assert device.wait(ticket.job_id, 30.0).ok  # the worker completes it
    finally:
        device.close()
