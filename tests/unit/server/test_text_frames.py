"""SSE text frames encoded once per stream (issue #20) are byte for byte the frames ``json.dumps``
of the whole chunk gives, for any text a stream can carry (§4 streaming, R4.7)."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from calculet.server.timed_stream import TextFrames, sse_json


def _chunk(text: str, chat: bool) -> dict[str, Any]:
    choice: dict[str, Any] = ({"index": 0, "delta": {"content": text}, "finish_reason": None, "logprobs": None}
                              if chat else {"index": 0, "text": text, "finish_reason": None, "logprobs": None})
    choice["stop_reason"] = None
    return {"id": "cmpl-1", "created": 7, "model": "m\u00e9", "system_fingerprint": "calculet-g1",
            "object": "chat.completion.chunk" if chat else "text_completion", "choices": [choice]}


@pytest.mark.req("R4.7")
@given(text=st.text(min_size=1), chat=st.booleans())
def test_a_frame_is_the_json_of_the_whole_chunk(text: str, chat: bool) -> None:
    frames = TextFrames(_chunk(TextFrames.SLOT, chat))
    expected = "data: " + sse_json(_chunk(text, chat)) + "\n\n"
    frame = frames.frame(text)
    assert frame == expected
    line = frame[len("data: "):-2]  # one line for any splitter, str.splitlines too (#14), and the chunk's JSON
    assert line.splitlines() == [line] and json.loads(line) == _chunk(text, chat)


def test_a_chunk_without_exactly_one_slot_is_refused() -> None:
    with pytest.raises(ValueError, match="exactly once"):
        TextFrames(_chunk("no slot", False))
