"""A fleet on one machine: HAProxy (the shipped template) and N simulated boards on loopback.

Why: the fleet tests, ``bench/fleet.py`` and ``calculet fleet local`` need the real set-up — real
``python -m calculet.run`` processes (one per simulated board, spec §3) behind a real HAProxy 2.6 —
started on free 127.0.0.1 ports and stopped by PID, never by name. Each board is configured with a
signed package under a trusted root (so the admin API can load another one, §11 steps 1–2), an
admin token, and the device cost model asked for (``reference``: the §13.1 model's 40 ms B1 step).
"""

from __future__ import annotations

import hashlib
import json
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

import httpx
import yaml

from calculet.adapters.sim.build import build_package as build_sim_package
from calculet.errors import Unavailable
from calculet.fleet.board_admin import BoardAdmin
from calculet.fleet.haproxy_config import BalancerSettings, Board, render
from calculet.fleet.haproxy_runtime import HAProxyRuntime
from calculet.packages import generate_keypair, sign_package

ALIAS = "qwen3"
BACKEND = "calculet"
START_TIMEOUT_S = 90.0


def free_port() -> int:
    """A free TCP port on 127.0.0.1 (bound and released; the caller binds it next)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def haproxy_binary() -> str | None:
    return shutil.which("haproxy") or next((p for p in ("/usr/sbin/haproxy",) if Path(p).exists()), None)


def make_package(root: Path, name: str, private_key: Path, *, corrupt_golden: bool = False) -> Path:
    """A signed simulated package ``root/name``; ``corrupt_golden`` alters one golden vector's
    expected tokens before signing, so the package verifies (§11 steps 1–2) and fails step 9."""
    out = root / name
    build_sim_package(out, variant="current", name=f"tiny-{name}")
    if corrupt_golden:
        manifest_path = out / "manifest.json"
        manifest = json.loads(manifest_path.read_text(encoding="utf-8"))
        first = manifest["golden"][0]
        first["expected_tokens"] = [(t + 1) % 256 for t in first["expected_tokens"]]
        manifest_path.write_text(json.dumps(manifest, indent=2, sort_keys=True) + "\n", encoding="utf-8")
    sign_package(out, private_key)
    return out


@dataclass
class BoardProcess:
    board: Board
    config: Path
    log: Path
    process: subprocess.Popen[bytes] | None = None
    agent: subprocess.Popen[bytes] | None = None

    @property
    def pid(self) -> int | None:
        return self.process.pid if self.process is not None else None


@dataclass
class LocalFleet:
    """HAProxy + ``boards`` calculet processes under ``workdir``; :meth:`start`, then :meth:`stop`."""

    workdir: Path
    boards: int = 3
    sim_cost: str = "reference"
    settings: BalancerSettings | None = None
    drain_deadline_ms: int = 30000
    log_level: str = "INFO"
    agents: bool = False
    """Start an agent-check responder per board (:mod:`calculet.fleet.agent`) and weight by it."""
    admin_token: str = field(default_factory=lambda: secrets.token_hex(16))
    members: list[BoardProcess] = field(default_factory=list)
    haproxy: subprocess.Popen[bytes] | None = None
    _logs: list[IO[bytes]] = field(default_factory=list)

    # ------------------------------------------------------------------ set-up

    def prepare(self) -> None:
        """Keys, the first package, one config per board and the HAProxy configuration."""
        self.workdir.mkdir(parents=True, exist_ok=True)
        pair = generate_keypair(self.workdir / "keys", "fleet")
        self.private_key = pair.private_key_path
        self.packages = self.workdir / "packages"
        make_package(self.packages, "gen-a", self.private_key)
        self.settings = self.settings or BalancerSettings(bind=f"127.0.0.1:{free_port()}",
                                                          admin_socket=str(self.workdir / "haproxy.sock"))
        for index in range(1, self.boards + 1):
            board = Board(f"board{index}", "127.0.0.1", free_port(), free_port() if self.agents else None)
            config = self.workdir / f"{board.name}.yaml"
            config.write_text(yaml.safe_dump(self.board_config(board)), encoding="utf-8")
            self.members.append(BoardProcess(board, config, self.workdir / f"{board.name}.log"))
        (self.workdir / "haproxy.cfg").write_text(render([m.board for m in self.members], self.settings),
                                                  encoding="utf-8")

    def board_config(self, board: Board) -> dict[str, object]:
        """One board's own configuration file: its address, the admin token's hash, the package and trust."""
        return {"schema": "calculet-scheduler/v1", "model_alias": ALIAS,
                "server": {"host": board.host, "port": board.port,
                           "admin_token_sha256": hashlib.sha256(self.admin_token.encode()).hexdigest()},
                "executor": {"drain_deadline_ms": self.drain_deadline_ms},
                "models": [{"alias": ALIAS, "package": str(self.packages / "gen-a")}],
                "trust": {"trusted_roots": [str(self.packages)], "trusted_keys_dir": str(self.workdir / "keys")}}

    def start(self, timeout_s: float = START_TIMEOUT_S) -> None:
        """Every board, then HAProxy; returns once each board is ready and HAProxy sees all UP."""
        if not self.members:
            self.prepare()
        binary = haproxy_binary()
        if binary is None:
            raise Unavailable("haproxy is not installed (make system-tools installs it)")
        for member in self.members:
            self._spawn(member)
        for member in self.members:
            self.wait_ready(member, timeout_s)
            if member.board.agent_port is not None:
                member.agent = subprocess.Popen(
                    [sys.executable, "-m", "calculet.fleet.cli", "agent", "--url", member.board.url,
                     "--port", str(member.board.agent_port)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                    env={**os.environ, "CALCULET_ADMIN_TOKEN": self.admin_token})
        log = open(self.workdir / "haproxy.log", "ab")  # noqa: SIM115 - closed in stop()
        self._logs.append(log)
        self.haproxy = subprocess.Popen([binary, "-f", str(self.workdir / "haproxy.cfg"), "-db"],
                                        stdout=log, stderr=subprocess.STDOUT)
        self.wait_all_up(timeout_s)

    # ------------------------------------------------------------------ boards

    def _spawn(self, member: BoardProcess) -> None:
        log = open(member.log, "ab")  # noqa: SIM115 - closed in stop()
        self._logs.append(log)
        member.process = subprocess.Popen(
            [sys.executable, "-m", "calculet.run", "--config", str(member.config), "--host", member.board.host,
             "--port", str(member.board.port), "--sim-cost", self.sim_cost, "--log-format", "json",
             "--log-level", self.log_level],
            stdout=log, stderr=subprocess.STDOUT, env={**os.environ, "PYTHONUNBUFFERED": "1"})

    def wait_ready(self, member: BoardProcess, timeout_s: float = START_TIMEOUT_S) -> None:
        deadline = time.monotonic() + timeout_s
        admin = self.admin(member.board.name)
        while not admin.ready()[0]:
            if member.process is not None and member.process.poll() is not None:
                raise Unavailable(f"{member.board.name} exited with {member.process.returncode}; see {member.log}")
            if time.monotonic() > deadline:
                raise Unavailable(f"{member.board.name} not ready within {timeout_s:g} s; see {member.log}")
            time.sleep(0.1)

    def wait_all_up(self, timeout_s: float = START_TIMEOUT_S) -> None:
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                if all(s.up for s in self.runtime().servers(BACKEND).values()):
                    return
            except Unavailable:
                pass
            if self.haproxy is not None and self.haproxy.poll() is not None:
                raise Unavailable(f"haproxy exited with {self.haproxy.returncode}; see {self.workdir / 'haproxy.log'}")
            if time.monotonic() > deadline:
                raise Unavailable(f"HAProxy did not see every board UP within {timeout_s:g} s")
            time.sleep(0.1)

    def kill(self, name: str) -> int:
        """``kill -9`` one board (by its PID); returns the PID."""
        member = self.member(name)
        assert member.process is not None
        member.process.send_signal(signal.SIGKILL)
        member.process.wait(10)
        return member.process.pid

    def restart(self, name: str) -> None:
        """Start a board again on its port (it comes back into rotation by HAProxy's checks alone)."""
        member = self.member(name)
        self._spawn(member)

    # ------------------------------------------------------------------ access

    def member(self, name: str) -> BoardProcess:
        return next(m for m in self.members if m.board.name == name)

    @property
    def url(self) -> str:
        assert self.settings is not None
        return f"http://{self.settings.bind}"

    def runtime(self) -> HAProxyRuntime:
        assert self.settings is not None
        return HAProxyRuntime(self.settings.admin_socket)

    def admin(self, name: str) -> BoardAdmin:
        return BoardAdmin(name, self.member(name).board.url, self.admin_token)

    def admins(self) -> list[BoardAdmin]:
        return [self.admin(m.board.name) for m in self.members]

    def pids(self) -> dict[str, int | None]:
        return {**{m.board.name: m.pid for m in self.members},
                "haproxy": self.haproxy.pid if self.haproxy is not None else None}

    def http(self, timeout_s: float = 30.0) -> httpx.Client:
        return httpx.Client(base_url=self.url, timeout=timeout_s)

    # ------------------------------------------------------------------ tear-down

    def stop(self, timeout_s: float = 20.0) -> None:
        """SIGTERM to HAProxy and every board by PID (each drains, §12); SIGKILL what is left."""
        processes = [p for p in [self.haproxy, *(m.process for m in self.members), *(m.agent for m in self.members)]
                     if p is not None]
        for process in processes:
            if process.poll() is None:
                process.send_signal(signal.SIGTERM)
        for process in processes:
            try:
                process.wait(timeout_s)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait(5)
        for log in self._logs:
            log.close()
        self._logs.clear()


__all__ = ["ALIAS", "BACKEND", "BoardProcess", "LocalFleet", "free_port", "haproxy_binary", "make_package"]
