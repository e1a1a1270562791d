"""KV sequence / hardware lane lifecycle (§9.1–9.2) — the one declaration of it."""

from __future__ import annotations

import enum
from typing import Any, NamedTuple

from calculet.logic.expr import And, Implies, Not, Or
from calculet.logic.types import Int
from calculet.machines.core import Machine
from calculet.machines.definition import Event, Group, Invariant, Param, State, StepProperty, T, Var
from calculet.machines.projection import DerivedState, StateProjection

is_working = Group("working")  # owned and usable by its request: Reserved or Active


class KvSequenceMachine(Machine):
    """One hardware lane's KV sequence, reused for request after request (§9).

    Append/decode is a transaction (§9.3 "transactions to be added") with one lane event per
    step (#20): the open transaction is the lane's *binding* to the device job writing it
    (:class:`~calculet.machines.job_lanes.JobLaneSystem`; the machine has no Updating state).
    §9.1's Updating is reported from the machine state and that binding by the projection
    :data:`KV_SEQUENCE_STATE` below (R9.1.1, R9.2.5): the lane instance's own ``state`` and the
    monitors' reports never say ``updating``; ``KvLaneManager.state`` / ``.sequence``,
    ``statistics().by_state`` and the ``calculet_kv_sequences`` gauge do. Why: a B1 decode token
    costs 5 machine events instead of 6 (this machine's ``commit``, RequestMachine's two,
    DeviceJobMachine's two; measured 6.05 -> 5.05 per token, count_core 1), and what the Updating
    state guarded (no release or stale settle while a job writes the lane, only the lane's own
    job's answer commits it) is the binding's guards and JobLaneSystem's step properties, proved
    for every size and checked at run time where the KV manager ends a lane's step.
    ``commit(tokens)`` makes the step's positions part of ``committed_len`` only when both the
    device and the output succeeded (§9.2); a failure whose effect on the device is known fires
    no lane event (nothing was kept: the binding is dropped); ``fault`` (timeout, CCU fault,
    DMA unknown) makes the lane Unknown: it keeps its owner and is never handed out again until
    recovery confirms the device no longer writes it (§9.2 last rule). That only the lane's own
    job's completion commits it, and only once that job ended does its step close, are step
    properties of the joint system.

    Decisions where the spec is silent:

    * ``reserved_len`` is the whole context the request may use (prompt + max_new_tokens),
      reserved at admission, so a running request never runs out of KV mid-decode (§5.1).
    * A lane returns to Free only through Releasing, on the runtime's release confirmation
      (§9.2 rule 2); Unknown reaches Releasing only by ``recover``.
    * ``remove_tail`` keeps at least one committed token; whether it may be used at all is a
      capability gate of the KvManager (§9.3: disabled until RemoveTokensAtEnd tests pass).
    * seq_id and generation 0 mean "none": a held lane always names its owner.
    """

    spec = "§9.1–9.2, §9.3, §7.4"
    examples = [dict(max_seq=4, lane=0), dict(max_seq=1, lane=3)]

    max_seq = Param(Int(ge=1), doc="context limit of the profile (§2 BatchProfile.max_seq)")
    lane = Param(Int(ge=0), doc="the hardware lane this sequence slot drives")

    seq_id = Var(Int(ge=0), doc="calrt KvSeqId of the owner; 0 when free")
    generation = Var(Int(ge=0), doc="model generation of the owner; 0 when free")
    committed_len = Var(Int(ge=0), doc="tokens whose KV the device wrote and the output confirmed")
    reserved_len = Var(Int(ge=0), doc="tokens this sequence may ever hold")

    free = State(initial=True, doc="no owner; may be reserved")
    reserved = State(doc="owned, nothing committed yet (before prefill)", groups=("working",))
    active = State(doc="owned, KV committed, no job in flight", groups=("working",))
    unknown = State(doc="device state unknown after timeout/CCU fault; quarantined")
    releasing = State(doc="owner gone; waiting for the runtime to confirm the free")

    reserve = Event("admission hands the lane to a sequence", seq=Int(ge=1), gen=Int(ge=1), tokens=Int(ge=1))
    commit = Event("the step writing `tokens` positions ended: device and output both succeeded", tokens=Int(ge=1))
    fault = Event("timeout / CCU fault / DMA unknown: the lane's device state is unknown")
    remove_tail = Event("drop the last `tokens` committed tokens (RemoveTokensAtEnd)", tokens=Int(ge=1))
    release = Event("the owner ended; ask the runtime to free the sequence")
    recover = Event("recovery reset the device; the unknown lane may be released")
    confirm_release = Event("the runtime confirmed the sequence is free")

    transitions = [
        T(free, reserve, reserved,
          guard=lambda v, tokens: tokens <= v.max_seq,
          effect=lambda v, seq, gen, tokens: {
              "seq_id": seq, "generation": gen, "reserved_len": tokens,
              "committed_len": 0}),
        T((reserved, active), commit, active,
          guard=lambda v, tokens: v.committed_len + tokens <= v.reserved_len,
          effect=lambda v, tokens: {"committed_len": v.committed_len + tokens}),
        T((reserved, active), fault, unknown),
        T(active, remove_tail, active,
          guard=lambda v, tokens: tokens < v.committed_len,
          effect=lambda v, tokens: {"committed_len": v.committed_len - tokens}),
        T((reserved, active), release, releasing),
        T(unknown, recover, releasing),
        T(releasing, confirm_release, free,
          effect=lambda v: {"seq_id": 0, "generation": 0, "reserved_len": 0,
                            "committed_len": 0}),
    ]

    invariants = [
        Invariant("R9.2.3", name="lengths_ordered", rejects=({"state": "active", "seq_id": 1, "generation": 1, "reserved_len": 2, "committed_len": 3},
                           {"state": "reserved", "seq_id": 1, "generation": 1, "reserved_len": 5}),
                  doc="committed_len ≤ reserved_len ≤ max_seq",
                  predicate=lambda v: And(v.committed_len <= v.reserved_len,
                                          v.reserved_len <= v.max_seq)),
        Invariant("R9.2.2", name="free_is_empty", rejects=({"state": "free", "seq_id": 1},),
                  doc="a free lane holds no owner and no tokens",
                  predicate=lambda v: Implies(v.at("free"), And(
                      v.seq_id == 0, v.generation == 0, v.reserved_len == 0,
                      v.committed_len == 0))),
        Invariant("R9.2.1", name="held_lane_has_owner", rejects=({"state": "reserved", "seq_id": 0, "generation": 1, "reserved_len": 2},
                           {"state": "reserved", "seq_id": 1, "generation": 0, "reserved_len": 2},
                           {"state": "reserved", "seq_id": 1, "generation": 1, "reserved_len": 0}),
                  doc="a lane that is not free belongs to exactly one (seq_id, generation)",
                  predicate=lambda v: Implies(Not(v.at("free")), And(v.seq_id >= 1, v.generation >= 1,
                                                                      v.reserved_len >= 1))),
        Invariant("R9.2.4", name="reserved_has_nothing_committed", rejects=({"state": "reserved", "committed_len": 1}, {"state": "active", "committed_len": 0}),
                  doc="Reserved means nothing committed; Active means something is",
                  predicate=lambda v: And(Implies(v.at("reserved"), v.committed_len == 0),
                                          Implies(v.at("active"), v.committed_len >= 1))),
        StepProperty("R9.2.5", name="commit_only_on_success", rejects=(({"state": "active", "seq_id": 1, "generation": 1, "reserved_len": 4, "committed_len": 1},
                                {"state": "unknown", "committed_len": 2}, "fault@active"),),
                     doc="committed_len grows only by a commit (device and output succeeded), which adds exactly "
                         "the step's tokens",
                     predicate=lambda pre, post, step: And(
                         Implies(post.committed_len > pre.committed_len, step.event == "commit"),
                         Implies(step.event == "commit", post.committed_len == pre.committed_len + step.args["tokens"])
                         if "tokens" in step.args else True)),  # the run-time monitor passes no arguments
        StepProperty("R9.2.5", name="fault_keeps_committed", rejects=(({"state": "active", "seq_id": 1, "generation": 1, "reserved_len": 4, "committed_len": 1},
                               {"state": "unknown", "committed_len": 0}, "fault@active"),),
                     doc="a fault keeps what was committed (the lane is Unknown: recovery decides, §9.2)",
                     predicate=lambda pre, post, step: Implies(step.event == "fault",
                                                               post.committed_len == pre.committed_len)),
        StepProperty("R9.2.1", name="owner_fixed_while_held", rejects=(({"state": "active", "seq_id": 1, "generation": 1}, {"seq_id": 2}),),
                     doc="a held lane keeps its seq_id and generation until it is Free again",
                     predicate=lambda pre, post: Implies(
                         And(Not(pre.at("free")), Not(post.at("free"))),
                         And(post.seq_id == pre.seq_id, post.generation == pre.generation))),
        StepProperty("R9.2.2", name="free_only_after_confirmed_release", rejects=(({"state": "active"}, {"state": "free"}),),
                     doc="a lane becomes Free only from Releasing (runtime confirmed the free)",
                     predicate=lambda pre, post: Implies(
                         And(post.at("free"), Not(pre.at("free"))), pre.at("releasing"))),
        StepProperty("R9.2.6", name="unknown_is_quarantined", rejects=(({"state": "unknown"}, {"state": "reserved"}),),
                     doc="an Unknown lane is never handed to a request: it leaves only to Releasing",
                     predicate=lambda pre, post: Implies(pre.at("unknown"),
                                                         Or(post.at("unknown"), post.at("releasing")))),
    ]


KV_SEQUENCE_STATE = StateProjection(
    KvSequenceMachine, "KvSequenceState", spec="§9.1", rid="R9.1.1", condition="step open",
    condition_doc="the lane is bound to the device job writing it — JobLaneSystem's binding, kept by the KV manager "
                  "(`KvLaneManager.open_list()[lane] > 0`) from the submit that opens the step to the commit, abort "
                  "or recovery that closes it (#20: the machine fires no event for it).",
    derived=(DerivedState("updating", is_working, rid="R9.2.5",
                          doc="a working lane (Reserved or Active) with its step open: after a successful submit, "
                              "until the step's own job ends; committed_len unchanged until the commit"),))
"""§9.1's ``KvSequenceState`` as the runtime reports it — the one declaration of the projection from (machine
state, step open) to it. Every reader of a lane's reported state goes through ``KV_SEQUENCE_STATE.of``."""

KvSequenceState = KV_SEQUENCE_STATE.enum
"""R9.1.1: exactly Free, Reserved, Active, Updating, Unknown, Releasing (a ``StrEnum``: members equal their names)."""


class KvSequence(NamedTuple):
    """R9.1.2: one lane's KV sequence as §9.1 lists it — a snapshot (``KvLaneManager.sequence``), its state
    projected by ``KV_SEQUENCE_STATE``."""

    seq_id: int
    hardware_lane: int
    committed_len: int
    reserved_len: int
    generation: int
    state: enum.StrEnum

    @classmethod
    def of(cls, lane: Any, step_open: bool) -> KvSequence:
        """The record of a lane's machine instance whose step is (or is not) open."""
        return cls(lane.seq_id, lane.lane, lane.committed_len, lane.reserved_len, lane.generation,
                   KV_SEQUENCE_STATE.of(lane.state, step_open))
