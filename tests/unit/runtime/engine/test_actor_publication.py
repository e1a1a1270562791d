"""The actor's admission snapshot after its turns (issue #20, session 16): published after a turn that found nothing
more ready (the actor may sleep: readers read it), not after one that did (the next turn follows at once and
withdraws it); a message still publishes after it runs.

Mutants caught: a publication after every turn (as before: ~3 % of the actor's CPU for snapshots no reader reads);
none after the last turn of a chain (readers would find no snapshot while the actor sleeps, every request going to
the engine).
"""

from __future__ import annotations

from typing import Any
from unittest import mock

from calculet.adapters.sim import CostModel, SimCalRT, SimConfig, TimeMode, package_dir
from calculet.runtime.engine.core import EngineCore
from calculet.runtime.engine.threaded import ThreadedEngine
from calculet.runtime.engine.types import EngineOptions
from calculet.runtime.streams.writer import StreamWriter
from tests.integration.engine.support import engine_config, request


def test_a_snapshot_is_published_after_the_last_turn_of_a_chain_and_not_between_its_turns() -> None:
    engine = ThreadedEngine(engine_config(), SimCalRT(SimConfig(time_mode=TimeMode.REAL, cost=CostModel.null())),
                            package_dir("current"), options=EngineOptions(verify_golden=False, monitor_mode=None))
    seen: list[Any] = []  # ("turn", ready), "message" and "publish", in the actor's order
    turn, publish, stepped = EngineCore.turn, ThreadedEngine._publish, ThreadedEngine._stepped

    def turned(core: EngineCore) -> bool:
        ready = turn(core)
        seen.append(("turn", ready))
        return ready

    def published(self: ThreadedEngine) -> None:
        seen.append("publish")
        publish(self)

    def message(self: ThreadedEngine, step: Any) -> Any:
        seen.append("message")  # a message's own publication follows it
        return stepped(self, step)

    with mock.patch.object(EngineCore, "turn", turned), mock.patch.object(ThreadedEngine, "_publish", published), \
            mock.patch.object(ThreadedEngine, "_stepped", message):
        engine.start()
        try:
            stream = StreamWriter(tokenizer=engine.tokenizer)
            engine.submit(request(0, 200), stream)  # 200 null-device steps: several turns of at most 1 ms
            assert stream.result(30).outcome.state == "completed"
            engine.statistics()  # a message after the request's last turn: the actor has published by then
        finally:
            engine.stop(5)
    after = list(zip(seen, seen[1:]))
    assert ("turn", True) in seen  # a chain of several turns, not one
    assert (("turn", True), "publish") not in after
    assert all(nxt == "publish" for event, nxt in after if event == ("turn", False))
