"""Device memory accounting (§13.1): no room is assumed for a second large model."""

from __future__ import annotations

import pytest

from calculet.adapters.calrt import DeviceInvalidArgument, DeviceOutOfMemory, JobKind, ReturnCode
from calculet.adapters.sim import BoardPreset, SimCalRT, SimConfig, open_sim, package_dir
from calculet.adapters.sim.memory import GIB
from calculet.errors import CapacityExhausted
from calculet.clock import FakeClock


def split(reserved: int, chips: int = 2) -> int:
    """A reservation is spread evenly over its chiplets (rounded up per chip)."""
    return -(-reserved // chips) * chips


@pytest.mark.req("R13.1.5", "R13.2.2", "R1.7")
def test_reference_board_refuses_a_second_large_model_with_the_figures() -> None:
    cfg = SimConfig(clock=FakeClock(), board=BoardPreset.reference())
    with SimCalRT(cfg).create_virtual_device() as dev:
        first = dev.create_calbin(package_dir("current", memory="reference"))
        assert first.memory.reserved_bytes == round(28.150 * GIB)
        for chip in (0, 1):
            mem = dev.read_mem(chip)
            assert mem.total_bytes == 16 * GIB and round(mem.used_bytes / GIB, 3) == 14.075
        with pytest.raises(DeviceOutOfMemory) as exc:
            dev.create_calbin(package_dir("future", memory="reference"))
        err = exc.value
        assert err.rc is ReturnCode.OUT_OF_MEMORY and isinstance(err, CapacityExhausted)
        for figure in ("28.150 GiB", "16.938 GiB", "BF16 KV 3.750 GiB", "7.462 GiB", "32.000 GiB",
                       "3.850 GiB free", "'ref-sim-current'", "'ref-sim-future'", "§13.1"):
            assert figure in str(err), figure
        stats = dev.statistics().memory
        assert stats.reservations == 1 and stats.refused == 1 and stats.used_bytes == split(round(28.150 * GIB))


@pytest.mark.req("R12.9", "R13.3.3")
def test_tiny_board_accounts_calbin_kv_and_buffers_and_returns_to_baseline() -> None:
    with open_sim("future") as s:
        dev = s.device
        reserved = s.calbin.memory.reserved_bytes
        assert dev.statistics().memory.used_bytes == split(reserved)
        bufs = dev.allocate_job_buffers(s.calbin, JobKind.DECODE, 16)
        grown = dev.statistics().memory.used_bytes
        assert grown - reserved >= 16 * s.calbin.vocab_size * 8
        dev.free_job_buffers(bufs)
        assert sum(dev.read_mem(c).used_bytes for c in (0, 1)) == dev.statistics().memory.used_bytes
        with pytest.raises(DeviceInvalidArgument, match="chiplet 2"):
            dev.read_mem(2)
        dev.destroy_kv_manager(s.kv)
        dev.destroy_calbin(s.calbin)
        assert dev.statistics().memory.used_bytes == 0
        assert dev.statistics().memory.peak_used_bytes == grown
    tiny = BoardPreset.tiny()
    assert tiny.total_bytes == 128 << 20 and "assumed" in BoardPreset.reference().note
