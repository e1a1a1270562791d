"""Bad configurations: each is rejected with a message that names the field path."""

from __future__ import annotations

from pathlib import Path

import pytest

from calculet.config import load_config, parse_config
from calculet.errors import ConfigError, DefinitionError

HEAD = "schema: calculet-scheduler/v1\n"
KEY_A = "a" * 64
KEY_B = "b" * 64

# (case id, YAML text, expected message fragments)
BAD_CONFIGS: list[tuple[str, str, list[str]]] = [
    ("missing-schema", "model_alias: qwen3\n",
     ["schema: required", "calculet-scheduler/v1"]),
    ("unknown-schema", "schema: calculet-scheduler/v2\n",
     ["schema: unknown schema 'calculet-scheduler/v2'"]),
    ("schema-wrong-type", "schema: 1\n", ["schema: unknown schema 1"]),
    ("empty-file", "", ["empty", "schema: calculet-scheduler/v1"]),
    ("top-level-list", "- schema\n", ["top level must be a mapping"]),
    ("unknown-top-level-key", HEAD + "queue:\n  decode_weight: 8\n",
     ["queue: unknown key; did you mean 'queues'?"]),
    ("unknown-nested-key", HEAD + "queues:\n  decod_weight: 8\n",
     ["queues.decod_weight: unknown key; did you mean 'decode_weight'?", "allowed: decode_weight"]),
    ("unknown-deep-key", HEAD + "executor:\n  degrade:\n    p99: 0.1\n",
     ["executor.degrade.p99: unknown key"]),
    ("unknown-tenant-key", HEAD + "tenants:\n  - name: a\n    priority: 9\n",
     ["tenants[0].priority: unknown key"]),
    ("wrong-type-string", HEAD + "queues:\n  decode_weight: eight\n",
     ["queues.decode_weight: must be an integer, got string 'eight'"]),
    ("quoted-number", HEAD + "admission:\n  max_waiting_requests: '128'\n",
     ["admission.max_waiting_requests: must be an integer, got string '128'"]),
    ("float-for-int", HEAD + "admission:\n  deadline_default_ms: 1.5\n",
     ["admission.deadline_default_ms: must be an integer, got float 1.5"]),
    ("int-for-bool", HEAD + "executor:\n  fixed_engine: 1\n",
     ["executor.fixed_engine: must be true or false, got int 1"]),
    ("section-is-scalar", HEAD + "queues: 5\n", ["queues: must be a mapping, got int 5"]),
    ("zero-decode-weight", HEAD + "queues:\n  decode_weight: 0\n",
     ["queues.decode_weight: must be > 0"]),
    ("zero-long-weight", HEAD + "queues:\n  long_prefill_weight: 0\n",
     ["queues.long_prefill_weight: must be > 0"]),
    ("zero-wfq-weight", HEAD + "queues:\n  wfq_decode_weight: 0\n",
     ["queues.wfq_decode_weight: must be > 0"]),
    ("classes-overlap", HEAD + "queues:\n  short_prefill_max_tokens: 4096\n",
     ["queues.medium_prefill_max_tokens: must be > short_prefill_max_tokens (4096)"]),
    ("negative-tenant-weight", HEAD + "tenants:\n  - name: a\n    weight: -1\n",
     ["tenants[0].weight: must be > 0"]),
    ("zero-tenant-weight", HEAD + "tenants:\n  - name: a\n    weight: 0\n",
     ["tenants[0].weight: must be > 0"]),
    ("tenant-name-missing", HEAD + "tenants:\n  - weight: 1\n",
     ["tenants[0].name: required field is missing"]),
    ("tenant-name-not-a-label", HEAD + "tenants:\n  - name: team a\n",
     ["tenants[0].name: must match"]),
    ("duplicate-tenant", HEAD + f"tenants:\n  - name: a\n    api_key_sha256: {KEY_A}\n"
     f"  - name: a\n    api_key_sha256: {KEY_B}\n",
     ["tenants[1].name: duplicate tenant name 'a'"]),
    ("duplicate-key-hash", HEAD + f"tenants:\n  - name: a\n    api_key_sha256: {KEY_A}\n"
     f"  - name: b\n    api_key_sha256: {KEY_A}\n",
     ["tenants[1].api_key_sha256: same API key hash as tenants[0]"]),
    ("two-keyless-tenants", HEAD + "tenants:\n  - name: a\n  - name: b\n",
     ["tenants: tenants ['a', 'b'] have no api_key_sha256; at most one tenant"]),
    ("bad-key-hash", HEAD + "tenants:\n  - name: a\n    api_key_sha256: not-a-hash\n",
     ["tenants[0].api_key_sha256: must match"]),
    ("negative-qps", HEAD + "tenants:\n  - name: a\n    qps: -2\n",
     ["tenants[0].qps: must be > 0"]),
    ("profiles-empty", HEAD + "batch:\n  profiles: []\n", ["batch.profiles: must not be empty"]),
    ("profiles-not-a-list", HEAD + "batch:\n  profiles: 1\n",
     ["batch.profiles: must be a list, got int 1"]),
    ("profile-zero", HEAD + "batch:\n  profiles: [0]\n", ["batch.profiles[0]: must be > 0"]),
    ("profile-duplicate", HEAD + "batch:\n  profiles: [1, 8, 8]\n",
     ["batch.profiles: duplicate profile(s) [8]"]),
    ("profile-without-threshold", HEAD + "batch:\n  profiles: [1, 2]\n",
     ["batch.select_thresholds: no threshold for profile(s) [2]"]),
    ("threshold-for-b1", HEAD + "batch:\n  select_thresholds: {1: 1}\n",
     ["batch.select_thresholds[1] (key): must be > 1"]),
    ("thresholds-decrease", HEAD + "batch:\n  select_thresholds: {4: 8, 8: 6}\n",
     ["batch.select_thresholds: threshold of profile 8 (6) is below that of the smaller "
      "profile 4"]),
    ("negative-window", HEAD + "batch:\n  batching_window_us: -1\n",
     ["batch.batching_window_us: must be >= 0"]),
    ("lane-share-above-one", HEAD + "batch:\n  max_tenant_lane_share: 1.5\n",
     ["batch.max_tenant_lane_share: must be <= 1.0"]),
    ("max-inflight-3", HEAD + "executor:\n  max_inflight: 3\n",
     ["executor.max_inflight: must be 1 or 2, got 3"]),
    ("max-inflight-0", HEAD + "executor:\n  max_inflight: 0\n",
     ["executor.max_inflight: must be > 0"]),
    ("fixed-engine-with-pingpong", HEAD + "executor:\n  max_inflight: 2\n  fixed_engine: true\n",
     ["executor.fixed_engine: cannot be true with max_inflight 2"]),
    ("zero-devices", HEAD + "executor:\n  physical_devices: 0\n",
     ["executor.physical_devices: must be > 0"]),
    ("p99-ratio-zero", HEAD + "executor:\n  degrade:\n    p99_regression_ratio: 0\n",
     ["executor.degrade.p99_regression_ratio: must be > 0"]),
    ("negative-resets", HEAD + "recovery:\n  max_resets_per_10min: -1\n",
     ["recovery.max_resets_per_10min: must be >= 0"]),
    ("restart-flag-string", HEAD + "recovery:\n  restart_on_unknown_dma: 'true'\n",
     ["recovery.restart_on_unknown_dma: must be true or false, got string 'true'"]),
    ("monitoring-not-bool", HEAD + "monitoring:\n  invariants: on-demand\n",
     ["monitoring.invariants: must be true or false"]),
    ("long-quota-zero", HEAD + "admission:\n  long_prefill_quota:\n    max_admitted: 0\n",
     ["admission.long_prefill_quota.max_admitted: must be > 0"]),
    ("inflight-budget-above-executor", HEAD + "admission:\n  max_inflight_jobs: 2\n",
     ["admission.max_inflight_jobs: must be <= executor.max_inflight (1)"]),
    ("alias-not-in-models", HEAD + "models:\n  - alias: llama\n    package: /p\n",
     ["model_alias: 'qwen3' is not among models[].alias ['llama']"]),
    ("duplicate-model-alias", HEAD + "models:\n  - alias: qwen3\n    package: /a\n"
     "  - alias: qwen3\n    package: /b\n", ["models[1].alias: duplicate model alias 'qwen3'"]),
    ("model-package-missing", HEAD + "models:\n  - alias: qwen3\n",
     ["models[0].package: required field is missing"]),
    ("port-out-of-range", HEAD + "server:\n  port: 70000\n", ["server.port: must be <= 65535"]),
    ("empty-host", HEAD + "server:\n  host: ''\n", ["server.host: must not be empty"]),
    ("max-file-bytes-zero", HEAD + "trust:\n  max_file_bytes: 0\n",
     ["trust.max_file_bytes: must be > 0"]),
    ("duplicate-yaml-key", HEAD + "queues:\n  decode_weight: 8\nqueues:\n  decode_weight: 1\n",
     ["invalid YAML", "duplicate key 'queues'", "line 4"]),
    ("yaml-syntax", HEAD + "queues: [unclosed\n", ["invalid YAML"]),
]


@pytest.mark.req("R15.1")
@pytest.mark.parametrize(
    ("text", "fragments"), [pytest.param(t, f, id=i) for i, t, f in BAD_CONFIGS]
)
def test_bad_config_is_rejected_naming_the_field(
    tmp_path: Path, text: str, fragments: list[str]
) -> None:
    file = tmp_path / "scheduler.yaml"
    file.write_text(text)
    with pytest.raises(ConfigError) as caught:
        load_config(file)
    message = str(caught.value)
    assert message.startswith(str(file)), message
    for fragment in fragments:
        assert fragment in message, f"{fragment!r} not in:\n{message}"


def test_all_problems_are_reported_at_once() -> None:
    data = {
        "schema": "calculet-scheduler/v1",
        "queues": {"decode_weight": 0, "short_prefill_weight": -1},
        "batch": {"profiles": []},
        "server": {"port": 0},
    }
    with pytest.raises(ConfigError) as caught:
        parse_config(data, source="inline")
    paths = [path for path, _ in caught.value.context["errors"]]  # type: ignore[union-attr]
    assert paths == [
        "queues.decode_weight",
        "queues.short_prefill_weight",
        "batch.profiles",
        "server.port",
    ]
    assert str(caught.value).startswith("inline: 4 invalid settings:")


def test_schema_is_checked_before_anything_else() -> None:
    """A file for another schema is reported as that, not as a flood of field errors."""
    with pytest.raises(ConfigError) as caught:
        parse_config({"schema": "calculet-scheduler/v2", "queues": {"bogus": 1}})
    assert caught.value.context["errors"] == [  # type: ignore[comparison-overlap]
        ("schema", "unknown schema 'calculet-scheduler/v2'; this calculet reads "
                   "'calculet-scheduler/v1'")
    ]


def test_missing_file_is_a_config_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="config file not found"):
        load_config(tmp_path / "absent.yaml")


def test_unreadable_file_is_a_config_error(tmp_path: Path) -> None:
    file = tmp_path / "binary.yaml"
    file.write_bytes(b"\xff\xfe\x00garbage")
    with pytest.raises(ConfigError, match="cannot read config file"):
        load_config(file)


def test_config_error_is_a_definition_error() -> None:
    with pytest.raises(DefinitionError) as caught:
        parse_config({})
    assert caught.value.http_status == 500
    assert caught.value.code == "config_error"


def test_yaml_tags_that_build_objects_are_refused(tmp_path: Path) -> None:
    """The loader is a SafeLoader: a config file cannot instantiate Python objects."""
    file = tmp_path / "evil.yaml"
    file.write_text(HEAD + "model_alias: !!python/object/apply:os.getcwd []\n")
    with pytest.raises(ConfigError, match="invalid YAML"):
        load_config(file)
