"""Device DRAM accounting of the simulated NPU (§13.1).

A calbin reserves its manifest's ``reserved_bytes`` (parameters + KV + runtime) spread evenly over
the chiplets it spans; job buffers take what they need from the chips' free memory. A reservation
that does not fit fails with OUT_OF_MEMORY and a message stating the figures, so that a second
large model is refused instead of assumed to fit (§13.1: "It must not be assumed that there is
still room to keep a second large model resident", R13.1.5).

The spec gives the reference model's figures (16.938 GiB parameters, 3.750 GiB BF16 KV, 28.150
GiB reserved per board, the last one *inferred*) but not the board's DRAM size; the reference
board preset assumes 2 × 16 GiB and says so.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass

from calculet.adapters.calrt import MemInfo, MemoryFootprint, ReturnCode, VendorError
from calculet.errors import DefinitionError

GIB = 1 << 30
MIB = 1 << 20


def gib(n: float) -> int:
    """Bytes in ``n`` GiB (rounded to a byte)."""
    return round(n * GIB)


def fmt_gib(n: int) -> str:
    return f"{n / GIB:.3f} GiB"


@dataclass(frozen=True)
class BoardPreset:
    """A board's DRAM per chiplet."""

    name: str
    chip_bytes: tuple[int, ...]
    note: str

    @property
    def total_bytes(self) -> int:
        return sum(self.chip_bytes)

    @classmethod
    def reference(cls) -> BoardPreset:
        """The reference dual-chiplet board. DRAM size is an assumption (2 × 16 GiB)."""
        return cls("reference", (16 * GIB, 16 * GIB),
                   "board DRAM assumed 2 x 16 GiB; the spec states only the 28.150 GiB reservation (§13.1)")

    @classmethod
    def tiny(cls) -> BoardPreset:
        """A small board for the tiny model: room for a few tiny calbins, so co-residency is a
        capability question, not a memory one."""
        return cls("tiny", (64 * MIB, 64 * MIB), "sized for the tiny simulated model")


# The reference model's figures (§13.1).
REFERENCE_PARAMETER_BYTES = gib(16.938)
REFERENCE_KV_BYTES = gib(3.750)
REFERENCE_RESERVED_BYTES = gib(28.150)


@dataclass(frozen=True)
class MemoryStatistics:
    board: str
    total_bytes: int
    used_bytes: int
    reservations: int
    peak_used_bytes: int
    refused: int


class MemoryLedger:
    """Reservations per owner and chip; thread-safe."""

    def __init__(self, board: BoardPreset) -> None:
        self.board = board
        self._lock = threading.Lock()
        self._owners: dict[str, dict[int, int]] = {}
        self._labels: dict[str, str] = {}
        self._peak = 0
        self._refused = 0

    def _used(self, chip: int) -> int:
        return sum(r.get(chip, 0) for r in self._owners.values())

    def _check_chips(self, chips: tuple[int, ...]) -> None:
        for c in chips:
            if not 0 <= c < len(self.board.chip_bytes):
                raise VendorError(ReturnCode.INVALID_ARGUMENT,
                                  f"chiplet {c} does not exist on board {self.board.name!r} "
                                  f"({len(self.board.chip_bytes)} chiplets)")

    def reserve_calbin(self, owner: str, label: str, footprint: MemoryFootprint) -> None:
        """Reserve a calbin's footprint or raise OUT_OF_MEMORY stating every figure (§13.1)."""
        chips = footprint.chiplets
        self._check_chips(chips)
        share = -(-footprint.reserved_bytes // len(chips))
        with self._lock:
            short = [c for c in chips if self.board.chip_bytes[c] - self._used(c) < share]
            if short:
                self._refused += 1
                used = sum(self._used(c) for c in range(len(self.board.chip_bytes)))
                holders = ", ".join(f"{self._labels[o]} {fmt_gib(sum(r.values()))}"
                                    for o, r in self._owners.items()) or "nothing"
                raise VendorError(
                    ReturnCode.OUT_OF_MEMORY,
                    f"cannot reserve {label}: it needs {fmt_gib(footprint.reserved_bytes)} of device DRAM "
                    f"(parameters {fmt_gib(footprint.parameter_bytes)} + {footprint.kv_dtype.upper()} KV "
                    f"{fmt_gib(footprint.kv_bytes)} + runtime/activations {fmt_gib(footprint.runtime_bytes)}, "
                    f"{fmt_gib(share)} on each of chiplets {list(chips)}); board {self.board.name!r} has "
                    f"{fmt_gib(self.board.total_bytes)}, {fmt_gib(used)} already reserved ({holders}), "
                    f"{fmt_gib(self.board.total_bytes - used)} free; short on chiplet(s) {short} "
                    "(§13.1: no room is assumed for a second large model)")
            self._owners[owner] = {c: share for c in chips}
            self._labels[owner] = label
            self._peak = max(self._peak, sum(self._used(c) for c in range(len(self.board.chip_bytes))))

    def reserve_bytes(self, owner: str, label: str, nbytes: int) -> int:
        """Reserve a buffer on the chip with the most free memory; returns the chip."""
        with self._lock:
            chips = range(len(self.board.chip_bytes))
            chip = max(chips, key=lambda c: self.board.chip_bytes[c] - self._used(c))
            free = self.board.chip_bytes[chip] - self._used(chip)
            if free < nbytes:
                self._refused += 1
                raise VendorError(ReturnCode.OUT_OF_MEMORY,
                                  f"cannot allocate {label} ({nbytes} bytes): largest free chiplet {chip} "
                                  f"has {free} bytes")
            self._owners[owner] = {chip: nbytes}
            self._labels[owner] = label
            self._peak = max(self._peak, sum(self._used(c) for c in chips))
            return chip

    def release(self, owner: str) -> None:
        with self._lock:
            if self._owners.pop(owner, None) is None:
                raise DefinitionError(f"memory ledger: {owner!r} holds no reservation")
            self._labels.pop(owner, None)

    def holds(self, owner: str) -> bool:
        with self._lock:
            return owner in self._owners

    def read_mem(self, chip: int) -> MemInfo:
        """ReadMem(chip). Figures only: not evidence of chip-scoped isolation (§13.3)."""
        self._check_chips((chip,))
        with self._lock:
            used = self._used(chip)
        total = self.board.chip_bytes[chip]
        return MemInfo(chip=chip, total_bytes=total, used_bytes=used, free_bytes=total - used)

    def statistics(self) -> MemoryStatistics:
        with self._lock:
            used = sum(self._used(c) for c in range(len(self.board.chip_bytes)))
            return MemoryStatistics(board=self.board.name, total_bytes=self.board.total_bytes, used_bytes=used,
                                    reservations=len(self._owners), peak_used_bytes=self._peak,
                                    refused=self._refused)
