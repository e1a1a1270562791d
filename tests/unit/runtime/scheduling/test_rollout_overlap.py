"""Issue #13 session 22: ping/pong's overlap measured (:class:`~calculet.runtime.scheduling.estimates.OverlapTimer`) and played by the rollout (§14).

Values in, values out (virtual time, no simulator, no sleep): the device's mechanics the tests state are the
simulated device's (``CostModel.finish_time``): a job submitted while the other engine's job runs progresses at the
overlap rate until that one ends, then at full rate; the earlier job is not slowed. Each docstring names the mutant
the test was seen to fail on (applied by hand, the test run, reverted).
"""

from __future__ import annotations

import pytest

from calculet.runtime.scheduling.decode_rollout import DeviceShape, Present, rollout_finish
from calculet.runtime.scheduling.estimates import OverlapTimer
from tests.unit.runtime.runtime_support import Harness

SOLO_B16, SOLO_B1, RATE = 0.080, 0.0425, 0.5


def _device_end(start: float, seconds: float, other_end: float | None, rate: float = RATE) -> float:
    """The simulated device's rule, written out here (the test's oracle)."""
    if other_end is None or other_end <= start:
        return start + seconds
    window = other_end - start
    if rate * window >= seconds:
        return start + seconds / rate
    return other_end + seconds - rate * window


@pytest.mark.req("R14.1")
def test_the_rate_and_a_large_batch_own_step_come_from_overlapped_steps() -> None:
    """A B1 step alone (42.5 ms) gives B1's own time; a B1 step submitted 20 ms into a B16 step gives the rate (0.5);
    then a B16 step overlapped throughout by a prefill still running (160 ms) and one partly overlapped give B16's own
    80 ms, though B16 never ran alone. Mutants caught: the overlap not taken out of an overlapped step (B16 read 160
    ms); the full-overlap case read as no overlap (``overlap`` returning 0 when an earlier job is still in flight: B16
    160 ms); the rate as the work over the job's whole time instead of over its overlap."""
    timer = OverlapTimer(smoothing=1.0)
    timer.completed(0.0, SOLO_B1, None, compiled=1)  # alone
    assert timer.solo_steps() == {1: SOLO_B1} and timer.rate == 0.0
    b16_end = 0.1 + SOLO_B16  # a B16 step from 0.1, solo at its submit
    timer.completed(0.1, b16_end, None, compiled=16)
    b1_end = _device_end(0.12, SOLO_B1, b16_end)
    timer.completed(0.12, b1_end, None, compiled=1)
    assert timer.rate == pytest.approx(RATE)
    # a prefill submitted at 1.0 still running when the B16 step submitted at 1.01 completes: overlapped throughout
    end = _device_end(1.01, SOLO_B16, 5.0)
    timer.completed(1.01, end, ahead=1.0, compiled=16)
    assert timer.solo_steps()[16] == pytest.approx(SOLO_B16)
    assert timer.rate == pytest.approx(RATE)


@pytest.mark.req("R14.1")
def test_a_prefill_own_cost_has_its_overlap_taken_out() -> None:
    """Two prefills of 100 and 500 tokens (own cost 5 ms + 0.6 ms a token), each submitted 30 ms into a decode step of
    80 ms: the device slows them while the decode runs; the fitted own cost is the device's (65 ms, 305 ms). Mutant
    caught: the prefill's measured time fitted as its cost (the overlap left in: +25 ms on each, fixed 30 ms)."""
    timer = OverlapTimer(smoothing=0.5)
    timer.completed(0.0, SOLO_B1, None, compiled=1)
    timer.completed(0.1, 0.1 + SOLO_B16, None, compiled=16)
    timer.completed(0.12, _device_end(0.12, SOLO_B1, 0.18), None, compiled=1)
    assert timer.rate == pytest.approx(RATE)
    for start, tokens in ((1.0, 100), (3.0, 500)):
        decode_end = start + SOLO_B16
        timer.completed(start, decode_end, None, compiled=16)
        own = 0.005 + 0.0006 * tokens
        timer.completed(start + 0.03, _device_end(start + 0.03, own, decode_end), None, tokens=tokens)
    fixed, per_token = timer.prefill.cost()
    assert fixed == pytest.approx(0.005) and per_token == pytest.approx(0.0006)


def _shape(overlap: float | None) -> DeviceShape:
    return DeviceShape(lanes=32, engines=2, profile_of=lambda n: 16 if n >= 12 else (1 if n < 3 else 4),
                       step_s=lambda key: 0.040 + 0.0025 * key, prefill_s=lambda tokens: 0.005 + 0.0006 * tokens,
                       overlap=overlap)


@pytest.mark.req("R14.1")
def test_the_rollout_slows_the_later_job_as_the_device_does() -> None:
    """One sequence decoding 3 more tokens; the candidate's 100-token prompt asks 1 token, so it finishes with its
    prefill. §6's WRR puts the decode step (42.5 ms) on one engine at 0 and the prefill (65 ms) on the other beside it:
    the device runs the prefill at half rate until the step ends, so it ends at 86.25 ms, not 65. Then a candidate of
    3 tokens behind a long prefill: its decode steps beside the prefill run at half speed. Mutants caught: the overlap
    ignored (``_overlapped`` returning ``t + seconds``: 65 ms); a prefill's overlap ignored (its end ``t + seconds``
    in ``_fill``: 65 ms)."""
    present = Present(decoding=(3,))
    got = rollout_finish(present, 100, 1, 0.0, _shape(RATE))
    assert got == pytest.approx(_device_end(0.0, 0.005 + 0.06, 0.0425))
    # the keyed model (no rate measured): the prefill beside a decode step at its own cost
    assert rollout_finish(present, 100, 1, 0.0, _shape(None)) == pytest.approx(0.065)


@pytest.mark.req("R14.1")
def test_decode_steps_beside_a_long_prefill_run_at_the_rate() -> None:
    """The candidate (1-token prompt, 3 tokens asked: 2 decode steps after its prefill) and, ahead of it in prefill
    order, a 2 000-token prompt (1.205 s). Device, by hand: §6's WRR serves the short class first, the candidate's
    prefill (5.6 ms) on one engine, the long prefill beside it (slowed until 5.6 ms, then full rate to about 1.2 s);
    each of the candidate's decode steps is then submitted while the long prefill runs: half rate, 85 ms each, not
    42.5. Mutant caught: a decode step beside a prefill at its own time (the keyed model's partner 0: 42.5 ms, the
    finish 90.6 ms)."""
    present = Present(prefilling=((2000, 4),))
    shape = DeviceShape(lanes=32, engines=2, profile_of=lambda n: 1, step_s=lambda key: 0.040 + 0.0025 * key,
                        prefill_s=lambda tokens: 0.005 + 0.0006 * tokens, overlap=RATE)
    got = rollout_finish(Present(), 1, 3, 0.0, shape)  # alone: two steps after the prefill
    assert got == pytest.approx(0.0056 + 2 * 0.0425)
    got = rollout_finish(present, 1, 3, 0.0, shape)
    long_end = _device_end(0.0, 0.005 + 0.0006 * 2000, 0.0056)
    first = _device_end(0.0056, 0.0425, long_end)
    second = _device_end(first, 0.0425, long_end)
    assert got == pytest.approx(second)
    assert second == pytest.approx(first + 0.085)


def test_the_applier_tells_the_overlap_timer_each_completion() -> None:
    """Two B4 decode jobs on the two engines through the scheduler (FakeClock): A alone from 0 to 100 ms, B submitted
    at 50 ms and completed at 175 ms (slowed to half rate while A ran). The applier's completions give B4's own 100
    ms and the rate 0.5. Mutant caught: no call from the applier (rate 0, no own step)."""
    h = Harness.build(sizes=(4,), lanes=8, executor={"max_inflight": 2})
    timer = h.scheduler.step_times.overlap = OverlapTimer(smoothing=1.0)
    for _ in range(8):
        h.submit(prompt=8, new=1000)
    assert h.prefill_all() == 8
    start = h.clock.now()
    a = h.next_decode()
    h.scheduler.submitted(a.job_id)
    h.clock.advance(0.05)
    b = h.next_decode()
    h.scheduler.submitted(b.job_id)
    h.clock.advance(start + 0.1 - h.clock.now())
    h.complete(a)
    h.confirm_all()
    h.clock.advance(start + 0.175 - h.clock.now())
    h.complete(b)
    assert timer.solo_steps() == {4: pytest.approx(0.1)}
    assert timer.rate == pytest.approx(0.5)


def _one_step_then_submit(h: Harness) -> Harness:
    """A request prefilled and one decode step measured (the policy's device model needs one), then a submit."""
    h.submit(prompt=8, new=100, deadline_ms=600_000)
    h.prefill_all()
    work = h.next_decode()
    h.scheduler.submitted(work.job_id)
    h.clock.advance(0.05)
    h.complete(work)
    h.confirm_all()
    h.submit(prompt=8, new=100, deadline_ms=600_000)
    return h


@pytest.mark.req("R14.1")
def test_the_policy_measures_the_overlap_on_b_gt_1_ping_pong_only() -> None:
    """The ``on_time`` policy hands the step timer an overlap timer where the rollout reports under ping/pong (B>1, two
    jobs in flight), and none on one engine (nothing there pays for it). Mutants caught: never wired (the rollout
    keeps the keyed model); wired whatever the engines; its measurements left out of the policy's ``statistics()``
    (DESIGN: statistics() on every component)."""
    pingpong = _one_step_then_submit(Harness.build(sizes=(1, 4), lanes=8, executor={"max_inflight": 2},
                                                   admission={"max_sequences": 8}))
    timer = pingpong.scheduler.step_times.overlap
    assert isinstance(timer, OverlapTimer)
    assert pingpong.scheduler.on_time.statistics().overlap == timer.statistics()
    one = _one_step_then_submit(Harness.build(sizes=(1, 4), lanes=4, admission={"max_sequences": 4}))
    assert one.scheduler.step_times.overlap is None
    assert one.scheduler.on_time.statistics().overlap is None


@pytest.mark.req("R14.1")
def test_the_rollout_is_handed_the_measured_overlap_and_own_steps(monkeypatch: pytest.MonkeyPatch) -> None:
    """Under ping/pong, once the overlap timer has a rate, the policy's rollout runs on it: the shape carries the rate,
    each compiled batch's own step (B1 42.5 and B16 80 ms measured, B4 50 ms on their line) and the prefill's own cost.
    Before a rate, the keyed model (no ``overlap``). Mutants caught: the rate not passed to the shape (``overlap``
    None: the keyed model kept); the step timer's keyed steps used with the rate (B16 read the smoothed key); the
    prefill's measured cost kept in place of its own; the long-task quota not passed (``long_admitted`` None)."""
    from calculet.runtime.scheduling import on_time

    h = _one_step_then_submit(Harness.build(sizes=(1, 4, 16), lanes=32, executor={"max_inflight": 2},
                                            admission={"max_sequences": 32}))
    policy, timer = h.scheduler.on_time, h.scheduler.step_times.overlap
    shapes: list[DeviceShape] = []

    def spy(present: Present, prompt: int, output: int, now: float, shape: DeviceShape, *args: object,
            **kwargs: object) -> float:
        shapes.append(shape)
        return now + 1.0

    monkeypatch.setattr(on_time, "rollout_finish", spy)
    rec = h.scheduler.registry.live()[-1]
    policy._rollout_finish(rec, h.clock.now(), h.scheduler.registry.live)
    assert shapes[-1].overlap is None  # no rate yet: the keyed model
    timer.completed(10.0, 10.0 + SOLO_B1, None, compiled=1)
    timer.completed(10.1, 10.1 + SOLO_B16, None, compiled=16)
    timer.completed(10.12, _device_end(10.12, SOLO_B1, 10.1 + SOLO_B16), None, compiled=1)
    timer.completed(11.0, 11.0 + 0.065, None, tokens=100)
    timer.completed(12.0, 12.0 + 0.305, None, tokens=500)
    policy._rollout_finish(rec, h.clock.now(), h.scheduler.registry.live)
    shape = shapes[-1]
    assert shape.overlap == pytest.approx(RATE)
    assert shape.step_s(16) == pytest.approx(SOLO_B16) and shape.step_s(4) == pytest.approx(0.050)
    assert shape.prefill_s(300) == pytest.approx(0.005 + 0.0006 * 300)
    assert shape.long_admitted == 1  # the shipped admission.long_prefill_quota.max_admitted (R6.11)


def _quota_shape(engines: int, quota: int | None) -> DeviceShape:
    return DeviceShape(lanes=8, engines=engines, profile_of=lambda n: 4, step_s=lambda key: 0.05,
                       prefill_s=lambda tokens: 0.001 * tokens, overlap=RATE if engines == 2 else None,
                       long_admitted=quota)


@pytest.mark.req("R6.11")
def test_a_long_prompt_waits_for_the_long_task_quota_and_the_ones_behind_it_pass() -> None:
    """§6's long-task quota of 1 (R6.11): one 8 000-token prompt prefilling, another waiting, then the candidate (100
    tokens, 20 asked) on ping/pong. The waiting long prompt stays out while the candidate passes it: the candidate's
    prefill (0.1 s) beside the long one, then 19 steps of 50 ms at half rate beside it: 2.0 s. Then a long candidate
    behind the long prompt on one engine: admitted when that prefill is done (8 s), its own 5 s after: 13 s. Mutants
    caught: the quota ignored (the two long prefills fill both engines and the candidate's steps wait: 9.55 s); the
    quota's slot never freed (the long candidate never admitted: None)."""
    present = Present(prefilling=((8000, 2),), waiting=((8000, 2),))
    assert rollout_finish(present, 100, 20, 0.0, _quota_shape(2, 1)) == pytest.approx(2.0)
    assert rollout_finish(present, 100, 20, 0.0, _quota_shape(2, None)) == pytest.approx(9.55)  # no quota stated
    behind = Present(prefilling=((8000, 1),))  # its one token comes with its prefill
    assert rollout_finish(behind, 5000, 1, 0.0, _quota_shape(1, 1)) == pytest.approx(13.0)
