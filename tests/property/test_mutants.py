"""The checker can fail: seeded mutants of the real declarations are each rejected with a
counterexample naming the invariant they break; the unmutated machines are accepted."""

from __future__ import annotations

import dataclasses

import pytest

from calculet.invariants.checks import check_machine
from calculet.logic.expr import And
from calculet.invariants.mutation import Mutant, derive, derive_pool, replace_row, rows_of
from calculet.invariants.pool_checks import check_pool_bmc, check_pool_induction
from calculet.invariants.system_bmc import check_system_bmc
from calculet.invariants.system_induction import check_system_induction, check_system_initiation, check_system_vacuity
from calculet.logic.expr import Not, Or
from calculet.machines import ALL_MACHINES, DeviceJobMachine, KvSequenceMachine, ModelMachine, RequestMachine
from calculet.machines.definition import T
from calculet.machines.kv_pool import KvLanePool, _held_count, _reserved_total
from calculet.machines.pool import PoolOp
from calculet.machines.request import FinishReason
from calculet.machines.request_lanes import RequestLaneSystem


def _add(machine, row_factory):
    def edit(rows, d):
        return rows + [row_factory(d)]
    return edit


def _kv(name, description, expected, edit):
    return Mutant(name, description, lambda: derive(KvSequenceMachine, name, edit), expected)


def _req(name, description, expected, edit):
    return Mutant(name, description, lambda: derive(RequestMachine, name, edit), expected)


MUTANTS = [
    _kv("KvDroppedReserveGuard", "reserve without tokens ≤ max_seq", "lengths_ordered",
        lambda rows, d: replace_row(rows, "reserve@free", guard=None)),
    _kv("KvWidenedCommitGuard", "commit allows one token past the reservation", "lengths_ordered",
        lambda rows, d: replace_row(rows, "commit@active",
                                    guard=lambda v, tokens: v.committed_len + tokens <= v.reserved_len + 1)),
    _kv("KvOffByOneCommit", "commit adds one token too many", "commit_only_on_success",
        lambda rows, d: replace_row(rows, "commit@active",
                                    guard=lambda v, tokens: v.committed_len + tokens + 1 <= v.reserved_len,
                                    effect=lambda v, tokens: {"committed_len": v.committed_len + tokens + 1})),
    _kv("KvUnknownToReserved", "an Unknown lane handed to a new request", "unknown_is_quarantined",
        _add(KvSequenceMachine, lambda d: T(d.states["unknown"], d.events["reserve"], d.states["reserved"],
                                             effect=lambda v, seq, gen, tokens: {
                                                 "seq_id": seq, "generation": gen, "reserved_len": 1,
                                                 "committed_len": 0}, name="reserve@unknown"))),
    _kv("KvReuseBeforeConfirm", "release frees the lane without the runtime's confirmation",
        "free_only_after_confirmed_release",
        lambda rows, d: replace_row(rows, "release@active", target=d.states["free"],
                                    effect=lambda v: {"seq_id": 0, "generation": 0, "reserved_len": 0,
                                                      "committed_len": 0})),
    _kv("KvCommitOnFault", "committed_len grows on a fault instead of on success", "commit_only_on_success",
        lambda rows, d: replace_row(rows, "fault@active", effect=lambda v: {"committed_len": v.committed_len + 1})),
    _req("ReqLeavesTerminal", "a completed request can still be cancelled", "terminal_is_final",
         _add(RequestMachine, lambda d: T(d.states["completed"], d.events["cancel"], d.states["cancelled"],
                                          effect=lambda v: {"finish_reason": FinishReason.CANCELLED},
                                          name="cancel@completed"))),
    _req("ReqClosesTwice", "a finished stream is closed a second time", "terminal_closed_once",
         lambda rows, d: replace_row(rows, "close@finishing", effect=lambda v: {"closes": v.closes + 2})),
    _req("ReqRunningCancelCompletesAtOnce", "cancel of a running request ends it without draining the job",
         "job_only_while_running",
         lambda rows, d: replace_row(rows, "cancel@decode_running", target=d.states["cancelled"],
                                     effect=lambda v: {"finish_reason": FinishReason.CANCELLED, "closes": 1})),
    _req("ReqRebind", "a request moves to another generation after admission", "generation_fixed",
         _add(RequestMachine, lambda d: T(d.states["decode_ready"], d.events["bind"], d.states["decode_ready"],
                                          effect=lambda v, gen: {"generation": gen}, name="bind@decode_ready"))),
    _req("ReqAdmitBeyondContext", "admission without the context check", "admitted_fits_context",
         lambda rows, d: replace_row(rows, "admit@waiting_admission", guard=None)),
    Mutant("ModelFreesWithPinnedRequests", "drained without waiting for pinned requests",
           lambda: derive(ModelMachine, "ModelFreesWithPinnedRequests",
                          lambda rows, d: replace_row(rows, "drained@draining",
                                                      guard=lambda v, inflight: inflight == 0)),
           "unloading_is_idle"),
    # (drained without waiting for the jobs on the device: GenDrainedWithJobsOnTheDevice, a joint-system mutant —
    # the generation no longer counts its jobs itself, issue #20)
    Mutant("ModelFreedDuringDrain", "buffers freed while the generation still serves what was pinned (and its jobs)",
           lambda: derive(ModelMachine, "ModelFreedDuringDrain",
                          _add(ModelMachine, lambda d: T(d.states["draining"], d.events["freed"], d.states["draining"],
                                                         effect=lambda v: {"buffers": False},
                                                         name="freed@draining"))),
           "serving_has_resources"),
    Mutant("ModelAdmitWhileDraining", "new requests pinned to a draining generation",
           lambda: derive(ModelMachine, "ModelAdmitWhileDraining",
                          _add(ModelMachine, lambda d: T(d.states["draining"], d.events["acquire"], d.states["draining"],
                                                         effect=lambda v: {"active_requests": v.active_requests + 1},
                                                         name="acquire@draining"))),
           "admission_only_when_ready"),
    Mutant("JobLateCompletionDelivers", "a timed-out job's late completion delivers its results",
           lambda: derive(DeviceJobMachine, "JobLateCompletionDelivers",
                          lambda rows, d: replace_row(rows, "late_complete@timed_out",
                                                      effect=lambda v: {"buffers_held": False,
                                                                        "delivered": v.delivered + 1})),
           "delivered_only_when_completed"),
    Mutant("JobReleasesOnTimeout", "a timed-out job's buffers are released while the device may write",
           lambda: derive(DeviceJobMachine, "JobReleasesOnTimeout",
                          lambda rows, d: replace_row(rows, "timeout@submitted", effect=lambda v: {"buffers_held": False})),
           "buffers_held_until_device_done"),
    Mutant("PoolNoUniqueness", "reserve does not check other lanes' owners",
           lambda: derive_pool(KvLanePool, "PoolNoUniqueness", [PoolOp(
               "reserve", guard=lambda pool, i, seq, gen, tokens: And(
                   _reserved_total(pool, pool.others(i)) + tokens <= pool.max_kv_tokens,
                   _held_count(pool, pool.others(i)) + 1 <= pool.max_sequences))]),
           "unique_owner_per_generation", kind="pool"),
    Mutant("PoolNoKvBudget", "reserve ignores the KV-token budget (the sequence budget stays, so the KV one is "
           "the only invariant the mutant can break and the solver cannot report another)",
           lambda: derive_pool(KvLanePool, "PoolNoKvBudget", [PoolOp(
               "reserve", guard=lambda pool, i, seq, gen, tokens: And(*[
                   ~((pool.lanes[j].seq_id == seq) & (pool.lanes[j].generation == gen) & ~pool.lanes[j].at("free"))
                   for j in pool.others(i)], _held_count(pool, pool.others(i)) + 1 <= pool.max_sequences))]),
           "kv_tokens_within_budget", kind="pool"),
]


def _coupled(step: str, name: str, description: str, expected: str, depth: int, extra: str = "", **changes):
    """A requests × lanes mutant: one coupled step of RequestLaneSystem edited (``changes`` are
    Coupled fields) — or, with ``extra``, a copy of it added under that name beside the original;
    ``depth`` is how far from the initial system its violation lies."""
    original = next(s for s in RequestLaneSystem.definition.steps if s.name == step)
    edited = dataclasses.replace(original, **changes, **({"name": extra} if extra else {}))
    mutant = Mutant(name, description,
                    lambda: RequestLaneSystem.derive(name, add=[edited]) if extra
                    else RequestLaneSystem.derive(name, replace={step: edited}),
                    expected, kind="system")
    return mutant, extra or step, depth


SYSTEM_MUTANTS = [
    _coupled("decode_ok:decode_done_continue", "SysDecodeCommitSkipsLane",
             "a decode step advances the request but does not commit the lane", "decode_position_is_committed_len",
             6, lane=(), involves="both"),
    _coupled("admit", "SysAdmitWithoutReserve", "admission binds the request to a lane it never reserved",
             "holding_request_owns_one_lane", 2, lane=(), involves="both"),
    _coupled("cancel@prefill_ready", "SysReleaseWithoutEnding",
             "the lane is released (and the lease dropped) while the request carries on", "holding_request_owns_one_lane",
             3, request=(), involves="both"),
    _coupled("admit", "SysBindBoundLane", "admission may bind the request to a lane another request holds",
             "lane_bound_at_most_once", 4, extra="admit_to_a_bound_lane", lane=(), involves="both",
             guard=lambda sys, i, j: Or(*[sys.bound(k, j) for k in range(len(sys.requests)) if k != i])),
    _coupled("prefill_fault:prefill_done_error", "SysFaultKeepsBinding",
             "a faulted (Unknown) lane stays bound to its ended request", "unknown_lane_unbound", 4, binding="keep"),
    _coupled("cancel@prefill_ready", "SysEndKeepsLease", "a request ends but keeps its lease (no release)",
             "ended_request_holds_no_lane", 3, lane=(), binding="keep", involves="both"),
]
MUTANTS += [m for m, _, _ in SYSTEM_MUTANTS]


@pytest.mark.req("R9.2.1", "R9.2.2", "R9.2.4", "R9.2.6", "R17.2.4")
@pytest.mark.parametrize("mutant, step, depth", [pytest.param(*m, id=m[0].name) for m in SYSTEM_MUTANTS])
def test_system_mutant_is_rejected_by_induction_and_found_by_bmc(mutant, step, depth):
    system = mutant.build().definition
    induction = [r for r in check_system_induction(system, steps=[step]) if not r.ok]
    assert induction, f"{mutant.name} ({mutant.description}) was not caught by induction"
    assert any(mutant.expected_invariant in r.broken for r in induction), [r.detail for r in induction]
    cx = next(r.counterexample for r in induction if mutant.expected_invariant in r.broken)
    assert cx.pre and cx.post and cx.pre != cx.post
    bmc = check_system_bmc(system, 3, 3, depth)
    assert not bmc.ok and mutant.expected_invariant in bmc.broken, bmc.detail
    assert len(bmc.counterexample.trace) == int(bmc.detail.split("depth ")[1].split(":")[0]) + 1
    assert bmc.counterexample.trace[-1]["transition"].startswith(step)  # the mutated step breaks it


def test_unmutated_system_is_accepted():
    """Every proof in full; bounded model checking to depth 4 (the slow tier goes to 6, beyond
    `verify --fast`'s 5; the mutants above show the search finds bugs up to depth 6)."""
    system = RequestLaneSystem.definition
    assert check_system_initiation(system).ok
    assert [r.detail for r in check_system_induction(system) if not r.ok] == []
    assert [r.subject for r in check_system_vacuity(system) if not r.ok] == []
    assert check_system_bmc(system, 3, 3, 4).ok


@pytest.mark.slow
def test_unmutated_system_has_no_bug_within_depth_six():
    assert check_system_bmc(RequestLaneSystem.definition, 3, 3, 6).ok


@pytest.mark.req("R17.2.3", "R9.2.3")
@pytest.mark.parametrize("mutant", [m for m in MUTANTS if m.kind == "machine"], ids=lambda m: m.name)
def test_machine_mutant_is_rejected_naming_the_broken_invariant(mutant):
    d = mutant.build().definition
    failures = [r for r in check_machine(d, include=["initiation", "consecution"]) if not r.ok]
    assert failures, f"{mutant.name} ({mutant.description}) was not caught"
    named = {name for r in failures for name in (r.broken or [r.counterexample.invariant])}
    assert mutant.expected_invariant in named, f"{mutant.name}: the failures name {named}"
    cx = next(r.counterexample for r in failures if mutant.expected_invariant in (r.broken or [r.counterexample.invariant]))
    assert cx.pre and cx.post and cx.pre != cx.post


@pytest.mark.req("R9.2.1", "R5.1.2", "R9.2.4")
@pytest.mark.parametrize("mutant", [m for m in MUTANTS if m.kind == "pool"], ids=lambda m: m.name)
def test_pool_mutant_is_rejected_by_induction_and_found_by_bmc(mutant):
    pool = mutant.build().definition
    induction = [r for r in check_pool_induction(pool, 4) if not r.ok]
    assert any(r.counterexample and r.counterexample.invariant == mutant.expected_invariant for r in induction)
    bmc = check_pool_bmc(pool, 4, 4)
    assert not bmc.ok and bmc.counterexample.invariant == mutant.expected_invariant
    assert len(bmc.counterexample.trace) >= 2  # a reachable run from the empty pool, step by step


def test_suite_has_at_least_twelve_mutants():
    assert len(MUTANTS) >= 12


@pytest.mark.parametrize("machine", ALL_MACHINES, ids=lambda m: m.definition.name)
def test_unmutated_machines_are_accepted(machine):
    failures = [r for r in check_machine(machine.definition) if not r.ok]
    assert failures == []


def test_unmutated_pool_is_accepted():
    assert all(r.ok for r in check_pool_induction(KvLanePool.definition, 4))
    assert check_pool_bmc(KvLanePool.definition, 4, 4).ok


def test_a_derived_copy_without_edits_is_accepted():
    copy = derive(KvSequenceMachine, "KvCopy", lambda rows, d: rows)
    assert len(rows_of(copy)) == len(KvSequenceMachine.definition.transitions)
    assert all(r.ok for r in check_machine(copy.definition))


# ------------------------------------------------------------------------------------------------
# Issue #17: one seeded fault per class of bug that got past the checks before, each with what
# rejects it now. Each `reject` returns the names the rejecting check reports.

def _weakened_lengths(props):
    """lengths_ordered without its `reserved_len <= max_seq` half (the rule reserve's guard keeps)."""
    return [dataclasses.replace(p, predicate=lambda v: v.committed_len <= v.reserved_len)
            if p.name == "lengths_ordered" else p for p in props]


def _reject_by_witnesses(machine):
    from calculet.invariants.strength import check_witnesses
    result = check_witnesses(machine.definition)
    assert not result.ok
    return set(result.broken)


def _reject_by_pool_vacuity(pool):
    from calculet.invariants.reachability import check_pool_reachability, check_pool_vacuity
    dead = {r.subject for r in check_pool_vacuity(pool.definition) if not r.ok}
    reach = check_pool_reachability(pool.definition)
    assert not reach.ok and "reserve@free" in reach.broken, reach.detail
    return dead


def _reject_by_consecution(machine):
    failures = [r for r in check_machine(machine.definition, include=["consecution"]) if not r.ok]
    return {name for r in failures for name in r.broken}


def _reject_by_system_induction(system):
    return {name for r in check_system_induction(system.definition) if not r.ok for name in r.broken}


def _reject_by_index_monitor(_):
    """A KvLaneManager whose confirm_release leaves (generation, seq) -> lane behind: the index
    monitor (kv_checks, on in every test) raises at the stale confirm."""
    from calculet.clock import FakeClock
    from calculet.machines.errors import InvariantViolation
    from calculet.runtime.scheduling.kv import KvLaneManager

    class StaleIndexManager(KvLaneManager):
        def _checked(self, operation):
            if operation == "confirm_release":
                self._by_seq[(1, 1)] = 0  # the fault: the released sequence still maps to its lane
            super()._checked(operation)

    kv = StaleIndexManager(2, 8, clock=FakeClock())
    lease = kv.reserve(1, 4, seq_id=1)
    command = kv.release(lease)
    with pytest.raises(InvariantViolation) as caught:
        kv.confirm_release(command.lane, command.seq_id)
    return {caught.value.invariant}


def _unflagged_completed():
    d = RequestMachine.definition
    completed = d.states["completed"]
    from calculet.machines.definition import State
    return {"completed": State(terminal=False, doc=completed.doc, groups=completed.groups)}


CLASS_MUTANTS = [
    # 1. an invariant weakened together with the guard it protects
    ("WeakenedWithItsGuard", "reserve drops tokens <= max_seq and lengths_ordered drops reserved_len <= max_seq",
     lambda: derive(KvSequenceMachine, "WeakenedWithItsGuard",
                    lambda rows, d: replace_row(rows, "reserve@free", guard=None), properties=_weakened_lengths),
     _reject_by_witnesses, "lengths_ordered"),
    # 2. vacuity in the pool: a pool guard that can never hold (a variable typed for another)
    ("PoolDeadReserve", "reserve's budget compares against the other lanes' total instead of max_kv_tokens",
     lambda: derive_pool(KvLanePool, "PoolDeadReserve", [PoolOp(
         "reserve", guard=lambda pool, i, seq, gen, tokens: And(
             _reserved_total(pool, pool.others(i)) + tokens <= _reserved_total(pool, pool.others(i)),
             _held_count(pool, pool.others(i)) + 1 <= pool.max_sequences))]),
     _reject_by_pool_vacuity, "reserve@free"),
    # 3. two sources of truth for "terminal": unflag a state and add a way out of it
    ("UnflaggedTerminal", "completed is no longer flagged terminal and a cancel leaves it",
     lambda: derive(RequestMachine, "UnflaggedTerminal",
                    lambda rows, d: rows + [T(d.states["completed"], d.events["cancel"], d.states["cancelled"],
                                              effect=lambda v: {"finish_reason": FinishReason.CANCELLED},
                                              name="cancel@completed")],
                    states=_unflagged_completed()),
     _reject_by_consecution, "terminal_closed_once"),
    # 4. commit and fault look the same: a fault keeps what the step wrote (there is no abort event any more, #20)
    ("FaultCommits", "fault@active adds a position to committed_len",
     lambda: derive(KvSequenceMachine, "FaultCommits",
                    lambda rows, d: replace_row(rows, "fault@active", effect=lambda v: {
                        "committed_len": v.committed_len + 1})),
     _reject_by_consecution, "fault_keeps_committed"),
    # 5. a model declared Ready while jobs are in doubt (the jobs are the jobs table's: proved on the joint system)
    ("ReadyWithJobsInDoubt", "recovered fires with jobs still in doubt",
     lambda: _job_system_over(derive(ModelMachine, "ReadyWithJobsInDoubt",
                                     lambda rows, d: replace_row(rows, "recovered@recovering",
                                                                 guard=lambda v: Not(v.unload_pending)))),
     _reject_by_system_induction, "job_in_doubt_only_while_recovering"),
    # 6. state outside the machines: an index left stale after a confirmed release
    ("StaleSeqIndex", "KvLaneManager keeps (generation, seq) -> lane after the release is confirmed",
     lambda: None, _reject_by_index_monitor, "index_seq_names_the_held_lanes"),
]


@pytest.mark.req("R17.2.3", "R9.2.3", "R9.2.5", "R4.6", "R12.10", "R9.2.1")
@pytest.mark.parametrize("name, description, build, reject, expected", CLASS_MUTANTS, ids=[m[0] for m in CLASS_MUTANTS])
def test_issue_17_fault_class_is_rejected(name, description, build, reject, expected):
    """Each of the six classes of issue #17 has a seeded fault, and the check named in its row
    rejects it, naming the property (or dead row, or index) it breaks."""
    assert expected in reject(build()), f"{name} ({description}) was not rejected naming {expected}"


def test_issue_17_faults_pass_the_old_checks_where_they_did():
    """The faults are real: the first passes every per-machine proof (only the witness check sees
    it), and the dead pool guard passes pool induction (vacuously)."""
    weakened = CLASS_MUTANTS[0][2]()
    assert all(r.ok for r in check_machine(weakened.definition, include=["initiation", "consecution"]))
    dead = CLASS_MUTANTS[1][2]()
    assert all(r.ok for r in check_pool_induction(dead.definition, 4))


# ------------------------------------------------------------------------------------------------
# Issue #17: the couplings of a model generation with what it counts (requests, device jobs), each
# seeded with a fault the joint proofs reject (induction names the property, bounded model checking
# finds a run from the initial system that breaks it).

def _generation_mutant(system, step: str, name: str, description: str, expected: str, depth: int, **changes):
    original = next(s for s in system.definition.steps if s.name == step)
    edited = dataclasses.replace(original, **changes)
    return Mutant(name, description, lambda: system.derive(name, replace={step: edited}), expected,
                  kind="system"), step, depth


def _job_system_over(model):
    """GenerationJobSystem with its generations declared by ``model`` (a ModelMachine mutant): same steps, same
    invariants (the steps name the rows, which the mutant keeps)."""
    from calculet.machines.model_couplings import GenerationJobSystem
    from calculet.machines.system import CoupledSystem

    sd = GenerationJobSystem.definition
    return type(f"{model.definition.name}Jobs", (CoupledSystem,), {
        "__doc__": f"GenerationJobSystem over {model.definition.name}.", "spec": sd.spec, "request": sd.request,
        "lane": model, "steps": list(sd.steps), "invariants": list(sd.invariants), "omitted": list(sd.omitted)})


def _generation_model_mutant(row: str, name: str, description: str, expected: str, depth: int, **changes):
    """A ModelMachine row mutated (``changes``), in the jobs system: the proofs that read the jobs table's count."""
    def build():
        return _job_system_over(derive(ModelMachine, name, lambda rows, d: replace_row(rows, row, **changes)))
    return Mutant(name, description, build, expected, kind="system"), f"model:{row}", depth


def _generation_mutants():
    from calculet.machines.model_couplings import GenerationJobSystem, GenerationRequestSystem
    return [
        _generation_mutant(GenerationRequestSystem, "bind@new", "GenBindWithoutAcquire",
                           "a request is pinned to a generation that does not count it (acquire dropped)",
                           "active_requests_are_the_pinned_live_requests", 5, lane=(), involves="both"),
        _generation_mutant(GenerationRequestSystem, "cancel@waiting_admission", "GenEndWithoutRelease",
                           "a pinned request is cancelled and its generation keeps counting it",
                           "active_requests_are_the_pinned_live_requests", 6, lane=(), involves="both"),
        _generation_mutant(GenerationJobSystem, "submit", "JobSubmitOnBusyEngine",
                           "a job is submitted on an engine another job on the device uses",
                           "one_engine_per_job_on_the_device", 6,
                           guard=lambda sys, i, j: And(sys.unbound(i), sys.lanes[j].at("ready", "draining"),
                                                       sys.requests[i].generation == sys.lanes[j].generation)),
        _generation_mutant(GenerationJobSystem, "submit", "JobSubmitToALeavingGeneration",
                           "a job is submitted to a generation that no longer takes one (may_submit dropped)",
                           "jobs_only_on_a_live_generation", 7,
                           guard=lambda sys, i, j: And(sys.unbound(i),
                                                       sys.requests[i].generation == sys.lanes[j].generation)),
        _generation_mutant(GenerationJobSystem, "timeout", "JobTimeoutKeepsReady",
                           "a job times out and its generation stays Ready (no fault)",
                           "job_in_doubt_only_while_recovering", 6, lane=(), involves="both"),
        _generation_mutant(GenerationJobSystem, "complete_ok", "JobEndsUncounted",
                           "a job completes and the jobs table keeps counting it (the ended job not removed)",
                           "counted_exactly_while_on_the_device", 6, binding="keep"),
        _generation_mutant(GenerationJobSystem, "model:drained@draining", "GenDrainedWithJobsOnTheDevice",
                           "drained fires with a count that is not the jobs table's (jobs still on the device)",
                           "jobs_only_on_a_live_generation", 7, guard=None),
        _generation_model_mutant("drained@draining", "GenDrainedIgnoringItsJobs",
                                 "the drained row forgets the count of jobs on the device",
                                 "jobs_only_on_a_live_generation", 7, guard=lambda v: v.active_requests == 0),
        _generation_model_mutant("resume_unload@recovering", "GenResumesUnloadWithJobsInDoubt",
                                 "resume_unload forgets the jobs still on the device",
                                 "jobs_only_on_a_live_generation", 8, guard=lambda v: v.active_requests == 0),
    ]


GENERATION_MUTANTS = _generation_mutants()


@pytest.mark.req("R10.2", "R12.3", "R14.3", "R12.10")
@pytest.mark.parametrize("mutant, step, depth", [pytest.param(*m, id=m[0].name) for m in GENERATION_MUTANTS])
def test_generation_coupling_mutant_is_rejected_by_induction_and_found_by_bmc(mutant, step, depth):
    system = mutant.build().definition
    # asked of the expected property alone: with every goal at once, the counterexample found may break only
    # another property the mutant also breaks (JobSubmitToALeavingGeneration, run alone, broke
    # one_engine_per_job_on_the_device in z3's model; in the full suite's order, its expected one)
    induction = [r for r in check_system_induction(system, steps=[step], goals=[mutant.expected_invariant])
                 if not r.ok]
    assert induction, f"{mutant.name} ({mutant.description}) was not caught by induction"
    assert any(mutant.expected_invariant in r.broken for r in induction), [r.detail for r in induction]
    # the search too is asked of the expected property alone: with every invariant a goal, z3's model may stop at a
    # state breaking only another one the mutant also breaks (JobSubmitToALeavingGeneration broke
    # one_engine_per_job_on_the_device in a fresh-clone CI run of session 19, its expected one locally: the
    # solver's choice follows the order the goals are built in)
    alone = dataclasses.replace(system, step_properties=(),
                                invariants=tuple(i for i in system.invariants if i.name == mutant.expected_invariant))
    bmc = check_system_bmc(alone, 2, 2, depth)
    assert not bmc.ok and bmc.broken == [mutant.expected_invariant], bmc.detail
    assert bmc.counterexample.trace[-1]["transition"].startswith(step)  # the mutated step breaks it


def test_unmutated_generation_couplings_are_accepted():
    from calculet.machines.model_couplings import GenerationJobSystem, GenerationRequestSystem
    for system in (GenerationRequestSystem, GenerationJobSystem):
        sd = system.definition
        assert check_system_initiation(sd).ok
        assert [r.detail for r in check_system_induction(sd) if not r.ok] == []
        assert [r.subject for r in check_system_vacuity(sd) if not r.ok] == []
        assert check_system_bmc(sd, 2, 2, 6).ok


# ------------------------------------------------------------------------------------------------
# Issue #17 class 6, the second index: the scheduler's availability is set by hand beside the
# model machine (Scheduler.set_model). The engine's tick monitor (ModelManager.counter_faults)
# checks it against the serving generation's ModelMachine; a recovery hook that moves the machine
# but forgets the scheduler is rejected.

class _SchedulerStub:
    """The SchedulerView the recovery hooks steer: generation, availability, hold (no requests)."""

    def __init__(self, generation: int, availability) -> None:
        self.generation = generation
        self.availability = availability
        self.holding_new_requests = False

    def set_model(self, generation, availability, profiles=None, detail=""):
        self.generation, self.availability = generation, availability


class _EngineStub:
    def __init__(self, scheduler) -> None:
        self.scheduler = scheduler


def _serving_generation():
    from pathlib import Path

    from calculet.runtime.models.generations import Generations
    from calculet.runtime.scheduling.admission import ModelAvailability

    gens = Generations("m", 1)
    gen = gens.new("m", Path("pkg"), 0.0)
    for event in ("validated", "configured", "warmed"):
        gen.machine.fire(event)
    gens.serving = gen
    return gens, _SchedulerStub(gen.id, ModelAvailability.READY)


def _fault_with(recovery_class):
    """A serving generation, then a job fault handled by ``recovery_class``'s on_fault; returns
    the availability faults the engine's monitor would report."""
    from calculet.runtime.models.availability import availability_faults

    gens, scheduler = _serving_generation()
    assert availability_faults(gens, scheduler) == []
    recovery_class(_EngineStub(scheduler), gens, None, None).on_fault()
    return {name for name, _ in availability_faults(gens, scheduler)}


@pytest.mark.req("R12.2", "R10.4", "R12.10")
def test_scheduler_availability_diverging_from_the_model_machine_is_rejected():
    from calculet.runtime.models.recovery import GenerationRecovery

    class ForgetfulRecovery(GenerationRecovery):
        def on_fault(self) -> None:  # the fault: the machine goes Recovering, the scheduler still says READY
            gen = self._gens.serving
            if gen is not None and gen.machine.at("ready", "draining"):
                gen.machine.fire("fault")

    assert _fault_with(GenerationRecovery) == set()  # the real hook keeps them in step
    assert "scheduler_availability_is_the_model_machines" in _fault_with(ForgetfulRecovery)


@pytest.mark.req("R10.4", "R12.2")
def test_scheduler_pinning_to_a_generation_that_is_not_ready_is_rejected():
    """READY (new requests pinned) is allowed only of a Ready generation; a draining one is READY
    only while a replacement holds new requests."""
    from calculet.runtime.models.availability import availability_of
    from calculet.runtime.scheduling.admission import ModelAvailability as A

    gens, _ = _serving_generation()
    gen = gens.serving
    assert availability_of(gen.machine, held=False) is A.READY
    gen.machine.fire("drain", replace=True, inflight=0)
    assert availability_of(gen.machine, held=False) is not A.READY
    assert availability_of(gen.machine, held=True) is A.READY
    gen.machine.fire("drained", inflight=0)
    assert availability_of(gen.machine, held=True, unserved=A.LOADING) is A.LOADING


@pytest.mark.req("R14.3", "R12.10")
def test_live_jobs_sharing_an_engine_or_in_doubt_on_a_ready_generation_are_rejected():
    """GenerationJobSystem's engine and doubt properties, as the engine's tick monitor checks them on
    the scheduler's jobs table: a planner that hands PING to a second job (the InflightTable's
    free-engine choice dropped), and a timeout that leaves the generation Ready, are both rejected."""
    from calculet.runtime.models.availability import job_faults
    from calculet.runtime.scheduling.jobs import InflightTable

    class SharedEngineTable(InflightTable):
        def _free_engine(self):
            return JobEngine.PING  # the fault: always PING, even while another job holds it

    from calculet.machines.job import JobEngine

    gens, _ = _serving_generation()
    gen_id = gens.serving.id
    good = InflightTable(max_inflight=2)
    for job_id in (1, 2):
        good.plan(job_id, "decode", gen_id, 1, None)
    assert job_faults(gens, list(good)) == []
    bad = SharedEngineTable(max_inflight=2)
    for job_id in (1, 2):
        bad.plan(job_id, "decode", gen_id, 1, None)
    assert ("one_engine_per_job_on_the_device", "R14.3") in job_faults(gens, list(bad))
    job = next(iter(good))
    good.fire(job, "submit")
    good.fire(job, "timeout")  # the fault: no on_fault, the generation stays Ready
    assert ("job_in_doubt_only_while_recovering", "R12.10") in job_faults(gens, list(good))
    gens.serving.machine.fire("fault")  # what GenerationRecovery.on_fault does
    assert job_faults(gens, list(good)) == []


# ------------------------------------------------------------------------------------------------
# Issue #17: device jobs × KV lanes (R14.4: each in-flight job has its own KV transaction). Each
# mutant settles a lane by the end of a job other than its own; induction names the property it
# breaks and bounded model checking (3 lanes × 2 jobs, §14's two in flight) finds a run to it.

def _job_lane_mutants():
    from calculet.machines.job_lanes import JobLaneSystem
    return [
        _generation_mutant(JobLaneSystem, "commit", "JobCommitsAnotherJobsLane",
                           "a job that completed commits a lane whose step is another job's, still on the device",
                           "lane_commits_only_after_its_job_answered", 6,
                           guard=lambda sys, i, j: sys.lanes[j].at("completed")),
        _generation_mutant(JobLaneSystem, "fault", "JobFaultMarksAnotherJobsLane",
                           "a job's timeout marks Unknown a lane whose step is another job's, still on the device",
                           "unknown_lane_names_its_job", 6,
                           guard=lambda sys, i, j: sys.lanes[j].at("timed_out", "quarantined")),
        _generation_mutant(JobLaneSystem, "recover", "RecoverWhileJobInDoubt",
                           "an Unknown lane is recovered while the job that may write it is still in doubt",
                           "open_step_closes_only_after_its_job_answered", 6,
                           guard=lambda sys, i, j: sys.bound(i, j)),
    ]


JOB_LANE_MUTANTS = _job_lane_mutants()


@pytest.mark.req("R14.4", "R9.2.6")
@pytest.mark.parametrize("mutant, step, depth", [pytest.param(*m, id=m[0].name) for m in JOB_LANE_MUTANTS])
def test_job_lane_mutant_is_rejected_by_induction_and_found_by_bmc(mutant, step, depth):
    system = mutant.build().definition
    induction = [r for r in check_system_induction(system, steps=[step]) if not r.ok]
    assert induction, f"{mutant.name} ({mutant.description}) was not caught by induction"
    bmc = check_system_bmc(system, 3, 2, depth)
    assert not bmc.ok and mutant.expected_invariant in bmc.broken, bmc.detail
    assert bmc.counterexample.trace[-1]["transition"].startswith(step)  # the mutated step breaks it


def test_unmutated_job_lanes_are_accepted():
    from calculet.machines.job_lanes import JobLaneSystem
    sd = JobLaneSystem.definition
    assert check_system_initiation(sd).ok
    assert all(r.ok for r in check_system_induction(sd))
    assert all(r.ok for r in check_system_vacuity(sd))
    assert check_system_bmc(sd, 3, 2, 6).ok


@pytest.mark.req("R5.1.2", "R14.3")
def test_job_submitted_beyond_max_inflight_is_rejected():
    """R5.1.2's in-flight budget beyond the pool's: a planner that submits without a free device
    slot (InflightTable.can_plan dropped) puts a third job on the device — induction (three jobs)
    names inflight_jobs_within_budget and bounded model checking over 1 lane × 3 jobs finds it."""
    from calculet.machines.job_lanes import JobLaneSystem
    step = "job:submit@prepared"
    original = next(s for s in JobLaneSystem.definition.steps if s.name == step)
    system = JobLaneSystem.derive("SubmitWithoutSlot", replace={step: dataclasses.replace(original, guard=None)})
    induction = [r for r in check_system_induction(system.definition, steps=[step]) if not r.ok]
    assert induction and "inflight_jobs_within_budget" in induction[0].broken
    bmc = check_system_bmc(system.definition, 1, 3, 3)
    assert not bmc.ok and "inflight_jobs_within_budget" in bmc.broken, bmc.detail
    assert check_system_bmc(JobLaneSystem.definition, 1, 3, 3).ok  # the declared guard keeps the budget
