"""The httptools protocol's direct writer of a streamed body part (issue #20, session 26): the bytes uvicorn's
``send`` of ``more_body`` writes (chunked coding), and nothing — ``send`` instead — whenever ``send`` would do more
than write: writes paused (it waits for the drain: backpressure), the client gone, the response not streaming."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest

from calculet.server.http_fast import write_body_part


class _Transport:
    def __init__(self) -> None:
        self.written: list[bytes] = []

    def write(self, data: bytes) -> None:
        self.written.append(data)


def _cycle(**overrides: Any) -> Any:
    fields = {"flow": SimpleNamespace(write_paused=False), "disconnected": False, "response_started": True,
              "response_complete": False, "chunked_encoding": True, "transport": _Transport()}
    fields.update(overrides)
    return SimpleNamespace(**fields)


def test_a_part_is_written_in_chunked_coding_and_an_empty_one_writes_nothing() -> None:
    cycle = _cycle()
    assert write_body_part(cycle, b"data: {}\n\n")
    assert write_body_part(cycle, b"")
    body = b"data: {}\n\n"
    assert cycle.transport.written == [b"%x\r\n" % len(body) + body + b"\r\n"]  # as uvicorn's send frames it


@pytest.mark.parametrize("state", [{"flow": SimpleNamespace(write_paused=True)}, {"disconnected": True},
                                   {"response_started": False}, {"response_complete": True},
                                   {"chunked_encoding": False}, {"chunked_encoding": None}])
def test_a_part_the_protocol_cannot_take_at_once_is_left_to_send(state: dict[str, Any]) -> None:
    cycle = _cycle(**state)
    assert not write_body_part(cycle, b"data: {}\n\n")
    assert cycle.transport.written == []
