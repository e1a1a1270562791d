"""Many boards behind HAProxy: the figures issue #15 asks for, in one run (a benchmark, not a test).

One local fleet — the shipped HAProxy configuration (``deploy/haproxy``, rendered by
``calculet.fleet.haproxy_config``) in front of 3 ``python -m calculet.run --sim-cost reference``
processes (the §13.1 model's assumed shape: 40 ms per B1 decode step, so the work is device-bound)
on 127.0.0.1 — and, in order:

1. **balance**: ``--requests`` (600) streaming completions from ``--clients`` (64) concurrent
   clients through HAProxy: errors, per-board counts and their largest deviation from even;
2. **scale-out**: the same workload with boards 2 and 3 in HAProxy's ``maint`` state (one board,
   same balancer, same clients) — the baseline — against the 3-board figure of step 1;
3. **kill -9** of board 3 under steady load: which requests failed (and on which board), whether
   any hung, how long HAProxy took to mark the board down with the shipped check intervals, that
   every request started after that succeeded, and how long the restarted board took to come back;
4. **rolling upgrade** of a new package under steady load: failed or refused requests, duration,
   and whether every response started after it names each board's new generation;
5. **failing rollout**: a package whose golden vector is wrong on board 2's copy: where it stopped,
   what was rolled back, what every board serves after, and the requests that failed meanwhile;
6. **agent-check vs leastconn**: a second fleet whose boards report their free KV-lane share through
   HAProxy's agent check (``calculet fleet agent``), then the same fleet with the agents disabled and
   the weights reset — step 1's workload on each, back to back.

Figures are printed as JSON (and written with ``--out``); each acceptance line of the issue is
judged from the figures beside them. Everything is stopped by PID at the end.

    python bench/fleet.py [--requests 600] [--clients 64] [--tokens 8] [--out FILE] [--only-agent]
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from calculet.fleet.load import BackgroundLoad, LoadResult, LoadSpec, drive
from calculet.fleet.local import ALIAS, BACKEND, LocalFleet, make_package
from calculet.fleet.rollout import Rollout

BOARDS = ("board1", "board2", "board3")


class _Skip(Exception):
    """--only-agent: skip the main fleet's steps."""


def wait_for(condition: Any, timeout_s: float) -> float:
    """Poll the running processes until ``condition()``; returns the time it held (perf_counter)."""
    deadline = time.perf_counter() + timeout_s
    while not condition():
        if time.perf_counter() > deadline:
            raise TimeoutError(f"not within {timeout_s} s")
        time.sleep(0.02)
    return time.perf_counter()


def balance(fleet: LocalFleet, spec: LoadSpec) -> tuple[dict[str, Any], LoadResult]:
    result = drive(fleet.url, spec)
    counts = result.by_board()
    even = len(result.outcomes) / len(BOARDS)
    worst = max(abs(counts.get(b, 0) - even) / even for b in BOARDS)
    figures = {**result.summary(), "largest_deviation_from_even": round(worst, 4)}
    figures["met"] = {"0 errors": not result.failed, "per-board within ±20% of even": worst <= 0.20}
    return figures, result


def one_board(fleet: LocalFleet, spec: LoadSpec, three: LoadResult) -> dict[str, Any]:
    runtime = fleet.runtime()
    for name in BOARDS[1:]:
        runtime.set_state(BACKEND, name, "maint")
    try:
        single = drive(fleet.url, spec)
    finally:
        for name in BOARDS[1:]:
            runtime.set_state(BACKEND, name, "ready")
        fleet.wait_all_up()
    ratio = (len(three.outcomes) / three.wall_s) / (len(single.outcomes) / single.wall_s)
    return {"one_board": single.summary(), "three_boards_requests_per_s": three.summary()["requests_per_s"],
            "throughput_ratio": round(ratio, 3), "met": {"3 boards >= 2.7x one board": ratio >= 2.7}}


def kill_nine(fleet: LocalFleet, spec: LoadSpec) -> dict[str, Any]:
    victim, runtime = "board3", fleet.runtime()
    with BackgroundLoad(fleet.url, spec) as load:
        wait_for(lambda: runtime.server(BACKEND, victim).current_sessions > 0 and len(load.outcomes) > 20, 60)
        serving_at_kill = runtime.server(BACKEND, victim).current_sessions
        killed = time.perf_counter()
        fleet.kill(victim)
        down = wait_for(lambda: not runtime.server(BACKEND, victim).status.startswith("UP"), 30)
        wait_for(lambda: len(load.started_after(down)) >= 50, 120)
        fleet.restart(victim)
        restarted = time.perf_counter()
        up = wait_for(lambda: runtime.server(BACKEND, victim).up, 120)
        wait_for(lambda: any(o.board == victim for o in load.started_after(up)), 60)
    result = load.finish()
    failed = result.failed
    after = [o for o in result.outcomes if o.started > down]
    figures = {"requests": len(result.outcomes), "failed": len(failed),
               "failed_on_killed_board_or_balancer": sum(1 for o in failed if o.board in (victim, None)),
               "failed_on_other_boards": sum(1 for o in failed if o.board not in (victim, None)),
               "streams_on_board_at_kill": serving_at_kill,
               "hung": sum(1 for o in result.outcomes if o.error.startswith("hang")),
               "failure_kinds": sorted({o.error[:60] for o in failed}),
               "marked_down_after_s": round(down - killed, 3),
               "requests_after_marked_down": len(after), "failed_after_marked_down": sum(not o.ok for o in after),
               "restarted_board_up_after_s": round(up - restarted, 3),
               "restarted_board_served": sum(1 for o in result.outcomes if o.started > up and o.board == victim)}
    figures["met"] = {"only the killed board's requests failed": figures["failed_on_other_boards"] == 0,
                      "no hang": figures["hung"] == 0,
                      "marked down <= 3 s": figures["marked_down_after_s"] <= 3.0,
                      "every request after mark-down succeeded": figures["failed_after_marked_down"] == 0,
                      "back in rotation without operator action": figures["restarted_board_served"] > 0}
    return figures


def rolling(fleet: LocalFleet, spec: LoadSpec, root: Path) -> dict[str, Any]:
    package = make_package(root, "gen-next", fleet.private_key)
    with BackgroundLoad(fleet.url, spec) as load:
        wait_for(lambda: len(load.outcomes) > 20, 60)
        record = Rollout(fleet.runtime(), BACKEND, fleet.admins(), alias=ALIAS, package=str(package)).run()
        served = {a.name: a.served() for a in fleet.admins()}
        mark = time.perf_counter()
        wait_for(lambda: len(load.started_after(mark)) >= 100, 120)
    result = load.finish()
    after = load.started_after(mark)
    named = sum(1 for o in after if o.ok and o.board in served and served[o.board] is not None
                and o.fingerprint == f"calculet-g{served[o.board].generation}")  # type: ignore[union-attr]
    figures = {"outcome": record.outcome, "rollout_s": record.duration_s, **result.summary(),
               "requests_after_rollout": len(after), "after_rollout_naming_new_generation": named,
               "steps_per_board_s": {b.name: round(sum(s.duration_s for s in record.steps if s.board == b.name), 2)
                                     for b in record.boards}}
    figures["met"] = {"0 failed or refused": not result.failed and record.ok,
                      "every response after names the new generation": named == len(after) > 0}
    return figures


def failing(fleet: LocalFleet, spec: LoadSpec, root: Path) -> dict[str, Any]:
    for board in BOARDS:
        make_package(root / board, "gen-bad", fleet.private_key, corrupt_golden=board == "board2")
    before = {a.name: a.served() for a in fleet.admins()}
    with BackgroundLoad(fleet.url, spec) as load:
        wait_for(lambda: len(load.outcomes) > 20, 60)
        record = Rollout(fleet.runtime(), BACKEND, fleet.admins(), alias=ALIAS,
                         package=str(root / "{board}" / "gen-bad")).run()
    result = load.finish()
    after = {a.name: a.served() for a in fleet.admins()}
    same = all(after[n] is not None and before[n] is not None and after[n].package_sha256 ==  # type: ignore[union-attr]
               before[n].package_sha256 for n in BOARDS)  # type: ignore[union-attr]
    figures = {"outcome": record.outcome, "failed_board": record.failed_board, "error": (record.error or "")[:160],
               "rolled_back": [b.name for b in record.boards if b.rolled_back],
               "untouched": [b.name for b in record.boards if b.after is None],
               "all_serve_the_old_package": same, "rollout_s": record.duration_s, **result.summary()}
    figures["met"] = {"stopped at board2": record.failed_board == "board2",
                      "board1 rolled back": figures["rolled_back"] == ["board1"],
                      "all three on the old generation": same, "0 failed meanwhile": not result.failed}
    return figures


def agent_versus_leastconn(spec: LoadSpec, workdir: Path) -> dict[str, Any]:
    """A fleet whose boards report their free-lane share by agent-check, then the same fleet with the
    agents disabled and the weights reset (plain leastconn), back to back on the same workload."""
    fleet = LocalFleet(workdir, boards=len(BOARDS), sim_cost="reference", log_level="WARNING", agents=True)
    try:
        fleet.start()
        runtime = fleet.runtime()
        with_agent = drive(fleet.url, spec)
        weights_seen = sorted({s.weight for s in runtime.servers(BACKEND).values()})
        for name in BOARDS:
            runtime.disable_agent(BACKEND, name)
            runtime.set_weight(BACKEND, name, 100)
        plain = drive(fleet.url, spec)
    finally:
        fleet.stop()
    a, p = with_agent.summary(), plain.summary()
    return {"agent_check": a, "leastconn": p, "weights_at_end_of_agent_run": weights_seen,
            "agent_over_leastconn_throughput": round(float(a["requests_per_s"]) / float(p["requests_per_s"]), 3),
            "ttft_p99_agent_minus_leastconn_s": round(float(a["ttft_p99_s"] or 0) - float(p["ttft_p99_s"] or 0), 3)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--requests", type=int, default=600)
    parser.add_argument("--clients", type=int, default=64)
    parser.add_argument("--tokens", type=int, default=8)
    parser.add_argument("--steady-clients", type=int, default=32)
    parser.add_argument("--out", type=Path)
    parser.add_argument("--only-agent", action="store_true", help="only the agent-check vs leastconn comparison")
    args = parser.parse_args(argv)
    spec = LoadSpec(clients=args.clients, requests=args.requests, max_tokens=args.tokens, timeout_s=120.0)
    steady = LoadSpec(clients=args.steady_clients, requests=None, max_tokens=args.tokens, timeout_s=60.0)
    report: dict[str, Any] = {"set_up": {"boards": len(BOARDS), "sim_cost": "reference (40 ms per B1 decode step)",
                                         "balancer": "HAProxy, deploy/haproxy/calculet.cfg.template as shipped",
                                         "requests": args.requests, "clients": args.clients, "tokens": args.tokens,
                                         "steady_clients": args.steady_clients}}
    with tempfile.TemporaryDirectory(prefix="calculet-fleet-bench-") as tmp:
        fleet = LocalFleet(Path(tmp) / "fleet", boards=len(BOARDS), sim_cost="reference", log_level="WARNING")
        started = time.perf_counter()
        try:
            if args.only_agent:
                raise _Skip
            fleet.start()
            report["set_up"]["start_s"] = round(time.perf_counter() - started, 2)
            report["balance"], three = balance(fleet, spec)
            report["scale_out"] = one_board(fleet, spec, three)
            report["kill_9"] = kill_nine(fleet, steady)
            report["rolling_upgrade"] = rolling(fleet, steady, fleet.packages / "bench")
            report["failing_rollout"] = failing(fleet, steady, fleet.packages / "bench-bad")
        except _Skip:
            pass
        finally:
            fleet.stop()
        report["agent_versus_leastconn"] = agent_versus_leastconn(spec, Path(tmp) / "agent-fleet")
    text = json.dumps(report, indent=2)
    print(text)
    if args.out is not None:
        args.out.write_text(text + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
