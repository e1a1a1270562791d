"""The policy catalogue's B1 policies (issue #13): ``calculet-b1`` is one KV lane, strictly serial;
``calculet-b1-shared`` is B1 as the service ships it, so several streams share the device."""

from __future__ import annotations

from calculet.adapters.sim.build import TINY_MAX_SEQUENCES
from calculet.config import load_config
from calculet.config.loading import DEFAULT_CONFIG_PATH
from calculet.loadsim.policies import (GOODPUT_DEVICES, POLICIES, deadline_orders, goodput_policies, parse_policies,
                                       shipped_kv_lanes)
from calculet.loadsim.workload import load_preset


def test_shared_b1_holds_the_shipped_kv_lanes_on_one_b1_device() -> None:
    shipped = load_config(DEFAULT_CONFIG_PATH)
    assert shipped_kv_lanes() == min(shipped.admission.max_sequences, TINY_MAX_SEQUENCES) > 1
    spec = POLICIES["calculet-b1-shared"]
    assert spec.profiles == (1,) and spec.max_inflight == 1 and spec.lanes == shipped_kv_lanes()
    config = spec.scheduler_config(load_preset("overload"))
    assert config.admission.max_sequences == shipped_kv_lanes()
    assert list(config.batch.profiles) == [1] and config.executor.max_inflight == 1
    assert config.batch.deadline_order == deadline_orders()[0]  # the shipped default order


def test_one_lane_b1_is_unchanged_and_says_so() -> None:
    spec = POLICIES["calculet-b1"]
    assert spec.lanes == 1 and spec.kv_lanes is None and "one KV lane" in spec.description
    assert POLICIES["calculet-b16"].lanes == 16 and POLICIES["calculet-b16-pingpong"].lanes == 32


def test_an_order_variant_keeps_the_shared_lanes() -> None:
    strict = parse_policies("calculet-b1-shared@strict")[0]
    assert strict.lanes == shipped_kv_lanes() and strict.deadline_order == "strict"
    assert strict.scheduler_config(load_preset("overload")).admission.max_sequences == shipped_kv_lanes()


def test_goodput_group_runs_the_shared_b1_and_b16_under_every_order() -> None:
    _default, values = deadline_orders()
    names = goodput_policies()
    assert GOODPUT_DEVICES == ("calculet-b1-shared", "calculet-b16")
    assert names[0] == "b1-serial-fcfs" and len(names) == 1 + len(GOODPUT_DEVICES) * len(values)
    assert names[-1] == "calculet-b16" and "calculet-b1-shared" in names and "calculet-b1" not in names
