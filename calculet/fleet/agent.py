"""HAProxy ``agent-check`` responder: a board's spare capacity as its weight (issue #15, item 2).

Why: ``leastconn`` balances on open connections, which for SSE streams is the number of requests a
board holds. A board also knows what the balancer cannot: how many of its KV lanes are taken
(``admission.max_sequences``, §5.1) and how much is queued. HAProxy's agent check asks a small TCP
responder for a weight (``"75%\\n"``) every ``agent-inter``; this module answers with the share of
lanes still free (at least 1 %, so a full board keeps a trickle and never looks dead — readiness
stays the httpchk's job). ``bench/fleet.py --agent`` measures whether it beats plain leastconn.
"""

from __future__ import annotations

import asyncio
import logging

from calculet.errors import CalculetError
from calculet.fleet.board_admin import BoardAdmin

log = logging.getLogger("calculet.fleet.agent")
MIN_WEIGHT = 1


class CapacityProbe:
    """The weight HAProxy should give one board: the percentage of its KV lanes that are free."""

    def __init__(self, board: BoardAdmin, lanes: int | None = None) -> None:
        self.board = board
        self._lanes = lanes

    @property
    def lanes(self) -> int:
        if self._lanes is None:
            config = self.board.config()
            self._lanes = int(config["admission"]["max_sequences"])
        return self._lanes

    def weight(self) -> int:
        """100 when idle, down to :data:`MIN_WEIGHT` when every lane is taken or requests queue."""
        busy = self.board.active_requests()
        free = max(0.0, 1.0 - busy / self.lanes)
        return max(MIN_WEIGHT, round(100 * free))


async def _answer(probe: CapacityProbe, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        weight = await asyncio.to_thread(probe.weight)
        writer.write(f"{weight}%\n".encode())
    except CalculetError as exc:  # the board did not answer: say nothing new (HAProxy keeps the weight)
        log.warning("agent: no weight", extra={"board": probe.board.name, "detail": str(exc)})
    finally:
        writer.close()


async def serve_agent(probe: CapacityProbe, host: str, port: int) -> None:
    """Answer HAProxy's agent checks on ``host:port`` until cancelled."""
    server = await asyncio.start_server(lambda r, w: _answer(probe, r, w), host, port)
    async with server:
        await server.serve_forever()


__all__ = ["CapacityProbe", "MIN_WEIGHT", "serve_agent"]
