"""R7.4.6 in the running engine: with lane-level failure isolation declared by the vendor profile, a decode job
whose completion reports a fault on one lane is quarantined and its good lanes commit — a step JobLaneSystem allows
(the commit guard and ``lane_commits_only_after_its_job_answered`` accept the lane's own job *answered*: ended, or
quarantined by a fault its completion reported, #20) and the job × lane monitor checks where the KV manager takes
it. Simulated evidence only (§20).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from calculet.adapters.calrt import JobKind
from calculet.adapters.sim import FaultRule, InjectedFault, SimConfig
from calculet.clock import FakeClock
from calculet.machines.monitor import MONITOR
from calculet.runtime.engine.driver import EngineDriver
from calculet.runtime.engine.types import EngineOptions
from calculet.runtime.streams.writer import StreamFinish
from tests.integration.engine.support import (RecordingRuntime, assert_clean, engine_config, reference, request,
                                              submit_all)
from tests.integration.sim.test_kv_transactions import isolated_package

PREFILL_FIRST = {"decode_weight": 1, "short_prefill_weight": 64}


@pytest.mark.req("R7.4.6", "R14.4", "R9.2.5")
def test_a_faulted_jobs_good_lanes_commit_under_declared_isolation_and_the_monitor_holds(tmp_path: Path) -> None:
    """A CCU fault on lane 1 of the 2nd B4 decode job, the vendor declaring lane-level isolation: the job is
    quarantined (its completion reported the fault, buffers fenced until the reset), lane 1 goes Unknown and its
    request fails with CCU_FAULT, and the other three lanes' tokens are delivered and *committed* at the end of that
    job — checked there by the job x lane monitor (raise mode, every event) against JobLaneSystem's step
    properties. The CCU fault then poisons the device (§12): its reset loses every lane's KV, so those three
    requests end failed after that token (what the engine does; isolation spares the lanes' results, not the
    device). Mutants caught (checked, the monitor raises at that commit): JobLaneSystem's commit guard and step
    properties on "the lane's own job *completed*" (main's model) or "*ended*" (559d3f7) — neither admits a job
    quarantined by a reported fault."""
    clock = FakeClock()
    runtime = RecordingRuntime(SimConfig(clock=clock, numerics=True))
    driver = EngineDriver(engine_config(profiles=[1, 4], queues=PREFILL_FIRST), runtime,  # type: ignore[arg-type]
                          isolated_package(tmp_path), clock=clock,
                          options=EngineOptions(verify_golden=True, monitor_mode=None))
    runtime.jobs.clear()
    runtime.device.faults.add(FaultRule(InjectedFault.CCU_FAULT, job_kind=JobKind.DECODE, nth=2, lanes=(1,)))
    kv = driver.core.kv
    assert kv.steps is not None and MONITOR.enabled and MONITOR.mode == "raise" and MONITOR.sample_every == 1
    commits: list[tuple[list[int], tuple[str, bool]]] = []
    check = kv.steps.after

    def seen(pre: list[Any], event: str, job: Any = None) -> None:
        if job is not None and event == "commit" and job.state != "completed":
            commits.append(([p[0] for p in pre], (job.state, job.fault_reported)))
        check(pre, event, job)

    kv.steps.after = seen
    before = MONITOR.statistics()
    streams = submit_all(driver, [request(i, 6) for i in range(4)])
    driver.run_until_idle()

    results = [s.result(0) for s in streams]
    assert [r.outcome.state for r in results] == ["failed"] * 4
    assert "CCU_FAULT" in results[1].outcome.detail and len(results[1].raw_tokens) == 2   # prefill + 1st decode
    for i in (0, 2, 3):   # the good lanes' 2nd decode token was delivered (and committed) before the reset
        assert results[i].raw_tokens == reference(i, 6)[:3], i
        assert results[i].outcome.detail.startswith("KV lost in device reset after CCU_FAULT")
    assert commits == [([0, 2, 3], ("quarantined", True))]
    after = MONITOR.statistics()
    assert after.checks > before.checks and after.violations == before.violations
    assert driver.statistics().recovery.faults == {"ccu_fault": 1}
    assert_clean(driver)
    driver.stop()
