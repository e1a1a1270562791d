"""Device memory as CalRT reports it: ReadMem per chiplet and a calbin's reservation (§13.1).

Neither figure is evidence of chip isolation (§13.3); :func:`read_board_memory` walks the board's
chiplets for the §13.1 capacity figures and the §12 release check.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from calculet.errors import CalculetError


@dataclass(frozen=True)
class MemInfo:
    """ReadMem(chip): DRAM figures of one chiplet. Not evidence of chip isolation (§13.3)."""

    chip: int
    total_bytes: int
    used_bytes: int
    free_bytes: int


@dataclass(frozen=True)
class MemoryFootprint:
    """What a calbin reserves on the board (§13.1)."""

    parameter_bytes: int
    kv_bytes: int
    reserved_bytes: int
    kv_dtype: str
    chiplets: tuple[int, ...]

    @property
    def runtime_bytes(self) -> int:
        """Reservation beyond parameters and KV (activations, runtime; §13.1 leaves 7.462 GiB open)."""
        return self.reserved_bytes - self.parameter_bytes - self.kv_bytes



MAX_CHIPLETS = 8
"""How far :func:`read_board_memory` asks: ReadMem takes a chip id and the board's chiplet count
is not part of the protocol, so the walk stops at the first refused id or here."""


class ReadsMemory(Protocol):
    """The one call of a VirtualDevice the board walk needs (the full protocol imports this module)."""

    def read_mem(self, chip: int) -> MemInfo: ...


def read_board_memory(device: ReadsMemory) -> tuple[MemInfo, ...]:
    """ReadMem for every chiplet of the board, in chip order (§13.1 capacity figures, §12 release
    check); a refused chip id ends the board. Not evidence of chip isolation (§13.3)."""
    board: list[MemInfo] = []
    for chip in range(MAX_CHIPLETS):
        try:
            board.append(device.read_mem(chip))
        except CalculetError:
            break
    return tuple(board)
