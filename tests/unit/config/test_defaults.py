"""§15 configuration: every field parsed with the spec's value, and the documented defaults."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from pydantic import BaseModel, ValidationError

import calculet.config as config_module
from calculet.config import (
    DEFAULT_CONFIG_PATH,
    EXAMPLE_CONFIG_PATH,
    SCHEMA_ID,
    CapacityBudget,
    SchedulerConfig,
    config_json_schema,
    default_config,
    load_config,
    parse_config,
)


def _get(config: SchedulerConfig, dotted: str) -> Any:
    value: Any = config
    for part in dotted.split("."):
        value = getattr(value, part)
    return value


# (requirement, dotted attribute path, spec §15 value)
SPEC_FIELDS = [
    ("R15.1", "schema_id", "calculet-scheduler/v1"),
    ("R15.2", "model_alias", "qwen3"),
    ("R15.3", "admission.max_waiting_requests", 128),
    ("R15.4", "admission.max_waiting_prompt_tokens", 262144),
    ("R15.5", "admission.deadline_default_ms", 120000),
    ("R15.6", "queues.decode_weight", 8),
    ("R15.7", "queues.short_prefill_weight", 4),
    ("R15.8", "queues.medium_prefill_weight", 2),
    ("R15.9", "queues.long_prefill_weight", 1),
    ("R15.10", "queues.short_prefill_max_tokens", 512),
    ("R15.11", "queues.medium_prefill_max_tokens", 4096),
    ("R15.12", "batch.profiles", (1,)),
    ("R15.13", "batch.batching_window_us", 0),
    ("R15.14", "executor.max_inflight", 1),
    ("R15.15", "executor.fixed_engine", False),
    ("R15.16", "recovery.max_resets_per_10min", 2),
    ("R15.17", "recovery.restart_on_unknown_dma", True),
]
SPEC_PARAMS = [
    pytest.param(path, value, id=req, marks=pytest.mark.req(req))
    for req, path, value in SPEC_FIELDS
]


@pytest.mark.parametrize(("path", "expected"), SPEC_PARAMS)
def test_reference_file_parses_every_section_15_field(path: str, expected: object) -> None:
    config = load_config(DEFAULT_CONFIG_PATH)
    assert _get(config, path) == expected
    assert type(_get(config, path)) is type(expected)


@pytest.mark.parametrize(("path", "expected"), SPEC_PARAMS)
def test_minimal_file_gets_the_spec_value_as_default(path: str, expected: object) -> None:
    config = parse_config({"schema": SCHEMA_ID})
    assert _get(config, path) == expected


@pytest.mark.req("R15.1")
def test_reference_file_equals_default_config() -> None:
    assert load_config(DEFAULT_CONFIG_PATH) == default_config()


def test_reference_file_holds_exactly_the_spec_block() -> None:
    """default.yaml is §15 verbatim: no key beyond the ones the spec's YAML block lists."""
    import yaml

    data = yaml.safe_load(DEFAULT_CONFIG_PATH.read_text())
    assert data == {
        "schema": "calculet-scheduler/v1",
        "model_alias": "qwen3",
        "admission": {
            "max_waiting_requests": 128,
            "max_waiting_prompt_tokens": 262144,
            "deadline_default_ms": 120000,
        },
        "queues": {
            "decode_weight": 8,
            "short_prefill_weight": 4,
            "medium_prefill_weight": 2,
            "long_prefill_weight": 1,
            "short_prefill_max_tokens": 512,
            "medium_prefill_max_tokens": 4096,
        },
        "batch": {"profiles": [1], "batching_window_us": 0},
        "executor": {"max_inflight": 1, "fixed_engine": False},
        "recovery": {"max_resets_per_10min": 2, "restart_on_unknown_dma": True},
    }


# Fields the spec implies outside §15 (ambiguity 8), with the defaults this project chose.
IMPLIED_DEFAULTS = [
    ("admission.max_sequences", 16),
    ("admission.max_kv_tokens", None),
    ("admission.max_inflight_jobs", None),
    ("admission.long_prefill_quota.max_admitted", 1),
    ("admission.long_prefill_quota.max_waiting", 8),
    ("queues.wfq_decode_weight", 8),
    ("batch.select_thresholds", {16: 12, 8: 6, 4: 3}),
    ("batch.max_tenant_lane_share", 0.5),
    ("executor.physical_devices", 1),
    ("executor.drain_deadline_ms", 120000),
    ("executor.degrade.p99_regression_ratio", 0.05),
    ("executor.degrade.consecutive_busy_or_timeout", 3),
    ("monitoring.invariants", True),
    ("models", ()),
    ("trust.trusted_roots", ()),
    ("trust.trusted_keys_dir", None),
    ("trust.max_file_bytes", 32 * 1024**3),
    ("server.host", "127.0.0.1"),
    ("server.port", 8000),
    ("server.admin_token_sha256", None),
]


@pytest.mark.parametrize(
    ("path", "expected"), IMPLIED_DEFAULTS, ids=[p for p, _ in IMPLIED_DEFAULTS]
)
def test_implied_fields_have_documented_defaults(path: str, expected: object) -> None:
    assert _get(default_config(), path) == expected


@pytest.mark.req("R5.3.1")
def test_no_tenants_means_one_default_tenant_of_weight_one() -> None:
    for data in ({"schema": SCHEMA_ID}, {"schema": SCHEMA_ID, "tenants": []},
                 {"schema": SCHEMA_ID, "tenants": None}):
        tenants = parse_config(data).tenants
        assert len(tenants) == 1
        assert tenants[0].name == "default"
        assert tenants[0].weight == 1.0
        assert tenants[0].api_key_sha256 is None
        assert tenants[0].max_active_sequences is None


@pytest.mark.req("R5.3.6", "R5.3.7")
def test_example_file_parses_with_tenants_models_and_trust() -> None:
    config = load_config(EXAMPLE_CONFIG_PATH)
    assert [t.name for t in config.tenants] == ["team-a", "team-b", "anonymous"]
    team_a = config.tenant("team-a")
    assert team_a.weight == 2.0
    assert team_a.max_active_sequences == 8
    assert team_a.max_waiting_tokens == 131072
    assert team_a.qps == 20.0
    assert config.tenant("anonymous").api_key_sha256 is None
    assert config.models[0].alias == "qwen3"
    assert config.trust.trusted_roots == (Path("/srv/calculet/packages"),)
    assert config.server.admin_token_sha256 is not None
    with pytest.raises(KeyError):
        config.tenant("nobody")


def test_example_file_restates_every_default_it_does_not_change() -> None:
    """The example documents the defaults: outside tenants/models/trust/server it is default."""
    example = load_config(EXAMPLE_CONFIG_PATH)
    default = default_config()
    for section in ("admission", "queues", "batch", "executor", "recovery", "monitoring"):
        assert getattr(example, section) == getattr(default, section), section


def test_relative_paths_are_relative_to_the_config_file(tmp_path: Path) -> None:
    (tmp_path / "conf").mkdir()
    file = tmp_path / "conf" / "scheduler.yaml"
    file.write_text(
        "schema: calculet-scheduler/v1\n"
        "models:\n  - alias: qwen3\n    package: ../packages/qwen3\n"
        "trust:\n  trusted_roots: [../packages, /abs/root]\n  trusted_keys_dir: keys\n"
    )
    config = load_config(file)
    base = file.resolve().parent
    assert config.models[0].package == base / "../packages/qwen3"
    assert config.trust.trusted_roots == (base / "../packages", Path("/abs/root"))
    assert config.trust.trusted_keys_dir == base / "keys"


def test_profiles_are_normalised_to_ascending_order() -> None:
    config = parse_config({"schema": SCHEMA_ID, "batch": {"profiles": [8, 1, 4]}})
    assert config.batch.profiles == (1, 4, 8)


def test_config_is_immutable() -> None:
    config = default_config()
    with pytest.raises(ValidationError):
        config.queues.decode_weight = 1  # type: ignore[misc]
    with pytest.raises(ValidationError):
        config.model_alias = "other"  # type: ignore[misc]


@pytest.mark.req("R5.3.2")
def test_wfq_decode_weight_is_separate_from_the_wrr_decode_weight() -> None:
    """Ambiguity 7: changing the WRR share does not change the WFQ cost multiplier."""
    config = parse_config({"schema": SCHEMA_ID, "queues": {"decode_weight": 6}})
    assert config.queues.decode_weight == 6
    assert config.queues.wfq_decode_weight == 8
    # The spec's worked example: 100 prompt + 8 * 10 output tokens = 180.
    assert 100 + default_config().queues.wfq_decode_weight * 10 == 180


@pytest.mark.req("R6.2", "R15.10", "R15.11")
@pytest.mark.parametrize(
    ("tokens", "queue"),
    [(1, "short"), (512, "short"), (513, "medium"), (4096, "medium"), (4097, "long"),
     (40_000, "long")],
)
def test_prefill_class_boundaries(tokens: int, queue: str) -> None:
    assert default_config().queues.prefill_class(tokens) == queue


@pytest.mark.req("R6.3", "R6.4")
def test_wrr_weights_follow_the_config() -> None:
    expected = {"decode": 8, "short": 4, "medium": 2, "long": 1}
    assert default_config().queues.wrr_weights() == expected
    tuned = parse_config(
        {"schema": SCHEMA_ID, "queues": {"decode_weight": 3, "long_prefill_weight": 2}}
    )
    assert tuned.queues.wrr_weights() == {"decode": 3, "short": 4, "medium": 2, "long": 2}


@pytest.mark.req("R5.1.1")
def test_capacity_budget_resolves_kv_and_inflight() -> None:
    budget = default_config().capacity_budget(device_kv_tokens=24_576)
    assert budget == CapacityBudget(
        max_sequences=16,
        max_kv_tokens=24_576,
        max_waiting_requests=128,
        max_waiting_prompt_tokens=262_144,
        max_inflight_jobs=1,
    )
    lowered = parse_config({"schema": SCHEMA_ID, "admission": {"max_kv_tokens": 8192}})
    assert lowered.capacity_budget(24_576).max_kv_tokens == 8192
    # A configured value can only lower the planned capacity, never raise it.
    assert lowered.capacity_budget(4096).max_kv_tokens == 4096
    pingpong = parse_config({"schema": SCHEMA_ID, "executor": {"max_inflight": 2}})
    assert pingpong.capacity_budget(1).max_inflight_jobs == 2
    with pytest.raises(ValueError):
        lowered.admission.kv_token_limit(-1)


def test_json_schema_is_complete_and_serialisable() -> None:
    schema = config_json_schema()
    json.dumps(schema)
    assert schema["$id"] == SCHEMA_ID
    assert schema["properties"]["schema"]["const"] == SCHEMA_ID
    assert schema["required"] == ["schema"]
    assert schema["additionalProperties"] is False
    assert set(schema["properties"]) == {
        "schema", "model_alias", "admission", "queues", "batch", "executor", "recovery",
        "monitoring", "tenants", "models", "trust", "server", "device",
    }
    for name, definition in schema["$defs"].items():
        assert definition.get("additionalProperties") is False, name
        for field, spec in definition["properties"].items():
            assert spec.get("description"), f"{name}.{field} has no description"


def test_every_model_field_is_documented() -> None:
    """The doc generator renders field descriptions; none may be missing."""
    for value in vars(config_module).values():
        ours = isinstance(value, type) and value.__module__.startswith(config_module.__name__ + ".")
        if ours and issubclass(value, BaseModel):
            for field_name, info in value.model_fields.items():
                assert info.description, f"{value.__name__}.{field_name}"
