"""A failure at every step of a load (§11) and of an unload (§12), on the simulated NPU.

Each test injects exactly one failure — through the manager's step hook (the step raises as it
starts) or through the device (a lifecycle call fails, the calbin reports other tensors, a
golden vector does not reproduce) — and then checks the two promises of §11: everything the
failed generation created is destroyed (device counters back to their baseline), and the model
keeps serving: the old generation itself where it is still resident, or, on the 0.7.6 contract
where it had to be drained first, its package restored as a new generation (reported, with the
downtime). Requests pinned to the old generation finish on it; requests held during the switch
run afterwards; every completed request has exactly its model's tokens.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from calculet.runtime.models.reports import LoadFailed, LoadStep, UnloadStep
from tests.integration.models.support import (
    ALIAS,
    Client,
    ModelsEnv,
    Rig,
    assert_isolated,
    make_rig,
    mismatched_tensors,
    reference_tokens,
)

NEW = 2  # the generation id of the package being loaded


def _raise_at(target: LoadStep | UnloadStep, generation: int) -> Any:
    def hook(step: LoadStep | UnloadStep, gen: int) -> None:
        if step is target and gen == generation:
            raise RuntimeError(f"injected failure at {step!r}")
    return hook


def _baseline(rig: Rig) -> tuple[int, int, int, int]:
    stats = rig.device_stats()
    return stats.calbins, stats.kv_managers, stats.buffers, stats.memory.used_bytes


def _serve_and_check(rig: Rig, client: Client, package: Path, *, generation: int) -> None:
    """A fresh request completes on ``generation`` with ``package``'s tokens; nothing leaked."""
    rid = client.submit()
    rig.driver.run_until_idle()
    assert client.outcome(rid).state == "completed", client.outcome(rid)
    assert client.generation_of(rid) == generation and client.tokens(rid) == reference_tokens(package)
    assert rig.driver.core.scheduler.idle() and rig.driver.core.executor.inflight() == 0


def _start(env: ModelsEnv, *, coresident: bool = False) -> tuple[Rig, Client, Path, Path, list[int]]:
    a = env.package("co-a" if coresident else "model-a", coresident=coresident)
    b = env.package("co-b" if coresident else "model-b", seed=7, coresident=coresident)
    rig = make_rig(env.config(a))
    client = Client(rig)
    pinned = [client.submit(6) for _ in range(3)]
    rig.driver.advance(0.002)
    return rig, client, a, b, pinned


# ---------------------------------------------------------------------------------------------
# §11, on the 0.7.6 contract (the old generation is drained before step 7)
# ---------------------------------------------------------------------------------------------


@pytest.mark.req("R11.1", "R11.2", "R11.3", "R11.4", "R11.5", "R11.6", "R11.12", "R11.13", "R11.14", "R10.4")
@pytest.mark.parametrize("step", list(LoadStep), ids=lambda s: f"{int(s)}-{s.name.lower()}")
def test_a_failure_at_each_load_step_leaves_the_model_serving(env: ModelsEnv, step: LoadStep) -> None:
    """Steps 1–6 fail before anything of the old generation is touched: it keeps serving, alias
    unchanged. Steps 7–10 fail after it was drained (0.7.6 cannot co-reside): the new generation
    is cleaned up and the old package is restored as a new generation; the report says so and
    gives the downtime. Step 11 comes after the switch: the new generation keeps serving and the
    report says rollback is unavailable (the spec orders retention after publication)."""
    rig, client, a, b, pinned = _start(env)
    baseline = _baseline(rig)
    rig.models.step_hook = _raise_at(step, NEW)
    held: list[int] = []
    if step <= LoadStep.PLAN:
        with pytest.raises(LoadFailed) as failed:
            rig.models.begin_load(ALIAS, b)
        error: LoadFailed | None = failed.value
    else:
        handle = rig.models.begin_load(ALIAS, b)
        held = [client.submit(6) for _ in range(2)]
        try:
            report = handle.result()
            error = None
        except LoadFailed as exc:
            error = exc
    rig.driver.run_until_idle()
    assert client.all_completed(), {r: client.outcome(r) for r in client.streams}
    assert all(client.generation_of(r) == 1 and client.tokens(r) == reference_tokens(a) for r in pinned)
    status = rig.models.status()
    if step is LoadStep.RETAIN:
        assert error is None and report.ok and report.warnings and not report.rollback_available
        assert report.warnings[0].startswith("step 11") and "rollback unavailable" in report.warnings[1]
        assert status.current == NEW and not status.rollback_available
        assert all(client.generation_of(r) == NEW and client.tokens(r) == reference_tokens(b) for r in held)
        _serve_and_check(rig, client, b, generation=NEW)
    elif step <= LoadStep.DRAIN_OLD:
        assert error is not None and error.step is step and error.report.restored_generation is None
        assert status.current == 1 and _baseline(rig) == baseline
        assert all(client.generation_of(r) == 1 and client.tokens(r) == reference_tokens(a) for r in held)
        _serve_and_check(rig, client, a, generation=1)
    else:
        assert error is not None and error.step is step
        restored = error.report.restored_generation
        assert restored == NEW + 1 and error.report.state == "restored" and error.report.previous_drained
        assert error.report.downtime_s is not None and error.report.downtime_s >= 0
        assert "restored as generation 3" in str(error)
        assert status.current == restored and _baseline(rig) == baseline
        assert all(client.generation_of(r) == restored and client.tokens(r) == reference_tokens(a) for r in held)
        _serve_and_check(rig, client, a, generation=restored)
    gens = {g.id: g for g in status.generations}
    if step is not LoadStep.RETAIN:
        assert gens[NEW].state == "unloaded" and not gens[NEW].published and gens[NEW].detail.startswith(
            f"step {int(step)}")
        assert rig.models.statistics().load_failures == {step.name.lower(): 1}
    assert_isolated(rig.provenance)
    rig.driver.stop()


@pytest.mark.req("R11.7", "R11.8", "R11.9", "R11.12", "R11.14")
@pytest.mark.parametrize("fault", ["create_calbin", "configure", "create_kv_manager", "allocate_job_buffers",
                                   "inspect_mismatch", "golden_mismatch"])
def test_a_device_failure_in_steps_7_to_9_is_cleaned_up_and_the_old_version_restored(env: ModelsEnv,
                                                                                     fault: str) -> None:
    """Real faults rather than hooks: each sub-call of step 7 failing on the device, a calbin whose
    reported tensors differ from its manifest (step 8), and a package whose golden vector does not
    reproduce (step 9). Every resource of the failed generation is destroyed (counters back to
    the baseline of one resident model) and the previous version serves again."""
    rig, client, a, b, pinned = _start(env)
    baseline = _baseline(rig)
    hooks = rig.runtime.hooks
    expected_step = {"inspect_mismatch": LoadStep.INSPECT, "golden_mismatch": LoadStep.GOLDEN}.get(fault,
                                                                                                 LoadStep.CREATE)
    if fault == "inspect_mismatch":
        armed = [True]

        def mutate(calbin: Any) -> None:
            if armed and calbin.name == "model-b":
                armed.clear()
                mismatched_tensors(calbin)
        hooks.mutate_calbin = mutate
    elif fault == "golden_mismatch":
        b = env.package("model-b-bad-golden", seed=7, golden_tamper=True)
    else:
        hooks.arm(fault, 1)
    with pytest.raises(LoadFailed) as failed:
        rig.models.load(ALIAS, b)
    rig.driver.run_until_idle()
    assert failed.value.step is expected_step, failed.value
    if fault == "inspect_mismatch":
        assert "does not match the verified manifest" in str(failed.value) and "logits" in str(failed.value)
    if fault == "golden_mismatch":
        assert "golden check failed" in str(failed.value)
    assert failed.value.report.restored_generation == NEW + 1
    assert _baseline(rig) == baseline and rig.models.status().current == NEW + 1
    assert all(client.generation_of(r) == 1 and client.tokens(r) == reference_tokens(a) for r in pinned)
    _serve_and_check(rig, client, a, generation=NEW + 1)
    rig.driver.stop()


# ---------------------------------------------------------------------------------------------
# §11 with a (simulated) co-residency contract: the old generation never stops
# ---------------------------------------------------------------------------------------------


@pytest.mark.req("R11.12", "R11.13", "R10.4")
@pytest.mark.parametrize("fault", ["create_calbin", "configure", "create_kv_manager", "allocate_job_buffers",
                                   "inspect", "golden", "publish"])
def test_with_coresidency_a_failure_at_steps_7_to_10_leaves_the_old_generation_ready(env: ModelsEnv,
                                                                                    fault: str) -> None:
    """Co-residency possible (simulated contract): a failure at any of steps 7–10 (each sub-call
    of step 7 included) destroys everything the new generation created — calbin, configuration,
    KvManager, pools, buffers — with device counters back to the baseline, and leaves generation 1
    Ready and serving with the alias unchanged; no restore is needed."""
    rig, client, a, b, pinned = _start(env, coresident=True)
    baseline = _baseline(rig)
    if fault in ("inspect", "golden", "publish"):
        rig.models.step_hook = _raise_at({"inspect": LoadStep.INSPECT, "golden": LoadStep.GOLDEN,
                                          "publish": LoadStep.PUBLISH}[fault], NEW)
    else:
        rig.runtime.hooks.arm(fault, 1)
    handle = rig.models.begin_load(ALIAS, b)
    held = client.submit(6)
    with pytest.raises(LoadFailed) as failed:
        handle.result()
    rig.driver.run_until_idle()
    report = failed.value.report
    assert report.coresident is (fault == "publish") or not report.previous_drained
    assert report.restored_generation is None and report.state == "old_serving"
    status = rig.models.status()
    gens = {g.id: g for g in status.generations}
    assert status.current == 1 and gens[1].state == "ready" and gens[NEW].state == "unloaded"
    assert _baseline(rig) == baseline
    assert client.all_completed()
    assert all(client.generation_of(r) == 1 and client.tokens(r) == reference_tokens(a) for r in [*pinned, held])
    _serve_and_check(rig, client, a, generation=1)
    rig.driver.stop()


# ---------------------------------------------------------------------------------------------
# §12 steps failing: inside a replacement (0.7.6) and in a plain unload
# ---------------------------------------------------------------------------------------------


@pytest.mark.req("R11.6", "R11.13", "R11.14", "R12.8", "R12.10", "R12.11")
@pytest.mark.parametrize("step", list(UnloadStep), ids=lambda s: f"{int(s)}-{s.name.lower()}")
def test_a_failure_at_each_unload_step_of_a_replacement_keeps_the_model_serving(env: ModelsEnv,
                                                                               step: UnloadStep) -> None:
    """The old generation's unload (step 6 on 0.7.6) fails at one §12 step. Before the drain began
    (step 1) nothing changed and it serves on. Later, what was pinned to it still ends exactly once
    (completed on it, or cancelled if the drain itself failed — never freed under a running job),
    the cleanup escalates to a device restart if anything was left, the load is abandoned and the
    old package is restored: held requests complete on it with its tokens."""
    rig, client, a, b, pinned = _start(env)
    rig.models.step_hook = _raise_at(step, 1)
    handle = rig.models.begin_load(ALIAS, b)
    held = [client.submit(6) for _ in range(2)]
    with pytest.raises(LoadFailed) as failed:
        handle.result()
    rig.driver.run_until_idle()
    report = failed.value.report
    assert failed.value.step is LoadStep.DRAIN_OLD
    for rid in pinned:
        outcome = client.outcome(rid)
        assert outcome.state in ("completed", "cancelled"), outcome
        if outcome.state == "completed":
            assert client.tokens(rid) == reference_tokens(a) and client.generation_of(rid) == 1
    if step is UnloadStep.DRAIN:
        assert report.state == "old_serving" and rig.models.status().current == 1
        serving = 1
    else:
        assert report.state == "restored" and report.restored_generation == NEW + 1
        serving = NEW + 1
        restarted = step in (UnloadStep.FREE_KV, UnloadStep.DESTROY, UnloadStep.VERIFY)
        assert rig.models.statistics().escalations == int(restarted)
        assert len(rig.runtime.devices) == 1 + int(restarted), "a restart only where the device was left unclean"
    assert all(client.outcome(r).state == "completed" and client.generation_of(r) == serving
               and client.tokens(r) == reference_tokens(a) for r in held)
    stats = rig.device_stats()
    assert stats.calbins == 1 and stats.inflight == 0 and stats.buffers_bound == 0
    _serve_and_check(rig, client, a, generation=serving)
    assert_isolated(rig.provenance)
    rig.driver.stop()


@pytest.mark.req("R12.8", "R12.9", "R12.11")
@pytest.mark.parametrize("step", list(UnloadStep), ids=lambda s: f"{int(s)}-{s.name.lower()}")
def test_a_failure_at_each_step_of_a_plain_unload_still_ends_on_a_clean_device(env: ModelsEnv,
                                                                              step: UnloadStep) -> None:
    """A plain ``unload``: a failure at step 1 leaves the generation Ready and serving; at any later
    step the unload still ends Unloaded on a verified clean device (a restart if cleanup was
    incomplete), reports the problem, and the next load serves normally."""
    a = env.package("model-a")
    rig = make_rig(env.config(a))
    client = Client(rig)
    client.submit(6)
    rig.driver.advance(0.002)
    rig.models.step_hook = _raise_at(step, 1)
    if step is UnloadStep.DRAIN:
        with pytest.raises(RuntimeError, match="injected"):
            rig.models.unload(ALIAS)
        assert rig.models.status().current == 1
        _serve_and_check(rig, client, a, generation=1)
        rig.driver.stop()
        return
    report = rig.models.unload(ALIAS)
    rig.driver.run_until_idle()
    assert report.state == "unloaded" and report.problems and f"step {int(step)}" in report.problems[0]
    stats = rig.device_stats()
    assert (stats.calbins, stats.kv_managers, stats.buffers, stats.memory.used_bytes) == (0, 0, 0, 0)
    assert client.all_completed() or all(client.outcome(r).state in ("completed", "cancelled")
                                         for r in client.streams)
    rig.models.step_hook = None
    assert rig.models.load(ALIAS, a).ok
    _serve_and_check(rig, client, a, generation=2)
    rig.driver.stop()
