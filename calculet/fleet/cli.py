"""``calculet fleet …``: the HAProxy configuration, a rolling upgrade, the boards' state, one board's
drain (a Kubernetes preStop) and reload (systemd ExecReload), an agent-check responder, a local fleet.

Why: what an operator of several boards types (spec §3: one process per board behind a balancer;
§10–§12: an upgrade rolled board by board). The boards are read from HAProxy itself (``show servers
state``: each server's address is its calculet, whose admin API is on the same port) unless
``--board NAME=URL`` says otherwise. Exit codes: 0 done, 1 the rollout stopped (the record says
what was rolled back), 2 bad usage or an unreachable balancer.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import time
from collections.abc import Sequence
from pathlib import Path

from rich.console import Console
from rich.table import Table

from calculet.errors import BadRequest, CalculetError
from calculet.fleet.board_admin import BoardAdmin
from calculet.fleet.haproxy_config import BalancerSettings, parse_board, render
from calculet.fleet.haproxy_runtime import HAProxyRuntime
from calculet.fleet.progress import ConsoleProgress
from calculet.fleet.rollout import Rollout, RolloutOptions

TOKEN_ENV = "CALCULET_ADMIN_TOKEN"


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="calculet fleet", description="Many boards behind HAProxy (§3, §10–§12).")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    config = sub.add_parser("haproxy-config", help="render deploy/haproxy/calculet.cfg.template for the boards")
    config.add_argument("--board", action="append", required=True, metavar="[NAME=]HOST:PORT")
    config.add_argument("--bind", default=BalancerSettings.bind)
    config.add_argument("--admin-socket", default=BalancerSettings.admin_socket)
    config.add_argument("--backend", default=BalancerSettings.backend)
    config.add_argument("--check-inter", default=BalancerSettings.check_inter)
    config.add_argument("--template", type=Path, help="another template (default: the shipped one)")
    config.add_argument("--out", type=Path, help="write here (default: stdout)")
    for name, helptext in (("rollout", "roll a package across the boards, one at a time"),
                           ("status", "what HAProxy and each board report now")):
        cmd = sub.add_parser(name, help=helptext)
        cmd.add_argument("--haproxy-socket", required=True, type=Path, help="HAProxy's admin socket (level admin)")
        cmd.add_argument("--backend", default=BalancerSettings.backend)
        cmd.add_argument("--board", action="append", default=[], metavar="NAME=URL",
                         help="a board's calculet URL (default: each server's address in HAProxy)")
        cmd.add_argument("--admin-token-file", type=Path, help=f"the admin token (default: ${TOKEN_ENV})")
    rollout = sub.choices["rollout"]
    rollout.add_argument("--package", required=True, help="the signed package, as the boards see its path (§11); "
                         "'{board}' in it becomes each board's name (one package store per board)")
    rollout.add_argument("--alias", default="qwen3")
    rollout.add_argument("--record", type=Path, help="write the JSON record of the rollout here")
    rollout.add_argument("--no-rollback", action="store_true", help="on a failure, leave changed boards as they are")
    rollout.add_argument("--drain-timeout", type=float, default=RolloutOptions.drain_timeout_s, metavar="SECONDS")
    drain = sub.add_parser("drain", help="drain one board through its admin API and wait until idle (preStop)")
    drain.add_argument("--url", default="http://127.0.0.1:8000", help="the board's calculet")
    drain.add_argument("--alias", default="qwen3")
    drain.add_argument("--timeout", type=float, default=140.0, metavar="SECONDS")
    drain.add_argument("--admin-token-file", type=Path, help=f"the admin token (default: ${TOKEN_ENV})")
    reload = sub.add_parser("reload", help="load a board's configured package again (systemctl reload)")
    reload.add_argument("--config", type=Path, required=True, help="the board's calculet-scheduler/v1 file")
    reload.add_argument("--admin-token-file", type=Path, help=f"the admin token (default: ${TOKEN_ENV})")
    agent = sub.add_parser("agent", help="answer HAProxy's agent-check with one board's free-lane share")
    agent.add_argument("--url", default="http://127.0.0.1:8000", help="the board's calculet")
    agent.add_argument("--host", default="127.0.0.1")
    agent.add_argument("--port", type=int, required=True)
    agent.add_argument("--admin-token-file", type=Path, help=f"the admin token (default: ${TOKEN_ENV})")
    local = sub.add_parser("local", help="HAProxy and N simulated boards on 127.0.0.1 until Ctrl-C")
    local.add_argument("--boards", type=int, default=3)
    local.add_argument("--sim-cost", choices=("tiny", "reference", "instant"), default="reference")
    local.add_argument("--workdir", type=Path, required=True)
    return parser


def _token(args: argparse.Namespace) -> str:
    if args.admin_token_file is not None:
        return args.admin_token_file.read_text(encoding="utf-8").strip()
    token = os.environ.get(TOKEN_ENV, "")
    if not token:
        raise BadRequest(f"give --admin-token-file or set {TOKEN_ENV}")
    return token


def _boards(args: argparse.Namespace, haproxy: HAProxyRuntime) -> list[BoardAdmin]:
    token = _token(args)
    given = dict(b.split("=", 1) for b in args.board if "=" in b)
    if len(given) != len(args.board):
        raise BadRequest("--board NAME=URL")
    addresses = haproxy.addresses(args.backend)
    unknown = sorted(set(given) - set(addresses))
    if unknown:
        raise BadRequest(f"backend {args.backend!r} has no server {', '.join(unknown)}")
    return [BoardAdmin(name, given.get(name, f"http://{address}"), token) for name, address in addresses.items()]


def _cmd_haproxy_config(args: argparse.Namespace) -> int:
    boards = [parse_board(text, i) for i, text in enumerate(args.board, 1)]
    settings = BalancerSettings(bind=args.bind, admin_socket=args.admin_socket, backend=args.backend,
                                check_inter=args.check_inter)
    text = render(boards, settings, template=args.template.read_text(encoding="utf-8") if args.template else None)
    if args.out is None:
        sys.stdout.write(text)
    else:
        args.out.write_text(text, encoding="utf-8")
    return 0


def _cmd_rollout(args: argparse.Namespace) -> int:
    haproxy = HAProxyRuntime(args.haproxy_socket)
    progress = ConsoleProgress()
    options = RolloutOptions(drain_timeout_s=args.drain_timeout, rollback=not args.no_rollback)
    rollout = Rollout(haproxy, args.backend, _boards(args, haproxy), alias=args.alias, package=args.package,
                      options=options, observer=progress)
    record = rollout.run()
    progress.summary(record)
    if args.record is not None:
        record.write(args.record)
        progress.console.print(f"record: {args.record}")
    return 0 if record.ok else 1


def _cmd_status(args: argparse.Namespace) -> int:
    haproxy = HAProxyRuntime(args.haproxy_socket)
    stats = haproxy.servers(args.backend)
    table = Table(title=f"backend {args.backend}")
    for column in ("board", "HAProxy", "connections", "requests", "ready", "serves"):
        table.add_column(column)
    for board in _boards(args, haproxy):
        stat = stats[board.name]
        ready, detail = board.ready()
        served = board.served() if ready else None
        table.add_row(board.name, stat.status, str(stat.current_sessions), str(stat.total_sessions),
                      "yes" if ready else f"no ({detail})",
                      f"g{served.generation} {served.package_sha256[:12]}" if served else "-")
    Console().print(table)
    return 0


def _cmd_drain(args: argparse.Namespace) -> int:
    board = BoardAdmin("board", args.url, _token(args))
    board.drain(args.alias)
    deadline = time.monotonic() + args.timeout
    while (busy := board.busy()) > 0:
        if time.monotonic() > deadline:
            print(f"calculet fleet drain: {busy} request(s)/job(s) still active after {args.timeout:g} s",
                  file=sys.stderr)
            return 1
        time.sleep(0.5)
    print(f"drained {args.url}: no active request")
    return 0


def _cmd_reload(args: argparse.Namespace) -> int:
    from calculet.config import load_config

    config = load_config(args.config)
    served = next((m for m in config.models if m.alias == config.model_alias), None)
    if served is None:
        raise BadRequest(f"{args.config}: models[] does not name the alias {config.model_alias!r}")
    host = "127.0.0.1" if config.server.host in ("0.0.0.0", "::") else config.server.host
    board = BoardAdmin("board", f"http://{host}:{config.server.port}", _token(args))
    result = board.load(config.model_alias, str(served.package))
    report = result.get("report") or {}
    print(f"reloaded {served.package}: generation {result.get('generation')} {result.get('state')}, "
          f"golden {report.get('golden')}, downtime {report.get('downtime_s')} s")
    return 0


def _cmd_agent(args: argparse.Namespace) -> int:
    import asyncio

    from calculet.fleet.agent import CapacityProbe, serve_agent

    probe = CapacityProbe(BoardAdmin("board", args.url, _token(args)))
    try:
        asyncio.run(serve_agent(probe, args.host, args.port))
    except KeyboardInterrupt:
        pass
    return 0


def _cmd_local(args: argparse.Namespace) -> int:
    from calculet.fleet.local import LocalFleet

    # SIGTERM (a supervisor, `kill PID`) stops the fleet as Ctrl-C does: without this the process died and left
    # HAProxy and every board running. SIGINT gets Python's handler back even when a shell started us in the
    # background with SIGINT ignored.
    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.signal(signal.SIGTERM, signal.default_int_handler)
    fleet = LocalFleet(args.workdir, boards=args.boards, sim_cost=args.sim_cost)
    try:  # a signal during the start stops what had started too
        fleet.start()
        console = Console()
        console.print(f"HAProxy on {fleet.url}; admin socket {fleet.runtime().socket_path}; boards "
                      + ", ".join(f"{m.board.name}={m.board.url} (pid {m.pid})" for m in fleet.members))
        console.print(f"admin token: {fleet.admin_token}   packages: {fleet.packages}   Ctrl-C stops everything")
        while True:
            time.sleep(3600)
    except KeyboardInterrupt:
        pass
    finally:
        signal.signal(signal.SIGINT, signal.SIG_IGN)  # a second signal must not cut the stop short
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        fleet.stop()
    return 0


_COMMANDS = {"haproxy-config": _cmd_haproxy_config, "rollout": _cmd_rollout, "status": _cmd_status,
             "drain": _cmd_drain, "reload": _cmd_reload, "agent": _cmd_agent, "local": _cmd_local}


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return _COMMANDS[args.command](args)
    except (CalculetError, OSError) as exc:
        print(f"calculet fleet {args.command}: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
