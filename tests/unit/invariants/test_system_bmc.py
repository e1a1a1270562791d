"""Coupled-system bounded model checking keeps every reachable state (up to symmetry) and still
finds bugs that need the selected-pair copy to show a binding elsewhere
(``calculet/invariants/system_bmc.py``: symmetry breaking, the partial-order reduction and one
copy of each local step per depth; the full ``verify`` spent 407 of its 443 s of CPU here)."""

from __future__ import annotations

import dataclasses
import itertools

import pytest
import z3

from calculet.invariants.explicit_reach import ExplicitSearch, _frame
from calculet.invariants.system_bmc import _Unrolling, check_system_bmc
from calculet.logic.expr import Not
from calculet.machines.request_lanes import RequestLaneSystem
from calculet.machines.system import NONE

SD = RequestLaneSystem.definition


def _explicit_levels(requests: int, lanes: int, depth: int) -> list[list[tuple]]:
    """The concrete systems first reached at each depth from one initial system (the first of the
    declared examples' parameters where every request's context fits every lane, so requests are
    admitted), by the explicit-state search's own successor function."""
    search = ExplicitSearch(SD, requests, lanes)
    level = [next(s for s in search.initial_states()
                  if all(r[1][0] + r[1][1] <= lane[1][0] for r in s[0] for lane in s[1]))]  # prompt + new ≤ max_seq
    seen = set(level)
    levels = [level]
    for _ in range(depth):
        level = [post for state in level for _, post in search.successors(state) if post not in seen
                 and not seen.add(post)]
        levels.append(level)
    return levels


def _is_permuted(frame, concrete, requests: int, lanes: int) -> z3.BoolRef:
    """The symbolic ``frame`` is ``concrete`` with its requests and lanes renamed by some pair of
    permutations (the runs symmetry breaking keeps reach each state in one renaming only)."""
    options = []
    for pr in itertools.permutations(range(requests)):
        for pl in itertools.permutations(range(lanes)):
            parts = []
            for i in range(requests):
                got, want = frame.requests[pr[i]], concrete.requests[i]
                parts += [got.state == want.state, *[got.value(n) == want.value(n) for n in got.names()]]
                b = concrete.binding[i].as_long()
                parts += [frame.binding[pr[i]] == (NONE if b == NONE else pl[b]), frame.seq[pr[i]] == concrete.seq[i]]
            for j in range(lanes):
                got, want = frame.lanes[pl[j]], concrete.lanes[j]
                parts += [got.state == want.state, *[got.value(n) == want.value(n) for n in got.names()]]
            options.append(z3.And(*parts))
    return z3.Or(*options)


@pytest.mark.req("R9.2.1")
def test_every_explicitly_reached_system_is_reached_by_the_reduced_unrolling():
    """Completeness of the reductions: each concrete system the explicit search reaches in 4 steps
    (2 requests × 2 lanes; about forty of each depth, taken evenly) is the last
    frame of some run the BMC unrolling allows, under some renaming of requests and lanes. Fails
    if symmetry breaking, the partial-order reduction or the copy of the selected pair drops a
    run; mutants caught: the touch-order bound without its +1; the reduction ordering the higher
    request first; the distance pruning one step too eager; the copy showing the selected lane as
    elsewhere; a kept binding written back from request 0 instead of the selected one. (Extra,
    unreachable runs are what ``tests/property/test_mutants.py``'s unmutated system rules out:
    a write-back that ignores whether the step touches a request fails it.)"""
    requests, lanes, depth = 2, 2, 4
    levels = _explicit_levels(requests, lanes, depth)
    sample = [state for level in levels[1:] for state in level[:: max(1, len(level) // 40)]]
    assert len(levels[-1]) > 1000 and len(sample) > 120  # forty or so of each depth, both requests moved
    u = _Unrolling(SD, requests, lanes)
    for k in range(1, depth + 1):
        u.unroll(k)
    search = ExplicitSearch(SD, requests, lanes)
    u.solver.set("rlimit", 0)
    missed = []
    for n, state in enumerate(sample):
        u.solver.push()
        u.solver.add(_is_permuted(u.frames[-1], _frame(search, state, f"t{n}"), requests, lanes))
        if u.solver.check() != z3.sat:
            missed.append(state)
        u.solver.pop()
    assert missed == []


_STEP = "decode_ok:decode_done_continue"


def _submits_on_any_lane():
    """A mutant whose decode completion asks only that the request holds *some* lane, not lane j (it commits lane
    j): its bug needs a binding to another lane than the step's, which the copy shows as "elsewhere". (#20: a
    decode submit fires no lane event any more, so the mutant moved to the step that does.)"""
    original = next(s for s in SD.steps if s.name == _STEP)
    edited = dataclasses.replace(original, guard=lambda sys, i, j: Not(sys.unbound(i)))
    return RequestLaneSystem.derive("SysSubmitDecodeAnyLane", replace={_STEP: edited}).definition


@pytest.mark.req("R17.2.4")
def test_a_bug_on_a_lane_the_request_does_not_hold_is_found():
    """Soundness of the copy's binding: the mutant's violation needs a request bound to the other
    lane to look bound (not ``NONE``) on the copy; a copy that shows every other lane as unbound
    misses it (mutant caught), which the completeness test above does not notice."""
    sd = _submits_on_any_lane()
    assert _STEP in sd.local  # built once per depth, on the copy of the selected pair
    result = check_system_bmc(sd, 2, 2, 8)
    assert not result.ok, result.detail
    trace = result.counterexample.trace
    last = trace[-1]
    assert last["transition"].startswith(_STEP)
    held = trace[-2]["system"][f"request{last['request']}"]["lane"]
    assert held != last["lane"] and held != "none"  # the request held the other lane
