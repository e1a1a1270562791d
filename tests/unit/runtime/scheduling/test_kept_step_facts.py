"""The decode step's kept facts (issue #20, session 17): what a step used to re-derive every time and now keeps.

* ``ProfileSet.by_ready``: the §8 profile of each Ready count, decided once per count for the set (a generation's
  profiles never change once built, so nothing invalidates it; a new generation brings a new set);
* ``ReadyBucket.parked``: a tenant's queue found empty leaves the tick's index but is kept for its return, so a
  one-stream rotation does not build a queue per step;
* the jobs table's draw: a job event the monitors' draw does not pick costs no call into the JobLaneSystem
  monitor, and the binding (lane -> the job that last opened it) is kept by the table at each submit.

These tests play random traffic with the facts kept and with them asked again at every step (the memo bypassed,
no queue parked): every answer, plan, token, outcome and statistic must be the same.
"""

from __future__ import annotations

import random
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from calculet.machines.monitor import MONITOR
from calculet.runtime.scheduling import apply as apply_module
from calculet.runtime.scheduling import scheduler as scheduler_module
from calculet.runtime.scheduling import step_done
from calculet.runtime.scheduling.jobs import lanes_of
from calculet.runtime.scheduling.plan import SchedulingCapabilities
from calculet.runtime.scheduling.profiles import ProfileSet
from tests.unit.runtime.runtime_support import Harness
from tests.unit.runtime.scheduling.traffic import play

OPS = ("submit", "submit", "submit", "submit", "cancel", "tick", "step", "step", "step", "step", "step", "fail",
       "confirm")
_op = st.tuples(st.sampled_from(OPS), st.integers(min_value=0, max_value=10**6))


class _AskAgain(dict):  # type: ignore[type-arg]
    """``ProfileSet.by_ready`` that keeps nothing: every read asks ``select_profile`` again."""

    def __init__(self, profiles: ProfileSet) -> None:
        super().__init__()
        self._profiles = profiles

    def __getitem__(self, ready: int) -> Any:
        return self._profiles.select_profile(ready)


class _NoPark(dict):  # type: ignore[type-arg]
    """``ReadyBucket.parked`` that keeps nothing: a tenant coming back gets a new queue, as before parking."""

    def __setitem__(self, tenant: str, queue: Any) -> None:
        pass


def _ask_again(h: Harness) -> None:
    """Turn the kept facts off on ``h``'s scheduler: profiles read through ``select_profile``, nothing parked."""
    decode = h.scheduler.decode
    original = decode.due

    def due(generation: int, profiles: ProfileSet, now: float) -> Any:
        if not isinstance(profiles.by_ready, _AskAgain):
            profiles.by_ready = _AskAgain(profiles)
        for bucket in decode._buckets.values():  # noqa: SLF001 - the containers the step reads
            if not isinstance(bucket.parked, _NoPark):
                bucket.parked = _NoPark()
        return original(generation, profiles, now)

    decode.due = due  # type: ignore[method-assign]


def _play(ops: list[tuple[str, int]], kept: bool) -> list[Any]:
    """Random traffic on a B1/B2/B4 scheduler (the Ready count picks the profile), three tenants (queues leave
    the index and come back), few lanes (requests wait), chunked prompts, short deadlines, cancels and failed
    jobs; returns what the caller sees."""
    h = Harness.build(sizes=(1, 2, 4), lanes=4, chunk=8, caps=SchedulingCapabilities(incremental_prefill=True),
                      batch={"select_thresholds": {2: 2, 4: 3}},
                      tenants=[{"name": "a", "weight": 1.0}, {"name": "b", "weight": 3.0, "api_key_sha256": "b" * 64},
                               {"name": "c", "weight": 2.0, "api_key_sha256": "c" * 64}])
    if not kept:
        _ask_again(h)
    return play(h, ops, "abc")


@pytest.mark.req("R8.1", "R7.2.1", "R7.2.3")
@settings(max_examples=80, deadline=None)
@given(st.lists(_op, min_size=20, max_size=120))
def test_the_kept_facts_see_what_asking_again_sees(ops: list[tuple[str, int]]) -> None:
    """Random traffic played twice, the step's kept facts on and off: the same answers, plans (work, profile,
    lanes, engine, wake-up), tokens, outcomes and statistics. Mutants caught (each checked to fail here): the
    profile memo keeping its first answer for every count (a steady "decided once" without the count as its
    key: B4 batches where three are Ready go out as B1); a capped tenant parked with work left (its queue leaves
    the index with entries: the step counts them Ready and never finds them)."""
    assert _play(ops, kept=True) == _play(ops, kept=False)


@pytest.mark.req("R8.1", "R7.2.1")
@pytest.mark.parametrize("seed", range(8))
def test_long_traffic_with_kept_facts_sees_what_asking_again_sees(seed: int) -> None:
    """The same on long seeded runs (160 calls: the pool fills, tenants leave the index and rejoin it often)."""
    rng = random.Random(seed)
    ops = [(rng.choice(OPS), rng.randrange(10**6)) for _ in range(160)]
    assert _play(ops, kept=True) == _play(ops, kept=False)


@pytest.mark.req("R8.1")
@settings(max_examples=40, deadline=None)
@given(st.lists(st.integers(min_value=0, max_value=40), min_size=1, max_size=60),
       st.sets(st.sampled_from((1, 2, 4, 8, 16)), min_size=1))
def test_the_profile_memo_is_select_profile(counts: list[int], sizes: set[int]) -> None:
    """Whatever order the Ready counts come in (repeats included), ``by_ready[n]`` is ``select_profile(n)``.
    Mutant caught: the memo keeping its first answer for every count (checked)."""
    h = Harness.build(sizes=tuple(sorted(sizes)), lanes=4,
                      batch={"select_thresholds": {s: s - 1 for s in sizes if s > 1}})
    profiles = h.scheduler.profiles
    assert profiles is not None
    for n in counts:
        assert profiles.by_ready[n] is profiles.select_profile(n)


@pytest.mark.req("R14.4")
@pytest.mark.parametrize("composite", [False, True])
def test_the_table_asks_the_monitor_only_on_a_drawn_event(composite: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    """The jobs table (or, for a B1 step's completion, the composite path: ``step_done``) draws for the JobLaneSystem monitor: with some events drawn, the monitor's check runs
    on exactly the events drawn for it, and the binding is kept at every submit whether drawn or not. Mutants
    caught (checked): the table calling the monitor on every event (it checks undrawn events); the binding
    recorded only on drawn events (a submit not drawn leaves its lanes bound to the previous job)."""
    if not composite:  # every job event through the table
        monkeypatch.setattr(step_done, "COMPOSITE", None)
        monkeypatch.setattr(step_done, "SUBMIT", None)
    h = Harness.build(sizes=(1,), lanes=2)
    monitor = h.scheduler.job_lanes
    checked: list[str] = []
    monitor.observe = lambda job, event: checked.append(event)  # type: ignore[method-assign]
    h.scheduler.jobs.check = monitor.observe
    events: list[str] = []
    table_fire, table_submit = h.scheduler.jobs.fire, h.scheduler.jobs.submit
    saved = MONITOR.draws
    rng = random.Random(5)
    pattern = iter(lambda: rng.random() < 0.4, None)  # events drawn at random (the test suite: every event)
    draws: list[bool] = []

    class _Spy:
        def __iter__(self) -> "_Spy":
            return self

        def __next__(self) -> bool:
            drawn = next(pattern)
            draws.append(drawn)
            return drawn

    try:
        MONITOR.draws = _Spy()

        def fire(job: Any, event: str, **args: Any) -> str:
            before = len(draws)
            target = table_fire(job, event, **args)
            events.append(event if len(draws) > before and draws[before] else "")
            if event == "submit":
                assert all(h.scheduler.jobs.binding[lane] is job for lane in lanes_of(job.work))
            return target

        def submit(job: Any, lanes: Any) -> str:  # the scheduler's submit (issue #20: lanes given, one call)
            before = len(draws)
            target = table_submit(job, lanes)
            events.append("submit" if len(draws) > before and draws[before] else "")
            assert all(h.scheduler.jobs.binding[lane] is job for lane in lanes_of(job.work))
            return target

        def done(applier: Any, job: Any, *args: Any) -> Any:  # the composite path's job event (issue #20)
            before = len(draws)
            applied = step_done_fire(applier, job, *args)
            if applied is not None:
                events.append("complete" if len(draws) > before and draws[before] else "")
            return applied

        def submitted(scheduler: Any, job: Any, batch: Any) -> bool:  # the composite path's submit (issue #20)
            before = len(draws)
            taken = step_done_submit(scheduler, job, batch)
            if taken:
                events.append("submit" if len(draws) > before and draws[before] else "")
                assert all(h.scheduler.jobs.binding[lane] is job for lane in lanes_of(job.work))
            return taken

        step_done_fire = apply_module.decode_step_done
        step_done_submit = step_done.decode_step_submitted
        monkeypatch.setattr(apply_module, "decode_step_done", done)
        monkeypatch.setattr(scheduler_module, "decode_step_submitted", submitted)  # Scheduler.submitted asks it
        h.scheduler.jobs.fire = fire  # type: ignore[method-assign]
        h.scheduler.jobs.submit = submit  # type: ignore[method-assign]
        for _ in range(3):
            h.submit(prompt=4, new=10, deadline_ms=60_000)
        h.drive()
    finally:
        MONITOR.draws = saved
    assert [e for e in events if e] == checked
    assert len(events) > len(checked) > 0 and "submit" in checked


@pytest.mark.req("R14.1", "R5.1.2")
@pytest.mark.parametrize("inflight", [1, 2])
def test_the_plan_says_when_it_takes_the_last_slot(inflight: int) -> None:
    """``Plan.last_slot`` (the engine stops planning on it) is the jobs table's answer once the job holds its slot:
    true exactly when another step would find no slot. Mutants caught (checked): the last slot counted before the
    job took it (``>`` for ``>=``: one job at a time never says last, the engine steps again for nothing; two
    at a time says last one job early, and ping/pong runs one job)."""
    h = Harness.build(sizes=(1,), lanes=4, executor={"max_inflight": inflight})
    for _ in range(4):
        h.submit(prompt=4, new=6, deadline_ms=60_000)
    held: list[Any] = []  # works on the device, oldest first
    planned = 0
    for _ in range(400):
        plan = h.step()
        if plan.work is None:
            if not held:
                if h.confirm_all() == 0:
                    break
                continue
            h.complete(held.pop(0))
            h.confirm_all()
            continue
        planned += 1
        h.scheduler.submitted(plan.work.job_id)
        held.append(plan.work)
        assert plan.last_slot == (not h.scheduler.jobs.has_slot())
        assert plan.last_slot == (len(held) == inflight)
        if plan.last_slot:
            h.complete(held.pop(0))
            h.confirm_all()
    assert planned > 8 and not held
