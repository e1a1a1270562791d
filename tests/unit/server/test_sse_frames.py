"""SSE frames from per-stream templates (issue #20) are byte for byte what the JSON of each whole chunk gives — the
construction the service used before (``"data: " + json.dumps(chunk) + "\\n\\n"`` with the line-break escapes) —
for any text a stream can carry, and a response's events framed in one pass are those frames in order, ending as
the old generator ended them (finish chunk, usage, ``[DONE]``, or the error body) (§4 streaming, R4.7)."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st
from starlette.responses import StreamingResponse

from calculet.machines.request import FinishReason
from calculet.runtime.request import RequestOutcome
from calculet.runtime.streams.writer import StreamEvent, StreamFinish
from calculet.server.sse import HEADERS, Frames, outcome_error

TRICKY = ["", "a", '"', "\\", '\\"', "\x00", "\x01\x1f\x7f", "\n\r\t\b\f", "é", "日本語", "\U0001F600", "\ufffd",
          "\x85", "\u2028", "\u2029", "a\u2028b\x85c\u2029", "</script>", "\u00a0", "'", "{\"}", "🦀\n\"\\"]


def _old_frame(payload: dict[str, Any]) -> bytes:
    """The construction before this change: the whole chunk's JSON, the line-break characters escaped after."""
    text = json.dumps(payload, ensure_ascii=False, separators=(",", ":"))
    text = text.translate(str.maketrans({"\x85": "\\u0085", "\u2028": "\\u2028", "\u2029": "\\u2029"}))
    return ("data: " + text + "\n\n").encode("utf-8")


def _old_chunk(text: str | None, finish: str | None, *, chat: bool, model: str, role: bool = False,
               why: str | None = None, usage: dict[str, int] | None = None) -> dict[str, Any]:
    if chat:
        delta: dict[str, Any] = {}
        if role:
            delta["role"] = "assistant"
        if text is not None:
            delta["content"] = text
        choice: dict[str, Any] = {"index": 0, "delta": delta, "finish_reason": finish, "logprobs": None}
    else:
        choice = {"index": 0, "text": text or "", "finish_reason": finish, "logprobs": None}
    choice["stop_reason"] = why
    payload = {"id": "cmpl-x\u2028\"1", "created": 1700000000, "model": model, "system_fingerprint": "calculet-g3",
               "object": "chat.completion.chunk" if chat else "text_completion", "choices": [choice]}
    if usage is not None:
        payload["usage"] = usage
    return payload


def _frames(chat: bool, model: str = "tiny", *, include_usage: bool = False, continuous: bool = False) -> Frames:
    return Frames(response_id="cmpl-x\u2028\"1", created=1700000000, model=model, fingerprint="calculet-g3", chat=chat,
                  prompt_tokens=5, include_usage=include_usage, continuous_usage=continuous)


def _text(index: int, text: str, generated: int) -> StreamEvent:
    return StreamEvent(index, (1,), text, False, None, None, generated)


def _last(index: int, text: str, outcome: RequestOutcome, generated: int) -> StreamEvent:
    return StreamEvent(index, (), text, True, StreamFinish.of(outcome.finish_reason), outcome, generated)


def _outcome(reason: FinishReason, generated: int, *, status: int = 200) -> RequestOutcome:
    completed = reason in (FinishReason.LENGTH, FinishReason.STOP)
    return RequestOutcome(1, "completed" if completed else "failed", reason, generated, status,
                          "" if completed else "why")


@pytest.mark.req("R4.7")
@pytest.mark.parametrize("chat", [False, True])
@pytest.mark.parametrize("text", TRICKY)
def test_a_text_frame_is_the_old_frame_of_the_whole_chunk_for_tricky_texts(text: str, chat: bool) -> None:
    """Catches: the text put in the template without JSON escaping, the line breaks left raw, a field order
    or separator of the template that differs from the chunk's own encoding."""
    for model in ("tiny", "m\u00e9\u2028\"x"):
        assert _frames(chat, model).text(text) == _old_frame(_old_chunk(text, None, chat=chat, model=model))


@pytest.mark.req("R4.7")
@given(text=st.text(), chat=st.booleans())
def test_a_text_frame_is_the_old_frame_for_any_text(text: str, chat: bool) -> None:
    frame = _frames(chat).text(text)
    assert frame == _old_frame(_old_chunk(text, None, chat=chat, model="tiny"))
    line = frame.decode()[len("data: "):-2]  # one line for any splitter, str.splitlines too (#14)
    assert line.splitlines() == [line] and json.loads(line)["choices"][0] == _old_chunk(
        text, None, chat=chat, model="tiny")["choices"][0]


def _old_events(events: list[StreamEvent], *, chat: bool, include_usage: bool, continuous: bool) -> bytes:
    """The old generator's frames for ``events`` (after the chat's role chunk)."""
    out = b""
    for event in events:
        if event.text:
            out += _old_frame(_old_chunk(event.text, None, chat=chat, model="tiny",
                                         usage=_usage(event.generated) if continuous else None))
        if event.finished:
            outcome = event.outcome
            assert outcome is not None
            if outcome.state == "completed":
                finish = "length" if event.finish_reason is StreamFinish.LENGTH else "stop"
                out += _old_frame(_old_chunk(None if chat else "", finish, chat=chat, model="tiny", why="END",
                                             usage=_usage(outcome.generated_tokens) if continuous else None))
                if include_usage:
                    payload = _old_chunk("", None, chat=chat, model="tiny")
                    payload["choices"] = []
                    payload["usage"] = _usage(event.generated)
                    out += _old_frame(payload)
            else:
                out += _old_frame(outcome_error(outcome).body())
            out += b"data: [DONE]\n\n"
    return out


def _usage(generated: int) -> dict[str, int]:
    return {"prompt_tokens": 5, "completion_tokens": generated, "total_tokens": 5 + generated}


@pytest.mark.req("R4.7", "R4.6")
@pytest.mark.parametrize("chat", [False, True])
@pytest.mark.parametrize("include_usage,continuous", [(False, False), (True, False), (True, True)])
@pytest.mark.parametrize("reason", [FinishReason.LENGTH, FinishReason.STOP, FinishReason.DEADLINE,
                                    FinishReason.CANCELLED, FinishReason.ERROR])
def test_a_batch_is_the_old_frames_of_its_events_in_order(chat: bool, include_usage: bool, continuous: bool,
                                                          reason: FinishReason) -> None:
    """Catches: an event without text framed anyway, the finish chunk's reason or stop_reason wrong, the usage
    chunk missing or counting the wrong tokens, an error body in place of the finish chunk (or the reverse),
    [DONE] missing, frames after the last event."""
    frames = _frames(chat, include_usage=include_usage, continuous=continuous)
    first = [_text(0, "a\u2028", 1), _text(1, "", 2), _text(2, '"\\', 3)]
    body, last = frames.batch(first, lambda event: "END")
    assert (body, last) == (_old_events(first, chat=chat, include_usage=include_usage, continuous=continuous), False)
    status = 200 if reason in (FinishReason.LENGTH, FinishReason.STOP) else 504
    end = [_text(3, "é", 4), _last(4, "z", _outcome(reason, 6, status=status), 5), _text(5, "never", 7)]
    body, last = frames.batch(end, lambda event: "END")
    assert last and body == _old_events(end[:2], chat=chat, include_usage=include_usage, continuous=continuous)


def test_a_batch_without_text_is_empty() -> None:
    assert _frames(False).batch([_text(0, "", 1), _text(1, "", 2)], lambda event: None) == (b"", False)


def test_the_headers_are_those_of_starlettes_streaming_response() -> None:
    """Catches: a header dropped or renamed, or the content type without its charset, against what
    ``StreamingResponse(media_type="text/event-stream")`` wrote before."""
    async def nothing() -> Any:
        yield b""

    old = StreamingResponse(nothing(), media_type="text/event-stream",
                            headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})
    assert HEADERS == old.raw_headers


@pytest.mark.req("R4.7")
@given(text=st.text() | st.sampled_from([*TRICKY, "\ud800", "a\udfff\u2028"]), chat=st.booleans())
def test_a_batch_frames_each_text_as_the_text_frame_does(text: str, chat: bool) -> None:
    """Catches: the batch's inlined text encoding (issue #20: no call per text) differing from :meth:`Frames.text`
    (the old frame, tested above) — a line break left raw, a lone surrogate not answered as the library answers it."""
    frames = _frames(chat)
    body, last = frames.batch([_text(0, text, 1)], lambda event: None)
    assert not last and body == (frames.text(text) if text else b"")
