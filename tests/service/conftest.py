"""Fixtures: real servers shared by the service tests (each started once, stopped at the end)."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from pathlib import Path

import pytest

from calculet.adapters.sim import CostModel
from tests.service.support import RunningServer, service_config, start_server

PACED = CostModel(prefill_fixed_s=1e-3, prefill_per_token_s=0.0, decode_fixed_s=5e-3, decode_per_lane_s=0.0,
                  pingpong_overlap=0.5)
"""5 ms per decode step: a 200-token stream lasts about a second, long enough to act on mid-way."""


@pytest.fixture(scope="session")
def key_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A development key pair made for the tests (never the machine's own ~/.calculet)."""
    return tmp_path_factory.mktemp("dev-keys")


@pytest.fixture(scope="session")
def server(key_dir: Path) -> Iterator[RunningServer]:
    """The default stack: four tenants, admin token, §15 defaults, tiny cost model."""
    running = start_server(service_config(), key_dir)
    yield running
    running.stop()


@pytest.fixture(scope="session")
def paced_server(key_dir: Path) -> Iterator[RunningServer]:
    """One active sequence, one waiting request at most (429 beyond), 5 ms decode steps, no admin token."""
    config = service_config(admin=False, admission={"max_sequences": 1, "max_waiting_requests": 1})
    running = start_server(config, key_dir, cost=PACED)
    yield running
    running.stop()


@pytest.fixture
def fresh_server(key_dir: Path) -> Iterator[RunningServer]:
    """A server of its own, for tests that drain or stop it (short drain deadline)."""
    running = start_server(service_config(executor={"drain_deadline_ms": 2000}), key_dir, cost=PACED)
    yield running
    running.stop()


@pytest.fixture
def restore_logging() -> Iterator[None]:
    """``run.main`` configures process-wide logging; put it back for the tests that follow."""
    names = ("calculet", "uvicorn", "uvicorn.error", "uvicorn.access")
    saved = {name: (list(lg.handlers), lg.level, lg.propagate, lg.disabled)
             for name in names for lg in (logging.getLogger(name),)}
    yield
    for name, (handlers, level, propagate, disabled) in saved.items():
        logger = logging.getLogger(name)
        logger.handlers[:] = handlers
        logger.setLevel(level)
        logger.propagate = propagate
        logger.disabled = disabled
