"""Schemathesis hooks for ``test_schemathesis.py`` (loaded by the CLI through ``hooks`` in its config).

One check of our own, in place of schemathesis's ``positive_data_acceptance`` (which accepts only 2xx, 3xx,
401, 403, 404, 409, 429 and 5xx for schema-valid data): a schema-valid request may be refused only for a
reason the schema states — the ``x-calculet-refusals`` of its operation names every error ``code`` the
service may answer to valid input (a prompt that does not fit the context, capacity, a package that fails
its §11 checks). Any other 4xx to positive data is a schema that offers what the server refuses (issue #14).
"""

from __future__ import annotations

from typing import Any

import schemathesis

ALWAYS_FINE = frozenset({401, 403, 404, 409, 429})
"""Statuses that depend on credentials, existence or capacity, never on the shape of the input."""


@schemathesis.check
def refused_only_for_a_stated_reason(ctx: Any, response: Any, case: Any) -> bool | None:
    meta = case.meta
    if meta is None or not meta.generation.mode.is_positive:
        return None
    status = response.status_code
    if status < 400 or status >= 500 or status in ALWAYS_FINE:
        return None
    stated = (case.operation.definition.raw or {}).get("x-calculet-refusals", {})
    try:
        code = response.json()["error"]["code"]
    except (ValueError, KeyError, TypeError):
        code = None
    if code not in stated:
        raise AssertionError(f"schema-valid input refused for a reason the schema does not state: {status} "
                             f"{code!r} ({response.text[:300]}); stated: {sorted(stated)}")
    return True


@schemathesis.hook
def before_call(context: Any, case: Any, kwargs: Any) -> None:
    """A chat without a length limit generates to the end of the context (about 250 tokens, 0.4 s each on the
    test device, most of the run's time); a valid limit keeps the run short without making any body valid or
    invalid (every phase sends through here)."""
    body = case.body
    if (isinstance(body, dict) and "messages" in body and body.get("max_tokens") is None
            and body.get("max_completion_tokens") is None):
        body["max_completion_tokens"] = 8  # in place of nothing or null
