"""Issue #13 session 18: the ``on_time`` planner's lane-free bet (:func:`.on_time_refusal.lane_free_bet`).

A request the estimate refuses is admitted when a KV lane is free now beside the kept work and it finishes by its
deadline at the best per-token time its decode set can give it (the measured step of the §8 profile the kept jobs and
it select, times their rotation); its outcome is not scored by the admission margin. Virtual time on the sans-io
scheduler (FakeClock, device by hand), shaped like the reference cost and exaggerated: a B1 step 0.05 s, a B4 step
0.2 s (§8 thresholds: B4 from 3 ready). Four long streams load the long window's per-token time to ~0.2 s.
"""

from __future__ import annotations

import pytest

from tests.unit.runtime.runtime_support import Harness
from tests.unit.runtime.scheduling.test_on_time_never import advance  # the device by hand: B1 0.05 s, B4 0.2 s a step
STEPS = 40
"""Decode steps of the candidate (``new`` = 41): 2 s alone on B1, 4 s rotating with one other stream on B1, 8 s at
the loaded window's ~0.2 s a token."""


def loaded(long_streams: int, long_new: int = 2_000, long_deadline_ms: int = 600_000) -> Harness:
    """B1 measured first (one request alone), then four streams on B4 until the long window reads ~0.2 s a token;
    at 30 s the short ones have ended, leaving ``long_streams`` of ``long_new`` tokens still decoding."""
    h = Harness.build(sizes=(1, 4), lanes=4, admission={"max_sequences": 4})
    h.submit(prompt=8, new=10, deadline_ms=600_000)  # done in 0.5 s: B1 measured
    advance(h, 1.0)
    for k in range(4):
        new, deadline_ms = (long_new, long_deadline_ms) if k < long_streams else (120, 600_000)
        assert not h.submit(prompt=8, new=new, deadline_ms=deadline_ms).outcome.rejected
    advance(h, 30.0)  # the short streams ended (~120 x 0.2 s) and their KV lanes are free
    policy = h.scheduler.on_time
    model = policy.model()
    assert model is not None and model.lane_step_s > 0.15  # the estimate: 40 steps take over 6 s
    assert policy.planner.kept_count == long_streams
    return h


@pytest.mark.req("R5.2.2")
def test_a_lane_free_candidate_that_fits_at_its_profiles_step_is_admitted_and_finishes_on_time():
    """Mutant caught: the old rule (no bet: refused 429 by the loaded estimate, 40 x ~0.2 s > 5 s)."""
    h = loaded(long_streams=1)
    start = h.clock.now()
    sub = h.submit(prompt=8, new=STEPS + 1, deadline_ms=5_000)  # 2 sequences on B1 rotate: 40 x 0.1 s = 4 s
    assert not sub.outcome.rejected
    assert h.scheduler.on_time.planner.bets == {sub.request_id}
    advance(h, start + 5.0)
    assert h.sinks[sub.request_id].outcome.state == "completed"


@pytest.mark.req("R5.2.2")
def test_the_bound_counts_the_candidate_in_its_decode_set():
    """Mutant caught: the profile and rotation read for the kept jobs alone (``len(kept)``, off by one): one sequence
    on B1 is 40 x 0.05 = 2 s and would admit; with the candidate two rotate, 4 s > 3 s: refused."""
    h = loaded(long_streams=1)
    sub = h.submit(prompt=8, new=STEPS + 1, deadline_ms=3_000)
    assert sub.outcome.rejected and sub.outcome.http_status == 429
    assert not h.scheduler.on_time.planner.bets


@pytest.mark.req("R5.2.2")
def test_no_bet_without_a_free_lane():
    """Mutant caught: the lane-free test dropped: four streams hold the four lanes until ~35 s (about 25 tokens left
    at 30 s, deadline 41 s, before the candidate's in EDF order), so the candidate waits for a lane and the estimate
    finishes it at ~43 s, past its 41.5 s; its bound, five sequences rotating on B4 from now (40 x 0.25 s = 10 s),
    would fit it."""
    h = loaded(long_streams=4, long_new=170, long_deadline_ms=40_000)
    sub = h.submit(prompt=8, new=STEPS + 1, deadline_ms=11_500)
    assert sub.outcome.rejected
    assert not h.scheduler.on_time.planner.bets


@pytest.mark.req("R5.2.2")
def test_a_bets_outcome_is_not_scored_by_the_margin():
    """Mutants caught: a bet scored like an estimated admission (its outcome counted, a late one raising the margin
    that every admission on the estimate then pays); a bet not counted in the statistics."""
    h = loaded(long_streams=1)
    planner = h.scheduler.on_time.planner
    before = planner.errors.statistics().outcomes
    sub = h.submit(prompt=8, new=STEPS + 1, deadline_ms=5_000)
    assert planner.bets == {sub.request_id}
    advance(h, h.clock.now() + 5.0)
    assert h.sinks[sub.request_id].outcome.state == "completed"
    assert planner.errors.statistics().outcomes == before  # the long stream still decodes: nothing else ended
    assert not planner.bets  # forgotten when it ended
    stats = planner.statistics()
    assert (stats.bets, stats.bets_missed) == (1, 0)  # counted apart (mutant: not counted)


def test_the_step_timer_keeps_a_step_per_compiled_batch():
    """Mutant caught: one smoothed step for every profile (the bound would read B4's step for two sequences on B1),
    or a profile never measured read as measured (a bet on a step of 0)."""
    from calculet.runtime.scheduling.estimates import StepTimer

    timer = StepTimer()
    timer.observe(0.2, lanes=4, compiled=4, decoding=4, now=0.5)
    assert timer.step_at(4) == 0.0  # not asked to measure per batch: nothing kept per step
    timer.measure_per_batch()
    for k in range(8):
        timer.observe(0.2, lanes=4, compiled=4, decoding=4, now=1.0 + k)
        timer.observe(0.05, lanes=1, compiled=1, decoding=1, now=1.5 + k)
    assert timer.step_at(4) == pytest.approx(0.2) and timer.step_at(1) == pytest.approx(0.05)
    assert timer.step_at(8) == 0.0


def test_no_refusal_is_read_from_the_caches_while_a_lane_is_free():
    """Mutant caught: ``refusal_cache`` offered with a lane free (the engine's fast refusal and the HTTP front's
    snapshot would then refuse, from the loaded estimate, a candidate that :func:`lane_free_bet` admits)."""
    h = loaded(long_streams=1)
    planner = h.scheduler.on_time.planner
    planner.changed(False)  # an event: the next tick replans at the step measured now (no drift, nothing stale)
    h.step()
    assert planner.cache_drift() == 0 and not planner.stale and planner._cache is not None
    assert planner.bet_lanes == 4 and planner.kept_count == 1
    assert planner.refusal_cache() is None
