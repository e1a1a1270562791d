"""A sampled ``fire_each`` whose draws hit in the middle of a batch (issue #20, R9.2.3).

The generated ``fire_each_sampled`` runs the inline loop on the runs of instances between the
drawn ones and sends only the drawn ones through the checked path (``compiled._fire_split``).
These tests pin the draws (the generated code's ``_draws``) and record every check the monitor
makes: the batch must fire the same events with the same results as single fires on twin
instances, in order, and check exactly the drawn instances — none more, none fewer, none moved.
"""

from __future__ import annotations

import itertools
from typing import Any, Iterator
from unittest import mock

import pytest
from hypothesis import given, strategies as st

from calculet.machines import KvSequenceMachine, RequestMachine
from calculet.machines.errors import TransitionNotAllowed
from calculet.machines.monitor import MONITOR


def _decoding(n: int) -> list[Any]:
    out = []
    for _ in range(n):
        r = RequestMachine.create(prompt_tokens=2, max_new_tokens=3, max_seq=64)
        r.fire("bind", gen=1)
        r.fire("admit")
        r.fire("submit_prefill", job=1)
        r.fire("prefill_done", job=1, ok=True, stop=False)
        r.fire("submit_decode", job=2)
        out.append(r)
    return out


def _state(xs: list[Any]) -> list[tuple[str, dict[str, object], object]]:
    return [(x.state, x.values(), x.last_transition) for x in xs]


class _Checks:
    """Patches the monitor's ``after`` to record which instance each check is for (then checks it)."""

    def __init__(self) -> None:
        self.seen: list[Any] = []
        self._after = MONITOR.after

    def __call__(self, instance: Any, pre: Any, transition: Any) -> None:
        self.seen.append(instance)
        self._after(instance, pre, transition)


def _pin_draws(cls: type, drawn: list[bool]) -> Iterator[bool]:
    """The generated code's draws: ``drawn`` first, then never (so twin single fires are not checked)."""
    draws = itertools.chain(drawn, itertools.repeat(False))
    cls.fire_each.__globals__["_draws"] = draws  # type: ignore[attr-defined]
    return draws


@pytest.mark.req("R9.2.3")
@given(data=st.data())
def test_drawn_instances_are_checked_and_the_runs_between_fire_as_single_fires(data: st.DataObject) -> None:
    MONITOR.configure(enabled=True, mode="raise")
    try:
        n = data.draw(st.integers(1, 12))
        drawn = data.draw(st.lists(st.booleans(), min_size=n, max_size=n))
        oks = data.draw(st.lists(st.booleans(), min_size=n, max_size=n))
        stops = data.draw(st.lists(st.booleans(), min_size=n, max_size=n))
        batch, single = _decoding(n), _decoding(n)
        checks = _Checks()
        draws = _pin_draws(RequestMachine.Instance, drawn)
        with mock.patch.object(MONITOR, "after", checks):
            targets = RequestMachine.Instance.fire_each(batch, "decode_done", job=[2] * n, ok=oks, stop=stops)
        assert next(draws) is False and checks.seen == [x for x, d in zip(batch, drawn) if d]
        assert targets == [y.fire("decode_done", job=2, ok=o, stop=s) for y, o, s in zip(single, oks, stops)]
        assert _state(batch) == _state(single)
    finally:
        MONITOR.configure(enabled=True, mode="raise")


@pytest.mark.req("R9.2.3")
@pytest.mark.parametrize("drawn", [[False, True, False, False, True], [True, False, True, True, False]],
                         ids=["before-and-after", "at-the-refused"])
def test_a_refusal_after_a_drawn_instance_stops_the_batch_as_a_loop_of_fires_would(drawn: list[bool]) -> None:
    """The refused lane (index 2: 9 tokens on an 8-token lane) raises whether drawn or not; the lanes
    before it are reserved and those drawn among them checked; the lanes after it are untouched."""
    MONITOR.configure(enabled=True, mode="raise")
    try:
        lanes = [KvSequenceMachine.create(max_seq=8, lane=i) for i in range(5)]
        checks = _Checks()
        _pin_draws(KvSequenceMachine.Instance, drawn)
        with mock.patch.object(MONITOR, "after", checks), pytest.raises(TransitionNotAllowed, match="no guard"):
            KvSequenceMachine.Instance.fire_each(lanes, "reserve", seq=[1, 2, 3, 4, 5], gen=[1] * 5,
                                                 tokens=[4, 4, 9, 4, 4])
        assert [x.state for x in lanes] == ["reserved", "reserved", "free", "free", "free"]
        assert checks.seen == [x for x, d in zip(lanes[:2], drawn) if d]
    finally:
        MONITOR.configure(enabled=True, mode="raise")
