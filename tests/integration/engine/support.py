"""Shared helpers for the engine tests: a recording CalRT runtime, drivers and reference tokens.

The runtime is the simulated NPU observed (:class:`~calculet.adapters.observed.ObservedCalRT`: a
log of every job it accepted — kind, engine, lanes, the device's in-flight count at submit) plus
hooks to inject any CalRT return code at submit or into a result — what the sim's fault kinds do
not cover (R19.2). A restart creates a new observed device, so the hooks survive recovery. The two tests at the bottom check the
helpers themselves.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import pytest

from calculet.adapters.calrt import JobResult, JobSpec, JobTicket, ReturnCode, error_for
from calculet.adapters.observed import DeviceObserver, ObservedCalRT
from calculet.adapters.sim import InjectedFault, SimCalRT, SimConfig, package_dir
from calculet.config import SchedulerConfig
from calculet.clock import FakeClock
from calculet.runtime.engine.driver import EngineDriver
from calculet.runtime.engine.types import EngineOptions, GenerateRequest
from calculet.runtime.execution.sampler import SamplingParams
from calculet.runtime.streams.writer import StreamWriter
from tests.unit.runtime.runtime_support import make_config


@dataclass
class Hooks:
    """Injection points shared by every device a runtime creates."""

    submit_errors: dict[int, ReturnCode] = field(default_factory=dict)
    """nth submit (1-based, counted across devices) → refuse it with this return code."""
    result_rc: dict[int, ReturnCode] = field(default_factory=dict)
    """nth accepted job → its result carries this return code."""
    reset_fails: int = 0
    """ResetConfiguration calls that fail (rc INTERNAL) before one succeeds."""
    before_recovery: Callable[[], None] | None = None
    """Called when the device is about to be reset, or a replacement device created (restart)."""
    submits: int = 0
    accepted: int = 0


class HookInjection(DeviceObserver):
    """Plays the hooks into every device of a runtime, and sets up each new device's faults: random
    faults reseeded per device (so a restart does not replay the same fault sequence) and the
    fault rules for the 1st, 2nd, ... device created (a restart gets the next set)."""

    def __init__(self, hooks: Hooks, rates: Mapping[InjectedFault, float], seed: int,
                 device_rules: Sequence[Sequence[Any]]) -> None:
        self.hooks = hooks
        self.rates = dict(rates)
        self.seed = seed
        self.device_rules = [tuple(rules) for rules in device_rules]
        self.created = 0
        self.nth: dict[int, int] = {}
        """Device job id → its accepted-job number (the current device's jobs)."""

    def calling(self, call: str) -> None:
        hooks = self.hooks
        if call == "create_virtual_device" and self.created and hooks.before_recovery is not None:
            hooks.before_recovery()
        elif call == "submit":
            hooks.submits += 1
            rc = hooks.submit_errors.get(hooks.submits)
            if rc is not None:
                raise error_for(rc, f"injected {rc.name} at submit {hooks.submits}")
        elif call == "reset_configuration":
            if hooks.before_recovery is not None:
                hooks.before_recovery()
            if hooks.reset_fails > 0:
                hooks.reset_fails -= 1
                raise error_for(ReturnCode.INTERNAL, "injected: ResetConfiguration failed")

    def device_created(self, device: Any, index: int) -> None:
        self.created += 1
        self.nth.clear()
        if self.rates:
            device.faults.set_random(self.seed + index, self.rates)
        for rule in self.device_rules[index] if index < len(self.device_rules) else ():
            device.faults.add(rule)

    def submitted(self, job: JobSpec, ticket: JobTicket) -> None:
        self.hooks.accepted += 1
        self.nth[int(ticket.job_id)] = self.hooks.accepted

    def delivering(self, result: JobResult) -> JobResult:
        nth = self.nth.pop(int(result.job_id), None)
        rc = self.hooks.result_rc.get(nth) if nth is not None else None
        if rc is not None:
            result = result._replace(rc=rc, message=f"injected {rc.name} into job {nth}")
        return result


class RecordingRuntime(ObservedCalRT):
    """The simulated CalRT, observed (:mod:`calculet.adapters.observed`: a job log across devices),
    with the injection hooks."""

    def __init__(self, config: SimConfig, *, fault_rates: Mapping[InjectedFault, float] | None = None,
                 fault_seed: int = 0, device_rules: Sequence[Sequence[Any]] = ()) -> None:
        self.hooks = Hooks()
        super().__init__(SimCalRT(config), [HookInjection(self.hooks, fault_rates or {}, fault_seed, device_rules)])

    def max_overlap(self) -> int:
        return self.observation.statistics().max_overlap


def engine_config(*, profiles: Sequence[int] = (1,), inflight: int = 1, **sections: Any) -> SchedulerConfig:
    """A config for the simulated packages: every requested profile > 1 is selected from 1 ready."""
    batch = dict(sections.pop("batch", {}))
    batch.setdefault("profiles", list(profiles))
    batch.setdefault("select_thresholds", {b: 1 for b in profiles if b > 1} or {4: 3, 8: 6, 16: 12})
    executor = dict(sections.pop("executor", {}))
    executor.setdefault("max_inflight", inflight)
    return make_config(batch=batch, executor=executor, **sections)


def make_driver(variant: str = "current", *, config: SchedulerConfig | None = None, numerics: bool = True,
                options: EngineOptions | None = None, fault_rates: Mapping[InjectedFault, float] | None = None,
                fault_seed: int = 0, observer: Callable[..., None] | None = None,
                **config_kwargs: Any) -> tuple[EngineDriver, RecordingRuntime]:
    clock = FakeClock()
    runtime = RecordingRuntime(SimConfig(clock=clock, numerics=numerics), fault_rates=fault_rates,
                               fault_seed=fault_seed)
    if options is None:
        options = EngineOptions(verify_golden=numerics, monitor_mode=None)
    driver = EngineDriver(config or engine_config(**config_kwargs), runtime, package_dir(variant),  # type: ignore[arg-type]
                          clock=clock, options=options, observer=observer)
    runtime.jobs.clear()  # the golden check's jobs are bring-up, not the workload
    runtime.hooks.submits = runtime.hooks.accepted = 0
    return driver, runtime


PROMPTS: tuple[tuple[int, ...], ...] = tuple(
    (256, *text) for text in (b"Calculet NPU", b"hello, world", b"batch", b"KV lanes and ping/pong", b"x",
                              b"the quick brown fox jumps over the lazy dog", b"0123456789", b"abc",
                              b"seventeen tokens!", b"mixed lengths in one batch of lanes", b"zz", b"Q",
                              b"generation recovery", b"lane 13", b"lane fourteen", b"last lane"))


def prompt(i: int) -> tuple[int, ...]:
    return PROMPTS[i % len(PROMPTS)]


def request(i: int, new: int = 6, *, seed: int | None = None, temperature: float = 0.0, **kwargs: Any
            ) -> GenerateRequest:
    params = SamplingParams(temperature=temperature, top_k=20 if temperature else 0, seed=seed, ignore_eos=True)
    return GenerateRequest(prompt(i), new, sampling=params, **kwargs)


@functools.lru_cache(maxsize=None)
def reference(i: int, new: int = 6, seed: int | None = None, temperature: float = 0.0) -> tuple[int, ...]:
    """Tokens of request ``i`` run alone on B1 (the current product), computed once."""
    driver, _ = make_driver("current")
    stream = StreamWriter()
    driver.submit(request(i, new, seed=seed, temperature=temperature), stream)
    driver.run_until_idle()
    result = stream.result(0)
    assert result.outcome.state == "completed", result.outcome
    driver.stop()
    return result.raw_tokens


def submit_all(driver: EngineDriver, requests: Sequence[GenerateRequest]) -> list[StreamWriter]:
    streams = []
    for req in requests:
        stream = StreamWriter(tokenizer=driver.tokenizer, stop=req.sampling.stop)
        submission = driver.submit(req, stream)
        assert not submission.outcome.rejected, submission
        streams.append(stream)
    return streams


def assert_clean(driver: EngineDriver) -> None:
    """Pools and queues back at their starting counts, nothing left on the device (§12 baseline)."""
    core = driver.core
    assert core.scheduler.idle(), core.scheduler.statistics()
    assert core.executor.inflight() == 0 and core.executor.statistics().sequences_bound == 0
    assert core.session.statistics().live_sequences == 0
    device = core.session.device.statistics()
    assert device.inflight == 0 and device.buffers_bound == 0
    stats = driver.statistics()
    assert stats.sampler.active == 0 and stats.live_requests == 0 and stats.pending_frees == 0


# ---------------------------------------------------------------------------------------------
# the helpers' own checks
# ---------------------------------------------------------------------------------------------


def test_reference_tokens_match_the_golden_vectors() -> None:
    """The reference path is itself checked against the manifest's golden vectors (§11 step 9)."""
    driver, _ = make_driver("current")
    golden = driver.core.session.calbin.golden
    driver.stop()
    for i, vector in enumerate(golden[:2]):
        assert tuple(vector.prompt) == prompt(i)
        assert reference(i, len(vector.expected_tokens)) == tuple(vector.expected_tokens)


def test_recording_runtime_logs_jobs_and_injects_return_codes() -> None:
    driver, runtime = make_driver("current", numerics=False)
    runtime.hooks.result_rc[2] = ReturnCode.INTERNAL
    stream = StreamWriter()
    driver.submit(request(0, 3), stream)
    driver.run_until_idle()
    assert [j.kind for j in runtime.jobs] == ["prefill", "decode"]
    assert runtime.jobs[1].rc == "INTERNAL" and "INTERNAL" in stream.result(0).outcome.detail
    assert_clean(driver)
    with pytest.raises(AssertionError):
        assert runtime.max_overlap() > 1
