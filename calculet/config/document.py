"""The ``calculet-scheduler/v1`` JSON Schema as a generated document in ``specs/`` (§15).

The schema is derived from the pydantic model in :mod:`calculet.config` (whose field
descriptions cite the spec), never written by hand: :mod:`calculet.specgen` lists
:func:`schema_document` among its producers, writes ``specs/calculet-scheduler-v1.schema.json``
and ``--check`` fails when it is stale. Editors and CI can validate a YAML configuration against
it before calculet ever reads the file; the loader's own checks (and
:func:`calculet.config.cross_validate` against the package manifest, R15.19) still decide at
startup.
"""

from __future__ import annotations

import json

from calculet.config import config_json_schema

SCHEMA_DOCUMENT = "calculet-scheduler-v1.schema.json"


def schema_document() -> str:
    """The JSON Schema, canonically encoded (sorted keys, 2-space indent, trailing newline)."""
    return json.dumps(config_json_schema(), indent=2, sort_keys=True, ensure_ascii=False) + "\n"

