"""What both edge protocols (h11: :mod:`calculet.server.http_server`, httptools: :mod:`calculet.server.http_fast`)
answer with: the server-generated request id, the whole error response they write themselves, and the limits of
a chunked body's pieces (issue #14). Apart so that neither protocol module imports the other."""

from __future__ import annotations

import json
import os


def new_request_id() -> str:
    """A server-generated request id: 128 random bits as 32 hex digits (``os.urandom``: a ``uuid4`` object cost
    several times more to build, once per request on the event loop, issue #13)."""
    return os.urandom(16).hex()


def error_response(status: int, code: str, message: str, request_id: str) -> bytes:
    """A whole ``Connection: close`` HTTP/1.1 response in the service's error shape, as bytes."""
    phrase = {400: b"Bad Request", 408: b"Request Timeout", 431: b"Request Header Fields Too Large"}.get(status, b"")
    body = json.dumps({"error": {"message": message, "type": "invalid_request_error", "code": code,
                                 "param": None}}).encode()
    return (b"HTTP/1.1 %d %s\r\ncontent-type: application/json\r\nconnection: close\r\nx-request-id: %s\r\n"
            b"content-length: %d\r\n\r\n" % (status, phrase, request_id.encode(), len(body)) + body)


FREE_CHUNKS = 1024
"""Pieces of a chunked body taken whatever their size; past them the average must reach :data:`MIN_CHUNK_AVERAGE`."""
MIN_CHUNK_AVERAGE = 256
"""Smallest average payload (bytes) of a chunked body's pieces past :data:`FREE_CHUNKS`.

Why: h11 spends about 10 µs of event-loop CPU per chunk, whatever its size, and parses everything one
socket read holds before the loop runs anything else: one 256 KiB read of 1-byte chunks (43 690 of
them) held the loop for 445 ms of CPU here, and a body within ``server.max_body_bytes`` (which counts
payload, not the 5 bytes of framing around each byte) could take about 190 such reads. Past 1024
pieces, a body averaging under 256 bytes a piece is refused 400 ``chunks_too_small`` — at most about
10 ms of the loop's CPU spent on it."""


__all__ = ["FREE_CHUNKS", "MIN_CHUNK_AVERAGE", "error_response", "new_request_id"]
