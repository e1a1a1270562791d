"""The simulated KvManager: canAllocate as a hint, §9.3 context operations, refusal while in flight."""

from __future__ import annotations

import numpy as np
import pytest

from calculet.adapters.calrt import (
    DeviceInvalidState,
    DeviceNotFound,
    DeviceOutOfMemory,
    KvSeqId,
    OperationNotSupported,
    ReturnCode,
)
from calculet.adapters.sim import SimSession
from calculet.adapters.host_driver import HostDriver
from calculet.adapters.sim.faults import InjectedFault, FaultRule
from calculet.errors import NotSupported

PROMPT = [256, *b"the quick brown fox"]


@pytest.mark.req("R5.1.3")
def test_can_allocate_is_only_a_hint_about_sequence_slots(current: SimSession) -> None:
    kv = current.kv
    slots = current.calbin.max_sequences
    # It says yes regardless of how many tokens the sequences will need: lengths are the service's job.
    assert kv.can_allocate(slots) and not kv.can_allocate(slots + 1)
    seqs = [kv.allocate_sequence() for _ in range(slots)]
    assert 0 not in seqs and len(set(seqs)) == slots
    assert not kv.can_allocate(1)
    with pytest.raises(DeviceOutOfMemory) as exc:
        kv.allocate_sequence()
    assert exc.value.rc is ReturnCode.OUT_OF_MEMORY
    kv.free_sequence(seqs[0])
    assert kv.can_allocate(1)
    fresh = kv.allocate_sequence()
    assert fresh not in seqs, "seq ids are never reused, so a stale id cannot touch a new sequence"
    with pytest.raises(DeviceNotFound):
        kv.committed_length(seqs[0])
    assert kv.statistics().live_sequences == slots


@pytest.mark.req("R9.3.4", "R9.3.5", "R9.3.6", "R9.3.7")
def test_empty_context_operations_return_not_supported_and_change_nothing(
        current: SimSession, current_driver: HostDriver) -> None:
    kv = current.kv
    a, b = kv.allocate_sequence(), kv.allocate_sequence()
    assert current_driver.prefill(a, PROMPT).ok
    before = kv.inspect(a).backing_sha256
    calls = [
        lambda: kv.copy_prefix(a, b, 4),
        lambda: kv.keep_one_sequence(a),
        lambda: kv.position_add(a, 0, 4, 2),
        lambda: kv.position_div(a, 0, 4, 2),
        lambda: kv.save_session(a),
        lambda: kv.load_session(b, b"\x00" * 16),
    ]
    for call in calls:
        with pytest.raises(OperationNotSupported) as exc:
            call()
        assert isinstance(exc.value, NotSupported) and exc.value.rc is ReturnCode.NOT_SUPPORTED
        assert "§9.3" in str(exc.value)
    assert kv.inspect(a).backing_sha256 == before and kv.committed_length(b) == 0
    assert kv.statistics().not_supported_calls == len(calls)


@pytest.mark.req("R9.3.2")
def test_remove_tokens_at_end_is_implemented_exactly(current: SimSession, current_driver: HostDriver) -> None:
    kv = current.kv
    a, b = kv.allocate_sequence(), kv.allocate_sequence()
    assert current_driver.prefill(a, PROMPT).ok
    assert current_driver.prefill(b, PROMPT[:-3]).ok
    kv.remove_tokens_at_end(a, 3)
    assert kv.committed_length(a) == len(PROMPT) - 3
    ka, kb = kv.inspect(a).k, kv.inspect(b).k
    assert ka is not None and kb is not None
    np.testing.assert_allclose(ka, kb, atol=1e-12)
    ra = current_driver.decode(1, [(a, PROMPT[-3])])
    rb = current_driver.decode(1, [(b, PROMPT[-3])])
    assert ra.lanes[0].logits is not None and rb.lanes[0].logits is not None
    np.testing.assert_allclose(ra.lanes[0].logits, rb.lanes[0].logits, atol=1e-12)
    with pytest.raises(Exception) as exc:
        kv.remove_tokens_at_end(a, 10_000)
    assert getattr(exc.value, "rc", None) is ReturnCode.INVALID_ARGUMENT


@pytest.mark.req("R9.3.8")
def test_do_shift_exists_but_is_not_semantically_closed(current: SimSession, current_driver: HostDriver) -> None:
    """DoShift keeps stale positions in the kept keys: the result differs from a fresh prefill."""
    kv = current.kv
    shifted, fresh = kv.allocate_sequence(), kv.allocate_sequence()
    assert current_driver.prefill(shifted, PROMPT).ok
    kv.do_shift(shifted, 4)
    assert current_driver.prefill(fresh, PROMPT[4:]).ok
    assert kv.committed_length(shifted) == kv.committed_length(fresh) == len(PROMPT) - 4
    rs = current_driver.decode(1, [(shifted, 7)])
    rf = current_driver.decode(1, [(fresh, 7)])
    assert rs.lanes[0].logits is not None and rf.lanes[0].logits is not None
    assert np.max(np.abs(rs.lanes[0].logits - rf.lanes[0].logits)) > 1e-3
    assert current.calbin.capabilities.context_ops.shift.value.value == "gated"


@pytest.mark.req("R12.11", "R9.2.6")
def test_sequence_written_by_an_unfinished_job_cannot_be_freed_or_edited(
        current: SimSession, current_driver: HostDriver) -> None:
    kv, dev = current.kv, current.device
    seq = kv.allocate_sequence()
    dev.faults.add(FaultRule(InjectedFault.TIMEOUT))
    dev.submit(current_driver.prefill_job(seq, PROMPT))
    for op in (lambda: kv.free_sequence(seq), lambda: kv.remove_tokens_at_end(seq, 0),
               lambda: kv.do_shift(seq, 0)):
        with pytest.raises(DeviceInvalidState, match="forced operation is not a cancellation"):
            op()
    assert kv.statistics().inflight_sequences == 1
    dev.reset_configuration()
    with pytest.raises(DeviceInvalidState, match="no longer valid"):
        kv.committed_length(KvSeqId(seq))
