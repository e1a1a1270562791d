"""Issue #17 (reachability at every level): every coupled-system step is taken on a real run from
the initial system, found by explicit-state search and replayed through the z3 encoding — cheap
enough for ``verify --fast`` — and a dead step still fails the check (R17.2.3)."""

from __future__ import annotations

import dataclasses

import pytest

from calculet.invariants.explicit_reach import ExplicitSearch, check_system_reachability_explicit, replay
from calculet.invariants.reachability import check_system_reachability
from calculet.machines.model_couplings import GenerationJobSystem, GenerationRequestSystem
from calculet.machines.system import NONE

pytestmark = pytest.mark.req("R17.2.3", "R10.2", "R12.3")


def test_every_generation_request_step_is_reached_by_a_replayed_run():
    result, missing = check_system_reachability_explicit(GenerationRequestSystem.definition)
    assert result.ok and missing == set(), result.detail
    # the last steps need a generation made Ready (4 steps), a request pinned and admitted (one
    # admit_now, or bind then admit), prefilled, decoded and closed: the witness runs are that long,
    # and each of their transitions was replayed
    # (63 steps since the generation stopped counting its jobs, issue #20: job_submitted/job_finished/reset gone)
    assert "runs of ≤10 steps" in result.detail and "63/63 steps" in result.detail and result.queries >= 64


def test_the_witness_run_of_a_late_step_is_a_run_from_the_initial_system():
    search = ExplicitSearch(GenerationRequestSystem.definition)
    search.run(16)
    path = search.witness("decode_done_finish")
    assert path[0][0] in search.initial_states()
    names = [edge[1].step.name for edge in path]
    assert names[-1] == "decode_done_finish" and "model:warmed@warming" in names
    assert "admit_now@new" in names or {"bind@new", "admit@waiting_admission"} <= set(names)
    assert len(path) >= 8


def test_a_post_state_the_encoding_does_not_give_is_caught_by_the_replay():
    search = ExplicitSearch(GenerationRequestSystem.definition)
    search.run(16)
    edge = search.first["bind@new"]
    state, v, i, j, args = edge
    reqs, lanes, binding = state
    honest = search.fire(state, _view(search, state), v, i, j, args)
    assert honest is not None and replay(search, edge, honest) is None
    # the same step, but the search claims the binding stayed empty
    tampered = (honest[0], honest[1], (NONE,) * len(binding))
    assert "binding" in replay(search, edge, tampered)


def test_a_dead_step_is_missed_by_the_search_and_proved_unreachable_by_the_symbolic_one():
    original = next(s for s in GenerationJobSystem.definition.steps if s.name == "quarantine")
    dead = GenerationJobSystem.derive("GenJobDeadQuarantine", replace={"quarantine": dataclasses.replace(
        original, guard=lambda sys, i, j: sys.requests[i].generation < 0)})
    result, missing = check_system_reachability_explicit(dead.definition)
    assert not result.ok and "quarantine" in missing
    full = check_system_reachability(dead.definition, depth=dead.definition.reach_depth)
    assert not full.ok and "quarantine" in full.broken and "no run of" in full.detail


def _view(search, state):
    from calculet.invariants.explicit_reach import _view as view
    return view(search, state)
