"""Shared test set-up: Hypothesis profiles, invariant monitors on, the `req` marker."""

from __future__ import annotations

import os

import pytest
from hypothesis import HealthCheck, settings

from calculet.machines.monitor import MONITOR

# DESIGN principle 9: two depths of fuzzing. `ci` is bounded and derandomized (no flakes, no
# deadline noise on a loaded 2-core machine); `deep` is for `make soak`.
settings.register_profile("ci", max_examples=150, stateful_step_count=40, derandomize=True,
                          deadline=None, print_blob=True,
                          suppress_health_check=[HealthCheck.too_slow])
settings.register_profile("deep", max_examples=3000, stateful_step_count=120, deadline=None,
                          print_blob=True, suppress_health_check=[HealthCheck.too_slow])
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))


# Every test checks every event, whatever monitoring.sample_every a configuration says (#20).
MONITOR.every_event = True


@pytest.fixture(autouse=True)
def _monitors_on():
    """Invariant monitors raise in every test (issue: run-time monitors), and a test that counted
    violations leaves none behind: the counts are per process, and the tests that break invariants on
    purpose (a corrupted variable, a sampled monitor's corruption, the #17 mutants, a dropped lease)
    left them for whichever test ran next in the same xdist worker — test_metrics read a non-zero
    calculet_invariant_violations_total in a fresh clone's run (#19)."""
    MONITOR.configure(enabled=True, mode="raise")
    before = MONITOR.statistics().violations
    yield
    MONITOR.configure(enabled=True, mode="raise")
    if MONITOR.statistics().violations != before:
        MONITOR.reset()
