"""``fire_each`` is ``fire`` on each instance in order (issue #20: one call per decode step's lanes).

The generated batch path is compared with single fires on twin instances driven by random
argument columns, with monitors off (the inline path) and on (every event checked: the
instance-by-instance path); refusals raise what ``fire`` raises, with the instances before the
refused one changed and the rest untouched, as a loop of fires leaves them.
"""

from __future__ import annotations

import pytest
from hypothesis import given, strategies as st

from calculet.machines import KvSequenceMachine, RequestMachine
from calculet.machines.errors import TransitionNotAllowed
from calculet.machines.monitor import MONITOR


@pytest.fixture(params=[True, False], ids=["monitors-on", "monitors-off"])
def monitors(request: pytest.FixtureRequest) -> bool:
    MONITOR.configure(enabled=request.param, mode="raise")
    return bool(request.param)


def _decoding(n: int, max_new: list[int]) -> list[object]:
    out = []
    for i in range(n):
        r = RequestMachine.create(prompt_tokens=2, max_new_tokens=max_new[i], max_seq=64)
        r.fire("bind", gen=1)
        r.fire("admit")
        r.fire("submit_prefill", job=1)
        r.fire("prefill_done", job=1, ok=True, stop=False)
        out.append(r)
    return out


def _state(xs: list[object]) -> list[tuple[str, dict[str, object], object]]:
    return [(x.state, x.values(), x.last_transition) for x in xs]  # type: ignore[attr-defined]


@pytest.mark.req("R4.6")
@given(data=st.data())
def test_fire_each_equals_fire_on_each_instance(data: st.DataObject) -> None:
    for enabled in (False, True):
        MONITOR.configure(enabled=enabled, mode="raise")
        n = data.draw(st.integers(0, 6))
        max_new = data.draw(st.lists(st.integers(1, 3), min_size=n, max_size=n))
        batch, single = _decoding(n, max_new), _decoding(n, max_new)
        for step in range(3):
            live = [i for i in range(n) if batch[i].state == "decode_ready"]
            job = 2 + step
            xs, ys = [batch[i] for i in live], [single[i] for i in live]
            assert RequestMachine.Instance.fire_each(xs, "submit_decode", job=[job] * len(xs)) == [
                y.fire("submit_decode", job=job) for y in ys]
            oks = data.draw(st.lists(st.booleans(), min_size=len(xs), max_size=len(xs)))
            stops = data.draw(st.lists(st.booleans(), min_size=len(xs), max_size=len(xs)))
            assert RequestMachine.Instance.fire_each(xs, "decode_done", job=[job] * len(xs), ok=oks, stop=stops) == [
                y.fire("decode_done", job=job, ok=o, stop=s) for y, o, s in zip(ys, oks, stops)]
            assert _state(batch) == _state(single)


@pytest.mark.req("R9.2.3")
def test_a_refused_instance_raises_as_fire_does_and_leaves_the_rest_as_a_loop_would(monitors: bool) -> None:
    lanes = [KvSequenceMachine.create(max_seq=8, lane=i) for i in range(3)]
    with pytest.raises(TransitionNotAllowed, match="no guard is true"):
        KvSequenceMachine.Instance.fire_each(lanes, "reserve", seq=[1, 2, 3], gen=[1, 1, 1], tokens=[4, 9, 4])
    assert [x.state for x in lanes] == ["reserved", "free", "free"]
    with pytest.raises(TransitionNotAllowed, match="argument tokens: 0 < 1"):
        KvSequenceMachine.Instance.fire_each(lanes[1:], "reserve", seq=[2, 3], gen=[1, 1], tokens=[0, 4])
    with pytest.raises(TransitionNotAllowed, match="do not match"):
        KvSequenceMachine.Instance.fire_each(lanes[1:], "reserve", seq=[2, 3], gen=[1, 1])
    with pytest.raises(TransitionNotAllowed, match="no transition for this event"):
        KvSequenceMachine.Instance.fire_each(lanes, "recover")
    assert [x.state for x in lanes] == ["reserved", "free", "free"]
    with pytest.raises(ValueError, match="tokens has 1 values for 2 instances"):
        KvSequenceMachine.Instance.fire_each(lanes[1:], "reserve", seq=[2, 3], gen=[1, 1], tokens=[4])
    assert KvSequenceMachine.Instance.fire_each(lanes[1:], "reserve", seq=[2, 3], gen=[1, 1], tokens=[4, 5]) == [
        "reserved", "reserved"]
    assert KvSequenceMachine.Instance.fire_each(lanes, "commit", tokens=[1, 1, 1]) == ["active"] * 3
    assert KvSequenceMachine.Instance.fire_each(lanes, "commit", tokens=[1, 2, 1]) == ["active"] * 3
    assert [x.last_transition.name for x in lanes] == ["commit@active"] * 3
    assert [x.committed_len for x in lanes] == [2, 3, 2]


def test_the_monitor_draws_as_for_single_fires() -> None:
    """``fire_each`` draws once per instance, as single fires would: a batch without a drawn event runs
    the inline loop and checks nothing; with one, exactly the drawn instances' events are checked."""
    MONITOR.every_event, saved = False, MONITOR.every_event
    try:
        MONITOR.configure(enabled=True, mode="raise", sample_every=1000)
        lanes = [KvSequenceMachine.create(max_seq=8, lane=i) for i in range(4)]
        checks = MONITOR.statistics().checks
        draws = iter([False] * 4 + [False, True, False, True])
        KvSequenceMachine.Instance.fire_each.__globals__["_draws"] = draws  # the generated code's draws
        KvSequenceMachine.Instance.fire_each(lanes, "reserve", seq=[1, 2, 3, 4], gen=[1] * 4, tokens=[4] * 4)
        assert MONITOR.statistics().checks == checks
        assert KvSequenceMachine.Instance.fire_each(lanes, "commit", tokens=[1] * 4) == ["active"] * 4
        assert MONITOR.statistics().checks == checks + 2
    finally:
        MONITOR.every_event = saved
        MONITOR.configure(enabled=True, mode="raise")


@pytest.mark.req("R9.2.3")
def test_one_instance_fires_as_its_own_fire() -> None:
    """One instance (every event of a B1 decode step) runs its own ``fire``'s body, generated inline: one draw,
    checked when it hits and not otherwise, its columns' first values as the arguments, and a column of the wrong
    length still refused. Mutants caught: the one-instance case without the draw (a drawn event unchecked; checked
    again when the body became inline, #20 session 17), passing a whole column (the argument refused), or taken
    before the length checks (no ValueError)."""
    MONITOR.every_event, saved = False, MONITOR.every_event
    try:
        MONITOR.configure(enabled=True, mode="raise", sample_every=1000)
        lane = KvSequenceMachine.create(max_seq=8, lane=0)
        fire_each = KvSequenceMachine.Instance.fire_each
        draws = iter([False, True, False])
        fire_each.__globals__["_draws"] = draws  # the generated code's draws (fire and fire_each share them)
        checks = MONITOR.statistics().checks
        assert fire_each([lane], "reserve", seq=[7], gen=[1], tokens=[4]) == ["reserved"]
        assert MONITOR.statistics().checks == checks  # not drawn: nothing checked
        assert (lane.seq_id, lane.reserved_len) == (7, 4)
        assert fire_each([lane], "commit", tokens=[1]) == ["active"]
        assert MONITOR.statistics().checks == checks + 1  # drawn: this event checked
        assert next(draws) is False  # exactly one draw per event
        with pytest.raises(ValueError):
            fire_each([lane], "commit", tokens=[1, 1])
        assert (lane.state, lane.committed_len) == ("active", 1)
    finally:
        MONITOR.every_event = saved
        MONITOR.configure(enabled=True, mode="raise")
