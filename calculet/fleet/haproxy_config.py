"""Render the shipped HAProxy configuration for N boards (DESIGN "Scaling out", spec §3).

Why: the template in ``deploy/haproxy/`` is the one configuration users run and the tests and
``bench/fleet.py`` measure; rendering it here (not writing a second configuration in a test) keeps
what is measured and what ships the same file. Placeholders are ``${name}`` (:class:`string.Template`);
``${servers}`` becomes one ``server`` line per board.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from string import Template

from calculet.errors import BadRequest

TEMPLATE_NAME = "calculet.cfg.template"
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,62}$")


def default_template() -> Path:
    """``deploy/haproxy/calculet.cfg.template`` of the source tree this package runs from."""
    return Path(__file__).resolve().parents[2] / "deploy" / "haproxy" / TEMPLATE_NAME


@dataclass(frozen=True)
class Board:
    """One board: one calculet process, named as HAProxy's ``server`` (and ``X-Calculet-Board``)."""

    name: str
    host: str
    port: int
    agent_port: int | None = None
    """Where this board's agent-check responder listens (:mod:`calculet.fleet.agent`); None: no agent."""

    @property
    def address(self) -> str:
        return f"{self.host}:{self.port}"

    @property
    def url(self) -> str:
        return f"http://{self.address}"


@dataclass(frozen=True)
class BalancerSettings:
    """The template's knobs; the defaults are the shipped ones."""

    bind: str = "127.0.0.1:8080"
    admin_socket: str = "/run/haproxy/calculet.sock"
    backend: str = "calculet"
    check_inter: str = "1s"
    check_fall: int = 2
    check_rise: int = 2
    stream_timeout: str = "10m"
    maxconn: int = 4096


def parse_board(text: str, index: int) -> Board:
    """``[NAME=]HOST:PORT`` → a board (named ``board<index>`` when no name is given)."""
    name, sep, address = text.rpartition("=")
    host, colon, port = (address if sep else text).rpartition(":")
    if not colon or not port.isdigit() or not host:
        raise BadRequest(f"board {text!r}: expected [NAME=]HOST:PORT", field="board")
    board = Board(name if sep else f"board{index}", host, int(port))
    if not _NAME.match(board.name):
        raise BadRequest(f"board name {board.name!r}: letters, digits, '.', '_' and '-' only", field="board")
    return board


def render(boards: Sequence[Board], settings: BalancerSettings = BalancerSettings(), *,
           template: str | None = None) -> str:
    """The HAProxy configuration for ``boards`` (the shipped template unless ``template`` is given)."""
    if not boards:
        raise BadRequest("at least one board is needed", field="board")
    if len({b.name for b in boards}) != len(boards):
        raise BadRequest("board names must be unique", field="board")
    text = template if template is not None else default_template().read_text(encoding="utf-8")
    servers = "\n".join(f"    server {b.name} {b.address}" + (
        f" agent-check agent-addr {b.host} agent-port {b.agent_port} agent-inter {settings.check_inter}"
        if b.agent_port is not None else "") for b in boards)
    values = {"bind": settings.bind, "admin_socket": settings.admin_socket, "backend": settings.backend,
              "check_inter": settings.check_inter, "check_fall": settings.check_fall,
              "check_rise": settings.check_rise, "stream_timeout": settings.stream_timeout,
              "maxconn": settings.maxconn, "servers": servers}
    return Template(text).substitute(values)


__all__ = ["BalancerSettings", "Board", "TEMPLATE_NAME", "default_template", "parse_board", "render"]
