"""``fire`` takes a generated fast path; what it accepts and refuses is exactly what the declared
types say (issue #20: argument checks generated into the dispatch, not repeated per event)."""

from __future__ import annotations

import enum

import pytest

from calculet.machines import KvSequenceMachine, RequestMachine
from calculet.machines.compiled import CompiledInstance
from calculet.machines.errors import TransitionNotAllowed
from calculet.machines.monitor import MONITOR


class Seven(enum.IntEnum):
    SEVEN = 7


@pytest.fixture(params=[True, False], ids=["monitors-on", "monitors-off"])
def monitors(request: pytest.FixtureRequest) -> bool:
    MONITOR.configure(enabled=request.param, mode="raise")
    return bool(request.param)


@pytest.mark.req("R9.2.3")
def test_wrong_arguments_are_refused_with_the_reason_and_change_nothing(monitors: bool):
    kv = KvSequenceMachine.create(max_seq=8, lane=0)
    before = (kv.state, kv.values())
    for args, reason in (({"seq": True, "gen": 1, "tokens": 4}, "argument seq: expected an int, got bool"),
                         ({"seq": 1, "gen": 1, "tokens": 0}, "argument tokens: 0 < 1"),
                         ({"seq": 1, "gen": 1}, "do not match"),
                         ({"seq": 1, "gen": 1, "tokens": 9}, "no guard is true")):
        with pytest.raises(TransitionNotAllowed, match=reason):
            kv.fire("reserve", **args)
        assert (kv.state, kv.values()) == before
    # a name no event of the machine declares: Python refuses the call itself, naming the machine
    for args in ({"seq": 1, "gen": 1, "tokens": 4, "extra": 1}, {"seq": 1, "gen": 1, "tokenz": 4}):
        with pytest.raises(TypeError, match=r"KvSequenceMachine\.fire\(\) got an unexpected keyword argument"):
            kv.fire("reserve", **args)
        assert (kv.state, kv.values()) == before
    with pytest.raises(TransitionNotAllowed, match="missing argument 'tokens'"):
        CompiledInstance.fire(kv, "reserve", seq=1, gen=1, tokenz=4)  # the generic exact path says which
    with pytest.raises(TransitionNotAllowed, match="unknown event"):
        kv.fire("nonsense")
    with pytest.raises(TransitionNotAllowed, match="no transition for this event"):
        kv.fire("commit")


def test_an_int_subclass_is_accepted_as_the_declared_type_says(monitors: bool):
    kv = KvSequenceMachine.create(max_seq=8, lane=0)
    assert kv.fire("reserve", seq=Seven.SEVEN, gen=1, tokens=4) == "reserved"
    assert kv.seq_id == 7 and kv.last_transition.name == "reserve@free"


def test_last_transition_and_parameters_are_those_of_the_row_taken(monitors: bool):
    r = RequestMachine.create(prompt_tokens=2, max_new_tokens=3, max_seq=16)
    assert r.last_transition is None and r.params() == {"prompt_tokens": 2, "max_new_tokens": 3, "max_seq": 16}
    r.fire("bind", gen=1)
    assert r.last_transition.name == "bind@new"
    copy = r.snapshot()
    r.fire("admit")
    assert copy.state == "waiting_admission" and r.state != copy.state and copy.values()["generation"] == 1


def test_instantiation_refuses_missing_unexpected_and_out_of_range_parameters():
    with pytest.raises(TypeError, match=r"missing parameters \['max_seq'\]"):
        RequestMachine.create(prompt_tokens=2, max_new_tokens=3)
    with pytest.raises(TypeError, match=r"unexpected \['colour'\]"):
        RequestMachine.create(prompt_tokens=2, max_new_tokens=3, max_seq=16, colour=1)
    with pytest.raises(ValueError, match="prompt_tokens=0"):
        RequestMachine.create(prompt_tokens=0, max_new_tokens=3, max_seq=16)
    with pytest.raises(ValueError, match="expected an int, got bool"):
        RequestMachine.create(prompt_tokens=True, max_new_tokens=3, max_seq=16)


@pytest.mark.req("R9.2.3")
def test_the_base_class_exact_fire_and_generic_snapshot_agree_with_the_generated_ones(monitors: bool):
    """The generic ``CompiledInstance.fire``/``snapshot`` (the exact path the generated ones fall back
    to) take the same transition and copy the same values as the generated per-machine methods."""
    fast, exact = KvSequenceMachine.create(max_seq=8, lane=0), KvSequenceMachine.create(max_seq=8, lane=0)
    assert fast.fire("reserve", seq=1, gen=1, tokens=4) == CompiledInstance.fire(exact, "reserve", seq=1, gen=1,
                                                                                 tokens=4)
    assert (fast.state, fast.values()) == (exact.state, exact.values())
    copy, generated = CompiledInstance.snapshot(exact), exact.snapshot()
    assert type(copy) is type(exact) and (copy.state, copy.values(), copy.params()) == (
        generated.state, generated.values(), generated.params())
    with pytest.raises(TransitionNotAllowed, match="no transition for this event"):
        CompiledInstance.fire(exact, "reserve", seq=2, gen=1, tokens=4)
    assert (exact.state, exact.values()) == (fast.state, fast.values())


@pytest.mark.req("R9.2.3")
def test_an_argument_of_another_event_is_refused_not_ignored(monitors: bool):
    """The generated ``fire`` takes every argument name of the machine as a keyword; one that this
    event does not declare sends the call to the exact check, which refuses it (issue #20)."""
    r = RequestMachine.create(prompt_tokens=2, max_new_tokens=3, max_seq=16)
    with pytest.raises(TransitionNotAllowed, match="do not match"):
        r.fire("bind", gen=1, job=3)
    with pytest.raises(TransitionNotAllowed, match="do not match"):
        r.fire("wait_model", ok=True)
    assert r.state == "new" and r.generation == 0 and r.last_transition is None
    assert r.fire("bind", gen=1) == "waiting_admission" and r.generation == 1


@pytest.mark.req("R4.2")
def test_state_is_public_read_only_and_read_without_a_python_frame():
    """``state`` is the one way to read a machine's state (issue #20: the runtime's hot paths read it instead of
    the private slot): read-only (R4.2, only ``fire`` writes it) and a C getter, so a read runs no Python
    frame. Mutants caught: a plain Python property (one call per read: the hot paths would pay a frame per lane
    per step again) and a writable public attribute (R4.2's encapsulation broken)."""
    import sys

    kv = KvSequenceMachine.create(max_seq=8, lane=0)
    calls: list[str] = []
    sys.setprofile(lambda _frame, event, _arg: calls.append(event) if event == "call" else None)
    try:
        states = [kv.state, kv.state, kv.state]
    finally:
        sys.setprofile(None)
    assert states == ["free"] * 3 and calls == []
    with pytest.raises(AttributeError):
        kv.state = "reserved"  # type: ignore[misc]
    kv.fire("reserve", seq=1, gen=1, tokens=4)
    assert kv.state == "reserved" == kv.snapshot().state
