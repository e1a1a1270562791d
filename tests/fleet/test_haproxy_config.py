"""The shipped HAProxy configuration: rendered for N boards, accepted by HAProxy 2.6 itself
(``haproxy -c``), and saying what the fleet relies on — readiness checks on /health/ready, leastconn,
a POST never retried once it reached a board, connection failures retried elsewhere, timeouts long
enough for SSE streams, and the admin socket the rollout drives (R3.5, R12.2)."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

from calculet.errors import BadRequest
from calculet.fleet.cli import main as fleet_main
from calculet.fleet.haproxy_config import BalancerSettings, Board, parse_board, render
from tests.fleet.conftest import require_haproxy

BOARDS = [Board("board1", "127.0.0.1", 8001), Board("board2", "127.0.0.1", 8002), Board("board3", "127.0.0.1", 8003)]


def backend_lines(text: str) -> list[str]:
    block = text[text.index("backend calculet"):]
    return [line.strip() for line in block.splitlines()[1:] if line.strip() and not line.strip().startswith("#")]


@pytest.mark.req("R3.5", "R12.2")
def test_the_rendered_backend_checks_readiness_balances_leastconn_and_retries_only_connections() -> None:
    text = render(BOARDS, BalancerSettings(bind="127.0.0.1:9000", admin_socket="/tmp/x.sock"))
    lines = backend_lines(text)
    assert "balance leastconn" in lines
    assert "option httpchk" in lines and "http-check expect status 200" in lines
    assert any(line.startswith("http-check send meth GET uri /health/ready") for line in lines)
    assert "retry-on conn-failure" in lines and "option redispatch 1" in lines
    assert not any(re.search(r"retry-on .*(response-timeout|50[0-9]|all-retryable-errors)", line) for line in lines)
    assert [line for line in lines if line.startswith("server ")] == [
        "server board1 127.0.0.1:8001", "server board2 127.0.0.1:8002", "server board3 127.0.0.1:8003"]
    default_server = next(line for line in lines if line.startswith("default-server"))
    assert "check inter 1s fall 2 rise 2" in default_server  # a dead board is out within ~2 s
    assert "timeout server 10m" in text and "timeout client 10m" in text  # long SSE streams
    assert "stats socket /tmp/x.sock mode 600 level admin" in text and "bind 127.0.0.1:9000" in text
    assert "X-Calculet-Board %[srv_name]" in text


def test_haproxy_accepts_the_rendered_configuration(tmp_path: Path) -> None:
    binary = require_haproxy()
    out = tmp_path / "haproxy.cfg"
    code = fleet_main(["haproxy-config", "--board", "a=127.0.0.1:8001", "--board", "127.0.0.1:8002",
                       "--bind", "127.0.0.1:18080", "--admin-socket", str(tmp_path / "s.sock"), "--out", str(out)])
    assert code == 0 and "server board2 127.0.0.1:8002" in out.read_text()
    checked = subprocess.run([binary, "-c", "-f", str(out)], capture_output=True, text=True, timeout=30)
    assert checked.returncode == 0, checked.stdout + checked.stderr
    out.write_text(out.read_text().replace("balance leastconn", "balance nonsense"))
    refused = subprocess.run([binary, "-c", "-f", str(out)], capture_output=True, text=True, timeout=30)
    assert refused.returncode != 0  # the check above can fail


def test_boards_are_named_and_addressed_or_refused() -> None:
    assert parse_board("b7=10.0.0.7:8000", 1) == Board("b7", "10.0.0.7", 8000)
    assert parse_board("127.0.0.1:8001", 4) == Board("board4", "127.0.0.1", 8001)
    for bad in ("nohost", "x=127.0.0.1:port", "bad name=127.0.0.1:1"):
        with pytest.raises(BadRequest):
            parse_board(bad, 1)
    with pytest.raises(BadRequest, match="unique"):
        render([BOARDS[0], BOARDS[0]])
    with pytest.raises(BadRequest, match="at least one"):
        render([])


def test_without_haproxy_the_fleet_tests_fail_under_ci_and_skip_elsewhere(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("tests.fleet.conftest.haproxy_binary", lambda: None)
    monkeypatch.setenv("CI", "true")
    with pytest.raises(pytest.fail.Exception, match="make system-tools"):
        require_haproxy()
    monkeypatch.delenv("CI")
    with pytest.raises(pytest.skip.Exception):
        require_haproxy()
