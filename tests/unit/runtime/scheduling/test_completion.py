"""Completion (§7.4): per-lane split and checks, independent finish, device failure, isolation."""

from __future__ import annotations

import dataclasses

import pytest
from hypothesis import example, given
from hypothesis import strategies as st

from calculet.machines.request import FinishReason
from calculet.runtime.scheduling.completion import (DecodeCompletion, FaultKind, LaneOutcome, LaneVerdict,
                                                    PrefillCompletion, check_decode_lanes, clean_decode_lanes)
from calculet.runtime.scheduling.decode import DecodeBatch
from calculet.runtime.scheduling.plan import SchedulingCapabilities
from tests.unit.runtime.runtime_support import Harness, default_token


def batch_of(count: int, size: int = 4, **kwargs) -> tuple[Harness, DecodeBatch, list[int]]:
    h = Harness.build(sizes=(size,), lanes=size + 2, **kwargs)
    ids = [h.submit(prompt=10 + i, new=6).request_id for i in range(count)]
    h.prefill_all()
    batch = h.next_decode()
    h.scheduler.submitted(batch.job_id)
    return h, batch, ids


def lanes_of(batch: DecodeBatch, ok: bool = True, stop=()):
    return tuple(LaneOutcome(b.lane, b.request_id, b.seq_id, b.generation, ok, default_token(b.request_id, b.position + 1),
                             b.request_id in stop) for b in batch.active)


@pytest.mark.req("R7.4.1", "R7.4.3")
def test_results_are_split_per_lane_and_lanes_finish_independently():
    h, batch, ids = batch_of(3)
    stopper = batch.active[1].request_id
    h.scheduler.on_decode_complete(DecodeCompletion(batch.job_id, 1, True, lanes_of(batch, stop={stopper})))
    assert h.sinks[stopper].outcome.finish_reason is FinishReason.STOP
    for rid in ids:
        if rid != stopper:
            assert h.state(rid) == "decode_ready"
        sink = h.sinks[rid]
        assert sink.tokens == [default_token(rid, p) for p in range(10 + ids.index(rid), 10 + ids.index(rid) + 2)]


@pytest.mark.req("R7.4.2")
def test_a_swapped_lane_is_detected_and_delivered_to_no_stream():
    h, batch, ids = batch_of(2)
    lanes = list(lanes_of(batch))
    a, b = lanes
    lanes = [dataclasses.replace(a, seq_id=b.seq_id), b]  # lane 0 claims lane 1's sequence
    applied = h.scheduler.on_decode_complete(DecodeCompletion(batch.job_id, 1, True, tuple(lanes)))
    assert (applied.lanes_ok, applied.lanes_failed) == (1, 1)
    victim = h.sinks[a.request_id]
    assert victim.outcome.state == "failed" and len(victim.tokens) == 1  # only its prefill token
    assert h.state(b.request_id) == "decode_ready"
    assert h.kv.statistics().unknown == 1          # the crosstalk lane's KV is not trusted
    assert h.scheduler.statistics().anomalies == 1


@pytest.mark.req("R7.4.2")
def test_wrong_generation_is_a_device_failure_for_the_whole_batch():
    h, batch, ids = batch_of(2)
    h.scheduler.on_decode_complete(DecodeCompletion(batch.job_id, 7, True, lanes_of(batch)))
    assert all(h.sinks[r].outcome.state == "failed" for r in ids)


def test_check_decode_lanes_verdicts():
    class Tag:
        def __init__(self, lane, rid):
            self.lane, self.request_id, self.seq_id, self.generation = lane, rid, rid * 10, 1
    bound = [Tag(0, 1), Tag(1, 2), Tag(2, 3)]
    outcomes = (LaneOutcome(0, 1, 10, 1, True, 5), LaneOutcome(1, 2, 20, 1, True, None),
                LaneOutcome(3, 9, 90, 1, True, 5))
    checks, extra = check_decode_lanes(bound, DecodeCompletion(1, 1, True, outcomes), lane_isolation=False)
    assert [c.verdict for c in checks] == [LaneVerdict.OK, LaneVerdict.OUTPUT_INVALID, LaneVerdict.DEVICE_FAILED]
    assert extra == 1
    checks, _ = check_decode_lanes(bound, DecodeCompletion(1, 1, True, outcomes), lane_isolation=False,
                                   vocab_size=5)
    assert checks[0].verdict is LaneVerdict.OUTPUT_INVALID


@pytest.mark.req("R7.4.5")
def test_device_failure_fails_every_lane_and_marks_all_kv_unknown():
    h, batch, ids = batch_of(4)
    h.scheduler.on_decode_complete(DecodeCompletion(batch.job_id, 1, False, lanes_of(batch), FaultKind.ERROR))
    assert all(h.sinks[r].outcome.finish_reason is FinishReason.ERROR for r in ids)
    assert h.kv.statistics().unknown == 4
    assert len(h.scheduler.jobs) == 0            # an error completion ends the job (buffers released)
    assert h.scheduler.recover_lanes() == 4      # no job can write them now: recover
    assert h.confirm_all() == 4 and h.scheduler.idle()


@pytest.mark.req("R7.4.6")
def test_lane_isolation_only_when_the_contract_declares_it():
    caps = SchedulingCapabilities(lane_failure_isolation=True)
    h, batch, ids = batch_of(3, caps=caps)
    lanes = list(lanes_of(batch))
    lanes[1] = dataclasses.replace(lanes[1], ok=False, token=None)
    h.scheduler.on_decode_complete(DecodeCompletion(batch.job_id, 1, False, tuple(lanes), FaultKind.ERROR))
    failed = lanes[1].request_id
    assert h.sinks[failed].outcome.state == "failed"
    assert [h.state(r) for r in ids if r != failed] == ["decode_ready", "decode_ready"]
    assert h.kv.statistics().unknown == 1


@pytest.mark.req("R9.2.5")
def test_commit_only_when_device_and_output_succeed():
    """R9.2.5 in the running scheduler: the submitted decode job's lanes are Updating (the derived §9.1 state)
    with committed_len unchanged; device success plus valid output grows committed_len; invalid output leaves it.
    Mutant caught: the projection ignoring the open step (the lanes reported Active while the job runs)."""
    h, batch, ids = batch_of(2)
    lanes = list(lanes_of(batch))
    lanes[0] = dataclasses.replace(lanes[0], token=None)        # the device ran, the output is unusable
    rec0, rec1 = h.rec(lanes[0].request_id), h.rec(lanes[1].request_id)
    lease0, before0 = rec0.lease, h.kv.committed_len(rec0.lease)
    before1 = h.kv.committed_len(rec1.lease)
    assert h.kv.state(rec0.lease) == h.kv.state(rec1.lease) == "updating" and before0 >= 1 and before1 >= 1
    h.scheduler.on_decode_complete(DecodeCompletion(batch.job_id, 1, True, tuple(lanes)))
    assert h.kv.state(rec1.lease) == "active" and h.kv.statistics().by_state["updating"] == 0
    assert h.kv.lane(lease0.lane).state == "releasing" and h.kv.lane(lease0.lane).committed_len == before0
    assert h.kv.committed_len(rec1.lease) == before1 + 1


@pytest.mark.req("R9.2.6", "R4.9")
def test_ccu_fault_quarantines_the_job_until_a_reset():
    h, batch, ids = batch_of(2, size=4)
    h.scheduler.on_decode_complete(DecodeCompletion(batch.job_id, 1, False, (), FaultKind.CCU_FAULT))
    assert all(h.sinks[r].outcome.state == "failed" for r in ids)
    assert len(h.scheduler.jobs) == 1 and h.scheduler.recover_lanes() == 0  # still fenced
    assert h.step().work is None
    h.scheduler.device_reset()
    assert len(h.scheduler.jobs) == 0 and h.confirm_all() == 2 and h.scheduler.idle()


def test_timeout_then_reset_ends_everything_consistently():
    h, batch, ids = batch_of(3)
    h.scheduler.job_timed_out(batch.job_id)
    assert all(h.sinks[r].outcome.state == "failed" for r in ids)
    assert h.kv.statistics().unknown == 3
    h.scheduler.device_reset()
    assert h.confirm_all() == 3 and h.scheduler.idle()
    assert h.complete(batch).stale                # the late completion after the reset is stale


def _reference_checks(bound, completion, *, lane_isolation, vocab_size):
    """check_decode_lanes as the general path computes it: first outcome per lane, check_lane per bound lane."""
    from calculet.runtime.scheduling.completion import check_lane

    by_lane: dict = {}
    for outcome in completion.lanes:
        by_lane.setdefault(outcome.lane, outcome)
    used = 0
    checks = []
    for b in bound:
        outcome = by_lane.pop(b.lane, None)
        used += outcome is not None
        checks.append(check_lane(b, outcome, job_ok=completion.ok, lane_isolation=lane_isolation,
                                 vocab_size=vocab_size))
    return tuple(checks), len(completion.lanes) - used


@pytest.mark.req("R7.4.2", "R7.4.5", "R7.4.6")
@given(lanes=st.integers(0, 6), faults=st.lists(st.sampled_from(
    ["none", "swap", "tag", "failed", "no_token", "negative", "vocab", "drop", "extra", "dup_bound"]), max_size=3),
    job_ok=st.booleans(), isolation=st.booleans(), vocab=st.sampled_from([None, 100]), stop=st.booleans())
@example(lanes=2, faults=["dup_bound"], job_ok=True, isolation=False, vocab=None, stop=False)
@example(lanes=3, faults=["swap"], job_ok=True, isolation=False, vocab=None, stop=True)
@example(lanes=3, faults=["vocab"], job_ok=True, isolation=True, vocab=100, stop=False)
def test_the_one_pass_check_gives_the_general_verdicts(lanes, faults, job_ok, isolation, vocab, stop):
    """The accepting one-pass of check_decode_lanes (issue #20) and the per-lane general path agree on
    every result: good ones, swapped or mistagged lanes, failed lanes, unusable tokens, missing and extra
    results, a bound lane listed twice."""
    from calculet.runtime.scheduling.decode import LaneBinding

    bound = [LaneBinding(i, 10 + i, 20 + i, 1, i, 5, 3, "t", 9.0) for i in range(lanes)]
    outcomes = [LaneOutcome(b.lane, b.request_id, b.seq_id, b.generation, True, 50 + b.lane, stop) for b in bound]
    for n, fault in enumerate(faults):
        if not outcomes:
            break
        k = n % len(outcomes)
        o = outcomes[k]
        if fault == "swap" and len(outcomes) > 1:
            outcomes[k], outcomes[(k + 1) % len(outcomes)] = outcomes[(k + 1) % len(outcomes)], o
        elif fault == "tag":
            outcomes[k] = dataclasses.replace(o, seq_id=o.seq_id + 1)
        elif fault == "failed":
            outcomes[k] = dataclasses.replace(o, ok=False)
        elif fault == "no_token":
            outcomes[k] = dataclasses.replace(o, token=None)
        elif fault == "negative":
            outcomes[k] = dataclasses.replace(o, token=-1)
        elif fault == "vocab":
            outcomes[k] = dataclasses.replace(o, token=100)
        elif fault == "drop":
            del outcomes[k]
        elif fault == "extra":
            outcomes.append(dataclasses.replace(o, lane=99))
        elif fault == "dup_bound":
            bound.append(bound[k % len(bound)])  # listed twice, with a result echoing it twice
            outcomes.append(LaneOutcome(bound[-1].lane, bound[-1].request_id, bound[-1].seq_id, 1, True, 7, stop))
    completion = DecodeCompletion(1, 1, job_ok, tuple(outcomes))
    reference = _reference_checks(bound, completion, lane_isolation=isolation, vocab_size=vocab)
    assert check_decode_lanes(bound, completion, lane_isolation=isolation, vocab_size=vocab) == reference
    # the columns the completion path takes instead of LaneChecks (issue #20): given only when every lane is
    # OK with no extra result, and then they are the reference's tokens and stops
    clean = clean_decode_lanes(bound, completion, vocab)
    checks, extra = reference
    if clean is not None:
        assert extra == 0 and all(c.verdict is LaneVerdict.OK for c in checks)
        assert clean == ([c.token for c in checks], [c.stop for c in checks])
    elif not faults and job_ok:
        raise AssertionError("a clean result must give its columns")


@pytest.mark.parametrize("record, values", [
    (LaneOutcome, (2, 7, 9, 1, True, 40, False)),
    (DecodeCompletion, (3, 1, True, (), FaultKind.NONE, "")),
    (PrefillCompletion, (3, 1, 7, 9, True, 40, False, FaultKind.NONE, "")),
])
def test_completion_records_are_built_by_quick_init_and_stay_frozen(record: type, values: tuple[object, ...]) -> None:
    """The completion records are built once per job and lane (issue #20): their ``__init__`` is quick_init's, every
    field in declaration order, equal to the same record by keywords, and no field may be written. Mutant caught:
    a record declared ``slots=True`` again (the dataclass's ``__init__``, ``object.__setattr__`` per field — ~1.4 µs
    a record on the B1 step that no call count shows)."""
    assert "quick_init" in record.__init__.__code__.co_filename
    built = record(*values)
    names = [f.name for f in dataclasses.fields(record)]
    assert list(vars(built)) == names and tuple(getattr(built, n) for n in names) == values
    assert built == record(**dict(zip(names, values)))
    with pytest.raises(dataclasses.FrozenInstanceError):
        built.job_id = 4  # type: ignore[attr-defined]
