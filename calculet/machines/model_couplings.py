"""Model generations coupled with what they count: pinned requests and device jobs (#17; §10, §12, §14).

``ModelMachine`` keeps one counter, ``active_requests`` (R10.2), and its unload waits for it and for the
generation's jobs on the device to reach zero (R12.3); on its own the machine cannot say what it counts. These
two coupled systems put the generation next to the instances it counts, in the shape of
:class:`~calculet.machines.system.CoupledSystem` (the ``lane`` role is the generation, the binding is
"counted by"):

* :class:`GenerationRequestSystem` — R requests × G generations. ``binding[i] = g`` while request
  ``i`` is pinned to generation ``g`` and not terminal: ``bind`` fires the request's ``bind`` and
  the generation's ``acquire`` in one step; every row that ends a pinned request fires the
  generation's ``release_request`` in the same step (what ``ModelManager.on_request_transition``
  does on the engine's actor). The generation's ``inflight`` arguments are free here (no jobs).
* :class:`GenerationJobSystem` — R device jobs × G generations. ``binding[i] = g`` while job
  ``i`` of generation ``g`` is on the device (submitted, timed out or quarantined): ``submit``
  binds a job of a Ready or Draining generation, every end of a job unbinds it. The generation
  keeps no count of them (issue #20: ``job_submitted``/``job_finished`` were two events per decoded
  token): the events whose guards need it (``drain``, ``drained``, ``drain_deadline``,
  ``recovered``, ``resume_unload``) take it as their ``inflight`` argument, which a step guard here holds
  to the number of jobs bound to the generation — what the runtime's jobs table, their one owner, gives
  (``runtime/models/generations.py`` ``jobs_on_device``). A timeout or CCU fault of a job moves its
  generation to Recovering (``GenerationRecovery.on_fault``); once recovery gave up (Failed) a job
  still on the device may still time out or fault, and stays in doubt until it ends. A device reset
  ends every job on the device (``reset_done`` per job); ``recovered`` needs none left.

The requests system's counting invariant is a sum over every request (declared ``counts=True``):
not of the ∀-shape that makes the requests × lanes induction hold for every size
(``system_checks``). Its sum, and the jobs count the ``inflight`` guards read, go through
``SystemView.beyond`` (``_count``), so the induction proves them for every size with the part of
each count over the instances not encoded as a ghost that no step changes (the argument is in
``calculet/invariants/system_induction.py``); the runtime also checks the request count on the
live instances (``ModelManager.counter_faults``).
"""

from __future__ import annotations

from calculet.logic.expr import And, If, Implies, Not, Or
from calculet.machines.job import DeviceJobMachine, JobEngine
from calculet.machines.model import ModelMachine
from calculet.machines.request import RequestMachine, is_holding, is_terminal
from calculet.machines.system import NONE, Coupled, CoupledSystem, SystemInvariant

__all__ = ["ON_DEVICE", "GenerationJobSystem", "GenerationRequestSystem"]


def _count(sys, j):
    """How many of the system's requests (or jobs) the binding counts on generation ``j``: those in
    view, and those beyond it (``SystemView.beyond``: 0 on a live or fully encoded system)."""
    total = sys.beyond(("bound to", j))
    for i in range(len(sys.requests)):
        total = total + If(sys.bound(i, j), 1, 0)
    return total


# ------------------------------------------------------------------------------------------------
# requests × generations

_REQ = RequestMachine.definition
LIVE = ("ready", "draining", "recovering", "failed")
"""The generation states a request may be pinned to and a job may be on the device in: from Ready until the
generation is idle and unloads (its buffers exist)."""
_UNPINNED = frozenset({"new", "waiting_model"})  # RequestMachine.pinned_exactly_after_bind: generation == 0
PINNING_EVENTS = ("bind", "admit_now")
"""The request events that pin a request to the Ready generation, which counts it (``acquire``): the coupling
below and the runtime's counter (``ModelManager.on_request_transition``) read them here."""


def _request_steps() -> list[Coupled]:
    """One step per request row, derived from the declaration: ``bind`` also acquires, a row that
    ends a pinned request also releases, every other row moves the request alone."""
    steps: list[Coupled] = []
    terminal = _REQ.group("terminal")
    for t in _REQ.transitions:
        args = dict(_REQ.events[t.event].args)  # the event's own arguments, passed through as step arguments
        if t.event in PINNING_EVENTS:  # both pin the request to the Ready generation
            steps.append(Coupled(
                t.name, request=(t.name,), lane=("acquire@ready",), binding="bind",
                request_args=lambda sys, i, j: {"gen": sys.lanes[j].generation},
                doc="the request is pinned to the Ready generation and counted by it (§10, R10.3, R12.2)"))
        elif t.target in terminal and t.source not in _UNPINNED:
            steps.append(Coupled(
                t.name, request=(t.name,), lane=("release_request",), binding="unbind", args=args,
                guard=lambda sys, i, j: sys.bound(i, j),
                doc="a pinned request ends and its generation stops counting it in the same step"))
        elif t.target in terminal:
            steps.append(Coupled(t.name, request=(t.name,), guard=lambda sys, i, j: sys.unbound(i), args=args,
                                 doc="a request that was never pinned ends; no generation counted it"))
        else:
            steps.append(Coupled(t.name, request=(t.name,), args=args))
    return steps


def _model_steps(coupled_events: tuple[str, ...], count=None) -> list[Coupled]:
    """Every ModelMachine row whose event the system does not couple, moving the generation alone.

    ``count(sys, j)``: the count of generation ``j``'s jobs on the device that the system knows. A row whose
    event takes an ``inflight`` argument then fires only with that count (a step guard: the runtime hands the
    jobs table's count, ``Generation.inflight``); the argument itself passes through unchanged, so the step's
    effect reads only what it moves (the every-size induction's projection, ``system_induction``). None: the
    argument is free (a system without jobs: any count)."""
    events = ModelMachine.definition.events
    counted = None if count is None else (lambda sys, i, j, inflight: inflight == count(sys, j))
    steps = []
    for t in ModelMachine.definition.transitions:
        if t.event in coupled_events:
            continue
        args = dict(events[t.event].args)
        guard = counted if counted is not None and "inflight" in args else None
        steps.append(Coupled(f"model:{t.name}", lane=(t.name,), args=args, guard=guard))
    return steps


class GenerationRequestSystem(CoupledSystem):
    """Requests pinned to model generations: ``active_requests`` is exactly the live pinned requests.

    Proved properties: the counter equals its requests (R10.2, R12.3), a pinned request names
    its generation (R10.3), no request is pinned to a generation that is not serving or draining
    (R12.3: unload starts only once none is left), and a request still holding KV keeps its
    generation's device resources alive (R12.5: sequences are freed before the pools and buffers).
    """

    spec = "§10, §12"
    # Reachability of every step needs runs of 11 steps (Ready after 4, a decode completion 6 steps
    # later, the close after it). The symbolic unrolling to that depth took 24 s of CPU at R = L = 1;
    # the explicit-state search (invariants/explicit_reach.py) finds every run in under a second, so
    # verify --fast checks it too. This depth is the symbolic search's, for a step the explicit one
    # does not reach (then it proves the step unreachable within 12 steps, or finds its run).
    reach_depth = 12
    bmc_size = (2, 1)  # two requests on one generation: the counter's bugs need no second generation
    fast_bmc = False   # verify --fast keeps the proofs (induction) within its CPU budget; the full run searches
    request = RequestMachine
    lane = ModelMachine
    steps = [*_request_steps(), *_model_steps(("acquire", "release_request"))]

    invariants = [
        SystemInvariant(
            "R10.2", "active_requests_are_the_pinned_live_requests", counts=True,
            predicate=lambda sys: And(*[sys.lanes[j].active_requests == _count(sys, j)
                                        for j in range(len(sys.lanes))]),
            doc="each generation's active_requests counts exactly the requests pinned to it and not yet "
                "terminal (R10.2's counter; R12.3 waits for it to reach zero)",
            rejects=({"requests": [{"state": "prefill_ready", "generation": 1}], "lanes": [{"state": "ready"}],
                      "binding": [0]},
                     {"requests": [{"state": "new"}], "lanes": [{"state": "ready", "active_requests": 1}],
                      "binding": [NONE]})),
        SystemInvariant(
            "R10.3", "pinned_request_names_its_generation",
            predicate=lambda sys: sys.all_pairs(lambda i, j: Implies(
                sys.bound(i, j), sys.requests[i].generation == sys.lanes[j].generation)),
            doc="a counted request carries the id of the generation that counts it",
            rejects=({"requests": [{"state": "waiting_admission", "generation": 2}],
                      "lanes": [{"state": "ready", "generation": 1, "active_requests": 1, "buffers": True}],
                      "binding": [0]},)),
        SystemInvariant(
            "R12.3", "requests_pinned_only_to_a_live_generation",
            predicate=lambda sys: sys.all_pairs(lambda i, j: Implies(
                sys.bound(i, j), sys.lanes[j].at(*LIVE))),
            doc="no request is pinned to a generation that is loading, cleaning up or unloaded: the unload's "
                "cleanup begins only once every pinned request ended",
            rejects=({"requests": [{"state": "decode_ready", "generation": 1}],
                      "lanes": [{"state": "unloading", "active_requests": 1}], "binding": [0]},)),
        SystemInvariant(
            "R12.5", "holding_request_keeps_its_generations_buffers",
            predicate=lambda sys: sys.all_pairs(lambda i, j: Implies(
                And(sys.bound(i, j), is_holding(sys.requests[i])), sys.lanes[j].buffers)),
            doc="while a request still holds a KV lane of its generation, the generation's pools and buffers "
                "exist: sequences are freed before pools and buffers are destroyed (§12 steps 5–6)",
            rejects=({"requests": [{"state": "decode_ready", "generation": 1}],
                      "lanes": [{"state": "ready", "active_requests": 1, "buffers": False}], "binding": [0]},)),
        SystemInvariant(
            "R10.2", "counted_exactly_while_pinned_and_live",
            predicate=lambda sys: sys.all_requests(lambda i: Not(sys.unbound(i)) == And(
                sys.requests[i].generation >= 1, Not(is_terminal(sys.requests[i])))),
            doc="a request is counted from its bind until its terminal state, and never otherwise",
            rejects=({"requests": [{"state": "completed", "generation": 1, "closes": 1,
                                    "finish_reason": 1, "generated_tokens": 1, "kv_length": 2}],
                      "lanes": [{"state": "ready", "active_requests": 1, "buffers": True}], "binding": [0]},)),
    ]


# ------------------------------------------------------------------------------------------------
# device jobs × generations

ON_DEVICE = ("submitted", "timed_out", "quarantined")
"""The DeviceJobMachine states of a job the device may still write (its buffers held after it was submitted): the
jobs the binding counts, and those the runtime counts into the generation's ``inflight`` arguments."""
_IN_DOUBT = ("timed_out", "quarantined")


def _engine_free(sys, i):
    """No other job on the device runs on job ``i``'s engine (§14: one engine per job, PING or PONG)."""
    return And(*[Or(sys.unbound(k), sys.requests[k].engine != sys.requests[i].engine)
                 for k in range(len(sys.requests)) if k != i])


SERVING = ("ready", "draining")
"""The generation states that take a new job (``ModelManager.may_submit``: Ready, or Draining what was pinned)."""


def _job_steps() -> list[Coupled]:
    ok = dict(DeviceJobMachine.definition.events["complete"].args)
    on = lambda sys, i, j: sys.bound(i, j)  # noqa: E731 — the job is counted by this generation
    given_up_or_recovering = lambda sys, i, j: And(sys.bound(i, j), sys.lanes[j].at("recovering", "failed"))  # noqa: E731
    return [
        Coupled("submit", request=("submit@prepared",), involves="both", binding="bind",
                guard=lambda sys, i, j: And(sys.unbound(i), sys.requests[i].generation == sys.lanes[j].generation,
                                            sys.lanes[j].at(*SERVING), _engine_free(sys, i)),
                doc="the device accepted a job of a generation that takes new jobs (Ready, or Draining what was "
                    "pinned: ModelManager.may_submit): the generation counts it from now on (R10.2); it runs on an "
                    "engine no other job on the device uses (§14)"),
        Coupled("submit_rejected", request=("submit_rejected@prepared",), guard=lambda sys, i, j: sys.unbound(i)),
        Coupled("complete_ok", request=("complete_ok",), involves="both", binding="unbind", guard=on, args=ok),
        Coupled("complete_error", request=("complete_error",), involves="both", binding="unbind", guard=on, args=ok),
        Coupled("timeout", request=("timeout@submitted",), lane=("fault",), guard=on,
                doc="a timed-out job leaves the device in doubt: its generation goes Recovering (on_fault)"),
        Coupled("timeout_while_recovering", request=("timeout@submitted",), involves="both", guard=given_up_or_recovering,
                doc="the generation is already Recovering, or Failed (recovery gave up: no fault is reported any "
                    "more, the job stays in doubt until it ends)"),
        Coupled("fault", request=("fault@submitted",), lane=("fault",), guard=on),
        Coupled("fault_while_recovering", request=("fault@submitted",), involves="both", guard=given_up_or_recovering),
        Coupled("quarantine", request=("quarantine@timed_out",)),
        Coupled("late_complete", request=("late_complete",), involves="both", binding="unbind", guard=on),
        Coupled("reset_done", request=("reset_done@quarantined",), involves="both", binding="unbind", guard=on,
                doc="a device reset ends this job (one of the jobs the reset ends)"),
    ]


class GenerationJobSystem(CoupledSystem):
    """Device jobs of a generation, on PING/PONG: the jobs on the device (the binding) are what the generation's
    guards count (the ``inflight`` argument, wired to the count here as the runtime's jobs table gives it), a job
    is on the device only while its generation is live and keeps its buffers, at most one job per engine (so at
    most two in flight), and a job in doubt only while its generation is Recovering (Ready again only once none
    is left)."""

    spec = "§10, §12, §14, §15"
    bmc_size = (2, 2)  # two jobs (an engine conflict), two generations (a job counted by the wrong one)
    fast_bmc = False
    request = DeviceJobMachine
    lane = ModelMachine
    steps = [*_job_steps(), *_model_steps((), count=_count)]

    invariants = [
        SystemInvariant(
            "R12.3", "jobs_only_on_a_live_generation",
            predicate=lambda sys: sys.all_pairs(lambda i, j: Implies(sys.bound(i, j), sys.lanes[j].at(*LIVE))),
            doc="a job the device may still write belongs to a generation between Ready and its unload: none before "
                "Ready (R12.9), none once the cleanup began (R12.3: drained, resume_unload and an unload of a Failed "
                "generation wait for the jobs table's count of them to reach zero)",
            rejects=({"requests": [{"state": "submitted"}], "lanes": [{"state": "unloading", "buffers": True}],
                      "binding": [0]},
                     {"requests": [{"state": "timed_out"}], "lanes": [{"state": "warming", "buffers": True}],
                      "binding": [0]})),
        SystemInvariant(
            "R12.10", "job_on_the_device_keeps_its_generations_buffers",
            predicate=lambda sys: sys.all_pairs(lambda i, j: Implies(sys.bound(i, j), sys.lanes[j].buffers)),
            doc="while any job of a generation is in flight its buffers exist (a forced delete is not a cancel), so "
                "no step frees them while one is (R12.11)",
            rejects=({"requests": [{"state": "submitted"}], "lanes": [{"state": "ready", "buffers": False}],
                      "binding": [0]},)),
        SystemInvariant(
            "R14.3", "one_engine_per_job_on_the_device",
            predicate=lambda sys: And(*[Implies(And(Not(sys.unbound(i)), Not(sys.unbound(k))),
                                                sys.requests[i].engine != sys.requests[k].engine)
                                        for i in range(len(sys.requests)) for k in range(i + 1, len(sys.requests))]),
            doc="two jobs on the device never share an engine (PING/PONG): at most two jobs are in flight, each "
                "with its own buffers (§14)",
            rejects=({"requests": [{"state": "submitted", "engine": JobEngine.PING},
                                   {"state": "submitted", "engine": JobEngine.PING}],
                      "lanes": [{"state": "ready", "buffers": True}], "binding": [0, 0]},)),
        SystemInvariant(
            "R12.10", "job_in_doubt_only_while_recovering",
            predicate=lambda sys: sys.all_pairs(lambda i, j: Implies(
                And(sys.bound(i, j), sys.requests[i].at(*_IN_DOUBT)), sys.lanes[j].at("recovering", "failed"))),
            doc="a job the device may still write after a timeout or fault keeps its generation Recovering (or "
                "Failed, once recovery gave up with it still in doubt): the generation is Ready (or Draining) "
                "again only once no job of it is in doubt",
            rejects=({"requests": [{"state": "timed_out"}],
                      "lanes": [{"state": "ready", "buffers": True}], "binding": [0]},
                     {"requests": [{"state": "quarantined"}],
                      "lanes": [{"state": "draining", "buffers": True, "unload_pending": True}],
                      "binding": [0]})),
        SystemInvariant(
            "R10.3", "job_names_its_generation",
            predicate=lambda sys: sys.all_pairs(lambda i, j: Implies(
                sys.bound(i, j), sys.requests[i].generation == sys.lanes[j].generation)),
            doc="a job counted by a generation carries that generation's id (§4: every callback carries it)",
            rejects=({"requests": [{"state": "submitted", "generation": 2}],
                      "lanes": [{"state": "ready", "generation": 1, "buffers": True}],
                      "binding": [0]},)),
        SystemInvariant(
            "R10.2", "counted_exactly_while_on_the_device",
            predicate=lambda sys: sys.all_requests(lambda i: Not(sys.unbound(i)) == sys.requests[i].at(*ON_DEVICE)),
            doc="a job is counted from its submission until it completes, fails or a reset ends it",
            rejects=({"requests": [{"state": "completed", "delivered": 1, "buffers_held": False}],
                      "lanes": [{"state": "ready", "buffers": True}], "binding": [0]},)),
    ]
