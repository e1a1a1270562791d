"""Stop strings matched on the decoded text with the bundled BPE tokenizer (issue #14; §3 StreamWriter).

The bundled package's tokenizer merges characters into multi-character tokens, so a stop string can be
generated across a token boundary or inside one token; token-id matching missed both. These tests pick
such stop strings from a text's actual token pieces and feed the tokens one by one, as the engine does.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest

from calculet.adapters.sim.bundled import build_bundled
from calculet.machines.request import FinishReason
from calculet.runtime.request import RequestOutcome
from calculet.runtime.streams.package_tokenizer import HfTokenizer, load_tokenizer
from calculet.runtime.streams.writer import StopTextMatcher, StreamFinish, StreamWriter

TEXT = "the scheduler serves KV lanes"


def outcome(reason: FinishReason) -> RequestOutcome:
    return RequestOutcome(1, "completed", reason, 0, 200)


@pytest.fixture(scope="module")
def tok(tmp_path_factory: pytest.TempPathFactory) -> HfTokenizer:
    path = tmp_path_factory.mktemp("bundled") / "pkg"
    build_bundled(path)
    manifest = (path / "manifest.json").read_bytes()
    loaded = load_tokenizer(path, manifest, hashlib.sha256(manifest).hexdigest())
    assert isinstance(loaded, HfTokenizer)
    return loaded


def pieces(tok: HfTokenizer, ids: list[int]) -> list[str]:
    """Each token's text as the incremental detokeniser gives it."""
    det = tok.detokenizer()
    return [det.push(t) for t in ids]


def boundary_stop(parts: list[str]) -> tuple[str, int]:
    """A 2-character stop string whose first occurrence straddles a token boundary, and the index of the
    token that completes it."""
    text = "".join(parts)
    end = 0
    for i, part in enumerate(parts[:-1]):
        end += len(part)
        if part and parts[i + 1]:
            stop = text[end - 1:end + 1]
            if text.find(stop) == end - 1:
                return stop, i + 1
    raise AssertionError(f"no token boundary to straddle in {parts!r}")


def inner_stop(parts: list[str]) -> tuple[str, int]:
    """A stop string strictly inside one token's text (first occurrence there), and that token's index."""
    text = "".join(parts)
    start = 0
    for i, part in enumerate(parts):
        if len(part) >= 3 and text.find(part[1:-1]) == start + 1:
            return part[1:-1], i
        start += len(part)
    raise AssertionError(f"no token of 3+ characters in {parts!r}")


def shown(stream: StreamWriter) -> str:
    """The text of every event emitted so far (without waiting)."""
    return "".join(stream.next_event(i, 0).text for i in range(stream.statistics().events))


def run(tok: HfTokenizer, ids: list[int], stops: list[str], *, stop_at: int | None,
        reason: FinishReason) -> tuple[StreamWriter, list[str]]:
    """Feed the tokens up to the one that completes a stop (as the sampler ends it there), then close."""
    stream = StreamWriter(tokenizer=tok, stop_text=stops)
    fed = ids if stop_at is None else ids[:stop_at + 1]
    for t in fed:
        stream.token(1, t)
    stream.close(outcome(reason))
    return stream, [e.text for e in stream.events(timeout=0)]


def test_the_bundled_tokenizer_merges_characters(tok: HfTokenizer) -> None:
    ids = tok.encode(TEXT, add_bos=False)
    assert len(ids) < len(TEXT) and "".join(pieces(tok, ids)) == TEXT


def test_a_stop_string_across_a_token_boundary_stops_and_is_not_shown(tok: HfTokenizer) -> None:
    ids = tok.encode(TEXT, add_bos=False)
    parts = pieces(tok, ids)
    stop, at = boundary_stop(parts)
    assert tuple(tok.encode(stop, add_bos=False)) not in {tuple(ids[i:i + n]) for n in (1, 2, 3)
                                                        for i in range(len(ids))}, "token ids would not match"
    stream, texts = run(tok, ids, ["\x00never", stop], stop_at=at, reason=FinishReason.STOP)
    result = stream.result(0)
    expected = TEXT[:TEXT.find(stop)]
    assert result.text == expected and "".join(texts) == expected
    assert stream.stop_matched == stop and result.finish_reason is StreamFinish.STOP
    assert len(result.raw_tokens) == at + 1
    assert result.tokens == tuple(ids[:at - 1]), "the two tokens holding the stop string are not visible"


def test_a_stop_string_inside_one_token_stops_and_is_not_shown(tok: HfTokenizer) -> None:
    ids = tok.encode(TEXT, add_bos=False)
    parts = pieces(tok, ids)
    stop, at = inner_stop(parts)
    stream, texts = run(tok, ids, [stop], stop_at=at, reason=FinishReason.STOP)
    result = stream.result(0)
    expected = TEXT[:TEXT.find(stop)]
    assert result.text == expected and "".join(texts) == expected and stream.stop_matched == stop
    assert result.tokens == tuple(ids[:at]), "the token holding the stop string is not visible"


def test_text_that_may_begin_a_stop_string_is_held_back_until_it_cannot(tok: HfTokenizer) -> None:
    """Streaming: no event ever shows a character of the stop string; a partial match that fails is shown."""
    ids = tok.encode(TEXT, add_bos=False)
    parts = pieces(tok, ids)
    stop, at = boundary_stop(parts)
    stream = StreamWriter(tokenizer=tok, stop_text=[stop])
    for i, t in enumerate(ids[:at]):
        stream.token(1, t)
        so_far = shown(stream)
        assert TEXT.startswith(so_far) and len(so_far) <= len("".join(parts[:i + 1]))
    assert shown(stream) == "".join(parts[:at])[:-1], "the stop string's first character is held back"
    assert stream.statistics().held_back >= 1


def test_a_partial_match_at_the_end_of_generation_is_released(tok: HfTokenizer) -> None:
    ids = tok.encode(TEXT, add_bos=False)
    stop = TEXT[-3:] + "\x01"
    stream = StreamWriter(tokenizer=tok, stop_text=[stop])
    for t in ids:
        stream.token(1, t)
    assert shown(stream) == TEXT[:-3], "the tail that may begin the stop string is held back"
    stream.close(outcome(FinishReason.LENGTH))
    result = stream.result(0)
    assert result.text == TEXT and result.tokens == tuple(ids) and stream.stop_matched is None
    assert result.finish_reason is StreamFinish.LENGTH


def test_eos_ends_a_stream_with_stop_strings_and_is_hidden(tok: HfTokenizer) -> None:
    ids = tok.encode(TEXT, add_bos=False)
    stream = StreamWriter(tokenizer=tok, stop_text=["\x00never"])
    for t in (*ids, tok.eos):
        stream.token(1, t)
    stream.close(outcome(FinishReason.STOP))
    result = stream.result(0)
    assert result.text == TEXT and result.tokens == tuple(ids) and stream.stop_matched is None


def test_stop_strings_need_a_tokenizer_and_exclude_token_id_stops(tok: HfTokenizer) -> None:
    with pytest.raises(ValueError):
        StreamWriter(stop_text=["x"])
    with pytest.raises(ValueError):
        StreamWriter(tokenizer=tok, stop=[(1, 2)], stop_text=["x"])


def test_the_matcher_finds_the_earliest_stop_and_holds_only_possible_starts() -> None:
    m = StopTextMatcher(["low", "ow!"])
    assert m.feed("hel") == "he" and m.held == 1, "'l' may begin 'low'"
    assert m.feed("lo") == "l" and m.held == 2, "'lo' may begin 'low'"
    assert m.feed(" w") == "lo w" and m.held == 0, "'lo w' ends with no beginning of a stop string"
    assert m.feed("o") == "" and m.held == 1, "'o' may begin 'ow!'"
    assert m.flush() == "o" and m.matched is None, "at the end a partial match is text"
    m2 = StopTextMatcher(["ow!", "low"])
    assert m2.feed("xlow!") == "x" and m2.matched == "low", "the earliest occurrence wins"
    assert m2.feed("more") == "" and m2.flush() == ""
    with pytest.raises(ValueError):
        StopTextMatcher([""])
