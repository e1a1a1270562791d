"""R5.1.2's admission budgets (§5.1 ``CapacityBudget``), declared once and coupled with the requests they count (#17).

§5.1 lists five limits: ``max_sequences``, ``max_kv_tokens``, ``max_waiting_requests``,
``max_waiting_prompt_tokens`` and ``max_inflight_jobs``. The in-flight one is proved on
:class:`~calculet.machines.job_lanes.JobLaneSystem` and the KV lanes' own capacity on the pool
(:class:`~calculet.machines.kv_pool.KvLanePool`); the other four are the admission controller's
(``calculet/runtime/scheduling/admission.py``): it keeps four counters and grows them only when the
budget has room. Here they are:

* :class:`AdmissionBudgetMachine` — the controller's counters and its budget as a machine. Its rows
  are the controller's operations (``accept`` after screening, ``leave`` a waiting request that
  ends without admission, ``admit``, ``admit_now`` (screened and admitted at once, never waiting),
  ``release`` the KV lease, ``refuse`` at screening), and the
  rows that grow a counter carry the budget guard (§5.2: RejectCapacity / Queue otherwise). Its invariants — each counter
  within its limit — are proved per machine by consecution, so a budget guard dropped from the
  declaration fails ``verify``.
* :class:`AdmissionBudgetSystem` — R requests × B budgets, in the shape of
  :class:`~calculet.machines.system.CoupledSystem` (``lane`` role: the budget; the binding is
  "counted by"). Every step is derived from a :class:`~calculet.machines.request.RequestMachine`
  row: leaving ``new`` for a waiting state fires the budget's ``accept`` (screening passed), the
  ``admit`` row fires ``admit``, a waiting request that ends fires ``leave``, and a row that leaves
  the ``holding`` group (the KV lease given back) fires ``release``. The properties speak of the
  *requests* (R5.1.2: at most ``max_waiting_requests`` requests wait, at most ``max_sequences`` hold a
  lane, ...), with the counters' equality to what they count as the strengthening.

The runtime is bound to the same declaration by a monitor
(:mod:`calculet.runtime.scheduling.budget_monitor`): the controller's counters are a live
``AdmissionBudgetMachine`` valuation, and the declared invariants are evaluated on it after each
operation that grows a counter, at the monitors' sampled rate.
"""

from __future__ import annotations

from typing import Any

from calculet.logic.expr import And, If, Not, Or
from calculet.logic.types import Int
from calculet.machines.core import Machine
from calculet.machines.definition import Event, Invariant, Param, State, T, Var
from calculet.machines.request import RequestMachine, is_holding
from calculet.machines.system import NONE, Coupled, CoupledSystem, SystemInvariant

__all__ = ["AdmissionBudgetMachine", "AdmissionBudgetSystem", "BUDGET_PARAMS", "COUNTED_WAITING", "COUNTERS"]

BUDGET_PARAMS = ("max_sequences", "max_kv_tokens", "max_waiting_requests", "max_waiting_prompt_tokens")
"""The §5.1 ``CapacityBudget`` fields this machine enforces (``max_inflight_jobs``: JobLaneSystem)."""
COUNTERS = ("waiting", "waiting_tokens", "active", "active_kv")
"""The controller's counters, in AdmissionStatistics order (waiting_requests, waiting_prompt_tokens,
active_sequences, active_kv_tokens)."""


class AdmissionBudgetMachine(Machine):
    """The admission controller's budget: four counters, each grown only while its limit has room (§5.1, §5.2).

    ``accept`` is screening's last word on a request that may wait (RejectCapacity when the waiting
    queue or the waiting prompt tokens are full, R5.2.4); ``admit`` is the Admit outcome (the request
    stays queued while the active sequences or KV tokens are full, R5.2.2). ``leave`` and ``release``
    give budget back; their guards only say a counter never goes below what it counts.
    """

    spec = "§5.1, §5.2"
    examples = [dict(max_sequences=2, max_kv_tokens=16, max_waiting_requests=2, max_waiting_prompt_tokens=8),
                dict(max_sequences=1, max_kv_tokens=4, max_waiting_requests=1, max_waiting_prompt_tokens=2)]

    max_sequences = Param(Int(ge=1), doc="§5.1 max_sequences: admitted requests holding a KV lease")
    max_kv_tokens = Param(Int(ge=1), doc="§5.1 max_kv_tokens: prompt + max_new_tokens of every admitted request")
    max_waiting_requests = Param(Int(ge=1), doc="§5.1 max_waiting_requests")
    max_waiting_prompt_tokens = Param(Int(ge=1), doc="§5.1 max_waiting_prompt_tokens")

    waiting = Var(Int(ge=0), doc="requests accepted and not yet admitted or ended")
    waiting_tokens = Var(Int(ge=0), doc="their prompt tokens")
    active = Var(Int(ge=0), doc="admitted requests still holding their KV lease")
    active_kv = Var(Int(ge=0), doc="their KV need (prompt + max_new_tokens each)")

    open = State(initial=True, doc="the controller's one state: it counts")

    accept = Event("a request passed screening and waits (holds waiting budget)", prompt=Int(ge=1))
    leave = Event("a waiting request ended without admission (cancel, expiry, rejection, failure)", prompt=Int(ge=1))
    admit = Event("Admit (§5.2): the head of the queue gets its KV lease", prompt=Int(ge=1), need=Int(ge=2))
    admit_now = Event("Admit at once (§5.2): a request screened into a budget with room, nothing else waiting, "
                      "gets its KV lease without waiting first", prompt=Int(ge=1), need=Int(ge=2))
    release = Event("an admitted request gave its KV lease back", need=Int(ge=2))
    refuse = Event("screening refused a request (400 / 429 / 503): it never holds budget")

    transitions = [
        T(open, accept, open,
          guard=lambda v, prompt: And(v.waiting + 1 <= v.max_waiting_requests,
                                      v.waiting_tokens + prompt <= v.max_waiting_prompt_tokens),
          effect=lambda v, prompt: {"waiting": v.waiting + 1, "waiting_tokens": v.waiting_tokens + prompt},
          doc="R5.2.4: RejectCapacity (429) when the waiting queue or the waiting prompt tokens are full"),
        T(open, leave, open,
          guard=lambda v, prompt: And(v.waiting >= 1, v.waiting_tokens >= prompt),
          effect=lambda v, prompt: {"waiting": v.waiting - 1, "waiting_tokens": v.waiting_tokens - prompt}),
        T(open, admit, open,
          guard=lambda v, prompt, need: And(v.waiting >= 1, v.waiting_tokens >= prompt,
                                            v.active + 1 <= v.max_sequences, v.active_kv + need <= v.max_kv_tokens),
          effect=lambda v, prompt, need: {"waiting": v.waiting - 1, "waiting_tokens": v.waiting_tokens - prompt,
                                          "active": v.active + 1, "active_kv": v.active_kv + need},
          doc="R5.2.2: the request stays queued while the active sequences or the KV tokens are full"),
        T(open, admit_now, open,
          guard=lambda v, prompt, need: And(v.waiting + 1 <= v.max_waiting_requests,
                                            v.waiting_tokens + prompt <= v.max_waiting_prompt_tokens,
                                            v.active + 1 <= v.max_sequences, v.active_kv + need <= v.max_kv_tokens),
          effect=lambda v, prompt, need: {"active": v.active + 1, "active_kv": v.active_kv + need},
          doc="accept then admit as one step (issue #20): screening's waiting room (R5.2.4) and the active "
              "budget (R5.2.2) are both required; the waiting counters never move"),
        T(open, release, open,
          guard=lambda v, need: And(v.active >= 1, v.active_kv >= need),
          effect=lambda v, need: {"active": v.active - 1, "active_kv": v.active_kv - need}),
        T(open, refuse, open, doc="a refusal is always possible and changes no counter (§5.2)"),
    ]

    invariants = [
        Invariant("R5.1.2", name="waiting_within_max_waiting_requests",
                  rejects=({"max_waiting_requests": 1, "waiting": 2, "waiting_tokens": 2},),
                  doc="the waiting counter never passes max_waiting_requests",
                  predicate=lambda v: v.waiting <= v.max_waiting_requests),
        Invariant("R5.1.2", name="waiting_tokens_within_max_waiting_prompt_tokens",
                  rejects=({"max_waiting_prompt_tokens": 4, "waiting": 1, "waiting_tokens": 5},),
                  doc="the waiting prompt tokens never pass max_waiting_prompt_tokens",
                  predicate=lambda v: v.waiting_tokens <= v.max_waiting_prompt_tokens),
        Invariant("R5.1.2", name="active_within_max_sequences",
                  rejects=({"max_sequences": 1, "active": 2, "active_kv": 4},),
                  doc="admitted requests holding a KV lease never pass max_sequences",
                  predicate=lambda v: v.active <= v.max_sequences),
        Invariant("R5.1.2", name="active_kv_within_max_kv_tokens",
                  rejects=({"max_kv_tokens": 4, "active": 1, "active_kv": 5},),
                  doc="the KV tokens of the admitted requests never pass max_kv_tokens",
                  predicate=lambda v: v.active_kv <= v.max_kv_tokens),
    ]


# ------------------------------------------------------------------------------------------------
# requests × budgets

_REQ = RequestMachine.definition
_WAITING = _REQ.group("waiting")
_HOLDING = _REQ.group("holding")
_COUNTED_WAITING = tuple(sorted(_WAITING - {_REQ.initial}))  # accepted: left New for a waiting state
COUNTED_WAITING: frozenset[str] = frozenset(_COUNTED_WAITING)
"""The request states the ``waiting`` counters count (the runtime's recount reads the same set)."""


def _need(sys: Any, i: int) -> Any:
    """Request ``i``'s KV need as the controller counts it (admission.py: prompt + max_new_tokens)."""
    return sys.requests[i].prompt_tokens + sys.requests[i].max_new_tokens


def _waits(sys: Any, i: int, j: int) -> Any:
    return And(sys.bound(i, j), sys.requests[i].at(*_COUNTED_WAITING))


def _holds(sys: Any, i: int, j: int) -> Any:
    return And(sys.bound(i, j), is_holding(sys.requests[i]))


def _sum(sys: Any, j: int, counted: Any, value: Any) -> Any:
    """Σ ``value(i)`` over the requests ``counted(sys, i, j)`` by budget ``j``."""
    total: Any = 0
    for i in range(len(sys.requests)):
        total = total + If(counted(sys, i, j), value(i), 0)
    return total


def _per_budget(sys: Any, predicate: Any) -> Any:
    return And(*[predicate(j) for j in range(len(sys.lanes))])


def _request_steps() -> list[Coupled]:
    """One step per RequestMachine row, derived from the declaration (module doc)."""
    steps: list[Coupled] = []
    prompt = lambda sys, i, j: {"prompt": sys.requests[i].prompt_tokens}  # noqa: E731
    both = lambda sys, i, j: {"prompt": sys.requests[i].prompt_tokens, "need": _need(sys, i)}  # noqa: E731
    need = lambda sys, i, j: {"need": _need(sys, i)}  # noqa: E731
    counted = lambda sys, i, j: sys.bound(i, j)  # noqa: E731
    for t in _REQ.transitions:
        args = dict(_REQ.events[t.event].args)  # the event's own arguments, passed through
        if t.source == "new" and t.target in _WAITING:
            steps.append(Coupled(
                t.name, request=(t.name,), lane=("accept",), binding="bind", args=args, lane_args=prompt,
                guard=lambda sys, i, j: sys.unbound(i),
                doc="screening passed (AdmissionController.screen, then accept): the request holds waiting budget"))
        elif t.event == "admit":
            steps.append(Coupled(t.name, request=(t.name,), lane=("admit",), args=args, lane_args=both, guard=counted,
                                 doc="next_admissible + admitted: the waiting budget becomes active budget"))
        elif t.event == "admit_now":
            steps.append(Coupled(t.name, request=(t.name,), lane=("admit_now",), binding="bind", args=args,
                                 lane_args=both, guard=lambda sys, i, j: sys.unbound(i),
                                 doc="screening passed and admit_at_once: the request holds active budget at once"))
        elif t.source in _COUNTED_WAITING and t.target not in _WAITING and t.target not in _HOLDING:
            steps.append(Coupled(t.name, request=(t.name,), lane=("leave",), binding="unbind", args=args,
                                 lane_args=prompt, guard=counted,
                                 doc="leave_waiting: a waiting request ended; its waiting budget frees"))
        elif t.source in _HOLDING and t.target not in _HOLDING:
            steps.append(Coupled(t.name, request=(t.name,), lane=("release",), binding="unbind", args=args,
                                 lane_args=need, guard=counted,
                                 doc="released: the request gave its KV lease back; its active budget frees"))
        elif t.source == "new" and t.event == "reject":
            steps.append(Coupled(t.name, request=(t.name,), lane=("refuse",), involves="both", args=args,
                                 guard=lambda sys, i, j: sys.unbound(i),
                                 doc="screening refused the request (AdmissionController.screen): no budget counts it"))
        elif t.source == "new":
            steps.append(Coupled(t.name, request=(t.name,), args=args, guard=lambda sys, i, j: sys.unbound(i),
                                 doc="a request that never passed screening ends; no budget counted it"))
        else:
            steps.append(Coupled(t.name, request=(t.name,), args=args))
    return steps


class AdmissionBudgetSystem(CoupledSystem):
    """Requests counted by the admission budget: at most max_waiting_requests requests wait, their
    prompts total at most max_waiting_prompt_tokens, at most max_sequences admitted requests hold a
    KV lease and their KV need totals at most max_kv_tokens (R5.1.2), because the budget's counters
    are exactly what they count and grow only within the budget."""

    spec = "§5.1, §5.2"
    # Every step is taken on a run of at most 7 steps from the initial system (a decode completion's rows
    # need bind, admit, a prefill and a decode job first): 0.7 s of CPU by the explicit-state search.
    reach_depth = 8
    bmc_size = (2, 1)   # two requests against one budget: a limit of 1 is passed by the second
    # The bounded search's depth cap (verify's full run otherwise searches 8): every budget bug passes a limit
    # of 1 within 4 steps (accept, accept, admit, admit); at 2 requests x 1 budget, depth 6 took 3.1 s of CPU
    # and depth 8 took 25 s (3 requests at depth 8: over 100 s), beyond the full run's 90 s budget.
    bmc_depth = 6
    fast_bmc = False    # verify --fast keeps the proofs (induction, vacuity); the full run searches
    request = RequestMachine
    lane = AdmissionBudgetMachine
    steps = _request_steps()

    invariants = [
        SystemInvariant(
            "R5.1.2", "waiting_requests_within_budget", counts=True,
            predicate=lambda sys: _per_budget(sys, lambda j: _sum(sys, j, _waits, lambda i: 1)
                                              <= sys.lanes[j].max_waiting_requests),
            doc="at most max_waiting_requests accepted requests wait for admission (R5.2.4: the next one gets 429)",
            rejects=({"requests": [{"state": "waiting_admission", "generation": 1},
                                   {"state": "waiting_model"}],
                      "lanes": [{"max_waiting_requests": 1, "waiting": 2, "waiting_tokens": 2}],
                      "binding": [0, 0]},)),
        SystemInvariant(
            "R5.1.2", "waiting_prompt_tokens_within_budget", counts=True,
            predicate=lambda sys: _per_budget(sys, lambda j: _sum(
                sys, j, _waits, lambda i: sys.requests[i].prompt_tokens) <= sys.lanes[j].max_waiting_prompt_tokens),
            doc="the waiting requests' prompt tokens total at most max_waiting_prompt_tokens",
            rejects=({"requests": [{"state": "waiting_model", "prompt_tokens": 5}],
                      "lanes": [{"max_waiting_prompt_tokens": 4, "waiting": 1, "waiting_tokens": 5}],
                      "binding": [0]},)),
        SystemInvariant(
            "R5.1.2", "active_sequences_within_budget", counts=True,
            predicate=lambda sys: _per_budget(sys, lambda j: _sum(sys, j, _holds, lambda i: 1)
                                              <= sys.lanes[j].max_sequences),
            doc="at most max_sequences admitted requests hold a KV lease (beyond the pool's lane count)",
            rejects=({"requests": [{"state": "prefill_ready", "generation": 1},
                                   {"state": "decode_ready", "generation": 1, "generated_tokens": 1,
                                    "kv_length": 2, "prompt_tokens": 2}],
                      "lanes": [{"max_sequences": 1, "active": 2, "active_kv": 4}], "binding": [0, 0]},)),
        SystemInvariant(
            "R5.1.2", "active_kv_tokens_within_budget", counts=True,
            predicate=lambda sys: _per_budget(sys, lambda j: _sum(sys, j, _holds, lambda i: _need(sys, i))
                                              <= sys.lanes[j].max_kv_tokens),
            doc="the admitted requests' KV need (prompt + max_new_tokens each) totals at most max_kv_tokens",
            rejects=({"requests": [{"state": "prefill_ready", "generation": 1, "prompt_tokens": 3,
                                    "max_new_tokens": 3}],
                      "lanes": [{"max_kv_tokens": 4, "active": 1, "active_kv": 6}], "binding": [0]},)),
        SystemInvariant(
            "R5.1.2", "counted_exactly_while_waiting_or_holding",
            predicate=lambda sys: sys.all_requests(lambda i: Not(sys.unbound(i)) == Or(
                sys.requests[i].at(*_COUNTED_WAITING), is_holding(sys.requests[i]))),
            doc="a request is counted from screening until it is admitted and gives its lease back, or ends "
                "waiting; never before screening, never after",
            rejects=({"requests": [{"state": "prefill_ready", "generation": 1}], "binding": [NONE]},
                     {"requests": [{"state": "completed", "generation": 1, "closes": 1, "finish_reason": 1,
                                    "generated_tokens": 1, "kv_length": 2}], "binding": [0]})),
        # Strengthening the solver forced.
        SystemInvariant(
            "R5.1.2", "counters_are_the_counted_requests", counts=True,
            predicate=lambda sys: _per_budget(sys, lambda j: And(
                sys.lanes[j].waiting == _sum(sys, j, _waits, lambda i: 1),
                sys.lanes[j].waiting_tokens == _sum(sys, j, _waits, lambda i: sys.requests[i].prompt_tokens),
                sys.lanes[j].active == _sum(sys, j, _holds, lambda i: 1),
                sys.lanes[j].active_kv == _sum(sys, j, _holds, lambda i: _need(sys, i)))),
            doc="each counter is exactly what it stands for: the accepted waiting requests, their prompts, the "
                "admitted requests holding a lease, their KV need",
            strengthening="the budget guards read the counters, so the bounds over requests hold only while the "
                          "counters count them (accept broke waiting_requests_within_budget from a state whose "
                          "counter was below the requests it counts)",
            rejects=({"requests": [{"state": "waiting_model"}], "binding": [0]},
                     {"requests": [{"state": "prefill_ready", "generation": 1}], "binding": [0],
                      "lanes": [{"active": 1, "active_kv": 3}]})),
    ]

