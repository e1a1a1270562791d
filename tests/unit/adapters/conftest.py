"""Fixtures for the adapter tests: simulated sessions on a FakeClock (virtual time)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from calculet.adapters.sim import SimSession, open_sim
from calculet.adapters.host_driver import HostDriver


@pytest.fixture
def current() -> Iterator[SimSession]:
    """The current product: B1 only, capabilities as the spec states them for CalRT 0.7.6."""
    with open_sim("current") as session:
        yield session


@pytest.fixture
def future() -> Iterator[SimSession]:
    """The simulated future calbin: B1/B4/B8/B16, masks, ping/pong, incremental prefill."""
    with open_sim("future") as session:
        yield session


@pytest.fixture
def future_driver(future: SimSession) -> HostDriver:
    return HostDriver(future.device, future.calbin, future.kv)


@pytest.fixture
def current_driver(current: SimSession) -> HostDriver:
    return HostDriver(current.device, current.calbin, current.kv)
