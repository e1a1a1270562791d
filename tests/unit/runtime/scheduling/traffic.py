"""Random traffic for the differential tests of the scheduler's kept answers (issue #20): the same calls played on
two schedulers, one keeping an answer and one asking again, must show the caller the same things."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from calculet.runtime.scheduling.decode import DecodeBatch
from tests.unit.runtime.runtime_support import Harness


def plan_row(plan: Any) -> tuple[Any, ...]:
    """What a plan shows the engine: its work (kind, job, profile, requests), wake-up and engine."""
    work = plan.work
    if work is None:
        return ("none", plan.wake_at, plan.reason)
    if isinstance(work, DecodeBatch):
        return ("DecodeBatch", work.job_id, work.profile.compiled_batch, tuple(b.request_id for b in work.active),
                plan.wake_at, plan.engine)
    return (type(work).__name__, work.job_id, 1, (work.request_id,), plan.wake_at, plan.engine)


def play(h: Harness, ops: list[tuple[str, int]], tenants: str,
         after_call: Callable[[], None] = lambda: None, before_step: Callable[[], None] = lambda: None) -> list[Any]:
    """``ops`` on ``h`` (submit, cancel, tick, step, fail, confirm, each with a number that picks its details),
    then the clock moved on and the scheduler driven dry. Returns every answer, plan, applied result, each
    request's outcome and tokens, and the statistics; ``after_call`` runs after every call (a promise to hold),
    ``before_step`` before each step."""
    seen: list[Any] = []
    ids: list[int] = []
    for op, n in ops:
        if op == "submit":
            sub = h.submit(prompt=(4, 12, 30)[n % 3], new=1 + n % 7, tenant=tenants[n // 3 % len(tenants)],
                           deadline_ms=(None, 3, 40, 400)[n // 7 % 4])
            seen.append(("submit", sub.request_id, sub.outcome))
            if sub.request_id:
                ids.append(sub.request_id)
        elif op == "cancel" and ids:
            seen.append(("cancel", h.scheduler.cancel(ids[n % len(ids)])))
        elif op == "tick":
            h.clock.advance((0.0, 0.001, 0.004, 0.05)[n % 4])
        elif op in ("step", "fail"):
            before_step()
            plan = h.step()
            seen.append(plan_row(plan))
            if plan.work is not None:
                h.scheduler.submitted(plan.work.job_id)
                seen.append(("applied", h.complete(plan.work, ok=op == "step", stop=ids[n % len(ids):][:1])))
                if op == "fail":  # a known failure: the device is done with the job's lanes (as the engine does)
                    seen.append(("recovered", h.scheduler.recover_lanes()))
        elif op == "confirm":
            h.confirm_all()
        after_call()
    h.clock.advance(1.0)
    seen.extend(plan_row(plan) for plan in h.drive())
    after_call()
    seen.extend((rid, h.scheduler.registry.outcome(rid), tuple(h.sinks[rid].tokens)) for rid in ids)
    seen.append(h.scheduler.statistics())
    assert h.scheduler.idle()
    return seen
