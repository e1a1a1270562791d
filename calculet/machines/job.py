"""Device job lifecycle (§14 ping/pong, §7.4 completion, §12 drain) — the one declaration of it."""

from __future__ import annotations

import enum

from calculet.logic.expr import And, Implies, Not
from calculet.logic.types import Bool, EnumType, Int
from calculet.machines.core import Machine
from calculet.machines.definition import Event, Invariant, Param, State, StepProperty, T, Var


class JobEngine(enum.IntEnum):
    """The two job engines/banks of §14; a job runs wholly on one (batches are never split)."""

    PING = 0
    PONG = 1


class DeviceJobMachine(Machine):
    """One prefill or decode job on engine PING or PONG, from its prepared buffers to their release.

    The buffers (InputBuf/OutputBuf and backing storage, one set per job, §14) are held from
    Prepared until the device has certainly stopped writing them. A timed-out job may still be
    writing: its buffers are quarantined, never reused, until a late completion proves the
    device done with them or a reset per the contract ends the job (§12: a forced delete is not
    a cancellation). Results are delivered at most once, and only by a completion in time.

    Decisions where the spec is silent: a completion that reports a device error ends the job
    Failed with its buffers released (the device has finished with them); a CCU fault or unknown
    DMA quarantines at once, since the device's state is not known.
    """

    spec = "§7.4, §12, §14"
    examples = [dict(job_id=1, generation=1, engine=JobEngine.PING, lanes=4),
                dict(job_id=2, generation=1, engine=JobEngine.PONG, lanes=1)]

    job_id = Param(Int(ge=1))
    generation = Param(Int(ge=1))
    engine = Param(EnumType(JobEngine))
    lanes = Param(Int(ge=1, le=16), doc="compiled batch of the job's profile")

    buffers_held = Var(Bool(), init=True, doc="input/output buffers and backing storage are allocated")
    delivered = Var(Int(ge=0, le=1), doc="results handed to completion (at most once)")
    fault_reported = Var(Bool(), init=False,
                         doc="a completion in time reported a CCU fault or unknown DMA (not a timeout): the device "
                             "answered for each lane (R7.4.6: with lane-level isolation its good lanes commit)")

    prepared = State(initial=True, doc="buffers allocated and filled; not yet submitted")
    submitted = State(doc="on the device")
    timed_out = State(doc="Wait timed out; the device may still write the buffers")
    quarantined = State(doc="buffers fenced until a reset or a late completion")
    completed = State(terminal=True, doc="results delivered; buffers released")
    failed = State(terminal=True, doc="ended without results; buffers released")

    submit = Event("the device accepted the job")
    submit_rejected = Event("submit returned an error (DeviceBusy, invalid argument, ...)")
    complete = Event("Wait returned in time", ok=Bool())
    timeout = Event("Wait timed out")
    fault = Event("CCU fault or unknown DMA reported for this job")
    quarantine = Event("recovery fenced the timed-out job's buffers")
    late_complete = Event("the device finished after the timeout; results are discarded")
    reset_done = Event("a device reset per the contract ended the job")

    transitions = [
        T(prepared, submit, submitted),
        T(prepared, submit_rejected, failed, effect=lambda v: {"buffers_held": False}),
        T(submitted, complete, completed, name="complete_ok", guard=lambda v, ok: ok,
          effect=lambda v: {"delivered": v.delivered + 1, "buffers_held": False}),
        T(submitted, complete, failed, name="complete_error", guard=lambda v, ok: Not(ok),
          effect=lambda v: {"buffers_held": False}),
        T(submitted, timeout, timed_out),
        T(submitted, fault, quarantined, effect=lambda v: {"fault_reported": True}),
        T(timed_out, quarantine, quarantined),
        T((timed_out, quarantined), late_complete, failed, effect=lambda v: {"buffers_held": False}),
        T(quarantined, reset_done, failed, effect=lambda v: {"buffers_held": False}),
    ]

    invariants = [
        Invariant("design", name="delivered_only_when_completed", rejects=({"state": "failed", "delivered": 1, "buffers_held": False},),
                  doc="results are delivered once, exactly by a completed job",
                  predicate=lambda v: (v.delivered == 1) == v.at("completed")),
        Invariant("R14.3", name="buffers_held_until_device_done", rejects=({"state": "timed_out", "buffers_held": False},),
                  doc="buffers stay allocated while the device may write them, and are released after",
                  predicate=lambda v: v.buffers_held == v.at("prepared", "submitted", "timed_out", "quarantined")),
        Invariant("R7.4.6", name="fault_reported_only_by_a_completion", rejects=({"state": "timed_out", "fault_reported": True},),
                  doc="only a job whose completion in time reported a fault is marked so (a timed-out job never is)",
                  predicate=lambda v: Implies(v.fault_reported, v.at("quarantined", "failed"))),
        StepProperty("R12.11", name="no_release_while_writable", rejects=(({"state": "submitted", "buffers_held": True}, {"state": "timed_out", "buffers_held": False}),),
                     doc="a job still on the device (submitted) never releases its buffers without a completion",
                     predicate=lambda pre, post: Implies(And(pre.at("submitted"), Not(post.buffers_held)),
                                                         post.at("completed", "failed"))),
    ]
