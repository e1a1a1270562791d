"""The refusal lane's statistics record (:meth:`calculet.server.refusal_lane.RefusalLane.statistics`).

Why a module of its own: the lane imports the routes, which import the service, which registers the collector that
exports this record (:mod:`calculet.server.metrics_front`); the record alone imports nothing of the server.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class RefusalLaneStatistics:
    """What the lane answered and what it left to the ASGI app."""

    refused: int
    """Requests answered 429 by the lane."""
    declined: int
    """Requests it handed to the ASGI app (invalid, not refused, or not decidable here)."""
    held: int
    """Requests it held for the engine's next answer before deciding (each once, however many waits)."""
    memo_hits: int
    memo_entries: int


__all__ = ["RefusalLaneStatistics"]
