"""Schemathesis against the service's own OpenAPI schema: no 5xx, no response outside the schema.

Bounded: a fixed number of derandomized examples per operation and generation mode (positive
and negative data), so the run is short and reproducible. Positive cases address the served
model alias (a random ``model`` would only ever reach the 404 path). Every operation of the schema is
exercised except ``POST /admin/models/{alias}/drain`` and ``.../unload`` — either would unload the
shared server's model; they are covered by ``test_errors_and_cancel.py`` and ``test_admin.py``.
``load`` (generated paths lie outside the trusted root: 400 at §11 step 1) and ``rollback``
(nothing to roll back to: 404) leave the served generation as it is.

Needs ``schemathesis>=4.0,<5`` (test extra); skipped with that reason when it is not installed.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis.errors import Unsatisfiable

from tests.service.support import ADMIN_TOKEN, ALIAS, TENANT_KEYS, RunningServer

schemathesis = pytest.importorskip("schemathesis", reason="schemathesis>=4.0,<5 is not installed (test extra)")

EXAMPLES = 20
EXCLUDED = (("POST", "/admin/models/{alias}/drain"), ("POST", "/admin/models/{alias}/unload"))


def _checks() -> list[Any]:
    from schemathesis import checks

    return [checks.not_a_server_error, checks.status_code_conformance, checks.content_type_conformance,
            checks.response_schema_conformance, checks.response_headers_conformance,
            checks.negative_data_rejection]


def test_no_5xx_and_no_schema_violation(server: RunningServer) -> None:
    from schemathesis import GenerationMode

    schema = schemathesis.openapi.from_url(f"{server.base_url}/openapi.json")
    checks = _checks()
    operations = [result.ok() for result in schema.get_all_operations()]
    exercised = []
    outcomes: Counter[tuple[str, int, str]] = Counter()
    positives: Counter[str] = Counter()
    for operation in operations:
        if (operation.method.upper(), operation.path) in EXCLUDED:
            continue
        token = ADMIN_TOKEN if operation.path.startswith("/admin") else TENANT_KEYS["alpha"]
        headers = {"Authorization": f"Bearer {token}"}
        for mode in (GenerationMode.POSITIVE, GenerationMode.NEGATIVE):
            @given(case=operation.as_strategy(generation_mode=mode))
            @settings(max_examples=EXAMPLES, deadline=None, derandomize=True, database=None, print_blob=True,
                      suppress_health_check=list(HealthCheck))
            def run(case: Any) -> None:
                if mode is GenerationMode.POSITIVE:  # reach past 404: address the served model
                    if isinstance(case.body, dict) and "model" in case.body:
                        case.body["model"] = ALIAS
                        positives[operation.path] += 1  # every other positive body streams (SSE), whatever
                        case.body["stream"] = positives[operation.path] % 2 == 1  # the generated bodies
                    if case.path_parameters and "alias" in case.path_parameters:
                        case.path_parameters["alias"] = ALIAS
                response = case.call_and_validate(base_url=server.base_url, headers=headers, checks=checks,
                                                  timeout=30)
                kind = response.headers.get("content-type", [""])[0].split(";")[0]
                outcomes[(operation.path, response.status_code, kind)] += 1

            try:
                run()
            except Unsatisfiable:
                assert mode is GenerationMode.NEGATIVE, f"no positive data for {operation.path}"
                # an operation without parameters or body has no invalid input to send
        exercised.append(f"{operation.method.upper()} {operation.path}")
    assert {"POST /v1/completions", "POST /v1/chat/completions", "GET /v1/models", "GET /metrics",
            "GET /admin/capabilities", "POST /admin/models/{alias}/load",
            "POST /admin/models/{alias}/rollback"} <= set(exercised)
    for path in ("/v1/completions", "/v1/chat/completions"):  # both bodies and streams were validated
        assert outcomes[(path, 200, "application/json")] and outcomes[(path, 200, "text/event-stream")], outcomes
    assert server.service.wait_streams_closed(30)
    served = [e for e in server.service.admin.status() if e["active"]]
    assert [(e["generation"], e["state"]) for e in served] == [(1, "ready")]  # no operation changed the model
