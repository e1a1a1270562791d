"""Many boards: one calculet process per board behind HAProxy, and model upgrades rolled across them.

Why this package exists: CalRT 0.7.6 drives one physical device per process, so "multi-board
deployment uses one process bound to one board, plus load balancing at the upper layer" (spec §3,
§13.1, capability C4 in §1); and a model replacement on one board is never zero-downtime because
``configure`` is whole-device state (§11, R11.16), so an upgrade without refused traffic rolls
across boards — blue-green one board at a time (§10–§12). The balancer is HAProxy (an existing,
well-kept one), never a balancer of our own; this package only *drives* it:

* :mod:`~calculet.fleet.haproxy_config` renders ``deploy/haproxy/calculet.cfg.template``;
* :mod:`~calculet.fleet.haproxy_runtime` speaks HAProxy's runtime API (the admin socket);
* :mod:`~calculet.fleet.board_admin` speaks calculet's admin API to one board;
* :mod:`~calculet.fleet.rollout` rolls a package across the boards (drain → idle → load and
  golden-check → ready, and rolls the changed boards back when a step fails), with its record;
* :mod:`~calculet.fleet.progress` shows a rollout on the terminal with ``rich``;
* :mod:`~calculet.fleet.local` starts HAProxy and N simulated boards on loopback (tests, bench);
* :mod:`~calculet.fleet.load` drives streaming load through the balancer and records outcomes;
* :mod:`~calculet.fleet.cli` is ``calculet fleet …``.
"""
