"""bench/overload_http.py's server-side window of a burst (issue #13: "through HTTP under a 300-request burst: time
to 429 P99 <= 50 ms"): the first tries' last 429 is told apart from a retry refused again.

Why (Q20): session 19 read one row's "last 429" at 1 026 ms, by the server's clock, where the client's P99 was 46 ms.
The access log is read after the retries too, and a client whose first try got ``Retry-After: 1`` retries about 1 s
after the burst: a retry refused again was counted as the burst's last 429, a first try "held" ~1 s that no request
was. The retry is named by its ``X-Request-Id`` (:data:`overload_http.RETRY_ID`), which the access line keeps."""

from __future__ import annotations

import math
import sys
from pathlib import Path

import pytest

from calculet.server.refusal_lane import CLIENT_ID

ROOT = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(ROOT / "bench"))

import overload_http  # noqa: E402  (bench/ is a directory of scripts, not a package)
from overload_http import RETRY_ID, Refusal, refusal_window  # noqa: E402

T0 = 1_800_000_000.0
"""The server's wall clock at the burst's first arrival (any instant: the window is relative to it)."""


def _burst() -> list[Refusal]:
    """A burst's 429s as the access log gives them: the first at its arrival from the snapshot, the last first try
    37 ms after the first arrival, and a retry (sent 1 s after its first try's 429) refused again at 1 026 ms."""
    first = [Refusal(0.001, T0 + 0.001, True, False)] + [
        Refusal(0.001, T0 + 0.002 + i * 0.0001, True, False) for i in range(290)]
    first.append(Refusal(0.030, T0 + 0.037, True, False))
    retry = Refusal(0.0004, T0 + 1.026, True, True)
    return [*first[:100], retry, *first[100:]]  # the log's order: lines as written, whatever they answered


def test_a_retry_refused_again_is_not_the_bursts_last_429() -> None:
    # mutant killed: every 429 counted in the window (the classification ignored) — its last would be 1 026 ms
    window = refusal_window(_burst())
    assert window.last_ms == pytest.approx(37.0, abs=0.01)
    assert window.first_front_ms == pytest.approx(1.0, abs=0.01)
    assert window.retries_refused == 1
    assert window.last_retry_ms == pytest.approx(1026.0, abs=0.01)


def test_the_window_starts_at_the_first_first_try_arrival_and_its_durations_are_first_tries_only() -> None:
    # mutants killed: the start taken from the first refusal's instant (not the first arrival: a first try held
    # from before it, the engine's 429 here), and the retries' durations in the server's P50/P99
    refusals = _burst() + [Refusal(0.500, T0 + 0.040, False, False)]  # the engine's 429, arrived at -460 ms
    window = refusal_window(refusals)
    assert window.last_ms == pytest.approx(500.0, abs=0.01)
    assert window.first_front_ms == pytest.approx(461.0, abs=0.01)
    few = [Refusal(0.001, T0 + 0.001, True, False), Refusal(0.002, T0 + 0.003, True, False)]
    assert refusal_window([*few, Refusal(0.9, T0 + 1.5, False, True)]).took_ms == refusal_window(few).took_ms


def test_no_retry_refused_reads_nan() -> None:
    window = refusal_window([r for r in _burst() if not r.retry])
    assert window.retries_refused == 0 and math.isnan(window.last_retry_ms)


class _Drain:
    def __init__(self, lines: list[str]) -> None:
        self.lines = lines

    def get_nowait(self) -> str:
        if not self.lines:
            raise overload_http.Empty
        return self.lines.pop(0)


class _Server:
    def __init__(self, lines: list[str]) -> None:
        self._drain = _Drain(lines)


def test_the_log_names_a_retry_by_its_request_id_and_the_retry_sends_it() -> None:
    # mutants killed: the retry sent without its X-Request-Id, the log's client_request_id not read
    lines = ['{"ts": "2027-01-15T08:00:00.001Z", "status": 429, "route": "/v1/completions", "duration_s": 0.001, '
             '"refused_by": "front"}',
             '{"ts": "2027-01-15T08:00:01.026Z", "status": 429, "route": "/v1/completions", "duration_s": 0.0004, '
             f'"refused_by": "front", "client_request_id": "{RETRY_ID}7"}}',
             '{"ts": "2027-01-15T08:00:00.040Z", "status": 200, "route": "/v1/completions", "duration_s": 0.5}',
             'not json']
    found = overload_http._server_refusals(_Server(lines))  # type: ignore[arg-type]
    assert [(r.front, r.retry) for r in found] == [(True, False), (True, True)]
    assert found[1].at - found[0].at == pytest.approx(1.025, abs=1e-4)
    retry = overload_http._raw("POST", "/v1/completions", "127.0.0.1", {"prompt": "p"}, f"{RETRY_ID}7")
    head = retry.split(b"\r\n\r\n", 1)[0].decode().split("\r\n")
    assert f"X-Request-Id: {RETRY_ID}7" in head
    assert CLIENT_ID.match(f"{RETRY_ID}299")  # the server keeps it as the line's client_request_id
