"""Requests × KV lanes (§4, §7.1, §7.4, §9.2): the joint model of the runtime's coupling.

Each request is a :class:`RequestMachine` and each lane a :class:`KvSequenceMachine`, with their
own invariants proved per machine. What neither machine can state is how they move together —
"a decoding request's kv_length equals its lane's committed_len" needs both — so this module
declares the coupling the scheduler (``calculet/runtime/scheduling/scheduler.py``) and the KV manager
(``calculet/runtime/scheduling/kv.py``) implement, as one :class:`~calculet.machines.system.CoupledSystem`
(why not a ``Pool``: see that module). Its proofs are in
:mod:`calculet.invariants.system_checks`; its document is ``specs/request_lanes.md``.
"""

from __future__ import annotations

from typing import Any, Callable, Mapping

from calculet.logic.expr import And, Implies, Not
from calculet.logic.types import Bool, Int
from calculet.machines.kv_sequence import KvSequenceMachine, is_working
from calculet.machines.request import ENDED, HOLDING, WAITING, RequestMachine, is_decoding, is_ended, is_holding, is_waiting
from calculet.machines.system import NONE, Coupled, CoupledSystem, SystemInvariant

# State groups come from the two declarations (``State(groups=...)``), never restated here.
PRE_ADMISSION = tuple(s for s in RequestMachine.definition.states if s in WAITING)  # declaration order
DECODING = HOLDING & RequestMachine.definition.group("decoding")  # decode_ready, decode_running


def _decoding(request: Any) -> Any:
    return And(is_holding(request), is_decoding(request))


def owns(sys: Any, i: int, j: int) -> Any:
    """Lane ``j`` names request ``i`` as its owner: same seq_id and generation (§9.2, §10)."""
    return And(sys.lanes[j].seq_id == sys.seq[i], sys.lanes[j].generation == sys.requests[i].generation)


def _on_its_lane(sys: Any, i: int, j: int) -> Any:
    """The runtime reaches a request's lane only through its lease: every step after admission
    acts on the lane the request holds, never on another."""
    return sys.bound(i, j)


def _clean(request: Any) -> Any:
    """Neither cancelled nor expired while a job ran: only such a request is queued for its
    next chunk (a flagged one ends when its chunk completes)."""
    return And(Not(request.cancel_requested), Not(request.deadline_passed))


def _job_result(ok: bool) -> Callable[..., Mapping[str, Any]]:
    """The request side of a completion: the registry fires ``*_done`` with the request's own job
    id (a stale id is dropped before any event fires), the step's verdict and the stop flag."""
    return lambda sys, i, j, stop: {"job": sys.requests[i].job_id, "ok": ok, "stop": stop}


def _alone(row: str, why: str) -> Coupled:
    """A request row that touches no lane (before admission, after release, or a drain flag)."""
    t = next(t for t in RequestMachine.definition.transitions if t.name == row)
    return Coupled(row, request=(row,), args=dict(RequestMachine.definition.events[t.event].args), doc=why)


STOP = {"stop": Bool()}
CHUNK = {"stop": Bool(), "tokens": Int(ge=1)}
ENDS = ("prefill_done_cancelled", "prefill_done_deadline")


def _last_chunk(sys: Any, i: int, j: int, tokens: Any) -> Any:
    """The job in flight writes the prompt's last positions (``PrefillWork.last_chunk``: done +
    tokens == prompt_tokens): only its completion finishes prefill."""
    lane = sys.lanes[j]
    return And(sys.bound(i, j), lane.committed_len + tokens == sys.requests[i].prompt_tokens)


def _middle_chunk(sys: Any, i: int, j: int, tokens: Any) -> Any:
    """A chunk that leaves prompt positions for a later one: its success commits the lane only."""
    lane = sys.lanes[j]
    return And(sys.bound(i, j), lane.committed_len + tokens < sys.requests[i].prompt_tokens)


def _between_chunks(sys: Any, i: int, j: int) -> Any:
    """PrefillRunning with nothing on the device (``prefill.queued``): its lane is Active, so an
    end needs no drain and releases the lane at once."""
    return And(sys.bound(i, j), sys.lanes[j].at("active"))


def _done_steps(kind: str, rows: tuple[tuple[str, bool], ...], guard: Any, prefill: bool) -> list[Coupled]:
    """The outcomes of a finished job: commit(tokens) (ok), nothing kept (invalid), fault (unknown)."""
    steps = []
    args = CHUNK if prefill else STOP
    tokens = (lambda sys, i, j, tokens: {"tokens": tokens}) if prefill else (lambda sys, i, j: {"tokens": 1})
    ok_guard = guard if prefill else _on_its_lane
    for row, ends in rows:
        steps.append(Coupled(
            f"{kind}_ok:{row}", request=(row,), lane=("commit", "release") if ends else ("commit",),
            binding="unbind" if ends else "keep", guard=ok_guard, args=args, request_args=_job_result(True),
            lane_args=tokens, doc="device and output succeeded: the lane commits; an ended request releases it"))
    failing = [row for row, _ in rows if not row.endswith(("_finish", "_continue"))] + [f"{kind}_done_error"]
    for row in failing:
        steps.append(Coupled(
            f"{kind}_invalid:{row}", request=(row,), lane=("release",), binding="unbind", guard=_on_its_lane,
            args=STOP, request_args=_job_result(False),
            doc="invalid output: nothing the step wrote is kept (no lane event), the request fails and releases it"))
    for row in failing:
        steps.append(Coupled(
            f"{kind}_fault:{row}", request=(row,), lane=("fault",), binding="unbind", guard=_on_its_lane,
            args=STOP, request_args=_job_result(False),
            doc="timeout / CCU fault / mismatch: the lane is Unknown (quarantined), the request ends and "
                "detaches from it (§9.2, R7.4.5)"))
    return steps


class RequestLaneSystem(CoupledSystem):
    """R requests and L KV lanes, moved together as the scheduler's actor moves them.

    Every step is one call into the scheduler's actor, in which a request's events and its
    lane's events fire together:

    * ``_pump``: the KV manager reserves a free lane for the whole context (prompt +
      max_new_tokens) and the request is admitted — it is bound to that lane (its lease);
    * ``submitted``: ``submit_prefill``/``submit_decode`` move the request only (the lane has no
      in-flight state: its open step is its binding to the device job, ``JobLaneSystem``, #20; a
      later chunk of a chunked prefill moves neither);
    * ``on_prefill_complete``/``on_decode_complete``: ``_settle_kv`` commits the step's positions
      on the lane when device and output succeeded, keeps nothing on invalid output (no lane
      event), faults it (Unknown) when the device's
      state is unknown; then the request's ``prefill_done``/``decode_done`` fires. A middle chunk
      commits only the lane (or ends the request, if it was cancelled or expired meanwhile);
    * ``job_timed_out``/``device_reset``: the lanes fault and their requests end;
    * whenever a request reaches Finishing or a terminal state, the registry's listener releases
      its lease in the same call: the lane goes to Releasing — or, if Unknown, is only detached
      and waits for recovery; either way the request is unbound;
    * ``confirm_release`` frees a Releasing lane; recovery moves an Unknown lane to Releasing.
    """

    spec = "§4, §5.1, §7.1, §7.4, §9.2"
    fast_bmc = False    # verify --fast keeps the proofs (induction for every pool size, vacuity, reachability)
    request = RequestMachine
    lane = KvSequenceMachine

    steps = [
        # Before admission no lane is involved (§4, §5.2, §10).
        *[_alone(row, "routing: pinned to a Ready generation, or waiting for one (§10)")
          for row in ("wait_model@new", "bind@new", "bind@waiting_model")],
        *[_alone(f"{event}@{state}", "refused or ended before admission: there is no lane to give back")
          for event in ("reject", "cancel", "expire", "fail") for state in PRE_ADMISSION],
        Coupled("admit", request=("admit@waiting_admission",), lane=("reserve",), binding="bind",
                lane_args=lambda sys, i, j: {
                    "seq": sys.seq[i], "gen": sys.requests[i].generation,
                    "tokens": sys.requests[i].prompt_tokens + sys.requests[i].max_new_tokens},
                doc="_pump: the KV manager reserves a free lane for the whole context, the request is admitted"),
        Coupled("admit_now", request=("admit_now@new",), lane=("reserve",), binding="bind", args={"gen": Int(ge=1)},
                lane_args=lambda sys, i, j, gen: {
                    "seq": sys.seq[i], "gen": gen,
                    "tokens": sys.requests[i].prompt_tokens + sys.requests[i].max_new_tokens},
                doc="admitted at once (nothing else waits): pinned to `gen` and given a lane as `admit` does"),
        # A ready request that ends gives its lane back in the same step (the registry listener).
        *[Coupled(f"{event}@{state}", request=(f"{event}@{state}",), lane=("release",), binding="unbind",
                  guard=_on_its_lane, doc="ends with no job in flight; the listener releases the lease (R4.4)")
          for state in ("prefill_ready", "decode_ready") for event in ("cancel", "expire", "fail")],
        # Prefill (§6, §7.4): the first chunk submits the request; a later chunk moves neither (its job does).
        Coupled("submit_prefill", request=("submit_prefill@prefill_ready",), involves="both",
                args={"job": Int(ge=1), "tokens": Int(ge=1)},
                guard=lambda sys, i, j, tokens: And(
                    sys.bound(i, j), tokens <= sys.requests[i].prompt_tokens - sys.lanes[j].committed_len),
                doc="the device accepted the prefill job (or its first chunk) of `tokens` positions"),
        Coupled("commit_chunk", lane=("commit",), involves="both", args={"tokens": Int(ge=1)},
                lane_args=lambda sys, i, j, tokens: {"tokens": tokens},
                guard=lambda sys, i, j, tokens: And(_middle_chunk(sys, i, j, tokens), sys.requests[i].at("prefill_running"),
                                            _clean(sys.requests[i])),
                doc="a chunk that is not the last succeeded: the lane commits, the request waits for the next"),
        *[Coupled(f"commit_chunk:{row}", request=(row,), lane=("commit", "release"), binding="unbind",
                  guard=_middle_chunk, args=CHUNK, request_args=_job_result(True),
                  lane_args=lambda sys, i, j, tokens: {"tokens": tokens},
                  doc="a middle chunk succeeded but the request was cancelled or expired meanwhile: it ends now")
          for row in ENDS],
        *_done_steps("prefill", (("prefill_done_cancelled", True), ("prefill_done_deadline", True),
                                 ("prefill_done_finish", True), ("prefill_done_continue", False)), _last_chunk, True),
        Coupled("cancel_between_chunks", request=("cancel@prefill_running", "prefill_done_cancelled"),
                lane=("release",), binding="unbind", guard=_between_chunks, args=STOP, request_args=_job_result(True),
                doc="Scheduler.cancel between chunks: nothing is in flight, so the request ends at once"),
        Coupled("expire_between_chunks", request=("expire@prefill_running", "prefill_done_deadline"),
                lane=("release",), binding="unbind", guard=_between_chunks, args=STOP, request_args=_job_result(True),
                doc="the deadline passes between chunks: the request ends at once"),
        Coupled("fail_between_chunks", request=("prefill_done_error",), lane=("release",), binding="unbind",
                guard=_between_chunks, args=STOP, request_args=_job_result(False),
                doc="Scheduler.fail / the generation ends between chunks"),
        # While a job runs, cancel and deadline only set a flag; the job drains (§4, R4.5).
        Coupled("cancel@prefill_running", request=("cancel@prefill_running",), involves="both",
                guard=lambda sys, i, j: sys.bound(i, j),
                doc="cancel while a chunk is on the device"),
        Coupled("expire@prefill_running", request=("expire@prefill_running",), involves="both",
                guard=lambda sys, i, j: sys.bound(i, j),
                doc="deadline while a chunk is on the device"),
        _alone("cancel@decode_running", "cancel while the decode batch runs: a flag, the job drains"),
        _alone("expire@decode_running", "deadline while the decode batch runs: a flag, the job drains"),
        # Decode (§7.1, §7.4): one position per step, at the lane's committed_len.
        Coupled("submit_decode", request=("submit_decode@decode_ready",), involves="both", guard=_on_its_lane,
                args={"job": Int(ge=1)},
                doc="the lane was bound into a decode batch the device accepted"),
        *_done_steps("decode", (("decode_done_cancelled", True), ("decode_done_deadline", True),
                                ("decode_done_finish", True), ("decode_done_continue", False)), _on_its_lane, False),
        # Finishing already released its lane.
        _alone("close@finishing", "the stream closes"),
        _alone("cancel@finishing", "cancel after the last token: nothing to drain"),
        _alone("fail@finishing", "the runtime failed before the stream closed"),
        # Lanes alone (§9.2): recovery of an Unknown lane, and the runtime's release confirmation.
        Coupled("recover", lane=("recover",), doc="device reset / late completion / recover_lanes"),
        Coupled("confirm_release", lane=("confirm_release",), doc="the runtime freed the sequence"),
    ]

    omitted = [
        ("KvSequenceMachine.remove_tail@active",
         "RemoveTokensAtEnd/shift are behind §9.3 capability gates and the scheduler never calls them; "
         "enabling one would need a request event that shortens kv_length with it"),
    ]

    invariants = [
        SystemInvariant(
            "R9.2.1", "holding_request_owns_one_lane", rejects=({"requests": [{"state": "prefill_ready", "generation": 1}], "binding": [NONE]},),
            doc="an admitted request that has not ended holds exactly one lane, which it owns (held, same "
                "seq_id and generation); no other held lane names it",
            predicate=lambda sys: sys.all_requests(lambda i: Implies(
                is_holding(sys.requests[i]),
                And(Not(sys.unbound(i)),
                    *[Implies(sys.bound(i, j), And(Not(sys.lanes[j].at("free")), owns(sys, i, j)))
                      for j in range(len(sys.lanes))],
                    *[Implies(And(Not(sys.lanes[j].at("free")), owns(sys, i, j)), sys.bound(i, j))
                      for j in range(len(sys.lanes))])))),
        SystemInvariant(
            "R9.2.2", "lane_bound_at_most_once", rejects=({"requests": [{"state": "prefill_ready", "generation": 1}, {"state": "prefill_ready", "generation": 1}],
                                "lanes": [{"state": "reserved", "seq_id": 1, "generation": 1, "reserved_len": 4}],
                                "binding": [0, 0], "seq": [1, 2]},),
            doc="no lane is bound to two requests (a lane is not reused while its sequence lives)",
            predicate=lambda sys: And(*[
                Not(And(sys.bound(a, j), sys.bound(b, j)))
                for a in range(len(sys.requests)) for b in range(a + 1, len(sys.requests))
                for j in range(len(sys.lanes))])),
        SystemInvariant(
            "R9.2.4", "decode_position_is_committed_len", rejects=({"requests": [{"state": "decode_ready", "generation": 1, "generated_tokens": 1,
                                                    "kv_length": 2}],
                                       "lanes": [{"state": "active", "seq_id": 1, "generation": 1, "reserved_len": 5,
                                                  "committed_len": 1}], "binding": [0], "seq": [1]},),
            doc="a decoding request's kv_length (the position its next token is fed at) equals its lane's "
                "committed_len",
            predicate=lambda sys: sys.all_pairs(lambda i, j: Implies(
                And(_decoding(sys.requests[i]), sys.bound(i, j)),
                sys.requests[i].kv_length == sys.lanes[j].committed_len))),
        SystemInvariant(
            "R17.2.4", "ended_request_holds_no_lane", rejects=({"requests": [{"state": "cancelled", "generation": 1}],
                                   "lanes": [{"state": "reserved", "seq_id": 1, "generation": 1, "reserved_len": 4}],
                                   "binding": [NONE], "seq": [1]},),
            doc="a request that has ended (Finishing or terminal) is bound to no lane, and no Reserved, Active "
                "lane names it: its lane is Releasing, Unknown or Free",
            predicate=lambda sys: sys.all_requests(lambda i: Implies(
                is_ended(sys.requests[i]),
                And(sys.unbound(i), *[Not(And(is_working(sys.lanes[j]), owns(sys, i, j)))
                                      for j in range(len(sys.lanes))])))),
        SystemInvariant(
            "R9.2.6", "unknown_lane_unbound", rejects=({"requests": [{"state": "decode_ready", "generation": 1}],
                            "lanes": [{"state": "unknown", "seq_id": 1, "generation": 1, "reserved_len": 4}],
                            "binding": [0], "seq": [1]},),
            doc="an Unknown lane is bound to no request (so none that can still be scheduled): the step "
                "that faults it ends and detaches its request",
            predicate=lambda sys: sys.all_pairs(lambda i, j: Implies(sys.bound(i, j), Not(sys.lanes[j].at("unknown"))))),
        SystemInvariant(
            "R9.2.2", "free_lane_unbound", rejects=({"requests": [{"state": "decode_ready", "generation": 1}], "binding": [0], "seq": [1]},),
            doc="a Free lane is bound to no request",
            predicate=lambda sys: sys.all_pairs(lambda i, j: Implies(sys.bound(i, j), Not(sys.lanes[j].at("free"))))),
        # Strengthenings: the six properties above are not inductive alone; each of these rules
        # out the counterexample to induction named in its `strengthening` note.
        SystemInvariant(
            "R2.4", "bound_exactly_while_holding", rejects=({"requests": [{"state": "new"}],
                                   "lanes": [{"state": "reserved", "seq_id": 1, "generation": 1, "reserved_len": 4}],
                                   "binding": [0], "seq": [1]},),
            doc="a request has a lane (SequenceState.hardware_lane) exactly from admission until it ends",
            strengthening="a New request bound to some lane was rejected and ended still bound "
                          "(ended_request_holds_no_lane broke on reject@new)",
            predicate=lambda sys: sys.all_requests(lambda i: Not(sys.unbound(i)) == is_holding(sys.requests[i]))),
        SystemInvariant(
            "R9.2.1", "unadmitted_request_named_by_no_lane", rejects=({"requests": [{"state": "waiting_admission", "generation": 1}],
                                           "lanes": [{"state": "reserved", "seq_id": 1, "generation": 1,
                                                      "reserved_len": 4}], "binding": [NONE], "seq": [1]},),
            doc="no held lane names a request that has not been admitted (seq ids are fresh)",
            strengthening="a waiting request whose seq a held lane already named was admitted to a second lane "
                          "(holding_request_owns_one_lane broke on admit), or ended while a Reserved lane named it "
                          "(ended_request_holds_no_lane broke on cancel@waiting_admission)",
            predicate=lambda sys: sys.all_pairs(lambda i, j: Implies(
                is_waiting(sys.requests[i]),
                Not(And(Not(sys.lanes[j].at("free")), sys.lanes[j].seq_id == sys.seq[i]))))),
        SystemInvariant(
            "R9.2.5", "request_and_lane_phases_agree", rejects=({"requests": [{"state": "prefill_ready", "generation": 1}],
                                     "lanes": [{"state": "active", "seq_id": 1, "generation": 1, "reserved_len": 4,
                                                "committed_len": 1}], "binding": [0], "seq": [1]},),
            doc="the request's phase matches its lane's: PrefillReady ↔ Reserved, PrefillRunning ↔ Reserved "
                "or Active (between chunks), DecodeReady and DecodeRunning ↔ Active (whether a job is in flight "
                "is the lane's binding to it, JobLaneSystem, #20)",
            strengthening="it keeps a bound lane Reserved or Active (free_lane_unbound broke on confirm_release "
                          "of a bound Releasing lane)",
            predicate=lambda sys: sys.all_pairs(lambda i, j: Implies(sys.bound(i, j), And(
                Implies(sys.requests[i].at("prefill_ready"), sys.lanes[j].at("reserved")),
                Implies(sys.requests[i].at("prefill_running"), sys.lanes[j].at("reserved", "active")),
                Implies(sys.requests[i].at("decode_ready"), sys.lanes[j].at("active")),
                Implies(sys.requests[i].at("decode_running"), sys.lanes[j].at("active")))))),
    ]


__all__ = ["RequestLaneSystem", "owns", "NONE", "HOLDING", "DECODING", "ENDED"]

