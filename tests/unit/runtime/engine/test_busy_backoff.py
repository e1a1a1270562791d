"""A submit the device refuses with DeviceBusy holds the engine's scheduling until the back-off passes (§14).

The engine reads its clock in the schedule loop only while a back-off stands (issue #20: not once per token);
this holds that a back-off still stops it. Mutant: the back-off never read (scheduling goes on at once after the
refusal) submits during the back-off and fails the first assertion block.
"""

from __future__ import annotations

from calculet.adapters.calrt import JobKind
from calculet.adapters.sim import FaultRule, InjectedFault
from tests.integration.engine.support import make_driver, request, submit_all


def test_a_device_busy_refusal_holds_scheduling_until_the_back_off_has_passed() -> None:
    driver, runtime = make_driver("current", numerics=False)
    core, clock = driver.core, driver.core.clock
    streams = submit_all(driver, [request(0, 4)])
    runtime.device.faults.add(FaultRule(InjectedFault.DEVICE_BUSY, job_kind=JobKind.DECODE, nth=1))
    for _ in range(20):  # until the decode submit is refused
        driver.dispatch()
        driver.schedule()
        if driver.statistics().executor.submit_rc.get("DEVICE_BUSY"):
            break
        clock.advance(1e-4)
    until = core._backoff_until  # noqa: SLF001 - the back-off the refusal set
    assert until > clock.now()
    submitted = runtime.hooks.submits
    assert driver.schedule() == 0 and runtime.hooks.submits == submitted  # held: nothing submitted
    assert core.next_wake() == until  # and the actor is told when to come back
    clock.advance(until - clock.now())
    driver.dispatch()
    assert driver.schedule() >= 1  # the back-off passed: the refused decode goes again
    driver.run_until_idle()
    result = streams[0].result(0)
    assert len(result.raw_tokens) == 4 and result.outcome.state == "completed"  # the request lost nothing
    driver.stop()
