"""Device faults in the middle of a lifecycle operation (§11, §12 with §15 recovery), simulated.

The engine's recovery (reset or restart per the contract, within the budget) and the model
manager meet on the generation's ModelMachine: a fault sends the serving generation to
Recovering, the reset ends its jobs (``reset``), and afterwards it is either Ready again or, if
it was being unloaded, its unload resumes. A reset or restart while a new generation is being
built kills that build (its configuration lived in the device's reset domain).
"""

from __future__ import annotations

import pytest

from calculet.adapters.calrt import JobKind
from calculet.adapters.sim import InjectedFault, FaultRule
from calculet.runtime.engine.types import EngineOptions
from calculet.runtime.models.reports import LoadFailed, LoadStep
from tests.integration.models.support import (
    ALIAS,
    Client,
    ModelsEnv,
    assert_counters_consistent,
    assert_isolated,
    make_rig,
    reference_tokens,
)


@pytest.mark.req("R12.10", "R11.6", "R18.11", "R15.17")
def test_a_job_fault_during_a_replacement_drain_is_recovered_and_the_switch_completes(env: ModelsEnv) -> None:
    """0.7.6 replacement: while generation 1 drains, one of its jobs never completes. Its Wait
    timeout sends generation 1 to Recovering; the restart (no verified reset on 0.7.6) ends the job
    and the request fails with the fault named; the unload resumes on the new device and the held
    requests complete on generation 2."""
    a, b = env.package("model-a"), env.package("model-b", seed=7)
    rig = make_rig(env.config(a), options=EngineOptions(job_timeout_s=0.5, monitor_mode=None))
    rig.runtime.device.inner.faults.add(FaultRule(InjectedFault.TIMEOUT, job_kind=JobKind.DECODE, nth=2))
    client = Client(rig)
    doomed = client.submit(8)
    rig.driver.advance(0.01)
    handle = rig.models.begin_load(ALIAS, b)
    held = [client.submit(6) for _ in range(2)]
    report = handle.result()
    rig.driver.run_until_idle()
    assert report.ok and report.previous_drained and report.generation == 2
    assert report.previous_unload is not None and report.previous_unload.state == "unloaded"
    outcome = client.outcome(doomed)
    assert outcome.state == "failed" and "TIMEOUT" in outcome.detail
    assert all(client.outcome(r).state == "completed" and client.generation_of(r) == 2
               and client.tokens(r) == reference_tokens(b) for r in held)
    assert rig.driver.statistics().recovery.restarts == 1 and len(rig.runtime.devices) == 2
    assert rig.device_stats().calbins == 1
    assert_counters_consistent(rig)
    assert_isolated(rig.provenance)
    rig.driver.stop()


@pytest.mark.req("R11.13", "R11.12")
def test_a_restart_before_the_switch_fails_the_load_and_the_old_generation_recovers(env: ModelsEnv) -> None:
    """Simulated co-residency: generation 2 is built and warmed beside a serving generation 1; while
    the switch waits for generation 1's request, that request's job hits an unknown DMA. The restart
    that recovers generation 1 also destroys generation 2's configuration (one reset domain), so the
    load fails at step 10; nothing of generation 2 is left, and generation 1 is Ready and serving
    again, the alias never having moved."""
    a, b = env.package("co-a", coresident=True), env.package("co-b", seed=7, coresident=True)
    rig = make_rig(env.config(a))
    client = Client(rig)
    hit = client.submit(12)
    rig.driver.advance(0.001)

    def arm(step: object, gen: int) -> None:
        if step is LoadStep.PUBLISH:
            rig.runtime.device.inner.faults.add(FaultRule(InjectedFault.DMA_UNKNOWN, job_kind=JobKind.DECODE, nth=1))

    rig.models.step_hook = arm
    with pytest.raises(LoadFailed) as failed:
        rig.models.load(ALIAS, b)
    rig.driver.run_until_idle()
    assert failed.value.step is LoadStep.PUBLISH and failed.value.report.state == "old_serving"
    assert "DMA_UNKNOWN" in client.outcome(hit).detail
    gens = {g.id: g for g in rig.models.status().generations}
    assert gens[1].state == "ready" and gens[1].published and gens[2].state == "unloaded"
    assert rig.device_stats().calbins == 1 and len(rig.runtime.devices) == 2
    after = client.submit(6)
    rig.driver.run_until_idle()
    assert client.generation_of(after) == 1 and client.tokens(after) == reference_tokens(a)
    assert_counters_consistent(rig)
    rig.driver.stop()


@pytest.mark.req("R11.12", "R11.13", "R15.17")
@pytest.mark.parametrize("coresident", [False, True], ids=["0.7.6", "coresident"])
def test_a_device_fault_in_a_golden_job_is_recovered_before_anything_serves_again(env: ModelsEnv,
                                                                                 coresident: bool) -> None:
    """A golden job (outside the executor) ends with an unknown DMA: the load fails at step 9, the
    fault is handed to the engine's recovery (restart), and only then is the old version back — the
    old generation itself (co-residency) or its restored package (0.7.6) — serving correct tokens."""
    a = env.package("co-a" if coresident else "model-a", coresident=coresident)
    b = env.package("co-b" if coresident else "model-b", seed=7, coresident=coresident)
    rig = make_rig(env.config(a))

    def arm(step: object, gen: int) -> None:
        if step is LoadStep.GOLDEN:
            rig.runtime.device.inner.faults.add(FaultRule(InjectedFault.DMA_UNKNOWN, job_kind=JobKind.DECODE, nth=1))

    rig.models.step_hook = arm
    with pytest.raises(LoadFailed) as failed:
        rig.models.load(ALIAS, b)
    assert failed.value.step is LoadStep.GOLDEN and "DmaUnknown" in str(failed.value)
    stats = rig.driver.statistics()
    assert stats.recovery.restarts == 1 and stats.recovery.faults == {"dma_unknown": 1}
    serving = 1 if coresident else 3
    assert failed.value.report.state == ("old_serving" if coresident else "restored")
    assert rig.models.status().current == serving and rig.device_stats().calbins == 1
    client = Client(rig)
    rid = client.submit(6)
    rig.driver.run_until_idle()
    assert client.generation_of(rid) == serving and client.tokens(rid) == reference_tokens(a)
    assert_counters_consistent(rig)
    rig.driver.stop()
