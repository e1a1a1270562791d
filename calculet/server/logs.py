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
import time
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
    return _stamp(record.created, record.msecs)


def _stamp(created: float, msecs: float) -> str:
    global _last_second
    second = int(created)
    known = _last_second
    if known[0] != second:
        when = _dt.datetime.fromtimestamp(second, tz=_dt.timezone.utc)
        known = _last_second = (second, when.strftime("%Y-%m-%dT%H:%M:%S."))
    return f"{known[1]}{int(msecs):03d}Z"


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
        out = _json_head(_timestamp(record), record.levelname, record.name, record.getMessage())
        _json_fields(out, vars(record))
        if record.exc_info:
            out["exc"] = self.formatException(record.exc_info)
        return dumps_text(out)  # orjson when installed: a refusal's line is written on the event loop (#13)


def _json_head(ts: str, level: str, logger: str, msg: str) -> dict[str, Any]:
    return {"ts": ts, "level": level, "logger": logger, "msg": msg}


def _json_fields(out: dict[str, Any], fields: dict[str, Any]) -> None:
    """The extras in one pass (every request's line is written on the event loop, issue #13): as _extras, _plain."""
    for key, value in fields.items():
        if key not in _STANDARD and key[:1] != "_":
            out[key] = value if type(value) in _AS_IS else _plain(value)


def _json_handler(logger: logging.Logger, level: int) -> logging.StreamHandler[Any] | None:  # type: ignore[type-arg]
    """The one handler a record of ``logger`` at ``level`` would reach, when it is the service's own JSON stream
    handler (:func:`configure_logging`) and nothing else could see or change the record (no filter, no other handler
    on the way up, the stdlib's record factory); else None."""
    if logger.filters or logging.getLogRecordFactory() is not logging.LogRecord:
        return None
    found = None
    current: logging.Logger | None = logger
    while current is not None:
        for handler in current.handlers:
            if found is not None:
                return None
            found = handler
        if not current.propagate:
            break
        current = current.parent
    if (found is None or type(found) is not logging.StreamHandler or found.name != "calculet" or found.filters
            or type(found.formatter) is not JsonFormatter or level < found.level):
        return None
    return found


def log_fields(logger: logging.Logger, level: int, msg: str, fields: dict[str, Any], *, plain: bool = False) -> None:
    """One log line of ``logger`` at ``level`` (already known enabled) with ``fields`` as its extras, as
    ``logger.log(level, msg, extra=fields)`` would write it.

    ``plain``: the caller vouches that every value is a str, int, float, bool or None and no name is a record's own or
    begins with ``_`` (its names are fixed in its code): the JSON line then takes ``fields`` as they are, without the
    per-field filter and conversion a record's extras need (:func:`_json_fields`; the refusal lane's line, #13).

    Why: every request's line is written on the event loop (a 429 of a burst as much as any, issue #13). When the
    line's only destination is the service's JSON handler (:func:`_json_handler`), the line is encoded and written
    here, under the handler's lock, without a ``LogRecord`` (its constructor reads the clock, the thread, the
    process) and the generic ``Logger.handle`` / ``Handler.handle`` / ``format`` walk: the same keys in the same
    order as :class:`JsonFormatter` writes. Otherwise the record is made directly (``Logger.log`` would first walk
    the stack for the caller's file and line, which no formatter of the service prints, and ``makeRecord`` would
    test each field against the record's own names — these are the caller's fixed names) and handled as usual."""
    log_lines(logger, level, msg, [(time.time(), fields)], plain=plain)


def log_lines(logger: logging.Logger, level: int, msg: str, lines: list[tuple[float, dict[str, Any]]], *,
              plain: bool = False) -> None:
    """Log lines as :func:`log_fields` writes each, every one with its own instant (``time.time()`` when it was
    decided: its ``ts``), written to the service's JSON handler in one write and one flush.

    Why one write (issue #13): a flush of the service's stream (stderr: a pipe or a file) is a system call that
    releases the interpreter lock; under a burst the engine's threads are busy, and the event loop then waits for
    one of them to hand the lock back before its next request — at each refusal's line. The refusal lane writes a
    turn's lines together (:meth:`~calculet.server.refusal_lane.RefusalLane.flush`)."""
    handler = _json_handler(logger, level)
    if handler is None:
        for created, fields in lines:
            record = logging.getLogRecordFactory()(logger.name, level, __file__, 0, msg, (), None, "log_fields")
            record.created, record.msecs = created, (created - int(created)) * 1000
            record.__dict__.update(fields)
            logger.handle(record)
        return
    name, level_name, end = logger.name, logging.getLevelName(level), handler.terminator
    text = []
    for created, fields in lines:
        head = _json_head(_stamp(created, (created - int(created)) * 1000), level_name, name, msg)
        if plain:
            head.update(fields)
        else:
            _json_fields(head, fields)
        text.append(dumps_text(head) + end)
    # the handler's lock held once for the write and the flush, the flush as ``StreamHandler.flush`` does it
    # without taking the lock again (issue #20: every request's line, five Python calls fewer on the event loop)
    with handler.lock:  # type: ignore[union-attr]  # a StreamHandler always has its lock
        try:
            stream = handler.stream
            stream.write("".join(text))
            flush = getattr(stream, "flush", None)
            if flush is not None:
                flush()
        except Exception:  # noqa: BLE001 - as StreamHandler.emit: reported, never raised into the caller
            record = logging.LogRecord(logger.name, level, __file__, 0, msg, (), None)
            handler.handleError(record)


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
