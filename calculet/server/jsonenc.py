"""One JSON encoder for what the service writes on its event loop: error answers, log lines, SSE frames (#13, #20).

Why: every refusal (a 429 under a burst) is encoded twice on the event loop — its answer and its log line —
and every streamed token once. ``orjson`` (a C encoder, a dependency of the service) writes the same compact
JSON as ``json.dumps(value, ensure_ascii=False, separators=(",", ":"))`` in a fraction of the time; where it
cannot (a lone UTF-16 surrogate in a string, a key that is not a string, a type it does not know), the
standard library writes it as before. One difference remains: orjson writes a NaN or infinite float as
``null`` where the standard library writes the non-JSON ``NaN``; no answer or frame of the service carries
one (usage and ids are integers), and a log line is better valid JSON.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from typing import Any

from starlette.responses import JSONResponse
from starlette.types import Send

import orjson


def _std(value: Any) -> bytes:
    return json.dumps(value, ensure_ascii=False, separators=(",", ":")).encode("utf-8", "surrogatepass")


def dumps(value: Any) -> bytes:
    """``value`` as compact UTF-8 JSON, non-ASCII characters as themselves (``ensure_ascii=False``)."""
    try:
        return orjson.dumps(value)
    except TypeError:  # a surrogate, a non-string key, a type orjson does not take: the library's answer
        return _std(value)


encode_str: Callable[[str], bytes] = orjson.dumps
"""The encoder :func:`dumps` tries first, for a caller that encodes one ``str`` per streamed token
(:func:`calculet.server.sse.json_text`) and calls it directly — a Python frame fewer per token (issue #20). The same
bytes as :func:`dumps` for every string it takes; on ``TypeError`` (a lone surrogate) the caller falls back to
:func:`dumps`."""


def dumps_text(value: Any) -> str:
    """:func:`dumps` as text."""
    return dumps(value).decode("utf-8", "surrogatepass")


class JSONBody(JSONResponse):
    """Starlette's ``JSONResponse`` (same bytes: compact, UTF-8) rendered with :func:`dumps`."""

    def render(self, content: Any) -> bytes:
        return dumps(content)


_JSON_TYPE = (b"content-type", b"application/json")


async def send_json(send: Send, status: int, content: Any, headers: Mapping[str, str] | None = None) -> None:
    """``content`` answered as :class:`JSONBody` answers it — the same status, headers in the same order and the same
    bytes — through ``send`` directly. Why: building a Starlette response object (its header list, its checks) for
    each answer was a visible share of the event loop's CPU per 429 under a burst (issue #13)."""
    body = dumps(content)
    if headers:
        raw = [(key.lower().encode("latin-1"), value.encode("latin-1")) for key, value in headers.items()]
        names = {name for name, _ in raw}
        if b"content-length" not in names:
            raw.append((b"content-length", str(len(body)).encode("latin-1")))
        if b"content-type" not in names:
            raw.append(_JSON_TYPE)
    else:
        raw = [(b"content-length", str(len(body)).encode("latin-1")), _JSON_TYPE]
    await send({"type": "http.response.start", "status": status, "headers": raw})
    await send({"type": "http.response.body", "body": body})


__all__ = ["JSONBody", "dumps", "dumps_text", "encode_str", "send_json"]
