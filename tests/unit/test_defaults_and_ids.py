"""Small spec facts no other test names: id widths and the shipped defaults (§2, §13.3, §15, §19)."""

from __future__ import annotations

import pytest

from calculet.adapters.calrt import DeviceCapabilities, EvidenceTier
from calculet.config import default_config, load_config, DEFAULT_CONFIG_PATH
from calculet.machines import ModelMachine, RequestMachine
from calculet.runtime.request import GenerationId, RequestId

U64_MAX = 2**64 - 1


@pytest.mark.req("R2.1")
def test_request_and_generation_ids_are_unsigned_64_bit():
    """Python ints stand for uint64_t; the declarations accept the whole unsigned range."""
    assert RequestId is int and GenerationId is int
    r = RequestMachine.create(prompt_tokens=1, max_new_tokens=1, max_seq=2)
    r.fire("bind", gen=U64_MAX)
    assert r.generation == U64_MAX
    assert ModelMachine.create(generation=U64_MAX).generation == U64_MAX
    with pytest.raises(ValueError):
        ModelMachine.create(generation=0)  # generation ids start at 1; 0 means "unbound"


@pytest.mark.req("R15.2", "R15.12", "R13.1.1")
@pytest.mark.parametrize("config", [default_config(), load_config(DEFAULT_CONFIG_PATH)], ids=["defaults", "reference-file"])
def test_default_model_alias_and_profiles(config):
    assert config.model_alias == "qwen3"
    assert list(config.batch.profiles) == [1]


@pytest.mark.req("R19.8", "R1.3", "R15.14")
@pytest.mark.parametrize("config", [default_config(), load_config(DEFAULT_CONFIG_PATH)], ids=["defaults", "reference-file"])
def test_ping_pong_is_not_on_by_default(config):
    """Two jobs in flight need explicit opt-in until M2 sign-off (§19)."""
    assert config.executor.max_inflight == 1


@pytest.mark.req("R1.6", "R13.3.4")
def test_single_chiplet_models_are_off_and_rated_c3_on_calrt_076():
    caps = DeviceCapabilities.calrt_076_current()
    assert caps.chiplet_scoped_models.value is False
    assert caps.chiplet_scoped_models.tier is EvidenceTier.C3
