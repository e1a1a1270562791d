"""The request desk's goodput ledger (issue #13): outcomes and jobs built by hand."""

from __future__ import annotations

import pytest

from calculet.machines.request import FinishReason
from calculet.runtime.engine.goodput import GoodputLedger, RequestWork


def test_on_time_and_late_completions_are_counted_per_tenant() -> None:
    ledger = GoodputLedger()
    a, b, c = RequestWork("alpha", 10.0), RequestWork("alpha", 10.0), RequestWork("beta", 5.0)
    ledger.ended(a, FinishReason.STOP, 10.0)       # at the deadline: on time
    ledger.ended(b, FinishReason.LENGTH, 10.5)     # after it: late
    ledger.ended(c, FinishReason.LENGTH, 1.0)
    stats = ledger.statistics()
    assert stats.on_time == {"alpha": 1, "beta": 1} and stats.late == {"alpha": 1}
    assert stats.goodput == 2 and stats.wasted_tokens == {} and stats.wasted_share == 0.0


def test_work_of_expired_and_failed_requests_is_wasted_by_phase_and_reason() -> None:
    ledger = GoodputLedger()
    doomed, failed, kept, cancelled = (RequestWork("t", 1.0) for _ in range(4))
    ledger.job_done([doomed], "prefill", 100, submitted_at=0.0, completed_at=1.0)
    ledger.job_done([failed], "prefill", 50, submitted_at=1.0, completed_at=1.5)
    ledger.job_done([kept], "prefill", 20, submitted_at=1.5, completed_at=2.0)
    for i in range(3):  # three B4 steps of 0.4 s, all submitted early; one lane's request is off record
        ledger.job_done([doomed, failed, kept, None], "decode", 1, submitted_at=0.0, completed_at=2.4 + 0.4 * i)
    ledger.ended(doomed, FinishReason.DEADLINE, 3.0)
    ledger.ended(failed, FinishReason.ERROR, 3.0)
    ledger.ended(kept, FinishReason.LENGTH, 3.0)   # late, but its work is not waste
    ledger.ended(cancelled, FinishReason.CANCELLED, 3.0)
    stats = ledger.statistics()
    assert stats.computed_tokens == {"prefill": 170, "decode": 12}
    assert stats.wasted_tokens == {("prefill", "deadline"): 100, ("decode", "deadline"): 3,
                                   ("prefill", "error"): 50, ("decode", "error"): 3}
    # each decode job is busy from the previous completion, not from its submit (no double count)
    assert stats.device_seconds == pytest.approx(2.0 + 3 * 0.4)
    assert stats.wasted_device_seconds["deadline"] == pytest.approx(1.0 + 3 * 0.4 / 4)
    assert stats.wasted_device_seconds["error"] == pytest.approx(0.5 + 3 * 0.4 / 4)
    assert stats.wasted_share == pytest.approx(2.1 / 3.2)
    assert stats.late == {"t": 1} and stats.goodput == 0
