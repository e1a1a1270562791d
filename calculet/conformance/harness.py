"""The device under test and the kit's probes: fresh sessions, B1 references, findings.

Why: every check must reach the device through the CalRT protocol alone (a vendor board offers
nothing else), start from a clean device, and compare what it sees with a reference the same
device computed the simplest way — one sequence on the B1 profile — so a check needs no
knowledge of the model (§18 "golden equivalence between profiles"). Each check opens its own
:class:`Session` (create device → CreateCalbin → configure → KvManager, §11 step 7) and closes the
device at the end, so one failure cannot leak into the next check.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from calculet.adapters.calrt import (
    Calbin,
    CalRT,
    GoldenVector,
    JobResult,
    KvManager,
    KvSeqId,
    LaneResult,
    VirtualDevice,
)
from calculet.adapters.calrt.evidence import CheckOutcome, Finding
from calculet.adapters.devices import DevicePlugin, FaultHooks
from calculet.adapters.host_driver import HostDriver
from calculet.clock import FakeClock

DEFAULT_ATOL = 1e-6


class NotRun(Exception):
    """A check cannot run on this device or package (e.g. no B>1 profile, no fault hooks)."""


@dataclass
class Probe:
    """What one check saw: evidence lines, findings, or why it could not run."""

    id: str
    title: str
    ref: str
    evidence: list[str] = field(default_factory=list)
    findings: list[Finding] = field(default_factory=list)
    skipped: str | None = None

    def note(self, text: str) -> None:
        self.evidence.append(text)

    def fail(self, code: str, detail: str) -> None:
        self.findings.append(Finding(code, self.id, detail))

    def expect(self, ok: bool, code: str, detail: str) -> bool:
        """Record a finding unless ``ok``; returns ``ok`` so a check can stop at the first failure."""
        if not ok:
            self.fail(code, detail)
        return ok

    def outcome(self) -> CheckOutcome:
        if self.skipped is not None:
            return CheckOutcome(self.id, self.title, self.ref, "not_run", (self.skipped,))
        status = "fail" if self.findings else "pass"
        return CheckOutcome(self.id, self.title, self.ref, status, tuple(self.evidence), tuple(self.findings))


@dataclass
class Session:
    """One freshly created device with the package configured and its KvManager."""

    device: VirtualDevice
    calbin: Calbin
    kv: KvManager
    driver: HostDriver
    hooks: FaultHooks | None
    profiles: tuple[int, ...]

    def hooks_or_skip(self) -> FaultHooks:
        if self.hooks is None:
            raise NotRun("the device offers no fault hooks (FaultHooks): fault behaviour cannot be observed")
        return self.hooks

    def prefilled(self, prompt: Sequence[int]) -> tuple[KvSeqId, JobResult]:
        seq = self.kv.allocate_sequence()
        return seq, self.driver.prefill(seq, prompt)

    def reconfigure(self) -> None:
        """After ResetConfiguration: configure the same profiles again and open a new KvManager."""
        self.device.configure(self.calbin, self.profiles)
        self.kv = self.device.create_kv_manager(self.calbin)
        self.driver = HostDriver(self.device, self.calbin, self.kv, timeout_s=self.driver.timeout_s)


def next_token(lane: LaneResult) -> int:
    """The greedy token of a lane (its logits' argmax, or the device's own when it returns none)."""
    if lane.logits is not None:
        return int(np.argmax(lane.logits))
    assert lane.greedy_token is not None, "a valid OK lane carries logits or a greedy token"
    return lane.greedy_token


def same_output(lane: LaneResult, reference: LaneResult, atol: float) -> bool:
    """The lane's output equals the reference's (logits within ``atol``; tokens without logits)."""
    if lane.logits is not None and reference.logits is not None:
        return bool(np.allclose(lane.logits, reference.logits, rtol=0.0, atol=atol))
    return lane.greedy_token == reference.greedy_token


@dataclass
class Bench:
    """The device under test: a plug-in, its runtime, the package, and cached B1 references."""

    plugin: DevicePlugin
    runtime: CalRT
    package: Path
    clock: FakeClock | None = None
    timeout_s: float = 30.0
    golden: tuple[GoldenVector, ...] = ()
    """The package's golden vectors (read once at the start): prompts every check derives from."""
    atol: float = DEFAULT_ATOL
    configured: tuple[int, ...] = (1,)
    """The profiles each session configures (:meth:`profiles_for`)."""
    _references: dict[tuple[int, ...], list[LaneResult]] = field(default_factory=dict, repr=False)
    facts: dict[str, object] = field(default_factory=dict)

    def profiles_for(self, calbin: Calbin) -> tuple[int, ...]:
        """Every profile when they may be resident together, else B1 only (§8)."""
        batches = tuple(p.compiled_batch for p in calbin.profiles)
        return batches if calbin.capabilities.multi_profile_residency.value else (1,)

    @contextlib.contextmanager
    def session(self) -> Iterator[Session]:
        device = self.runtime.create_virtual_device()
        try:
            calbin = device.create_calbin(self.package)
            profiles = self.profiles_for(calbin)
            device.configure(calbin, profiles)
            kv = device.create_kv_manager(calbin)
            driver = HostDriver(device, calbin, kv, timeout_s=self.timeout_s)
            yield Session(device, calbin, kv, driver, self.plugin.fault_hooks(device), profiles)
        finally:
            device.close()

    def read_package(self, calbin: Calbin) -> None:
        """Keep what every check needs from the package: golden vectors and their tolerance."""
        self.golden = tuple(calbin.golden)
        self.configured = self.profiles_for(calbin)
        self.atol = max((g.atol for g in calbin.golden), default=DEFAULT_ATOL)

    def references(self, n: int, steps: int) -> tuple[list[tuple[int, ...]], list[list[LaneResult]]]:
        """``n`` prompts and their B1 references (computed before a check opens its session)."""
        prompts = self.prompts(n)
        return prompts, [self.reference(p, steps) for p in prompts]

    def prompts(self, n: int) -> list[tuple[int, ...]]:
        """``n`` distinct in-vocabulary prompts of mixed lengths, cut from the package's golden prompts."""
        if not self.golden:
            raise NotRun("the package carries no golden vectors to derive prompts from")
        bases = [tuple(g.prompt) for g in self.golden]
        out: list[tuple[int, ...]] = []
        cut = 0
        while len(out) < n:
            for base in bases:
                length = max(2, len(base) - cut)
                candidate = base[:length] if cut < len(base) - 1 else base[: 2 + (cut % 3)] + (base[-1],) * cut
                if candidate not in out:
                    out.append(candidate)
                if len(out) == n:
                    break
            cut += 1
        return out

    def reference(self, prompt: Sequence[int], steps: int) -> list[LaneResult]:
        """Lane results of ``prompt`` alone on B1: the prefill, then ``steps`` greedy decode steps.

        It opens its own session, so call it before a check opens one (one device per process, §3)."""
        key = (steps, *prompt)
        if key not in self._references:
            with self.session() as s:
                seq, first = s.prefilled(prompt)
                if not first.ok:
                    raise RuntimeError(f"reference prefill failed: rc {first.rc.name} {first.message}")
                lanes = [first.lanes[0]]
                for _ in range(steps):
                    res = s.driver.decode(1, [(seq, next_token(lanes[-1]))])
                    if not res.ok:
                        raise RuntimeError(f"reference decode failed: rc {res.rc.name} {res.message}")
                    lanes.append(res.lanes[0])
            self._references[key] = lanes
        return self._references[key]
