"""Issue #13: an ``on_time`` refusal says "never" only when the request is late even on an idle device; any other
refusal carries a ``Retry-After`` from the estimate, and a retry then, on the drained device, is admitted.

Virtual time on the sans-io scheduler (FakeClock, device by hand). The device is shaped like the reference cost
(§8: a step's time grows with the compiled batch), exaggerated so the two figures are far apart: a B1 step takes
0.05 s, a B4 step 0.2 s. Under a load of four streams the per-token time is ~0.2 s; alone, 0.05 s.
"""

from __future__ import annotations

import pytest

from calculet.runtime.scheduling.decode import DecodeBatch
from calculet.runtime.scheduling.on_time_retry import RetrySlots, retry_placement
from tests.unit.runtime.runtime_support import Harness

STEP_S = {1: 0.05, 4: 0.2}
PREFILL_S = 0.01
DEADLINE_MS = 5_000
FITS_ALONE = 41
"""New tokens of a request that fits alone (40 steps x 0.05 s = 2 s) but not under the load (40 x 0.2 s = 8 s)."""
NEVER = 201
"""... and of one that is late even alone (200 steps x 0.05 s = 10 s > 5 s)."""


def advance(h: Harness, until: float | None = None, *, drained: bool = False) -> None:
    """Play the device: each job takes its profile's time. Stops at ``until`` (no job is started after it) or,
    with ``drained``, once no request is left."""
    while True:
        if drained and len(h.scheduler.registry) == 0:
            return
        if until is not None and h.clock.now() >= until - 1e-12:
            return
        plan = h.step()
        work = plan.work
        if work is None:
            wake = plan.wake_at if plan.wake_at is not None else h.clock.now() + 0.01
            stop = wake if until is None else min(wake, until)
            h.clock.advance(max(1e-3, stop - h.clock.now()))
            h.confirm_all()
            continue
        h.scheduler.submitted(work.job_id)
        h.clock.advance(STEP_S[work.profile.compiled_batch] if isinstance(work, DecodeBatch) else PREFILL_S)
        h.complete(work)
        h.confirm_all()


def loaded() -> Harness:
    """One request decodes alone first (the fastest step is measured), then four streams share the B4 profile."""
    h = Harness.build(sizes=(1, 4), lanes=4, admission={"max_sequences": 4})
    h.submit(prompt=8, new=400, deadline_ms=600_000)
    advance(h, 1.0)
    for _ in range(3):
        assert not h.submit(prompt=8, new=400, deadline_ms=600_000).outcome.rejected
    advance(h, 20.0)  # the smoothed step converges on the B4 step
    model = h.scheduler.on_time.model()
    assert model is not None and model.lane_step_s > 0.15  # the load's per-token time: a request of FITS_ALONE is late
    return h


@pytest.mark.req("R5.2.2", "R5.2.4")
def test_late_under_load_but_fitting_an_idle_device_gets_a_retry_after_and_the_retry_is_admitted():
    """Mutants caught: "never" judged on the loaded per-token time (retry_placement's ``alone`` = ``length``, or
    alone_model keeping the measured step: Retry-After None); the retry placed before the kept lanes drain (lower
    bound ``now``: the retry comes while the four streams hold the device and is refused); a candidate on an idle
    device judged on the loaded figure (the retry is refused)."""
    h = loaded()
    now = h.clock.now()
    refused = h.submit(prompt=8, new=FITS_ALONE, deadline_ms=DEADLINE_MS)
    outcome = refused.outcome
    assert outcome.http_status == 429 and "never" not in outcome.reason
    assert outcome.retry_after_s is not None and outcome.retry_after_s > 0
    retry_at = now + outcome.retry_after_s
    advance(h, retry_at)
    assert len(h.scheduler.registry) == 0  # the estimate's drain time: the four streams are done by then
    retry = h.submit(prompt=8, new=FITS_ALONE, deadline_ms=DEADLINE_MS)
    assert not retry.outcome.rejected
    advance(h, drained=True)
    done = h.sinks[retry.request_id]
    assert done.outcome.state == "completed" and h.clock.now() <= retry_at + DEADLINE_MS / 1000


@pytest.mark.req("R5.2.2")
def test_late_even_alone_is_never():
    """Mutant caught: "never" dropped (every refusal placed in the retry slots: a Retry-After for a request that no
    retry can ever fit)."""
    h = loaded()
    refused = h.submit(prompt=8, new=NEVER, deadline_ms=DEADLINE_MS)
    assert refused.outcome.http_status == 429 and refused.outcome.retry_after_s is None
    assert "never" in refused.outcome.reason
    advance(h, drained=True)  # and on the idle device it is refused the same way: admission judges it alone
    again = h.submit(prompt=8, new=NEVER, deadline_ms=DEADLINE_MS)
    assert again.outcome.http_status == 429 and again.outcome.retry_after_s is None


def test_retry_placement_places_by_the_load_fits_alone_after_the_drain_or_never():
    """The rule the planner and the HTTP front share. Mutants caught: the loaded length kept for a request that
    fits only alone (its ghost over-reserves, and its lower bound is the loaded estimator's); the drain time taken
    as the earliest free lane instead of the last; "never" judged on ``length``."""
    free = [3.0, 7.0, 5.0]
    assert retry_placement(free, 1.0, 2.0, 1.0, 4.0, 3.0) == (2.0, 3.0, False)   # fits under the load: as before
    assert retry_placement(free, 1.0, 6.0, 1.5, 4.0, 3.0) == (1.5, 7.0, True)    # fits alone: every lane free
    assert retry_placement(free, 1.0, 2.0, 1.5, 4.0, None) == (1.5, 7.0, True)   # no fitting instant under the load
    assert retry_placement(free, 1.0, 6.0, 4.5, 4.0, 3.0) is None                # late alone: never
    assert retry_placement([], 1.0, 6.0, 1.5, 4.0, None) == (1.5, 1.0, True)     # nothing kept: now
    assert retry_placement([0.5], 1.0, 6.0, 1.5, 4.0, None) == (1.5, 1.0, True)  # every lane free already: now


def test_requests_that_fit_only_alone_are_placed_one_after_the_other():
    """Each is judged alone at its retry, so the next one's retry waits for the previous one's ghost. Mutant
    caught: ``drained`` ignored by the slots (both placed at the drain time: the second retry finds the first
    request on the device, is judged sharing it and refused again)."""
    slots = RetrySlots()
    free = [3.0, 7.0]
    first = slots.reserve(free, "k", 1.0, 2.0, 4.0, 7.0, "t", drained=True)
    second = slots.reserve(free, "k", 1.0, 2.0, 4.0, 7.0, "t", drained=True)
    assert first == 7.0 and second == 9.0
