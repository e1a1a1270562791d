"""``admit_now`` (issue #20): a new request pinned and admitted by one declared event, exactly as ``bind``
then ``admit`` leave it — only from New, never past the context.

The scheduler fires it for a request admitted at once (nothing else waits, the budget has room), so a
submit into free budget costs one request event, not two. The coupled systems take the row too
(requests × lanes: it reserves the lane; requests × budgets: ``AdmissionBudgetMachine.admit_now``;
requests × generations: it pins, like ``bind``), which ``verify`` proves and
``tests/property/test_admission_budget_mutants.py`` checks against weakened budget guards.
"""

from __future__ import annotations

import pytest

from calculet.machines import RequestMachine
from calculet.machines.errors import TransitionNotAllowed
from tests.machine_support import key


def _new(prompt: int = 4, new: int = 8, max_seq: int = 32):  # type: ignore[no-untyped-def]
    return RequestMachine.create(prompt_tokens=prompt, max_new_tokens=new, max_seq=max_seq)


@pytest.mark.req("R10.3", "R5.1.4")
@pytest.mark.parametrize("gen", [1, 7])
def test_admit_now_ends_where_bind_then_admit_ends(gen: int):
    """Mutants caught: a target other than PrefillReady, an effect that does not pin the generation."""
    once, twice = _new(), _new()
    assert once.fire("admit_now", gen=gen) == "prefill_ready"
    twice.fire("bind", gen=gen)
    twice.fire("admit")
    assert key(once) == key(twice) and once.generation == gen


@pytest.mark.req("R5.1.4")
def test_admit_now_never_admits_past_the_context():
    """Mutant caught: the row without its guard (an admitted request beyond max_seq breaks R5.1.4)."""
    r = _new(prompt=6, new=4, max_seq=8)
    before = key(r)
    with pytest.raises(TransitionNotAllowed):
        r.fire("admit_now", gen=1)
    assert key(r) == before


@pytest.mark.req("R10.3")
@pytest.mark.parametrize("path", [[("bind", {"gen": 1})], [("wait_model", {})], [("bind", {"gen": 1}), ("admit", {})]])
def test_admit_now_is_only_for_a_request_that_never_waited(path):
    """Mutant caught: the row's source widened to the waiting states (a bound request re-pinned, R10.3)."""
    r = _new()
    for event, args in path:
        r.fire(event, **args)
    before = key(r)
    with pytest.raises(TransitionNotAllowed):
        r.fire("admit_now", gen=2)
    assert key(r) == before
