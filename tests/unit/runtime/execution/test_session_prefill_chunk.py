"""The B1 profile's prefill chunk size flows manifest → BatchProfile → ProfileSpec → ProfileSet (§6).

The scheduler chunks only when the capability contract says ``incremental_prefill`` *and* the
profile set has a chunk size (``Scheduler.set_model``); these tests pin the second input's path
from the package, which until now nothing filled.
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from calculet.packages.manifest import MANIFEST_FILE, CalbinManifest
from calculet.adapters.sim import package_dir
from calculet.errors import DefinitionError
from calculet.runtime.scheduling.profiles import ProfileSpec
from calculet.runtime.execution.model_facts import ModelFacts
from calculet.runtime.execution.session_plan import plan_session, profile_spec
from tests.unit.runtime.runtime_support import make_config

CONFIG: dict[str, Any] = {"batch": {"profiles": [1, 4, 8, 16], "select_thresholds": {4: 3, 8: 6, 16: 12}}}


def facts(chunk: int | None) -> ModelFacts:
    data = json.loads((package_dir("future") / MANIFEST_FILE).read_bytes())
    if chunk is not None:
        data["profiles"][0]["prefill_chunk_tokens"] = chunk
    return ModelFacts.from_manifest(CalbinManifest.parse(data), "0" * 64)


@pytest.mark.parametrize("chunk", [None, 16, 100])
def test_the_declared_chunk_reaches_the_profile_set(chunk: int | None) -> None:
    f = facts(chunk)
    assert profile_spec(f.profiles[0]).prefill_chunk_tokens == chunk
    assert all(profile_spec(p).prefill_chunk_tokens is None for p in f.profiles[1:])
    plan = plan_session(f, make_config(**CONFIG))
    assert plan.profiles.prefill_chunk_tokens == chunk
    assert plan.scheduling_capabilities().incremental_prefill, "the future package declares the capability"


def test_a_b1_only_plan_keeps_the_chunk() -> None:
    assert plan_session(facts(64), make_config()).profiles.prefill_chunk_tokens == 64


@pytest.mark.parametrize("chunk", [0, -1])
def test_profile_spec_refuses_a_non_positive_chunk(chunk: int) -> None:
    with pytest.raises(DefinitionError, match="prefill_chunk_tokens"):
        ProfileSpec(1, 8192, None, False, prefill_chunk_tokens=chunk)
