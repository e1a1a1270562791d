"""``python -m calculet.run``: start-up refusals name the field; SIGTERM drains and exits 0.

The signal test runs the real entry point as a subprocess on 127.0.0.1 with ``--port 0``; it
learns the port from the ``listening`` log line and drives it over HTTP. Every wait is for an
event on a pipe or socket (a log line, a chunk, the process exit), each bounded by a timeout.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import threading
from pathlib import Path
from queue import Empty, Queue
from typing import Any

import httpx
import pytest

from calculet import run

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.req("R15.1", "R15.19")
@pytest.mark.usefixtures("restore_logging")
def test_an_invalid_config_stops_start_up_naming_the_field(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                           capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv("CALCULET_HOME", str(tmp_path / "home"))
    bad = tmp_path / "bad.yaml"
    bad.write_text("schema: calculet-scheduler/v1\nqueues:\n  decode_weight: 0\n")
    assert run.main(["--config", str(bad), "--port", "0"]) == 2
    assert "queues.decode_weight" in capsys.readouterr().err
    b8 = tmp_path / "b8.yaml"
    b8.write_text("schema: calculet-scheduler/v1\nbatch:\n  profiles: [1, 8]\n")
    assert run.main(["--config", str(b8), "--port", "0"]) == 2
    err = capsys.readouterr().err
    assert "batch.profiles" in err and "B8" in err
    assert run.main(["--config", str(tmp_path / "missing.yaml")]) == 2
    assert "not found" in capsys.readouterr().err


def test_the_socket_listens_before_the_listening_line() -> None:
    """Issue #14: ``_listen`` only bound the socket, which listened once uvicorn's loop served it, so a client
    that connected on the ``listening`` line could be refused. The socket it returns accepts connections at once
    (the kernel queues them until uvicorn accepts)."""
    sock = run._listen("127.0.0.1", 0)
    try:
        port = sock.getsockname()[1]
        with socket.create_connection(("127.0.0.1", port), timeout=10):
            pass  # refused (ConnectionRefusedError) if the socket did not listen
    finally:
        sock.close()


class _Lines:
    """The subprocess's stderr, one JSON log record at a time (read by a thread into a queue)."""

    def __init__(self, stream: Any) -> None:
        self.queue: Queue[str] = Queue()
        self.seen: list[str] = []
        threading.Thread(target=self._pump, args=(stream,), daemon=True).start()

    def _pump(self, stream: Any) -> None:
        for line in stream:
            self.queue.put(line)

    def until(self, msg: str, timeout: float = 60.0) -> dict[str, Any]:
        while True:
            try:
                line = self.queue.get(timeout=timeout)  # allowed: bounded wait for the server's next log line
            except Empty:
                raise AssertionError(f"no {msg!r} log line; got:\n{''.join(self.seen)}") from None
            self.seen.append(line)
            try:
                record = json.loads(line)
            except json.JSONDecodeError:
                continue
            if record.get("msg") == msg:
                return record  # type: ignore[no-any-return]


@pytest.mark.req("R12.2", "R12.4")
def test_sigterm_stops_admission_drains_and_exits_0(tmp_path: Path) -> None:
    config = tmp_path / "service.yaml"
    config.write_text("schema: calculet-scheduler/v1\nmodel_alias: tiny\nexecutor:\n  drain_deadline_ms: 10000\n")
    env = {**os.environ, "CALCULET_HOME": str(tmp_path / "home"), "PYTHONPATH": str(ROOT)}
    proc = subprocess.Popen([sys.executable, "-m", "calculet.run", "--config", str(config), "--host", "127.0.0.1",
                             "--port", "0", "--log-format", "json", "--sim-cost", "reference"],
                            cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    lines = _Lines(proc.stderr)
    try:
        port = lines.until("listening")["port"]
        url = f"http://127.0.0.1:{port}"
        body = {"model": "tiny", "prompt": "drain", "max_tokens": 12, "temperature": 0, "ignore_eos": True,
                "stream": True}
        with httpx.Client(base_url=url, timeout=30) as http:
            assert http.get("/health/ready").status_code == 200
            with http.stream("POST", "/v1/completions", json=body) as response:
                events = response.iter_lines()
                first = next(e for e in events if e)
                assert first.startswith("data: ")
                proc.send_signal(signal.SIGTERM)  # reference cost: ~40 ms a token, the stream is mid-way
                lines.until("shutdown: admission stopped, draining")
                rest = [e for e in events if e]
        assert rest[-1] == "data: [DONE]"
        assert json.loads(rest[-2][6:])["choices"][0]["finish_reason"] == "length", "the accepted stream completed"
        assert proc.wait(timeout=60) == 0
        stopped = lines.until("stopped")
        assert stopped["clean"] is True and stopped["finished"] == {"length": 1}
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)


def test_the_switch_interval_is_an_option_and_a_nonpositive_one_stops_start_up(
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    """Issue #13: the HTTP loop's wait for the interpreter lock is bounded by the switch interval; the service
    serves with ``--switch-interval-ms`` (default :data:`run.SWITCH_INTERVAL_MS`, the environment's
    ``CALCULET_SWITCH_INTERVAL_MS`` overriding it for benchmarks), refuses one that is not > 0 before
    bringing anything up, and sets it only while serving."""
    monkeypatch.delenv("CALCULET_SWITCH_INTERVAL_MS", raising=False)
    assert run.build_parser().parse_args([]).switch_interval_ms == run.SWITCH_INTERVAL_MS
    assert run.build_parser().parse_args(["--switch-interval-ms", "0.5"]).switch_interval_ms == 0.5
    monkeypatch.setenv("CALCULET_SWITCH_INTERVAL_MS", "2.5")
    assert run.build_parser().parse_args([]).switch_interval_ms == 2.5
    before = sys.getswitchinterval()
    assert run.main(["--switch-interval-ms", "0"]) == 2
    assert "--switch-interval-ms must be > 0" in capsys.readouterr().err
    assert sys.getswitchinterval() == before
    with pytest.raises(RuntimeError), run.switch_interval(0.0007):
        assert sys.getswitchinterval() == pytest.approx(0.0007)
        raise RuntimeError("serving ended by an error")
    assert sys.getswitchinterval() == before
