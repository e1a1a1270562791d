"""``/health/ready`` is the balancer's contract (DESIGN "Scaling out"): 200 only while the service
accepts and a generation is Ready; 503 — at once, without waiting on the engine — while a model
operation runs, and in every other §10 state (R12.2: a draining board is routed around)."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest

from calculet.server.service import Service


class FakeAdmin:
    def __init__(self, entries: list[dict[str, Any]], operation: str | None = None) -> None:
        self.entries = entries
        self.operation = operation
        self.status_reads = 0

    def status(self) -> list[dict[str, Any]]:
        self.status_reads += 1
        return self.entries

    def operation_in_progress(self) -> str | None:
        return self.operation


def readiness(admin: FakeAdmin, *, accepting: bool = True) -> tuple[bool, str]:
    return Service.readiness(SimpleNamespace(accepting=accepting, admin=admin))  # type: ignore[arg-type]


@pytest.mark.req("R12.2", "R10.1")
@pytest.mark.parametrize("state", ["validating", "configuring", "warming", "draining", "unloading", "recovering",
                                   "failed", "unloaded"])
def test_not_ready_in_every_state_but_ready(state: str) -> None:
    ok, detail = readiness(FakeAdmin([{"alias": "qwen3", "state": state, "active": True}]))
    assert not ok and f"qwen3={state}" in detail


@pytest.mark.req("R12.2")
def test_an_operation_under_way_is_not_ready_without_asking_the_engine() -> None:
    admin = FakeAdmin([{"alias": "qwen3", "state": "ready", "active": True}], operation="load of 'qwen3' (starting)")
    ok, detail = readiness(admin)
    assert not ok and "load of 'qwen3'" in detail and admin.status_reads == 0
    admin.operation = None
    assert readiness(admin) == (True, "ready: qwen3")
    assert readiness(admin, accepting=False) == (False, "shutting down")
