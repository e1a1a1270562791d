"""Structured logs: one line per event, JSON or text, carrying request id, tenant and generation.

Request and job ids belong here, never in metric labels (§16, R16.10). Fields are passed as
``logging`` extras (``log.info("request done", extra={"request_id": ..., "tenant": ...})``);
both formatters print every extra, so a record written once reads the same in either format.

* ``json``: ``{"ts": ..., "level": ..., "logger": ..., "msg": ..., "request_id": ..., ...}``
* ``text``: ``2026-08-02T10:00:00.123Z INFO calculet.server request done request_id=... tenant=...``
"""

from __future__ import annotations

import datetime as _dt
import logging
import sys
from typing import Any, Literal

from calculet.server.jsonenc import dumps_text

LogFormat = Literal["json", "text"]

_STANDARD = frozenset(vars(logging.LogRecord("", 0, "", 0, "", None, None)).keys()) | {
    "message", "asctime", "taskName", "color_message"}


def _extras(record: logging.LogRecord) -> dict[str, Any]:
    return {k: v for k, v in vars(record).items() if k not in _STANDARD and not k.startswith("_")}


_last_second: tuple[int, str] = (-1, "")
"""The last whole second formatted (its number, its text; one tuple, read and replaced whole by any thread):
lines come many a second, and formatting a date is not free."""


def _timestamp(record: logging.LogRecord) -> str:
    global _last_second
    second = int(record.created)
    known = _last_second
    if known[0] != second:
        when = _dt.datetime.fromtimestamp(second, tz=_dt.timezone.utc)
        known = _last_second = (second, when.strftime("%Y-%m-%dT%H:%M:%S."))
    return f"{known[1]}{int(record.msecs):03d}Z"


def _plain(value: Any) -> Any:
    if isinstance(value, (str, int, float, bool)) or value is None:
        return value
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    return str(value)


_AS_IS = frozenset({str, int, float, bool, type(None)})
"""Types :func:`_plain` returns unchanged (an exact-type test is cheaper than its ``isinstance`` chain)."""


class JsonFormatter(logging.Formatter):
    """One JSON object per line."""

    def format(self, record: logging.LogRecord) -> str:
        out: dict[str, Any] = {"ts": _timestamp(record), "level": record.levelname, "logger": record.name,
                               "msg": record.getMessage()}
        # the extras in one pass (every request's line is written on the event loop, issue #13): as _extras, _plain
        for key, value in vars(record).items():
            if key not in _STANDARD and not key.startswith("_"):
                out[key] = value if type(value) in _AS_IS else _plain(value)
        if record.exc_info:
            out["exc"] = self.formatException(record.exc_info)
        return dumps_text(out)  # orjson when installed: a refusal's line is written on the event loop (#13)


class TextFormatter(logging.Formatter):
    """``ts LEVEL logger message key=value ...``."""

    def format(self, record: logging.LogRecord) -> str:
        fields = " ".join(f"{k}={_plain(v)!r}" if isinstance(v, str) and " " in v else f"{k}={_plain(v)}"
                          for k, v in _extras(record).items())
        line = f"{_timestamp(record)} {record.levelname} {record.name} {record.getMessage()}"
        if fields:
            line += " " + fields
        if record.exc_info:
            line += "\n" + self.formatException(record.exc_info)
        return line


def configure_logging(fmt: LogFormat = "text", level: str | int = "INFO", *, stream: Any = None) -> logging.Handler:
    """Route the ``calculet`` and ``uvicorn`` loggers through one formatter (idempotent per process)."""
    if fmt not in ("json", "text"):
        raise ValueError(f"log format must be 'json' or 'text', not {fmt!r}")
    handler = logging.StreamHandler(stream if stream is not None else sys.stderr)
    handler.setFormatter(JsonFormatter() if fmt == "json" else TextFormatter())
    handler.set_name("calculet")
    for name in ("calculet", "uvicorn", "uvicorn.error"):
        logger = logging.getLogger(name)
        for old in [h for h in logger.handlers if h.get_name() == "calculet"]:
            logger.removeHandler(old)
        logger.addHandler(handler)
        logger.setLevel(level)
        logger.propagate = False
    logging.getLogger("uvicorn.access").disabled = True  # the service logs each request itself
    return handler
