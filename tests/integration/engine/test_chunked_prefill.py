"""§6 chunked prefill end to end on a simulated package that declares a chunk size.

The ``future`` package built with ``prefill_chunk_tokens=512`` declares incremental prefill (a
simulated capability) and a 512-token chunk on its B1 profile. Checked with real numerics:

* the device: prefilling 1300 tokens in chunks at 512 and 1024 gives the same KV, logits and next
  decode step as one-shot prefill (the test_sim_golden comparison, at this package's boundaries),
  and a chunk that does not start on a multiple of the declared size is refused;
* the engine: a 1300-token prompt is prefilled as 3 jobs (512 + 512 + 276), the scheduler counts
  3 chunked jobs, and the greedy tokens equal those of the same prompt on the same package
  without a chunk size (one prefill job).

Simulated evidence of the software path only: R6.6–R6.10 still need the NPU (§20).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from calculet.adapters.calrt import DeviceInvalidArgument
from calculet.adapters.host_driver import HostDriver
from calculet.adapters.sim import BoardPreset, SimCalRT, SimConfig
from calculet.adapters.sim.build import build_package
from calculet.adapters.sim.model import TinyConfig
from calculet.clock import FakeClock
from calculet.runtime.engine.driver import EngineDriver
from calculet.runtime.engine.types import EngineOptions, GenerateRequest
from calculet.runtime.execution.sampler import SamplingParams
from calculet.runtime.streams.writer import StreamWriter
from tests.integration.engine.support import RecordingRuntime, assert_clean, engine_config
from tests.integration.sim.test_golden import assert_chunked_equals_one_shot

CHUNK = 512
MAX_SEQ = 2048
"""Room for a 1300-token prompt plus its output (the tiny default context is 256)."""
PROMPT = (256, *np.random.default_rng(1300).integers(0, 256, size=1299).tolist())
NEW_TOKENS = 6


@pytest.fixture(scope="module")
def packages(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """The same tiny model with and without the B1 chunk declaration (same weights: same seed/context)."""
    root = tmp_path_factory.mktemp("chunked-pkg")
    out = {}
    for name, chunk in (("chunked", CHUNK), ("plain", None)):
        build_package(root / name, variant="future", config=TinyConfig(max_seq=MAX_SEQ), name=f"tiny-{name}",
                      prefill_chunk_tokens=chunk)
        out[name] = root / name
    return out


def sim_config(clock: FakeClock) -> SimConfig:
    # 64 KV sequences of 2048 tokens do not fit the tiny board; the reference board has room.
    return SimConfig(clock=clock, numerics=True, board=BoardPreset.reference())


@pytest.fixture
def chunked_driver(packages: dict[str, Path]) -> Iterator[HostDriver]:
    device = SimCalRT(sim_config(FakeClock())).create_virtual_device()
    try:
        calbin = device.create_calbin(packages["chunked"])
        device.configure(calbin, None)
        yield HostDriver(device, calbin, device.create_kv_manager(calbin))
    finally:
        device.close()


@pytest.mark.req("R6.7", "R6.9")
def test_chunks_at_the_declared_boundaries_equal_one_shot_prefill(chunked_driver: HostDriver) -> None:
    assert chunked_driver.calbin.profile(1).prefill_chunk_tokens == CHUNK
    assert_chunked_equals_one_shot(chunked_driver, list(PROMPT), [CHUNK, 2 * CHUNK])


def test_a_chunk_off_the_declared_boundary_is_refused(chunked_driver: HostDriver) -> None:
    """Each chunk must start on a multiple of the declared size; the last one may be short."""
    kv = chunked_driver.kv
    off, on = kv.allocate_sequence(), kv.allocate_sequence()
    try:
        assert chunked_driver.prefill(off, list(PROMPT[:500])).ok
        with pytest.raises(DeviceInvalidArgument, match="not a multiple of the B1 profile's prefill_chunk_tokens"):
            chunked_driver.prefill(off, list(PROMPT[500:700]))
        assert kv.committed_length(off) == 500
        assert chunked_driver.prefill(on, list(PROMPT[:CHUNK])).ok
        assert chunked_driver.prefill(on, list(PROMPT[CHUNK:700])).ok
        assert kv.committed_length(on) == 700
    finally:
        kv.free_sequence(off)
        kv.free_sequence(on)


def serve(package: Path) -> tuple[tuple[int, ...], list[int], int]:
    """Greedy tokens of PROMPT on ``package``, the token counts of its prefill jobs, and the
    scheduler's chunked-job count."""
    clock = FakeClock()
    runtime = RecordingRuntime(sim_config(clock))
    driver = EngineDriver(engine_config(profiles=(1, 4, 8, 16)), runtime, package, clock=clock,  # type: ignore[arg-type]
                          options=EngineOptions(verify_golden=True, monitor_mode=None))
    runtime.jobs.clear()  # the golden check's jobs are bring-up, not the workload
    lengths: list[int] = []
    inner_submit = runtime.device.submit

    def submit(job):  # type: ignore[no-untyped-def]
        if job.kind.value == "prefill":
            lengths.append(len(job.tokens))
        return inner_submit(job)

    runtime.device.submit = submit  # type: ignore[method-assign]
    stream = StreamWriter()
    params = SamplingParams(temperature=0.0, ignore_eos=True)
    assert not driver.submit(GenerateRequest(PROMPT, NEW_TOKENS, sampling=params), stream).outcome.rejected
    driver.run_until_idle()
    result = stream.result(0)
    assert result.outcome.state == "completed", result.outcome
    chunked = driver.statistics().scheduler.prefill.chunked_jobs
    assert_clean(driver)
    driver.stop()
    return result.raw_tokens, lengths, chunked


@pytest.mark.req("R6.5", "R6.10")
def test_a_1300_token_prompt_runs_as_three_chunks_with_the_unchunked_tokens(packages: dict[str, Path]) -> None:
    chunked_tokens, chunked_jobs, chunked_count = serve(packages["chunked"])
    plain_tokens, plain_jobs, plain_count = serve(packages["plain"])
    assert chunked_jobs == [512, 512, 276] and chunked_count == 3
    assert plain_jobs == [1300] and plain_count == 0, "no chunk size declared: one prefill job (§6, R6.5)"
    assert len(chunked_tokens) == NEW_TOKENS and chunked_tokens == plain_tokens
