"""Issue #17: the live monitors as the engine drives them, and the fault soak with all of them on.

"Monitors for pool and joint invariants on in every test; the 10 000-request fault soak runs with them on";
"any index kept beside a machine is checked against it by a monitor". The engine checks, at the end of each
actor call (every call in tests; one tick in ``monitoring.sample_every`` in production):

* requests × KV lanes (``RequestLaneSystem``, :mod:`calculet.runtime.scheduling.joint_checks`), with the
  counters kept beside the machines as its ``extra``: the generations' (``ModelManager.counter_faults``) and
  the admission budget's (``budget_monitor.count_faults``: the four counters equal the live requests they
  count, ``AdmissionBudgetSystem``);
* device jobs × KV lanes (``JobLaneSystem``, :mod:`calculet.runtime.scheduling.job_lane_monitor`) — also at
  every job event and at the start of each scheduler step;

and, where their operations happen, the KV pool (``KvLanePool``, ``kv_checks``) and the budget limits
(``AdmissionBudgetMachine``). Seeded faults: an admission controller whose release forgets the request's
KV tokens (a counter that drifts while staying within its limit), and a lane left pending by no job, each
caught at the end of the engine's actor call.
"""

from __future__ import annotations

from collections import Counter
from unittest import mock

import pytest

from calculet.machines.errors import InvariantViolation
from calculet.machines.monitor import MONITOR
from calculet.runtime.scheduling.admission import AdmissionController
from calculet.runtime.scheduling.job_lane_monitor import JobLaneMonitor
from calculet.runtime.scheduling.joint_checks import JointMonitor
from tests.integration.engine.support import make_driver, request, submit_all
from tests.integration.engine.test_soak import soak

WHOLE_SYSTEM_MONITORS = {"RequestLaneSystem", "JobLaneSystem", "AdmissionBudgetSystem", "KvLanePool",
                         "AdmissionBudgetMachine"}


def _counting_checks() -> tuple[Counter[str], object]:
    """Count MONITOR.check_whole calls by the system, pool or machine they check."""
    seen: Counter[str] = Counter()
    real = MONITOR.check_whole

    def counting(name, *args, **kwargs):  # type: ignore[no-untyped-def]
        seen[name] += 1
        return real(name, *args, **kwargs)

    return seen, mock.patch.object(MONITOR, "check_whole", counting)


class _ForgetsKvOnRelease(AdmissionController):
    """The seeded fault: ``released`` gives the sequence back but not its KV tokens (``active_kv`` drifts up
    while staying far below ``max_kv_tokens``, so no limit notices)."""

    def released(self, rec):  # type: ignore[no-untyped-def]
        self._active_kv += rec.prompt_tokens + rec.max_new_tokens
        super().released(rec)


@pytest.mark.req("R5.1.2", "R14.4", "R9.2.1")
def test_an_engine_run_checks_every_whole_system_monitor() -> None:
    seen, patch = _counting_checks()
    with patch:
        driver, _ = make_driver("current", numerics=False)
        submit_all(driver, [request(i, 4) for i in range(6)])
        driver.run_until_idle()
        driver.stop()
    assert WHOLE_SYSTEM_MONITORS <= set(seen), seen
    assert not MONITOR.statistics().violations


@pytest.mark.req("R17.3.3", "R5.1.2", "R14.4", "R9.2.1")
def test_the_fault_soak_runs_with_every_whole_system_monitor_on() -> None:
    """``soak`` is the function both fault soaks call (1 000 requests in the default suite, 10 000 in ``make
    soak``): its engine, with faults of every kind injected, runs every pool and joint monitor, each many times."""
    seen, patch = _counting_checks()
    with patch:
        soak(60, seed=3)
    assert WHOLE_SYSTEM_MONITORS <= set(seen), seen
    assert min(seen[name] for name in WHOLE_SYSTEM_MONITORS) >= 50, seen


@pytest.mark.req("R5.1.2")
def test_an_admission_counter_that_drifts_is_caught_by_the_engine() -> None:
    driver, _ = make_driver("current", numerics=False)
    driver.core.scheduler.admission.__class__ = _ForgetsKvOnRelease
    submit_all(driver, [request(0, 3)])
    with pytest.raises(InvariantViolation) as info:
        driver.run_until_idle()
    assert info.value.machine == "AdmissionBudgetSystem"
    assert info.value.invariant == "counters_are_the_counted_requests" and info.value.rid == "R5.1.2"


@pytest.mark.req("R14.4")
def test_the_job_lane_monitor_checks_the_end_of_every_actor_call() -> None:
    """With every event checked, each actor call (dispatch, schedule) ends with JobLaneSystem's check, as the
    requests × lanes one: a lane left with its step open after it was freed is caught at the end of the call that left it, before
    any scheduler step or job event (the requests × lanes monitor is silenced here to isolate this one)."""
    driver, _ = make_driver("current", numerics=False)
    submit_all(driver, [request(i, 3) for i in range(2)])
    afters: list[str] = []
    real = JobLaneMonitor.check

    def recording(self, after="check"):  # type: ignore[no-untyped-def]
        afters.append(after)
        return real(self, after)

    with mock.patch.object(JobLaneMonitor, "check", recording):
        driver.step()
    assert afters.count("engine tick") == 2, afters
    driver.run_until_idle()
    kv = driver.core.kv
    batch = driver.core.scheduler.job_lanes.batch
    j = next(j for j in range(kv.lanes) if kv.lane(j).state == "free" and j in batch)
    kv.open_list()[j] = 1  # the fault: a step left open on a freed lane, bound to the ended job it last served (#20)
    expected = "open_step_lane_is_held"
    with mock.patch.object(JointMonitor, "check", lambda *args, **kwargs: None), \
            pytest.raises(InvariantViolation) as info:
        driver.step()
    assert info.value.machine == "JobLaneSystem" and info.value.transition == "engine tick"
    assert info.value.invariant == expected and info.value.rid == "R14.4"
