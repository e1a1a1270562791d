"""§12 unload through the ModelManager, in virtual time on the simulated NPU.

Ready → Draining (new requests 503, queued ones cancelled at once), wait for active requests and
in-flight jobs until ``executor.drain_deadline_ms``, cancel what is left (submitted jobs still
drain; at the deadline a job still on the device sends the generation to Recovering with every
buffer kept), free sequences and pools, destroy the KvManager and the calbin, ResetConfiguration
only where the contract verifies it, verify the device → Unloaded. Hardware R-ids (R12.12) are
out of scope; the contract flags are the simulated package's.
"""

from __future__ import annotations

import pytest

from calculet.adapters.calrt import JobKind
from calculet.adapters.sim import InjectedFault, FaultRule
from calculet.runtime.scheduling.admission import Decision
from calculet.runtime.engine.types import EngineOptions
from calculet.runtime.models.reports import UnloadFailed, UnloadStep
from calculet.runtime.streams.writer import StreamWriter
from tests.integration.models.support import (
    ALIAS,
    Client,
    ModelsEnv,
    make_rig,
    reference_tokens,
    request,
)


@pytest.mark.req("R12.1", "R12.2", "R12.3", "R12.4", "R12.5", "R12.6", "R12.7", "R12.9", "R16.6", "R5.2.5")
def test_unload_drains_cancels_the_queue_frees_in_order_and_returns_to_baseline(env: ModelsEnv) -> None:
    """After ``unload`` the generation is Draining: a new request gets 503, queued requests end
    Cancelled at once, the running ones finish with their tokens; as soon as nothing is pinned
    and nothing is in flight the unload frees sequences and pools, then the KvManager and the
    calbin (never ResetConfiguration: the current contract does not verify it), verifies the
    device and ends Unloaded with every counter at the pre-load baseline."""
    a = env.package("model-a")
    rig = make_rig(env.config(a, admission={"max_sequences": 2}))
    client = Client(rig)
    running = [client.submit(10) for _ in range(2)]
    queued = [client.submit(10) for _ in range(2)]
    rig.driver.advance(0.002)
    at_steps: dict[UnloadStep, tuple[str, int, int, int]] = {}

    def hook(step: object, gen: int) -> None:
        if isinstance(step, UnloadStep):
            g = next(x for x in rig.models.generations() if x.id == gen)
            session = rig.driver.core.session if g.session is None else g.session
            at_steps[step] = (g.state, session.statistics().live_sequences, session.statistics().buffer_pairs,
                              rig.driver.core.kv.free_lanes)

    rig.models.step_hook = hook
    mark = len(rig.runtime.calls)
    handle = rig.models.begin_unload(ALIAS)
    assert rig.models.status().generations[0].state == "draining"
    assert all(client.outcome(r).state == "cancelled" for r in queued)
    late = StreamWriter()
    submission = rig.driver.submit(request(), late)
    assert submission.outcome.decision is Decision.REJECT_UNAVAILABLE and late.result(0).outcome.http_status == 503
    report = handle.result()
    assert report.state == "unloaded" and not report.deadline_passed and not report.went_recovering
    assert report.problems == () and report.escalation == "" and not report.reset_configuration
    assert all(client.outcome(r).state == "completed" and client.tokens(r) == reference_tokens(a, 10)
               for r in running)
    assert at_steps[UnloadStep.DRAIN][0] == "ready" and at_steps[UnloadStep.FREE_KV][0] == "unloading"
    assert at_steps[UnloadStep.FREE_KV][3] == 2, "no KV lane is held once drained"
    assert at_steps[UnloadStep.DESTROY][1:3] == (0, 0), "sequences freed and pools destroyed first (R12.5)"
    calls = rig.runtime.calls_since(mark)
    assert calls == ["free_job_buffers"] * 2 + ["destroy_kv_manager", "destroy_calbin"], calls
    stats = rig.device_stats()
    assert (stats.calbins, stats.kv_managers, stats.buffers, stats.memory.used_bytes, stats.resets) == (0, 0, 0, 0, 0)
    assert rig.driver.core.scheduler.idle()
    status = rig.models.status()
    assert status.current is None and status.generations[0].state == "unloaded"
    durations = status.generations[0].durations_s
    assert {"load", "configure", "warmup", "drain", "unload"} <= set(durations)
    stats_m = rig.models.statistics()
    assert stats_m.unloads == 1 and stats_m.drain.count == 1 and stats_m.current_generation == 0
    waiting = Client(rig)
    rid = waiting.submit()
    assert rig.driver.core.scheduler.registry.get(rid).state == "waiting_model", "routed to the next load"
    rig.models.load(ALIAS, a)
    rig.driver.run_until_idle()
    assert waiting.outcome(rid).state == "completed" and waiting.generation_of(rid) == 2
    rig.driver.stop()


@pytest.mark.req("R12.7", "R12.6")
def test_reset_configuration_runs_once_after_the_calbin_only_where_the_contract_verifies_it(env: ModelsEnv) -> None:
    """The "future" simulated contract verifies ResetConfiguration: the unload calls it exactly
    once, after buffers, KvManager and calbin are destroyed."""
    future = env.package("future-a", variant="future")
    rig = make_rig(env.config(future, batch={"profiles": [1, 4], "select_thresholds": {4: 2}}))
    mark = len(rig.runtime.calls)
    report = rig.models.unload(ALIAS)
    calls = rig.runtime.calls_since(mark)
    assert report.reset_configuration and calls.count("reset_configuration") == 1
    assert calls[-2:] == ["destroy_calbin", "reset_configuration"]
    assert rig.device_stats().memory.used_bytes == 0
    rig.driver.stop()


@pytest.mark.req("R12.8")
def test_leftover_device_memory_stops_the_unload_before_unloaded(env: ModelsEnv) -> None:
    """A memory check that reports leftover memory: the unload escalates to a device restart and
    verifies again; while the leak is still reported it never says Unloaded (UnloadFailed, the
    generation stays in Unloading); once the device reports clean, an unload attempt completes."""
    a = env.package("model-a")
    rig = make_rig(env.config(a))

    def leak(step: object, gen: int) -> None:
        if step is UnloadStep.DESTROY:
            rig.runtime.hooks.extra_used_bytes = 4096  # what the calbin's destruction failed to give back

    rig.models.step_hook = leak
    with pytest.raises(UnloadFailed, match="not clean even after a restart"):
        rig.models.unload(ALIAS)
    gen = rig.models.status().generations[0]
    assert gen.state == "unloading" and "4096" in gen.detail
    assert rig.models.statistics().escalations == 1
    rig.runtime.hooks.extra_used_bytes = 0
    rig.models.step_hook = None
    report = rig.models.load(ALIAS, a)
    assert report.ok and rig.models.status().current == 2
    rig.driver.stop()


@pytest.mark.req("R12.10", "R12.11", "R12.3")
def test_at_the_drain_deadline_a_job_still_submitted_keeps_its_buffers_and_the_generation_recovers(
        env: ModelsEnv) -> None:
    """Fake clock plus a device that never completes one decode job: at the drain deadline the
    request is only flagged (a forced unload is not a cancellation: it stays running, its job's
    buffers stay bound, nothing is freed) and the generation is Recovering, not Unloaded. The job's
    Wait timeout then triggers the contract's recovery (a restart on 0.7.6), which ends the job;
    only then does the unload free and verify, ending Unloaded."""
    a = env.package("model-a")
    rig = make_rig(env.config(a, executor={"drain_deadline_ms": 200}),
                   options=EngineOptions(job_timeout_s=2.0, monitor_mode=None))
    rig.runtime.device.inner.faults.add(FaultRule(InjectedFault.TIMEOUT, job_kind=JobKind.DECODE, nth=2))
    client = Client(rig)
    stuck = client.submit(8)
    rig.driver.advance(0.05)
    mark = len(rig.runtime.calls)
    handle = rig.models.begin_unload(ALIAS)
    rig.driver.run_until(rig.clock.now() + 0.3)
    gen = rig.models.status().generations[0]
    assert gen.state == "recovering" and gen.inflight_jobs == 1
    rec = rig.driver.core.scheduler.registry.get(stuck)
    assert rec.state == "decode_running" and rec.machine.cancel_requested
    device = rig.device_stats()
    assert device.buffers_bound == 2 and device.inflight == 1
    assert rig.runtime.calls_since(mark) == [], "nothing freed while the job may still write (R12.11)"
    report = handle.result()
    assert report.state == "unloaded" and report.deadline_passed and report.went_recovering
    assert report.cancelled_requests == 1
    assert client.outcome(stuck).state in ("failed", "cancelled")
    stats = rig.driver.statistics()
    assert stats.recovery.restarts == 1 and len(rig.runtime.devices) == 2
    assert rig.device_stats().memory.used_bytes == 0 and rig.device_stats().buffers == 0
    rig.driver.stop()


@pytest.mark.req("R12.3")
def test_unload_goes_on_as_soon_as_both_counters_are_zero(env: ModelsEnv) -> None:
    """No waiting for the deadline when the generation drains early (fake clock)."""
    a = env.package("model-a")
    rig = make_rig(env.config(a, executor={"drain_deadline_ms": 600_000}))
    client = Client(rig)
    client.submit(4)
    start = rig.clock.now()
    report = rig.models.unload(ALIAS)
    assert report.drain_s < 1.0 and rig.clock.now() - start < 1.0 and not report.deadline_passed
    rig.driver.stop()


def test_the_manager_answers_the_active_operations_deadline_for_the_actors_wake_up(env: ModelsEnv) -> None:
    """Issue #20 (ModelManager.next_deadline reads the lifecycle lock's active operation without its frame): None
    with no operation; during a drain, the drain's deadline (what the actor's next wake-up must include), the
    lock's own answer; None again once the unload ended."""
    a = env.package("model-a")
    rig = make_rig(env.config(a, executor={"drain_deadline_ms": 200}),
                   options=EngineOptions(job_timeout_s=2.0, monitor_mode=None))
    rig.runtime.device.inner.faults.add(FaultRule(InjectedFault.TIMEOUT, job_kind=JobKind.DECODE, nth=2))
    Client(rig).submit(8)
    rig.driver.advance(0.05)
    models = rig.models
    assert models.next_deadline() is None and models._lock.next_deadline() is None
    handle = models.begin_unload(ALIAS)
    rig.driver.advance(0.01)
    deadline = models.next_deadline()
    assert deadline is not None and deadline == models._lock.next_deadline()
    assert rig.clock.now() < deadline <= rig.clock.now() + 0.2
    handle.result()
    assert models.next_deadline() is None
    rig.driver.stop()
