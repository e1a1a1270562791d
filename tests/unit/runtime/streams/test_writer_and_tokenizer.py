"""StreamWriter and the byte tokenizer (§3 StreamWriter, §4: the stream closes exactly once)."""

from __future__ import annotations

import asyncio
import threading

import pytest

from calculet.errors import BadRequest
from calculet.machines.request import FinishReason
from calculet.runtime.request import RequestOutcome
from calculet.runtime.streams.writer import StreamFinish, StreamWriter
from calculet.runtime.streams.tokenizer import ByteTokenizer

TOK = ByteTokenizer()


def outcome(reason: FinishReason, state: str = "completed", status: int = 200) -> RequestOutcome:
    return RequestOutcome(1, state, reason, 0, status)


def test_the_tokenizer_matches_the_sim_vocabulary() -> None:
    assert (TOK.vocab_size, TOK.bos, TOK.eos) == (260, 256, 257)
    ids = TOK.encode("héllo")
    assert ids[0] == 256 and bytes(ids[1:]) == "héllo".encode()
    assert TOK.decode(ids + [257]) == "héllo"
    with pytest.raises(BadRequest):
        TOK.validate([1, 260])
    with pytest.raises(BadRequest):
        TOK.validate([True])
    assert TOK.statistics().specials == (256, 257, 258, 259)


def test_text_is_streamed_by_whole_characters() -> None:
    stream = StreamWriter(tokenizer=TOK)
    for b in "é€".encode():
        stream.token(1, b)
    stream.close(outcome(FinishReason.LENGTH))
    texts = [e.text for e in stream.events(timeout=0)]
    assert "".join(texts) == "é€" and all("\ufffd" not in t for t in texts)
    assert stream.result(0).text == "é€"


@pytest.mark.req("R4.7", "R4.6")
def test_the_stream_closes_once_and_refuses_late_tokens() -> None:
    stream = StreamWriter()
    stream.token(1, 65)
    stream.close(outcome(FinishReason.LENGTH))
    stream.close(outcome(FinishReason.CANCELLED, "cancelled", 499))
    stream.token(1, 66)
    stats = stream.statistics()
    assert (stats.refused_closes, stats.refused_tokens, stats.raw_tokens) == (1, 1, 1)
    assert stream.result(0).finish_reason is StreamFinish.LENGTH


@pytest.mark.parametrize(("reason", "finish"), [
    (FinishReason.STOP, StreamFinish.STOP), (FinishReason.LENGTH, StreamFinish.LENGTH),
    (FinishReason.CANCELLED, StreamFinish.CANCELLED), (FinishReason.ERROR, StreamFinish.ERROR),
    (FinishReason.DEADLINE, StreamFinish.DEADLINE), (FinishReason.REJECTED, StreamFinish.ERROR)])
def test_finish_reasons(reason: FinishReason, finish: StreamFinish) -> None:
    stream = StreamWriter()
    stream.close(outcome(reason))
    final = stream.next_event(0, timeout=0)
    assert final.finished and final.finish_reason is finish and final.outcome is not None


def test_stop_sequences_and_eos_are_held_back_and_hidden() -> None:
    stream = StreamWriter(tokenizer=TOK, stop=[(ord("E"), ord("N"), ord("D"))])
    for ch in "abEx":
        stream.token(1, ord(ch))
    assert (stream.statistics().held_back, stream.statistics().visible_tokens) == (0, 4)
    for ch in "yEN":
        stream.token(1, ord(ch))
    assert stream.statistics().held_back == 2, "E, N may still begin the stop sequence"
    stream.token(1, ord("D"))
    stream.close(outcome(FinishReason.STOP))
    result = stream.result(0)
    assert result.text == "abExy" and bytes(result.raw_tokens) == b"abExyEND"
    eos = StreamWriter(tokenizer=TOK)
    for t in (ord("h"), ord("i"), TOK.eos):
        eos.token(2, t)
    eos.close(outcome(FinishReason.STOP))
    assert eos.result(0).text == "hi" and eos.result(0).tokens == (ord("h"), ord("i"))
    length = StreamWriter(tokenizer=TOK, stop=[(ord("E"), ord("N"), ord("D"))])
    for ch in "okEN":
        length.token(3, ord(ch))
    length.close(outcome(FinishReason.LENGTH))
    assert length.result(0).text == "okEN", "a partial stop sequence is flushed when the request ends otherwise"


def test_a_thread_and_an_asyncio_task_consume_while_another_thread_writes() -> None:
    stream = StreamWriter(tokenizer=TOK)
    go = threading.Event()
    got_thread: list[int] = []

    def writer() -> None:
        go.wait(5)
        for b in b"streaming":
            stream.token(1, b)
        stream.close(outcome(FinishReason.LENGTH))

    def reader() -> None:
        for event in stream.events(timeout=5):
            got_thread.extend(event.tokens)

    async def consume() -> list[int]:
        tokens: list[int] = []
        go.set()
        async for event in stream.aevents():
            tokens.extend(event.tokens)
        return tokens

    threads = [threading.Thread(target=writer), threading.Thread(target=reader)]
    for t in threads:
        t.start()
    got_async = asyncio.run(asyncio.wait_for(consume(), 10))
    for t in threads:
        t.join(10)
    assert bytes(got_async) == bytes(got_thread) == b"streaming"
    with pytest.raises(TimeoutError):
        StreamWriter().result(timeout=0)
