"""The rollout's decisions against fake boards and a fake HAProxy (no processes, the fake clock):
the order of steps, the stop at a failing board, the rollback of the boards already changed, and
the record (R11.16 blue-green across boards, R12.2 drained board routed elsewhere, R11.11 rollback)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import pytest

from calculet.clock import FakeClock
from calculet.errors import BadRequest
from calculet.fleet.board_admin import Served
from calculet.fleet.haproxy_runtime import ServerStat
from calculet.fleet.record import RECORD_KIND
from calculet.fleet.rollout import Rollout, RolloutOptions

OLD, NEW = "a" * 64, "b" * 64


@dataclass
class FakeHAProxy:
    states: dict[str, str]
    sessions: dict[str, int] = field(default_factory=dict)
    log: list[tuple[str, str]] = field(default_factory=list)

    def set_state(self, backend: str, server: str, state: str) -> None:
        assert backend == "calculet"
        self.states[server] = state
        self.log.append((server, state))

    def server(self, backend: str, name: str) -> ServerStat:
        status = {"ready": "UP", "drain": "DRAIN", "maint": "MAINT"}[self.states[name]]
        return ServerStat(name, status, self.sessions.get(name, 0), 0, 1)


@dataclass
class FakeBoard:
    name: str
    golden_ok: bool = True
    busy_polls: int = 0
    generation: int = 1
    sha: str = OLD
    history: list[str] = field(default_factory=list)
    calls: list[str] = field(default_factory=list)

    def served(self) -> Served:
        return Served(self.generation, "ready", "/pkgs", self.sha)

    def busy(self) -> int:
        self.busy_polls -= 1
        return 1 if self.busy_polls >= 0 else 0

    def ready(self) -> tuple[bool, str]:
        return True, "ready"

    def load(self, alias: str, package: str) -> dict[str, Any]:
        self.calls.append(f"load {package}")
        self.generation += 1
        if not self.golden_ok:  # calculet restores the old generation itself (§11)
            raise BadRequest(f"board {self.name}: loading failed at §11 step 9 (golden + warmup)")
        self.history.append(self.sha)
        self.sha = NEW
        return {"generation": self.generation, "state": "ready", "package_sha256": NEW}

    def rollback(self, alias: str) -> dict[str, Any]:
        self.calls.append("rollback")
        self.generation += 1
        self.sha = self.history.pop()
        return {"generation": self.generation, "state": "ready", "package_sha256": self.sha}


def rollout(boards: list[FakeBoard], haproxy: FakeHAProxy, **options: Any) -> Rollout:
    clock = FakeClock()
    return Rollout(haproxy, "calculet", boards, alias="qwen3", package="/pkgs/{board}/v2",  # type: ignore[arg-type]
                   options=RolloutOptions(poll_s=0.5, **options), clock=clock, pause=clock.advance)


@pytest.mark.req("R11.16", "R12.2", "R12.3", "R3.5")
def test_each_board_is_drained_idle_loaded_and_back_before_the_next() -> None:
    boards = [FakeBoard("board1", busy_polls=3), FakeBoard("board2"), FakeBoard("board3")]
    haproxy = FakeHAProxy(dict.fromkeys(["board1", "board2", "board3"], "ready"))
    record = rollout(boards, haproxy).run()
    assert record.ok and record.outcome == "completed" and record.failed_board is None
    assert haproxy.log == [("board1", "drain"), ("board1", "ready"), ("board2", "drain"), ("board2", "ready"),
                           ("board3", "drain"), ("board3", "ready")]
    assert [b.calls for b in boards] == [["load /pkgs/board1/v2"], ["load /pkgs/board2/v2"], ["load /pkgs/board3/v2"]]
    board1_steps = [s.action for s in record.steps if s.board == "board1"]
    assert board1_steps == ["before", "drain", "wait_idle", "load", "check", "ready", "wait_up"]
    waited = next(s for s in record.steps if s.board == "board1" and s.action == "wait_idle")
    assert waited.duration_s == pytest.approx(1.5)  # 3 busy answers, 0.5 s apart on the fake clock, then idle
    assert all(b.after is not None and b.after.package_sha256 == NEW and b.changed for b in record.boards)
    assert record.as_dict()["kind"] == RECORD_KIND


@pytest.mark.req("R11.16", "R11.9", "R11.11")
def test_a_golden_failure_on_board2_stops_there_and_rolls_board1_back() -> None:
    boards = [FakeBoard("board1"), FakeBoard("board2", golden_ok=False), FakeBoard("board3")]
    haproxy = FakeHAProxy(dict.fromkeys(["board1", "board2", "board3"], "ready"))
    record = rollout(boards, haproxy).run()
    assert not record.ok and record.outcome == "stopped_rolled_back" and record.failed_board == "board2"
    assert "step 9" in (record.error or "")
    assert boards[0].calls == ["load /pkgs/board1/v2", "rollback"] and boards[2].calls == []
    assert [b.sha for b in boards] == [OLD, OLD, OLD]
    assert set(haproxy.states.values()) == {"ready"}  # every board back in rotation, on the old package
    one, two, three = record.boards
    assert one.rolled_back and not one.changed and one.after is not None and one.after.package_sha256 == OLD
    assert not two.changed and two.after is not None and two.after.package_sha256 == OLD and three.after is None
    actions = [(s.board, s.action, s.ok) for s in record.steps]
    assert ("board2", "load", False) in actions and ("board2", "restore_check", True) in actions
    assert actions.index(("board2", "restore_check", True)) < actions.index(("board1", "rollback", True))


def test_without_rollback_the_changed_boards_stay_and_the_outcome_says_stopped() -> None:
    boards = [FakeBoard("board1"), FakeBoard("board2", golden_ok=False)]
    haproxy = FakeHAProxy(dict.fromkeys(["board1", "board2"], "ready"))
    record = rollout(boards, haproxy, rollback=False).run()
    assert record.outcome == "stopped" and boards[0].sha == NEW and boards[0].calls == ["load /pkgs/board1/v2"]
    assert record.board("board1").changed and not record.board("board1").rolled_back


@pytest.mark.req("R12.3")
def test_a_board_that_never_drains_stops_the_rollout_before_any_load() -> None:
    boards = [FakeBoard("board1"), FakeBoard("board2")]
    haproxy = FakeHAProxy(dict.fromkeys(["board1", "board2"], "ready"), sessions={"board1": 3})
    record = rollout(boards, haproxy, drain_timeout_s=5.0).run()
    assert record.outcome == "stopped" and record.failed_board == "board1"
    assert "within 5 s" in (record.error or "") and boards[0].calls == [] and boards[1].calls == []
    assert haproxy.states == {"board1": "ready", "board2": "ready"}  # the drained board is put back
