"""Three simulated boards behind the shipped HAProxy configuration, through real processes: the load
spreads evenly with no error, a rolling upgrade under steady load refuses nothing and leaves every
board on the new generation, a rollout whose package fails its golden check on board 2 stops there
with board 1 rolled back, and a ``kill -9``'d board fails only its own streams and comes back by
itself (R3.5, R13.1.4, R11.16, R11.9, R11.11, R12.2). Sizes are small (``make test``); the figures at
the issue's sizes come from ``bench/fleet.py``."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pytest

from calculet.fleet.board_admin import Served
from calculet.fleet.cli import main as fleet_main
from calculet.fleet.load import BackgroundLoad, LoadSpec, drive
from calculet.fleet.local import ALIAS, BACKEND, LocalFleet, make_package
from calculet.fleet.rollout import Rollout

pytestmark = pytest.mark.usefixtures("fleet")
STEADY = LoadSpec(clients=6, requests=None, max_tokens=4, timeout_s=30.0)


def serving(fleet: LocalFleet) -> dict[str, Served]:
    served = {a.name: a.served() for a in fleet.admins()}
    assert all(s is not None and s.state == "ready" for s in served.values()), served
    return served  # type: ignore[return-value]


def wait_for(condition: object, timeout_s: float, what: str) -> float:
    """Poll a real system (other processes: HAProxy, the boards) until ``condition()``; returns when it
    held. ``timeout_s`` is a hang guard, tripled for a loaded machine, not a measured figure (the
    figures, e.g. 'marked down within 3 s', come from bench/fleet.py)."""
    deadline = time.monotonic() + 3 * timeout_s  # allowed: a hang guard on other processes, not a duration asserted
    while not condition():  # type: ignore[operator]
        if time.monotonic() >= deadline:  # allowed: the same hang guard
            pytest.fail(f"{what}: not within {3 * timeout_s} s")
        time.sleep(0.05)  # allowed: polling other processes, which have no fake clock
    return time.monotonic()


@pytest.mark.req("R3.5", "R13.1.4")
def test_streams_spread_evenly_across_three_boards_with_no_error(fleet: LocalFleet) -> None:
    result = drive(fleet.url, LoadSpec(clients=12, requests=60, max_tokens=4))
    assert result.failed == [] and len(result.outcomes) == 60
    counts = result.by_board()
    assert set(counts) == {"board1", "board2", "board3"}
    assert all(16 <= n <= 24 for n in counts.values()), counts  # within ±20 % of 20 each (leastconn)
    assert all(o.tokens >= 1 and o.fingerprint and o.fingerprint.startswith("calculet-g") for o in result.outcomes)


@pytest.fixture
def packages(fleet: LocalFleet) -> Path:
    """A fresh directory under the boards' trusted root for this test's packages. It is kept until
    the fleet goes: a board restores or rolls back to a package it served before (§11 step 11)."""
    root = fleet.packages / f"t{time.monotonic_ns()}"
    root.mkdir()
    return root


@pytest.mark.req("R11.16", "R12.2", "R12.3", "R10.3", "R11.9")
def test_rolling_upgrade_under_steady_load_refuses_nothing_and_ends_on_the_new_generation(
        fleet: LocalFleet, packages: Path) -> None:
    before = serving(fleet)
    package = make_package(packages, "gen-next", fleet.private_key)
    with BackgroundLoad(fleet.url, STEADY) as load:
        wait_for(lambda: len(load.outcomes) >= 3, 30, "steady load running")
        record = Rollout(fleet.runtime(), BACKEND, fleet.admins(), alias=ALIAS, package=str(package)).run()
        after = serving(fleet)
        mark = time.perf_counter()  # every board's new generation is known: what starts now must name it
        wait_for(lambda: len(load.started_after(mark)) >= 9, 30, "requests after the rollout")
    steady = load.result
    assert steady is not None and record.ok, record.as_dict()
    assert len(steady.outcomes) >= 20 and steady.failed == [], steady.summary()
    assert {s.package_sha256 for s in after.values()} == {record.boards[0].after.package_sha256}  # type: ignore[union-attr]
    assert all(after[n].package_sha256 != before[n].package_sha256 for n in after)
    for outcome in load.started_after(mark):
        assert outcome.board is not None and outcome.fingerprint == f"calculet-g{after[outcome.board].generation}"
    assert [s.action for s in record.steps if s.board == "board2"] == [
        "before", "drain", "wait_idle", "load", "check", "ready", "wait_up"]


@pytest.mark.req("R11.16", "R11.9", "R11.11")
def test_a_golden_failure_on_board2_stops_the_rollout_and_board1_is_rolled_back(
        fleet: LocalFleet, packages: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    before = serving(fleet)
    for board in ("board1", "board2", "board3"):  # one store per board; board 2's copy has a bad golden vector
        make_package(packages / board, "gen-bad2", fleet.private_key, corrupt_golden=board == "board2")
    monkeypatch.setenv("CALCULET_ADMIN_TOKEN", fleet.admin_token)
    record_path = tmp_path / "rollout.json"
    with BackgroundLoad(fleet.url, STEADY) as load:
        code = fleet_main(["rollout", "--haproxy-socket", fleet.runtime().socket_path, "--backend", BACKEND,
                           "--package", str(packages / "{board}" / "gen-bad2"), "--record", str(record_path)])
    assert code == 1
    record = json.loads(record_path.read_text())
    assert record["outcome"] == "stopped_rolled_back" and record["failed_board"] == "board2"
    assert "step 9" in record["error"] and "golden" in record["error"]
    boards = {b["name"]: b for b in record["boards"]}
    assert boards["board1"]["rolled_back"] and boards["board3"]["after"] is None
    after = serving(fleet)
    assert {n: s.package_sha256 for n, s in after.items()} == {n: s.package_sha256 for n, s in before.items()}
    assert after["board3"].generation == before["board3"].generation  # board 3 was never touched
    assert load.result is not None and load.result.failed == [], load.result.summary()
    assert all(s.up for s in fleet.runtime().servers(BACKEND).values())
    shown = capsys.readouterr().out
    assert "board2" in shown and "stopped_rolled_back" in shown


@pytest.mark.req("R12.2")
def test_ready_answers_503_while_a_board_loads(fleet: LocalFleet, packages: Path) -> None:
    """Readiness is the balancer's contract: a board whose model is being replaced leaves rotation."""
    import threading

    import httpx

    name = "board1"
    board = fleet.member(name).board
    package = make_package(packages, "gen-ready", fleet.private_key)
    seen: set[int] = set()
    fleet.runtime().set_state(BACKEND, name, "drain")
    try:
        loader = threading.Thread(target=lambda: fleet.admin(name).load(ALIAS, str(package)))
        with httpx.Client(base_url=board.url, timeout=5) as http:
            loader.start()
            while loader.is_alive():
                seen.add(http.get("/health/ready").status_code)
            loader.join()
            assert http.get("/health/ready").status_code == 200
    finally:
        fleet.runtime().set_state(BACKEND, name, "ready")
    assert 503 in seen
    wait_for(lambda: fleet.runtime().server(BACKEND, name).up, 30, "board1 UP")


@pytest.mark.req("R12.1", "R12.2", "R12.3", "R11.1")
def test_drain_then_reload_one_board_as_the_prestop_hook_and_systemctl_reload_do(
        fleet: LocalFleet, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    name = "board2"
    member, admin = fleet.member(name), fleet.admin(name)
    monkeypatch.setenv("CALCULET_ADMIN_TOKEN", fleet.admin_token)
    fleet.runtime().set_state(BACKEND, name, "drain")
    try:
        assert fleet_main(["drain", "--url", member.board.url, "--alias", ALIAS, "--timeout", "60"]) == 0
        ready, detail = admin.ready()
        assert not ready and admin.busy() == 0 and admin.served() is None, detail
        assert fleet_main(["reload", "--config", str(member.config)]) == 0  # the configured package, again
        served = admin.served()
        assert admin.ready()[0] and served is not None and served.state == "ready"
    finally:
        fleet.runtime().set_state(BACKEND, name, "ready")
    wait_for(lambda: fleet.runtime().server(BACKEND, name).up, 30, "board2 UP")
    assert "drained" in capsys.readouterr().out
    assert fleet_main(["status", "--haproxy-socket", fleet.runtime().socket_path, "--backend", BACKEND]) == 0
    shown = capsys.readouterr().out
    assert all(f"board{i}" in shown for i in (1, 2, 3)) and "UP" in shown


@pytest.mark.req("R13.1.4", "R3.5")
def test_kill_9_fails_only_that_boards_streams_and_it_comes_back_by_itself(fleet: LocalFleet) -> None:
    victim = "board3"
    runtime = fleet.runtime()
    with BackgroundLoad(fleet.url, LoadSpec(clients=9, requests=None, max_tokens=8, timeout_s=30.0)) as load:
        wait_for(lambda: runtime.server(BACKEND, victim).current_sessions > 0, 30, "board3 serving")
        killed_at = time.perf_counter()
        fleet.kill(victim)
        wait_for(lambda: not runtime.server(BACKEND, victim).status.startswith("UP"), 10, "board3 marked down")
        down_at = time.perf_counter()
        fleet.restart(victim)
        wait_for(lambda: runtime.server(BACKEND, victim).up, 90, "board3 back UP")
        up_at = time.perf_counter()
        wait_for(lambda: any(o.board == victim for o in load.started_after(up_at)), 30, "board3 serving again")
    result = load.result
    assert result is not None
    failed = result.failed
    assert all("hang" not in o.error for o in result.outcomes)
    assert all(o.board in (victim, None) for o in failed), [(o.board, o.error) for o in failed]
    assert all(o.started < down_at for o in failed)  # once HAProxy marked it down, every new request succeeded
    assert all(o.ok for o in result.outcomes if o.started > down_at)
    assert [o for o in result.outcomes if o.started > up_at and o.board == victim], "board3 not back in rotation"
    assert killed_at < down_at < up_at
