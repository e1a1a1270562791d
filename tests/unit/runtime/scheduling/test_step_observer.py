"""The decode cycle told as one unit (issue #20): a scheduler observer still hears every request transition.

The scheduler declares a decode step's moves between ``decode_ready`` and ``decode_running`` quiet: its own
reclaim path ignores them, and they reach an observer once per step and batch call — to ``step_observer``
(records, source, targets) when there is one, else to ``observer`` record by record from that one call.
Either way every request's transitions, as an observer sees them, form one unbroken chain from its first
state to its terminal one, and each token is one decode step.
"""

from __future__ import annotations

from typing import Any

import pytest

from tests.unit.runtime.runtime_support import Harness


def _chains(moves: list[tuple[int, str, str]]) -> dict[int, list[str]]:
    """Each request's states in the order the observer heard them (a move's source must be the last target)."""
    chains: dict[int, list[str]] = {}
    for rid, source, target in moves:
        chain = chains.setdefault(rid, [source])
        assert chain[-1] == source, f"request {rid}: heard {source}->{target} after {chain}"
        chain.append(target)
    return chains


@pytest.mark.req("R4.1")
@pytest.mark.parametrize("batch", [1, 4])
@pytest.mark.parametrize("stepwise", [False, True])
def test_an_observer_hears_every_transition_of_every_request(batch: int, stepwise: bool) -> None:
    """Mutants caught: the scheduler installing no quiet listener for its observer (the decode steps go
    unheard: the chain breaks at the first ``decode_ready -> decode_running``), the step observer given the
    records but not their targets in lane order, and a step observer called per record (counted)."""
    moves: list[tuple[int, str, str]] = []
    calls: list[int] = []

    def observer(rec: Any, source: str, target: str) -> None:
        moves.append((rec.request_id, source, target))

    def step_observer(recs: Any, source: str, targets: Any) -> None:
        calls.append(len(recs))
        for rec, target in zip(recs, targets):
            observer(rec, source, target)

    h = Harness.build(sizes=(batch,), lanes=8, observer=observer, step_observer=step_observer if stepwise else None)
    new = 5
    ids = [h.submit(prompt=4, new=new).request_id for _ in range(6)]
    h.drive()
    chains = _chains(moves)
    for rid in ids:
        chain = chains[rid]
        assert chain[0] == "new" and chain[-1] == "completed", chain
        assert chain.count("decode_running") == new - 1  # the prefill gave the first token, each step one more
    if stepwise:  # one call per batch call: a step's submit and its result, each for the whole batch
        assert sum(calls) == sum(chains[rid].count("decode_running") for rid in ids) + sum(
            chains[rid].count("decode_ready") for rid in ids) - len(ids)
        assert max(calls) <= batch
        if batch > 1:
            assert len(calls) < sum(calls)  # some call told several records at once
