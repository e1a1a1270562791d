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
from typing import Any

from starlette.responses import JSONResponse

import orjson


def _std(value: Any) -> bytes:
    return json.dumps(value, ensure_ascii=False, separators=(",", ":")).encode("utf-8", "surrogatepass")


def dumps(value: Any) -> bytes:
    """``value`` as compact UTF-8 JSON, non-ASCII characters as themselves (``ensure_ascii=False``)."""
    try:
        return orjson.dumps(value)
    except TypeError:  # a surrogate, a non-string key, a type orjson does not take: the library's answer
        return _std(value)


def dumps_text(value: Any) -> str:
    """:func:`dumps` as text."""
    return dumps(value).decode("utf-8", "surrogatepass")


class JSONBody(JSONResponse):
    """Starlette's ``JSONResponse`` (same bytes: compact, UTF-8) rendered with :func:`dumps`."""

    def render(self, content: Any) -> bytes:
        return dumps(content)


__all__ = ["JSONBody", "dumps", "dumps_text"]
