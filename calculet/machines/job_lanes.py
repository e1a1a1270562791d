"""Device jobs × KV lanes (#17; §9.2, §14, R14.3/R14.4): each in-flight job has its own KV transaction.

§14 runs up to two jobs at once (PING/PONG), each with its own buffers (R14.3) and its own KV
transaction (R14.4: "a fault in one in-flight job rolls back or marks Unknown only the KV of its
own lanes"). Neither :class:`DeviceJobMachine` nor :class:`KvSequenceMachine` can say which lanes
a job writes, so this coupled system puts them side by side, in the shape of
:class:`~calculet.machines.system.CoupledSystem` — with the roles the other way round from
``RequestLaneSystem``: the ``request`` role is the KV lane (R instances) and the ``lane`` role is
the device job (L instances), because the binding is a function and a lane belongs to at most one
job's batch while a job has many lanes.

``binding[i] = j``: lane ``i``'s step is job ``j``'s, open from the moment the device accepts the
job with the lane in its batch (``enlist``: no lane event, the binding is the open transaction —
the lane has no Updating state, #20) until it settles by *its own* job's answer: ``commit(tokens)``
after a completion in time — or, with lane-level isolation (R7.4.6), a good lane of a job that failed with a device
error or was quarantined by a CCU fault its completion reported (``fault_reported``) — (the
binding dropped), nothing kept after an error or invalid output
(``abort``: only the binding dropped, no lane event), Unknown after a timeout, a fault or a lane
whose result is not known (R7.4.5 a device error fails the whole batch; R7.4.6 a lane the device
reports failed; R7.4.2 a result whose tags do not match the lane) — the binding kept, so recovery
knows which job may still write the lane (``recover`` drops it once that job ended). The job's
buffers are reclaimed after a timeout (``late_complete``, ``reset_done``) only once none of its
lanes still has its step open and working. The batch's lanes enlist one step each while the job
is Submitted: the model allows every interleaving of those steps, more runs than the runtime's
single step, so what is proved of it holds of the runtime's.

What no state can say is a *step property* (``step_properties``): both states of a lane committed
while its job is still on the device satisfy every invariant here (there is no in-flight lane state
to contradict), so "a lane commits only after its own job answered" and "a lane's step closes
only once its job answered" are properties of (before, step, after), proved by the same induction.

*Answered* (R7.4.6, decided in session 19): the job ended — completed, or failed (a device error in time; or after
a timeout, when no working lane of it has its step open) — or its completion in time reported a CCU fault / unknown
DMA (quarantined, ``DeviceJobMachine.fault_reported``). With lane-level isolation the runtime commits the lanes
the device did not report failed in both of the last two cases (``apply.py``; the simulator's isolated fault is
a CCU fault on chosen lanes, tests/integration/engine/test_lane_isolation.py), and the model describes what the
runtime does rather than the runtime firing ``complete(ok=True)`` for a failed job (which would misstate the job
counts). Main's model (and this branch until 559d3f7) had "completed" only; the state-only monitor could not
see the runtime step outside it, the step check at the lane's commit did. A job quarantined after a *timeout* has
not answered: its lanes are only marked Unknown.

Between two steps of the runtime's actor — where its monitor
(:mod:`calculet.runtime.scheduling.job_lane_monitor`) evaluates these invariants on the live jobs and
lanes — one more thing holds, declared here as :data:`SETTLED_AT_STEP_END`: no job that answered leaves a lane
of its batch with its step open (the runtime settles every lane of a job in the step that ends it). The model
splits that step into one event per lane, so the property is false between those events and is no
invariant of the induction; only the monitor, at step ends, checks it.

R5.1.2's in-flight budget is a property here too: at most ``MAX_INFLIGHT`` jobs hold a device slot
(a job in doubt keeps its slot), because the planner submits only while one is free.

The step guards read other instances (which lanes of a job still have their step open, how many jobs hold a
slot) and the budget counts every job (through ``SystemView.beyond``), so the induction at 3 lanes ×
3 jobs gives the jobs beyond them a ghost count and holds for every number of lanes and jobs
(argument in ``calculet/invariants/system_induction.py``); bounded model checking searches 3 lanes ×
2 jobs (§14's two in flight; the budget's bug needs a third job, which the induction and the mutant
test's 1 × 3 search cover).
"""

from __future__ import annotations

from typing import Any

from calculet.logic.expr import And, If, Implies, Not, Or
from calculet.logic.types import Int
from calculet.machines.job import DeviceJobMachine
from calculet.machines.kv_sequence import KvSequenceMachine
from calculet.machines.system import NONE, Coupled, CoupledSystem, SystemInvariant, SystemStepProperty

__all__ = ["JobLaneSystem", "SETTLED_AT_STEP_END"]

_IN_DOUBT = ("timed_out", "quarantined")        # the device may still write the job's lanes (§12)
_ENDED = tuple(s for s, st in DeviceJobMachine.definition.states.items() if st.terminal)  # from the declaration
_ON_DEVICE = ("submitted", *_IN_DOUBT)           # a job holding a device slot (InflightTable keeps it)
# §5.1 ``max_inflight_jobs`` / §14: at most PING and PONG at once (``InflightTable`` accepts 1 or 2); the
# model takes the largest the runtime allows. The induction runs with three jobs, so the bound bites.
MAX_INFLIGHT = 2


def _on_device(sys: Any, jobs: Any) -> Any:
    """How many of ``jobs`` hold a device slot (submitted, or in doubt after a timeout or fault);
    ``jobs`` are the jobs in view less some of them, and the jobs beyond the view count too."""
    total: Any = sys.beyond("jobs holding a device slot")
    for k in jobs:
        total = total + If(sys.lanes[k].at(*_ON_DEVICE), 1, 0)
    return total


def _of_job(sys: Any, i: int, j: int, *states: str) -> Any:
    """Lane ``i`` is in job ``j``'s batch and job ``j`` is in one of ``states``."""
    return And(sys.bound(i, j), sys.lanes[j].at(*states))


def _answered(job: Any) -> Any:
    """The job's device said what became of each lane: it ended (completed, or failed — a device error in time, or
    after its lanes were all marked Unknown), or its completion in time reported a CCU fault / unknown DMA (buffers
    fenced until a reset; R7.4.6: with lane-level isolation the lanes not reported failed are good)."""
    return Or(job.at(*_ENDED), And(job.at("quarantined"), job.fault_reported))


def _open_step(sys: Any, i: int, j: int) -> Any:
    """Lane ``i``'s step is job ``j``'s and still open on a working lane (not yet settled)."""
    return And(sys.bound(i, j), sys.requests[i].at("reserved", "active"))


def _none_pending(sys: Any, i: int, j: int) -> Any:
    """No lane of job ``j``'s batch still has its step open (every one settled): only then are
    the job's buffers reclaimed after a timeout (R12.11, R14.4)."""
    return And(*[Not(_open_step(sys, k, j)) for k in range(len(sys.requests))])


def _job_steps() -> list[Coupled]:
    """Every DeviceJobMachine row, moving the job alone (its lanes settle in the steps after):
    derived from the declaration; the rows that reclaim a job in doubt wait for its lanes."""
    ok = dict(DeviceJobMachine.definition.events["complete"].args)
    steps = []
    for t in DeviceJobMachine.definition.transitions:
        args = ok if t.event == "complete" else {}
        if t.event == "submit":
            steps.append(Coupled(f"job:{t.name}", lane=(t.name,), args=args,
                                 guard=lambda sys, i, j: _on_device(sys, (k for k in range(len(sys.lanes)) if k != j))
                                 < MAX_INFLIGHT,
                                 doc="the planner submits only while a device slot is free (InflightTable.can_plan: "
                                     "in-flight jobs < max_inflight, R5.1.2); a job in doubt keeps its slot"))
        elif t.source in _IN_DOUBT and t.target in _ENDED:
            steps.append(Coupled(f"job:{t.name}", lane=(t.name,), args=args,
                                 guard=lambda sys, i, j: _none_pending(sys, i, j),
                                 doc="the device is done with a job in doubt: its lanes were all marked Unknown"))
        else:
            steps.append(Coupled(f"job:{t.name}", lane=(t.name,), args=args))
    return steps


class JobLaneSystem(CoupledSystem):
    """KV lanes written by device jobs: a lane's open step belongs to exactly one job (the
    binding), and only its own job's answer settles it — commit after a completion in time (or, R7.4.6, a good lane of
    a job failed or quarantined by a reported fault, with lane-level isolation), abort after
    an error, Unknown after a timeout, a fault or a lane whose result is not known (R7.4) — so two
    in-flight jobs never share a lane and a fault of one job marks Unknown only its own lanes (R14.4); and at most max_inflight jobs hold a
    device slot (R5.1.2)."""

    spec = "§9.2, §12, §14"
    bmc_size = (3, 2)   # three lanes, two jobs in flight (§14)
    fast_bmc = False    # verify --fast keeps the proofs (induction, vacuity); the full run searches
    request = KvSequenceMachine
    lane = DeviceJobMachine

    steps = [
        *_job_steps(),
        Coupled("enlist", binding="bind", involves="both",
                guard=lambda sys, i, j: And(sys.unbound(i), sys.requests[i].at("reserved", "active"),
                                            sys.lanes[j].at("submitted")),
                doc="Scheduler.submitted: the device accepted the job with the lane in its batch; the binding is the "
                    "lane's open step (no lane event, #20)"),
        Coupled("commit", request=("commit",), binding="unbind", involves="both", args={"tokens": Int(ge=1)},
                guard=lambda sys, i, j: And(sys.bound(i, j), _answered(sys.lanes[j])),
                doc="its own job answered — completed, or, with lane-level isolation (R7.4.6: a device error affects "
                    "only the lanes it reports), failed with a device error or quarantined by a reported CCU fault — "
                    "and the lane's output is valid: the lane commits the step's positions (§9.2) and its step "
                    "closes (a job that failed after a timeout has no working lane with its step open: late_complete "
                    "and reset_done wait for that)"),
        Coupled("abort", binding="unbind", involves="both",
                guard=lambda sys, i, j: And(sys.bound(i, j), _answered(sys.lanes[j]),
                                            sys.requests[i].at("reserved", "active")),
                doc="its own job reported an error, or the lane's output is invalid: nothing the step wrote is kept "
                    "(no lane event; the step closes)"),
        Coupled("fault", request=("fault",), involves="both",
                guard=lambda sys, i, j: _of_job(sys, i, j, *_IN_DOUBT, *_ENDED),
                doc="its own job timed out or faulted (R9.2.6), reported a device error (R7.4.5: every lane of the "
                    "batch), reported this lane failed (R7.4.6, lane-level isolation) or returned a result whose "
                    "tags do not match the lane (R7.4.2): the lane's device state is unknown (R14.4: its own job's); "
                    "the binding stays, naming the job recovery waits for"),
        Coupled("recover", request=("recover",), binding="unbind", involves="both",
                guard=lambda sys, i, j: _of_job(sys, i, j, *_ENDED),
                doc="recover_lanes / a late completion / a reset: an Unknown lane is released only once the "
                    "job that may write it has ended"),
        Coupled("reserve", request=("reserve",), args={"seq": Int(ge=1), "gen": Int(ge=1), "tokens": Int(ge=1)},
                doc="admission hands the lane to a sequence"),
        Coupled("release", request=("release",), guard=lambda sys, i, j: sys.unbound(i),
                doc="the lane's request ended; refused while its step is open (the runtime reads the binding)"),
        Coupled("confirm_release", request=("confirm_release",), doc="the runtime freed the sequence"),
    ]

    omitted = [
        ("KvSequenceMachine.remove_tail@active",
         "RemoveTokensAtEnd is behind a §9.3 capability gate and no job issues it"),
    ]

    invariants = [
        SystemInvariant(
            "R14.4", "open_step_lane_is_held",
            predicate=lambda sys: sys.all_requests(lambda i: Implies(
                Not(sys.unbound(i)), sys.requests[i].at("reserved", "active", "unknown"))),
            doc="a lane whose step is open (bound to a job) is held — working or Unknown: never released, freed or "
                "reused while a job may write it",
            rejects=({"requests": [{"state": "releasing", "seq_id": 1, "generation": 1, "reserved_len": 2}],
                      "lanes": [{"state": "submitted"}], "binding": [0]},)),
        SystemInvariant(
            "R14.4", "unknown_lane_names_its_job",
            predicate=lambda sys: sys.all_requests(lambda i: Implies(
                sys.requests[i].at("unknown"),
                And(Not(sys.unbound(i)), *[Implies(sys.bound(i, j), Not(sys.lanes[j].at("submitted")))
                                           for j in range(len(sys.lanes))]))),
            doc="an Unknown lane names the job whose fault made it so (recovery waits for that job to end), a "
                "job no longer running in time",
            rejects=({"requests": [{"state": "unknown", "seq_id": 1, "generation": 1, "reserved_len": 2}],
                      "binding": [NONE]},)),
        SystemInvariant(
            "R5.1.2", "inflight_jobs_within_budget", counts=True,
            predicate=lambda sys: _on_device(sys, range(len(sys.lanes))) <= MAX_INFLIGHT,
            doc=f"at most max_inflight_jobs (here {MAX_INFLIGHT}, §14's PING and PONG) jobs hold a device slot, "
                "counting the jobs in doubt after a timeout or fault",
            rejects=({"lanes": [{"state": "submitted"}, {"state": "timed_out"}, {"state": "quarantined"}]},)),
        SystemInvariant(
            "R14.4", "lanes_name_only_submitted_jobs",
            predicate=lambda sys: sys.all_pairs(lambda i, j: Implies(sys.bound(i, j), Not(sys.lanes[j].at("prepared")))),
            doc="a lane's step is only ever a job's the device accepted (or that ended after it)",
            rejects=({"requests": [{"state": "active", "seq_id": 1, "generation": 1, "reserved_len": 2,
                                    "committed_len": 1}], "binding": [0]},)),
    ]

    step_properties = [
        SystemStepProperty(
            "R14.4", "lane_commits_only_after_its_job_answered",
            predicate=lambda pre, post, step: And(
                pre.all_pairs(lambda i, j: Implies(
                    And(pre.bound(i, j), post.requests[i].committed_len > pre.requests[i].committed_len),
                    _answered(pre.lanes[j]))),
                pre.all_requests(lambda i: Implies(post.requests[i].committed_len > pre.requests[i].committed_len,
                                                   Not(pre.unbound(i))))),
            doc="a lane keeps new positions only in a step of the job it is bound to, once that job answered "
                "(completed, or with lane-level isolation failed or quarantined by a reported fault, R7.4.6): no "
                "other job's end, and not its own while on the device or in doubt after a timeout, commits it "
                "(§9.2, R14.4)",
            rejects=({"pre": {"requests": [{"state": "active", "seq_id": 1, "generation": 1, "reserved_len": 3,
                                            "committed_len": 1}], "lanes": [{"state": "submitted"}], "binding": [0]},
                      "post": {"requests": [{"committed_len": 2}], "binding": [NONE]}, "step": "commit"},)),
        SystemStepProperty(
            "R14.4", "open_step_closes_only_after_its_job_answered",
            predicate=lambda pre, post, step: pre.all_pairs(lambda i, j: Implies(
                And(pre.bound(i, j), post.unbound(i)), _answered(pre.lanes[j]))),
            doc="a lane's step closes (its binding dropped: committed, rolled back or recovered) only once its job "
                "answered — completed, failed, or quarantined by a fault its completion in time reported: while the "
                "device may write the lane, it is neither settled nor released",
            rejects=({"pre": {"requests": [{"state": "active", "seq_id": 1, "generation": 1, "reserved_len": 3,
                                            "committed_len": 1}], "lanes": [{"state": "submitted"}], "binding": [0]},
                      "post": {"binding": [NONE]}, "step": "abort"},)),
    ]


SETTLED_AT_STEP_END: tuple[SystemInvariant, ...] = (
    SystemInvariant(
        "R14.4", "answered_job_leaves_no_step_open",
        predicate=lambda sys: sys.all_pairs(lambda i, j: Not(And(
            sys.bound(i, j), _answered(sys.lanes[j]), sys.requests[i].at("reserved", "active")))),
        doc="at the end of each runtime step, a job that answered (completed, failed, or quarantined by a fault its "
            "completion reported) has settled every lane of its batch (committed, rolled back, or marked Unknown): "
            "the runtime's step does the job's answer and its lanes' settlement together (module doc); checked by "
            "the monitor, not by the induction",
        rejects=({"requests": [{"state": "active", "seq_id": 1, "generation": 1, "reserved_len": 2, "committed_len": 1}],
                  "lanes": [{"state": "completed", "delivered": 1, "buffers_held": False}], "binding": [0]},)),
)
"""Properties of the runtime's step ends only (module doc): the job lane monitor evaluates them with the
declared invariants."""
