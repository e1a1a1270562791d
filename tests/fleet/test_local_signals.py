"""``calculet fleet local`` stopped by SIGTERM stops what it started.

A supervisor or ``kill PID`` sends SIGTERM, not Ctrl-C. Before, the command died on it and left HAProxy and every
board running on their ports (found by following the README, session 17). The mutant this catches: the SIGTERM
handler removed from ``_cmd_local`` (checked: the board and HAProxy outlive the command).
"""

from __future__ import annotations

import os
import queue
import signal
import subprocess
import sys
import threading
from pathlib import Path

from tests.fleet.conftest import require_haproxy

START_S = 180.0


def _descendants(pid: int) -> set[int]:
    """Every live process below ``pid`` (from /proc: this test runs on Linux, as the fleet does)."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            fields = Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        children.setdefault(int(fields[1]), []).append(int(entry))
    found, todo = set(), [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            found.add(child)
            todo.append(child)
    return found


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def test_sigterm_stops_haproxy_and_every_board(tmp_path: Path) -> None:
    require_haproxy()
    command = subprocess.Popen(
        [sys.executable, "-m", "calculet.fleet.cli", "local", "--boards", "1", "--sim-cost", "instant",
         "--workdir", str(tmp_path / "fleet")],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env={**os.environ, "PYTHONUNBUFFERED": "1"})
    lines: queue.Queue[str] = queue.Queue()
    threading.Thread(target=lambda: [lines.put(line) for line in command.stdout or ()], daemon=True).start()
    started: set[int] = set()
    try:
        while True:
            line = lines.get(timeout=START_S)
            if line.startswith("HAProxy on"):
                break
        started = _descendants(command.pid)
        assert len(started) >= 2, f"a board and HAProxy under the command: {started}"
        command.send_signal(signal.SIGTERM)
        assert command.wait(60) == 0
        left = {pid for pid in started if _alive(pid)}
        assert not left, f"still running after the command's SIGTERM: {left}"
    finally:
        if command.poll() is None:
            command.kill()
            command.wait(10)
        for pid in started | _descendants(command.pid):
            if _alive(pid):
                os.kill(pid, signal.SIGKILL)
