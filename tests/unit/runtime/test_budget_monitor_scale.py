"""The counters' recount (``budget_monitor.check_counts``) scaled with the live requests when sampling (#20).

A sampled step recounts every live request; with many live ones it does so on one sampled step in
live / ``RECOUNT_REQUESTS``, so its amortized cost per step stays bounded, while with every event
checked (the test suite's setting) and with few live requests every sampled step still recounts.
"""

from __future__ import annotations

import itertools
from typing import Any

import pytest

from calculet.machines.monitor import MONITOR
from calculet.runtime.scheduling import budget_monitor


class _Registry:
    """What check_counts reads of a registry: how many are live, and the live records (none here)."""

    def __init__(self, n: int) -> None:
        self.n, self.walks = n, 0

    def __len__(self) -> int:
        return self.n

    def live(self) -> list[Any]:
        self.walks += 1
        return []


def _recounts(monkeypatch: pytest.MonkeyPatch, live: int, sample_every: int, steps: int = 2000) -> int:
    """How many of ``steps`` sampled steps (every draw hits) recount, at ``live`` requests."""
    monkeypatch.setattr(MONITOR, "enabled", True)
    monkeypatch.setattr(MONITOR, "sample_every", sample_every)
    monkeypatch.setattr(MONITOR, "draws", itertools.repeat(True))
    monkeypatch.setattr(budget_monitor, "count_faults", lambda admission, live: [])
    registry = _Registry(live)
    for _ in range(steps):
        budget_monitor.check_counts(None, registry, "test step")
    return registry.walks


@pytest.mark.req("R5.1.2")
def test_sampled_recount_runs_once_in_live_over_64_steps(monkeypatch: pytest.MonkeyPatch) -> None:
    assert _recounts(monkeypatch, budget_monitor.RECOUNT_REQUESTS, 256) == 2000  # few live: every sampled step
    # 6 400 live: 64 / 6 400 of 2 000 sampled steps, 20 expected (binomial: 5..45 holds with p > 0.9999)
    assert 5 <= _recounts(monkeypatch, 6400, 256) <= 45


@pytest.mark.req("R5.1.2")
def test_every_event_checked_recounts_every_step_whatever_the_live_count(monkeypatch: pytest.MonkeyPatch) -> None:
    assert _recounts(monkeypatch, 65_536, 1, steps=200) == 200
