"""``python -m calculet.run``: serve calculet over HTTP (OpenAI-compatible API, admin API, /metrics).

::

    python -m calculet.run [--config FILE] [--device NAME] [--host 127.0.0.1] [--port 8000] [--log-format json|text]
                           [--log-level INFO] [--sim-cost tiny|reference|instant|null] [--switch-interval-ms 1]

With no arguments: the simulated NPU in real time, the bundled tiny model package built and
signed with this machine's development key at start-up, the default configuration (§15) with
``models``/``trust`` naming that package and key (so §11 steps 1–2 really verify it), on
127.0.0.1:8000. The engine starts through its model manager either way, and the admin API's
load/unload/drain/rollback drive that manager
(:class:`~calculet.server.model_admin.ManagedModelAdmin`). ``--host``/``--port`` override
``server.host``/``server.port``; ``--port 0`` picks a free port (the ``listening`` log line names it).

Start-up stops with exit code 2 and a message naming the field when the configuration is
invalid (``queues.decode_weight: must be > 0``), when it asks for what the package cannot do
(a B8 profile of a B1 calbin, R15.19), or when the package fails its trust checks (§11).

SIGTERM / SIGINT: admission stops at once (new requests 503, ``/health/ready`` 503), accepted
requests run on until ``executor.drain_deadline_ms``, what is left is then cancelled (jobs on
the device still drain), the device is released and the process exits 0 (§12).
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import logging
import os
import signal
import socket
import sys
from collections.abc import Iterator, Sequence
from types import FrameType
from typing import TYPE_CHECKING, Any

from calculet.adapters.sim import CostModel, SimConfig, TimeMode
from calculet.config import SchedulerConfig, default_config, load_config
from calculet.errors import CalculetError, ConfigError
from calculet.runtime.engine.types import EngineOptions

if TYPE_CHECKING:
    from calculet.server.bringup import BroughtUp

log = logging.getLogger("calculet.run")

COSTS = {"tiny": CostModel.tiny, "reference": CostModel.reference, "instant": CostModel.instant,
         "null": CostModel.null}
SHUTDOWN_MARGIN_S = 5.0
"""Extra time the HTTP server waits for streams after the drain deadline (they end by then)."""
SWITCH_INTERVAL_MS = 1.0
"""The interpreter's thread switch interval while serving (CPython's default: 5 ms), issues #13 and #20.

Why: the event-loop thread that answers HTTP shares the interpreter lock with the engine's actor,
the device's completion thread and (on the simulated NPU) the device worker. The loop gives the lock
up at every socket send, log write and wake-up, and when a busy thread has taken it meanwhile, gets it
back only once that thread is asked to drop it — after the switch interval (a wall-clock profile of
the loop during a 300-request burst at 5 ms: 2.2 ms per log line written, 1 ms per socket send,
against under 0.1 ms of CPU for either). A longer interval costs the loop that wait and saves the busy
threads their forced hand-overs: the trade-off is the time to 429 (#13) against CPU per token (#20).

Decided again on 2026-12-03 with the ``--switch-ms`` option of both benchmarks, each interval a server of
its own, the intervals interleaved (load average 3-8 on this 2-core machine from other work in runs 1-2,
1.3-1.7 in run 3). ``bench/host_path.py`` (null device, 64-token streams, ratios per round, medians of 3-4
rounds), 5 ms over 1 ms: at 16 streams CPU per token 0.76x, 0.76x, 0.91x in three runs (93-123 against
121-134 us; CPU ratio to the bare server 3.4-5.0 against 4.4-6.3) and completions/s 1.46x, 1.34x, 1.11x;
at 64 streams CPU 0.84-0.95x, completions/s 0.90-1.16x; at 1 stream no difference (0.94-0.98x); 2 ms lay
between, 10 ms no better than 5. No interval meets #20's CPU ratio <= 3; every one keeps completions/s
>= 1/3 of the bare server's. ``bench/overload_http.py --part burst --orders on_time`` (300 concurrent,
B1 reference cost), time to 429 P99 per run: one body for all 33, 33, 33, 34, 51 ms at 1 ms against 28,
30, 36, 43, 54 ms at 5 ms; a prompt per client (``--distinct``) 39, 41, 47, 49, 52, 53, 56 ms at 1 ms
against 39, 51, 51, 67, 88, 94, 108 ms at 5 ms (the last two at load 1.3: not the machine's noise), and
62, 88, 90 ms at 2 ms; retries admitted 99-100 % at every interval. 1 ms kept: what 5 ms saves in CPU
(a quarter at 16 streams on a loaded machine, a tenth on a quiet one) does not reach #20's target,
while with a prompt per client it put #13's 50 ms out of reach in 6 of 7 runs (1 ms: 3 of 7). The
2026-12-02 figures at load 15-17 (completions/s 0.52 at 1 ms against 0.38 at 5 ms) did not hold here.
``--switch-interval-ms`` (or the environment's ``CALCULET_SWITCH_INTERVAL_MS``, which benchmarks that
start the service use; ``--switch-ms`` of both benchmarks runs several in one run) sets it."""


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m calculet.run",
                                     description="Serve calculet: OpenAI-compatible API, admin API, /metrics.")
    parser.add_argument("--config", metavar="FILE", help="calculet-scheduler/v1 YAML (default: the §15 defaults)")
    parser.add_argument("--host", default=None, help="listen address (default: server.host, 127.0.0.1)")
    parser.add_argument("--port", type=int, default=None, help="port (default: server.port, 8000; 0 = any free)")
    parser.add_argument("--log-format", choices=("json", "text"), default="text")
    parser.add_argument("--device", metavar="NAME", default=None,
                        help="device plug-in (entry-point group calculet.devices; default: device.name, 'sim')")
    parser.add_argument("--log-level", default="INFO", choices=("DEBUG", "INFO", "WARNING", "ERROR"))
    parser.add_argument("--sim-cost", choices=tuple(COSTS), default="tiny",
                        help="latency cost model of the simulated NPU (tiny: ms-scale; reference: the §13.1 "
                             "model's assumed shape, 40 ms per B1 step; instant: zero device time; null: zero "
                             "device time and no numerics, the host alone)")
    parser.add_argument("--switch-interval-ms", type=float,
                        default=float(os.environ.get("CALCULET_SWITCH_INTERVAL_MS", SWITCH_INTERVAL_MS)),
                        help="the interpreter's thread switch interval while serving (default 1 ms; CPython's own: "
                             "5 ms): how long the HTTP event loop may wait for the lock a busy engine thread holds; "
                             "longer saves CPU per streamed token and lengthens the time to 429 in a burst")
    return parser


def _load(path: str | None) -> SchedulerConfig:
    return load_config(path) if path else default_config()


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if not args.switch_interval_ms > 0:
        print(f"calculet: --switch-interval-ms must be > 0, not {args.switch_interval_ms:g}", file=sys.stderr)
        return 2
    from calculet.server.logs import configure_logging

    configure_logging(args.log_format, args.log_level)
    try:
        config = _load(args.config)
    except ConfigError as exc:
        print(f"calculet: invalid configuration, not starting:\n{exc}", file=sys.stderr)
        return 2
    host = args.host or config.server.host
    port = args.port if args.port is not None else config.server.port

    from calculet.server.bringup import bring_up

    try:
        cost = COSTS[args.sim_cost]()
        # the null device computes no logits, so §11 step 9's golden vectors cannot be checked on it
        brought = bring_up(config, device=args.device, sim=SimConfig(time_mode=TimeMode.REAL, cost=cost),
                           options=EngineOptions(verify_golden=cost.numerics))
    except ConfigError as exc:
        print(f"calculet: the configuration does not fit the package or device, not starting:\n{exc}",
              file=sys.stderr)
        return 2
    except CalculetError as exc:
        print(f"calculet: bring-up failed, not starting: {exc}", file=sys.stderr)
        return 2
    try:
        sock = _listen(host, port)
    except OSError as exc:
        brought.engine.stop(0)
        brought.close()
        print(f"calculet: cannot listen on {host}:{port}: {exc}", file=sys.stderr)
        return 2
    _serve(brought, sock, host, args.switch_interval_ms / 1000)
    return 0


LISTEN_BACKLOG = 2048
"""uvicorn's own default backlog."""


def _listen(host: str, port: int) -> socket.socket:
    """A TCP socket that already listens, for uvicorn (``port`` 0: any free port).

    It listens before the ``listening`` log line is written: a client that connects on that line
    is queued by the kernel until uvicorn accepts, never refused (issue #14: with ``bind`` alone,
    the socket listened only once uvicorn's loop started serving)."""
    # proto=IPPROTO_TCP: asyncio sets TCP_NODELAY only on sockets that say they are TCP; without
    # it a response written in two parts waits ~40 ms for a delayed ACK (Nagle).
    sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM,
                         socket.IPPROTO_TCP)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, port))
    sock.listen(LISTEN_BACKLOG)
    return sock


@contextlib.contextmanager
def switch_interval(seconds: float) -> Iterator[None]:
    """The interpreter's thread switch interval set to ``seconds`` inside, the previous one restored after
    (:data:`SWITCH_INTERVAL_MS`: the event loop's wait for the lock a busy engine thread holds)."""
    previous = sys.getswitchinterval()
    sys.setswitchinterval(seconds)
    try:
        yield
    finally:
        sys.setswitchinterval(previous)


def _serve(brought: BroughtUp, sock: socket.socket, host: str, switch_interval_s: float) -> None:
    """Serve until a signal, then drain (§12) and release the device; the interpreter switches threads every
    ``switch_interval_s`` meanwhile (:data:`SWITCH_INTERVAL_MS`) and as before once serving ends."""
    import uvicorn

    from calculet.server.app import create_app
    from calculet.server.http_server import uvicorn_config
    from calculet.server.service import Service, ServiceOptions

    config = brought.config
    drain_s = config.executor.drain_deadline_ms / 1000
    offered = brought.offered()  # #18: above C3 only with a passing conformance report for this device and package
    service = Service(brought.config, brought.engine,
                      options=ServiceOptions(device_label=brought.device_label, capabilities=offered.capabilities,
                                             profile_tiers=offered.profiles))  # admin API: the ModelManager
    service.start()
    app = create_app(service)

    class Server(uvicorn.Server):
        """uvicorn, plus: a signal first stops admission and starts the engine's drain (§12)."""

        def handle_exit(self, sig: int, frame: FrameType | None) -> None:
            service.begin_shutdown()
            super().handle_exit(sig, frame)

    def after_serving(sig: int, frame: FrameType | None) -> None:
        # uvicorn re-raises the signal it caught once it has stopped; by then we exit on our own.
        service.begin_shutdown()

    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, after_serving)
    server = Server(uvicorn_config(app, config.server, timeout_graceful_shutdown=int(drain_s + SHUTDOWN_MARGIN_S)))
    bound: Any = sock.getsockname()
    log.info("listening", extra={"url": f"http://{host}:{bound[1]}", "host": host, "port": bound[1],
                                 "model_alias": config.model_alias, "bundled_model": brought.bundled,
                                 "drain_deadline_s": drain_s})
    # the heap built so far (model, tokenizer, schemas, the app: ~120 000 objects) lives as long as the process:
    # out of the collector's walks, a generation-2 collection during a 300-request burst took 115 ms of the
    # event loop's thread instead of walking it all (issue #13, time to 429)
    gc.freeze()
    try:
        with switch_interval(switch_interval_s):
            server.run(sockets=[sock])
    finally:
        stopped = service.stop(wait_s=drain_s + SHUTDOWN_MARGIN_S * 2)
        brought.close()
        final = service.lifecycle.final
        log.info("stopped", extra={"clean": stopped, "finished": final.finished if final else None})


if __name__ == "__main__":
    sys.exit(main())
