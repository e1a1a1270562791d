"""§10–§11, §13: loading model generations through the ModelManager on the simulated NPU.

Everything runs on an :class:`~calculet.runtime.engine.driver.EngineDriver` in virtual time, so drains,
deadlines and switches are exact. "Co-residency" and "configure is not device-global" exist only
as a *simulated* contract (CalRT 0.7.6 offers neither, §13.2); the default path is 0.7.6's.
"""

from __future__ import annotations

import dataclasses
import shutil
from pathlib import Path

import pytest

from calculet.packages import sign_package, verify_package
from calculet.adapters.sim import SimConfig
from calculet.adapters.sim.memory import BoardPreset
from calculet.errors import CapacityExhausted, ConfigError, NotFound, NotSupported, PackageError
from calculet.runtime.scheduling.admission import Decision
from calculet.clock import FakeClock
from calculet.runtime.engine.driver import EngineDriver
from calculet.runtime.models.reports import LoadFailed, LoadStep, ModelGeneration
from calculet.runtime.streams.writer import StreamWriter
from tests.integration.models.support import (
    ALIAS,
    Client,
    LifecycleRuntime,
    ModelsEnv,
    assert_isolated,
    make_rig,
    reference_tokens,
    request,
)


# ---------------------------------------------------------------------------------------------
# bring-up and a first look at the generation record
# ---------------------------------------------------------------------------------------------


@pytest.mark.req("R11.1", "R11.2", "R11.3", "R11.7", "R11.9", "R11.10", "R13.1.1", "R10.1", "R10.2", "R3.3")
def test_the_engine_starts_from_the_configured_signed_package_through_every_step(env: ModelsEnv) -> None:
    """The engine's first generation comes from ``models[model_alias]`` through all 11 steps: the
    bring-up report lists them, the device saw CreateCalbin → configure → KvManager → pools in that
    order, golden and warm-up passed before the alias was published, and the generation record has
    the §10 fields with an identity that cannot be changed."""
    pkg = env.package("model-a")
    rig = make_rig(env.config(pkg))
    report = rig.driver.core.bring_up
    assert report.ok and [t.step for t in report.steps] == [s.name.lower() for s in LoadStep]
    assert report.golden.startswith("passed (2 vectors)") and "warmup passed" in report.golden
    calls = [c for c in rig.runtime.calls if c in ("create_calbin", "configure", "create_kv_manager",
                                                   "allocate_job_buffers")]
    assert calls[:3] == ["create_calbin", "configure", "create_kv_manager"]
    assert set(calls[3:]) == {"allocate_job_buffers"}
    status = rig.models.status()
    assert status.alias == ALIAS and status.current == 1 and not status.rollback_available
    [gen] = status.generations
    assert isinstance(gen, ModelGeneration)
    assert (gen.state, gen.published, gen.active_requests, gen.inflight_jobs) == ("ready", True, 0, 0)
    assert gen.calbin_sha256 == verify_package(pkg, [env.root], env.keys).manifest_sha256
    assert "release-signer" in gen.signed_by and gen.runtime is rig.driver.core.session
    assert gen.as_dict()["state"] == "ready" and gen.as_dict()["active"] is True
    record = next(iter(rig.models.generations()))
    with pytest.raises(dataclasses.FrozenInstanceError):
        record.identity.calbin_sha256 = "0" * 64  # type: ignore[misc,union-attr]
    with pytest.raises(Exception, match="already fixed"):
        record.fix_identity(record.identity)  # type: ignore[arg-type]
    client = Client(rig)
    rid = client.submit()
    rig.driver.run_until_idle()
    assert client.tokens(rid) == reference_tokens(pkg)
    rig.driver.stop()


@pytest.mark.req("R15.19", "R17.1.6", "R11.3", "R15.18")
def test_profiles_one_and_eight_against_a_b1_only_manifest_fail_fast(env: ModelsEnv) -> None:
    """Fail-fast profile check (R15.19): ``batch.profiles: [1, 8]`` against a B1-only manifest
    aborts startup with a clear error before any device call. And at run time: an engine serving
    a B1/B4/B8/B16 package with ``[1, 8]`` refuses, at step 3 and with no device call, a
    replacement that compiles only B1 — the serving generation carries on."""
    current, future = env.package("model-a"), env.package("future-a", variant="future")
    config = env.config(current, batch={"profiles": [1, 8], "select_thresholds": {8: 2}})
    clock = FakeClock()
    runtime = LifecycleRuntime(SimConfig(clock=clock))
    with pytest.raises(ConfigError, match=r"profile 8 \(B8\) is not compiled"):
        EngineDriver(config, runtime, clock=clock)
    assert runtime.calls == [] and runtime.statistics().live_devices == 0
    rig = make_rig(env.config(future, batch={"profiles": [1, 8], "select_thresholds": {8: 2}}))
    mark = len(rig.runtime.calls)
    with pytest.raises(LoadFailed) as failed:
        rig.models.load(ALIAS, current)
    assert failed.value.step is LoadStep.VALIDATE and isinstance(failed.value.cause, ConfigError)
    assert "profile 8 (B8) is not compiled" in str(failed.value) and failed.value.http_status == 400
    assert rig.runtime.calls_since(mark) == [] and failed.value.report.state == "unloaded"
    assert rig.models.status().current == 1
    client = Client(rig)
    rid = client.submit()
    rig.driver.run_until_idle()
    assert client.outcome(rid).state == "completed" and client.generation_of(rid) == 1
    rig.driver.stop()


# ---------------------------------------------------------------------------------------------
# replacement on CalRT 0.7.6: drain first, no zero-downtime claim
# ---------------------------------------------------------------------------------------------


@pytest.mark.req("R11.5", "R11.6", "R11.14", "R13.1.2", "R10.3", "R10.4", "R19.16", "R12.4")
def test_a_replacement_on_0_7_6_drains_the_old_model_before_configuring_the_new_one(env: ModelsEnv) -> None:
    """Configure is device-global and co-residency impossible (the 0.7.6 contract): from step 5
    new requests are held (Queue, unbound); requests already pinned to generation 1 — running or
    queued — finish on it; it reaches zero active requests and in-flight jobs and is unloaded
    before CreateCalbin of generation 2; the held requests then run on generation 2. The gap is
    reported as downtime, never as zero downtime. Every token comes from its own generation
    (simulated evidence for R19.16)."""
    a, b = env.package("model-a"), env.package("model-b", seed=7)
    rig = make_rig(env.config(a, admission={"max_sequences": 2}))
    client = Client(rig)
    old = [client.submit(8) for _ in range(4)]  # 2 run, 2 queue on generation 1
    rig.driver.advance(0.003)
    seen: dict[str, tuple[int, int, int]] = {}

    def hook(step: object, gen: int) -> None:
        if step is LoadStep.CREATE:
            g1 = next(g for g in rig.models.generations() if g.id == 1)
            seen["create"] = (g1.machine.active_requests, g1.inflight(), len(rig.runtime.calls))

    rig.models.step_hook = hook
    handle = rig.models.begin_load(ALIAS, b)
    held = [client.submit(8) for _ in range(3)]
    registry = rig.driver.core.scheduler.registry
    assert all(registry.get(r).state == "waiting_model" and registry.get(r).generation == 0 for r in held)
    report = handle.result()
    rig.driver.run_until_idle()
    assert report.ok and report.replaced == 1 and report.previous_drained and not report.coresident
    assert report.downtime_s is not None and report.downtime_s > 0
    assert seen["create"][:2] == (0, 0)
    calls = rig.runtime.calls
    destroy_old = max(i for i, c in enumerate(calls[: seen["create"][2]]) if c == "destroy_calbin")
    assert calls.index("create_calbin", destroy_old) > destroy_old
    assert client.all_completed()
    assert {client.generation_of(r) for r in old} == {1} and {client.generation_of(r) for r in held} == {2}
    assert all(client.tokens(r) == reference_tokens(a, 8) for r in old)
    assert all(client.tokens(r) == reference_tokens(b, 8) for r in held)
    assert_isolated(rig.provenance)
    gens = {g.id: g for g in rig.models.status().generations}
    assert gens[1].state == "unloaded" and gens[2].state == "ready" and gens[2].published
    assert rig.device_stats().calbins == 1
    rig.driver.stop()


@pytest.mark.req("R10.3", "R10.4", "R11.10", "R11.13", "R19.16")
def test_with_a_coresidency_contract_the_old_generation_serves_until_the_switch(env: ModelsEnv) -> None:
    """Simulated co-residency (no real CalRT offers it): steps 7–9 build generation 2 beside a
    serving generation 1; a request created on generation 1 mid-decode keeps it for every job and
    completes on it; the alias switches only after generation 2 passed golden and warm-up, and
    generation 1 is unloaded after the switch."""
    a, b = env.package("co-a", coresident=True), env.package("co-b", seed=7, coresident=True)
    rig = make_rig(env.config(a))
    client = Client(rig)
    long = client.submit(40)
    rig.driver.advance(0.01)
    assert rig.driver.core.scheduler.registry.get(long).state in ("decode_ready", "decode_running")
    order: list[str] = []
    rig.models.step_hook = lambda step, gen: order.append(f"{step.name}:{gen}:{rig.models.status().current}")
    report = rig.models.load(ALIAS, b)
    rig.driver.run_until_idle()
    assert report.ok and report.coresident and not report.previous_drained and report.replaced == 1
    assert "CREATE:2:1" in order and "GOLDEN:2:1" in order and "PUBLISH:2:1" in order and "RETAIN:2:2" in order
    assert client.outcome(long).state == "completed" and client.generation_of(long) == 1
    assert client.tokens(long) == reference_tokens(a, 40)
    jobs_of_long = {j.generation for j in rig.runtime.jobs if j.generation == 1}
    assert jobs_of_long == {1}
    after = client.submit(6)
    rig.driver.run_until_idle()
    assert client.generation_of(after) == 2 and client.tokens(after) == reference_tokens(b)
    assert_isolated(rig.provenance)
    gens = {g.id: g.state for g in rig.models.status().generations}
    assert gens == {1: "unloaded", 2: "ready"} and rig.device_stats().calbins == 1
    rig.driver.stop()


# ---------------------------------------------------------------------------------------------
# rollback, statistics
# ---------------------------------------------------------------------------------------------


@pytest.mark.req("R11.11", "R19.17", "R16.6")
def test_rollback_restores_the_previous_signed_artifact_in_one_call(env: ModelsEnv) -> None:
    """Step 11 keeps the old signed package; it still verifies; ``rollback(alias)`` verifies it
    again, passes golden and publishes it (simulated evidence for R19.17). Statistics record the
    load/configure/warm-up/drain/unload durations (R16.6)."""
    a, b = env.package("model-a"), env.package("model-b", seed=7)
    rig = make_rig(env.config(a))
    rig.models.load(ALIAS, b)
    status = rig.models.status()
    assert status.rollback_available and status.previous_package == str(a)
    assert status.previous_sha256 == verify_package(a, [env.root], env.keys).manifest_sha256
    report = rig.models.rollback(ALIAS)
    assert report.ok and report.kind == "rollback" and report.generation == 3 and report.replaced == 2
    assert report.golden.startswith("passed") and report.calbin_sha256 == status.previous_sha256
    client = Client(rig)
    rid = client.submit()
    rig.driver.run_until_idle()
    assert client.tokens(rid) == reference_tokens(a) and client.generation_of(rid) == 3
    assert rig.models.status().previous_package == str(b)  # a second rollback goes back to b
    stats = rig.models.statistics()
    assert (stats.loads, stats.rollbacks, stats.replacements, stats.unloads) == (3, 1, 2, 2)
    for durations in (stats.load, stats.configure, stats.warmup):
        assert durations.count == 3
    assert stats.drain.count == stats.unload.count == 2 and stats.downtime.count == 2
    assert stats.generations_by_state == {"unloaded": 2, "ready": 1} and stats.current_generation == 3
    assert rig.driver.statistics().models == rig.models.statistics()
    rig.driver.stop()


def test_rollback_without_a_previous_artifact_is_a_clear_error(env: ModelsEnv) -> None:
    rig = make_rig(env.config(env.package("model-a")))
    with pytest.raises(NotFound, match="no previous artifact"):
        rig.models.rollback(ALIAS)
    with pytest.raises(NotFound, match="no model alias"):
        rig.models.unload("other")
    rig.driver.stop()


# ---------------------------------------------------------------------------------------------
# refused at load: tampering, trust, multi-model, capacity
# ---------------------------------------------------------------------------------------------


def _tamper_byte(pkg: Path) -> None:
    data = bytearray((pkg / "weights.bin").read_bytes())
    data[100] ^= 0x01
    (pkg / "weights.bin").write_bytes(bytes(data))


def _add_file(pkg: Path) -> None:
    (pkg / "extra.bin").write_bytes(b"not in the manifest")


@pytest.mark.req("R11.1", "R11.2", "R11.3")
@pytest.mark.parametrize("case", ["byte_changed", "file_added", "wrong_key", "outside_roots", "symlink_escape",
                                  "symlink_inside", "dotdot_escape"])
def test_every_tampering_case_is_refused_before_any_device_call(env: ModelsEnv, tmp_path: Path, case: str) -> None:
    """One byte changed, a file added, a package signed by an untrusted key, a path outside the
    trusted roots, a symlink that escapes them or sits inside the package, a ``..`` escape: each
    is refused at step 1 or 2 with nothing created on the device, and generation 1 keeps serving."""
    rig = make_rig(env.config(env.package("model-a")))
    good = env.package("model-b", seed=7)
    bad = env.root / f"bad-{case}"
    shutil.copytree(good, bad)
    if case == "byte_changed":
        _tamper_byte(bad)
        target, step = bad, LoadStep.VERIFY
    elif case == "file_added":
        _add_file(bad)
        target, step = bad, LoadStep.VERIFY
    elif case == "wrong_key":
        sign_package(bad, env.stranger.private_key_path)
        target, step = bad, LoadStep.VERIFY
    elif case == "outside_roots":
        target, step = shutil.copytree(good, tmp_path / "elsewhere"), LoadStep.RESOLVE
    elif case == "symlink_escape":
        outside = shutil.copytree(good, tmp_path / "outside-pkg")
        target = env.root / "link-out"
        target.symlink_to(outside, target_is_directory=True)
        step = LoadStep.RESOLVE
    elif case == "symlink_inside":
        (bad / "weights.bin").unlink()
        (bad / "weights.bin").symlink_to(good / "weights.bin")
        target, step = bad, LoadStep.RESOLVE
    else:
        target, step = env.root / ".." / "packages" / ".." / "elsewhere", LoadStep.RESOLVE
        shutil.copytree(good, tmp_path / "elsewhere")
    mark = len(rig.runtime.calls)
    with pytest.raises(LoadFailed) as failed:
        rig.models.load(ALIAS, target)
    assert failed.value.step is step, failed.value
    assert isinstance(failed.value.cause, PackageError) and failed.value.http_status == 400
    assert rig.runtime.calls_since(mark) == []
    assert rig.models.statistics().load_failures == {step.name.lower(): 1}
    client = Client(rig)
    rid = client.submit()
    rig.driver.run_until_idle()
    assert client.outcome(rid).state == "completed" and client.generation_of(rid) == 1
    rig.driver.stop()


@pytest.mark.req("R13.2.2", "R13.1.1", "R13.3.4")
def test_a_second_alias_beside_the_first_is_refused_without_a_multi_model_contract(env: ModelsEnv) -> None:
    """One alias per instance (§13.1 recommendation); a second co-resident model needs the vendor's
    multi-model contract (§13.2), which 0.7.6 lacks: refused at step 3, nothing on the device."""
    rig = make_rig(env.config(env.package("model-a")))
    mark = len(rig.runtime.calls)
    with pytest.raises(LoadFailed) as failed:
        rig.models.load("second-model", env.package("model-b", seed=7))
    assert failed.value.step is LoadStep.VALIDATE and isinstance(failed.value.cause, NotSupported)
    assert "§13.2" in str(failed.value) and rig.runtime.calls_since(mark) == []
    assert rig.device_stats().calbins == 1 and rig.models.status().current == 1
    rig.driver.stop()


@pytest.mark.req("R13.1.5", "R11.4")
def test_the_capacity_plan_refuses_a_second_large_model_before_step_5(env: ModelsEnv) -> None:
    """The reference model (16.938 GiB parameters, 3.750 GiB BF16 KV, 28.150 GiB reserved) on the
    reference board: with a (simulated) co-residency contract both would have to fit, and the plan
    refuses before the lifecycle lock, with the figures; without co-residency (0.7.6) the old one is
    drained first, so the plan passes and the replacement works."""
    board = BoardPreset.reference()
    a = env.package("ref-a", memory="reference", coresident=True)
    b = env.package("ref-b", memory="reference", coresident=True, seed=7)
    rig = make_rig(env.config(a), board=board)
    busy: list[bool] = []
    rig.models.step_hook = lambda step, gen: busy.append(rig.models.lifecycle_busy())
    mark = len(rig.runtime.calls)
    with pytest.raises(LoadFailed) as failed:
        rig.models.load(ALIAS, b)
    assert failed.value.step is LoadStep.PLAN and isinstance(failed.value.cause, CapacityExhausted)
    message = str(failed.value)
    assert "28.150 GiB" in message and "16.938 GiB" in message and "3.750 GiB" in message
    assert "second large model" in message and busy == [False] * 4
    assert rig.runtime.calls_since(mark) == [] and rig.models.status().current == 1
    rig.driver.stop()

    plain_a, plain_b = env.package("ref-plain-a", memory="reference"), env.package("ref-plain-b", memory="reference",
                                                                                    seed=7)
    rig = make_rig(env.config(plain_a), board=board)
    report = rig.models.load(ALIAS, plain_b)
    assert report.ok and report.previous_drained and rig.device_stats().calbins == 1
    rig.driver.stop()


def test_a_replacement_must_keep_the_engine_contract(env: ModelsEnv) -> None:
    """A package with another context length cannot replace the serving one in a running engine."""
    from calculet.adapters.sim.model import TinyConfig
    from calculet.adapters.sim.build import build_package

    rig = make_rig(env.config(env.package("model-a")))
    other = env.root / "short-context"
    build_package(other, variant="current", name="short", config=TinyConfig(max_seq=128))
    sign_package(other, env.signer.private_key_path)
    with pytest.raises(LoadFailed, match="max_seq: serving 256, package 128") as failed:
        rig.models.load(ALIAS, other)
    assert failed.value.step is LoadStep.VALIDATE
    rig.driver.stop()


@pytest.mark.req("R12.2", "R5.2.5")
def test_held_requests_are_bounded_and_end_with_503_when_nothing_can_serve(env: ModelsEnv) -> None:
    """A failed replacement whose previous version cannot be restored leaves the alias without a
    model: the held requests end 503 and new ones are answered 503 (never left waiting)."""
    a, b = env.package("model-a"), env.package("model-b", seed=7)
    rig = make_rig(env.config(a))
    rig.runtime.hooks.arm("create_calbin", 1)  # the new generation's CreateCalbin fails ...
    rig.runtime.hooks.arm("configure", 1)  # ... and so does the restore's configure
    client = Client(rig)
    running = client.submit()  # pinned to generation 1: the drain of step 6 waits for it
    handle = rig.models.begin_load(ALIAS, b)
    held = client.submit()
    with pytest.raises(LoadFailed) as failed:
        handle.result()
    assert client.outcome(running).state == "completed" and client.generation_of(running) == 1
    assert failed.value.report.state == "restore_failed" and failed.value.http_status == 502
    assert client.outcome(held).http_status == 503 and "could not be restored" in client.outcome(held).detail
    late = StreamWriter()
    assert rig.driver.submit(request(), late).outcome.decision is Decision.REJECT_UNAVAILABLE
    assert rig.device_stats().calbins == 0 and rig.device_stats().memory.used_bytes == 0
    rig.driver.stop()
