"""Batch profiles (§2, §7.3, §8): selection table, configurable thresholds, fail fast, Ready gates."""

from __future__ import annotations

import pytest

from calculet.errors import ConfigError, DefinitionError
from calculet.runtime.scheduling.profiles import LaneFill, ProfileSet, ProfileSpec
from tests.unit.runtime.runtime_support import make_config, profile

THRESHOLDS = {16: 12, 8: 6, 4: 3}


def pset(sizes, thresholds=THRESHOLDS, multi=True, manifest=None):
    manifest = manifest if manifest is not None else [profile(b) for b in sizes]
    return ProfileSet(manifest, requested=list(sizes), thresholds=thresholds, multi_profile_residency=multi)


@pytest.mark.req("R8.1")
@pytest.mark.parametrize("ready", [0, 1, 2, 3, 5, 6, 11, 12, 20])
@pytest.mark.parametrize("sizes", [(1,), (1, 4), (1, 4, 8), (1, 4, 8, 16), (1, 8)])
def test_select_profile_table(ready, sizes):
    def spec_policy() -> int:  # the §8 example policy, written out
        if ready >= 12 and 16 in sizes:
            return 16
        if ready >= 6 and 8 in sizes:
            return 8
        if ready >= 3 and 4 in sizes:
            return 4
        return 1
    assert pset(sizes).select_profile(ready, oldest_wait=0.0).compiled_batch == spec_policy()


@pytest.mark.req("R8.1")
def test_select_profile_examples():
    assert pset((1, 4, 8)).select_profile(12, 0.0).compiled_batch == 8
    assert pset((1, 8)).select_profile(5, 0.0).compiled_batch == 1


@pytest.mark.req("R8.1")
@pytest.mark.parametrize("sizes", [(1,), (1, 4), (1, 4, 8), (1, 4, 8, 16), (1, 8)])
def test_the_largest_profile_is_what_selection_picks_past_every_threshold(sizes):
    """``largest`` (the on-time policy's device model and lanes, session 24) is one name for the former
    ``select_profile(2**31)``: the largest usable size. Fails with it the smallest, or computed from the requested
    sizes rather than the usable ones (next test)."""
    profiles = pset(sizes)
    assert profiles.largest is profiles.select_profile(2**31)
    assert profiles.largest.compiled_batch == max(sizes)


@pytest.mark.req("R8.2")
def test_thresholds_come_from_configuration():
    config = make_config(batch={"profiles": [1, 4, 8], "select_thresholds": {4: 2, 8: 4}})
    profiles = pset((1, 4, 8), thresholds=config.batch.select_thresholds)
    assert [profiles.select_profile(n).compiled_batch for n in range(6)] == [1, 1, 4, 4, 8, 8]


@pytest.mark.req("R8.4")
def test_without_multi_profile_residency_one_fixed_profile_serves():
    with pytest.raises(ConfigError, match="one fixed profile per instance"):
        pset((1, 8), multi=False)
    fixed = pset((8,), multi=False, manifest=[profile(1), profile(8)])
    assert fixed.fixed and {fixed.select_profile(n).compiled_batch for n in range(20)} == {8}


@pytest.mark.req("R17.1.6", "R15.19", "R2.7")
def test_a_profile_missing_from_the_manifest_fails_fast():
    with pytest.raises(ConfigError, match="B8"):
        ProfileSet([profile(1)], requested=[1, 8], thresholds=THRESHOLDS, multi_profile_residency=True)
    config = make_config(batch={"profiles": [1, 8]})
    with pytest.raises(ConfigError, match="not compiled"):
        ProfileSet([profile(1)], requested=config.batch.profiles, thresholds=config.batch.select_thresholds,
                   multi_profile_residency=True)
    with pytest.raises(ConfigError):
        pset((1,)).get(8)


@pytest.mark.req("R7.3.3", "R7.3.2")
def test_a_batched_profile_without_mask_contract_never_enters_ready():
    manifest = [profile(1), ProfileSpec(4, 8192, LaneFill(7), has_mask_contract=False)]
    profiles = ProfileSet(manifest, requested=[1, 4], thresholds=THRESHOLDS, multi_profile_residency=True)
    assert profiles.sizes == (1,) and "mask contract" in profiles.unusable[4]
    assert {profiles.select_profile(n).compiled_batch for n in range(20)} == {1}
    assert profiles.largest.compiled_batch == 1
    with pytest.raises(ConfigError, match="mask contract"):
        profiles.get(4)
    with pytest.raises(ConfigError, match="no requested profile may enter Ready"):
        ProfileSet(manifest[1:], requested=[4], thresholds=THRESHOLDS, multi_profile_residency=False)


@pytest.mark.req("R7.3.1")
def test_inactive_policy_never_defaults_to_token_zero():
    with pytest.raises(DefinitionError, match="token 0"):
        LaneFill(0)
    no_fill = ProfileSpec(8, 8192, None, has_mask_contract=True)
    assert "inactive-lane policy" in (no_fill.unusable_reason or "")
    assert ProfileSpec(1, 8192, None, has_mask_contract=False).unusable_reason is None


@pytest.mark.req("R2.5", "R2.8")
def test_profile_fields_and_the_current_product():
    spec = profile(1)
    assert (spec.compiled_batch, spec.max_seq) == (1, 8192)
    current = ProfileSet([profile(1)], requested=[1], thresholds=THRESHOLDS, multi_profile_residency=False)
    assert current.sizes == (1,)
    with pytest.raises(DefinitionError):
        ProfileSpec(0, 10, None, False)
