"""PrefillScheduler (§6): classes, the WRR of service opportunities, chunking gates, long-prefill share."""

from __future__ import annotations

from collections import Counter

import pytest

from calculet.config import QueuesConfig
from calculet.machines.request import FinishReason
from calculet.runtime.scheduling.decode import DecodeBatch
from calculet.runtime.scheduling.prefill import QUEUES, PrefillScheduler, PrefillWork, SmoothWrr
from calculet.runtime.scheduling.plan import SchedulingCapabilities
from tests.unit.runtime.runtime_support import Harness


@pytest.mark.req("R6.2", "R15.10", "R15.11")
@pytest.mark.parametrize("tokens,queue", [(1, "short"), (512, "short"), (513, "medium"), (4096, "medium"),
                                          (4097, "long"), (40_000, "long")])
def test_prefill_class_boundaries(tokens, queue):
    assert PrefillScheduler(QueuesConfig()).classify(tokens) == queue


@pytest.mark.req("R6.3", "R15.6", "R15.7", "R15.8", "R15.9")
def test_every_15_consecutive_opportunities_split_8_4_2_1():
    wrr = SmoothWrr(QueuesConfig().wrr_weights())
    picks = [wrr.choose(set(QUEUES)) for _ in range(15 * 20)]
    for start in range(len(picks) - 14):
        window = Counter(picks[start:start + 15])
        assert window == {"decode": 8, "short": 4, "medium": 2, "long": 1}, (start, window)


@pytest.mark.req("R6.4")
def test_configured_weights_change_the_ratio():
    queues = QueuesConfig(decode_weight=3, short_prefill_weight=1, medium_prefill_weight=1, long_prefill_weight=1)
    wrr = SmoothWrr(queues.wrr_weights())
    picks = Counter(wrr.choose(set(QUEUES)) for _ in range(6 * 50))
    assert picks == {"decode": 150, "short": 50, "medium": 50, "long": 50}


def test_empty_queues_are_skipped_and_bank_no_credit():
    wrr = SmoothWrr(QueuesConfig().wrr_weights())
    assert wrr.choose(set()) is None
    assert [wrr.choose({"long"}) for _ in range(3)] == ["long"] * 3
    assert Counter(wrr.choose({"decode", "long"}) for _ in range(9)) == {"decode": 8, "long": 1}


@pytest.mark.req("R6.3", "R6.4")
def test_the_wrr_choice_equals_smooth_weighted_round_robin_over_any_sequence_of_eligible_sets():
    """SmoothWrr answers a lone repeated choice without its loop (issue #20): over random eligible sets with long
    runs of one queue alone, its picks and counts equal nginx's algorithm computed here from scratch."""
    import random

    weights = QueuesConfig().wrr_weights()
    wrr, current, rng = SmoothWrr(weights), {name: 0 for name in weights}, random.Random(20)
    expected_picks: Counter[str] = Counter()
    for _ in range(3000):
        eligible = {rng.choice(QUEUES)} if rng.random() < 0.6 else set(rng.sample(QUEUES, rng.randint(0, 4)))
        best, total = None, 0
        for name, weight in weights.items():
            current[name] = current[name] + weight if name in eligible else 0
            total += weight if name in eligible else 0
            if name in eligible and (best is None or current[name] > current[best]):
                best = name
        if best is not None:
            current[best] -= total
            expected_picks[best] += 1
        assert wrr.choose(eligible) == best, eligible
    assert wrr.picks() == {name: expected_picks[name] for name in weights}


@pytest.mark.req("R17.1.5", "R5.3.5", "R5.3.4")
def test_long_prefill_keeps_its_minimum_share_under_sustained_decode():
    h = Harness.build(sizes=(1,), lanes=64, max_seq=16_384,
                      admission={"max_sequences": 64, "long_prefill_quota": {"max_admitted": 4, "max_waiting": 8}})
    for _ in range(8):
        h.submit(prompt=16, new=5000)               # sustained decode
    h.prefill_all()
    longs = [h.submit(prompt=6000, new=4).request_id for _ in range(4)]
    kinds = []
    for _ in range(60):
        plan = h.step()
        work = plan.work
        kinds.append("decode" if isinstance(work, DecodeBatch) else work.queue)
        h.run(plan)
        h.confirm_all()
    # with decode always ready, long still gets one opportunity in every 9 (weights 8:1) ...
    picks = [i for i, kind in enumerate(kinds) if kind == "long"]
    assert len(picks) == 4 and picks[0] < 9 and all(b - a <= 9 for a, b in zip(picks, picks[1:]))
    # ... and a long prefill never blocks decode: decode got every other opportunity
    assert kinds.count("decode") == 56
    assert all(h.state(r) not in ("prefill_ready", "prefill_running") for r in longs)


@pytest.mark.req("R6.3", "R17.1.5")
def test_scheduler_interleaves_opportunities_by_weight_with_all_queues_busy():
    h = Harness.build(sizes=(1,), lanes=128, max_seq=16_384,
                      admission={"max_sequences": 128, "max_waiting_requests": 1000,
                                 "long_prefill_quota": {"max_admitted": 32, "max_waiting": 32}})
    for _ in range(4):
        h.submit(prompt=16, new=10_000)
    h.prefill_all()
    for _ in range(32):
        h.submit(prompt=100, new=2)
        h.submit(prompt=1000, new=2)
        h.submit(prompt=5000, new=2)
    kinds = []
    for _ in range(75):
        plan = h.step()
        kinds.append("decode" if isinstance(plan.work, DecodeBatch) else plan.work.queue)
        h.run(plan)
        h.confirm_all()
    for start in range(0, 75, 15):
        assert Counter(kinds[start:start + 15]) == {"decode": 8, "short": 4, "medium": 2, "long": 1}


@pytest.mark.req("R6.1", "R6.5")
def test_without_incremental_prefill_a_40k_prompt_is_one_job():
    h = Harness.build(sizes=(1,), lanes=2, max_seq=65_536)
    rid = h.submit(prompt=40_000, new=2).request_id
    plan = h.step()
    work = plan.work
    assert isinstance(work, PrefillWork)
    assert (work.start_position, work.tokens, work.last_chunk) == (0, 40_000, True)
    h.run(plan)
    assert h.state(rid) == "decode_ready"
    assert h.kv.committed_len(h.rec(rid).lease) == 40_000


def test_a_chunk_size_without_the_capability_does_not_chunk():
    h = Harness.build(sizes=(1,), lanes=2, max_seq=65_536, chunk=16)
    h.submit(prompt=100, new=2)
    assert h.step().work.tokens == 100


def chunked(prompt: int, chunk: int) -> tuple[Harness, int]:
    h = Harness.build(sizes=(1,), lanes=4, max_seq=8192, chunk=chunk,
                      caps=SchedulingCapabilities(incremental_prefill=True))
    return h, h.submit(prompt=prompt, new=3).request_id


@pytest.mark.req("R6.5")
@pytest.mark.parametrize("prompt", [15, 16, 17, 48, 50])
def test_with_incremental_prefill_chunks_fall_on_profile_boundaries(prompt):
    h, rid = chunked(prompt, 16)
    jobs = []
    while h.state(rid) in ("prefill_ready", "prefill_running"):
        plan = h.step()
        work = plan.work
        assert isinstance(work, PrefillWork)
        jobs.append((work.start_position, work.tokens, work.last_chunk))
        h.run(plan)
    starts = [s for s, _, _ in jobs]
    assert all(s % 16 == 0 for s in starts)
    assert sum(t for _, t, _ in jobs) == prompt and [last for _, _, last in jobs][-1]
    assert sum(last for _, _, last in jobs) == 1
    assert h.state(rid) == "decode_ready" and h.rec(rid).machine.kv_length == prompt
    h.drive()
    assert h.sinks[rid].outcome.state == "completed" and len(h.sinks[rid].tokens) == 3


@pytest.mark.req("R6.2", "R6.3")
def test_chunks_of_a_long_prompt_stay_in_the_long_queue_so_short_prompts_pass_them():
    """Classed by prompt length (R6.2), a 40K prompt's 512-token chunks use the long queue's share."""
    h = Harness.build(sizes=(1,), lanes=8, max_seq=65_536, chunk=512,
                      caps=SchedulingCapabilities(incremental_prefill=True))
    long_id = h.submit(prompt=40_000, new=2).request_id
    plan = h.step()
    assert plan.work.queue == "long" and plan.work.tokens == 512
    h.run(plan)
    shorts = [h.submit(prompt=100, new=2).request_id for _ in range(3)]
    queues = []
    for _ in range(8):
        plan = h.step()
        if isinstance(plan.work, PrefillWork):
            queues.append((plan.work.queue, plan.work.request_id))
            h.run(plan)
        else:
            h.scheduler.submitted(plan.work.job_id)
            h.complete(plan.work)
    # the three short prompts are prefilled before the long prompt's next chunks pile up
    firsts = [rid for q, rid in queues[:4]]
    assert set(shorts) <= set(firsts), queues
    assert all(q == "long" for q, rid in queues if rid == long_id)
    assert all(q == "short" for q, rid in queues if rid in shorts)


@pytest.mark.req("R6.2", "R5.3.3")
def test_a_later_prompt_of_the_same_class_does_not_wait_for_every_chunk_of_an_earlier_one():
    """Chunks rotate within their class: a 1000-token prompt arriving after a 4000-token one's first
    chunk starts after a chunk or two of it, not after all eight."""
    h = Harness.build(sizes=(1,), lanes=8, max_seq=65_536, chunk=512,
                      caps=SchedulingCapabilities(incremental_prefill=True))
    big = h.submit(prompt=4000, new=2).request_id
    plan = h.step()
    assert plan.work.request_id == big and plan.work.queue == "medium"
    h.run(plan)
    small = h.submit(prompt=1000, new=2).request_id
    order = []
    while h.state(small) in ("prefill_ready", "prefill_running") or h.state(big) in ("prefill_ready",
                                                                                      "prefill_running"):
        plan = h.step()
        if isinstance(plan.work, PrefillWork):
            order.append(plan.work.request_id)
            h.run(plan)
        else:
            h.scheduler.submitted(plan.work.job_id)
            h.complete(plan.work)
    first_small = order.index(small)
    assert first_small <= 2, order
    assert order.count(big) == 7 and order.count(small) == 2


@pytest.mark.req("R4.4", "R4.5")
def test_cancel_between_chunks_ends_at_once_and_during_a_chunk_drains():
    h, rid = chunked(64, 16)
    h.run(h.step())                                  # first chunk done, nothing in flight
    assert h.state(rid) == "prefill_running"
    h.scheduler.cancel(rid)
    assert h.sinks[rid].outcome.finish_reason is FinishReason.CANCELLED
    assert h.confirm_all() == 1 and h.scheduler.idle()

    h, rid = chunked(64, 16)
    plan = h.step()
    h.scheduler.submitted(plan.work.job_id)          # a chunk is on the device
    h.scheduler.cancel(rid)
    assert h.state(rid) == "prefill_running"
    h.complete(plan.work)
    assert h.sinks[rid].outcome.finish_reason is FinishReason.CANCELLED
    h.confirm_all()
    assert h.scheduler.idle()


def test_deadline_between_chunks_fails_the_request():
    h = Harness.build(sizes=(1,), lanes=4, max_seq=8192, chunk=16,
                      caps=SchedulingCapabilities(incremental_prefill=True))
    rid = h.submit(prompt=64, new=3, deadline_ms=1000).request_id
    h.run(h.step())
    h.clock.advance(1)
    assert h.step().work is None
    assert h.sinks[rid].outcome.finish_reason is FinishReason.DEADLINE


def test_prefill_statistics():
    h = Harness.build(sizes=(1,), lanes=8)
    h.submit(prompt=10, new=2)
    h.clock.advance(2)
    h.submit(prompt=5000, new=2)
    stats = h.scheduler.prefill.statistics()
    assert stats.depth == {"short": 1, "medium": 0, "long": 1}
    assert stats.oldest_wait_s == {"short": 2, "medium": 0, "long": 0}
