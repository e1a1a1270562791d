"""Test doubles and a small harness for the scheduling core (fake clock, hand-built results)."""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable

from calculet.config import SchedulerConfig, parse_config
from calculet.runtime.scheduling.admission import ModelAvailability
from calculet.clock import FakeClock
from calculet.runtime.scheduling.completion import DecodeCompletion, FaultKind, LaneOutcome, PrefillCompletion
from calculet.runtime.scheduling.decode import DecodeBatch
from calculet.runtime.scheduling.kv import KvCapabilities, KvLaneManager
from calculet.runtime.scheduling.prefill import PrefillWork
from calculet.runtime.scheduling.profiles import LaneFill, ProfileSet, ProfileSpec
from calculet.runtime.request import InferenceRequest, RequestOutcome
from calculet.runtime.scheduling.plan import Plan, SchedulingCapabilities, Submission
from calculet.runtime.scheduling.scheduler import Scheduler

FILL_TOKEN = 7


class CountingSink:
    """A sink that counts: tokens in order, closes, and any token after a close (thread-safe)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.tokens: list[int] = []
        self.outcomes: list[RequestOutcome] = []
        self.late_tokens = 0

    def token(self, request_id: int, token: int) -> None:
        with self._lock:
            if self.outcomes:
                self.late_tokens += 1
            self.tokens.append(token)

    def close(self, outcome: RequestOutcome) -> None:
        with self._lock:
            self.outcomes.append(outcome)

    @property
    def closes(self) -> int:
        return len(self.outcomes)

    @property
    def outcome(self) -> RequestOutcome:
        assert len(self.outcomes) == 1, self.outcomes
        return self.outcomes[0]


def make_config(**sections: Any) -> SchedulerConfig:
    return parse_config({"schema": "calculet-scheduler/v1", **sections})


def profile(size: int, *, max_seq: int = 8192, mask: bool = True, fill: int | None = FILL_TOKEN,
            chunk: int | None = None) -> ProfileSpec:
    policy = LaneFill(fill) if fill is not None else None
    return ProfileSpec(size, max_seq, policy, mask if size > 1 else False, f"sim-b{size}", chunk)


def profile_set(sizes: Iterable[int], config: SchedulerConfig | None = None, *, max_seq: int = 8192,
                chunk: int | None = None, multi: bool | None = None) -> ProfileSet:
    sizes = sorted(sizes)
    thresholds = (config or make_config()).batch.select_thresholds
    return ProfileSet([profile(b, max_seq=max_seq, chunk=chunk) for b in sizes], requested=sizes,
                      thresholds=thresholds, multi_profile_residency=len(sizes) > 1 if multi is None else multi)


def default_token(request_id: int, position: int) -> int:
    """The 'model': the token a lane produces depends only on (request, position)."""
    return (request_id * 7919 + position * 31) % 30000 + 1


@dataclass
class Harness:
    """A Scheduler on a FakeClock with helpers that play the device by hand."""

    scheduler: Scheduler
    clock: FakeClock
    kv: KvLaneManager
    sinks: dict[int, CountingSink] = field(default_factory=dict)
    confirmed: list[tuple[int, int]] = field(default_factory=list)

    @classmethod
    def build(cls, *, sizes: Iterable[int] = (1,), lanes: int = 16, max_seq: int = 8192, kv_tokens: int = 10**7,
              config: SchedulerConfig | None = None, kv_caps: KvCapabilities = KvCapabilities(),
              caps: SchedulingCapabilities = SchedulingCapabilities(), chunk: int | None = None,
              ready: bool = True, step_estimate_s: float = 0.0, observer: Any = None, step_observer: Any = None,
              **sections: Any) -> Harness:
        sizes = sorted(sizes)
        if config is None:
            batch = dict(sections.pop("batch", {}))
            batch.setdefault("profiles", sizes)
            admission = dict(sections.pop("admission", {}))
            admission.setdefault("max_sequences", lanes)
            # the decisions here are checked to the step; the on_time admission margin (which starts
            # at 0.2 and follows outcomes) has tests of its own that set it explicitly
            admission.setdefault("initial_margin", 0.0)
            config = make_config(batch=batch, admission=admission, **sections)
        clock = FakeClock()
        kv = KvLaneManager(lanes, max_seq, capabilities=kv_caps, clock=clock)
        scheduler = Scheduler(config, clock=clock, kv=kv, device_kv_tokens=kv_tokens, max_seq=max_seq,
                              capabilities=caps, step_estimate_s=step_estimate_s, observer=observer,
                              step_observer=step_observer)
        if ready:
            scheduler.set_model(1, ModelAvailability.READY,
                                profile_set(sizes, config, max_seq=max_seq, chunk=chunk))
        return cls(scheduler, clock, kv)

    # ------------------------------------------------------------------ requests

    def submit(self, prompt: int = 16, new: int = 4, tenant: str = "default",
               deadline_ms: int | None = None) -> Submission:
        sink = CountingSink()
        sub = self.scheduler.submit(InferenceRequest(prompt, new, tenant, deadline_ms), sink)
        self.sinks[sub.request_id] = sink
        return sub

    def rec(self, request_id: int) -> Any:
        return self.scheduler.registry.get(request_id)

    def state(self, request_id: int) -> str:
        rec = self.rec(request_id)
        if rec is not None:
            return rec.state  # type: ignore[no-any-return]
        outcome = self.scheduler.registry.outcome(request_id)
        assert outcome is not None
        return outcome.state

    # ------------------------------------------------------------------ the device, by hand

    def step(self) -> Plan:
        return self.scheduler.step()

    def complete(self, work: PrefillWork | DecodeBatch, *, ok: bool = True,
                 token: Callable[[int, int], int | None] = default_token, stop: Iterable[int] = (),
                 fault: FaultKind = FaultKind.NONE) -> Any:
        stops = set(stop)
        s = self.scheduler
        if isinstance(work, PrefillWork):
            position = work.start_position + work.tokens
            return s.on_prefill_complete(PrefillCompletion(
                work.job_id, work.generation, work.request_id, work.seq_id, ok,
                token(work.request_id, position) if ok else None, work.request_id in stops, fault))
        lanes = tuple(LaneOutcome(b.lane, b.request_id, b.seq_id, b.generation, ok,
                                  token(b.request_id, b.position + 1) if ok else None, b.request_id in stops)
                      for b in work.active)
        return s.on_decode_complete(DecodeCompletion(work.job_id, work.generation, ok, lanes, fault))

    def run(self, plan: Plan, **kwargs: Any) -> Any:
        assert plan.work is not None, plan.reason
        self.scheduler.submitted(plan.work.job_id)
        return self.complete(plan.work, **kwargs)

    def confirm_all(self) -> int:
        commands = self.scheduler.take_commands()
        for command in commands:
            self.scheduler.confirm_release(command.lane, command.seq_id)
            self.confirmed.append((command.lane, command.seq_id))
        return len(commands)

    def play(self, op: str, tenant: str, prompt: int, new: int, pick: int) -> Any:
        """One operation of the differential admission tests (two schedulers driven alike must answer alike): a
        submit's result, the name of the work a step planned and ran (None if none), a cancel's result on the
        ``pick``-th live request, or how many releases were confirmed."""
        if op == "submit":
            return self.submit(prompt, new, tenant)
        if op == "step":
            plan = self.step()
            if plan.work is None:
                return None
            self.run(plan)
            return type(plan.work).__name__
        if op == "cancel":
            live = sorted(r.request_id for r in self.scheduler.registry.live())
            return self.scheduler.cancel(live[pick % len(live)]).result if live else None
        return self.confirm_all()

    def prefill_all(self, limit: int = 10_000) -> int:
        """Run every queued prefill to completion; decode batches planned meanwhile are refused."""
        done = 0
        for _ in range(limit):
            if not self.scheduler.prefill.nonempty():
                return done
            plan = self.step()
            if plan.work is None:
                return done
            if isinstance(plan.work, DecodeBatch):
                self.scheduler.submit_failed(plan.work.job_id)
                continue
            self.run(plan)
            self.confirm_all()
            done += 1
        raise AssertionError("prefill_all did not converge")

    def drive(self, limit: int = 100_000) -> list[Plan]:
        """Step and complete every job (all succeed) until nothing is left to do."""
        plans = []
        for _ in range(limit):
            plan = self.step()
            if plan.work is None:
                if self.confirm_all() == 0:
                    return plans
                continue
            plans.append(plan)
            self.run(plan)
            self.confirm_all()
        raise AssertionError("drive did not converge")

    def next_decode(self) -> DecodeBatch:
        plan = self.step()
        assert isinstance(plan.work, DecodeBatch), plan
        return plan.work


def expression_calls(run: Callable[[], Any]) -> tuple[Any, list[str]]:
    """``run()``'s result and the functions of ``calculet.logic.expr`` it called: a check meant to run generated
    code must call none of the expression helpers (issue #20)."""
    import sys

    import calculet.logic.expr as expr

    walked: list[str] = []

    def hook(frame: Any, event: str, _arg: Any) -> None:
        if event == "call" and frame.f_code.co_filename == expr.__file__:
            walked.append(frame.f_code.co_name)

    sys.setprofile(hook)
    try:
        result = run()
    finally:
        sys.setprofile(None)
    return result, walked
