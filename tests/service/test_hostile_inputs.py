"""The HTTP edge under hostile and careless clients (issue #14, R5.2.3, R16.10).

Every client input is a 4xx in the OpenAI error shape naming the field the client wrote, with an
``x-request-id`` on the answer — never a 5xx — and the process serves afterwards. Surrogates in
every text field, extreme floats, wrong JSON types, deep nesting, huge and chunked bodies,
half-sent headers and slow bodies, against a server of its own whose limits are small
(``max_body_bytes`` 64 KiB, header and body timeouts 0.5 s) so that nothing here waits long.
Timeouts are observed as their effect (a 408 and a closed socket), never as a measured duration.
"""

from __future__ import annotations

import json
import logging
import re
import select
import socket
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
import httpx
import pytest

from calculet.server import body_gate

from tests.service.support import ALIAS, TENANT_KEYS, RunningServer, service_config, start_server

MAX_BODY = 64 * 1024
KEY = {"Authorization": f"Bearer {TENANT_KEYS['alpha']}"}
SURROGATE = "\ud800"


@pytest.fixture(scope="module")
def edge(key_dir: Path) -> Iterator[RunningServer]:
    config = service_config(server={"max_body_bytes": MAX_BODY, "header_timeout_s": 0.5, "body_timeout_s": 0.5,
                                    "body_min_rate_bytes_s": 100.0})
    running = start_server(config, key_dir)
    yield running
    running.stop()


class Statuses:
    """Every answer of a test, so that one assertion covers 'no response >= 500'."""

    def __init__(self) -> None:
        self.seen: list[tuple[str, int]] = []

    def note(self, label: str, response: httpx.Response) -> httpx.Response:
        self.seen.append((label, response.status_code))
        assert response.headers.get("x-request-id"), (label, response.headers)
        return response

    def assert_no_5xx(self) -> None:
        assert [s for s in self.seen if s[1] >= 500] == [], self.seen


def _post(http: httpx.Client, path: str, body: Any) -> httpx.Response:
    raw = body if isinstance(body, bytes) else json.dumps(body).encode()  # ensure_ascii: "\ud800" stays an escape
    return http.post(path, content=raw, headers={**KEY, "Content-Type": "application/json"})


def _served(server: RunningServer) -> None:
    """The process still serves a completion."""
    with server.http() as http:
        ok = _post(http, "/v1/completions", {"model": ALIAS, "prompt": "still here", "max_tokens": 2})
    assert ok.status_code == 200 and ok.json()["choices"][0]["finish_reason"] in ("length", "stop")


COMPLETION = {"model": ALIAS, "prompt": "x", "max_tokens": 2}
CHAT = {"model": ALIAS, "messages": [{"role": "user", "content": "x"}], "max_tokens": 2}
SURROGATE_CASES: list[tuple[str, dict[str, Any], str]] = [
    ("/v1/completions", {**COMPLETION, "prompt": f"a{SURROGATE}b"}, "prompt"),
    ("/v1/completions", {**COMPLETION, "prompt": ["\udfff"]}, "prompt.0"),
    ("/v1/completions", {**COMPLETION, "stop": SURROGATE}, "stop"),
    ("/v1/completions", {**COMPLETION, "stop": ["ok", SURROGATE]}, "stop.1"),
    ("/v1/completions", {**COMPLETION, "model": SURROGATE}, "model"),
    ("/v1/completions", {**COMPLETION, "user": SURROGATE}, "user"),
    ("/v1/completions", {**COMPLETION, "metadata": {"k": SURROGATE}}, "metadata.k"),
    ("/v1/completions", {**COMPLETION, "service_tier": SURROGATE}, "service_tier"),
    ("/v1/chat/completions", {**CHAT, "messages": [{"role": "user", "content": "\udfff"}]}, "messages.0.content"),
    ("/v1/chat/completions", {**CHAT, "messages": [{"role": "user", "content": [{"type": "text", "text": SURROGATE}]}]},
     "messages.0.content.0.text"),
    ("/v1/chat/completions", {**CHAT, "messages": [{"role": "user", "content": "x", "name": SURROGATE}]},
     "messages.0.name"),
    ("/v1/chat/completions", {**CHAT, "stop": [SURROGATE]}, "stop.0"),
    ("/v1/completions", {**COMPLETION, "prompt_cache_key": SURROGATE}, "prompt_cache_key"),
    ("/v1/completions", {**COMPLETION, "safety_identifier": SURROGATE}, "safety_identifier"),
    ("/v1/chat/completions", {**CHAT, "messages": [{"role": SURROGATE, "content": "x"}]}, "messages.0.role"),
    ("/v1/chat/completions", {**CHAT, "messages": [{"role": "user", "content": [{"type": SURROGATE, "text": "x"}]}]},
     "messages.0.content.0.type"),
    ("/v1/chat/completions", {**CHAT, "tool_choice": SURROGATE}, "tool_choice"),
    ("/v1/chat/completions", {**CHAT, "response_format": {"type": SURROGATE}}, "response_format.type"),
    # in a key: the error names the key, written as its escape (naming it raw made the error itself a 500)
    ("/v1/completions", {**COMPLETION, "metadata": {SURROGATE: "v"}}, "metadata.\\ud800"),
    ("/v1/completions", {**COMPLETION, "logit_bias": {SURROGATE: 1.0}}, "logit_bias.\\ud800"),
    ("/v1/completions", {**COMPLETION, "stream_options": {SURROGATE: True}}, "stream_options.\\ud800"),
    ("/v1/completions", {**COMPLETION, SURROGATE: 1}, "\\ud800"),
    ("/v1/chat/completions", {**CHAT, "messages": [{"role": "user", "content": "x", SURROGATE: "y"}]},
     "messages.0.\\ud800"),
]


@pytest.mark.req("R5.2.3")
@pytest.mark.parametrize("stream", [False, True])
def test_lone_surrogates_in_every_text_field_are_400_naming_the_field(edge: RunningServer, stream: bool) -> None:
    statuses = Statuses()
    with edge.http() as http:  # one keep-alive connection for all: none may be reset
        for path, body, param in SURROGATE_CASES:
            response = statuses.note(param, _post(http, path, {**body, "stream": stream}))
            error = response.json()["error"]
            assert response.status_code == 400, (param, response.text)
            assert (error["code"], error["param"]) == ("invalid_unicode", param), error
    statuses.assert_no_5xx()
    _served(edge)


def test_surrogate_pairs_and_raw_surrogate_bytes(edge: RunningServer) -> None:
    """A surrogate *pair* is one character (😀) and is served; a surrogate written as raw UTF-8 bytes (CESU) is
    the same lone surrogate, named by its field; other invalid UTF-8 is invalid JSON."""
    with edge.http() as http:
        paired = [_post(http, "/v1/completions", {**COMPLETION, "prompt": "\U0001f600 ok", "stop": "\U0001f600"}),
                  _post(http, "/v1/chat/completions", {**CHAT, "messages": [{"role": "user", "content": "\U0001f600"}]})]
        cesu = _post(http, "/v1/completions", b'{"model": "tiny", "prompt": "\xed\xa0\x80"}')
        invalid = _post(http, "/v1/completions", b'{"model": "tiny", "prompt": "\xff"}')
    assert [r.status_code for r in paired] == [200, 200], [r.text for r in paired]
    assert cesu.status_code == 400 and (cesu.json()["error"]["code"], cesu.json()["error"]["param"]) == (
        "invalid_unicode", "prompt")
    assert invalid.status_code == 400 and invalid.json()["error"]["code"] == "invalid_json"


@pytest.mark.req("R5.2.3")
def test_extreme_floats_are_served_greedily_or_refused(edge: RunningServer) -> None:
    """temperature 1e-308 used to end in 500 'no usable output token': below 1e-5 is greedy (as vLLM)."""
    statuses = Statuses()
    greedy = {"model": ALIAS, "prompt": "float", "max_tokens": 6, "ignore_eos": True}
    with edge.http() as http:
        baseline = statuses.note("t=0", _post(http, "/v1/completions", {**greedy, "temperature": 0})).json()
        for tiny in (1e-308, 1e-310, 5e-324, 9.9e-6):
            for stream in (False, True):
                response = statuses.note(f"t={tiny}", _post(http, "/v1/completions",
                                                             {**greedy, "temperature": tiny, "stream": stream}))
                assert response.status_code == 200, (tiny, response.text)
                if not stream:
                    assert response.json()["choices"][0]["text"] == baseline["choices"][0]["text"]
        top = statuses.note("top_p", _post(http, "/v1/completions", {**greedy, "temperature": 1.0, "top_p": 5e-324}))
        assert top.status_code == 200
        for field, raw in (("temperature", b"1e308"), ("temperature", b"NaN"), ("top_p", b"Infinity"),
                           ("temperature", b"-1e-320"), ("seed", b"1e400"), ("max_tokens", b"1e3")):
            body = b'{"model": "%s", "prompt": "x", "%s": %s}' % (ALIAS.encode(), field.encode(), raw)
            response = statuses.note(field, _post(http, "/v1/completions", body))
            assert response.status_code == 400, (field, raw, response.text)
            error = response.json()["error"]
            assert error["param"] in (field, None) and error["type"] == "invalid_request_error", error
        for field, raw in (("max_tokens", b"1" + b"0" * 30), ("max_tokens", b"9223372036854775808"),
                           ("seed", b"18446744073709551616"), ("top_k", b"-1"), ("max_tokens", b"-0"),
                           ("prompt", b"[18446744073709551616]"), ("max_tokens", b"1" + b"0" * 5000)):
            body = b'{"model": "%s", "prompt": "x", "%s": %s}' % (ALIAS.encode(), field.encode(), raw)
            if field == "prompt":
                body = b'{"model": "%s", "prompt": %s}' % (ALIAS.encode(), raw)
            response = statuses.note(field, _post(http, "/v1/completions", body))
            assert response.status_code == 400 and response.json()["error"]["param"] in (field, None), response.text
        for raw in (b"-0.0", b"1e-400", b"0." + b"0" * 5000 + b"1"):  # zero, an underflow to zero, a tiny number
            body = b'{"model": "%s", "prompt": "x", "max_tokens": 2, "temperature": %s}' % (ALIAS.encode(), raw)
            assert statuses.note("temperature", _post(http, "/v1/completions", body)).status_code == 200
    statuses.assert_no_5xx()


WRONG_TYPES: list[tuple[str, dict[str, Any], str]] = [
    ("/v1/completions", {**COMPLETION, "max_tokens": "16"}, "max_tokens"),
    ("/v1/completions", {**COMPLETION, "max_tokens": True}, "max_tokens"),
    ("/v1/completions", {**COMPLETION, "max_tokens": 2.5}, "max_tokens"),
    ("/v1/completions", {**COMPLETION, "stream": "yes"}, "stream"),
    ("/v1/completions", {**COMPLETION, "stream": 1}, "stream"),
    ("/v1/completions", {**COMPLETION, "temperature": "0.5"}, "temperature"),
    ("/v1/completions", {**COMPLETION, "seed": "7"}, "seed"),
    ("/v1/completions", {**COMPLETION, "model": 5}, "model"),
    ("/v1/completions", {**COMPLETION, "prompt": 5}, "prompt"),
    ("/v1/completions", {**COMPLETION, "prompt": [1, "a"]}, "prompt.1"),
    ("/v1/completions", {**COMPLETION, "stop": 5}, "stop"),
    ("/v1/completions", {**COMPLETION, "stop": [5]}, "stop.0"),
    ("/v1/completions", {**COMPLETION, "stream_options": {"include_usage": "true"}}, "stream_options.include_usage"),
    ("/v1/completions", {**COMPLETION, "ignore_eos": 0}, "ignore_eos"),
    ("/v1/chat/completions", {**CHAT, "messages": {"role": "user"}}, "messages"),
    ("/v1/chat/completions", {**CHAT, "messages": [{"role": "user", "content": 5}]}, "messages.0.content"),
    ("/v1/chat/completions", {**CHAT, "max_completion_tokens": "2"}, "max_completion_tokens"),
]


@pytest.mark.req("R5.2.3")
def test_wrong_json_types_are_refused_not_coerced(edge: RunningServer) -> None:
    statuses = Statuses()
    with edge.http() as http:
        for path, body, param in WRONG_TYPES:
            response = statuses.note(param, _post(http, path, body))
            assert response.status_code == 400, (param, response.text)
            error = response.json()["error"]
            assert error["param"] == param, (body, error)
            assert "-str" not in error["message"] and "constrained" not in error["message"], error
        for body in (b"[]", b'"text"', b"17", b"null", b"{", b"\xff\xfe", b""):
            response = statuses.note(repr(body), _post(http, "/v1/completions", body))
            assert response.status_code == 400 and response.json()["error"]["code"] == "invalid_json", body
    statuses.assert_no_5xx()


@pytest.mark.req("R5.2.3")
def test_deep_nesting_is_400(edge: RunningServer) -> None:
    statuses = Statuses()
    depth = 5_000  # under the body limit, far over any parser's recursion limit
    with edge.http() as http:
        for body in (b'{"model": "tiny", "prompt": ' + b"[" * depth + b"]" * depth + b"}",
                     b'{"model": "tiny", "prompt": "x", "metadata": ' + b'{"a":' * depth + b"1" + b"}" * depth + b"}",
                     b"[" * depth + b"]" * depth):
            response = statuses.note("deep", _post(http, "/v1/completions", body))
            assert response.status_code == 400, response.text[:200]
    statuses.assert_no_5xx()
    _served(edge)


def _chunks(total: int, piece: int = 16 * 1024) -> Iterator[bytes]:
    yield b'{"model": "tiny", "prompt": "'
    sent = 0
    while sent < total:
        yield b"a" * piece
        sent += piece
    yield b'"}'


@pytest.mark.req("R5.2.3")
def test_huge_bodies_chunked_or_declared_are_413_and_unauthenticated_ones_401_unread(edge: RunningServer) -> None:
    statuses = Statuses()
    for headers in ({**KEY}, {}):
        with edge.http() as http:
            try:
                response = http.post("/v1/completions", content=_chunks(MAX_BODY * 64),
                                     headers={**headers, "Content-Type": "application/json"})
            except httpx.TransportError:  # the server closed while the client was still sending: refused unread
                continue
            statuses.note("chunked", response)
            assert response.status_code == (413 if headers else 401), response.text
            assert response.headers["connection"] == "close"
    with socket.create_connection(("127.0.0.1", edge.port), timeout=30) as sock:
        sock.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: t\r\nContent-Type: application/json\r\n"
                     b"Authorization: Bearer %s\r\nContent-Length: 900000000\r\n\r\n" % TENANT_KEYS["alpha"].encode())
        answer = _read_all(sock)
    assert answer.startswith(b"HTTP/1.1 413") and b"body_too_large" in answer and b"x-request-id" in answer
    with edge.http() as http:  # exactly at the limit: read, parsed, answered (a prompt beyond the context)
        body = b'{"model": "tiny", "prompt": "' + b"a" * (MAX_BODY - 40) + b'"}'
        response = statuses.note("at limit", _post(http, "/v1/completions", body))
        assert len(body) <= MAX_BODY and response.status_code == 400
        assert response.json()["error"]["code"] == "context_length_exceeded"
    statuses.assert_no_5xx()
    _served(edge)


def _read_all(sock: socket.socket) -> bytes:
    """Everything the server sends until it closes (each recv bounded by the socket's timeout)."""
    data = b""
    while True:
        chunk = sock.recv(65536)
        if not chunk:
            return data
        data += chunk


class HttpLines(logging.Handler):
    """The service's ``http`` log lines as they are written (from the server's thread), waited for by request id."""

    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.lines: dict[str, logging.LogRecord] = {}
        self.written = threading.Condition()

    def emit(self, record: logging.LogRecord) -> None:
        if record.getMessage() == "http":
            with self.written:
                self.lines[str(getattr(record, "request_id", ""))] = record
                self.written.notify_all()

    def line(self, request_id: str) -> logging.LogRecord:
        """The line of ``request_id`` (the 30 s bound is a hang guard: it is written before or just after the answer)."""
        with self.written:
            assert self.written.wait_for(lambda: request_id in self.lines, timeout=30), request_id
            return self.lines[request_id]


@pytest.fixture
def http_lines() -> Iterator[HttpLines]:
    logger = logging.getLogger("calculet.server")
    handler, level = HttpLines(), logger.level
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    yield handler
    logger.removeHandler(handler)
    logger.setLevel(level)


def _raw_answer(port: int, *pieces: bytes) -> tuple[int, dict[str, str], bytes]:
    """``pieces`` sent on a fresh connection; the answer's status, headers and body once the server closes."""
    with socket.create_connection(("127.0.0.1", port), timeout=30) as sock:
        try:
            for piece in pieces:
                sock.sendall(piece)
        except OSError:  # the server refused and closed while we were still sending
            pass
        answer = _read_all(sock)
    head, _, body = answer.partition(b"\r\n\r\n")
    status_line, *header_lines = head.decode("latin-1").split("\r\n")
    headers = dict((k.strip().lower(), v.strip()) for k, _, v in (line.partition(":") for line in header_lines))
    return int(status_line.split()[1]), headers, body


AUTH = b"Authorization: Bearer " + TENANT_KEYS["alpha"].encode() + b"\r\n"
PROTOCOL_ERRORS: list[tuple[str, tuple[bytes, ...], int, str, str]] = [
    ("malformed request line", (b"GARBAGE\r\n\r\n",), 400, "malformed_request", "request line"),
    ("request line without version", (b"GET /health/live\r\n\r\n",), 400, "malformed_request", "request line"),
    ("non-ASCII target", (b"GET /h\xc3\xa9alth HTTP/1.1\r\nHost: t\r\n\r\n",), 400, "malformed_request",
     "request line"),
    ("header without a colon", (b"GET /health/live HTTP/1.1\r\nHost: t\r\nno colon here\r\n\r\n",), 400,
     "malformed_request", "header line"),
    ("space in a header name", (b"GET /health/live HTTP/1.1\r\nHost: t\r\nBad Header: x\r\n\r\n",), 400,
     "malformed_request", "header line"),
    ("HTTP/1.1 without Host", (b"GET /health/live HTTP/1.1\r\n\r\n",), 400, "malformed_request", "Host"),
    ("Content-Length not a number", (b"POST /v1/completions HTTP/1.1\r\nHost: t\r\nContent-Length: 1e3\r\n\r\n",),
     400, "malformed_request", "Content-Length"),
    ("two different Content-Lengths", (b"POST /v1/completions HTTP/1.1\r\nHost: t\r\nContent-Length: 3\r\n"
                                       b"Content-Length: 4\r\n\r\n{}",), 400, "malformed_request", "Content-Length"),
    ("a transfer coding other than chunked", (b"POST /v1/completions HTTP/1.1\r\nHost: t\r\n"
                                              b"Transfer-Encoding: gzip\r\n\r\n",), 400,
     "unsupported_transfer_encoding", "Transfer-Encoding"),
    ("headers growing past server.max_header_bytes", (b"GET /health/live HTTP/1.1\r\nHost: t\r\nX-Big: "
                                                      + b"a" * (40 * 1024),), 431, "headers_too_large",
     "server.max_header_bytes"),
    ("whole headers past server.max_header_bytes", (b"GET /health/live HTTP/1.1\r\nHost: t\r\nX-Big: "
                                                    + b"a" * (20 * 1024) + b"\r\n\r\n",), 431, "headers_too_large",
     "server.max_header_bytes"),
    ("whole headers past the limit, with a body", (b"POST /v1/completions HTTP/1.1\r\nHost: t\r\n" + AUTH
                                                   + b"X-Big: " + b"a" * (20 * 1024)
                                                   + b"\r\nContent-Length: 2\r\n\r\n{}",), 431,
     "headers_too_large", "server.max_header_bytes"),
]


@pytest.mark.req("R5.2.3")
@pytest.mark.req("R16.10")
@pytest.mark.parametrize("label,pieces,status,code,says", PROTOCOL_ERRORS, ids=[c[0] for c in PROTOCOL_ERRORS])
def test_bytes_that_are_not_http_are_refused_with_a_request_id_and_a_line_saying_why(
        edge: RunningServer, http_lines: HttpLines, label: str, pieces: tuple[bytes, ...], status: int, code: str,
        says: str) -> None:
    """What h11 refuses never reaches the app: uvicorn answered a plain-text 400 without an id, logged only
    'Invalid HTTP request received.', and said 501 for a transfer coding. The edge's protocol answers in the
    error shape with a server-generated x-request-id and logs h11's reason under that id (issue #14)."""
    got, headers, body = _raw_answer(edge.port, *pieces)
    assert got == status < 500, (label, got, body)
    error = json.loads(body)["error"]
    assert error["code"] == code and error["type"] == "invalid_request_error", error
    request_id = headers["x-request-id"]
    assert re.fullmatch(r"[0-9a-f]{32}", request_id) and headers["connection"] == "close"
    line = http_lines.line(request_id)
    assert (line.status, line.code) == (status, code)  # type: ignore[attr-defined]
    assert says.lower() in line.reason.lower() and line.reason == error["message"]  # type: ignore[attr-defined]
    _served(edge)


@pytest.mark.req("R5.2.3")
@pytest.mark.req("R16.10")
def test_a_broken_chunk_inside_a_body_is_400_with_the_requests_own_id_and_one_line(
        edge: RunningServer, http_lines: HttpLines) -> None:
    """The request was parsed, so the app has it (and its id): the protocol's 400 carries that id, and the request's
    one line says 400 with h11's reason — not the 'client closed' 500 it was counted as. Twice: all bytes at once
    (refused before the app runs), and after the app is reading the body (uvicorn's '100 Continue' says so)."""
    head = b"POST /v1/completions HTTP/1.1\r\nHost: t\r\n" + AUTH + b"Transfer-Encoding: chunked\r\n"
    broken = b"5\r\n{\"mod\r\nel\": \"tiny\"}\r\n"  # a chunk, then data where the next size line belongs
    answers = [_raw_answer(edge.port, head + b"\r\n" + broken)]
    with socket.create_connection(("127.0.0.1", edge.port), timeout=30) as sock:
        sock.sendall(head + b"Expect: 100-continue\r\n\r\n")
        interim = b""
        while not interim.endswith(b"\r\n\r\n"):
            interim += sock.recv(1)
        assert interim.startswith(b"HTTP/1.1 100"), interim
        sock.sendall(broken)
        head_bytes, _, body = _read_all(sock).partition(b"\r\n\r\n")
        lines = head_bytes.decode("latin-1").split("\r\n")
        answers.append((int(lines[0].split()[1]), dict((k.strip().lower(), v.strip()) for k, _, v in
                                                       (line.partition(":") for line in lines[1:])), body))
    for status, headers, body in answers:
        assert status == 400 and json.loads(body)["error"]["code"] == "malformed_request", body
        line = http_lines.line(headers["x-request-id"])
        assert (line.status, line.code) == (400, "malformed_request")  # type: ignore[attr-defined]
        assert line.method == "POST" and "chunk" in line.reason  # type: ignore[attr-defined]
    assert [r for r in list(http_lines.lines.values()) if r.status >= 500] == []  # type: ignore[attr-defined]
    _served(edge)


@pytest.mark.req("R16.10")
def test_a_client_that_closes_while_sending_its_body_is_logged_499_not_500(edge: RunningServer,
                                                                          http_lines: HttpLines) -> None:
    with socket.create_connection(("127.0.0.1", edge.port), timeout=30) as sock:
        sock.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: t\r\n" + AUTH + b"X-Request-Id: closer-1\r\n"
                     b"Content-Length: 1000\r\n\r\n{\"model\"")
    with http_lines.written:
        assert http_lines.written.wait_for(
            lambda: any(getattr(r, "client_request_id", None) == "closer-1" for r in http_lines.lines.values()), 30)
        line = next(r for r in http_lines.lines.values() if getattr(r, "client_request_id", None) == "closer-1")
    assert (line.status, line.code) == (499, "client_closed_request")  # type: ignore[attr-defined]
    _served(edge)


@pytest.mark.req("R5.2.3")
@pytest.mark.parametrize("half", [b"POST /v1/comple", b"POST /v1/completions HTTP/1.1\r\nHost: t\r\nAuthoriz",
                                  b"GET /health/live HTTP/1.1\r\nHost: t\r\n"])
def test_a_half_sent_request_is_closed_within_the_header_timeout(edge: RunningServer, http_lines: HttpLines,
                                                                 half: bytes) -> None:
    """server.header_timeout_s 0.5: the server answers 408 with a request id, logs why, and closes; the socket's
    own 30 s timeout would fail the test first if it did not."""
    status, headers, body = _raw_answer(edge.port, half)
    assert status == 408 and json.loads(body)["error"]["code"] == "header_timeout"
    line = http_lines.line(headers["x-request-id"])
    assert (line.status, line.code) == (408, "header_timeout")  # type: ignore[attr-defined]
    assert "server.header_timeout_s" in line.reason  # type: ignore[attr-defined]
    _served(edge)


def test_a_half_sent_second_request_on_a_keep_alive_connection_is_closed_too(edge: RunningServer) -> None:
    with socket.create_connection(("127.0.0.1", edge.port), timeout=30) as sock:
        sock.sendall(b"GET /health/live HTTP/1.1\r\nHost: t\r\n\r\n")
        first = b""
        while not first.endswith(b"}"):  # the whole JSON answer (headers and body may come apart)
            first += sock.recv(65536)
        assert first.startswith(b"HTTP/1.1 200")
        sock.sendall(b"GET /health/live HTTP/1.1\r\nHo")
        answer = _read_all(sock)
    assert answer.startswith(b"HTTP/1.1 408")


def _trickle(port: int, head: bytes, trickled: bytes) -> tuple[bytes, int]:
    """``head``, then ``trickled`` one byte at a time, each after waiting up to 0.1 s for the server to answer;
    the answer and how many trickled bytes went out before it."""
    with socket.create_connection(("127.0.0.1", port), timeout=30) as sock:
        sock.sendall(head)
        sent = 0
        for byte in trickled:
            if select.select([sock], [], [], 0.1)[0]:
                break  # the server answered (or closed)
            try:
                sock.sendall(bytes([byte]))
            except OSError:
                break
            sent += 1
        return _read_all(sock), sent


@pytest.mark.req("R5.2.3")
@pytest.mark.parametrize("part", ["headers", "body"])
def test_a_request_trickled_a_byte_at_a_time_is_cut_off(edge: RunningServer, http_lines: HttpLines,
                                                        part: str) -> None:
    """Each pause (0.1 s) is under the timeouts (0.5 s): headers are timed once per request, not per byte, and a
    body must keep server.body_min_rate_bytes_s (100 B/s here) on average after one pause's grace. Trickling
    10 000 bytes at most 10 B/s would take over 15 minutes; the server answers 408 long before."""
    head = b"POST /v1/completions HTTP/1.1\r\nHost: t\r\nContent-Type: application/json\r\n" + AUTH
    if part == "headers":
        answer, sent = _trickle(edge.port, b"", head + b"X-Pad: " + b"a" * 10_000)
        code = b"header_timeout"
    else:
        answer, sent = _trickle(edge.port, head + b"Content-Length: 10030\r\n\r\n",
                                b'{"model": "tiny", "prompt": "' + b"a" * 10_000 + b'"}')
        code = b"body_too_slow"
    assert answer.startswith(b"HTTP/1.1 408") and code in answer and sent < 10_000, (answer[:300], sent)
    request_id = next(line.split(b":", 1)[1].strip() for line in answer.split(b"\r\n")
                      if line.lower().startswith(b"x-request-id:"))
    line = http_lines.line(request_id.decode())
    assert (line.status, line.code) == (408, code.decode())  # type: ignore[attr-defined]
    _served(edge)


@pytest.mark.req("R5.2.3")
@pytest.mark.parametrize("framing", [b"Content-Length: 100\r\n\r\n{\"model\"",
                                     b"Transfer-Encoding: chunked\r\n\r\n8\r\n{\"model\"\r\n"])
def test_a_slow_body_is_408_and_closed(edge: RunningServer, http_lines: HttpLines, framing: bytes) -> None:
    status, headers, body = _raw_answer(edge.port, b"POST /v1/completions HTTP/1.1\r\nHost: t\r\n"
                                                   b"Content-Type: application/json\r\n" + AUTH + framing)
    assert status == 408 and json.loads(body)["error"]["code"] == "body_timeout" and headers["connection"] == "close"
    line = http_lines.line(headers["x-request-id"])
    assert (line.status, line.code, line.route) == (408, "body_timeout", "unmatched")  # type: ignore[attr-defined]
    assert "paused" in line.reason  # type: ignore[attr-defined]
    _served(edge)


def test_an_unexpected_error_is_a_500_with_the_request_id_and_the_connection_survives(
        edge: RunningServer, monkeypatch: pytest.MonkeyPatch) -> None:
    def broken(model: str) -> None:
        raise RuntimeError("injected")

    with edge.http() as http:
        monkeypatch.setattr(edge.service, "check_model", broken)
        failed = _post(http, "/v1/completions", COMPLETION)
        monkeypatch.undo()
        after = _post(http, "/v1/completions", COMPLETION)  # the same keep-alive connection
    assert failed.status_code == 500 and failed.json()["error"]["code"] == "internal_error"
    assert failed.headers["x-request-id"] and after.status_code == 200


def test_4xx_log_lines_say_why_and_framework_routes_are_named(edge: RunningServer,
                                                              caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.INFO, logger="calculet.server"), edge.http() as http:
        bad = _post(http, "/v1/completions", {**COMPLETION, "max_tokens": "16"})
        docs = http.get("/openapi.json")
    lines = {getattr(r, "request_id", None): r for r in caplog.records if r.getMessage() == "http"}
    line = lines[bad.headers["x-request-id"]]
    assert (line.status, line.code, line.route) == (400, "invalid_value", "/v1/completions")  # type: ignore[attr-defined]
    assert "max_tokens" in line.reason  # type: ignore[attr-defined]
    assert lines[docs.headers["x-request-id"]].route == "/openapi.json"  # type: ignore[attr-defined]


def test_known_openai_fields_that_do_not_change_generation_are_accepted(edge: RunningServer) -> None:
    ignored = {"store": False, "metadata": {"run": "1"}, "user": "u-1", "service_tier": "auto",
               "prompt_cache_key": "k", "safety_identifier": "s"}
    with edge.http() as http:
        plain = _post(http, "/v1/completions", {**COMPLETION, **ignored, "temperature": 0})
        chat = _post(http, "/v1/chat/completions", {**CHAT, **ignored, "parallel_tool_calls": True,
                                                    "n": 1, "presence_penalty": 0, "logit_bias": {}, "tools": []})
        unknown = _post(http, "/v1/completions", {**COMPLETION, "frobnicate": 1})
        refused = _post(http, "/v1/chat/completions", {**CHAT, "top_logprobs": 2})
    assert plain.status_code == 200 and chat.status_code == 200, (plain.text, chat.text)
    assert unknown.status_code == 400 and unknown.json()["error"]["param"] == "frobnicate"
    assert refused.json()["error"]["code"] == "unsupported_parameter" and "top_logprobs" in refused.text


def test_vllm_and_openai_surface_health_model_card_usage_and_responses(edge: RunningServer) -> None:
    greedy = {"model": ALIAS, "prompt": "stop here", "max_tokens": 12, "temperature": 0, "ignore_eos": True}
    with edge.http() as http:
        health = http.get("/health")
        card = http.get(f"/v1/models/{ALIAS}", headers=KEY)
        missing = http.get("/v1/models/nope", headers=KEY)
        responses = http.post("/v1/responses", headers=KEY, json={"model": ALIAS, "input": "hi"})
        with http.stream("POST", "/v1/completions", headers=KEY,
                         json={**greedy, "stream": True,
                               "stream_options": {"continuous_usage_stats": True, "include_usage": True}}) as sse:
            chunks = [json.loads(line[6:]) for line in sse.iter_lines() if line.startswith("data: {")]
    assert health.status_code == 200 and card.json()["id"] == ALIAS and missing.status_code == 404
    assert responses.status_code == 404 and "/v1/chat/completions" in responses.json()["error"]["message"]
    counts = [c["usage"]["completion_tokens"] for c in chunks]
    assert all("usage" in c for c in chunks) and counts == sorted(counts) and counts[-1] == 12
    assert chunks[-2]["choices"][0]["finish_reason"] == "length" and chunks[-2]["choices"][0]["stop_reason"] is None


def test_stop_reason_names_the_stop_string_that_ended_the_choice(edge: RunningServer) -> None:
    """vLLM's stop_reason: the stop string that ended the choice (null for EOS or length). A chunk's text is one
    or a few generated tokens; the first whose text stops the same greedy generation is the stop string."""
    greedy = {"model": ALIAS, "prompt": "stop here", "max_tokens": 12, "temperature": 0, "ignore_eos": True}
    with edge.http() as http:
        with http.stream("POST", "/v1/completions", headers=KEY, json={**greedy, "stream": True}) as sse:
            texts = [json.loads(line[6:])["choices"][0]["text"] for line in sse.iter_lines()
                     if line.startswith("data: {")]
        stopped = []
        for text in dict.fromkeys(t for t in texts[1:] if t and "\ufffd" not in t):
            for kind in ("completions", "chat/completions"):
                body = {**greedy, "stop": ["\x00never", text]}
                if kind != "completions":
                    body = {k: v for k, v in body.items() if k != "prompt"}
                    body["messages"] = [{"role": "user", "content": "stop here"}]
                choice = _post(http, f"/v1/{kind}", body).json()["choices"][0]
                if choice["finish_reason"] == "stop":
                    stopped.append((kind, text, choice["stop_reason"]))
                else:
                    assert choice["stop_reason"] is None, choice
    assert stopped and all(reason == text for _, text, reason in stopped), (texts, stopped)


def test_hostile_admin_bodies_are_400_naming_the_field(edge: RunningServer) -> None:
    """The admin API's load body too: a NUL in a path used to reach the file system (500 'embedded null byte')."""
    statuses = Statuses()
    headers = {**edge.admin_headers(), "Content-Type": "application/json"}
    with edge.http() as http:
        for body in (b'{"package": "a\\u0000b"}', b'{"package": "\\ud800"}', b'{"package": 5}', b'{"package": ""}',
                     b'{"package": "x", "trust": "me"}'):
            response = statuses.note(repr(body), http.post(f"/admin/models/{ALIAS}/load", content=body,
                                                           headers=headers))
            assert response.status_code == 400, (body, response.text)
            assert response.json()["error"]["param"] in ("package", "trust"), response.text
    statuses.assert_no_5xx()


def test_the_bulk_pacer_spaces_bulk_bytes_at_its_rate_across_bodies(monkeypatch: pytest.MonkeyPatch) -> None:
    """BulkPacer on a fake clock: every body's bulk shares one budget of ``rate`` bytes a second; a piece waits
    exactly until the bytes before it fit, and a pacer left idle does not bank credit."""
    clock = [100.0]
    slept: list[float] = []

    async def sleep(seconds: float) -> None:
        slept.append(seconds)
        clock[0] += seconds

    monkeypatch.setattr(body_gate.anyio, "current_time", lambda: clock[0])
    monkeypatch.setattr(body_gate.anyio, "sleep", sleep)
    pacer = body_gate.BulkPacer(1000.0)

    async def run() -> list[float]:
        waits = [await pacer.take(500), await pacer.take(500), await pacer.take(250)]  # one body, back to back
        waits.append(await pacer.take(1000))  # another body: the same budget
        clock[0] += 60.0  # idle for a minute
        waits.append(await pacer.take(500))
        return waits

    assert anyio.run(run) == [0.0, 0.5, 0.5, 0.25, 0.0]
    assert slept == [0.5, 0.5, 0.25]


@pytest.mark.req("R5.2.3")
def test_a_body_past_the_bulk_threshold_is_read_whole_at_the_pace(server: RunningServer) -> None:
    """A 3 MiB body (2 MiB of it paced) arrives whole: parsed and answered for what it says (a prompt beyond the
    context), chunked or not."""
    body = b'{"model": "tiny", "prompt": "' + b"a" * (3 * 1024 * 1024) + b'"}'
    with server.http() as http:
        for content in (body, iter([body[i:i + 65536] for i in range(0, len(body), 65536)])):
            response = http.post("/v1/completions", content=content, headers={**KEY, "Content-Type": "application/json"})
            assert response.status_code == 400 and response.json()["error"]["code"] == "context_length_exceeded"


def _chunked(pieces: list[bytes]) -> bytes:
    return b"".join(b"%x\r\n%s\r\n" % (len(p), p) for p in pieces) + b"0\r\n\r\n"


@pytest.mark.req("R5.2.3")
def test_a_body_in_tiny_chunks_is_refused_before_it_holds_the_event_loop(edge: RunningServer,
                                                                         http_lines: HttpLines) -> None:
    """h11's cost is per chunk: a 256 KiB read of 1-byte chunks held the loop for ~0.4 s of CPU. Past 1024 pieces a
    chunked body must average 256 bytes a piece; 1-byte and 50-byte pieces are refused with the request's id."""
    head = (b"POST /v1/completions HTTP/1.1\r\nHost: t\r\nContent-Type: application/json\r\n" + AUTH
            + b"Transfer-Encoding: chunked\r\n\r\n")
    for size in (1, 50):
        prompt = [b'{"model": "tiny", "prompt": "'] + [b"a" * size] * 1100 + [b'"}']
        status, headers, body = _raw_answer(edge.port, head + _chunked(prompt))
        assert status == 400 and json.loads(body)["error"]["code"] == "chunks_too_small", body
        line = http_lines.line(headers["x-request-id"])
        assert (line.status, line.code) == (400, "chunks_too_small") and "1025 pieces" in line.reason  # type: ignore[attr-defined]
    _served(edge)


@pytest.mark.req("R5.2.3")
def test_a_body_in_many_chunks_of_ordinary_size_is_read(server: RunningServer) -> None:
    """Past 1024 pieces, pieces of 300 bytes are read (and answered for what they say: a prompt beyond the context);
    so are 1000 pieces of 1 byte."""
    with socket.create_connection(("127.0.0.1", server.port), timeout=30) as sock:
        for pieces in ([b"a" * 300] * 1100, [b"a"] * 1000):
            sock.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: t\r\nContent-Type: application/json\r\n" + AUTH
                         + b"Transfer-Encoding: chunked\r\n\r\n"
                         + _chunked([b'{"model": "tiny", "prompt": "', *pieces, b'"}']))
            answer = b""
            while b"}}" not in answer:  # one JSON error body per request; the connection stays open
                answer += sock.recv(65536)
            assert answer.startswith(b"HTTP/1.1 400") and b"context_length_exceeded" in answer, answer[:300]


@pytest.mark.req("R5.2.3")
def test_a_body_of_millions_of_token_ids_is_refused_before_it_is_parsed(server: RunningServer) -> None:
    """8 MiB of token ids (4 million) took 1 s of CPU under the interpreter lock and 190 MB to parse, only to be
    refused for the context: more commas than any body that fits the context can hold are refused unparsed — the
    service's own RSS stays put. A prompt of token ids within the context is still served."""
    ids = b"1," * (4 * 1024 * 1024 - 32) + b"1"
    statuses = Statuses()
    rss_before = _rss_bytes()
    with server.http() as http:
        for path, body in (("/v1/completions", b'{"model": "tiny", "prompt": [' + ids + b"]}"),
                           ("/v1/chat/completions", b'{"model": "tiny", "messages": [{"role": "user", "content": "x"}],'
                                                    b' "stop": [' + b'"a",' * 100_000 + b'"b"]}')):
            response = statuses.note(path, _post(http, path, body))
            error = response.json()["error"]
            assert response.status_code == 400 and error["code"] == "context_length_exceeded", error
            assert "commas" in error["message"]
        fits = statuses.note("fits", _post(http, "/v1/completions", {**COMPLETION, "prompt": [1] * 200}))
    assert fits.status_code == 200, fits.text
    assert _rss_bytes() - rss_before < 64 * 1024 * 1024  # the bodies themselves are 8 MiB; parsed, one was 190 MB
    statuses.assert_no_5xx()


def _rss_bytes() -> int:
    with open("/proc/self/status") as status:
        return next(int(line.split()[1]) * 1024 for line in status if line.startswith("VmRSS:"))
