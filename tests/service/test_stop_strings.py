"""Stop strings over HTTP, matched on the decoded text (issue #14: OpenAI and vLLM compatibility).

The served tiny model uses the bundled BPE tokenizer: its tokens are several characters long, so a stop
string the model writes may straddle a token boundary or sit inside one token. Each test first generates
greedily through the engine itself (the same tokens the API will produce), picks such a stop string from
the real token pieces, then asks the API — completions and chat, streaming and not — and checks: the
request ends with ``finish_reason`` "stop" and vLLM's ``stop_reason`` = the string, the text ends right
before it, the streamed chunks add up to the same text, and usage counts the tokens generated up to the
one completing it. A partial match at the end of generation is released as ordinary text.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

import pytest

from calculet.runtime.engine.types import GenerateRequest
from calculet.runtime.execution.sampler import SamplingParams
from calculet.runtime.streams.package_tokenizer import HfTokenizer
from calculet.runtime.streams.writer import StreamWriter
from tests.service.support import ALIAS, TENANT_KEYS, RunningServer

KEY = {"Authorization": f"Bearer {TENANT_KEYS['alpha']}"}
PROMPT = "stop here"
N = 24


@dataclass(frozen=True)
class Generated:
    """A greedy generation through the engine: its tokens, each token's text and the whole text."""

    ids: tuple[int, ...]
    parts: tuple[str, ...]
    text: str

    def boundary_stop(self) -> tuple[str, int]:
        """Two characters whose first occurrence straddles a token boundary; the completing token."""
        end = 0
        for i, part in enumerate(self.parts[:-1]):
            end += len(part)
            stop = self.text[end - 1:end + 1]
            if part and self.parts[i + 1] and "\ufffd" not in stop and self.text.find(stop) == end - 1:
                return stop, i + 1
        raise AssertionError(f"no token boundary to straddle in {self.parts!r}")

    def inner_stop(self) -> tuple[str, int]:
        """A string strictly inside one token's text (its first occurrence); that token."""
        start = 0
        for i, part in enumerate(self.parts):
            inner = part[1:-1]
            if len(part) >= 3 and "\ufffd" not in inner and self.text.find(inner) == start + 1:
                return inner, i
            start += len(part)
        raise AssertionError(f"no token of 3+ characters in {self.parts!r}")


def generate(server: RunningServer, kind: str) -> Generated:
    tok = server.service.tokenizer
    assert isinstance(tok, HfTokenizer), "the served model uses the bundled BPE package tokenizer"
    if kind == "completions":
        prompt = tuple(tok.encode(PROMPT, add_bos=True))
    else:
        prompt = tuple(tok.encode_chat(tok.chat_text([("user", PROMPT)])))
    stream = StreamWriter(tokenizer=tok)
    server.service.engine.submit(GenerateRequest(prompt, N, tenant="alpha", sampling=SamplingParams(ignore_eos=True)),
                                 stream)
    result = stream.result(30)
    det = tok.detokenizer()
    return Generated(result.raw_tokens, tuple(det.push(t) for t in result.raw_tokens), result.text)


def ask(server: RunningServer, kind: str, stop: str, *, stream: bool,
        max_tokens: int = N) -> tuple[str, dict[str, Any], dict[str, Any]]:
    """(text, final choice, usage) of one API request, streamed or not."""
    body: dict[str, Any] = {"model": ALIAS, "max_tokens": max_tokens, "temperature": 0, "ignore_eos": True,
                            "stop": ["\x00never", stop]}
    if kind == "completions":
        body["prompt"] = PROMPT
    else:
        body["messages"] = [{"role": "user", "content": PROMPT}]
    with server.http() as http:
        if not stream:
            response = http.post(f"/v1/{kind}", headers=KEY, json=body)
            assert response.status_code == 200, response.text
            out = response.json()
            choice = out["choices"][0]
            text = choice["text"] if kind == "completions" else choice["message"]["content"]
            return text, choice, out["usage"]
        body.update(stream=True, stream_options={"include_usage": True})
        with http.stream("POST", f"/v1/{kind}", headers=KEY, json=body) as sse:
            assert sse.status_code == 200
            chunks = [json.loads(line[6:]) for line in sse.iter_lines() if line.startswith("data: {")]
    texts, final = [], None
    for chunk in chunks:
        for choice in chunk["choices"]:
            piece = choice["text"] if kind == "completions" else choice["delta"].get("content")
            texts.append(piece or "")
            if choice.get("finish_reason") is not None:
                final = choice
    assert final is not None and chunks[-1]["usage"] is not None
    for i in range(1, len(texts) + 1):  # no chunk ever showed a character of the stop string
        assert stop not in "".join(texts[:i])
    return "".join(texts), final, chunks[-1]["usage"]


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
@pytest.mark.parametrize("kind", ["completions", "chat/completions"])
@pytest.mark.parametrize("where", ["boundary", "inside"])
def test_a_stop_string_on_the_decoded_text_stops_the_request(server: RunningServer, kind: str, stream: bool,
                                                             where: str) -> None:
    gen = generate(server, kind)
    stop, at = gen.boundary_stop() if where == "boundary" else gen.inner_stop()
    assert at < N - 1, "the stop completes before max_tokens, so only a match can end it with 'stop'"
    text, choice, usage = ask(server, kind, stop, stream=stream)
    assert text == gen.text[:gen.text.find(stop)], (gen.parts, stop)
    assert choice["finish_reason"] == "stop" and choice["stop_reason"] == stop
    assert usage["completion_tokens"] == at + 1, "every token generated, the stop's own included"


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
@pytest.mark.parametrize("kind", ["completions", "chat/completions"])
def test_a_partial_match_at_the_end_of_generation_is_released(server: RunningServer, kind: str,
                                                              stream: bool) -> None:
    gen = generate(server, kind)
    tail = gen.text[-2:]  # the text ends with the beginning of the stop string, which never completes
    assert len(tail) == 2, gen.text
    text, choice, usage = ask(server, kind, tail + "\x01", stream=stream)
    assert text == gen.text and choice["finish_reason"] == "length" and choice["stop_reason"] is None
    assert usage["completion_tokens"] == N


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
def test_a_stop_completed_by_the_last_allowed_token_is_a_stop(server: RunningServer, stream: bool) -> None:
    """The stop string completes exactly at max_tokens: OpenAI reports "stop" (the match), not "length"."""
    gen = generate(server, "completions")
    stop, at = gen.boundary_stop()
    text, choice, usage = ask(server, "completions", stop, stream=stream, max_tokens=at + 1)
    assert text == gen.text[:gen.text.find(stop)]
    assert (choice["finish_reason"], choice["stop_reason"], usage["completion_tokens"]) == ("stop", stop, at + 1)
