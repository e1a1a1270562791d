"""The refusal lane's 429 written from bytes encoded once (issue #13: the answer was over half a refusal's CPU on
the event loop): the same bytes as the full path's answer built afresh, the same JSON log line, and the HTTP
families counted in bulk but exact whenever they are read after the loop's turn."""

from __future__ import annotations

import asyncio
import json
import logging
import math
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from calculet.runtime.engine.early_refusal import EarlyRefusal, refusal_reason
from calculet.server.edge_answers import _STATUS_LINE, AnswerBytes
from calculet.server.errors import admission_error
from calculet.server.logs import log_fields
from calculet.server.refusal_lane import RefusalLane


def _built_afresh(default_headers: list[tuple[bytes, bytes]], refusal: EarlyRefusal, request_id: str,
                  client_id: str | None, keep_alive: bool) -> bytes:
    """The answer as the lane built it before it kept encoded pieces (6380cb9): every part encoded per refusal."""
    error = admission_error(429, refusal.reason, retry_after_s=refusal.retry_after_s)
    content = error.json_bytes()
    parts = [_STATUS_LINE]
    for name, value in default_headers:
        parts += (name, b": ", value, b"\r\n")
    parts.append(b"retry-after: %s\r\ncontent-length: %d\r\ncontent-type: application/json\r\nx-request-id: %s\r\n"
                 % (error.headers["Retry-After"].encode("latin-1"), len(content), request_id.encode()))
    if client_id is not None:
        parts.append(b"x-client-request-id: %s\r\n" % client_id.encode())
    if not keep_alive:
        parts.append(b"connection: close\r\n")
    parts += (b"\r\n", content)
    return b"".join(parts)


_HEADERS = st.lists(st.tuples(st.sampled_from([b"server", b"date", b"x-extra"]),
                              st.binary(min_size=0, max_size=12).filter(lambda v: b"\r" not in v and b"\n" not in v)),
                    max_size=3)
_FIT = st.one_of(st.none(), st.floats(min_value=-0.04, max_value=1e5, allow_nan=False))


@settings(max_examples=300, deadline=None)
@given(headers=st.lists(_HEADERS, min_size=1, max_size=4), fits=st.lists(_FIT, min_size=1, max_size=4),
       client=st.one_of(st.none(), st.from_regex(r"[A-Za-z0-9._:-]{1,20}", fullmatch=True)), keep_alive=st.booleans())
def test_the_encoded_answer_is_the_one_built_afresh(headers: list[list[tuple[bytes, bytes]]], fits: list[float | None],
                                                    client: str | None, keep_alive: bool) -> None:
    """Mutants caught (each checked): the number in the body written "%.2f" or rounded to whole seconds; the
    Retry-After not raised to RETRY_AFTER_S (a fit within a second: 0); a "never" body with a Retry-After other than
    the default; the default headers' list kept by reference (changed in place, the old head was written)."""
    answers = AnswerBytes()
    for i, fit in enumerate(fits):
        default = headers[i % len(headers)]
        refusal = EarlyRefusal(None if fit is None else 1.0, None if fit is None else max(0.0, math.ceil(fit - 1e-9)),
                               fit)
        assert answers.response(default, refusal.fit_in_s, refusal.retry_after_s, "ab" * 16, client, keep_alive) == \
            _built_afresh(default, refusal, "ab" * 16, client, keep_alive)
    if headers[0]:
        changed = headers[0]
        answers.response(changed, None, None, "cd", None, True)
        changed[0] = (changed[0][0], changed[0][1] + b"x")  # in place: still the same list object
        assert answers.response(changed, None, None, "cd", None, True) == _built_afresh(
            changed, EarlyRefusal(None, None), "cd", None, True)


def test_the_reason_is_the_engines_words() -> None:
    """Mutant caught: the message's number formatted otherwise than the engine's (on_time: "in {:.1f} s")."""
    assert refusal_reason(3.14).endswith("(it would fit in 3.1 s)")
    assert refusal_reason(12.0).endswith("(it would fit in 12.0 s)")
    assert refusal_reason(None).endswith("(it would fit never on this device)")


def test_a_plain_line_is_the_formatters_line(json_logger: Any) -> None:
    """``log_fields(..., plain=True)`` writes what the JSON formatter writes for the same record. Mutants caught: the
    fields before the head (``ts``, ``level``, ... first in the formatter), a field dropped, the head's level name."""
    json_logger.at(1_700_000_000.5)
    fields = {"request_id": "ab", "method": "POST", "route": "/v1/completions", "status": 429,
              "duration_s": 0.000012, "tenant": "t\u00e9", "client_request_id": "c-1", "code": "over_capacity",
              "reason": refusal_reason(3.14), "refused_by": "front", "generation": 2, "model": None}
    log_fields(json_logger.logger, logging.WARNING, "http", dict(fields), plain=True)
    assert json_logger.stream.getvalue() == json_logger.formatted(logging.WARNING, fields)
    assert list(json.loads(json_logger.stream.getvalue()))[:5] == ["ts", "level", "logger", "msg", "request_id"]


class _Child:
    def __init__(self) -> None:
        self.calls: list[float] = []

    def inc(self, n: float = 1) -> None:
        self.calls.append(n)

    def observe(self, value: float) -> None:
        self.calls.append(value)

    def observe_many(self, values: list[float]) -> None:
        self.calls.append(list(values))  # type: ignore[arg-type]  # one call: the turn's durations together


class _Family:
    def __init__(self) -> None:
        self.children: dict[tuple[str, ...], _Child] = {}

    def labels(self, *labels: str) -> _Child:
        return self.children.setdefault(labels, _Child())


class _Metrics:
    def __init__(self) -> None:
        self.http_requests, self.http_duration = _Family(), _Family()


def test_refusals_are_counted_once_per_turn_of_the_loop_and_all_of_them() -> None:
    """A burst's refusals in one turn: one counter increment by their number and every duration observed, in one call
    per route (session 22: :meth:`BulkHistogram.observe_many`), before the next turn (a scrape is answered in a later
    one); a second turn counts its own. Mutants caught: no flush scheduled (nothing counted), the pending durations
    kept after a flush (counted twice), a call per duration (``observe_many`` of each, or ``observe``)."""
    service = type("S", (), {"metrics": _Metrics()})()
    lane = RefusalLane.__new__(RefusalLane)
    lane.service, lane._pending, lane._lines = service, {}, []

    async def turn(durations: list[tuple[str, float]]) -> None:
        for route, took in durations:
            lane._count(route, took, None)
        await asyncio.sleep(0)

    async def run() -> None:
        await turn([("/v1/completions", 0.001), ("/v1/completions", 0.002), ("/v1/chat/completions", 0.003)])
        requests, durations = service.metrics.http_requests.children, service.metrics.http_duration.children
        assert requests[("/v1/completions", "POST", "429")].calls == [2]
        assert requests[("/v1/chat/completions", "POST", "429")].calls == [1]
        assert durations[("/v1/completions",)].calls == [[0.001, 0.002]]
        assert durations[("/v1/chat/completions",)].calls == [[0.003]]
        await turn([("/v1/completions", 0.004)])
        assert requests[("/v1/completions", "POST", "429")].calls == [2, 1]
        assert durations[("/v1/completions",)].calls == [[0.001, 0.002], [0.004]]

    asyncio.run(run())


def test_a_turns_log_lines_are_written_after_it_in_one_write_each_with_its_own_instant(json_logger: Any,
                                                                                      monkeypatch: Any) -> None:
    """Issue #13: a flush of the log stream per refusal released the interpreter lock at each one; a turn's lines are
    written at its end, in one write and one flush, each the formatter's line for its own instant (the one it was
    decided at), and a second turn writes only its own. Mutants caught: each line written at once (before the turn's
    end), the instant read at the flush (every line of the turn with the last one's ``ts``), a flush per line, the
    written lines kept for the next turn (written twice)."""
    import calculet.server.refusal_lane as refusal_lane

    monkeypatch.setattr(refusal_lane, "log", json_logger.logger)
    parent = logging.getLogger(json_logger.name)
    handler = parent.handlers[0]
    monkeypatch.setattr(parent, "handlers", [handler])  # the JSON handler alone (pytest's capture added its own)
    flushes: list[int] = []
    # the stream's flushes (the system calls): log_lines flushes it under the handler's lock it holds already
    monkeypatch.setattr(handler.stream, "flush", lambda: flushes.append(1))
    service = type("S", (), {"metrics": _Metrics()})()
    lane = RefusalLane.__new__(RefusalLane)
    lane.service, lane._pending, lane._lines = service, {}, []
    fields = [{"request_id": f"r{k}", "method": "POST", "route": "/v1/completions", "status": 429,
               "duration_s": 0.001 * k, "tenant": "default"} for k in range(3)]

    async def run() -> None:
        expected = ""
        for k, at in enumerate((1_700_000_000.25, 1_700_000_000.5)):
            json_logger.at(at)
            expected += json_logger.formatted(logging.INFO, fields[k])
            lane._count("/v1/completions", 0.001, dict(fields[k]))
        assert json_logger.stream.getvalue() == ""  # not before the turn's end
        await asyncio.sleep(0)
        assert json_logger.stream.getvalue() == expected and flushes == [1]
        json_logger.at(1_700_000_001.0)
        lane._count("/v1/completions", 0.001, dict(fields[2]))
        await asyncio.sleep(0)
        assert json_logger.stream.getvalue() == expected + json_logger.formatted(logging.INFO, fields[2])
        assert flushes == [1, 1]

    asyncio.run(run())
