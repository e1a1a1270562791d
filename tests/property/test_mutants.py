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
from calculet.logic.expr import Or
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
    _kv("KvWidenedSubmitGuard", "submit allows one token past the reservation", "lengths_ordered",
        lambda rows, d: replace_row(rows, "submit@active",
                                    guard=lambda v, tokens: v.committed_len + tokens <= v.reserved_len + 1)),
    _kv("KvOffByOneCommit", "commit adds one token too many", "lengths_ordered",
        lambda rows, d: replace_row(rows, "commit@updating",
                                    effect=lambda v: {"committed_len": v.committed_len + v.pending + 1, "pending": 0})),
    _kv("KvUnknownToReserved", "an Unknown lane handed to a new request", "unknown_is_quarantined",
        _add(KvSequenceMachine, lambda d: T(d.states["unknown"], d.events["reserve"], d.states["reserved"],
                                             effect=lambda v, seq, gen, tokens: {
                                                 "seq_id": seq, "generation": gen, "reserved_len": 1,
                                                 "committed_len": 0, "pending": 0}, name="reserve@unknown"))),
    _kv("KvReuseBeforeConfirm", "release frees the lane without the runtime's confirmation",
        "free_only_after_confirmed_release",
        lambda rows, d: replace_row(rows, "release@active", target=d.states["free"],
                                    effect=lambda v: {"seq_id": 0, "generation": 0, "reserved_len": 0,
                                                      "committed_len": 0, "pending": 0})),
    _kv("KvCommitOnSubmit", "committed_len grows on submit instead of on success", "commit_only_on_success",
        lambda rows, d: replace_row(replace_row(rows, "submit@active",
                                                effect=lambda v, tokens: {"pending": tokens,
                                                                          "committed_len": v.committed_len + tokens},
                                                guard=lambda v, tokens: v.committed_len + 2 * tokens <= v.reserved_len),
                                    "commit@updating", effect=lambda v: {"pending": 0})),
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
    Mutant("ModelFreesWithInflight", "drained without waiting for in-flight jobs",
           lambda: derive(ModelMachine, "ModelFreesWithInflight",
                          lambda rows, d: replace_row(rows, "drained@draining",
                                                      guard=lambda v: v.active_requests == 0)),
           "unloading_is_idle"),
    Mutant("ModelFreedDuringDrain", "buffers freed while jobs are in flight",
           lambda: derive(ModelMachine, "ModelFreedDuringDrain",
                          _add(ModelMachine, lambda d: T(d.states["draining"], d.events["freed"], d.states["draining"],
                                                         effect=lambda v: {"buffers": False},
                                                         name="freed@draining"))),
           "no_free_with_inflight"),
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
    Mutant("PoolStalePosition", "the batch binds a position other than committed_len",
           lambda: derive_pool(KvLanePool, "PoolStalePosition", [PoolOp(
               "submit", ghost=lambda pool, i, tokens: {"position": pool.lanes[i].committed_len + tokens})]),
           "batch_position_is_committed_len", kind="pool"),
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
    """Every proof in full; bounded model checking to depth 4 (the slow tier goes to 6, as
    `verify --fast` does; the mutants above show the search finds bugs up to depth 6)."""
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
