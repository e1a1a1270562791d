"""HAProxy's runtime API over its admin socket: drain, ready, and what each board is doing.

Why: a rolling upgrade takes one board out of rotation *through the balancer* — HAProxy's
``set server <backend>/<server> state drain`` stops new requests while open streams finish (§12
drain at the fleet level) — and must know when the board has no connection left (``scur``) and
when HAProxy's checks see it up again. The runtime API is a line protocol on a UNIX socket
(``stats socket … level admin`` in the shipped configuration): one command per connection.
"""

from __future__ import annotations

import csv
import io
import socket
from dataclasses import dataclass
from pathlib import Path

from calculet.errors import BadRequest, Unavailable

STATES = ("ready", "drain", "maint")


@dataclass(frozen=True)
class ServerStat:
    """One server line of ``show stat``: HAProxy's view of one board."""

    name: str
    status: str
    """``UP``, ``DOWN``, ``DRAIN``, ``MAINT``, ``UP 1/2`` (going down), ``DOWN 1/2`` (coming up), ``no check``."""
    current_sessions: int
    total_sessions: int
    weight: int

    @property
    def up(self) -> bool:
        return self.status == "UP"


class HAProxyRuntime:
    """A client of HAProxy's runtime API on ``socket_path`` (level admin)."""

    def __init__(self, socket_path: str | Path, *, timeout_s: float = 5.0) -> None:
        self.socket_path = str(socket_path)
        self.timeout_s = timeout_s

    def command(self, line: str) -> str:
        """Send one command, return HAProxy's whole answer."""
        if "\n" in line or ";" in line:
            raise BadRequest(f"one runtime API command at a time, got {line!r}")
        try:
            with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
                sock.settimeout(self.timeout_s)
                sock.connect(self.socket_path)
                sock.sendall(line.encode() + b"\n")
                chunks = []
                while chunk := sock.recv(65536):
                    chunks.append(chunk)
        except OSError as exc:
            raise Unavailable(f"HAProxy runtime API at {self.socket_path}: {exc}") from None
        return b"".join(chunks).decode("utf-8", "replace")

    def set_state(self, backend: str, server: str, state: str) -> None:
        """``ready``, ``drain`` (no new requests; open ones go on) or ``maint``."""
        if state not in STATES:
            raise BadRequest(f"state {state!r}: one of {', '.join(STATES)}")
        answer = self.command(f"set server {backend}/{server} state {state}").strip()
        if answer:  # HAProxy answers nothing on success
            raise Unavailable(f"HAProxy refused 'set server {backend}/{server} state {state}': {answer}")

    def set_weight(self, backend: str, server: str, weight: int) -> None:
        answer = self.command(f"set weight {backend}/{server} {int(weight)}").strip()
        if answer:
            raise Unavailable(f"HAProxy refused 'set weight {backend}/{server} {weight}': {answer}")

    def disable_agent(self, backend: str, server: str) -> None:
        """Stop the agent check of one server (its weight stays where the agent left it)."""
        answer = self.command(f"disable agent {backend}/{server}").strip()
        if answer:
            raise Unavailable(f"HAProxy refused 'disable agent {backend}/{server}': {answer}")

    def servers(self, backend: str) -> dict[str, ServerStat]:
        """Every server of ``backend`` as ``show stat`` reports it now."""
        text = self.command("show stat").lstrip("# ")
        found: dict[str, ServerStat] = {}
        for row in csv.DictReader(io.StringIO(text)):
            if row.get("pxname") != backend or row.get("svname") in ("FRONTEND", "BACKEND", None):
                continue
            found[row["svname"]] = ServerStat(name=row["svname"], status=row.get("status", ""),
                                              current_sessions=int(row.get("scur") or 0),
                                              total_sessions=int(row.get("stot") or 0),
                                              weight=int(row.get("weight") or 0))
        if not found:
            raise Unavailable(f"HAProxy has no backend {backend!r} with servers")
        return found

    def addresses(self, backend: str) -> dict[str, str]:
        """Server name → ``host:port`` for ``backend`` (``show servers state``), in configuration order."""
        lines = self.command(f"show servers state {backend}").splitlines()
        header = next((line[2:].split() for line in lines if line.startswith("# ")), None)
        if header is None:
            raise Unavailable(f"HAProxy has no backend {backend!r}")
        found: dict[str, str] = {}
        for line in lines:
            fields = line.split()
            if line.startswith("#") or len(fields) < len(header):
                continue
            row = dict(zip(header, fields))
            found[row["srv_name"]] = f"{row['srv_addr']}:{row['srv_port']}"
        return found

    def server(self, backend: str, name: str) -> ServerStat:
        servers = self.servers(backend)
        if name not in servers:
            raise BadRequest(f"backend {backend!r} has no server {name!r} (it has {', '.join(sorted(servers))})")
        return servers[name]


__all__ = ["HAProxyRuntime", "STATES", "ServerStat"]
