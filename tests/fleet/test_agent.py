"""The agent-check responder: a board's free KV-lane share (§5.1 ``admission.max_sequences``) as the
percentage HAProxy weighs it by, over the agent protocol (one line per TCP connection), and the
server line the template renders for it (R3.5)."""

from __future__ import annotations

import asyncio
from typing import Any

from calculet.errors import Unavailable
from calculet.fleet.agent import MIN_WEIGHT, CapacityProbe, serve_agent
from calculet.fleet.haproxy_config import BalancerSettings, Board, render
from calculet.fleet.local import free_port


class FakeBoard:
    name = "board1"

    def __init__(self, active: int, lanes: int = 16) -> None:
        self.active = active
        self.lanes = lanes
        self.fail = False

    def active_requests(self) -> int:
        if self.fail:
            raise Unavailable("board1 did not answer")
        return self.active

    def config(self) -> dict[str, Any]:
        return {"admission": {"max_sequences": self.lanes}}


def test_the_weight_is_the_free_lane_share_never_below_the_minimum() -> None:
    board = FakeBoard(0)
    probe = CapacityProbe(board)  # type: ignore[arg-type]
    assert probe.weight() == 100 and probe.lanes == 16
    board.active = 4
    assert probe.weight() == 75
    board.active = 40  # more requests than lanes: queued
    assert probe.weight() == MIN_WEIGHT


def test_the_agent_answers_one_percentage_per_connection_and_nothing_when_the_board_is_silent() -> None:
    board = FakeBoard(8)
    port = free_port()

    async def scenario() -> list[bytes]:
        task = asyncio.ensure_future(serve_agent(CapacityProbe(board), "127.0.0.1", port))  # type: ignore[arg-type]
        answers = []
        try:
            for fail in (False, True):
                board.fail = fail
                for _ in range(50):  # the listener is up within a few loop turns
                    try:
                        reader, writer = await asyncio.open_connection("127.0.0.1", port)
                        break
                    except OSError:
                        await asyncio.sleep(0)
                answers.append(await asyncio.wait_for(reader.read(), 10))
                writer.close()
        finally:
            task.cancel()
        return answers

    assert asyncio.run(scenario()) == [b"50%\n", b""]


def test_a_board_with_an_agent_port_gets_an_agent_check_on_its_server_line() -> None:
    text = render([Board("board1", "127.0.0.1", 8001, 9001), Board("board2", "127.0.0.1", 8002)], BalancerSettings())
    assert "server board1 127.0.0.1:8001 agent-check agent-addr 127.0.0.1 agent-port 9001 agent-inter 1s" in text
    assert "server board2 127.0.0.1:8002\n" in text + "\n" and "weight 100" in text
