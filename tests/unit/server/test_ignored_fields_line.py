"""The accepted-and-ignored fields' DEBUG line (request_parsing._ignored), looked for only when DEBUG is on (issue #13).

Catches the guard inverted or the line dropped (no line with DEBUG on), and the fields looked for with DEBUG off."""

from __future__ import annotations

import logging
from typing import Any

import pytest

from calculet.server import request_parsing
from calculet.server.request_parsing import parse_body
from calculet.server.schemas import IGNORED_FIELDS, CompletionRequest


def _body() -> CompletionRequest:
    field = sorted(IGNORED_FIELDS)[0]
    return parse_body(CompletionRequest, b'{"model": "m", "prompt": "x", "%s": null}' % field.encode())


def test_the_line_names_the_ignored_fields_with_debug_on(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.DEBUG, logger="calculet.server.inference"):
        request_parsing._ignored(_body())
    lines = [r for r in caplog.records if r.getMessage() == "ignored request fields"]
    assert [r.fields for r in lines] == [[sorted(IGNORED_FIELDS)[0]]]  # type: ignore[attr-defined]


def test_the_fields_are_not_looked_for_with_debug_off(monkeypatch: pytest.MonkeyPatch,
                                                     caplog: pytest.LogCaptureFixture) -> None:
    asked: list[Any] = []
    monkeypatch.setattr(CompletionRequest, "ignored", lambda self: asked.append(self) or [])
    with caplog.at_level(logging.INFO, logger="calculet.server.inference"):
        request_parsing._ignored(_body())
    assert asked == []
