"""One real fleet for the fleet tests: HAProxy 2.6 (the shipped template) and 3 simulated boards
(``python -m calculet.run --sim-cost reference``) on free 127.0.0.1 ports, stopped by PID.

The fleet is started once for the module that uses it (about 20 s on two cores), stopped when that
module is done, and the fleet tests are kept on one xdist worker (``xdist_group``; ``make test`` runs ``--dist loadgroup``). Each test reads the
state it starts from (what every board serves) instead of relying on another test's order.
Without HAProxy the tests fail under ``CI=true`` (``make system-tools`` installs it) and are
skipped elsewhere, saying why.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from calculet.fleet.local import LocalFleet, haproxy_binary


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    here = Path(__file__).parent
    for item in items:
        if here in Path(str(item.fspath)).parents:
            item.add_marker(pytest.mark.xdist_group("fleet"))


def require_haproxy() -> str:
    binary = haproxy_binary()
    if binary is None:
        message = "haproxy is not installed: `make system-tools` installs it (Debian package haproxy)"
        if os.environ.get("CI", "").lower() in ("1", "true", "yes"):
            pytest.fail(message)
        pytest.skip(message)
    return binary


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalFleet]:
    require_haproxy()
    running = LocalFleet(tmp_path_factory.mktemp("fleet"), boards=3, sim_cost="reference")
    try:
        running.start()
        yield running
    finally:
        running.stop()
