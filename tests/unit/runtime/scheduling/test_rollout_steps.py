"""Issue #13 session 21: the rollout's steps for profiles not measured yet, and the lengths of the law's mean path.

Values in, values out (virtual time; no simulator): :func:`.decode_rollout.measured_steps` (what a rollout reads for a
key the step timer has not measured: the affine line on one engine, the nearest measured key under ping/pong),
:meth:`.ArrivalLaw.lengths` (the sample the mean path's arrivals take their lengths from; session 22 removed the paths
drawn from the law, measured not to pay). Each docstring names the mutant the test
was seen to fail on (applied by hand, the test run, reverted).
"""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from calculet.runtime.scheduling.arrival_law import LENGTHS, MIN_FINISHED, ArrivalLaw, RatePiece
from calculet.runtime.scheduling.decode_rollout import DeviceShape, Present, measured_steps, rollout_finish


@pytest.mark.req("R8.1")
def test_one_engine_reads_an_unmeasured_profile_on_the_line_through_the_measured_ones() -> None:
    """B1 and B4 measured at 42.5 and 50 ms (40 + 2.5 ms a lane): B16, not run yet, is 80 ms on their line, B2 45 ms
    between them; a measured key is its own. Mutants caught: the long-window fallback for an unmeasured key (B16
    read 45 ms, the session-20 behaviour); extrapolation from the nearest key (B16 50 ms); interpolation dropped
    (B2 read on the least-squares line is the same here, so B2 also checks a bent table below)."""
    step = measured_steps({1: 0.0425, 4: 0.050}, fallback=0.045, affine=True)
    assert step(16) == pytest.approx(0.080)
    assert step(2) == pytest.approx(0.045)
    assert step(4) == 0.050
    bent = measured_steps({1: 0.040, 2: 0.060, 8: 0.070}, fallback=0.05, affine=True)
    assert bent(4) == pytest.approx(0.060 + 0.010 * 2 / 6)  # between 2 and 8, not on the fitted line


@pytest.mark.req("R8.1")
def test_the_line_never_slopes_down_and_one_key_is_not_a_line() -> None:
    """A noisy table whose fit slopes down (B2 60 ms, B4 50 ms): the slope is held at 0, so B16 and B1 read their mean
    (55 ms). One key measured: no line, the fallback for other keys. Mutants caught: a negative slope kept (B16 -10
    ms, B1 65 ms); a single key's step extended to every key (B16 read 45 ms instead of the fallback)."""
    step = measured_steps({2: 0.060, 4: 0.050}, fallback=0.03, affine=True)
    assert step(16) == pytest.approx(0.055) and step(1) == pytest.approx(0.055)
    single = measured_steps({1: 0.045}, fallback=0.07, affine=True)
    assert single(16) == 0.07 and single(1) == 0.045
    assert measured_steps({}, fallback=0.07, affine=True)(4) == 0.07


@pytest.mark.req("R14.1")
def test_ping_pong_reads_the_nearest_measured_key_not_a_line() -> None:
    """Under ping/pong a key sums the two jobs' batches (B16 alone and B8 beside B8 are both 16), so no line: an
    unmeasured key reads the nearest measured one, the larger on a tie. Mutants caught: the affine line under
    ping/pong (key 20 read 0.1 + 4 x slope, session 21's 31.6 -> 43.0 % row); the smaller key on a tie (key 3 read
    0.057)."""
    step = measured_steps({2: 0.057, 4: 0.065, 16: 0.080, 32: 0.107}, fallback=0.05, affine=False)
    assert step(20) == 0.080
    assert step(3) == 0.065
    assert step(28) == 0.107
    assert measured_steps({}, fallback=0.05, affine=False)(8) == 0.05


@dataclass
class Law:
    """A constant rate forever (what the mean path reads of ``ArrivalLaw``)."""

    rate: float
    mean_prompt_tokens: float = 100.0
    mean_output_tokens: float = 50.0

    def forecast(self, now: float, horizon_s: float) -> tuple[RatePiece, ...]:
        return (RatePiece(now, now + horizon_s, self.rate),)


def _shape() -> DeviceShape:
    return DeviceShape(lanes=8, engines=1, profile_of=lambda n: 8 if n > 4 else 4,
                       step_s={4: 0.05, 8: 0.06}.__getitem__, prefill_s=lambda tokens: 0.001 * tokens)


@pytest.mark.req("R5.2.2")
def test_on_time_statistics_export_the_learned_law_on_b_gt_1_and_none_on_b1() -> None:
    """``OnTimeStatistics.arrivals`` is the law's own statistics, the submits kept for it counted (told first), on
    B>1; None on B1 (no law). Mutants caught: the statistics read without telling the kept submits (arrivals 0 of
    2); the field left None on B>1."""
    from tests.unit.runtime.runtime_support import Harness

    b4 = Harness.build(sizes=(1, 4), lanes=4, admission={"max_sequences": 4})
    b4.submit(prompt=8, new=10, deadline_ms=600_000)
    b4.submit(prompt=9, new=10, deadline_ms=600_000)
    law = b4.scheduler.on_time.statistics().arrivals
    assert law is not None and law.arrivals == 2 and law.mean_prompt_tokens == 8.5
    b1 = Harness.build(sizes=(1,), lanes=4, admission={"max_sequences": 4})
    b1.submit(prompt=8, new=10, deadline_ms=600_000)
    assert b1.scheduler.on_time.statistics().arrivals is None


@pytest.mark.req("R5.2.2")
def test_the_mean_paths_arrivals_take_the_samples_quantiles_so_a_rare_long_prompt_is_not_spread_into_each() -> None:
    """The mean path's k-th arrival takes the sample's prompt and output at the k-th point of a low-discrepancy
    sequence. A sample of one prompt and one output is the means' path exactly; a sample of nineteen 10-token prompts
    and one of 10 000 (mean 509.5) puts the long one at its frequency (not among the first twenty arrivals here), so
    the candidate finishes earlier than on the mean path, where every arrival prefills 509 tokens. Mutants caught: the
    lengths ignored on the mean path (the two equal); the sequence's point not advanced (every arrival at quantile 0,
    the shortest: half long prompts in the sample then cost nothing)."""
    shape, present = _shape(), Present(decoding=(30, 60))
    means = Law(rate=2.0, mean_prompt_tokens=50.0, mean_output_tokens=20.0)
    assert rollout_finish(present, 100, 80, 0.0, shape, means, lengths=((50,), (20,))) == rollout_finish(
        present, 100, 80, 0.0, shape, means)
    sample = ((10,) * 19 + (10_000,), (20,) * 20)
    heavy = Law(rate=2.0, mean_prompt_tokens=sum(sample[0]) / 20, mean_output_tokens=20.0)
    spread = rollout_finish(present, 100, 80, 0.0, shape, heavy)
    quantiles = rollout_finish(present, 100, 80, 0.0, shape, heavy, lengths=sample)
    assert spread is not None and quantiles is not None and quantiles < spread
    half = rollout_finish(present, 100, 80, 0.0, shape, means, lengths=((10,) * 10 + (2_000,) * 10, (20,)))
    short = rollout_finish(present, 100, 80, 0.0, shape, means, lengths=((10,), (20,)))
    assert half is not None and short is not None and half > short
