"""Request lifecycle (§2 RequestState, §4 RequestRegistry rules) — the one declaration of it."""

from __future__ import annotations

import enum

from calculet.logic.expr import And, If, Implies, In, Not, Or
from calculet.logic.types import Bool, EnumType, Int
from calculet.machines.core import Machine
from calculet.machines.definition import Event, Group, Invariant, Param, State, StepProperty, T, Var, is_terminal


class FinishReason(enum.IntEnum):
    """Why a request ended; NONE while it has not. Maps to the stream's finish_reason."""

    NONE = 0
    STOP = 1        # a stop token or stop sequence
    LENGTH = 2      # max_new_tokens reached
    CANCELLED = 3   # the client cancelled or disconnected
    ERROR = 4       # a device or runtime failure (the CalRT rc travels with the error)
    DEADLINE = 5    # the deadline passed before completion
    REJECTED = 6    # admission refused it (400 / 429 / 503)


# The state groups, as predicates over a view (``is_running(v)``); their members are the states
# that declare them below (``terminal``: the states flagged terminal), never a tuple of names.
is_waiting = Group("waiting")      # not admitted yet: no lane, no job
is_ready = Group("ready")          # admitted, queued for its next job
is_running = Group("running")      # a job of it is on the device
is_admitted = Group("admitted")    # admitted and not cancelled or failed
is_decoding = Group("decoding")    # past prefill: the first token exists
is_holding = Group("holding")      # admitted and still owns its KV lane (ready or running)
is_ended = Group("ended")          # its last token is produced or it ended: Finishing or terminal


def _clean(v):  # neither cancelled nor past its deadline while the job ran
    return And(Not(v.cancel_requested), Not(v.deadline_passed))


def _done_rows(source, event, prefix: str, *, ready, finishing, cancelled, failed, first_token: bool):
    """The five outcomes of a finished job; guards are disjoint, so exactly one applies (§4, §7.4).

    Cancellation wins over the deadline, which wins over the job's own result: a cancelled
    request's output is discarded whatever the device returned (§4: the job still drains).
    """

    def progress(v):
        if first_token:  # prefill writes the prompt's KV and yields the first token
            return {"generated_tokens": 1, "kv_length": v.prompt_tokens}
        return {"generated_tokens": v.generated_tokens + 1, "kv_length": v.kv_length + 1}

    def last(v):  # the token this job yields is the last one allowed
        return v.generated_tokens + 1 >= v.max_new_tokens

    return [
        T(source, event, cancelled, name=f"{prefix}_cancelled",
          guard=lambda v, job: And(job == v.job_id, v.cancel_requested),
          effect=lambda v: {"job_id": 0, "cancel_requested": False, "deadline_passed": False,
                            "finish_reason": FinishReason.CANCELLED, "closes": 1}),
        T(source, event, failed, name=f"{prefix}_deadline",
          guard=lambda v, job: And(job == v.job_id, Not(v.cancel_requested), v.deadline_passed),
          effect=lambda v: {"job_id": 0, "deadline_passed": False,
                            "finish_reason": FinishReason.DEADLINE, "closes": 1}),
        T(source, event, failed, name=f"{prefix}_error",
          guard=lambda v, job, ok: And(job == v.job_id, _clean(v), Not(ok)),
          effect=lambda v: {"job_id": 0, "finish_reason": FinishReason.ERROR, "closes": 1}),
        T(source, event, finishing, name=f"{prefix}_finish",
          guard=lambda v, job, ok, stop: And(job == v.job_id, _clean(v), ok, Or(stop, last(v))),
          effect=lambda v, stop: {**progress(v), "job_id": 0,
                                  "finish_reason": If(stop, FinishReason.STOP, FinishReason.LENGTH)}),
        T(source, event, ready, name=f"{prefix}_continue",
          guard=lambda v, job, ok, stop: And(job == v.job_id, _clean(v), ok, Not(stop), Not(last(v))),
          effect=lambda v: {**progress(v), "job_id": 0}),
    ]


class RequestMachine(Machine):
    """One inference request from creation to its single terminal state (§2, §4).

    Decisions where the spec is silent (requirements.md, ambiguities 3, 6):

    * Cancel in New / WaitingModel / WaitingAdmission / PrefillReady / DecodeReady completes at
      once (§4). In PrefillRunning / DecodeRunning it only sets ``cancel_requested``; the job
      drains and its completion ends the request Cancelled, its output discarded (§4).
    * Cancel in **Finishing** (all tokens produced, stream not yet closed) also completes at
      once: no job is in flight, so nothing needs to drain.
    * Cancel of a terminal request is idempotent at the registry: it returns the terminal
      outcome without firing, because no transition may leave a terminal state.
    * A deadline passing while waiting or ready fails the request (``DEADLINE``); while a job
      runs it sets ``deadline_passed`` and the job drains first, like cancel.
    * The generation is bound once (``bind``) — at creation when the alias resolves to a Ready
      generation, or when a waited-for model becomes ready — and never changes after (§10).
    * Admission's rejections (400/429/503) end the request Failed with ``REJECTED``.
    * ``closes`` counts stream closes: exactly one, on entering a terminal state (§4).
    * Positions: after prefill ``kv_length`` = prompt_tokens; each decode step feeds the last
      token at position ``kv_length`` and commits one more (§7.1, §9.2 position == committed_len).
    """

    spec = "§2, §4, §5.2, §7.2, §10"
    examples = [dict(prompt_tokens=2, max_new_tokens=3, max_seq=8),
                dict(prompt_tokens=1, max_new_tokens=1, max_seq=2),
                dict(prompt_tokens=6, max_new_tokens=4, max_seq=8)]

    prompt_tokens = Param(Int(ge=1), doc="prompt length in tokens")
    max_new_tokens = Param(Int(ge=1), doc="output tokens requested")
    max_seq = Param(Int(ge=1), doc="context limit of the model's profile")

    generation = Var(Int(ge=0), doc="model generation the request is pinned to; 0 until bound")
    job_id = Var(Int(ge=0), doc="the in-flight job; 0 when none")
    generated_tokens = Var(Int(ge=0))
    kv_length = Var(Int(ge=0), doc="tokens committed to the KV sequence")
    cancel_requested = Var(Bool(), doc="cancel arrived while a job was running")
    deadline_passed = Var(Bool(), doc="the deadline passed while a job was running")
    finish_reason = Var(EnumType(FinishReason), init=FinishReason.NONE)
    closes = Var(Int(ge=0, le=1), doc="stream closes so far (promise set + stream close)")

    new = State(initial=True, doc="created, not yet routed to a generation", groups=("waiting",))
    waiting_model = State(doc="the alias has no Ready generation yet", groups=("waiting",))
    waiting_admission = State(doc="bound to a generation; waiting for budget (Queue outcome)", groups=("waiting",))
    prefill_ready = State(doc="admitted; in a prefill queue", groups=("ready", "admitted", "holding"))
    prefill_running = State(doc="its prefill job is on the device", groups=("running", "admitted", "holding"))
    decode_ready = State(doc="in the decode ready queue", groups=("ready", "admitted", "decoding", "holding"))
    decode_running = State(doc="its lane is in a submitted decode batch",
                           groups=("running", "admitted", "decoding", "holding"))
    finishing = State(doc="last token produced; the stream close is pending", groups=("admitted", "decoding", "ended"))
    completed = State(terminal=True, groups=("admitted", "decoding", "ended"))
    cancelled = State(terminal=True, groups=("ended",))
    failed = State(terminal=True, groups=("ended",))

    bind = Event("pin the request to a Ready generation", gen=Int(ge=1))
    wait_model = Event("the alias has no Ready generation yet")
    admit = Event("admission: Admit (§5.2)")
    admit_now = Event("admission: Admit at once — pinned to the Ready generation and admitted in one step, as "
                      "bind then admit would, when nothing else waits and the budget has room (§5.2, §10)",
                      gen=Int(ge=1))
    reject = Event("admission: RejectInvalid / RejectCapacity / RejectUnavailable (§5.2)")
    submit_prefill = Event("the prefill job was submitted", job=Int(ge=1))
    prefill_done = Event("the prefill job finished", job=Int(ge=1), ok=Bool(), stop=Bool())
    submit_decode = Event("the lane was bound into a submitted decode batch", job=Int(ge=1))
    decode_done = Event("the decode batch finished for this lane", job=Int(ge=1), ok=Bool(), stop=Bool())
    close = Event("the stream was closed with the finish reason")
    cancel = Event("the client cancelled (idempotent at the registry)")
    expire = Event("the deadline passed")
    fail = Event("the model or runtime failed while no job of this request was in flight")

    transitions = [
        T(new, wait_model, waiting_model),
        T((new, waiting_model), bind, waiting_admission,
          effect=lambda v, gen: {"generation": gen}),
        T(waiting_admission, admit, prefill_ready,
          guard=lambda v: v.prompt_tokens + v.max_new_tokens <= v.max_seq),
        # ``bind`` then ``admit`` as one row (issue #20: one event, not two, for a request that never waits)
        T(new, admit_now, prefill_ready,
          guard=lambda v: v.prompt_tokens + v.max_new_tokens <= v.max_seq,
          effect=lambda v, gen: {"generation": gen}),
        T((new, waiting_model, waiting_admission), reject, failed,
          effect=lambda v: {"finish_reason": FinishReason.REJECTED, "closes": 1}),
        T(prefill_ready, submit_prefill, prefill_running,
          effect=lambda v, job: {"job_id": job}),
        *_done_rows(prefill_running, prefill_done, "prefill_done", ready=decode_ready, finishing=finishing,
                    cancelled=cancelled, failed=failed, first_token=True),
        T(decode_ready, submit_decode, decode_running,
          effect=lambda v, job: {"job_id": job}),
        *_done_rows(decode_running, decode_done, "decode_done", ready=decode_ready, finishing=finishing,
                    cancelled=cancelled, failed=failed, first_token=False),
        T(finishing, close, completed, effect=lambda v: {"closes": 1}),
        T((new, waiting_model, waiting_admission, prefill_ready, decode_ready, finishing), cancel, cancelled,
          effect=lambda v: {"finish_reason": FinishReason.CANCELLED, "closes": 1}),
        T(prefill_running, cancel, prefill_running, effect=lambda v: {"cancel_requested": True}),
        T(decode_running, cancel, decode_running, effect=lambda v: {"cancel_requested": True}),
        T((new, waiting_model, waiting_admission, prefill_ready, decode_ready), expire, failed,
          effect=lambda v: {"finish_reason": FinishReason.DEADLINE, "closes": 1}),
        T(prefill_running, expire, prefill_running, effect=lambda v: {"deadline_passed": True}),
        T(decode_running, expire, decode_running, effect=lambda v: {"deadline_passed": True}),
        T((new, waiting_model, waiting_admission, prefill_ready, decode_ready, finishing), fail, failed,
          effect=lambda v: {"finish_reason": FinishReason.ERROR, "closes": 1}),
    ]

    invariants = [
        Invariant("R4.6", name="terminal_closed_once", rejects=({"state": "completed", "closes": 0},),
                  doc="the stream is closed exactly once, when a terminal state is entered",
                  predicate=lambda v: v.closes == If(is_terminal(v), 1, 0)),
        Invariant("R2.3", name="finish_reason_matches_state", rejects=({"state": "decode_ready", "finish_reason": FinishReason.STOP},),
                  doc="a finish reason exists exactly when the request is finishing or ended, and fits the state",
                  predicate=lambda v: And(
                      Implies(Or(is_waiting(v), is_ready(v), is_running(v)), v.finish_reason == FinishReason.NONE),
                      Implies(v.at("finishing", "completed"),
                              In(v.finish_reason, (FinishReason.STOP, FinishReason.LENGTH))),
                      Implies(v.at("cancelled"), v.finish_reason == FinishReason.CANCELLED),
                      Implies(v.at("failed"), In(v.finish_reason, (
                          FinishReason.ERROR, FinishReason.DEADLINE, FinishReason.REJECTED))))),
        Invariant("R4.8", name="job_only_while_running", rejects=({"state": "decode_ready", "job_id": 3},),
                  doc="a request names an in-flight job exactly while one runs",
                  predicate=lambda v: (v.job_id >= 1) == is_running(v)),
        Invariant("R4.5", name="flags_only_while_running", rejects=({"state": "decode_ready", "cancel_requested": True},),
                  doc="cancel/deadline flags exist only while a job drains",
                  predicate=lambda v: Implies(Or(v.cancel_requested, v.deadline_passed), is_running(v))),
        Invariant("R10.3", name="pinned_exactly_after_bind", rejects=({"state": "prefill_ready", "generation": 0}, {"state": "waiting_model", "generation": 1}),
                  doc="a request is pinned to a generation from bind on, and not before",
                  predicate=lambda v: And(Implies(Or(is_admitted(v), v.at("waiting_admission")), v.generation >= 1),
                                          Implies(v.at("new", "waiting_model"), v.generation == 0))),
        Invariant("R5.1.4", name="admitted_fits_context", rejects=({"state": "prefill_ready", "prompt_tokens": 6, "max_new_tokens": 4, "max_seq": 8},),
                  doc="an admitted request can never exceed the context",
                  predicate=lambda v: Implies(is_admitted(v), v.prompt_tokens + v.max_new_tokens <= v.max_seq)),
        Invariant("R9.2.4", name="kv_length_tracks_tokens", rejects=({"state": "decode_ready", "generated_tokens": 1, "kv_length": 5},),
                  doc="after prefill, kv_length = prompt + generated - 1 (the last token is not yet in KV)",
                  predicate=lambda v: And(
                      Implies(is_decoding(v), And(v.generated_tokens >= 1,
                                                  v.kv_length + 1 == v.prompt_tokens + v.generated_tokens)),
                      Implies(Or(is_waiting(v), v.at("prefill_ready", "prefill_running")),
                              And(v.generated_tokens == 0, v.kv_length == 0)),
                      v.generated_tokens <= v.max_new_tokens)),
        Invariant("R5.1.4", name="decoding_has_budget", rejects=({"state": "decode_ready", "generated_tokens": 3, "kv_length": 4},),
                  doc="a request in decode has tokens left to produce and room in the context",
                  predicate=lambda v: Implies(v.at("decode_ready", "decode_running"), And(
                      v.generated_tokens < v.max_new_tokens, v.kv_length + 1 <= v.max_seq))),
        StepProperty("R10.3", name="generation_fixed", rejects=(({"state": "decode_ready", "generation": 1}, {"generation": 2}),),
                     doc="once bound, the generation never changes (no switch when the alias moves)",
                     predicate=lambda pre, post: Implies(pre.generation >= 1, post.generation == pre.generation)),
    ]



# The groups as sets of state names, for runtime code (derived from the declaration above).
TERMINAL: frozenset[str] = is_terminal.of(RequestMachine)
WAITING: frozenset[str] = is_waiting.of(RequestMachine)
READY: frozenset[str] = is_ready.of(RequestMachine)
RUNNING: frozenset[str] = is_running.of(RequestMachine)
ADMITTED: frozenset[str] = is_admitted.of(RequestMachine)
DECODING: frozenset[str] = is_decoding.of(RequestMachine)
HOLDING: frozenset[str] = is_holding.of(RequestMachine)
ENDED: frozenset[str] = is_ended.of(RequestMachine)
