"""Conformance of the generated composites: one call equals its machines' events fired in sequence (issue #20).

``calculet/machines/generated/decode_step.py`` (:mod:`calculet.machines.codegen_composite`) fires a B1 decode step's
job ``complete(ok=True)``, its lane's ``commit(tokens)`` and its request's ``decode_done(job, ok=True, stop)`` in
one function. For any reachable states of the three machines (each explored breadth-first from its declaration's
examples, ``tests/machine_support.explore``) and any arguments (valid and not), the composite must leave the three
instances exactly as ``fire`` called three times in sequence leaves them — states, variables, the rows taken — and
return the same targets, or raise the same refusal at the same part with the parts after it untouched; in the
monitored variant, with one draw per event attempted, whatever the draws.
"""

from __future__ import annotations

import functools
import itertools

from hypothesis import given, settings
from hypothesis import strategies as st

from calculet.machines import DeviceJobMachine, KvSequenceMachine, RequestMachine
from calculet.machines.errors import TransitionNotAllowed
from calculet.runtime.scheduling import step_done
from calculet.runtime.scheduling.step_done import COMPOSITE
from tests.machine_support import explore


@functools.cache
def _reachable(machine: type) -> tuple:
    return tuple(itertools.chain.from_iterable(explore(machine, p, 400) for p in machine.definition.examples))


def _biased(machine: type, *states: str) -> st.SearchStrategy:
    """A reachable instance, three times in four one in ``states`` (where the composite's rows are: the later
    parts are reached only when the earlier ones fired)."""
    every = _reachable(machine)
    usual = [x for x in every if x.state in states]
    return st.one_of(st.sampled_from(usual), st.sampled_from(usual), st.sampled_from(usual), st.sampled_from(every))


def _view(inst: object) -> tuple:
    return inst.state, inst.values(), inst.last_transition  # type: ignore[attr-defined]


def _sequence(job, lane, request, tokens, job_id, stop):  # type: ignore[no-untyped-def]
    """The three events as the layered runtime fires them: each instance's own ``fire``, in order."""
    targets = []
    try:
        targets.append(job.fire("complete", ok=True))
        targets.append(lane.fire("commit", tokens=tokens))
        targets.append(request.fire("decode_done", job=job_id, ok=True, stop=stop))
    except TransitionNotAllowed as exc:
        return tuple(targets), (exc.state, exc.event)
    return tuple(targets), None


def _composite(fire, *args):  # type: ignore[no-untyped-def]
    try:
        return tuple(fire(*args)), None
    except TransitionNotAllowed as exc:
        return None, (exc.state, exc.event)


@settings(max_examples=400, deadline=None)
@given(data=st.data(), tokens=st.sampled_from([-1, 0, 1, 2, 3, 5, True]), stop=st.sampled_from([False, True, 0]),
       sampled=st.booleans(), draws=st.lists(st.booleans(), min_size=3, max_size=3))
def test_the_decode_step_composite_is_its_three_events_in_sequence(data, tokens, stop, sampled, draws) -> None:
    """Mutants caught (each applied once to the generated module, then restored): the request's part given
    ``stop=False`` whatever the step said; the lane's rows without their guard (a commit over the reservation
    taken); the job's part not calling the exact path when drawn or refused (the job left as it was)."""
    job = data.draw(_biased(DeviceJobMachine, "submitted"))
    lane = data.draw(_biased(KvSequenceMachine, "reserved", "active"))
    request = data.draw(_biased(RequestMachine, "decode_running"))
    job_id = data.draw(st.sampled_from(sorted({request.job_id, request.job_id + 1, 0, 1})))
    seq = [job.snapshot(), lane.snapshot(), request.snapshot()]
    fused = [job.snapshot(), lane.snapshot(), request.snapshot()]
    want, refused = _sequence(*seq, tokens, job_id, stop)
    drawn = iter(draws)
    if sampled:
        got, got_refused = _composite(COMPOSITE.fire_sampled, *fused, tokens, job_id, stop, drawn)
        attempted = len(want) + (refused is not None)
        assert len(list(drawn)) == 3 - attempted  # one draw per event attempted, none after a refusal
    else:
        got, got_refused = _composite(COMPOSITE.fire_plain, *fused, tokens, job_id, stop)
    assert got_refused == refused
    if refused is None:
        assert got == want
    assert [_view(x) for x in fused] == [_view(x) for x in seq]


def test_the_composite_reaches_every_row_it_prints() -> None:
    """The reachable states above take each row of the composite at least once through its inline path (no draw,
    valid arguments): the test does not pass by sending everything to the exact path."""
    rows = {value for name, value in vars(COMPOSITE).items() if name.startswith("_p") and "_row_" in name}
    taken = set()
    for job, lane, request in itertools.product(
            [j for j in _reachable(DeviceJobMachine) if j.state == "submitted"],
            [x for x in _reachable(KvSequenceMachine) if x.state in ("reserved", "active")][::8],
            [r for r in _reachable(RequestMachine) if r.state == "decode_running"][:60]):
        for stop in (False, True):
            parts = [job.snapshot(), lane.snapshot(), request.snapshot()]
            try:
                COMPOSITE.fire_plain(*parts, 1, request.job_id, stop)
            except TransitionNotAllowed:
                continue
            taken |= {p.last_transition for p in parts}
    # ok is always True in this composite: the job's and the request's error rows are printed, never taken
    errors = {t for m in (DeviceJobMachine, RequestMachine) for t in m.definition.transitions
              if t.name in ("complete_error", "decode_done_error")}
    assert rows - taken == errors


@settings(max_examples=300, deadline=None)
@given(data=st.data(), sampled=st.booleans(), draws=st.lists(st.booleans(), min_size=2, max_size=2))
def test_the_decode_submit_composite_is_its_two_events_in_sequence(data, sampled, draws) -> None:
    """``generated/decode_submit.py``: the job's ``submit`` then the request's ``submit_decode(job)``, as the two
    ``fire`` calls leave them, for any reachable states and job ids (valid and not). Mutant caught (applied once to
    the generated module, then restored): the request's part writing a fixed ``job_id`` (1), not its argument."""
    job = data.draw(_biased(DeviceJobMachine, "prepared"))
    request = data.draw(_biased(RequestMachine, "decode_ready"))
    job_id = data.draw(st.sampled_from([job.job_id, 0, 1, 7, True]))
    seq, fused = [job.snapshot(), request.snapshot()], [job.snapshot(), request.snapshot()]
    want: list[str] = []
    refused = None
    try:
        want.append(seq[0].fire("submit"))
        want.append(seq[1].fire("submit_decode", job=job_id))
    except TransitionNotAllowed as exc:
        refused = (exc.state, exc.event)
    submit = step_done.SUBMIT
    drawn = iter(draws)
    args = (*fused, job_id, drawn) if sampled else (*fused, job_id)
    got, got_refused = _composite(submit.fire_sampled if sampled else submit.fire_plain, *args)
    assert got_refused == refused
    if refused is None:
        assert got == tuple(want)
    assert [_view(x) for x in fused] == [_view(x) for x in seq]
