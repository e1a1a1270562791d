"""A fixed answer per key, asked of its function once (issue #20)."""

from __future__ import annotations

from typing import Callable, Hashable, TypeVar

K = TypeVar("K", bound=Hashable)
V = TypeVar("V")

__all__ = ["AskedOnce"]


class AskedOnce(dict[K, V]):
    """``key -> ask(key)``, asked once per key: for an answer that nothing changes once given (a tenant's
    configured decode cost, a profile set's choice for a Ready count) but that a decode step reads per lane or
    per step — a dictionary read instead of a call. Read it as a mapping (``memo[key]``) or call it like the
    function it keeps (``memo(key)``)."""

    __slots__ = ("_ask",)

    def __init__(self, ask: Callable[[K], V]) -> None:
        super().__init__()
        self._ask = ask

    def __missing__(self, key: K) -> V:
        value = self[key] = self._ask(key)
        return value

    __call__ = dict.__getitem__
