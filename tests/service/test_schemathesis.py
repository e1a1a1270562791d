"""Schemathesis against the service's own OpenAPI schema, all four phases (issue #14, R5.2.3).

The ``schemathesis run`` CLI (the test extra ``schemathesis>=4.0,<5``) runs the examples, coverage,
fuzzing and stateful phases, positive and negative data, with a fixed seed, deterministic generation and
a bounded number of examples per operation, against a test server on 127.0.0.1 whose simulated device
takes no device time. Checks: no 5xx,
status codes, content types, headers and bodies as the schema declares, negative data rejected, and
``refused_only_for_a_stated_reason`` (``schemathesis_hooks.py``): a schema-valid request is refused only
for a reason its operation states in ``x-calculet-refusals``.

``POST /admin/models/{alias}/drain`` and ``.../unload`` are left out: either would unload the shared
server's model (``test_errors_and_cancel.py`` and ``test_admin.py`` cover them). ``load`` (generated paths
lie outside the trusted root: 400 ``load_failed``, a stated refusal) and ``rollback`` (nothing to roll back
to: 404) leave the served generation as it is.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from calculet.adapters.sim import CostModel
from tests.service.support import ADMIN_TOKEN, TENANT_KEYS, RunningServer, service_config, start_server

pytest.importorskip("schemathesis", reason="schemathesis>=4.0,<5 is not installed (test extra)")

ROOT = Path(__file__).resolve().parents[2]
SEED = 14
EXAMPLES = 15
PHASES = ("examples", "coverage", "fuzzing", "stateful")


@pytest.fixture(scope="module")
def instant_server(key_dir: Path) -> Iterator[RunningServer]:
    """The default stack on a simulated device without device time (the model still runs): the phases send about
    a thousand requests, many of them chats that generate to the end of the context."""
    running = start_server(service_config(), key_dir, cost=CostModel.instant())
    yield running
    running.stop()


def _config(tmp: Path) -> Path:
    checks = ["not_a_server_error", "status_code_conformance", "content_type_conformance",
              "response_headers_conformance", "response_schema_conformance", "negative_data_rejection"]
    lines = [
        f"seed = {SEED}",
        'hooks = "tests.service.schemathesis_hooks"',
        "request-timeout = 30",
        "[generation]",
        f"max-examples = {EXAMPLES}",
        "deterministic = true",
        'mode = "all"',
        "[checks]",
        "enabled = false",
        *[f"{name}.enabled = true" for name in checks],
        "refused_only_for_a_stated_reason.enabled = true",
        "[phases]",
        *[f"{phase}.enabled = true" for phase in PHASES],
        "[[operations]]",
        'include-path-regex = "^/admin/models/[^/]+/(drain|unload)$"',
        "enabled = false",
        "[[operations]]",
        'include-path-regex = "^/admin"',
        f'headers = {{ Authorization = "Bearer {ADMIN_TOKEN}" }}',
        "[[operations]]",
        'include-path-regex = "^/v1"',
        f'headers = {{ Authorization = "Bearer {TENANT_KEYS["alpha"]}" }}',
    ]
    path = tmp / "schemathesis.toml"
    path.write_text("\n".join(lines) + "\n")
    return path


@pytest.mark.req("R5.2.3")
def test_all_phases_find_no_5xx_and_no_schema_valid_request_refused_for_an_unstated_reason(
        instant_server: RunningServer, tmp_path: Path) -> None:
    server = instant_server
    cli = Path(sys.executable).parent / "schemathesis"
    env = {**os.environ, "PYTHONPATH": str(ROOT), "NO_COLOR": "1"}
    junit = tmp_path / "junit.xml"
    result = subprocess.run(
        [str(cli), "--config-file", str(_config(tmp_path)), "run", f"{server.base_url}/openapi.json",
         "--phases", ",".join(PHASES), "--workers", "1", "--report", "junit", "--report-junit-path", str(junit)],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=900)
    output = result.stdout + result.stderr
    assert result.returncode == 0, output[-6000:]
    for phase in ("Examples", "Coverage", "Fuzzing", "Stateful"):
        assert phase in output, (phase, output[-3000:])
    assert "POST /v1/completions" in junit.read_text() and "POST /v1/chat/completions" in junit.read_text()
    assert server.service.wait_streams_closed(30)
    served = [e for e in server.service.admin.status() if e["active"]]
    assert [e["state"] for e in served] == ["ready"]  # the model serves still (a rollback may have reloaded it)
