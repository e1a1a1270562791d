"""ModelManager's request filter (issue #20) against the declared requests × generations coupling.

``REQUEST_TARGETS`` lets the engine skip ``on_request_transition`` for a move that cannot change a generation's
counters (a decode step's two moves). It must hold every target of a request row that
``GenerationRequestSystem`` couples with ``acquire`` or ``release_request``, so no counted move is skipped; and
``on_request_transition`` must fire exactly the coupled event on each such row.

Mutants caught: ``REQUEST_TARGETS`` without the pinning targets (``_TERMINAL`` alone: ``bind`` and ``admit_now``
never acquire); ``_PINNING`` from ``bind`` alone (``admit_now`` not counted); the filter testing ``source``
instead of ``target``.
"""

from __future__ import annotations

from types import SimpleNamespace

from calculet.machines import RequestMachine
from calculet.machines.model_couplings import GenerationRequestSystem
from calculet.runtime.models.manager import REQUEST_TARGETS, ModelManager

_ROWS = {t.name: t for t in RequestMachine.definition.transitions}


def _counted() -> dict[str, str]:
    """Request row name → the generation event its coupled step fires (rows with none left out)."""
    counted = {}
    for step in GenerationRequestSystem.definition.steps:
        if step.request and step.lane:
            counted[step.request[0]] = step.lane[0].split("@")[0]
    return counted


def test_every_counted_row_reaches_a_request_target() -> None:
    counted = _counted()
    assert {"acquire", "release_request"} == set(counted.values())
    assert {"bind", "admit_now"} <= {_ROWS[name].event for name, event in counted.items() if event == "acquire"}
    for name in counted:
        assert _ROWS[name].target in REQUEST_TARGETS, name


class _Machine:
    def __init__(self) -> None:
        self.fired: list[str] = []

    def fire(self, event: str) -> None:
        self.fired.append(event)


def test_on_request_transition_fires_the_coupled_event_on_every_row() -> None:
    """Each declared request row with a pinned request, told to the manager: the coupled event, or none."""
    counted = _counted()
    machine = _Machine()
    gens = {7: SimpleNamespace(machine=machine)}  # generation 7, the one every request below is pinned to
    manager = ModelManager.__new__(ModelManager)  # only the generation table is read
    manager._gens = gens  # noqa: SLF001  (a dict has the table's get and [] the method reads)
    for t in RequestMachine.definition.transitions:
        machine.fired.clear()
        # the request as the listener sees it, after the move. R10.3 pinned_exactly_after_bind: generation 0 until
        # it is bound; a request ended from New or WaitingModel (reject, cancel, ...) was never pinned either
        unpinned = t.target in ("new", "waiting_model") or t.source in ("new", "waiting_model") and t.event not in (
            "bind", "admit_now")
        rec = SimpleNamespace(machine=SimpleNamespace(generation=0 if unpinned else 7))
        manager.on_request_transition(rec, t.source, t.target)
        expected = [counted[t.name]] if t.name in counted and t.source != t.target else []
        assert machine.fired == expected, t.name
