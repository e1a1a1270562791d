"""manifest.json (calbin-package/v1): schema, contract views, reproducible builds."""

from __future__ import annotations

import copy
import hashlib
import json
from pathlib import Path
from typing import Any

import pytest

from calculet.adapters.calrt import EvidenceSource, EvidenceTier, MaskContract
from calculet.packages.manifest import MANIFEST_FILE, CalbinManifest
from calculet.adapters.sim import package_dir
from calculet.adapters.sim.build import build_package, main
from calculet.errors import PackageError


def manifest_dict(variant: str = "current") -> dict[str, Any]:
    data: dict[str, Any] = json.loads((package_dir(variant) / MANIFEST_FILE).read_bytes())  # type: ignore[arg-type]
    return data


@pytest.mark.req("R2.8", "R15.18")
def test_current_product_manifest_has_exactly_b1() -> None:
    m = CalbinManifest.from_path(package_dir("current"))
    assert m.format == "calbin-package/v1" and m.calrt_version == "0.7.6"
    assert m.profile_batches() == (1,)
    assert [p.compiled_batch for p in m.batch_profiles()] == [1]
    assert m.device_capabilities().simulated_enabled() == ()


@pytest.mark.req("R1.4", "R2.7", "R20.7")
def test_future_manifest_offers_batched_profiles_only_as_simulated_c3() -> None:
    m = CalbinManifest.from_path(package_dir("future"))
    profiles = m.batch_profiles()
    assert [p.compiled_batch for p in profiles] == [1, 4, 8, 16]
    assert all(p.usable for p in profiles)
    assert {p.tier for p in profiles if p.compiled_batch > 1} == {EvidenceTier.C3}
    caps = m.device_capabilities()
    assert caps.ping_pong.value and caps.ping_pong.source is EvidenceSource.SIMULATED
    assert caps.incremental_prefill.tier is EvidenceTier.C3 and not caps.incremental_prefill.proved
    assert not caps.lane_failure_isolation.value
    assert set(caps.simulated_enabled()) == {"incremental_prefill", "max_inflight_jobs", "ping_pong",
                                             "ping_pong_overlap", "multi_profile_residency",
                                             "reset_configuration_verified"}
    for p in profiles:
        assert p.tensor("token_ids").shape == (p.compiled_batch,)
        assert p.tensor("logits").shape == (p.compiled_batch, m.architecture.vocab_size)


def test_files_map_lists_sha256_and_size_and_from_path_needs_no_signature() -> None:
    pkg = package_dir("current")
    assert not (pkg / "manifest.sig").exists()
    m = CalbinManifest.from_path(pkg)
    for rel, entry in m.files.items():
        data = (pkg / rel).read_bytes()
        assert entry.size == len(data) and entry.sha256 == hashlib.sha256(data).hexdigest()
    assert m.to_json_bytes() == (pkg / MANIFEST_FILE).read_bytes()


@pytest.mark.req("R7.3.2")
@pytest.mark.parametrize("field", ["mask", "kv_manager_mode", "inactive_writes_kv", "inactive_logits_returned"])
def test_profile_missing_any_of_the_four_inactive_lane_items_is_rejected(field: str) -> None:
    data = manifest_dict("future")
    del data["profiles"][1]["inactive_policy"][field]
    with pytest.raises(PackageError, match=f"profiles.1.inactive_policy.{field}"):
        CalbinManifest.parse(data)


@pytest.mark.req("R7.3.1")
def test_profile_filling_inactive_lanes_with_token_zero_is_rejected() -> None:
    data = manifest_dict("future")
    data["profiles"][2]["inactive_policy"]["fill_token"] = 0
    with pytest.raises(PackageError, match="token 0"):
        CalbinManifest.parse(data)
    del data["profiles"][2]["inactive_policy"]["fill_token"]
    with pytest.raises(PackageError, match="fill_token"):
        CalbinManifest.parse(data)


@pytest.mark.req("R7.3.3")
def test_b4_without_mask_contract_loads_but_is_not_usable(tmp_path: Path) -> None:
    m = build_package(tmp_path, variant="future", profiles=[1, 4], batched_mask=MaskContract.NONE)
    b1, b4 = m.batch_profiles()
    assert b1.usable and not b4.usable
    assert "never enters Ready" in (b4.unusable_reason or "")


@pytest.mark.req("R20.7")
def test_simulated_capability_with_a_better_tier_than_the_spec_is_rejected() -> None:
    data = manifest_dict("future")
    data["capabilities"]["ping_pong"]["tier"] = "C0"
    with pytest.raises(PackageError, match="only vendor or measured evidence"):
        CalbinManifest.parse(data)
    data["capabilities"]["ping_pong"]["source"] = "vendor"
    assert CalbinManifest.parse(data).device_capabilities().ping_pong.proved
    del data["capabilities"]["ping_pong"]["tier"]
    with pytest.raises(PackageError, match="must state its tier"):
        CalbinManifest.parse(data)


@pytest.mark.req("R9.3.9")
def test_manifest_cannot_declare_an_empty_context_op_supported() -> None:
    data = manifest_dict("future")
    data["capabilities"]["context_ops"]["copy_prefix"] = {"value": "supported", "source": "simulated"}
    with pytest.raises(PackageError, match="empty implementation"):
        CalbinManifest.parse(data)


@pytest.mark.parametrize(("mutate", "needle"), [
    (lambda d: d.update(format="calbin-package/v2"), "format"),
    (lambda d: d.update(calrt_version="0.8.0"), "0.7.6"),
    (lambda d: d["files"].update({"../escape.bin": {"sha256": "0" * 64, "size": 1}}), "inside the package"),
    (lambda d: d["files"].update({"/etc/passwd": {"sha256": "0" * 64, "size": 1}}), "inside the package"),
    (lambda d: d.update(profiles=[p for p in d["profiles"] if p["compiled_batch"] != 1]), "B1 profile"),
    (lambda d: d["profiles"].append(copy.deepcopy(d["profiles"][1])), "duplicate compiled_batch"),
    (lambda d: d["profiles"][1].update(max_seq=100000), "max_seq"),
    (lambda d: d.update(unexpected=1), "unexpected"),
    (lambda d: d["files"].pop("weights.bin"), "weights file"),
    (lambda d: d["memory"].update(reserved_bytes=1), "reserved_bytes"),
    (lambda d: d["capabilities"]["max_inflight_jobs"].update(value=3), "two engines"),
    (lambda d: d["capabilities"].pop("lane_failure_isolation"), "lane_failure_isolation"),
])
def test_malformed_manifests_fail_as_package_errors(mutate: Any, needle: str) -> None:
    data = manifest_dict("future")
    mutate(data)
    with pytest.raises(PackageError, match=needle):
        CalbinManifest.parse(json.dumps(data))


def test_missing_manifest_is_a_package_error(tmp_path: Path) -> None:
    with pytest.raises(PackageError, match="cannot read"):
        CalbinManifest.from_path(tmp_path)


def test_builds_are_byte_for_byte_reproducible(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main([str(tmp_path / "a"), "--variant", "future", "--profiles", "1,4"]) == 0
    assert main([str(tmp_path / "b"), "--variant", "future", "--profiles", "1,4"]) == 0
    assert "profiles [1, 4]" in capsys.readouterr().out
    for name in ("manifest.json", "weights.bin"):
        assert (tmp_path / "a" / name).read_bytes() == (tmp_path / "b" / name).read_bytes()
    assert (tmp_path / "a" / "weights.bin").stat().st_size < 400_000


@pytest.mark.req("R13.1.5")
def test_reference_memory_figures_are_the_spec_figures() -> None:
    m = CalbinManifest.from_path(package_dir("current", memory="reference"))
    fp = m.memory_footprint()
    gib = 1 << 30
    assert round(fp.parameter_bytes / gib, 3) == 16.938
    assert round(fp.kv_bytes / gib, 3) == 3.750 and fp.kv_dtype == "bf16"
    assert round(fp.reserved_bytes / gib, 3) == 28.150
    assert round(fp.runtime_bytes / gib, 3) == 7.462


# --- §6 prefill chunk size on the B1 profile ------------------------------------------------


def _chunked(variant: str, chunk: Any, batch: int = 1) -> dict[str, Any]:
    data = manifest_dict(variant)
    profile = next(p for p in data["profiles"] if p["compiled_batch"] == batch)
    profile["prefill_chunk_tokens"] = chunk
    return data


@pytest.mark.req("R6.5", "R6.6")
def test_a_chunk_size_without_incremental_prefill_is_refused() -> None:
    """The current product declares no incremental prefill (§6), so a chunk size would be a lie."""
    with pytest.raises(PackageError, match="incremental_prefill is false"):
        CalbinManifest.parse(_chunked("current", 128))
    data = _chunked("future", 128)
    data["capabilities"]["incremental_prefill"]["value"] = False
    with pytest.raises(PackageError, match="incremental_prefill is false"):
        CalbinManifest.parse(json.dumps(data))


@pytest.mark.parametrize(("chunk", "batch", "needle"), [
    (0, 1, "greater than or equal to 1"),
    (-16, 1, "greater than or equal to 1"),
    (True, 1, "valid integer"),
    (512.0, 1, "valid integer"),
    ("512", 1, "valid integer"),
    (100_000, 1, "exceeds the profile's max_seq"),
    (16, 4, "only the B1 profile"),
])
def test_bad_chunk_sizes_are_refused(chunk: Any, batch: int, needle: str) -> None:
    with pytest.raises(PackageError, match=needle):
        CalbinManifest.parse(json.dumps(_chunked("future", chunk, batch)))


def test_a_declared_chunk_size_reaches_the_b1_contract_and_round_trips() -> None:
    m = CalbinManifest.parse(json.dumps(_chunked("future", 16)))
    assert [p.prefill_chunk_tokens for p in m.batch_profiles()] == [16, None, None, None]
    assert CalbinManifest.parse(m.to_json_bytes()) == m
    assert b'"prefill_chunk_tokens": 16' in m.to_json_bytes()


@pytest.mark.parametrize("variant", ["current", "future"])
def test_without_a_chunk_size_the_manifest_bytes_are_unchanged(variant: str, tmp_path: Path) -> None:
    """An absent chunk size is not serialised (not even as null): old packages keep their bytes and signatures."""
    pkg = package_dir(variant)  # type: ignore[arg-type]
    raw = (pkg / MANIFEST_FILE).read_bytes()
    assert b"prefill_chunk_tokens" not in raw
    assert CalbinManifest.from_path(pkg).to_json_bytes() == raw
    rebuilt = build_package(tmp_path, variant=variant, prefill_chunk_tokens=None)  # type: ignore[arg-type]
    assert rebuilt.to_json_bytes() == raw


def test_the_builder_writes_the_chunk_on_b1_only(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main([str(tmp_path / "c"), "--variant", "future", "--max-seq", "1024",
                 "--prefill-chunk-tokens", "512"]) == 0
    data = json.loads((tmp_path / "c" / MANIFEST_FILE).read_bytes())
    assert {p["compiled_batch"]: p.get("prefill_chunk_tokens") for p in data["profiles"]} == {
        1: 512, 4: None, 8: None, 16: None}
    assert data["architecture"]["max_seq"] == 1024
    with pytest.raises(PackageError, match="incremental_prefill is false"):
        build_package(tmp_path / "d", variant="current", prefill_chunk_tokens=16)
    assert not (tmp_path / "d" / MANIFEST_FILE).exists(), "nothing is written for a refused manifest"
