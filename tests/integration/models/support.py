"""Shared helpers of the model-lifecycle tests (§10–§13): signed packages, a device that records
and fails lifecycle calls, drivers built from configuration, and token-provenance checks.

* :class:`ModelsEnv` — a trusted root and key directory with signed simulated packages built on
  demand (different seeds give different weights, so different tokens: a request that ever saw
  the other model's output would show it). Variants: the reference memory figures (§13.1) and a
  *simulated* co-residency contract (``model_coresidency`` on, ``configure_device_global`` off),
  which no real CalRT offers — it exists so the "old generation keeps serving" path is tested.
* :class:`LifecycleRuntime` — the simulated NPU, observed (:mod:`calculet.adapters.observed`): a log
  of every lifecycle call (CreateCalbin, configure, CreateKvManager, AllocateBuffers, FreeBuffers,
  DestroyKvManager, DestroyCalbin, ResetConfiguration) and hooks to fail the nth call of any of
  them, to report a calbin whose tensors differ from its manifest (§11 step 8), or to report
  leftover device memory (§12 verify).
* :class:`Client` — submits requests, keeps their streams, and checks every delivered token's
  :class:`~calculet.runtime.engine.types.TokenProvenance` (R19.16, simulated).

The tests at the bottom check the helpers themselves.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import os
import shutil
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from calculet.adapters.calrt import BatchProfile, Calbin, MemInfo, ReturnCode, error_for
from calculet.adapters.observed import LIFECYCLE_CALLS, DeviceObserver, ObservedCalRT
from calculet.packages.manifest import CalbinManifest
from calculet.packages import KeyPair, generate_keypair, sign_package, verify_package
from calculet.adapters.sim import CostModel, SimCalRT, SimConfig
from calculet.adapters.sim.build import build_package
from calculet.adapters.sim.memory import BoardPreset
from calculet.adapters.sim.model import TinyConfig
from calculet.config import SchedulerConfig
from calculet.clock import FakeClock
from calculet.runtime.engine.driver import EngineDriver
from calculet.runtime.engine.types import EngineOptions, GenerateRequest, TokenProvenance
from calculet.runtime.request import RequestOutcome
from calculet.runtime.execution.sampler import SamplingParams
from calculet.runtime.streams.writer import StreamWriter
from tests.unit.runtime.runtime_support import make_config

ALIAS = "qwen3"
PROMPT = (256, *b"generation isolation")


# ---------------------------------------------------------------------------------------------
# signed packages
# ---------------------------------------------------------------------------------------------


@dataclass
class ModelsEnv:
    """A trusted root, a trusted key and the signed packages built under it."""

    base: Path
    root: Path
    keys: Path
    signer: KeyPair
    stranger: KeyPair
    built: dict[str, Path] = field(default_factory=dict)

    @classmethod
    def create(cls, base: Path) -> ModelsEnv:
        root, keys = base / "packages", base / "keys"
        root.mkdir(parents=True)
        signer = generate_keypair(keys, "release-signer")
        stranger = generate_keypair(base / "other-keys", "stranger")
        return cls(base, root, keys, signer, stranger)

    def package(self, name: str, *, seed: int | None = None, memory: str = "tiny", coresident: bool = False,
                variant: str = "current", golden_tamper: bool = False, key: KeyPair | None = None) -> Path:
        """A signed package ``root/name`` (built once). ``seed`` changes the weights (and tokens)."""
        if name in self.built:
            return self.built[name]
        path = self.root / name
        build_package(path, variant=variant, memory=memory, name=name,  # type: ignore[arg-type]
                      config=TinyConfig(seed=seed) if seed is not None else None)
        if coresident or golden_tamper:
            data = json.loads((path / "manifest.json").read_bytes())
            if coresident:
                data["capabilities"]["model_coresidency"] = {"value": True, "source": "simulated"}
                data["capabilities"]["configure_device_global"] = {"value": False, "source": "simulated"}
            if golden_tamper:
                golden = data["golden"][0]
                golden["expected_tokens"] = [(t + 1) % 256 for t in golden["expected_tokens"]]
            (path / "manifest.json").write_bytes(CalbinManifest.parse(data).to_json_bytes())
        sign_package(path, (key or self.signer).private_key_path)
        self.built[name] = path
        return path

    def config(self, package: Path | None = None, **sections: Any) -> SchedulerConfig:
        models = [{"alias": ALIAS, "package": str(package)}] if package is not None else []
        trust = {"trusted_roots": [str(self.root)], "trusted_keys_dir": str(self.keys)}
        return make_config(models=models, trust=trust, **sections)

    def verifies(self, package: Path) -> bool:
        verify_package(package, [self.root], self.keys)
        return True


# ---------------------------------------------------------------------------------------------
# a device that records and fails lifecycle calls
# ---------------------------------------------------------------------------------------------


@dataclass
class LifecycleHooks:
    fail: dict[str, int] = field(default_factory=dict)
    """method name → fail its nth call from now (1 = the next one), with rc INTERNAL."""
    counts: dict[str, int] = field(default_factory=dict)
    mutate_calbin: Callable[[Any], None] | None = None
    """Called on each created calbin: a test may make it report other tensors (§11 step 8)."""
    extra_used_bytes: int = 0
    """Added to ReadMem's used bytes: a leak the unload's verify step must catch (§12)."""

    def arm(self, method: str, nth: int = 1) -> None:
        self.counts[method] = 0
        self.fail[method] = nth


class LifecycleFaults(DeviceObserver):
    """Fails the armed lifecycle calls and alters what the device reports, as the hooks say."""

    def __init__(self, hooks: LifecycleHooks) -> None:
        self.hooks = hooks

    def calling(self, call: str) -> None:
        hooks = self.hooks
        if call in LIFECYCLE_CALLS and call in hooks.fail:
            hooks.counts[call] = hooks.counts.get(call, 0) + 1
            if hooks.counts[call] == hooks.fail[call]:
                del hooks.fail[call]
                raise error_for(ReturnCode.INTERNAL, f"injected: {call} failed")

    def calbin_created(self, calbin: Calbin) -> None:
        if self.hooks.mutate_calbin is not None:
            self.hooks.mutate_calbin(calbin)

    def memory_read(self, chip: int, info: MemInfo) -> MemInfo:
        extra = self.hooks.extra_used_bytes if chip == 0 else 0
        return dataclasses.replace(info, used_bytes=info.used_bytes + extra, free_bytes=info.free_bytes - extra)


class LifecycleRuntime(ObservedCalRT):
    """The simulated CalRT, observed (lifecycle call log, job log), whose devices fail lifecycle calls
    as the hooks say; a restart gets an observed device too."""

    def __init__(self, config: SimConfig) -> None:
        self.hooks = LifecycleHooks()
        super().__init__(SimCalRT(config), [LifecycleFaults(self.hooks)])

    def calls_since(self, mark: int) -> list[str]:
        return self.calls[mark:]


def mismatched_tensors(calbin: Any) -> None:
    """Make a created calbin report a B1 logits tensor of another shape than its manifest's."""
    profiles: list[BatchProfile] = []
    for p in calbin.profiles:
        tensors = tuple(dataclasses.replace(t, shape=(t.shape[0], t.shape[1] + 1)) if t.name == "logits" else t
                        for t in p.tensors)
        profiles.append(dataclasses.replace(p, tensors=tensors))
    calbin._profiles = tuple(profiles)  # the device reports something else than it was given (simulated)



# ---------------------------------------------------------------------------------------------
# drivers and clients
# ---------------------------------------------------------------------------------------------


@dataclass
class Rig:
    driver: EngineDriver
    runtime: LifecycleRuntime
    clock: FakeClock
    provenance: list[TokenProvenance]

    @property
    def models(self) -> Any:
        return self.driver.models

    def device_stats(self) -> Any:
        return self.runtime.device.inner.statistics()


def make_rig(config: SchedulerConfig, *, numerics: bool = True, options: EngineOptions | None = None,
             cost: CostModel | None = None, board: BoardPreset | None = None, package: Path | None = None) -> Rig:
    """An EngineDriver whose first generation comes from ``config`` (all 11 steps) unless ``package``."""
    clock = FakeClock()
    sim = SimConfig(clock=clock, numerics=numerics, cost=cost or CostModel.tiny(), board=board or BoardPreset.tiny())
    runtime = LifecycleRuntime(sim)
    provenance: list[TokenProvenance] = []
    options = options or EngineOptions(verify_golden=numerics, monitor_mode=None)
    driver = EngineDriver(config, runtime, package, clock=clock, options=options, provenance=provenance.append)
    return Rig(driver, runtime, clock, provenance)


def request(n: int = 6, prompt: Sequence[int] = PROMPT, **kwargs: Any) -> GenerateRequest:
    return GenerateRequest(tuple(prompt), n, sampling=SamplingParams(ignore_eos=True), **kwargs)


class Client:
    """Submits requests to a driver and keeps their streams."""

    def __init__(self, rig: Rig) -> None:
        self.rig = rig
        self.streams: dict[int, StreamWriter] = {}
        self.rejected: list[RequestOutcome] = []

    def submit(self, n: int = 6, **kwargs: Any) -> int:
        stream = StreamWriter()
        submission = self.rig.driver.submit(request(n, **kwargs), stream)
        if submission.outcome.rejected:
            self.rejected.append(stream.result(0).outcome)
            return 0
        self.streams[submission.request_id] = stream
        return submission.request_id

    def outcome(self, rid: int) -> RequestOutcome:
        return self.streams[rid].result(0).outcome

    def tokens(self, rid: int) -> tuple[int, ...]:
        return self.streams[rid].result(0).raw_tokens

    def generation_of(self, rid: int) -> int:
        gens = {p.request_generation for p in self.rig.provenance if p.request_id == rid}
        assert len(gens) == 1, (rid, gens)
        return gens.pop()

    def all_completed(self) -> bool:
        return all(s.closed and s.result(0).outcome.state == "completed" for s in self.streams.values())


def assert_isolated(provenance: Sequence[TokenProvenance]) -> None:
    """Every delivered token came from its request's own generation (job, result and calbin)."""
    bad = [p for p in provenance if not p.isolated]
    assert not bad, bad[:5]


def assert_counters_consistent(rig: Rig) -> None:
    """Each ModelMachine's counter equals what the engine holds: its pinned live requests; and the jobs the
    generations count on the device (the jobs table's, ``Generation.inflight``) are, in total, the jobs the
    executor tracks — the declared drain guard counts the real thing."""
    core = rig.driver.core
    live = [r for r in core.scheduler.registry.live() if r.generation]
    gens = list(rig.models.generations())
    for gen in gens:
        assert gen.machine.active_requests == sum(1 for r in live if r.generation == gen.id), gen.machine
    assert sum(g.inflight() for g in gens) == core.executor.inflight()


@functools.lru_cache(maxsize=None)
def _reference_tokens(package: str, n: int) -> tuple[int, ...]:
    rig = make_rig(make_config(), package=Path(package))
    stream = StreamWriter()
    rig.driver.submit(request(n), stream)
    rig.driver.run_until_idle()
    tokens = stream.result(0).raw_tokens
    rig.driver.stop()
    return tokens


def reference_tokens(package: Path, n: int = 6) -> tuple[int, ...]:
    """The tokens ``request(n)`` produces alone on ``package`` (numerics on)."""
    return _reference_tokens(str(package), n)


def open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


def thread_count() -> int:
    return threading.active_count()


def clean_copy(src: Path, dst: Path) -> Path:
    shutil.copytree(src, dst)
    return dst


# ---------------------------------------------------------------------------------------------
# the helpers' own checks
# ---------------------------------------------------------------------------------------------


def test_packages_with_other_seeds_give_other_tokens(env: ModelsEnv) -> None:
    a, b = env.package("a"), env.package("b", seed=7)
    assert env.verifies(a) and env.verifies(b)
    assert reference_tokens(a) != reference_tokens(b)


def test_lifecycle_device_logs_and_fails_calls(env: ModelsEnv) -> None:
    rig = make_rig(env.config(env.package("a")))
    assert rig.runtime.calls[:4] == ["create_calbin", "configure", "create_kv_manager", "allocate_job_buffers"]
    rig.runtime.hooks.arm("configure")
    with pytest.raises(Exception, match="injected: configure failed"):
        rig.runtime.device.configure(None)
    rig.driver.stop()
