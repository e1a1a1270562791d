"""§9.3 context operations on a KV lane, each behind the capability contract that enables it.

Why a module of its own: these are the sequence-level operations of the vendor KV API (tail
removal, shift, copy, sessions), most of them empty implementations in CalRT 0.7.6 and so
refused with ``NotSupported`` until their boundary tests pass (§9.3, R9.3.x). They are a
different responsibility from :class:`~calculet.runtime.scheduling.kv.KvLaneManager`'s lane
transactions, which this mixin joins; it reads the manager's capability contract and fires its
lane machines through the manager's own ``_fire``/``_owned``/``_checked``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

from calculet.errors import NotSupported

KvLease = Any
"""A :class:`~calculet.runtime.scheduling.kv.KvLease` (not imported: ``kv`` imports this module)."""


@dataclass(frozen=True, slots=True)
class ShiftSequence:
    """Command: shift the sequence left by ``tokens`` (DoShift; only behind its capability)."""

    lane: int
    seq_id: int
    generation: int
    tokens: int


class KvContextOperations:
    """The §9.3 operations of :class:`~calculet.runtime.scheduling.kv.KvLaneManager`."""

    capabilities: Any
    """The manager's :class:`~calculet.runtime.scheduling.kv.KvCapabilities`."""

    # the manager's own methods, which these operations go through (declared here, defined there)
    _fire: Callable[..., None]
    _owned: Callable[[KvLease], int]
    _checked: Callable[[str], None]

    def remove_tail(self, lease: KvLease, tokens: int) -> None:
        """RemoveTokensAtEnd: only when the capability contract enables it (§9.3)."""
        if not self.capabilities.remove_tail:
            raise NotSupported("remove tail is disabled until the RemoveTokensAtEnd boundary tests pass (§9.3)",
                               operation="remove_tail")
        self._fire(self._owned(lease), "remove_tail", tokens=tokens)
        self._checked("remove_tail")

    def shift(self, lease: KvLease, tokens: int) -> ShiftSequence:
        """DoShift: C1/C2, only behind its capability; the lengths change like a tail removal."""
        if not self.capabilities.shift:
            raise NotSupported("shift is C1/C2: the SDK has DoShift but its semantics are not closed-loop (§9.3)",
                               operation="shift")
        lane = self._owned(lease)
        self._fire(lane, "remove_tail", tokens=tokens)
        self._checked("shift")
        return ShiftSequence(lane, lease.seq_id, lease.generation, tokens)

    def copy_prefix(self, source: KvLease, target: KvLease, tokens: int) -> None:
        raise NotSupported("copy prefix/sequence is an empty implementation in the adapter; disabled (§9.3)",
                           operation="copy_prefix")

    def keep_one_sequence(self, lease: KvLease) -> None:
        raise NotSupported("keep one seq is an empty implementation; disabled (§9.3)", operation="keep_one_seq")

    def position_add_div(self, lease: KvLease, start: int, end: int, delta: int, divisor: int = 1) -> None:
        raise NotSupported("position add/div is an empty implementation; disabled (§9.3)",
                           operation="position_add_div")

    def save_session(self, lease: KvLease) -> bytes:
        raise NotSupported("save session KV is an empty implementation; disabled (§9.3)", operation="save_session")

    def load_session(self, lease: KvLease, data: bytes) -> None:
        raise NotSupported("load session KV is an empty implementation; disabled (§9.3)", operation="load_session")
