"""The retry slots' rules written plainly, as the one reference for :class:`~calculet.runtime.scheduling.on_time_retry
.RetrySlots` (issue #13): one list of ghosts in arrival order, an expiry pass over every ghost at every reservation
(and at every :meth:`PlainRetrySlots.expire`), a walk over every ghost for an admission, the lanes rebuilt from every
ghost in retry-time order when the kept schedule or the ghosts changed, the oldest dropped down to the limit once more
than limit + limit // 8 are held. Plain Python with no code of the production class: the tests that hold
``RetrySlots`` to it (its indexes, its expiry skipped while nothing can have expired, its C-level rebuild) compare two
independent writings of one rule."""

from __future__ import annotations

import heapq
import math
from dataclasses import dataclass, field


@dataclass
class PlainGhost:
    retry_at: float
    length: float
    tenant: str
    seq: int


@dataclass
class PlainRetrySlots:
    grace_s: float = 2.0
    limit: int = 512
    ghosts: list[PlainGhost] = field(default_factory=list)
    free: list[float] | None = None
    key: object = None
    seq: int = 0

    def reserve(self, base: list[float], key: object, now: float, length: float, relative: float, lower: float,
                tenant: str = "", drained: bool = False) -> float:
        self.expire(now)
        if self.free is None or key != self.key:
            self.rebuild(base, key, now)
        assert self.free is not None
        lane = self.free[0]
        if drained:
            lower = max(lower, max(self.free))
        retry = now + max(0, math.ceil(max(lower, lane + length - relative) - now - 1e-9))
        heapq.heapreplace(self.free, max(retry, lane) + length)
        self.seq += 1
        self.ghosts.append(PlainGhost(retry, length, tenant, self.seq))
        if len(self.ghosts) > self.limit + self.limit // 8:
            del self.ghosts[:len(self.ghosts) - self.limit]
            self.free = None
        return retry

    def rebuild(self, base: list[float], key: object, now: float) -> None:
        """The lanes from ``base`` with every ghost placed in retry-time order, ties in arrival order (stable sort)."""
        self.free = [max(now, t) for t in base] or [now]
        heapq.heapify(self.free)
        for ghost in sorted(self.ghosts, key=lambda g: g.retry_at):
            heapq.heapreplace(self.free, max(ghost.retry_at, self.free[0]) + ghost.length)
        self.key = key

    def admitted(self, tenant: str, now: float) -> None:
        due = [g for g in self.ghosts if g.tenant == tenant and g.retry_at <= now + self.grace_s]
        if due:
            self.ghosts.remove(min(due, key=lambda g: (g.retry_at, g.seq)))
            self.free = None

    def expire(self, now: float) -> None:
        kept = [g for g in self.ghosts if g.retry_at + self.grace_s >= now]
        if len(kept) != len(self.ghosts):
            self.ghosts, self.free = kept, None
