"""Model generations coupled with what they count: pinned requests and device jobs (#17; §10, §12, §14).

``ModelMachine`` keeps two counters, ``active_requests`` and ``inflight_jobs`` (R10.2), and the
unload waits for both to reach zero (R12.3); on its own the machine cannot say they count
anything. These two coupled systems put each counter next to the instances it counts, in the
shape of :class:`~calculet.machines.system.CoupledSystem` (the ``lane`` role is the generation,
the binding is "counted by"):

* :class:`GenerationRequestSystem` — R requests × G generations. ``binding[i] = g`` while request
  ``i`` is pinned to generation ``g`` and not terminal: ``bind`` fires the request's ``bind`` and
  the generation's ``acquire`` in one step; every row that ends a pinned request fires the
  generation's ``release_request`` in the same step (what ``ModelManager.on_request_transition``
  does on the engine's actor).
* :class:`GenerationJobSystem` — R device jobs × G generations. ``binding[i] = g`` while job
  ``i`` of generation ``g`` is on the device (submitted, timed out or quarantined): ``submit``
  fires the job's ``submit`` and ``job_submitted``; every end of a job fires ``job_finished``
  (``engine/jobs.py``). A timeout or CCU fault of a job moves its generation to Recovering
  (``GenerationRecovery.on_fault``); once recovery gave up (Failed) a job still on the device may
  still time out or fault, and stays in doubt until it ends. A device reset ends every job on the device; here it is the
  sequence of those ends (``reset_done`` and ``job_finished`` per job) followed by the
  generation's ``reset``, which the step guard lets fire only once nothing is left in flight —
  the runtime does the same in one actor step (``executor.forget_all`` then ``on_jobs_discarded``).

Both systems' counting invariants are sums over every request/job (declared ``counts=True``):
not of the ∀-shape that makes the requests × lanes induction hold for every size
(``system_checks``). Their sums go through ``SystemView.beyond`` (``_count``), so the induction
proves them for every size with the part of each count over the instances not encoded as a ghost
that no step changes (the argument is in ``calculet/invariants/system_induction.py``); the runtime
also checks the same equalities on the live instances (``ModelManager.counter_faults``).
"""

from __future__ import annotations

from calculet.logic.expr import And, If, Implies, Not, Or
from calculet.machines.job import DeviceJobMachine, JobEngine
from calculet.machines.model import ModelMachine
from calculet.machines.request import RequestMachine, is_holding, is_terminal
from calculet.machines.system import NONE, Coupled, CoupledSystem, SystemInvariant

__all__ = ["GenerationJobSystem", "GenerationRequestSystem"]


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


def _model_steps(coupled_events: tuple[str, ...], guards: dict | None = None) -> list[Coupled]:
    """Every ModelMachine row whose event the system does not couple, moving the generation alone."""
    guards = guards or {}
    events = ModelMachine.definition.events
    return [Coupled(f"model:{t.name}", lane=(t.name,), guard=guards.get(t.name), args=dict(events[t.event].args))
            for t in ModelMachine.definition.transitions if t.event not in coupled_events]


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
                sys.bound(i, j), sys.lanes[j].at("ready", "draining", "recovering", "failed"))),
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

_ON_DEVICE = ("submitted", "timed_out", "quarantined")
_IN_DOUBT = ("timed_out", "quarantined")


def _engine_free(sys, i):
    """No other job on the device runs on job ``i``'s engine (§14: one engine per job, PING or PONG)."""
    return And(*[Or(sys.unbound(k), sys.requests[k].engine != sys.requests[i].engine)
                 for k in range(len(sys.requests)) if k != i])


def _job_steps() -> list[Coupled]:
    finished = ("job_finished",)
    ok = dict(DeviceJobMachine.definition.events["complete"].args)
    on = lambda sys, i, j: sys.bound(i, j)  # noqa: E731 — the job is counted by this generation
    given_up_or_recovering = lambda sys, i, j: And(sys.bound(i, j), sys.lanes[j].at("recovering", "failed"))  # noqa: E731
    return [
        Coupled("submit", request=("submit@prepared",), lane=("job_submitted",), binding="bind",
                guard=lambda sys, i, j: And(sys.unbound(i), sys.requests[i].generation == sys.lanes[j].generation,
                                            _engine_free(sys, i)),
                doc="the device accepted the job: its generation counts it (R10.2); it runs on an engine no "
                    "other job on the device uses (§14)"),
        Coupled("submit_rejected", request=("submit_rejected@prepared",), guard=lambda sys, i, j: sys.unbound(i)),
        Coupled("complete_ok", request=("complete_ok",), lane=finished, binding="unbind", guard=on, args=ok),
        Coupled("complete_error", request=("complete_error",), lane=finished, binding="unbind", guard=on, args=ok),
        Coupled("timeout", request=("timeout@submitted",), lane=("fault",), guard=on,
                doc="a timed-out job leaves the device in doubt: its generation goes Recovering (on_fault)"),
        Coupled("timeout_while_recovering", request=("timeout@submitted",), involves="both", guard=given_up_or_recovering,
                doc="the generation is already Recovering, or Failed (recovery gave up: no fault is reported any "
                    "more, the job stays in doubt until it ends)"),
        Coupled("fault", request=("fault@submitted",), lane=("fault",), guard=on),
        Coupled("fault_while_recovering", request=("fault@submitted",), involves="both", guard=given_up_or_recovering),
        Coupled("quarantine", request=("quarantine@timed_out",)),
        Coupled("late_complete", request=("late_complete",), lane=finished, binding="unbind", guard=on),
        Coupled("reset_done", request=("reset_done@quarantined",), lane=finished, binding="unbind", guard=on,
                doc="a device reset ends this job (one of the jobs the reset ends)"),
    ]


class GenerationJobSystem(CoupledSystem):
    """Device jobs counted by their generation, on PING/PONG: ``inflight_jobs`` is exactly the
    generation's jobs on the device, at most one job per engine (so at most two in flight), and a
    job in doubt only while its generation is Recovering (Ready again only once none is left)."""

    spec = "§10, §12, §14, §15"
    bmc_size = (2, 2)  # two jobs (an engine conflict), two generations (a job counted by the wrong one)
    fast_bmc = False
    request = DeviceJobMachine
    lane = ModelMachine
    steps = [*_job_steps(),
             *_model_steps(("job_submitted", "job_finished"),
                           {"reset@recovering": lambda sys, i, j: sys.lanes[j].inflight_jobs == 0,
                            "reset@failed": lambda sys, i, j: sys.lanes[j].inflight_jobs == 0})]

    invariants = [
        SystemInvariant(
            "R10.2", "inflight_jobs_are_the_generations_jobs_on_the_device", counts=True,
            predicate=lambda sys: And(*[sys.lanes[j].inflight_jobs == _count(sys, j)
                                        for j in range(len(sys.lanes))]),
            doc="each generation's inflight_jobs counts exactly its jobs the device may still write "
                "(R10.2's counter; R12.3 waits for it to reach zero)",
            rejects=({"requests": [{"state": "submitted"}], "lanes": [{"state": "ready", "buffers": True}],
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
                      "lanes": [{"state": "ready", "inflight_jobs": 2, "buffers": True}], "binding": [0, 0]},)),
        SystemInvariant(
            "R12.10", "job_in_doubt_only_while_recovering",
            predicate=lambda sys: sys.all_pairs(lambda i, j: Implies(
                And(sys.bound(i, j), sys.requests[i].at(*_IN_DOUBT)), sys.lanes[j].at("recovering", "failed"))),
            doc="a job the device may still write after a timeout or fault keeps its generation Recovering (or "
                "Failed, once recovery gave up with it still in doubt): the generation is Ready (or Draining) "
                "again only once no job of it is in doubt",
            rejects=({"requests": [{"state": "timed_out"}],
                      "lanes": [{"state": "ready", "inflight_jobs": 1, "buffers": True}], "binding": [0]},
                     {"requests": [{"state": "quarantined"}],
                      "lanes": [{"state": "draining", "inflight_jobs": 1, "buffers": True, "unload_pending": True}],
                      "binding": [0]})),
        SystemInvariant(
            "R10.3", "job_names_its_generation",
            predicate=lambda sys: sys.all_pairs(lambda i, j: Implies(
                sys.bound(i, j), sys.requests[i].generation == sys.lanes[j].generation)),
            doc="a job counted by a generation carries that generation's id (§4: every callback carries it)",
            rejects=({"requests": [{"state": "submitted", "generation": 2}],
                      "lanes": [{"state": "ready", "generation": 1, "inflight_jobs": 1, "buffers": True}],
                      "binding": [0]},)),
        SystemInvariant(
            "R10.2", "counted_exactly_while_on_the_device",
            predicate=lambda sys: sys.all_requests(lambda i: Not(sys.unbound(i)) == sys.requests[i].at(*_ON_DEVICE)),
            doc="a job is counted from its submission until it completes, fails or a reset ends it",
            rejects=({"requests": [{"state": "completed", "delivered": 1, "buffers_held": False}],
                      "lanes": [{"state": "ready", "inflight_jobs": 1, "buffers": True}], "binding": [0]},)),
    ]
