"""Issue #20 (left from #13): the alone model's fastest step starts afresh with the device.

``OnTimePlanner.alone_model`` judges a request the device would serve alone (nothing kept) and "never" on the
fastest decode step measured. That figure stood for the device as it once was: after a device reset, or on a
new generation's profile set, a device that has since slowed was still judged at its old speed, so a request
late on it was admitted to serve alone (optimistic admission) and then missed its deadline. Virtual time on the
sans-io scheduler (FakeClock, device played by hand).
"""

from __future__ import annotations

import pytest

from calculet.runtime.scheduling.decode import DecodeBatch
from tests.unit.runtime.runtime_support import Harness, profile_set

FAST_S = 0.05
SLOW_S = 0.3
PREFILL_S = 0.01
NEW = 41
"""40 decode steps: 2 s at the fast step, 12 s at the slow one."""
DEADLINE_MS = 5_000


def play(h: Harness, step_s: float) -> None:
    """Run the device until no request is left, each decode step taking ``step_s``."""
    while len(h.scheduler.registry):
        plan = h.step()
        work = plan.work
        if work is None:
            h.clock.advance(0.01)
            h.confirm_all()
            continue
        h.scheduler.submitted(work.job_id)
        h.clock.advance(step_s if isinstance(work, DecodeBatch) else PREFILL_S)
        h.complete(work)
        h.confirm_all()


def slowed_device() -> Harness:
    """A B1 device measured fast first, then slowed for long enough that the smoothed step is the slow one."""
    h = Harness.build(sizes=(1,), lanes=4, admission={"max_sequences": 4, "initial_margin": 0.0})
    assert not h.submit(prompt=8, new=60, deadline_ms=600_000).outcome.rejected
    play(h, FAST_S)
    assert not h.submit(prompt=8, new=200, deadline_ms=600_000).outcome.rejected
    play(h, SLOW_S)
    policy = h.scheduler.on_time
    assert policy is not None
    model = policy.model()
    assert model is not None and model.decode_step_s > 0.9 * SLOW_S
    return h


def test_without_a_restart_the_alone_model_keeps_the_fastest_step():
    """The design the restart bounds (issue #13): a device that merely slowed keeps its fastest step, so a retry
    is refused again rather than told "never" — here the request fits alone at the fast step and is admitted."""
    h = slowed_device()
    assert not h.submit(prompt=8, new=NEW, deadline_ms=DEADLINE_MS).outcome.rejected


@pytest.mark.req("R5.2.2")
def test_after_a_device_reset_a_request_late_on_the_device_is_refused_never():
    """Mutant caught: ``OnTimePolicy.mark`` (the device reset) without ``planner.restart()`` — the request is
    admitted on the pre-reset fastest step (2 s of decode) and then runs 12 s past a 5 s deadline."""
    h = slowed_device()
    h.scheduler.device_reset("test reset")
    sub = h.submit(prompt=8, new=NEW, deadline_ms=DEADLINE_MS)
    assert sub.outcome.http_status == 429 and sub.outcome.retry_after_s is None  # late even alone: "never"


@pytest.mark.req("R5.2.2")
def test_on_a_new_generations_profile_set_a_request_late_on_the_device_is_refused_never():
    """Mutant caught: ``OnTimePolicy.model`` keeping the fastest step across a new profile set (no
    ``planner.restart()``): admitted on the old generation's fastest step."""
    h = slowed_device()
    h.scheduler.generations.profiles = profile_set((1,), h.scheduler.config)  # the next generation's
    sub = h.submit(prompt=8, new=NEW, deadline_ms=DEADLINE_MS)
    assert sub.outcome.http_status == 429 and sub.outcome.retry_after_s is None


def test_a_restart_keeps_the_models_equal_to_those_built_afresh():
    """After a restart the admitting model is rebuilt from the device as measured now, and the alone one from the
    step measured since (mutant caught: the alone model read from the pre-restart cache)."""
    h = slowed_device()
    policy = h.scheduler.on_time
    assert policy is not None
    planner = policy.planner
    model = policy.model()
    assert model is not None
    before = planner.admitting_model(model)
    alone_before = planner.admitting_alone()
    assert alone_before is not None and alone_before.decode_step_s < model.decode_step_s  # the fast step
    h.scheduler.device_reset("test reset")
    model = policy.model()
    assert model is not None
    admitting = planner.admitting_model(model)
    assert admitting == before == model.slowed(1.0 + planner.errors.margin)
    alone = planner.admitting_alone()
    assert alone == planner.alone_model(model).slowed(1.0 + planner.errors.margin)
    assert alone is not None and alone.decode_step_s == admitting.decode_step_s
