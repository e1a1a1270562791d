"""``ThreadedEngine.snapshot_pending`` (issue #13): whether the actor publishes its next admission snapshot of itself,
the signal the refusal lane waits on instead of guessing from how lately it read one (session 19's 50 ms rule).

True exactly while the actor is in a withdrawn-snapshot section (a message, a turn, results applied: its publication
follows), while device results wait to be applied, or while the published snapshot's validity ended at the actor's
timed wake-up and that wake-up has come; False when none comes of itself (idle with its snapshot, none publishable,
stopping, stopped). The actor runs for real here (no sleep: blocking calls with a reply).
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from typing import Any

import pytest

from calculet.adapters.sim import CostModel, SimCalRT, SimConfig, TimeMode, package_dir
from calculet.runtime.engine import threaded
from calculet.runtime.engine.admission_snapshot import AdmissionSnapshot
from calculet.runtime.engine.threaded import ThreadedEngine
from calculet.runtime.engine.types import EngineOptions
from calculet.runtime.scheduling.finish_estimate import DeviceModel
from calculet.runtime.streams.writer import StreamWriter
from tests.integration.engine.support import engine_config, request


def _engine() -> ThreadedEngine:
    return ThreadedEngine(engine_config(), SimCalRT(SimConfig(time_mode=TimeMode.REAL, cost=CostModel.null())),
                          package_dir("current"), options=EngineOptions(verify_golden=False, monitor_mode=None,
                                               actor_idle_s=3600.0))  # no idle turn under a test's reads


@pytest.fixture
def engine() -> Iterator[ThreadedEngine]:
    built = _engine()
    try:
        yield built
    finally:
        if built._final is None:  # noqa: SLF001 - a test that stopped it already
            built.stop(drain_timeout_s=5)


def _snapshot(now: float) -> AdmissionSnapshot:
    model = DeviceModel(decode_step_s=0.05)
    return AdmissionSnapshot(1, now, math.inf, (now,), 0.0, model, model, 5.0, 10**6, {})


def test_a_snapshot_is_pending_from_the_withdrawal_through_the_publication_of_each_step(
        engine: ThreadedEngine, monkeypatch: pytest.MonkeyPatch) -> None:
    """Read inside a step (the request observer runs on the actor, in its steps) and inside the publication that ends
    it: True; after the steps: False. Mutants caught: the flag never set (False in the step); cleared before the
    publication (False while the actor takes the snapshot: a reader could find no snapshot and no step, and
    forward, before the one being published)."""
    seen: dict[str, list[bool]] = {"step": [], "publication": []}
    take = threaded.take_snapshot

    def taking(*args: Any, **kwargs: Any) -> Any:
        seen["publication"].append(engine.snapshot_pending)
        return take(*args, **kwargs)

    monkeypatch.setattr(threaded, "take_snapshot", taking)
    assert engine.snapshot_pending is False  # not started: nothing is published before the first turn
    engine.set_observer(lambda record, old, new: seen["step"].append(engine.snapshot_pending))  # in the actor's steps
    engine.start()
    stream = StreamWriter()
    engine.submit(request(0, 2), stream)
    assert stream.result(5).outcome.state == "completed"
    engine.statistics()  # a call after the last step: its publication has ended
    assert seen["step"] and all(seen["step"]) and seen["publication"] and all(seen["publication"])
    assert engine.snapshot_pending is False


def test_results_to_apply_or_a_due_wake_up_leave_a_snapshot_pending_a_stopped_actor_none(
        engine: ThreadedEngine) -> None:
    """Between steps (the actor not started: its state set as it leaves it): device results posted and not applied
    pend a snapshot (the actor applies them in a step); a published snapshot whose wake-up has come pends the next
    (the turn at that wake-up publishes), one whose wake-up is still ahead, or no snapshot, does not; stopping or
    stopped, none pends whatever else holds. Mutants caught: results not counted (False with one posted); the wake-up
    not compared with the clock (True for a wake-up ahead) or the snapshot not required (True with none published:
    a state the actor publishes none in); the stop not checked (True while stopping or stopped)."""
    now = engine.clock.now()
    assert engine.snapshot_pending is False
    engine._results_posted += 1  # noqa: SLF001 - the completion thread posted a WaitAny's results
    assert engine.snapshot_pending is True
    engine._results_applied += 1  # noqa: SLF001 - ... and the actor applied them
    assert engine.snapshot_pending is False
    engine._published_wake = now - 1.0  # noqa: SLF001 - the wake-up the last publication read: come
    assert engine.snapshot_pending is False  # no snapshot published (the engine cannot refuse from one)
    engine._snapshot = _snapshot(now)  # noqa: SLF001
    assert engine.snapshot_pending is True
    engine._published_wake = now + 3600.0  # noqa: SLF001 - ahead
    assert engine.snapshot_pending is False
    engine._published_wake = now - 1.0  # noqa: SLF001
    engine._results_posted += 1  # noqa: SLF001
    engine._stop_deadline = now + 30.0  # noqa: SLF001 - stopping: only None is published from now on
    assert engine.snapshot_pending is False
    engine._stop_deadline = None  # noqa: SLF001
    engine._ended = True  # noqa: SLF001 - the actor left its loop
    assert engine.snapshot_pending is False
    engine._ended = False  # noqa: SLF001 - the fixture's stop() runs the real path


def test_a_stopped_engine_has_no_snapshot_pending_even_with_results_left_unapplied(engine: ThreadedEngine) -> None:
    """After ``stop()`` the actor never publishes again: no snapshot pends, even when the completion thread posted
    results the actor never applied. Mutant caught: the actor's end not recorded (``_ended``: True after the stop)."""
    engine.start()
    engine.stop(drain_timeout_s=5)
    engine._stop_deadline = None  # noqa: SLF001 - only the actor's end tells it now
    engine._results_posted = engine._results_applied + 1  # noqa: SLF001
    assert engine.snapshot_pending is False


def test_a_turn_chained_to_the_next_defers_its_publication_until_a_reader_finds_none(engine: ThreadedEngine) -> None:
    """Issue #20: after a turn the actor follows at once with another, the publication is deferred unless a reader
    asked for one since the last (found none, or was told one is pending); the snapshot stays withdrawn and pending
    meanwhile, and a turn after which the actor may sleep always publishes. Driven on this thread (the actor not
    started: ``_turned`` is its turn with the publication around it). Mutants caught: the deferral ignoring the
    reader (no publication after the read: the reader would wait for nothing); the deferral not pending (False while
    withdrawn: the refusal lane would forward a request for want of a snapshot, untracked); a last turn deferred."""
    published = engine._published  # noqa: SLF001 - the actor's publication count
    ready, _ = engine._turned(lambda: True)  # noqa: SLF001 - a turn chained to the next
    assert ready and engine._published == published  # noqa: SLF001 - deferred
    assert engine.snapshot_pending is True  # withdrawn, and the read asks for the next
    assert engine._turned(lambda: True)[0]  # noqa: SLF001
    assert engine._published == published + 1  # noqa: SLF001 - published: a reader asked
    assert engine._turned(lambda: True)[0] and engine._published == published + 1  # noqa: SLF001 - nobody asked
    assert engine.admission_snapshot is None  # a read finding none asks too
    engine._turned(lambda: True)  # noqa: SLF001
    assert engine._published == published + 2  # noqa: SLF001
    assert not engine._turned(lambda: False)[0]  # noqa: SLF001 - the actor may sleep after it: published
    assert engine._published == published + 3 and engine.snapshot_pending is False  # noqa: SLF001
