"""Device jobs × KV lanes (#17; §9.2, §14, R14.3/R14.4): each in-flight job has its own KV transaction.

§14 runs up to two jobs at once (PING/PONG), each with its own buffers (R14.3) and its own KV
transaction (R14.4: "a fault in one in-flight job rolls back or marks Unknown only the KV of its
own lanes"). Neither :class:`DeviceJobMachine` nor :class:`KvSequenceMachine` can say which lanes
a job writes, so this coupled system puts them side by side, in the shape of
:class:`~calculet.machines.system.CoupledSystem` — with the roles the other way round from
``RequestLaneSystem``: the ``request`` role is the KV lane (R instances) and the ``lane`` role is
the device job (L instances), because the binding is a function and a lane belongs to at most one
job's batch while a job has many lanes.

``binding[i] = j``: lane ``i``'s last KV transaction was opened by job ``j`` (the lane was in the
batch of ``j``), kept after the transaction settles until another job takes the lane — so the
proofs can see which job's end settles which lane. The steps follow the runtime's actor
(``calculet/runtime/scheduling/scheduler.py`` ``submitted``, ``apply.py`` ``prefill_complete``,
``decode_complete``, ``timed_out``, ``device_reset``, ``_late``, ``recover_lanes``): the job's event
fires first, then each lane of its batch settles by the outcome of *its own* job — commit after
a completion in time, abort after an error or invalid output, Unknown after a timeout or fault, and
Unknown too after a completion when the device's effect on the lane is not known (R7.4.5: a device
error fails the whole batch and marks its KV Unknown; R7.4.6: a lane the device reports failed;
R7.4.2: a result whose tags do not match the lane). A completed job may therefore leave a lane
Unknown; an earlier declaration said it never did (``completed_job_leaves_no_lane_unknown``), and
the runtime monitor found the runtime doing what R7.4 asks on a mismatched lane — the property was
the spec's misreading, not the runtime's bug, and is gone.
The runtime does a job's end and its lanes' settlement in one actor step; here it is that
step's sequence of events, one lane at a time, and the job's buffers are reclaimed after a
timeout (``late_complete``, ``reset_done``) only once none of its lanes is still pending. Likewise
the batch's lanes open their transactions one step each while the job is Submitted (``enlist``):
the model allows every interleaving of those events, more runs than the runtime's single step, so
what is proved of it holds of the runtime's.

Between two steps of the runtime's actor — where its monitor
(:mod:`calculet.runtime.scheduling.job_lane_monitor`) evaluates these invariants on the live jobs and
lanes — one more thing holds, declared here as :data:`SETTLED_AT_STEP_END`: no ended job leaves a lane
of its batch pending (the runtime settles every lane of a job in the step that ends it). The model
splits that step into one event per lane, so the property is false between those events and is no
invariant of the induction; only the monitor, at step ends, checks it.

R5.1.2's in-flight budget is a property here too: at most ``MAX_INFLIGHT`` jobs hold a device slot
(a job in doubt keeps its slot), because the planner submits only while one is free.

The step guards read other instances (which lanes of a job are still pending, how many jobs hold a
slot) and the budget counts every job (through ``SystemView.beyond``), so the induction at 3 lanes ×
3 jobs gives the jobs beyond them a ghost count and holds for every number of lanes and jobs
(argument in ``calculet/invariants/system_induction.py``); bounded model checking searches 3 lanes ×
2 jobs (§14's two in flight; the budget's bug needs a third job, which the induction and the mutant
test's 1 × 3 search cover).
"""

from __future__ import annotations

from typing import Any

from calculet.logic.expr import And, If, Implies, Not
from calculet.logic.types import Int
from calculet.machines.job import DeviceJobMachine
from calculet.machines.kv_sequence import KvSequenceMachine
from calculet.machines.system import NONE, Coupled, CoupledSystem, SystemInvariant

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


def _none_pending(sys: Any, i: int, j: int) -> Any:
    """No lane of job ``j``'s batch still has tokens in flight (every one settled): only then are
    the job's buffers reclaimed after a timeout (R12.11, R14.4)."""
    return And(*[Not(And(sys.bound(k, j), sys.requests[k].at("updating"))) for k in range(len(sys.requests))])


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
    """KV lanes written by device jobs: a lane with pending tokens belongs to exactly one job's
    batch, and only its own job's end settles it — commit after a completion in time, abort after
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
        Coupled("enlist", request=("submit",), binding="bind", involves="both", args={"tokens": Int(ge=1)},
                guard=lambda sys, i, j: sys.lanes[j].at("submitted"),
                doc="Scheduler.submitted: the device accepted the job and each lane of its batch opens its "
                    "KV transaction for it (KvLaneManager.submit_batch); the lane is now that job's"),
        Coupled("commit", request=("commit",), involves="both", guard=lambda sys, i, j: _of_job(sys, i, j, "completed"),
                doc="its own job completed in time and the lane's output is valid: the lane commits (§9.2)"),
        Coupled("abort", request=("abort",), involves="both", guard=lambda sys, i, j: _of_job(sys, i, j, "completed", "failed"),
                doc="its own job reported an error, or the lane's output is invalid: the transaction rolls back"),
        Coupled("fault", request=("fault@updating",), involves="both",
                guard=lambda sys, i, j: _of_job(sys, i, j, *_IN_DOUBT, *_ENDED),
                doc="its own job timed out or faulted (R9.2.6), reported a device error (R7.4.5: every lane of the "
                    "batch), reported this lane failed (R7.4.6, lane-level isolation) or returned a result whose "
                    "tags do not match the lane (R7.4.2): the lane's device state is unknown (R14.4: its own job's)"),
        Coupled("recover", request=("recover",), involves="both", guard=lambda sys, i, j: _of_job(sys, i, j, *_ENDED),
                doc="recover_lanes / a late completion / a reset: an Unknown lane is released only once the "
                    "job that may write it has ended"),
        Coupled("reserve", request=("reserve",), args={"seq": Int(ge=1), "gen": Int(ge=1), "tokens": Int(ge=1)},
                doc="admission hands the lane to a sequence"),
        Coupled("release", request=("release",), doc="the lane's request ended"),
        Coupled("confirm_release", request=("confirm_release",), doc="the runtime freed the sequence"),
    ]

    omitted = [
        ("KvSequenceMachine.remove_tail@active",
         "RemoveTokensAtEnd is behind a §9.3 capability gate and no job issues it"),
        ("KvSequenceMachine.fault@reserved", "only a lane in a job's transaction is faulted by that job (R14.4)"),
        ("KvSequenceMachine.fault@active", "only a lane in a job's transaction is faulted by that job (R14.4)"),
    ]

    invariants = [
        SystemInvariant(
            "R14.4", "pending_lane_in_one_submitted_batch",
            predicate=lambda sys: sys.all_requests(lambda i: Implies(
                sys.requests[i].at("updating"),
                Not(sys.unbound(i)))),
            doc="a lane with pending tokens belongs to exactly one job's batch (the binding names one job): two "
                "in-flight jobs never share a lane's transaction",
            rejects=({"requests": [{"state": "updating", "seq_id": 1, "generation": 1, "reserved_len": 2,
                                    "pending": 1}], "binding": [NONE]},)),
        SystemInvariant(
            "R14.4", "lanes_of_a_job_on_the_device_are_pending",
            predicate=lambda sys: sys.all_pairs(lambda i, j: Implies(
                _of_job(sys, i, j, "submitted"), sys.requests[i].at("updating"))),
            doc="while a job is on the device, every lane of its batch still has its transaction open: no other "
                "job's end commits, aborts or faults it",
            rejects=({"requests": [{"state": "active", "seq_id": 1, "generation": 1, "reserved_len": 2,
                                    "committed_len": 1}], "lanes": [{"state": "submitted"}], "binding": [0]},)),
        SystemInvariant(
            "R14.4", "lanes_of_a_job_in_doubt_are_pending_or_unknown",
            predicate=lambda sys: sys.all_pairs(lambda i, j: Implies(
                _of_job(sys, i, j, *_IN_DOUBT), sys.requests[i].at("updating", "unknown"))),
            doc="while a timed-out or faulted job may still write, its lanes are not committed, rolled back, "
                "recovered or reused (§9.2: Unknown until recovery confirms the device stopped)",
            rejects=({"requests": [{"state": "releasing", "seq_id": 1, "generation": 1, "reserved_len": 2}],
                      "lanes": [{"state": "timed_out"}], "binding": [0]},)),
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
        # Strengthening the solver forced.
        SystemInvariant(
            "R14.4", "lanes_name_only_submitted_jobs",
            predicate=lambda sys: sys.all_pairs(lambda i, j: Implies(sys.bound(i, j), Not(sys.lanes[j].at("prepared")))),
            doc="a lane is in the batch only of a job the device accepted (or that ended after it)",
            strengthening="a Prepared job with an Active lane in its batch was submitted "
                          "(lanes_of_a_job_on_the_device_are_pending broke on job:submit@prepared)",
            rejects=({"requests": [{"state": "active", "seq_id": 1, "generation": 1, "reserved_len": 2,
                                    "committed_len": 1}], "binding": [0]},)),
    ]


SETTLED_AT_STEP_END: tuple[SystemInvariant, ...] = (
    SystemInvariant(
        "R14.4", "ended_job_leaves_no_lane_pending",
        predicate=lambda sys: sys.all_pairs(lambda i, j: Not(And(
            _of_job(sys, i, j, *_ENDED), sys.requests[i].at("updating")))),
        doc="at the end of each runtime step, a job that completed or failed has settled every lane of its batch "
            "(committed, rolled back, or marked Unknown): the runtime's step does the job's end and its lanes' "
            "settlement together (module doc); checked by the monitor, not by the induction",
        rejects=({"requests": [{"state": "updating", "seq_id": 1, "generation": 1, "reserved_len": 2, "pending": 1}],
                  "lanes": [{"state": "completed", "delivered": 1, "buffers_held": False}], "binding": [0]},)),
)
"""Properties of the runtime's step ends only (module doc): the job lane monitor evaluates them with the
declared invariants."""
