"""Fail-fast cross-validation of the config against the manifest and the device contract."""

from __future__ import annotations

import pytest

from calculet.config import SCHEMA_ID, SchedulerConfig, cross_validate, default_config, parse_config
from calculet.errors import ConfigError

B1_MANIFEST = {1}
FULL_MANIFEST = {1, 4, 8, 16}
LABEL = "manifest of package qwen3-b1"


def _with(**sections: dict[str, object]) -> SchedulerConfig:
    return parse_config({"schema": SCHEMA_ID, **sections})


@pytest.mark.req("R15.18", "R2.8", "R1.2")
def test_default_config_matches_the_current_b1_product() -> None:
    cross_validate(default_config(), manifest_profiles=B1_MANIFEST, manifest_label=LABEL)


@pytest.mark.req("R15.19", "R2.7", "R17.1.6")
def test_b8_missing_from_a_b1_manifest_fails_fast_naming_profile_and_manifest() -> None:
    config = _with(batch={"profiles": [1, 8], "select_thresholds": {8: 6}})
    with pytest.raises(ConfigError) as caught:
        cross_validate(
            config, manifest_profiles=B1_MANIFEST, manifest_label=LABEL,
            multi_profile_residency=True,
        )
    message = str(caught.value)
    assert "batch.profiles: profile 8 (B8) is not compiled in " + LABEL in message
    assert "compiled batches: [1]" in message
    assert caught.value.context["errors"][0][0] == "batch.profiles"  # type: ignore[index]


@pytest.mark.req("R15.18", "R1.4")
@pytest.mark.parametrize("profiles", [[4], [1, 4], [16], [1, 4, 8, 16]])
def test_any_profile_list_other_than_b1_fails_on_the_current_manifest(profiles: list[int]) -> None:
    config = _with(batch={"profiles": profiles})
    with pytest.raises(ConfigError, match="is not compiled in"):
        cross_validate(config, manifest_profiles=B1_MANIFEST, multi_profile_residency=True)


@pytest.mark.req("R1.4", "R8.4")
def test_batch_profiles_pass_against_a_simulated_batch_manifest() -> None:
    config = _with(batch={"profiles": [1, 4, 8, 16]})
    cross_validate(config, manifest_profiles=FULL_MANIFEST, multi_profile_residency=True)


@pytest.mark.req("R8.4")
def test_several_profiles_need_multi_profile_residency() -> None:
    config = _with(batch={"profiles": [1, 16]})
    with pytest.raises(ConfigError, match="one profile per instance"):
        cross_validate(config, manifest_profiles=FULL_MANIFEST, multi_profile_residency=False)
    # One fixed profile per instance pool is fine without residency.
    cross_validate(_with(batch={"profiles": [16]}), manifest_profiles=FULL_MANIFEST)


@pytest.mark.req("R1.3", "R15.14")
def test_pingpong_needs_the_capability() -> None:
    config = _with(executor={"max_inflight": 2})
    with pytest.raises(ConfigError, match=r"executor.max_inflight: 2 needs the ping/pong"):
        cross_validate(config, manifest_profiles=B1_MANIFEST, max_inflight_supported=2,
                       ping_pong=False)
    with pytest.raises(ConfigError, match=r"supports at most 1"):
        cross_validate(config, manifest_profiles=B1_MANIFEST, max_inflight_supported=1,
                       ping_pong=True)
    cross_validate(config, manifest_profiles=B1_MANIFEST, max_inflight_supported=2, ping_pong=True)


@pytest.mark.req("R1.8", "R3.4")
def test_more_than_one_physical_device_fails_fast() -> None:
    config = _with(executor={"physical_devices": 2})
    with pytest.raises(ConfigError) as caught:
        cross_validate(config, manifest_profiles=B1_MANIFEST)
    message = str(caught.value)
    assert "executor.physical_devices: 2 physical devices requested" in message
    assert "CalRT 0.7.6" in message
    assert "one process per board" in message
    cross_validate(config, manifest_profiles=B1_MANIFEST, physical_devices_supported=2,
                   runtime_label="future runtime")


def test_every_problem_is_reported_together() -> None:
    config = _with(
        batch={"profiles": [1, 8], "select_thresholds": {8: 6}},
        executor={"max_inflight": 2, "physical_devices": 3},
    )
    with pytest.raises(ConfigError) as caught:
        cross_validate(config, manifest_profiles=B1_MANIFEST)
    paths = [path for path, _ in caught.value.context["errors"]]  # type: ignore[union-attr]
    assert paths == [
        "batch.profiles",
        "batch.profiles",
        "executor.max_inflight",
        "executor.max_inflight",
        "executor.physical_devices",
    ]


def test_a_manifest_without_profiles_is_refused() -> None:
    with pytest.raises(ConfigError, match="declares no compiled batch profile"):
        cross_validate(default_config(), manifest_profiles=set())

