"""Issue #13 session 20: the decode set's rollout (:mod:`.decode_rollout`), the finish estimate reported on B>1.

The model on small cases checked by hand (virtual time, values in, a finish out: each docstring walks the steps),
then through the sans-io scheduler: on B>1 the reported ``estimated_finish`` is the rollout's while the planner's own
estimate is what the admission margin scores (no decision moves); on B1 nothing changes.
"""

from __future__ import annotations

from dataclasses import dataclass
from types import SimpleNamespace
from typing import Any

import pytest

from calculet.runtime.scheduling.arrival_law import ArrivalLaw, RatePiece
from calculet.runtime.scheduling.decode_rollout import DeviceShape, Present, expected_arrivals, rollout_finish
from calculet.runtime.scheduling.on_time_report import PENDING, ROLLOUTS_PER_COMPLETION, ReportedEstimate
from tests.unit.runtime.runtime_support import Harness
from tests.unit.runtime.scheduling.test_on_time_never import advance


def shape(*, profile_of: Any = lambda n: 4, steps: dict[int, float] | None = None, prefill_per_token: float = 0.001,
          lanes: int = 4, engines: int = 1, chunk: int | None = None) -> DeviceShape:
    table = steps or {4: 0.2}
    return DeviceShape(lanes=lanes, engines=engines, profile_of=profile_of, step_s=table.__getitem__,
                       prefill_s=lambda tokens: prefill_per_token * tokens, chunk_tokens=chunk)


@dataclass
class Forecast:
    """A constant rate forever; told of submits and ends (what the planner tells a learned law), it counts them."""

    rate: float
    mean_prompt_tokens: float = 1.0
    mean_output_tokens: float = 100.0
    submits: int = 0
    ends: int = 0

    def forecast(self, now: float, horizon_s: float) -> tuple[RatePiece, ...]:
        return (RatePiece(now, now + horizon_s, self.rate),)

    def arrived(self, now: float, prompt_tokens: int, max_new_tokens: int) -> None:
        self.submits += 1

    def finished(self, generated_tokens: int) -> None:
        self.ends += 1

    def lengths(self) -> tuple[tuple[int, ...], tuple[int, ...]]:
        return (), ()  # no sample: the means


@pytest.mark.req("R6.3")
def test_one_profile_the_wrr_interleaves_the_candidates_prefill_and_its_prefill_yields_the_first_token():
    """One sequence decoding (10 left), B4 only at 0.2 s a step, prefill 1 ms a token. The candidate (100-token prompt,
    4 tokens) waits in the short queue: §6's WRR (decode 8 : short 4) serves a decode step first (0.2 s), then its
    prefill (0.1 s, its first token), then 3 steps of the two sequences: 0.3 + 0.6 = 0.9 s.
    Mutants caught: the prefill yielding no token (1.1 s); prefills before decode (0.7 s)."""
    finish = rollout_finish(Present(decoding=(10,)), 100, 4, 0.0, shape())
    assert finish == pytest.approx(0.9)


@pytest.mark.req("R8.1")
def test_a_set_larger_than_its_profile_rotates():
    """B1 only (0.1 s a step), one sequence with 2 tokens left; the candidate asks 3, its prefill free. Step 1 (t 0.1)
    serves the other alone (1 left); the prefill gives the candidate's first token; two sequences on one lane rotate:
    each gets half a token a step, so after 2 steps (t 0.3) the other has ended and the candidate has 1 left; alone, one
    step more: 0.4 s. Mutant caught: no rotation (a token a step for every sequence: 0.3 s)."""
    finish = rollout_finish(Present(decoding=(2,)), 10, 3, 0.0,
                            shape(profile_of=lambda n: 1, steps={1: 0.1}, prefill_per_token=0.0))
    assert finish == pytest.approx(0.4)


@pytest.mark.req("R8.1")
def test_expected_arrivals_join_the_set_and_the_profile_grows():
    """Arrivals at 2 per second (the mean path puts them at 0.25, 0.75, 1.25 s), each 100 tokens; §8 selects B4 (0.2 s
    a step) from 3 ready, else B1 (0.1 s; two rotate); prefills free. The candidate (10 decode tokens) alone would end
    at 1.0 s. Walked by hand: 3 B1 steps alone (t 0.3, 7 left), the first arrival joins after one more step (t 0.4, 6
    left); two rotate on B1 for 4 steps (t 0.8, 4 left), the second arrives: 2 more rotating steps (t 1.0, 3 left);
    three sequences select B4: 2 steps to the third arrival (t 1.4, 1 left), then its last: 1.6 s.
    Mutants caught: arrivals ignored (1.0 s); the profile not grown (B1 rotation throughout: later)."""
    profile_of = lambda n: 4 if n >= 3 else 1  # noqa: E731
    device = shape(profile_of=profile_of, steps={1: 0.1, 4: 0.2}, prefill_per_token=0.0, lanes=8)
    assert expected_arrivals((RatePiece(0.0, 1.6, 2.0),), 0.0) == pytest.approx([0.25, 0.75, 1.25])
    assert rollout_finish(Present(), 1, 11, 0.0, device) == pytest.approx(1.0)
    assert rollout_finish(Present(), 1, 11, 0.0, device, Forecast(rate=2.0)) == pytest.approx(1.6)


@pytest.mark.req("R6.3")
def test_a_lane_holders_prefill_stalls_the_set():
    """B4 at 0.1 s a step, prefill 1 ms a token. One sequence decoding (5 left), and a lane holder still to prefill a
    1000-token prompt (a *medium* one, §6: WRR weight 2). The candidate (100 tokens, asks 5): decode (t 0.1), its short
    prefill (t 0.2, 4 left), two steps (t 0.4, 2 left), then the medium prefill's turn: 1.0 s (t 1.4), two steps: 1.6 s
    against 0.6 s with no lane holder. Mutant caught: a lane holder's prefill not modelled (0.6 s)."""
    device = shape(steps={4: 0.1})
    assert rollout_finish(Present(decoding=(5,)), 100, 5, 0.0, device) == pytest.approx(0.6)
    assert rollout_finish(Present(decoding=(5,), prefilling=((1000, 10),)), 100, 5, 0.0, device) == pytest.approx(1.6)


@pytest.mark.req("R14.1")
def test_ping_pong_builds_a_job_from_what_is_ready_and_times_it_beside_the_other():
    """Two jobs in flight (§14). Three sequences decode (10 left each); the candidate (1-token prompt, asks 2) waits to be
    prefilled (50 ms). Slot 0 takes the three on B4 (§8: 3 ready), alone: 0.2 s; slot 1 the prefill (ends 0.05 s). Then
    slot 1 builds a job of what is ready, the candidate alone on B1, beside the B4 job: the step keyed 1 + 4 (0.25 s),
    its last token at 0.30 s. Mutants caught: the partner job ignored (B1 alone, 0.15 s); one engine (serial: later)."""
    profile_of = lambda n: 4 if n >= 3 else 1  # noqa: E731
    device = shape(profile_of=profile_of, steps={1: 0.1, 2: 0.15, 4: 0.2, 5: 0.25, 8: 0.3}, prefill_per_token=0.05,
                   lanes=8, engines=2)
    assert rollout_finish(Present(decoding=(10, 10, 10)), 1, 2, 0.0, device) == pytest.approx(0.30)


@pytest.mark.req("R5.2.2")
def test_a_waiting_candidate_joins_at_its_expected_admission():
    """Lanes full (one lane, one sequence with 3 left, B4 at 0.1 s): alone in the queue the candidate (free prefill,
    asks 2) takes the lane when it frees (t 0.3) and ends 0.1 s later (0.4 s); told it is admitted at 1.0 s (the §5.3
    queue's order, ``not_before``), it ends at 1.1 s. Mutant caught: ``not_before`` ignored (0.4 s)."""
    device = shape(steps={4: 0.1}, prefill_per_token=0.0, lanes=1)
    assert rollout_finish(Present(decoding=(3,)), 1, 2, 0.0, device) == pytest.approx(0.4)
    assert rollout_finish(Present(decoding=(3,)), 1, 2, 0.0, device, not_before=1.0) == pytest.approx(1.1)


class _Scored:
    """The planner's estimate errors with the estimates ``finished`` is handed recorded (the rest forwarded)."""

    def __init__(self, errors: Any) -> None:
        self.errors = errors
        self.seen: list[float] = []

    def finished(self, arrival: float, estimate: float, deadline: float | None, now: float) -> None:
        self.seen.append(estimate)
        self.errors.finished(arrival, estimate, deadline, now)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.errors, name)


@pytest.mark.req("R5.2.2")
def test_on_b_gt_1_the_reported_estimate_is_the_rollouts_and_the_margin_scores_the_planners():
    """B1 + B4, four lanes: a first request measures the step; two more stream on B4 (8 s); a candidate then joins a
    lane free. Its reported ``estimated_finish`` is the rollout's (the policy's ``_rollout_finish`` on the same present),
    not the planner's; when it ends, the margin is handed the planner's own estimate.
    The planner tells the law of every submit and every end. Mutants caught: the rollout not wired (the planner's
    estimate reported); ``ended`` scoring the reported estimate; ``planned_finish`` answering the reported one; the law
    not told of submits or of ends."""
    h, law = streaming()
    policy = h.scheduler.on_time
    planner = policy.planner
    assert planner.report.rollout is not None
    scored = planner.errors = _Scored(planner.errors)
    sub = h.submit(prompt=8, new=20, deadline_ms=600_000)
    rec = h.rec(sub.request_id)
    own = planner.report._own[sub.request_id]
    assert rec.estimated_finish != pytest.approx(own) and planner.report.planned_finish(rec) == own
    now = h.clock.now()
    assert rec.estimated_finish == pytest.approx(policy._rollout_finish(rec, now, h.scheduler.registry.live))
    advance(h, drained=True)
    assert own in scored.seen and rec.estimated_finish not in scored.seen
    assert (law.submits, law.ends) == (4, 4)


@pytest.mark.req("R5.2.2")
def test_without_a_law_of_arrivals_the_planners_estimate_is_reported():
    """The same device with no law wired: the rollout would let the present drain (worse than the plan's estimate on
    every bursty B16 load measured, docs/estimator.md), so the planner's estimate is reported.
    Mutant caught: the rollout reported with no law."""
    h, _ = streaming(law=False)
    planner = h.scheduler.on_time.planner
    sub = h.submit(prompt=8, new=20, deadline_ms=600_000)
    assert sub.request_id not in planner.report._own and h.rec(sub.request_id).estimated_finish is not None


def streaming(law: bool = True) -> tuple[Harness, Forecast]:
    """B1 + B4, four lanes, a law of arrivals at 0.5 per second (or none): a first request measures the step, two
    more then stream on B4."""
    h = Harness.build(sizes=(1, 4), lanes=4, admission={"max_sequences": 4})
    forecast = Forecast(rate=0.5)
    h.scheduler.on_time.planner.report.arrivals = forecast
    h.submit(prompt=8, new=10, deadline_ms=600_000)
    advance(h, 1.0)
    for _ in range(2):
        h.submit(prompt=8, new=40, deadline_ms=600_000)
    advance(h, 1.5)
    if not law:
        h.scheduler.on_time.planner.report.arrivals = None
    return h, forecast


@pytest.mark.req("R5.2.2")
def test_the_policy_wires_a_learned_law_on_b_gt_1_only():
    """The shipped ``on_time`` policy learns the law of arrivals from the submits on B>1 (``arrival_law.ArrivalLaw``,
    the first submit kept for it) and keeps none on B1. Mutants caught: no law wired (the rollout never reports);
    a law on B1 too; the submit not kept."""
    b4 = Harness.build(sizes=(1, 4), lanes=4, admission={"max_sequences": 4})
    b4.submit(prompt=8, new=10, deadline_ms=600_000)
    report = b4.scheduler.on_time.planner.report
    law = report.arrivals
    report.told()
    assert isinstance(law, ArrivalLaw) and law.statistics().arrivals == 1
    b1 = Harness.build(sizes=(1,), lanes=4, admission={"max_sequences": 4})
    b1.submit(prompt=8, new=10, deadline_ms=600_000)
    assert b1.scheduler.on_time.planner.report.arrivals is None


@pytest.mark.req("R5.2.2")
def test_on_b1_the_reported_estimate_is_the_planners():
    """B1 only (one lane shared by four sequences): no rollout, the planner's estimate is reported as before.
    Mutant caught: the rollout wired whatever the compiled batch."""
    h = Harness.build(sizes=(1,), lanes=4, admission={"max_sequences": 4})
    h.scheduler.on_time.planner.report.arrivals = Forecast(rate=0.5)
    h.submit(prompt=8, new=10, deadline_ms=600_000)
    advance(h, 1.0)
    sub = h.submit(prompt=8, new=20, deadline_ms=600_000)
    planner = h.scheduler.on_time.planner
    assert planner.report.rollout is None and not planner.report._own
    assert h.rec(sub.request_id).estimated_finish is not None


@pytest.mark.req("R5.2.2")
def test_a_waiting_candidates_estimate_is_between_the_replayed_queue_and_the_queue_order_start():
    """Four lanes held by long streams, two more waiting: a candidate waits too. Its reported estimate is the mean of
    the rollout replaying the §5.3 queue and of the rollout joining at the queue-order estimate's start (they bracket
    the wait), so it is not the replay's alone. Mutant caught: the replay alone reported."""
    h = Harness.build(sizes=(1, 4), lanes=4, admission={"max_sequences": 4})
    h.submit(prompt=8, new=10, deadline_ms=600_000)
    advance(h, 1.0)
    for _ in range(6):
        h.submit(prompt=8, new=60, deadline_ms=600_000)
    advance(h, 1.5)
    policy = h.scheduler.on_time
    sub = h.submit(prompt=8, new=20, deadline_ms=600_000)
    rec = h.rec(sub.request_id)
    assert rec.state == "waiting_admission" and sub.request_id in policy.planner.report._own
    replayed = policy._rollout_finish(rec, h.clock.now(), h.scheduler.registry.live, None)
    assert replayed is not None and rec.estimated_finish != pytest.approx(replayed)


@pytest.mark.req("R5.2.2")
def test_at_most_four_rollouts_between_two_device_completions():
    """A burst's submits land in one engine turn: the first four after a device completion are rolled out, the others
    keep the planner's estimate (a rollout is milliseconds of the engine thread: 300 of them held the next step back by
    seconds, and made ``submit()`` 100x its #20 budget); after the next completion they are rolled out again, and the
    statistics count both. Mutants caught: no gate (every submit rolled out); the gate never reopened (keyed on
    nothing that a completion moves); the allowance not reset at a completion; the skipped count not kept."""
    h, _ = streaming()
    planner = h.scheduler.on_time.planner
    before = planner.statistics()
    recs = [h.rec(h.submit(prompt=8, new=20, deadline_ms=600_000).request_id) for _ in range(ROLLOUTS_PER_COMPLETION + 1)]
    for rec in recs[:-1]:
        assert planner.report.planned_finish(rec) != rec.estimated_finish  # the rollout's reported
    assert planner.report.planned_finish(recs[-1]) == recs[-1].estimated_finish  # the planner's own
    after = planner.statistics()
    assert (after.rollouts - before.rollouts, after.rollouts_skipped - before.rollouts_skipped) == (4, 1)
    advance(h, h.clock.now() + 0.5)  # device completions
    more = [h.rec(h.submit(prompt=8, new=20, deadline_ms=600_000).request_id) for _ in range(2)]
    assert all(planner.report.planned_finish(rec) != rec.estimated_finish for rec in more)
    assert planner.statistics().rollouts - before.rollouts == 6


class _Told(Forecast):
    """A law that records the instants it is told of, in order."""

    def __init__(self) -> None:
        super().__init__(rate=0.5)
        self.instants: list[float] = []

    def arrived(self, now: float, prompt_tokens: int, max_new_tokens: int) -> None:
        self.instants.append(now)


def test_submits_are_told_to_the_law_before_a_rollout_reads_it_in_order_and_at_most_pending_kept():
    """Learning costs ~7 µs a submit (over a third of ``submit()``'s #20 budget) and only a rollout reads the law: the
    planner keeps each submit and tells the law of them, in order, before the next rollout, or once ``PENDING`` are
    kept. Mutants caught: the law told at once (nothing kept); not told before the rollout (it reads a stale law);
    told out of order; no bound on the kept list."""
    report = ReportedEstimate(lambda: (0, 0))
    report.arrivals = law = _Told()
    seen: list[int] = []
    report.rollout = lambda rec, now, records, start: seen.append(len(law.instants)) or None
    for k in range(3):
        report.arrived(float(k), 8, 8)
    assert law.instants == []
    report.admitted(SimpleNamespace(request_id=1), 3.0, 1.0, lambda: (), None)  # type: ignore[arg-type]
    assert seen == [3] and law.instants == [0.0, 1.0, 2.0]
    for k in range(PENDING + 2):
        report.arrived(10.0 + k, 8, 8)
    assert len(law.instants) == 3 + PENDING and len(report._pending) == 2
