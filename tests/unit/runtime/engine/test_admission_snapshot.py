"""The admission snapshot (issue #13, time to 429): the HTTP front refuses from it only what the engine refuses.

Virtual time, the sans-io scheduler driven by hand (FakeClock, a B1 device whose every job takes ``STEP``): the
snapshot is taken as the actor publishes it (after its last step), the front decides a candidate from it, then
the same candidate is submitted to the scheduler at the same instant — a front refusal the scheduler would
admit fails the test.
"""

from __future__ import annotations

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from calculet.runtime.engine.admission_snapshot import (HELD, HOLD_IN_FLIGHT, AdmissionSnapshot, EarlyAdmission,
                                                      take_snapshot)
from calculet.runtime.engine.early_refusal import EarlyRefusal
from calculet.runtime.scheduling.on_time_retry import RetrySlots
from tests.unit.runtime.runtime_support import Harness
from tests.unit.runtime.scheduling.retry_reference import PlainRetrySlots

STEP = 0.1
DEADLINE_MS = 3_000


def _harness(lanes: int = 1) -> Harness:
    return Harness.build(sizes=(lanes,), lanes=16, step_estimate_s=STEP,
                         admission={"max_sequences": 16, "deadline_default_ms": DEADLINE_MS})


def _snapshot(h: Harness, generation: int = 1, admitted: dict[str, int] | None = None) -> AdmissionSnapshot | None:
    return take_snapshot(h.scheduler, accepting=True, generation=generation, now=h.clock.now(), wake=None,
                         admitted=admitted or {})


def _job(h: Harness) -> bool:
    """One device job of STEP seconds, if the scheduler plans one; False when nothing was planned."""
    plan = h.step()
    if plan.work is None:
        return False
    h.scheduler.submitted(plan.work.job_id)
    h.clock.advance(STEP)
    h.complete(plan.work)
    h.confirm_all()
    return True


def _decide(front: EarlyAdmission, snap: AdmissionSnapshot | None, h: Harness, prompt: int,
            new: int) -> EarlyRefusal | None:
    return front.decide(lambda: snap, prompt_tokens=prompt, max_new_tokens=new, tenant="default", now=h.clock.now())


@pytest.mark.req("R5.2.2", "R5.2.4")
def test_the_front_refuses_what_the_engine_refuses_with_the_same_retry_after():
    h = _harness()
    for _ in range(3):  # three 1 s requests: the device is busy until 3 s (prefills aside)
        assert not h.submit(prompt=8, new=11).outcome.rejected
    snap = _snapshot(h)
    assert snap is not None and snap.deadline_s == DEADLINE_MS / 1000
    front = EarlyAdmission()
    refusal = _decide(front, snap, h, 8, 11)
    assert refusal is not None and refusal.retry_after_s is not None and refusal.retry_after_s >= 1
    engine = h.submit(prompt=8, new=11).outcome
    assert engine.http_status == 429 and engine.retry_after_s == refusal.retry_after_s
    # a second refusal is placed behind the first one's retry slot (the retries spread), as the engine's is
    second = _decide(front, snap, h, 8, 11)
    assert second is not None and second.retry_after_s is not None and second.retry_after_s > refusal.retry_after_s
    assert h.submit(prompt=8, new=11).outcome.retry_after_s == second.retry_after_s
    # late even on an idle device: refused with no retry time, as the engine does
    never = _decide(front, snap, h, 8, 40)
    assert never is not None and never.retry_after_s is None and never.retry_at is None
    assert h.submit(prompt=8, new=40).outcome.retry_after_s is None
    stats = front.statistics()
    assert stats.refused == 3 and stats.refused_never == 1 and stats.retry_slots == 2


def test_what_fits_or_what_the_snapshot_cannot_judge_goes_to_the_engine():
    h = _harness()
    front = EarlyAdmission()
    assert _snapshot(h) is None  # nothing kept: a lane is idle, every request fits or the engine decides
    assert _decide(front, _snapshot(h), h, 8, 11) is None
    assert not h.submit(prompt=8, new=11).outcome.rejected
    snap = _snapshot(h)
    assert snap is not None
    assert _decide(front, snap, h, 8, 5) is None  # fits behind the kept 1 s
    assert _decide(front, snap, h, 10**8, 11) is None  # more KV than the budget: the engine's 400, not a 429
    later = snap._replace(latest=h.clock.now() + 60)
    assert _decide(front, later, h, 8, 11) is None  # an earlier deadline than a kept one: the full EDF check
    expired = snap._replace(valid_until=h.clock.now())
    assert _decide(front, expired, h, 8, 40) is None  # the actor's timed wake-up is due
    # a snapshot the actor replaced while the front decided: forwarded, not refused
    reads = iter([snap, None])
    assert front.decide(lambda: next(reads), prompt_tokens=8, max_new_tokens=40, tenant="default",
                        now=h.clock.now()) is None
    forwarded = front.statistics().forwarded
    assert forwarded["no_snapshot"] == 1 and forwarded["fits"] == 1 and forwarded["kv_budget"] == 1
    assert forwarded["not_latest"] == 1 and forwarded["expired"] == 1 and forwarded["raced"] == 1
    assert front.statistics().refused == 0


def test_no_snapshot_while_work_that_left_the_kept_set_is_not_replanned():
    h = _harness()
    first = h.submit(prompt=8, new=11)
    h.submit(prompt=8, new=11)
    assert _snapshot(h) is not None
    h.scheduler.cancel(first.request_id)  # work left: the cached schedule over-states what is ahead
    assert _snapshot(h) is None
    _job(h)  # the next tick replans
    assert _snapshot(h) is not None


def test_a_refusal_at_submit_leaves_the_snapshot_usable():
    """A request the engine refuses was never in the kept schedule: its end does not make the cache stale (it
    did, and every later refusal of a burst paid a replan)."""
    h = _harness()
    for _ in range(3):
        h.submit(prompt=8, new=11)
    assert h.submit(prompt=8, new=11).outcome.http_status == 429
    assert _snapshot(h) is not None
    replans = h.scheduler.statistics().on_time.replans
    assert h.submit(prompt=8, new=11).outcome.http_status == 429
    assert h.scheduler.statistics().on_time.replans == replans  # the fast refusal: no replan


SUBMIT = st.tuples(st.just("submit"), st.sampled_from([4, 8, 30]), st.sampled_from([2, 6, 11, 24, 40]))
OPS = st.lists(st.one_of(SUBMIT, SUBMIT, SUBMIT, st.tuples(st.just("job"), st.integers(1, 12), st.just(0)),
                         st.tuples(st.just("idle"), st.integers(1, 20), st.just(0)),
                         st.tuples(st.just("cancel"), st.integers(0, 50), st.just(0))), min_size=8, max_size=60)


@pytest.mark.req("R5.2.2")
@settings(max_examples=80)
@given(ops=OPS, lanes=st.sampled_from([1, 4]), backlog=st.integers(0, 12))
def test_every_front_refusal_is_an_engine_refusal(ops: list[tuple[str, int, int]], lanes: int, backlog: int):
    """Random arrivals (after a backlog of 1 s requests), device progress, idle time and cancels: at every
    arrival the front decides from the snapshot published after the scheduler's last step, and the scheduler
    then decides the same request."""
    h = _harness(lanes)
    front = EarlyAdmission()
    refused = 0
    for generation, (op, a, b) in enumerate([("submit", 8, 11)] * backlog + ops):
        if op == "submit":
            refusal = _decide(front, _snapshot(h, generation), h, a, b)
            outcome = h.submit(prompt=a, new=b).outcome
            if refusal is not None:
                refused += 1
                assert outcome.http_status == 429, (refusal, outcome)
        elif op == "job":
            for _ in range(a):
                if not _job(h):
                    break
        elif op == "idle":
            h.clock.advance(a * STEP / 2)  # the device idle meanwhile; then a tick (deadlines expire), its job run
            _job(h)
        else:
            live = sorted(r.request_id for r in h.scheduler.registry.live())
            if live:
                h.scheduler.cancel(live[a % len(live)])
    assert front.statistics().refused == refused


def test_an_engine_refusal_takes_its_retry_slot_among_the_fronts():
    """The front's slots and the planner's are two sets: a client the engine refused gets a Retry-After behind
    the slots the front handed out (never earlier than the engine's own answer), so the two do not collide."""
    h = _harness()
    for _ in range(3):
        h.submit(prompt=8, new=11)
    snap = _snapshot(h)
    front = EarlyAdmission()
    first = _decide(front, snap, h, 8, 11)
    assert first is not None and first.retry_after_s is not None
    engine = h.submit(prompt=8, new=11).outcome  # the engine's slots know nothing of the front's
    assert engine.retry_after_s == first.retry_after_s
    placed = front.engine_refused(lambda: snap, prompt_tokens=8, max_new_tokens=11, tenant="default",
                                  now=h.clock.now(), retry_after_s=engine.retry_after_s)
    assert placed > engine.retry_after_s and front.statistics().retry_slots == 2
    # no snapshot: the engine's answer stands
    assert front.engine_refused(lambda: None, prompt_tokens=8, max_new_tokens=11, tenant="default",
                                now=h.clock.now(), retry_after_s=7.0) == 7.0


def test_a_request_finding_no_snapshot_waits_for_the_engines_next_answer_only_behind_enough_in_flight():
    front = EarlyAdmission()
    woken: list[int] = []
    for i in range(HOLD_IN_FLIGHT):
        assert not front.should_hold(None)  # the first ones go to the engine
        front.sent()
    assert front.should_hold(None)
    h = _harness()
    h.submit(prompt=8, new=11)
    assert not front.should_hold(_snapshot(h))  # a snapshot to decide from: no wait
    front.hold(lambda: woken.append(1))
    front.hold(lambda: woken.append(2))
    front.answered()
    assert woken == [1, 2] and front.in_flight == HOLD_IN_FLIGHT - 1 and front.statistics().held == 2
    front.answered()
    assert woken == [1, 2]  # each waker once


@settings(max_examples=150)
@given(ops=st.lists(st.tuples(st.sampled_from(["reserve", "reserve", "admit", "wait", "wait"]), st.integers(0, 40),
                              st.sampled_from(["a", "b"])), min_size=4, max_size=80), limit=st.sampled_from([4, 64]))
def test_retry_slots_skipping_the_expiry_pass_hold_what_a_pass_at_every_call_holds(ops: list[tuple[str, int, str]],
                                                                                    limit: int):
    """Same reservations, admissions and time on RetrySlots (which skips the expiry pass while no slot can have
    expired) and on the reference that walks every slot at every call (:class:`.retry_reference.PlainRetrySlots`),
    explicit expiry passes among them: the same retry times and the same slots, in the same order, and ``len`` counting
    them. Mutants caught (each checked): the expiry boundary moved (``<=``), a gone slot's expiry entry not skipped (the
    held count drifts), the expiry pass stopping at a gone slot's entry."""
    plain, front = PlainRetrySlots(limit=limit), RetrySlots(limit=limit)
    now, base = 0.0, [3.0, 5.0]
    for op, x, tenant in ops:
        if op == "reserve":
            got = [s.reserve(list(base), tuple(base), now, 0.5 + x / 10, 4.0, now, tenant) for s in (plain, front)]
            assert got[0] == got[1]
        elif op == "admit":
            plain.admitted(tenant, now)
            front.admitted(tenant, now)
        else:
            now += x / 8
            plain.expire(now)
            front.expire(now)
        assert [(g.retry_at, g.length, g.tenant, g.seq) for g in plain.ghosts] == [
            (g.retry_at, g.length, g.tenant, g.seq) for g in front.ghosts] and len(front) == len(plain.ghosts)


def test_no_snapshot_while_the_step_is_faster_than_the_cached_plans():
    """A faster measured step makes the cached lanes free late: the planner does not refuse from them, nor does
    the front (no snapshot until the next plan)."""
    h = _harness()
    for _ in range(3):
        h.submit(prompt=8, new=11)
    assert _snapshot(h) is not None
    timer = h.scheduler.step_times
    for _ in range(50):
        timer.observe(STEP / 3)
    assert h.scheduler.on_time.planner.cache_drift() < 0
    assert _snapshot(h) is None


@pytest.mark.req("R5.2.2", "R5.2.4")
def test_the_fronts_never_is_the_engines_late_even_alone_and_a_request_fitting_alone_gets_the_same_retry_after():
    """Issue #13: "never" is judged on the device serving the request alone (``OnTimePlanner.alone_model``), not
    on the per-token time under the load. A B4 device whose B1 step is 0.05 s and B4 step 0.2 s, four streams
    decoding, deadline 10 s: a 100-step request is late under the load (20 s) but fits alone (5 s); a 250-step one
    is late alone (12.5 s). Mutant caught: the front judging "never" on the snapshot's loaded model (a 429 without
    Retry-After where the engine gives one)."""
    h = Harness.build(sizes=(1, 4), lanes=4, admission={"max_sequences": 4, "deadline_default_ms": 10_000})
    step_s = {1: 0.05, 4: 0.2}

    def play(until: float) -> None:
        while h.clock.now() < until:
            plan = h.step()
            if plan.work is None:
                h.clock.advance(0.01)
                continue
            h.scheduler.submitted(plan.work.job_id)
            h.clock.advance(step_s[plan.work.profile.compiled_batch] if hasattr(plan.work, "profile") else 0.01)
            h.complete(plan.work)
            h.confirm_all()

    h.submit(prompt=8, new=15)
    play(1.0)  # alone: the fastest step is measured
    for _ in range(4):
        assert not h.submit(prompt=8, new=100, deadline_ms=22_000).outcome.rejected
    play(15.0)
    snap = _snapshot(h)
    assert snap is not None
    front = EarlyAdmission()
    fits_alone = _decide(front, snap, h, 8, 101)
    assert fits_alone is not None and fits_alone.retry_after_s is not None, front.statistics()
    assert h.submit(prompt=8, new=101).outcome.retry_after_s == fits_alone.retry_after_s
    never = _decide(front, snap, h, 8, 251)
    assert never is not None and never.retry_after_s is None
    assert h.submit(prompt=8, new=251).outcome.retry_after_s is None


def _idle(h: Harness) -> None:
    """One request served to its end, then a tick: the device measured and idle, its plan empty and fresh."""
    h.submit(prompt=8, new=3)
    while _job(h):
        pass
    h.step()


@pytest.mark.req("R5.2.2", "R5.2.4")
def test_a_burst_on_an_idle_device_is_refused_by_the_front_before_the_engine_has_decided_any():
    """Issue #13, time to 429: the front accounts for the requests it forwarded and the engine has not decided yet,
    appended to the snapshot's lanes as the engine appends them, so a burst's excess is refused at once instead of
    held until the engine has admitted what fits. The engine then decides the same requests in the same order at
    the same instant: it admits every forward and refuses every front refusal with the same Retry-After. Mutants
    caught: refusing from the snapshot alone (every request forwarded, none refused), counting a forward twice once
    the snapshot holds it (an admissible request refused), an idle snapshot refusing what the engine serves alone."""
    h = _harness()
    _idle(h)
    snap = _snapshot(h)
    assert snap is not None and snap.kept == 0 and snap.room > 0
    front = EarlyAdmission()
    answers = []
    for _ in range(8):  # just over 1 s each, 3 s deadline: two fit
        answer = front.decide(lambda: snap, prompt_tokens=8, max_new_tokens=11, tenant="default", now=h.clock.now(),
                              hold=True)
        assert answer is not HELD
        front.unsent += answer is None  # forwarded by the refusal lane: on its way
        answers.append(answer)
    assert [a is None for a in answers] == [True] * 2 + [False] * 6
    assert front.statistics().provisional == 6 and front.statistics().refused == 6
    # the engine decides the first forward; the front sees its next snapshot, which holds it, before its answer
    front.unsent -= 1
    front.sent()
    assert not h.submit(prompt=8, new=11).outcome.rejected
    newer = _snapshot(h, 2)
    assert newer is not None and newer.kept == 1
    fits = front.decide(lambda: newer, prompt_tokens=8, max_new_tokens=2, tenant="default", now=h.clock.now(),
                        hold=True)
    assert fits is None  # 0.2 s fits behind the two (counted once: the snapshot holds the first)
    front.unsent += 1
    assert not h.submit(prompt=8, new=11).outcome.rejected  # the second forward
    for answer in answers[2:]:
        engine = h.submit(prompt=8, new=11).outcome
        assert engine.http_status == 429 and engine.retry_after_s == answer.retry_after_s, (answer, engine)
    assert not h.submit(prompt=8, new=2).outcome.rejected


def test_an_idle_snapshot_forwards_what_the_engine_judges_alone():
    """Nothing kept: a request late on the loaded model may fit the device serving it alone, as the engine judges
    it (``fit_afresh``): forwarded ("alone"), never refused from the idle snapshot."""
    h = _harness()
    _idle(h)
    snap = _snapshot(h)
    assert snap is not None and snap.kept == 0
    front = EarlyAdmission()
    loaded = snap._replace(model=snap.model.slowed(10.0))  # 10 s a request on the loaded model
    assert _decide(front, loaded, h, 8, 11) is None and front.statistics().forwarded["alone"] == 1


LAG = st.lists(st.tuples(st.sampled_from([4, 8, 30]), st.sampled_from([2, 6, 11, 24]), st.integers(0, 3),
                         st.integers(0, 3)), min_size=4, max_size=40)


@pytest.mark.req("R5.2.2")
@settings(max_examples=40)
@given(arrivals=LAG, lanes=st.sampled_from([1, 4]), backlog=st.integers(0, 6))
@example(arrivals=[(4, 2, 0, 0), (4, 2, 1, 0), (4, 6, 0, 0), (4, 6, 0, 0), (4, 2, 0, 0)], lanes=1, backlog=5)
@example(arrivals=[(4, 2, 0, 0)] * 9 + [(4, 2, 1, 0), (4, 2, 1, 0)], lanes=1, backlog=6)
@example(arrivals=[(4, 11, 0, 0), (4, 24, 0, 0), (4, 2, 0, 0), (4, 24, 0, 0)], lanes=1, backlog=0)
@example(arrivals=[(30, 24, 0, 0), (4, 11, 0, 0), (30, 2, 1, 1), (4, 6, 1, 1), (8, 6, 1, 0), (8, 6, 1, 2),
                   (4, 24, 1, 1), (30, 11, 0, 0), (8, 6, 0, 0), (4, 24, 3, 2), (4, 6, 1, 0), (8, 6, 0, 0),
                   (8, 11, 1, 0)], lanes=4, backlog=0)
def test_every_front_refusal_counting_forwards_is_an_engine_refusal(arrivals: list[tuple[int, int, int, int]],
                                                                     lanes: int, backlog: int):
    """Arrivals at one instant, the engine lagging behind the front: before each arrival the engine decides up to a
    few of the earlier ones (in arrival order; the front's refusals too, so their retry slots stay in step) and
    the front sees a snapshot after each decision but hears its answers later still. Every front refusal — from
    the snapshot and the forwards it does not hold yet — is an engine refusal; with the same Retry-After while the
    front knew the engine's lanes at every refusal so far (``known``: not an under-count of forwards of unlike
    lengths, whose retry slot then differs from the engine's). Mutants caught: tracking a forward decided on
    under-counted lanes (the engine refuses it; a later refusal counting it is unsound), taking the snapshot's
    admissions again for forwards already taken (:meth:`EarlyAdmission._track`: double-freed retry slots); the
    lane arithmetic written twice (issue #13 item 2; before :func:`~calculet.runtime.scheduling.lane_time
    .lane_finish`, the cache's placement summed ``now + steps × step + prefill`` where its fast refusal and the
    plan sum ``now + (prefill + steps × step)``): the fourth example, on B4 with no turnover, a Retry-After of 2 s
    where the engine's is 3 s. Found by random runs of this body (1 in 12 000; hypothesis's draws found none in
    3 000 examples)."""
    h = _harness(lanes)
    _idle(h)
    _lagging_engine(h, arrivals, backlog)


def _crowded(h: Harness) -> None:
    """Eight short requests at once on the B4 device, served to their end, then a tick: the newcomers held their KV
    slots while they waited for their prefills, so the slot's measured per-token time exceeds the sequence's
    (``StepTimer.slot_token_s``) and a job taking a lane another job holds is charged the turnover
    (``DeviceModel.handover_s``, issue #13 session 14); the device idle, its plan empty and fresh."""
    for _ in range(8):
        h.submit(prompt=8, new=3)
    while _job(h):
        pass
    h.step()


@pytest.mark.req("R5.2.2")
@settings(max_examples=60)
@given(arrivals=LAG, backlog=st.integers(0, 6))
@example(arrivals=[(8, 11, 0, 0)] * 4 + [(4, 2, 0, 0)], backlog=4)
@example(arrivals=[(8, 24, 0, 0), (8, 6, 0, 0), (4, 11, 3, 2), (30, 11, 1, 2)], backlog=6)
@example(arrivals=[(4, 2, 0, 0)] * 8 + [(8, 6, 0, 0)], backlog=4)
@example(arrivals=[(30, 24, 0, 0), (30, 6, 1, 1), (8, 6, 1, 0), (30, 11, 1, 2), (4, 24, 0, 0), (4, 24, 0, 0),
                   (8, 6, 0, 0), (8, 6, 1, 0)], backlog=0)
def test_every_front_refusal_counting_forwards_is_an_engine_refusal_with_a_handover(
        arrivals: list[tuple[int, int, int, int]], backlog: int):
    """The lagging engine of the test above on a B4 device whose freed lanes carry a handover (the admission model's
    ``handover_s`` > 0): the engine charges a job that starts on a held lane its per-step turnover, and so does the
    front (:meth:`EarlyAdmission.decide`, :meth:`EarlyAdmission._lanes`). Mutants caught: the front deciding such a
    forward without the turnover and counting it as surely admitted (as before 2cf8cd8) — the first example: four
    lanes held past now, four 1 s forwards that fit them without the turnover but not with it (the engine refuses
    all four), then a 0.1 s request the front refuses behind them and the engine admits; the second: a forward the
    engine admits, its lane's finish short of the engine's by the turnover, so the next refusal's Retry-After is
    not the engine's — and the front deciding with it but appending the forwards it does not see in the snapshot
    without it (``_lanes``; the third example: a Retry-After of 0 s where the engine's is 1 s); the front's lanes and
    the engine's summed in different orders (before :func:`~calculet.runtime.scheduling.lane_time.lane_finish`;
    the fourth example: 1 s where the engine's is 2 s; 26 in 12 000 random runs of this body)."""
    h = _harness(4)
    _crowded(h)
    snap = _snapshot(h)
    assert snap is not None and snap.model.handover_s > 0.1 * snap.model.lane_step_s
    _lagging_engine(h, arrivals, backlog)


def _lagging_engine(h: Harness, arrivals: list[tuple[int, int, int, int]], backlog: int) -> None:
    """The body of the lagging-engine property tests: ``h`` warmed up, idle."""
    for _ in range(backlog):  # all admitted: a refusal the front did not see would hold a retry slot it has not
        assert not h.submit(prompt=8, new=4).outcome.rejected
    front = EarlyAdmission()
    admitted = backlog
    snap = _snapshot(h, 0, {"default": admitted})
    queue: list[tuple[int, int, EarlyRefusal | None]] = []  # decided by the front, not yet by the engine
    answers = 0  # engine decisions of forwards whose answer the front has not heard
    checked = 0  # front refusals the engine decided (for the check only)
    known: list[bool] = []  # per queued decision: not a refusal from lanes the front under-counted
    synced = True  # the front's retry slots are the engine's: every refusal so far decided on known lanes
    for generation, (prompt, new, decided, heard) in enumerate(arrivals, start=1):
        for _ in range(min(decided, len(queue))):
            p, n, refusal = queue.pop(0)
            synced = synced and known.pop(0)
            if refusal is None:
                front.unsent -= 1
                front.sent()
                answers += 1
            outcome = h.submit(prompt=p, new=n).outcome
            if refusal is not None:
                assert outcome.http_status == 429, (refusal, outcome)
                assert outcome.retry_after_s == refusal.retry_after_s or not synced, (refusal, outcome)
            synced = synced and not (refusal is None and outcome.rejected)  # a forward refused: a slot (see below)
            admitted += not outcome.rejected
            checked += refusal is not None
            snap = _snapshot(h, generation, {"default": admitted})
            if snap is not None:  # a front refusal never reaches the engine: its parity check is no request created
                snap = snap._replace(created=snap.created - checked)
        for _ in range(min(heard, answers)):
            front.answered()
            answers -= 1
        answer = front.decide(lambda: snap, prompt_tokens=prompt, max_new_tokens=new, tenant="default",
                              now=h.clock.now(), hold=True)
        if answer is HELD:
            continue  # waits for the engine's next answer: not decided here
        assert answer is None or isinstance(answer, EarlyRefusal)
        front.unsent += answer is None
        queue.append((prompt, new, answer))
        known.append(answer is None or answer.known)
    for (p, n, refusal), sure in zip(queue, known):
        synced = synced and sure
        outcome = h.submit(prompt=p, new=n).outcome
        if refusal is not None:
            assert outcome.http_status == 429, (refusal, outcome)
            assert outcome.retry_after_s == refusal.retry_after_s or not synced, (refusal, outcome)
        # a forward the engine refused took a retry slot of the engine's the front's slots lack (the service places
        # the front's by EarlyAdmission.engine_refused, its own rule): later Retry-After may differ
        synced = synced and not (refusal is None and outcome.rejected)


def test_a_chain_begun_on_an_idle_lane_is_counted_only_within_its_first_requests_deadline():
    """The engine starts a lane idle at the front's decision at its own, later, instant: the whole chain behind the
    first request moves with it, its later requests' deadlines do not. Idle device, 3 s deadline: a 1.1 s request
    forwarded at t0; 0.4 s later a 2.0 s one fits behind it at the front's instant (t0 + 3.1 <= t0 + 3.4) but not
    within t0 + 3: held, not counted ahead, so a third 1.1 s request is forwarded — the engine, deciding all three
    0.4 s late, refuses the second and admits the third. Mutant caught: counting the chain from the front's
    instants (the third refused by the front, admitted by the engine)."""
    h = _harness()
    _idle(h)
    snap = _snapshot(h)
    assert snap is not None and snap.kept == 0
    front = EarlyAdmission()

    def decide(new: int) -> EarlyRefusal | None | str:
        answer = front.decide(lambda: snap, prompt_tokens=8, max_new_tokens=new, tenant="default",
                              now=h.clock.now(), hold=True)
        front.unsent += answer is None
        return answer

    assert decide(11) is None
    h.clock.advance(0.4)
    assert decide(20) is HELD
    assert decide(11) is None and front.statistics().refused == 0
    assert not h.submit(prompt=8, new=11).outcome.rejected
    assert h.submit(prompt=8, new=20).outcome.http_status == 429
    assert not h.submit(prompt=8, new=11).outcome.rejected
