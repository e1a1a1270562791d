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
