"""The ``calculet-scheduler/v1`` JSON Schema is a generated document in ``specs/`` (§15).

It is produced from the pydantic model (never written by hand), registered with specgen by
:mod:`calculet.config.document`, and covers every section the loader reads — including ``models`` and
``trust``, which the model manager uses to start the engine (§11 steps 1–2).
"""

from __future__ import annotations

import json

import pytest
import yaml

from calculet import specgen
from calculet.config import EXAMPLE_CONFIG_PATH, SCHEMA_ID, config_json_schema
from calculet.config.document import SCHEMA_DOCUMENT, schema_document


@pytest.mark.req("R15.1")
def test_the_schema_document_is_generated_into_specs_and_current() -> None:
    docs = specgen.render_all()
    assert SCHEMA_DOCUMENT in docs and docs[SCHEMA_DOCUMENT] == schema_document()
    committed = (specgen.SPECS_DIR / SCHEMA_DOCUMENT).read_text(encoding="utf-8")
    assert json.loads(committed) == config_json_schema()
    assert f"[{SCHEMA_DOCUMENT}]({SCHEMA_DOCUMENT})" in docs["index.md"]


@pytest.mark.req("R15.1")
def test_the_schema_names_every_section_the_example_uses_and_pins_the_schema_id() -> None:
    schema = config_json_schema()
    assert schema["properties"]["schema"]["const"] == SCHEMA_ID and schema["$id"] == SCHEMA_ID
    example = yaml.safe_load(EXAMPLE_CONFIG_PATH.read_text(encoding="utf-8"))
    assert set(example) <= set(schema["properties"])
    assert {"models", "trust"} <= set(schema["properties"])
    trust = schema["$defs"]["TrustConfig"]["properties"]
    assert {"trusted_roots", "trusted_keys_dir"} <= set(trust) and "§11 step 1" in trust["trusted_roots"]["description"]
    assert schema["$defs"]["ExecutorConfig"]["properties"]["drain_deadline_ms"]["default"] == 120_000
