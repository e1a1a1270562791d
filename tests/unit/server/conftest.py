"""Shared fixtures of the server unit tests."""

from __future__ import annotations

import io
import logging
from collections.abc import Iterator
from dataclasses import dataclass

import pytest

from calculet.server import logs
from calculet.server.logs import JsonFormatter


@dataclass
class JsonLogger:
    """A logger ``<name>.server`` whose parent writes through the service's JSON formatter to :attr:`stream` (and
    nowhere else), with the log clock fixed at :meth:`at`: a line written directly (``log_fields``) can be compared
    with the formatter's own for the same record (:meth:`formatted`)."""

    name: str
    stream: io.StringIO
    logger: logging.Logger
    monkeypatch: pytest.MonkeyPatch
    created: float = 0.0

    def at(self, created: float) -> None:
        """The log clock (``logs.time.time``) reads ``created`` from now on."""
        self.created = created
        self.monkeypatch.setattr(logs.time, "time", lambda: created)

    def formatted(self, level: int, fields: dict[str, object]) -> str:
        """The formatter's line for a record of ``level`` with ``fields`` at the fixed clock."""
        record = logging.LogRecord(self.logger.name, level, __file__, 0, "http", (), None)
        record.created, record.msecs = self.created, (self.created % 1) * 1000
        record.__dict__.update(fields)
        return JsonFormatter().format(record) + "\n"


@pytest.fixture
def json_logger(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> Iterator[JsonLogger]:
    """A :class:`JsonLogger` named after the test (its handler removed afterwards, its child's filters cleared)."""
    name = request.node.name
    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    handler.setFormatter(JsonFormatter())
    handler.set_name("calculet")
    parent = logging.getLogger(name)
    child = logging.getLogger(f"{name}.server")
    parent.addHandler(handler)
    parent.propagate = False
    try:
        yield JsonLogger(name, stream, child, monkeypatch)
    finally:
        parent.removeHandler(handler)
        parent.propagate = True
        child.filters.clear()
