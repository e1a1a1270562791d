"""The refusal lane (issue #13): a 429 the httptools protocol writes itself is the full path's 429, byte for byte,
with the same log line and metrics; anything it cannot answer as the full path would goes on to the ASGI app.

The service is the real one (the bundled model on the simulated NPU) behind its real edge protocols on fake
transports; the admission snapshot is pinned (every lane busy for an hour), so every valid request is refused by
the front from it, through the lane (one read) or through the ASGI app (the body in a second read, or h11).
"""

from __future__ import annotations

import asyncio
import json
import logging
import math
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from calculet.adapters.sim import CostModel, SimConfig, TimeMode
from calculet.config import load_config
from calculet.runtime.engine.admission_snapshot import HELD, AdmissionSnapshot, EarlyAdmission
from calculet.runtime.scheduling.finish_estimate import DeviceModel
from calculet.server.logs import log_fields

STEP_S = 0.05
DEADLINE_S = 5.0


class _Transport:
    """Keeps every byte written; closing is remembered."""

    def __init__(self) -> None:
        self.data = bytearray()
        self.closing = False

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return {"sockname": ("127.0.0.1", 8000), "peername": ("127.0.0.1", 40000)}.get(name, default)

    def write(self, data: bytes) -> None:
        self.data += data

    def is_closing(self) -> bool:
        return self.closing

    def close(self) -> None:
        self.closing = True

    def pause_reading(self) -> None:
        pass

    def resume_reading(self) -> None:
        pass

    def set_write_buffer_limits(self, *args: Any, **kwargs: Any) -> None:
        pass

    def get_write_buffer_size(self) -> int:
        return 0


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    from calculet.server.app import create_app
    from calculet.server.bringup import bring_up
    from calculet.server.service import Service

    path = Path(tmp_path_factory.mktemp("lane")) / "config.yaml"
    path.write_text(json.dumps({"schema": "calculet-scheduler/v1", "model_alias": "tiny-random",
                                "admission": {"deadline_default_ms": int(DEADLINE_S * 1000)},
                                "batch": {"deadline_order": "on_time"}}))
    brought = bring_up(load_config(str(path)), sim=SimConfig(time_mode=TimeMode.REAL, cost=CostModel.tiny()))
    service = Service(brought.config, brought.engine)
    service.start()
    try:
        yield service, create_app(service)
    finally:
        service.stop(wait_s=5)
        brought.close()


@pytest.fixture(autouse=True)
def _no_snapshot_pending(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> None:
    """Each test's engine says no snapshot is pending (its idle actor's own turns must not hold a test's requests); a
    test wanting one sets ``pending`` (:func:`_pending`). (A request's wait for one is its own, in its scope: nothing
    of it is left in the module's shared lane.)"""
    if "served" in request.fixturenames or "pinned" in request.fixturenames:
        service, _app = request.getfixturevalue("served")
        monkeypatch.setattr(type(service.engine), "snapshot_pending", property(lambda engine: False))


def _pending(service: Any, monkeypatch: pytest.MonkeyPatch) -> list[bool]:
    """A one-item list whose item ``service``'s engine gives as ``snapshot_pending`` (False at first)."""
    pending = [False]
    monkeypatch.setattr(type(service.engine), "snapshot_pending", property(lambda engine: pending[0]))
    return pending


@pytest.fixture
def pinned(served: Any, monkeypatch: pytest.MonkeyPatch) -> Any:
    """Every request of ``served`` finds the same snapshot: its one lane busy for an hour."""
    service, app = served
    now = service.engine.clock.now()
    model = DeviceModel(decode_step_s=STEP_S, prefill_fixed_s=0.005, prefill_per_token_s=0.0006)
    snapshot = AdmissionSnapshot(1, now, math.inf, (now + 3600.0,), 0.0, model, model, DEADLINE_S, 10**6, {})
    monkeypatch.setattr(type(service.engine), "admission_snapshot", property(lambda engine: snapshot))
    return service, app


def _request(body: dict[str, Any], *, headers: str = "", version: str = "1.1",
             path: str = "/v1/completions") -> tuple[bytes, bytes]:
    payload = json.dumps(body).encode()
    head = (f"POST {path} HTTP/{version}\r\nHost: t\r\nContent-Type: application/json\r\n{headers}"
            f"Content-Length: {len(payload)}\r\n\r\n").encode()
    return head, payload


def _exchange(app: Any, service: Any, http: str, reads: list[bytes]) -> tuple[bytes, int, bool]:
    """(response bytes, ASGI tasks started, connection closed) of ``reads`` on one connection of ``http``."""
    from uvicorn.server import ServerState

    from calculet.server.http_server import edge_protocol, uvicorn_config

    async def run() -> tuple[bytes, int, bool]:
        config = uvicorn_config(app, service.config.server)
        config.http = edge_protocol(service.config.server.header_timeout_s, http)  # type: ignore[assignment]
        config.load()
        protocol = config.http_protocol_class(config=config, server_state=ServerState(), app_state={},  # type: ignore
                                              _loop=asyncio.get_running_loop())
        transport = _Transport()
        protocol.connection_made(transport)
        tasks = 0
        for data in reads:
            before = set(protocol.tasks)
            protocol.data_received(data)
            tasks += len(set(protocol.tasks) - before)
        for _ in range(400):
            if b"\r\n\r\n" in transport.data:
                head, _, rest = bytes(transport.data).partition(b"\r\n\r\n")
                length = int(re.search(rb"content-length: (\d+)", head).group(1))  # type: ignore[union-attr]
                if len(rest) >= length:
                    break
            await asyncio.sleep(0.005)
        return bytes(transport.data), tasks, transport.closing

    return asyncio.run(run())


def _masked(response: bytes) -> bytes:
    """The response without what differs between two answers: the request id, the date."""
    response = re.sub(rb"x-request-id: [0-9a-f]{32}", b"x-request-id: ID", response)
    return re.sub(rb"date: [^\r]*", b"date: DATE", response)


NEVER = {"model": "tiny-random", "prompt": "lane", "max_tokens": 120, "temperature": 0, "ignore_eos": True}
"""Late even on an idle device (120 steps of 50 ms > 5 s): the refusal's answer does not depend on the retry slots."""
SLOT = {**NEVER, "max_tokens": 16}


def _http_lines(caplog: pytest.LogCaptureFixture) -> list[dict[str, Any]]:
    standard = set(vars(logging.LogRecord("", 0, "", 0, "", None, None))) | {"message", "taskName"}
    return [{k: v for k, v in vars(r).items() if k not in standard} for r in caplog.records if r.getMessage() == "http"]


@pytest.mark.parametrize("headers,version", [("", "1.1"), ("X-Request-Id: client-7\r\n", "1.1"),
                                             ("Connection: close\r\n", "1.1"), ("", "1.0")])
def test_the_lanes_429_is_the_full_paths_with_its_log_line_and_metrics(pinned: Any, caplog: pytest.LogCaptureFixture,
                                                                       headers: str, version: str) -> None:
    service, app = pinned
    head, body = _request(NEVER, headers=headers, version=version)
    counted = service.metrics.http_requests.labels("/v1/completions", "POST", "429")
    before = counted._value.get()
    with caplog.at_level(logging.INFO, logger="calculet"):
        lane, lane_tasks, lane_closed = _exchange(app, service, "httptools", [head + body])
        full, full_tasks, full_closed = _exchange(app, service, "httptools", [head, body])  # the body in a 2nd read
        h11, _, _ = _exchange(app, service, "h11", [head + body])
    assert lane.startswith(b"HTTP/1.1 429 ") and b"retry-after: 1\r\n" in lane
    assert (lane_tasks, full_tasks) == (0, 1)  # the lane answered without an ASGI task; the split body had one
    assert _masked(lane) == _masked(full)
    assert _masked(lane).lower() == _masked(h11).lower()  # h11 writes its own "Connection: close" capitalised
    assert lane_closed == full_closed == (bool(headers.startswith("Connection")) or version == "1.0")
    assert counted._value.get() == before + 3
    lines = _http_lines(caplog)
    assert len(lines) == 3
    for line in lines:
        assert line.pop("request_id") and line.pop("duration_s") >= 0
    assert lines[0] == lines[1] == lines[2]
    assert lines[0]["refused_by"] == "front" and lines[0]["code"] == "over_capacity"
    assert ("client_request_id" in lines[0]) == bool(headers.startswith("X-Request-Id"))


def test_a_refusal_with_a_retry_slot_carries_the_same_fields(pinned: Any) -> None:
    service, app = pinned
    head, body = _request(SLOT)
    lane, _, _ = _exchange(app, service, "httptools", [head + body])
    full, _, _ = _exchange(app, service, "httptools", [head, body])
    retry = [int(re.search(rb"retry-after: (\d+)", r).group(1)) for r in (lane, full)]  # type: ignore[union-attr]
    assert 3500 < retry[0] <= retry[1]  # behind the hour the lane is busy; the second slot behind the first
    assert _masked(re.sub(rb"(retry-after: |fit in )[0-9.]+", rb"\1N", lane)).split(b"content-length")[0] == \
        _masked(re.sub(rb"(retry-after: |fit in )[0-9.]+", rb"\1N", full)).split(b"content-length")[0]


def test_a_chat_completion_is_refused_by_the_lane_as_by_the_full_path(pinned: Any,
                                                                     caplog: pytest.LogCaptureFixture) -> None:
    service, app = pinned
    chat = {"model": "tiny-random", "messages": [{"role": "user", "content": "lane"}], "max_tokens": 120}
    head, body = _request(chat, path="/v1/chat/completions")
    with caplog.at_level(logging.INFO, logger="calculet"):
        lane, tasks, _ = _exchange(app, service, "httptools", [head + body])
        full, _, _ = _exchange(app, service, "httptools", [head, body])
    assert tasks == 0 and lane.startswith(b"HTTP/1.1 429 ") and _masked(lane) == _masked(full)
    lines = _http_lines(caplog)
    assert [line["route"] for line in lines] == ["/v1/chat/completions"] * 2


@pytest.mark.parametrize("body,status", [({**SLOT, "n": 2}, 400), ({**SLOT, "model": "other"}, 404),
                                         ({**SLOT, "max_tokens": 10**6}, 400), ({**SLOT, "prompt": 5}, 400)])
def test_what_the_full_path_refuses_otherwise_is_answered_by_it(pinned: Any, body: dict[str, Any],
                                                                status: int) -> None:
    service, app = pinned
    head, payload = _request(body)
    lane, tasks, _ = _exchange(app, service, "httptools", [head + payload])
    full, _, _ = _exchange(app, service, "httptools", [head, payload])
    assert tasks == 1 and lane.startswith(b"HTTP/1.1 %d " % status)
    assert _masked(lane) == _masked(full)


def test_the_same_body_is_prepared_once_and_its_model_asked_each_time(pinned: Any,
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    service, app = pinned
    lane = app.refusal_lane
    body = json.dumps({**NEVER, "prompt": "memo"}).encode()
    scope = {"method": "POST", "path": "/v1/completions", "headers": [], "state": {}}
    first = lane._prepared(service, "/v1/completions", body)
    hits = lane.memo.hits
    assert lane._prepared(service, "/v1/completions", body) is first and lane.memo.hits == hits + 1
    monkeypatch.setattr(service.admin, "unloaded", lambda model: True)  # the admin API unloaded it meanwhile
    assert lane._prepared(service, "/v1/completions", body) is None
    assert lane.decide(scope, body, default_headers=[], keep_alive=True, started=0.0, hold=True) is None


def test_decide_holds_a_fitting_request_that_would_not_fit_behind_the_forwards_on_its_snapshot() -> None:
    """A snapshot without room (the front cannot tell that the engine admits its forwards as appended): what fits
    it but not behind the forwards on it is held, never refused from them."""
    early = EarlyAdmission()
    model = DeviceModel(decode_step_s=STEP_S)
    snapshot = AdmissionSnapshot(1, 0.0, 10.0, (0.0, 1.0), 0.0, model, model, DEADLINE_S, 10**6, {})

    def decide(hold: bool, read: Any = lambda: snapshot) -> Any:  # 1.95 s of lane each: two fit a lane in 5 s
        answer = early.decide(read, prompt_tokens=4, max_new_tokens=40, tenant="t", now=0.0, hold=hold)
        if answer is None:  # forwarded: on its way, as the lane (``unsent``) or the full path (``sent``) counts it
            early.unsent += hold
            if not hold:
                early.sent()
        return answer

    assert [decide(True) for _ in range(4)] == [None] * 4  # forwarded: 0+1.95+1.95 on one lane, 1+1.95+1.95
    assert decide(True) is HELD and decide(False) is None  # it fits the snapshot, not behind the four: held if asked
    assert decide(True) is HELD  # the forward without hold was appended too
    assert early.statistics().forwarded["fits"] == 5 and early.statistics().refused == 0  # a held one: not counted
    newer = AdmissionSnapshot(2, 0.0, 10.0, (0.0, 1.0), 0.0, model, model, DEADLINE_S, 10**6, {})
    assert decide(True, lambda: newer) is HELD  # a new snapshot: the forwards before it may not be in it yet
    early.unsent = 0
    early.in_flight = 0  # all answered: the actor published after deciding them
    assert decide(True, lambda: newer) is None


def test_the_json_line_written_directly_is_the_formatters(json_logger: Any) -> None:
    json_logger.at(1_700_000_000.25)
    fields = {"request_id": "ab", "status": 429, "duration_s": 0.5, "tenant": None, "odd": Path("/x"),
              "text": "é\u2028"}
    log_fields(json_logger.logger, logging.INFO, "http", fields)
    assert json_logger.stream.getvalue() == json_logger.formatted(logging.INFO, fields)
    seen: list[logging.LogRecord] = []
    json_logger.logger.addFilter(lambda r: seen.append(r) or True)  # a filter sees records: the generic path is taken
    log_fields(json_logger.logger, logging.INFO, "http", fields)
    assert len(seen) == 1 and seen[0].status == 429  # type: ignore[attr-defined]


def test_a_forward_is_on_its_way_until_submitted_or_ended(served: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """The lane's forwards count as on their way to the engine (what makes later requests of the same read hold)
    until the full path submits them (here: admitted and served) or their request ends before."""
    service, app = served
    monkeypatch.setattr(type(service.engine), "admission_snapshot", property(lambda engine: None))
    early = service.early_admission
    head, body = _request({**SLOT, "max_tokens": 2})
    lane = app.refusal_lane
    scope = {"method": "POST", "path": "/v1/completions", "headers": [], "state": {}}
    assert lane.decide(scope, body, default_headers=[], keep_alive=True, started=0.0, hold=True) is None
    assert early.unsent == 1 and scope["state"]["unsent"]
    early.unsent -= 1  # that scope's request never runs
    response, tasks, _ = _exchange(app, service, "httptools", [head + body])
    assert tasks == 1 and response.startswith(b"HTTP/1.1 200 ")
    assert early.unsent == 0 and early.in_flight == 0

    async def fails(scope: Any, receive: Any, send: Any) -> None:
        raise RuntimeError("before its submit")

    from calculet.server.app import RequestContext

    async def run() -> None:
        sent: list[Any] = []

        async def send(message: Any) -> None:
            sent.append(message)

        early.unsent += 1
        state = {"unsent": True}
        await RequestContext(fails, service)({"type": "http", "method": "POST", "path": "/v1/completions",
                                              "headers": [], "state": state}, None, send)  # type: ignore[arg-type]
        assert sent[0]["status"] == 500

    asyncio.run(run())
    assert early.unsent == 0


class _Edge:
    """The protocol as the lane's hold sees it: what it was told to write or start, in order."""

    def __init__(self) -> None:
        self.transport = _Transport()
        self.done: list[tuple[str, Any]] = []

    def default_headers(self) -> list[tuple[bytes, bytes]]:
        return []

    def write_answer(self, cycle: Any, answer: bytes) -> None:
        self.done.append(("answer", cycle.name))

    def start_app(self, cycle: Any, app: Any) -> None:
        self.done.append(("app", cycle.name))


async def _engine_answers(early: EarlyAdmission) -> None:
    """The engine answers one more request (``in_flight`` unchanged): every held wait ends, its drain runs."""
    early.in_flight += 1
    early.answered()
    await asyncio.sleep(0)
    await asyncio.sleep(0)


def _held_at_arrival(lane: Any, edge: _Edge, names: str, body: bytes) -> list[_Cycle]:
    """A request of ``body`` per name, each decided at its arrival (held: the caller made sure of it) and held."""
    cycles = [_Cycle(name) for name in names]
    for cycle in cycles:
        assert lane.decide(cycle.scope, body, default_headers=[], keep_alive=True, started=0.0, hold=True) is HELD
        lane.hold(edge, cycle, None, body, 0.0)
    return cycles


def _refusing(service: Any, generation: int) -> AdmissionSnapshot:
    """A snapshot of ``service``'s engine that refuses every request: its one lane busy for an hour."""
    now = service.engine.clock.now()
    model = DeviceModel(decode_step_s=STEP_S)  # one lane: alone, the same device
    return AdmissionSnapshot(generation, now, math.inf, (now + 3600.0,), 0.0, model, model, DEADLINE_S, 10**6, {})


def _shown(service: Any, monkeypatch: pytest.MonkeyPatch) -> list[Any]:
    """A one-item list whose item ``service``'s engine shows as its admission snapshot (None at first)."""
    shown: list[Any] = [None]
    monkeypatch.setattr(type(service.engine), "admission_snapshot", property(lambda engine: shown[0]))
    return shown


class _Cycle:
    def __init__(self, name: str) -> None:
        self.name = name
        self.scope = {"method": "POST", "path": "/v1/completions", "headers": [], "state": {}}
        self.keep_alive = True
        self.disconnected = False


def test_held_requests_are_decided_in_order_at_the_engines_answers_and_once_it_has_answered_all(
        served: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    service, app = served
    lane, early = app.refusal_lane, service.early_admission
    refusing, shown = _refusing(service, 7), _shown(service, monkeypatch)
    monkeypatch.setattr(early, "in_flight", 4)  # no snapshot, four on their way: hold
    body = json.dumps(NEVER).encode()
    edge = _Edge()

    async def run() -> None:
        cycles = _held_at_arrival(lane, edge, "abc", body)
        cycles[1].disconnected = True  # b's client goes while held
        await _engine_answers(early)
        assert edge.done == []  # still no snapshot: all held
        shown[0] = refusing
        await _engine_answers(early)
        assert edge.done == [("answer", "a"), ("app", "b"), ("answer", "c")]  # in order; b is the app's
        shown[0] = None
        late = _Cycle("d")
        lane.hold(edge, late, None, body, 0.0)
        for _ in range(3):
            await _engine_answers(early)
        assert edge.done[-1] == ("answer", "c")  # answers that leave four on their way are no rounds: still held
        early.in_flight = 0  # the engine answered everything on its way: the next answer ends a round
        await _engine_answers(early)
        assert edge.done[-1] == ("app", "d")  # nothing on its way and still no snapshot: forwarded
        assert late.scope["state"]["early_decided"]
        lane_sent(service, late.scope["state"])

    from calculet.server.inference import lane_sent

    asyncio.run(run())


def _lane_series(service: Any) -> dict[str, float]:
    """The ``calculet_front_lane_*`` samples of the service's /metrics registry, by family name."""
    from prometheus_client import generate_latest
    from prometheus_client.parser import text_string_to_metric_families

    return {family.name: sample.value
            for family in text_string_to_metric_families(generate_latest(service.registry).decode())
            if family.name.startswith("calculet_front_lane_")
            for sample in family.samples if not sample.name.endswith("_created")}


def test_the_lanes_statistics_are_exported_each_from_its_own_field(pinned: Any) -> None:
    """DESIGN.md (statistics() on every component): /metrics carries RefusalLane.statistics(). Three refusals of one
    body (two found in the memo) and one invalid body (declined) give each counter a different step, so a family
    reading another field, or an unregistered collector or a lane the service does not know, fails."""
    service, app = pinned
    before = _lane_series(service)
    head, body = _request({**NEVER, "prompt": "exported"})
    for _ in range(3):
        answer, tasks, _ = _exchange(app, service, "httptools", [head + body])
        assert tasks == 0 and answer.startswith(b"HTTP/1.1 429 ")
    head, body = _request({**SLOT, "n": 2})
    assert _exchange(app, service, "httptools", [head + body])[0].startswith(b"HTTP/1.1 400 ")
    after = _lane_series(service)
    stats = app.refusal_lane.statistics()
    assert after == {"calculet_front_lane_refused": stats.refused, "calculet_front_lane_declined": stats.declined,
                     "calculet_front_lane_held": stats.held, "calculet_front_lane_memo_hits": stats.memo_hits,
                     "calculet_front_lane_memo_entries": stats.memo_entries}
    steps = {name: after[name] - before[name] for name in after if name != "calculet_front_lane_memo_entries"}
    assert steps == {"calculet_front_lane_refused": 3, "calculet_front_lane_declined": 1,
                     "calculet_front_lane_held": 0, "calculet_front_lane_memo_hits": 2}
    assert after["calculet_front_lane_memo_entries"] == len(app.refusal_lane.memo) > 0


def test_a_drain_forwards_no_more_than_may_be_on_their_way(served: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """Held requests past their last round, no snapshot, nothing on its way: one drain forwards HOLD_IN_FLIGHT of
    them and holds the rest (each forward is on its way), not all at once. Mutant caught: ``busy`` read once per
    drain (all six forwarded)."""
    import time as clock

    from calculet.runtime.engine.admission_snapshot import HOLD_IN_FLIGHT
    from calculet.server.inference import lane_sent

    service, app = served
    lane, early = app.refusal_lane, service.early_admission
    monkeypatch.setattr(type(service.engine), "admission_snapshot", property(lambda engine: None))
    monkeypatch.setattr(early, "in_flight", HOLD_IN_FLIGHT)  # held at arrival
    body = json.dumps(NEVER).encode()
    edge = _Edge()

    async def run() -> None:
        cycles = [_Cycle(name) for name in "abcdef"]
        for cycle in cycles:
            lane.hold(edge, cycle, None, body, clock.perf_counter())
        for _ in range(2):
            await _engine_answers(early)
        assert edge.done == []
        early.in_flight = 0  # the engine answered everything on its way; the next answer ends the last round
        await _engine_answers(early)
        assert edge.done == [("app", name) for name in "abcdef"[:HOLD_IN_FLIGHT]]
        assert early.unsent == HOLD_IN_FLIGHT
        for cycle in cycles:
            lane_sent(service, cycle.scope["state"])
            cycle.disconnected = True  # the held ones leave the lane's queue at its next drain
        await _engine_answers(early)
        assert [name for _, name in edge.done] == list("abcdef") and not lane._queue

    asyncio.run(run())


def test_a_held_request_is_screened_once_and_decided_again_from_the_snapshot_only(
        served: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """A held request's re-decision asks the snapshot only: its tenant and prepared body are the ones found at its
    arrival, as the full path prepares once and then holds. Its body is gone from the memo (as a burst of distinct
    bodies longer than the memo evicts it), so a re-screen would parse it again. Mutant caught: ``screened`` not
    kept in the state (``prepare`` runs at the drain too: 2 calls)."""
    from calculet.server import refusal_lane
    from calculet.server.refusal_lane import PreparedMemo

    service, app = served
    lane, early = app.refusal_lane, service.early_admission
    refusing, shown = _refusing(service, 9), _shown(service, monkeypatch)
    monkeypatch.setattr(early, "in_flight", 4)  # no snapshot, four on their way: hold
    monkeypatch.setattr(lane, "memo", PreparedMemo(entries=1))
    prepare, kind = refusal_lane.GENERATION_ROUTES["/v1/completions"]
    calls: list[bytes] = []

    def counted(served_by: Any, raw: bytes) -> Any:
        calls.append(raw)
        return prepare(served_by, raw)

    monkeypatch.setitem(refusal_lane.GENERATION_ROUTES, "/v1/completions", (counted, kind))
    body = json.dumps({**NEVER, "prompt": "screened once"}).encode()
    edge = _Edge()

    async def run() -> None:
        _held_at_arrival(lane, edge, "a", body)
        lane.memo.put("/v1/completions", b"another body", lane.memo.get("/v1/completions", body))  # evicts it
        shown[0] = refusing
        await _engine_answers(early)
        assert edge.done == [("answer", "a")]

    asyncio.run(run())
    assert calls == [body]


def test_an_answer_that_leaves_requests_on_their_way_forwards_no_held_request(
        served: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """With no snapshot, fewer than HOLD_IN_FLIGHT on their way and requests held: an answer after which some are
    still on their way forwards none of them (the actor withdrew its snapshot to run the next), nor a new arrival
    behind them; the answer after which none is on its way decides them (here a snapshot that refuses). Mutants
    caught: ``patient`` ignored in the drain (a and b forwarded at the first answer, as at d515e2d: one more
    forward each answer); an arrival not patient behind held ones (c forwarded before a and b)."""
    service, app = served
    lane, early = app.refusal_lane, service.early_admission
    refusing, shown = _refusing(service, 11), _shown(service, monkeypatch)
    monkeypatch.setattr(early, "in_flight", 4)
    monkeypatch.setattr(lane, "_round_at", float("inf"))  # no round by the hold's timer (HOLD_S) in this test
    body = json.dumps(NEVER).encode()
    edge = _Edge()

    async def run() -> None:
        _held_at_arrival(lane, edge, "ab", body)
        early.in_flight = 2  # two answered: two still on their way
        await _engine_answers(early)
        assert edge.done == []
        arrival = _Cycle("c")
        assert lane.decide(arrival.scope, body, default_headers=[], keep_alive=True, started=0.0, hold=True,
                           patient=lane.holding()) is HELD
        lane.hold(edge, arrival, None, body, 0.0)
        early.in_flight = 0
        shown[0] = refusing
        await _engine_answers(early)
        assert edge.done == [("answer", "a"), ("answer", "b"), ("answer", "c")]

    asyncio.run(run())


def test_held_requests_wait_for_the_next_snapshot_when_the_one_they_were_decided_from_is_withdrawn(
        served: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """A drain deciding from a snapshot that the actor withdraws meanwhile (it began a step: the next is pending): the
    requests left are not forwarded for want of a snapshot; they are decided at a poll once the next one is published.
    Mutant caught: no wait for a pending snapshot (``snapshot_pending`` ignored by ``SnapshotWait``: b and c forwarded
    to the engine, ``("app", ...)``)."""
    from calculet.server import refusal_lane

    service, app = served
    lane, early = app.refusal_lane, service.early_admission
    refusing = _refusing(service, 13)
    edge = _Edge()
    published = [False]
    shown: list[Any] = [None]

    def current(engine: Any) -> Any:  # withdrawn once the first answer is written, until published again
        return None if shown[0] is None or edge.done and not published[0] else shown[0]

    monkeypatch.setattr(type(service.engine), "admission_snapshot", property(current))
    monkeypatch.setattr(type(service.engine), "snapshot_pending",
                        property(lambda engine: bool(edge.done) and not published[0]))  # the actor's step
    monkeypatch.setattr(early, "in_flight", 4)
    monkeypatch.setattr(refusal_lane, "SNAPSHOT_POLL_S", 0.0)
    monkeypatch.setattr(lane, "_polling", False)  # a poll an earlier test left on its own (closed) loop
    body = json.dumps(NEVER).encode()

    async def run() -> None:
        _held_at_arrival(lane, edge, "abc", body)
        early.in_flight = 0
        shown[0] = refusing
        await _engine_answers(early)
        assert edge.done == [("answer", "a")]  # b met the snapshot withdrawn: it and c wait
        published[0] = True
        await asyncio.sleep(0)  # the poll (SNAPSHOT_POLL_S made 0: no time passes)
        await asyncio.sleep(0)
        assert edge.done == [("answer", "a"), ("answer", "b"), ("answer", "c")]

    asyncio.run(run())


def _quiet(lane: Any, service: Any, early: EarlyAdmission, monkeypatch: pytest.MonkeyPatch) -> None:
    """No poll or wait left by an earlier test (each on its own, closed, loop), polls at once, and no round or drain
    but at the engine's answers (the hold's timer, HOLD_S of wall time, cannot fire within a test)."""
    from calculet.server import refusal_lane

    monkeypatch.setattr(refusal_lane, "SNAPSHOT_POLL_S", 0.0)
    monkeypatch.setattr(lane, "_polling", False)
    monkeypatch.setattr(lane, "_armed", False)
    monkeypatch.setattr(lane, "_round_at", float("inf"))
    monkeypatch.setattr(service.next_answer, "_future", None)
    monkeypatch.setattr(service.next_answer, "_hold_s", 3600.0)
    monkeypatch.setattr(early, "_wakers", [])


def test_requests_held_at_arrival_for_a_pending_snapshot_are_decided_once_it_is_published(
        served: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """Issue #13: a read decided while the actor is in a step (no snapshot, one pending: ``snapshot_pending``) is held;
    the actor's next snapshot decides it at a poll, without waiting for the engine's next answer (none comes here); a
    poll finding none pending any more decides it as an arrival then (forwarded: nothing on its way). No poll when
    none is pending (a snapshot then comes with a message the lane cannot see: the answers decide), nor once the
    request has waited SNAPSHOT_WAIT_S for a pending one (a longer step). Mutants caught: no poll at the hold (a and b
    still held when the snapshot is published, as at 784cd2c); a poll that stops while the snapshot is still pending
    (the first poll finds none, the publication is never read); a poll whatever the engine says (e decided without an
    answer); no bound on the wait (d decided without an answer); a poll deciding only from a snapshot (c still held
    when the engine says none comes, as at 29177b9)."""
    import time

    from calculet.server import refusal_lane
    from calculet.server.inference import lane_sent

    service, app = served
    lane, early = app.refusal_lane, service.early_admission
    refusing, shown, pending = _refusing(service, 17), _shown(service, monkeypatch), _pending(service, monkeypatch)
    monkeypatch.setattr(early, "in_flight", 4)  # no snapshot, four on their way: hold
    _quiet(lane, service, early, monkeypatch)
    body = json.dumps(NEVER).encode()
    edge = _Edge()

    def held(name: str, waited_s: float = 0.0) -> _Cycle:
        cycle = _Cycle(name)
        if waited_s:  # it has waited for the pending snapshot that long already (SnapshotWait)
            cycle.scope["state"][refusal_lane.WAIT_SINCE] = service.engine.clock.now() - waited_s
        started = time.perf_counter()
        assert lane.decide(cycle.scope, body, default_headers=[], keep_alive=True, started=started, hold=True,
                           patient=lane.holding()) is HELD
        lane.hold(edge, cycle, None, body, started)
        return cycle

    async def polls() -> None:
        for _ in range(3):
            await asyncio.sleep(0)

    async def run() -> None:
        pending[0] = True  # the actor's step
        held("a")
        held("b")
        early.in_flight = 0  # all answered meanwhile: the answers' drains, not a poll, forward for want of a snapshot
        await polls()  # polls that find the snapshot still pending
        assert edge.done == []
        shown[0], pending[0] = refusing, False  # published: no answer from the engine
        await polls()
        assert edge.done == [("answer", "a"), ("answer", "b")]
        shown[0], pending[0] = None, True  # the next step
        c = held("c")
        early.in_flight = 0
        await polls()
        assert edge.done[-1] == ("answer", "b")
        pending[0] = False  # it published none (it cannot refuse from one now): decided at the poll as on arrival
        await polls()
        assert edge.done[-1] == ("app", "c")  # nothing on its way, no snapshot coming: forwarded
        lane_sent(service, c.scope["state"])
        shown[0] = None  # none pending: a state the actor publishes no snapshot in
        early.in_flight = 4
        held("e")
        shown[0] = refusing  # published after a message the lane does not see
        await polls()
        assert edge.done[-1] == ("app", "c")
        await _engine_answers(early)
        assert edge.done[-1] == ("answer", "e")
        shown[0], pending[0] = None, True  # a step d has waited for longer than SNAPSHOT_WAIT_S already
        held("d", waited_s=2 * refusal_lane.SNAPSHOT_WAIT_S)
        shown[0], pending[0] = refusing, False
        await polls()
        assert edge.done[-1] == ("answer", "e")
        await _engine_answers(early)
        assert edge.done[-1] == ("answer", "d")

    asyncio.run(run())


def test_an_arrival_meeting_the_actors_step_is_held_for_the_next_snapshot_not_forwarded(
        served: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """Issue #13, the burst whose first 429 came 40-80 ms late: the actor withdrew its snapshot to decide the burst's
    first forward, and the next arrivals (fewer than HOLD_IN_FLIGHT on their way) were forwarded untracked, after which
    the front held every request that fit until the engine had answered them all. An arrival that finds no snapshot
    while one is pending (``snapshot_pending``) is held and decided from the next; with none pending (a state the
    actor publishes none in) it is forwarded as before. Mutants caught: the old rule (a forwarded with one on its way,
    as at 784cd2c); the engine's word ignored, holding whenever a snapshot is missing (z held); the lane never waiting
    for a pending snapshot (a forwarded)."""
    from calculet.server.inference import lane_sent

    service, app = served
    lane, early = app.refusal_lane, service.early_admission
    refusing, shown, pending = _refusing(service, 19), _shown(service, monkeypatch), _pending(service, monkeypatch)
    monkeypatch.setattr(early, "in_flight", 1)  # the burst's first forward, being decided by the actor
    _quiet(lane, service, early, monkeypatch)
    body = json.dumps(NEVER).encode()
    edge = _Edge()

    def decide(name: str) -> Any:
        cycle = _Cycle(name)
        return cycle, lane.decide(cycle.scope, body, default_headers=[], keep_alive=True, started=0.0, hold=True)

    async def run() -> None:
        shown[0] = refusing
        assert isinstance(decide("r")[1], bytes)  # refused from the snapshot read for it
        shown[0], pending[0] = None, True  # the actor's step
        cycle, answer = decide("a")
        assert answer is HELD
        lane.hold(edge, cycle, None, body, 0.0)
        shown[0], pending[0] = refusing, False  # published
        for _ in range(3):
            await asyncio.sleep(0)
        assert edge.done == [("answer", "a")]
        shown[0] = None
        late, answer = decide("z")
        assert answer is None and late.scope["state"]["early_decided"]  # forwarded, as before
        lane_sent(service, late.scope["state"])

    asyncio.run(run())


def test_an_arrival_finding_its_snapshot_expired_at_the_actors_wake_up_waits_for_the_next(
        served: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """A snapshot whose validity ended at the actor's timed wake-up, which has come (``snapshot_pending``: the actor's
    turn follows and publishes the next), holds an arrival for the next, nothing on its way; one that expired with
    none pending forwards it as before (``expired``). Why: a request forwarded "expired" goes to the actor untracked,
    as one forwarded for want of a snapshot (7-21 a run during retries, session 19). Mutant caught: an expired
    snapshot taken as usable (a forwarded ``expired``, not held)."""
    from calculet.server.inference import lane_sent

    service, app = served
    lane, early = app.refusal_lane, service.early_admission
    shown, pending = _shown(service, monkeypatch), _pending(service, monkeypatch)
    refusing = _refusing(service, 23)
    monkeypatch.setattr(early, "in_flight", 0)
    _quiet(lane, service, early, monkeypatch)
    body = json.dumps(NEVER).encode()
    edge = _Edge()
    shown[0], pending[0] = refusing._replace(valid_until=refusing.taken_at), True

    def decide(name: str) -> Any:
        cycle = _Cycle(name)
        return cycle, lane.decide(cycle.scope, body, default_headers=[], keep_alive=True, started=0.0, hold=True)

    async def run() -> None:
        cycle, answer = decide("a")
        assert answer is HELD
        lane.hold(edge, cycle, None, body, 0.0)
        shown[0], pending[0] = refusing._replace(generation=24, valid_until=math.inf), False  # the turn's
        for _ in range(3):
            await asyncio.sleep(0)
        assert edge.done == [("answer", "a")]
        shown[0] = refusing._replace(generation=25, valid_until=refusing.taken_at)
        expired = early.statistics().forwarded["expired"]
        late, answer = decide("z")
        assert answer is None and early.statistics().forwarded["expired"] == expired + 1
        lane_sent(service, late.scope["state"])

    asyncio.run(run())


def test_a_request_held_while_the_engine_is_stuck_is_decided_at_the_holds_cap_after_its_arrival(
        served: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """What bounds a hold (issue #13, Q20: a burst's "last 429 at 1 026 ms" was a retry refused again, not a hold, but
    the bound is this): an engine whose next snapshot never comes (none shown, one always pending: ``snapshot_pending``
    stuck up) and with HOLD_IN_FLIGHT requests on their way forever. The lane holds an arrival through its rounds,
    then while requests are on their way, and decides it HOLD_CAP_S after its arrival whatever the engine says
    (forwarded: no snapshot to refuse from); the snapshot wait alone ends after SNAPSHOT_WAIT_S. Virtual time: the
    lane's clock (``perf_counter``) and the engine's are one fake clock the test advances; drains at the engine's
    answers. Mutants caught (each checked): no cap (``busy`` alone holds: still held at the cap), the hold ignoring what
    is on its way (decided at its last round, 90 ms), a hold whatever the round (still held at the cap)."""
    import time
    from types import SimpleNamespace

    from calculet.runtime.engine.admission_snapshot import HOLD_IN_FLIGHT
    from calculet.server import refusal_lane
    from calculet.server.inference import lane_sent

    service, app = served
    lane, early = app.refusal_lane, service.early_admission
    _shown(service, monkeypatch)  # no snapshot, ever
    pending = _pending(service, monkeypatch)
    _quiet(lane, service, early, monkeypatch)
    start = 1000.0
    now = [start]
    monkeypatch.setattr(refusal_lane, "time", SimpleNamespace(perf_counter=lambda: now[0], time=time.time))
    monkeypatch.setattr(type(service.engine), "clock", property(lambda engine: SimpleNamespace(now=lambda: now[0])))
    monkeypatch.setattr(lane, "_round_at", start)
    monkeypatch.setattr(early, "in_flight", HOLD_IN_FLIGHT)
    pending[0] = True
    body = json.dumps(NEVER).encode()
    edge = _Edge()

    async def run() -> None:
        cycle = _Cycle("a")
        assert lane.decide(cycle.scope, body, default_headers=[], keep_alive=True, started=start, hold=True,
                           patient=lane.holding()) is HELD
        lane.hold(edge, cycle, None, body, start)
        rounds = lane._round
        for after in (0.01, 0.035, 0.06, 0.09, 0.2, 0.5, 0.9, refusal_lane.HOLD_CAP_S - 1e-3):
            now[0] = start + after
            await _engine_answers(early)
            assert edge.done == [], after
            assert lane._awaited(None, now[0], cycle.scope["state"]) is (after < refusal_lane.SNAPSHOT_WAIT_S)
        assert lane._round - rounds >= 3  # past its last round: held by what is on its way
        now[0] = start + refusal_lane.HOLD_CAP_S
        await _engine_answers(early)
        assert edge.done == [("app", "a")]
        lane_sent(service, cycle.scope["state"])

    asyncio.run(run())


def test_an_arrival_late_in_a_long_step_waits_for_the_snapshot_as_long_as_the_first_arrival_did(
        served: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """Issue #13, session 21: a step longer than SNAPSHOT_WAIT_S (under load the actor waits for the interpreter lock
    the burst's loop holds) does not make the front blind for the rest of it. ``a`` arrives as the step begins, waits
    SNAPSHOT_WAIT_S and goes on (no snapshot, nothing on its way: forwarded); ``b`` arrives later in the same step
    and waits its own SNAPSHOT_WAIT_S, so the snapshot published meanwhile refuses it at a poll, as the engine would
    after its step. ``c`` arrives in a later step, after ``a`` and ``b`` were decided: it waits too (no instant left
    over from an earlier spell). Virtual time: one fake clock for the lane and the engine; nothing on its way, so only
    the snapshot wait holds. Mutant caught: one wait per spell (``SnapshotWait`` keeping the first waiter's instant
    until a usable snapshot is seen, as at 45eef29): ``b`` forwarded at its arrival, ``("app", "b")``."""
    import time
    from types import SimpleNamespace

    from calculet.server import refusal_lane
    from calculet.server.inference import lane_sent

    service, app = served
    lane, early = app.refusal_lane, service.early_admission
    refusing, shown, pending = _refusing(service, 29), _shown(service, monkeypatch), _pending(service, monkeypatch)
    _quiet(lane, service, early, monkeypatch)
    start = 2000.0
    now = [start]
    monkeypatch.setattr(refusal_lane, "time", SimpleNamespace(perf_counter=lambda: now[0], time=time.time))
    monkeypatch.setattr(type(service.engine), "clock", property(lambda engine: SimpleNamespace(now=lambda: now[0])))
    monkeypatch.setattr(early, "in_flight", 0)
    body = json.dumps(NEVER).encode()
    edge = _Edge()

    def arrive(name: str) -> _Cycle:
        cycle = _Cycle(name)
        answer = lane.decide(cycle.scope, body, default_headers=[], keep_alive=True, started=now[0], hold=True,
                             patient=lane.holding())
        if answer is HELD:
            lane.hold(edge, cycle, None, body, now[0])
        else:
            edge.done.append(("answer" if isinstance(answer, bytes) else "app", name))
        return cycle

    async def polls() -> None:
        for _ in range(3):
            await asyncio.sleep(0)

    async def run() -> None:
        pending[0] = True  # the actor's step begins; it lasts
        a = arrive("a")
        await polls()
        assert edge.done == []  # waits for the snapshot
        now[0] = start + 1.2 * refusal_lane.SNAPSHOT_WAIT_S  # a's wait is over: forwarded at the next poll
        await polls()
        assert edge.done == [("app", "a")]
        lane_sent(service, a.scope["state"])
        now[0] = start + 1.5 * refusal_lane.SNAPSHOT_WAIT_S  # later in the same step
        arrive("b")
        await polls()
        assert edge.done == [("app", "a")]  # b waits for the snapshot as a did
        now[0] = start + 1.7 * refusal_lane.SNAPSHOT_WAIT_S
        shown[0], pending[0] = refusing, False  # the step ends: its snapshot refuses b
        await polls()
        assert edge.done == [("app", "a"), ("answer", "b")]
        shown[0], pending[0] = None, True  # a later step
        now[0] = start + 10 * refusal_lane.SNAPSHOT_WAIT_S
        arrive("c")
        await polls()
        assert edge.done[-1] == ("answer", "b")  # c waits too
        shown[0], pending[0] = refusing, False
        await polls()
        assert edge.done[-1] == ("answer", "c")

    asyncio.run(run())


class _Settling:
    """A protocol as :meth:`RefusalLane.arrive` sees it: the requests it was told to settle, in order; those named in
    ``answered`` get their answer written (a 429), the others go on (forwarded or held)."""

    def __init__(self, settled: list[str], answered: str) -> None:
        self.settled = settled
        self.answered = answered

    def lane_body(self, cycle: Any) -> bytes | None:
        return None  # nothing for the lane's screen: only the order of the settles is followed here

    def settle(self, cycle: Any, app: Any, started: float, answers: list[Any] | None = None) -> None:
        self.settled.append(cycle.name)
        cycle.response_complete = cycle.name in self.answered


def test_a_turns_requests_are_settled_at_once_up_to_its_first_answer_and_the_others_at_its_end_in_order(
        served: Any) -> None:
    """Mutants caught: every request settled at once (no batch: ``c`` and ``d`` settled before the turn ends); the
    turn's first request only settled at once (``b``'s 429, the turn's first, delayed to the turn's end); the turn's
    requests settled out of order or lost; the turn never closed, or its batching kept (``e``, the first of the next
    turn, deferred; ``f``, after it, never settled)."""
    from calculet.server.refusal_lane import RefusalLane

    service, _app = served
    lane = RefusalLane(service, {})
    settled: list[str] = []

    async def run() -> None:
        edge = _Settling(settled, answered="bcdef")
        for name in "abcd":
            lane.arrive(edge, _Cycle(name), None, 0.0)
        assert settled == ["a", "b"]
        await asyncio.sleep(0)
        assert settled == ["a", "b", "c", "d"]
        lane.arrive(edge, _Cycle("e"), None, 0.0)
        lane.arrive(edge, _Cycle("f"), None, 0.0)
        assert settled == ["a", "b", "c", "d", "e"]
        await asyncio.sleep(0)
        assert settled == ["a", "b", "c", "d", "e", "f"]

    asyncio.run(run())


class _Staged:
    """A protocol as :meth:`RefusalLane._end_turn` sees it, recording each stage of each request: its body handed to
    the screen, its decision (``settle``), its answer's write; the requests named in ``answered`` are refused."""

    def __init__(self, events: list[tuple[str, str]], answered: str) -> None:
        self.events = events
        self.answered = answered

    def lane_body(self, cycle: Any) -> bytes | None:
        return cycle.name.encode()

    def settle(self, cycle: Any, app: Any, started: float, answers: list[Any] | None = None) -> None:
        self.events.append(("decide", cycle.name))
        if cycle.name not in self.answered:
            cycle.response_complete = False
        elif answers is None:
            self.write_answer(cycle, b"429")
        else:
            answers.append((self, cycle, b"429"))

    def write_answer(self, cycle: Any, answer: bytes) -> None:
        self.events.append(("write", cycle.name))
        cycle.response_complete = True


def test_a_turns_kept_requests_are_screened_then_decided_then_answered_each_stage_in_order(served: Any) -> None:
    """Mutants caught: the turn's screen stage removed (each body screened inside its decision: ``screen`` of ``c``
    after the decision of ``b``); the answers written as each is decided (``write`` of ``b`` before the decision of
    ``c``); a stage out of arrival order, or a request lost or answered twice; a body screened again at its decision
    (``screen`` twice for one request)."""
    from calculet.server.refusal_lane import RefusalLane

    service, _app = served
    lane = RefusalLane(service, {})
    events: list[tuple[str, str]] = []

    def screen(scope: dict[str, Any], body: bytes) -> bool:
        events.append(("screen", body.decode()))
        scope["state"]["screened"] = False  # declined: the decisions of this test are the edge's own
        return False

    lane.screen = screen  # type: ignore[method-assign]

    async def run() -> None:
        edge = _Staged(events, answered="abd")
        for name in "abcd":
            lane.arrive(edge, _Cycle(name), None, 0.0)
        assert events == [("decide", "a"), ("write", "a")]  # the turn's first answer: at once, as before
        events.clear()
        await asyncio.sleep(0)
        assert events == [("screen", "b"), ("screen", "c"), ("screen", "d"),
                          ("decide", "b"), ("decide", "c"), ("decide", "d"),
                          ("write", "b"), ("write", "d")]

    asyncio.run(run())


def test_a_burst_read_in_one_turn_gets_the_same_429s_as_requests_sent_alone(pinned: Any) -> None:
    """Several connections whose requests arrive in one turn of the loop (settled by the lane's turn, stage by stage)
    each get the answer a request alone on its connection gets (its own client id echoed), and one log line each.
    Mutants caught: the turn's answers not written, written to another request's connection, or written twice; a
    screen of the turn's stage lost before the decision (the lane declines, the ASGI app answers: a task started)."""
    from uvicorn.server import ServerState

    from calculet.server.http_server import edge_protocol, uvicorn_config

    service, app = pinned
    names = [f"burst-{i}" for i in range(5)]
    reads = [b"".join(_request(NEVER, headers=f"X-Request-Id: {name}\r\n")) for name in names]
    alone = [_masked(_exchange(app, service, "httptools", [read])[0]) for read in reads]

    async def run() -> tuple[list[bytes], int]:
        config = uvicorn_config(app, service.config.server)
        config.http = edge_protocol(service.config.server.header_timeout_s, "httptools")  # type: ignore[assignment]
        config.load()
        state, loop = ServerState(), asyncio.get_running_loop()
        edges = []
        for _ in reads:
            protocol = config.http_protocol_class(config=config, server_state=state, app_state={},  # type: ignore
                                                  _loop=loop)
            transport = _Transport()
            protocol.connection_made(transport)
            edges.append((protocol, transport))
        for (protocol, _transport), read in zip(edges, reads):
            protocol.data_received(read)
        tasks = sum(len(protocol.tasks) for protocol, _transport in edges)
        await asyncio.sleep(0)
        await asyncio.sleep(0)
        return [bytes(transport.data) for _protocol, transport in edges], tasks

    answers, tasks = asyncio.run(run())
    assert tasks == 0
    assert [_masked(answer) for answer in answers] == alone
    for name, answer in zip(names, answers):
        assert answer.count(b"HTTP/1.1 429") == 1 and f"x-client-request-id: {name}\r\n".encode() in answer
