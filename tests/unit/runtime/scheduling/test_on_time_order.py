"""Issue #20: a queued submit's admission-order estimate from the kept order is the afresh one.

``OnTimePlanner._admission_order_estimate`` walked, sorted, replayed and list-scheduled every waiting
request on each accepted queued submit where the budget is no larger than the lanes (B16 with 16
sequences, one KV lane on B1). The index (:mod:`calculet.runtime.scheduling.on_time_order`) keeps the
queue's order with its admitted tags and the lanes' free times per prefix between submits; these tests
hold every value it gives to the afresh computation (``admission_order_afresh``, the sorting version)
under random bursts of several flows, device steps, admissions and ends, and show what a burst costs it.
"""

from __future__ import annotations

from bisect import bisect_right
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from calculet.runtime.scheduling.estimates import StepTimer
from calculet.runtime.scheduling.on_time_order import newcomer_tag
from calculet.runtime.scheduling.on_time_planner import OnTimePlanner
from calculet.runtime.scheduling.wfq_order import QueuedRequest, admission_ranks
from tests.unit.runtime.runtime_support import Harness

B = 16
STEP = 0.02
PREFILL = 0.004
TENANTS = [{"name": "a", "weight": 1.0, "api_key_sha256": "a" * 64}, {"name": "b", "weight": 3.0}]


class _TokensUnmeasured(StepTimer):
    """A step timer whose per-token wait is never measured (``token_s`` 0): the B>1 device model then charges the
    whole prefill backlog before every lane (``prefill_on_lane`` False, ``lane_step_s`` the step), the model a
    serving device has before its first decode step completes with an instant. Kept for a whole example, so
    the bursts after device steps reach it too: on a lane the index's two finish formulas differ only by float
    rounding, and a property that never leaves the lane cannot tell them apart (Q3: a mutant swapping them
    passed)."""

    __slots__ = ()

    @property
    def token_s(self) -> float:
        return 0.0


def measured(h: Harness, off_lane: bool = False) -> Harness:
    """The timers have measured steps and prefills, as on a serving device: the screen has a device model.
    ``off_lane``: not the per-token wait (:class:`_TokensUnmeasured`)."""
    s, at = h.scheduler, 0.0
    if off_lane:
        s.step_times.__class__ = _TokensUnmeasured
    for _ in range(4):
        s.prefill_times.observe(16, PREFILL)
        s.step_times.prefill_ran(PREFILL)
        at += STEP + PREFILL
        s.step_times.observe(STEP, lanes=B, compiled=B, decoding=B, now=at)
    assert s.on_time is not None
    model = s.on_time.model()
    assert model is not None and model.prefill_on_lane is (not off_lane or lanes_of(h) == 1)
    return h


def lanes_of(h: Harness) -> int:
    assert h.scheduler.on_time is not None
    return h.scheduler.on_time.lanes()


def build(lanes: int = B, sizes: tuple[int, ...] = (B,), off_lane: bool = False) -> Harness:
    return measured(Harness.build(sizes=sizes, lanes=lanes, tenants=TENANTS,
                                  admission={"max_sequences": lanes}), off_lane)


def planner(h: Harness) -> OnTimePlanner:
    assert h.scheduler.on_time is not None
    return h.scheduler.on_time.planner


def checked(h: Harness) -> list[tuple[float, float | None]]:
    """Every indexed estimate beside the afresh one computed at the same moment from the same requests."""
    p = planner(h)
    pairs: list[tuple[float, float | None]] = []
    indexed = p._admission_order_estimate

    def both(rec: Any, job: Any, now: float, model: Any, records: Any, *cost: Any) -> float | None:
        before = p.order_index.statistics().indexed
        value = indexed(rec, job, now, model, records, *cost)
        if p.order_index.statistics().indexed > before:
            assert value is not None
            tags = p.order_index.order_tags()
            assert tags is not None and tags[1] == tenant_tags(p.order_index._flow_tag)
            pairs.append((value, p.admission_order_afresh(rec, job, now, model, records)))
        return value

    p._admission_order_estimate = both  # type: ignore[method-assign]
    return pairs


def tenant_tags(flow_tags: dict[Any, float]) -> dict[str, float]:
    """Per tenant, the largest tag of its flows' newest requests: ``order_tags``' mapping, rebuilt from every flow
    (issue #20: the index keeps it as σ grows). ``checked`` compares the two at every indexed estimate; mutants
    caught: the kept mapping not updated on insertion, or updated with the flow's tag where it is not the
    tenant's largest (a tenant's long flow tagged below its short one)."""
    last: dict[str, float] = {}
    for (tenant, _), tag in flow_tags.items():
        if tag > last.get(tenant, -float("inf")):
            last[tenant] = tag
    return last


def tick(h: Harness, seconds: float) -> None:
    """One step of the played device: the job it plans runs and completes ``seconds`` later."""
    plan = h.step()
    h.clock.advance(seconds)
    if plan.work is not None:
        h.run(plan)
    h.confirm_all()


def test_a_one_flow_burst_is_estimated_from_the_index_with_the_afresh_values():
    h = build()
    pairs = checked(h)
    for _ in range(B):  # the budget: admitted at once, nobody waits
        h.submit(prompt=16, new=40, tenant="a")
    ids = [h.submit(prompt=16 + i, new=20 + 7 * i, tenant="a").request_id for i in range(40)]
    assert all(h.state(i) == "waiting_admission" for i in ids)
    stats = planner(h).order_index.statistics()
    assert stats.seeded == 1 and stats.indexed == len(ids) - 2  # the first queued has nobody waiting ahead
    assert len(pairs) == stats.indexed and stats.scheduled == stats.indexed + 1  # one flow: a lane state each
    for value, afresh in pairs:
        assert afresh is not None and value == pytest.approx(afresh, rel=1e-12, abs=1e-9)
    finishes = [h.rec(i).estimated_finish for i in ids[1:]]
    assert finishes == sorted(finishes)  # one flow: first in, first out, each behind the one before


def test_several_flows_are_indexed_and_pay_only_for_the_prefixes_they_need():
    """Two tenants (weights 1 and 3) alternating: each newcomer is inserted where the queue admits it, and a
    candidate schedules only the lane states between the earliest stale one and its place."""
    h = build()
    pairs = checked(h)
    for _ in range(B):
        h.submit(prompt=16, new=40, tenant="a")
    for i in range(60):
        h.submit(prompt=16 + i, new=10 + (7 * i) % 50, tenant="ab"[i % 2])
    stats = planner(h).order_index.statistics()
    assert stats.seeded == 1 and stats.indexed == 58 and len(pairs) == 58
    assert stats.scheduled < 58 * 58 // 4  # far fewer lane states than a walk of every waiting request each time
    for value, afresh in pairs:
        assert afresh is not None and value == pytest.approx(afresh, rel=1e-12, abs=1e-9)
    assert len({round(v, 9) for v, _ in pairs}) > 40  # the values differ: the test can tell a wrong place


def test_one_request_shape_inserted_early_in_the_order_makes_no_lane_state_stale():
    """One request shape from two tenants (weights 1 and 3): the heavier one's newcomers are inserted early in
    the order, into the run of jobs of their own lane length, which leaves every lane state as it was — one
    state scheduled per indexed submit (the candidate's place at the end), where invalidating past the
    insertion recomputed the run's tail each time; the values are the afresh ones."""
    h = build()
    pairs = checked(h)
    for _ in range(B):
        h.submit(prompt=16, new=40, tenant="a")
    for i in range(60):
        h.submit(prompt=16, new=30, tenant="ab"[i % 4 != 0])  # b (weight 3) three times in four
    stats = planner(h).order_index.statistics()
    assert stats.seeded == 1 and stats.indexed == 58 and len(pairs) == 58
    assert stats.scheduled <= stats.indexed + 1
    for value, afresh in pairs:
        assert afresh is not None and value == pytest.approx(afresh, rel=1e-12, abs=1e-9)
    assert len({round(v, 9) for v, _ in pairs}) == 4  # one shape: waves of 16 lanes, each placed in its wave


def test_a_job_joining_the_leading_run_of_its_shape_leaves_the_states_up_to_the_runs_end():
    """One lane (every change of a lane state shows in the next finish): tenant b's short requests (weight 3)
    form the order's leading run, tenant a's longer ones follow, and each new b request joins the run ahead of
    them. The states inside the run stand; the one after it (run + an a request before, run + one more b
    request now) does not, and every value is the afresh one."""
    h = build(lanes=1, sizes=(1,))
    pairs = checked(h)
    h.submit(prompt=16, new=40, tenant="a")  # admitted: holds the lane
    for _ in range(4):
        h.submit(prompt=16, new=10, tenant="b")
    for i in range(12):
        h.submit(prompt=16, new=40, tenant="a")
        h.submit(prompt=16, new=10, tenant="b")
    index = planner(h).order_index
    assert index.statistics().seeded == 1 and len(pairs) == index.statistics().indexed >= 24
    assert 4 < index._uniform < len(index._lengths)  # a run of b requests ahead of a's, and a's behind it
    for value, afresh in pairs:
        assert afresh is not None and value == pytest.approx(afresh, rel=1e-12, abs=1e-9)
    assert len({round(v, 9) for v, _ in pairs}) == len(pairs)


def test_a_job_of_another_shape_at_the_head_of_the_order_ends_the_leading_run():
    """One lane: b's requests form the leading run, a's first (short, weight 1) is inserted ahead of all of
    them and its second inside them, while the lane states to the end are valid: the run is now a's first
    alone, and a's second, of its shape, ends it — the states past it are stale (each value the afresh one)."""
    h = build(lanes=1, sizes=(1,))
    pairs = checked(h)
    h.submit(prompt=16, new=40, tenant="a")  # admitted: holds the lane
    for _ in range(6):
        h.submit(prompt=16, new=40, tenant="b")
    h.submit(prompt=8, new=8, tenant="a")  # placed at the head of the order
    h.submit(prompt=16, new=40, tenant="b")  # places itself at the end: every lane state computed
    h.submit(prompt=8, new=8, tenant="a")  # placed after b's first, inside the former run
    h.submit(prompt=16, new=40, tenant="b")
    h.submit(prompt=16, new=40, tenant="b")
    index = planner(h).order_index
    assert index.statistics().seeded == 1 and len(pairs) == index.statistics().indexed == 9
    for value, afresh in pairs:
        assert afresh is not None and value == pytest.approx(afresh, rel=1e-12, abs=1e-9)
    assert index._uniform == 1 and index._lengths[0] == index._lengths[2] != index._lengths[1]


def test_an_event_between_two_submits_reseeds_the_index():
    h = build()
    pairs = checked(h)
    for _ in range(B):
        h.submit(prompt=16, new=3, tenant="a")
    for _ in range(4):
        h.submit(prompt=16, new=30, tenant="a")
    indexed = planner(h).order_index.statistics().indexed
    epoch = planner(h).epoch
    for _ in range(6):  # requests end, waiting ones are admitted from the queue: the epoch moves
        tick(h, STEP)
    assert planner(h).epoch > epoch
    h.submit(prompt=16, new=30, tenant="a")
    assert planner(h).order_index.statistics().indexed == indexed  # afresh, and a new index seeded
    h.submit(prompt=16, new=30, tenant="a")
    assert planner(h).order_index.statistics().indexed == indexed + 1
    for value, afresh in pairs:
        assert afresh is not None and value == pytest.approx(afresh, rel=1e-12, abs=1e-9)


BURSTS = st.lists(st.tuples(st.sampled_from("aab"), st.sampled_from([16, 48, 5000]), st.integers(1, 60),
                            st.integers(1, 12), st.integers(0, 3), st.floats(0.0, 0.2), st.booleans()),
                  min_size=1, max_size=10)
"""Bursts of one flow — (tenant, prompt, new tokens of the first, requests, device steps after, each step's
seconds, one shape) — of two tenants, short and long prompts (four §5.3 flows). ``one shape``: every request
of the burst has the same prompt and one of 4 new-token counts (shapes shared across bursts and tenants: runs of
one lane length, which the index's insertion treats apart, :meth:`.AdmissionOrderIndex._insert`); else each
its own."""


def shaped(prompt: int, new: int, i: int, one_shape: bool) -> tuple[int, int]:
    """The ``i``-th request's (prompt, new tokens) of a burst (:data:`BURSTS`)."""
    return (prompt, 1 + 13 * (new % 4)) if one_shape else (prompt + i, 1 + (new + 7 * i) % 60)


@settings(max_examples=90, deadline=None)
@given(bursts=BURSTS, shape=st.sampled_from(["b16", "b16-unmeasured", "b1"]), lead=st.integers(0, B))
def test_every_indexed_estimate_is_the_afresh_one(bursts: list[tuple[str, int, int, int, int, float, bool]],
                                                  shape: str, lead: int):
    """Random bursts of two tenants (weights 1 and 3; short and long prompts: four flows), the played device
    stepping between them (admissions from the queue, ends, replans), on B16 with 16 sequences — its per-token
    wait measured (prefills on their lanes) or not (the prefill backlog before every lane) — and on one lane
    with one sequence (calculet-b1-shared's shape): every value the index gives is the afresh one."""
    b1 = shape == "b1"
    h = build(lanes=1, sizes=(1,)) if b1 else build(off_lane=shape == "b16-unmeasured")
    pairs = checked(h)
    for _ in range(1 if b1 else lead):
        h.submit(prompt=16, new=40, tenant="a")
    for tenant, prompt, new, count, steps, seconds, one_shape in bursts:
        for i in range(count):
            p, n = shaped(prompt, new, i, one_shape)
            h.submit(prompt=p, new=n, tenant=tenant)
        for _ in range(steps):
            tick(h, seconds)
    for value, afresh in pairs:
        assert afresh is not None and value == pytest.approx(afresh, rel=1e-12, abs=1e-9)


def test_off_the_lane_the_prefill_backlog_before_the_lanes_is_in_every_indexed_estimate():
    """B16 before the per-token wait is measured: each estimate carries the prefills of everyone before it in
    the order, charged before the lanes (``prefill_on_lane`` False). The indexed values are the afresh ones,
    and they are not what the on-lane formula gives from the same lanes (the backlog is tens of prefills:
    far above rounding), so a swap of the two formulas is caught here deterministically."""
    h = build(off_lane=True)
    assert h.scheduler.on_time is not None
    model = h.scheduler.on_time.model()
    assert model is not None and not model.prefill_on_lane and model.prefill_s(16) > 0
    pairs = checked(h)
    for _ in range(B):
        h.submit(prompt=16, new=40, tenant="a")
    for i in range(40):
        h.submit(prompt=16 + i, new=10 + (7 * i) % 50, tenant="ab"[i % 2])
    index = planner(h).order_index
    assert index.statistics().indexed == 38 and len(pairs) == 38
    for value, afresh in pairs:
        assert afresh is not None and value == pytest.approx(afresh, rel=1e-12, abs=1e-9)
    backlog = index._prefills[index._valid - 1]  # the prefills before the lanes at the last prefix scheduled
    assert backlog >= 30 * model.prefill_s(16)


FLOWS = [("a", False), ("a", True), ("b", False)]


@given(items=st.lists(st.tuples(st.sampled_from(FLOWS), st.integers(1, 40), st.integers(-1, 60)), max_size=30),
       global_vt=st.integers(0, 50), flow=st.sampled_from(FLOWS), cost=st.integers(1, 40))
def test_a_newcomer_joins_the_replayed_order_where_the_index_inserts_it(
        items: list[tuple[tuple[str, bool], int, int]], global_vt: int, flow: tuple[str, bool], cost: int):
    """The lemma the index rests on, against the replay itself: a snapshot (heads tagged earlier, some below
    global virtual time, as a flow parked by its tenant's limit leaves them) replayed with one more request,
    the newest of its flow, admits every other request in the same order with the same tag, and the newcomer
    with :func:`newcomer_tag` at ``bisect_right`` of the others' tags. Integer costs and tags: exact floats."""
    waiting, heads = [], set()
    for age, (f, c, fixed) in enumerate(items):
        tag = float(fixed) if f not in heads and fixed >= 0 else None  # only a flow's oldest may carry a tag
        heads.add(f)
        waiting.append(QueuedRequest(age, f, age, float(c), tag))
    before: dict[int, float] = {}
    admission_ranks(waiting, float(global_vt), before)
    new = QueuedRequest(len(waiting), flow, 10**6, float(cost))
    after: dict[int, float] = {}
    ranks = admission_ranks([*waiting, new], float(global_vt), after)
    assert [i for i in after if i != new.id] == list(before)
    assert all(after[i] == before[i] for i in before)
    own = [w.id for w in waiting if w.flow == flow]
    tag = newcomer_tag(before[own[-1]] if own else None, float(global_vt), float(cost))
    assert after[new.id] == tag
    assert ranks[new.id] == bisect_right(list(before.values()), tag)


def test_the_queue_clock_read_without_fractions_is_the_fractions_value():
    """The policy reads a tenant's virtual start and a head's tag as the queue's scaled integers divided once
    (#20); each equals the float of the queue's exact Fraction, for every tenant and waiting head of a burst
    with admissions between (weights 1 and 3: a scale that does not divide every tag)."""
    from fractions import Fraction

    h = build()
    p = planner(h)
    wfq = h.scheduler.admission.wfq
    seen = 0
    for i in range(80):
        h.submit(prompt=16 + i, new=10 + (7 * i) % 50, tenant="ab"[i % 3 == 0])
        if i % 20 == 19:
            tick(h, STEP)
        for tenant in ("a", "b"):
            assert p.virtual_start is not None
            exact = max(wfq.tenant_virtual_time(tenant), wfq.global_virtual_time())
            assert p.virtual_start(tenant) == float(exact)
        for rec in h.scheduler.registry.live():
            tag = p.head_tag(rec)
            entry = rec.entry
            if tag is not None and entry is not None:
                assert tag == float(Fraction(entry[0], wfq.scale)) and tag == float(wfq.to_fraction(entry[0]))
                seen += 1
    assert seen > 100 and wfq.global_virtual_time() > 0 and wfq.global_virtual_time().denominator > 1


def test_a_queued_candidates_expected_start_is_its_finish_less_its_service(monkeypatch: pytest.MonkeyPatch):
    """B16 with 16 sequences: a queued candidate's reported estimate (the rollout's, :mod:`.on_time_report`) gets its
    expected admission — the queue-order finish (overtaking included) less its service alone. #20 reads that service
    once per submit for the rates, the overtaking term and the start. Mutant caught: the start given as the finish."""
    h = build()
    p = planner(h)
    seen: list[tuple[int, float, float | None]] = []
    original = type(p.report).admitted

    def spy(report: Any, rec: Any, now: float, finish: float, records: Any, start: float | None = None) -> None:
        seen.append((rec.request_id, finish, start))
        original(report, rec, now, finish, records, start)

    monkeypatch.setattr(type(p.report), "admitted", spy)
    for _ in range(B):
        h.submit(prompt=16, new=40, tenant="a")
    waiting = [h.submit(prompt=16 + i, new=20 + i, tenant="ab"[i % 2]).request_id for i in range(6)]
    assert all(h.state(i) == "waiting_admission" for i in waiting)
    assert h.scheduler.on_time is not None
    model = h.scheduler.on_time.model()
    assert model is not None
    starts = {i: (finish, start) for i, finish, start in seen}
    assert all(starts[i][1] is None for i in range(1, B + 1))  # admitted at once: no wait, no start
    for k, i in enumerate(waiting[1:], 1):  # the first queued has nobody waiting ahead: no queue-order estimate
        finish, start = starts[i]
        assert start is not None and start == pytest.approx(finish - model.service_s(16 + k, 20 + k - 1), abs=1e-9)
        assert start > h.clock.now()
