"""The joint monitor's check restricted to what moved (issue #20) gives the full check's verdict (#17).

``JointMonitor.check`` evaluates the declared ``RequestLaneSystem`` invariants on the connected parts of the
requests and lanes that moved since the last check, not on every lane (module doc of
``calculet/runtime/scheduling/joint_checks.py``). Two things make that sound, and both are tested here:

* the lemma its argument rests on, proved with z3 for every declared invariant: splitting a system into two
  parts no binding or seq id relates never changes the invariant's value (so a lane related to no request can
  be dropped, and parts are checked apart) — an invariant added with another shape (a count over every lane)
  fails here;
* on a live scheduler driven through random lives with silent corruptions of state outside the machines
  (a dropped or moved lease, a lane renamed or set Unknown, a wrong kv_length, a request ended silently), the restricted verdict after
  each step is the full one: the same broken invariants as the declared predicates over every kept request and
  every lane (R9.2.1, R9.2.2, R9.2.4, R9.2.6, R17.2.4, §9.2).
"""

from __future__ import annotations

import itertools

import pytest
import z3
from hypothesis import given, settings, strategies as st

from calculet.clock import FakeClock
from calculet.logic.symbolic import SymbolicVars
from calculet.machines.request_lanes import RequestLaneSystem
from calculet.machines.system import NONE, SystemView
from calculet.runtime.scheduling.admission import ModelAvailability
from calculet.runtime.scheduling.joint_checks import ELSEWHERE, JointMonitor
from calculet.runtime.scheduling.kv import KvLaneManager
from calculet.runtime.scheduling.plan import SchedulingCapabilities
from calculet.runtime.scheduling.scheduler import Scheduler
from tests.unit.runtime.runtime_support import Harness, expression_calls, make_config, profile_set

SYSTEM = RequestLaneSystem.definition
REQUESTS, LANES = 3, 2  # two requests on a side reach lane_bound_at_most_once's pairs across a split


def _split_cases() -> list[tuple[frozenset[int], frozenset[int]]]:
    """Every split of 3 requests and 2 lanes into a part A and the rest B (A non-empty, up to swapping)."""
    cases = []
    for side in itertools.product((0, 1), repeat=REQUESTS + LANES):
        if side[0] == 1:  # request 0 in A: each split once
            continue
        cases.append((frozenset(i for i in range(REQUESTS) if side[i] == 0),
                      frozenset(j for j in range(LANES) if side[REQUESTS + j] == 0)))
    return cases


def _part(requests, lanes, binding, seq, rs: list[int], ls: list[int]) -> SystemView:
    """The view JointMonitor.view builds for a part: a lease outside the part's lanes is bound ELSEWHERE."""
    def remap(b):
        out = z3.IntVal(ELSEWHERE)
        for k, j in enumerate(ls):
            out = z3.If(b == j, z3.IntVal(k), out)
        return z3.If(b == NONE, z3.IntVal(NONE), out)
    return SystemView([requests[i] for i in rs], [lanes[j] for j in ls], [remap(binding[i]) for i in rs],
                      [seq[i] for i in rs])


@pytest.mark.req("R9.2.1", "R9.2.2", "R17.2.4")
@pytest.mark.parametrize("inv", SYSTEM.invariants, ids=lambda inv: inv.name)
def test_every_declared_invariant_splits_over_parts_no_binding_or_seq_id_relates(inv):
    """The module doc's relatedness lemma, for each declared invariant and every split of 3 requests × 2 lanes:
    when no request of one side is bound to a lane of the other or shares its seq id, the invariant on the whole
    equals its conjunction on the two sides (a side with no lanes or no requests included)."""
    assert not inv.counts, "a count over every instance: the restricted check needs more than the ∀-shape"
    requests = [SymbolicVars(SYSTEM.request.definition, f"_r{i}") for i in range(REQUESTS)]
    lanes = [SymbolicVars(SYSTEM.lane.definition, f"_l{j}") for j in range(LANES)]
    binding = [z3.Int(f"b{i}") for i in range(REQUESTS)]
    seq = [z3.Int(f"s{i}") for i in range(REQUESTS)]
    whole = inv.predicate(SystemView(requests, lanes, binding, seq))
    for a_req, a_lanes in _split_cases():
        b_req = [i for i in range(REQUESTS) if i not in a_req]
        b_lanes = [j for j in range(LANES) if j not in a_lanes]
        unrelated = [z3.And(binding[i] != j, lanes[j].seq_id != seq[i])
                     for side_r, other_l in ((sorted(a_req), b_lanes), (b_req, sorted(a_lanes)))
                     for i in side_r for j in other_l]
        split = z3.And(inv.predicate(_part(requests, lanes, binding, seq, sorted(a_req), sorted(a_lanes))),
                       inv.predicate(_part(requests, lanes, binding, seq, b_req, b_lanes)))
        solver = z3.Solver()
        solver.add(*unrelated, whole != split)
        assert solver.check() == z3.unsat, f"{inv.name} differs split as A={sorted(a_req)}×{sorted(a_lanes)}: " \
                                           f"{solver.model()}"


def test_the_lemma_catches_a_count_over_every_lane():
    """The lemma can fail: an invariant that also reads lanes related to no request (every lane Free while no
    request holds one) does not split, and the test above would reject it."""
    requests = [SymbolicVars(SYSTEM.request.definition, f"_r{i}") for i in range(1)]
    lanes = [SymbolicVars(SYSTEM.lane.definition, f"_l{j}") for j in range(2)]
    binding, seq = [z3.Int("b0")], [z3.Int("s0")]

    def counting(sys):
        return z3.Or(sys.binding[0] != NONE, *[sys.lanes[j].at("free") for j in range(len(sys.lanes))]) \
            if sys.requests else z3.BoolVal(True)
    whole = counting(SystemView(requests, lanes, binding, seq))
    split = z3.And(counting(_part(requests, lanes, binding, seq, [0], [0])),
                   counting(_part(requests, lanes, binding, seq, [], [1])))
    solver = z3.Solver()
    solver.add(binding[0] != 1, lanes[1].seq_id != seq[0], whole != split)
    assert solver.check() == z3.sat


# ---------------------------------------------------------------- the live scheduler, random lives

def build() -> tuple[Harness, JointMonitor]:
    monitor = JointMonitor()
    config = make_config(batch={"profiles": [1, 4], "batching_window_us": 2000}, executor={"max_inflight": 2},
                         admission={"max_sequences": 4, "max_waiting_requests": 40,
                                    "long_prefill_quota": {"max_admitted": 2, "max_waiting": 4}})
    clock = FakeClock()
    kv = KvLaneManager(4, 8192, clock=clock)
    scheduler = Scheduler(config, clock=clock, kv=kv, device_kv_tokens=10**7, max_seq=8192,
                          capabilities=SchedulingCapabilities(incremental_prefill=True), observer=monitor.observe)
    scheduler.set_model(1, ModelAvailability.READY, profile_set((1, 4), config, max_seq=8192, chunk=16))
    return Harness(scheduler, clock, kv), monitor


OPS = ("submit", "step", "complete", "invalid", "fail", "timeout", "cancel", "confirm", "recover", "reset",
       "drop_lease", "move_lease", "rename_lane", "unknown_lane", "kv_length", "end_silently")
CORRUPTIONS = OPS[10:]


def _apply(h: Harness, monitor: JointMonitor, op: str, pick: int, inflight: list) -> None:
    s = h.scheduler
    live = sorted(s.registry.live(), key=lambda r: r.request_id)
    leased = [r for r in live if r.lease is not None]
    if op == "submit":
        h.submit(prompt=(3, 20, 40)[pick % 3], new=1 + pick % 4, deadline_ms=(None, 5, 2000)[pick % 3])
    elif op == "step":
        h.clock.advance(0.001 * (pick % 3))
        plan = h.step()
        if plan.work is not None:
            s.submitted(plan.work.job_id)
            inflight.append(plan.work)
    elif op in ("complete", "invalid", "fail", "timeout") and inflight:
        work = inflight.pop(pick % len(inflight))
        if op == "timeout":
            s.job_timed_out(work.job_id)
        else:
            h.complete(work, ok=op != "fail", token=(lambda rid, pos: None) if op == "invalid" else
                       (lambda rid, pos: 7), stop=[r for r in h.sinks if (r + pick) % 5 == 0])
    elif op == "cancel" and h.sinks:
        s.cancel(sorted(h.sinks)[pick % len(h.sinks)])
    elif op == "confirm":
        h.confirm_all()
    elif op == "recover":
        s.recover_lanes()
    elif op == "reset":
        s.device_reset()
        inflight.clear()
    elif op == "drop_lease" and leased:
        leased[pick % len(leased)].lease = None
    elif op == "move_lease" and leased:
        rec = leased[pick % len(leased)]
        taken = [r.lease.lane for r in leased if r is not rec]  # onto a held lane (even pick) or a free one
        free = [j for j in range(h.kv.lanes) if h.kv.lane(j).state == "free"]
        targets = (taken if pick % 2 == 0 else free) or taken or free
        if targets:
            rec.lease = rec.lease._replace(lane=targets[pick % len(targets)])
    elif op == "rename_lane":
        lane = h.kv.lane(pick % h.kv.lanes)
        others = [r.lease.seq_id for r in leased] or [lane.seq_id + 1]
        lane.seq_id = others[pick % len(others)] if lane.seq_id != others[pick % len(others)] else lane.seq_id + 9
    elif op == "unknown_lane":
        h.kv.lane(pick % h.kv.lanes)._state = "unknown"
    elif op == "kv_length" and leased:
        # A request's machine moves only by transitions the registry reports (observe): a wrong effect.
        targets = [r for r in leased if r.machine.state.startswith("decode")] or leased
        rec = targets[pick % len(targets)]
        rec.machine.kv_length += 1
        monitor.observe(rec)
    elif op == "end_silently" and leased:  # a request ended without its lease released
        rec = leased[pick % len(leased)]
        rec.machine._state = "cancelled"
        monitor.observe(rec)


@pytest.mark.req("R9.2.1", "R9.2.2", "R9.2.4", "R9.2.6", "R17.2.4")
@settings(max_examples=120, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(OPS[:10]), st.integers(0, 11)), min_size=1, max_size=30),
       st.tuples(st.sampled_from(CORRUPTIONS), st.integers(0, 11)),
       st.integers(0, 34))
def test_the_restricted_check_gives_the_full_verdict_after_each_step(ops, corruption, at):
    """After each step of a random life (ended, at step ``at``, by one silent corruption of state outside the
    machines), the invariants the restricted check finds broken are exactly those the declared predicates break
    over every kept request and every lane; the life ends at the first broken verdict (a check that failed
    leaves its instance broken, and the next incremental check rightly does not report it again)."""
    h, monitor = build()
    inflight: list = []
    steps = [("submit", 0), ("submit", 1), ("submit", 2), ("step", 0), *ops]  # leases to corrupt early on
    steps = steps[:at] + [corruption]  # the life's last step: a corrupted runtime may refuse to go on
    for op, pick in steps:
        _apply(h, monitor, op, pick, inflight)
        full = monitor.broken(h.kv)
        restricted = JointMonitor.verdict(monitor.advance(h.kv))
        assert restricted == full, f"after {op}: restricted {restricted}, full {full}"
        if full:
            assert op in CORRUPTIONS, f"the runtime itself broke {full} after {op}"
            return


def test_a_corruption_of_a_lane_no_request_moved_is_found():
    """A lane renamed to a live request's seq id while nothing else moves: only the lane changed, and the
    restricted check still evaluates it with that request (a part joined by the seq id)."""
    h, monitor = build()
    a = h.submit(prompt=3, new=2).request_id
    h.submit(prompt=3, new=2)
    h.step()
    assert JointMonitor.verdict(monitor.advance(h.kv)) == []
    assert JointMonitor.verdict(monitor.advance(h.kv)) == []  # nothing moved: nothing to evaluate
    assert monitor.advance(h.kv) == []
    rec = h.rec(a)
    other = next(j for j in range(h.kv.lanes) if j != rec.lease.lane and h.kv.lane(j).state == "free")
    h.kv.lane(other).seq_id = rec.lease.seq_id
    h.kv.lane(other).generation = rec.machine.generation
    h.kv.lane(other)._state = "reserved"
    parts = monitor.advance(h.kv)
    assert JointMonitor.verdict(parts) == monitor.broken(h.kv) != []
    assert sorted(j for p in parts for j in p.lanes) == sorted({rec.lease.lane, other})


@pytest.mark.req("R9.2.1", "R9.2.2", "R9.2.4", "R9.2.6", "R17.2.4")
@pytest.mark.parametrize("corruption, pick", [(c, p) for c in CORRUPTIONS for p in (0, 1)])
def test_each_corruption_of_a_decoding_system_is_found_by_the_restricted_check(corruption, pick):
    """Every kind of corruption the random lives draw, from a state with requests decoding, breaks some
    invariant, and the restricted check names exactly the ones the full check does."""
    h, monitor = build()
    for prompt in (3, 5, 7):
        h.submit(prompt=prompt, new=4)
    for _ in range(6):
        plan = h.step()
        if plan.work is not None:
            h.run(plan)
    assert sum(r.machine.state == "decode_ready" for r in h.scheduler.registry.live()) >= 2
    assert JointMonitor.verdict(monitor.advance(h.kv)) == []
    _apply(h, monitor, corruption, pick, [])
    full = monitor.broken(h.kv)
    assert full, f"{corruption} broke nothing"
    assert JointMonitor.verdict(monitor.advance(h.kv)) == full


@pytest.mark.req("R9.2.4", "R17.2.4")
def test_a_decode_move_its_lane_does_not_follow_is_found():
    """Why the monitor hears every decode move (issue #20 asked whether ``observe`` of a decode step's moves is
    redundant): a decode step whose request advances while its lane does not commit changes nothing the lane
    snapshot sees, so only the move marks the request for the check. Mutant caught: ``observe`` skipping the
    decode cycle's moves (the check then finds nothing while the whole system is broken)."""
    h, monitor = build()
    h.submit(prompt=3, new=40)
    while not any(r.machine.state == "decode_ready" for r in h.scheduler.registry.live()):
        plan = h.step()
        if plan.work is not None:
            h.run(plan)
    rec = next(r for r in h.scheduler.registry.live() if r.machine.state == "decode_ready")
    assert JointMonitor.verdict(monitor.advance(h.kv)) == []
    h.scheduler.registry.fire_all([rec], "submit_decode", job=999)  # no lane event (#20): the job's binding
    assert JointMonitor.verdict(monitor.advance(h.kv)) == []
    h.scheduler.registry.fire_all([rec], "decode_done", job=999, ok=True, stop=False)  # the fault: no lane commit
    full = monitor.broken(h.kv)
    assert full
    assert JointMonitor.verdict(monitor.advance(h.kv)) == full


class _Machine:
    """A request or a lane as the joint predicates read it: its declaration, a state and the declared variables."""

    def __init__(self, definition: object, state: str, **values: object) -> None:
        self._definition = definition
        self.state = state
        self.__dict__.update(values)

    def at(self, *states: str) -> bool:
        return self.state in states


@pytest.mark.req("R9.2.1", "R9.2.2", "R9.2.4", "R9.2.6", "R17.2.4")
def test_the_generated_part_check_is_the_declared_predicates():
    """The check generated from the declared predicates' z3 terms for a part of at most one request and one lane
    (joint_codegen, issue #20) names exactly the invariants the declared predicates find false on that part, on
    random parts (mutants: the binding printed as a constant, an invariant left out)."""
    import random

    from calculet.runtime.scheduling.joint_codegen import compile_part_check

    rnd = random.Random(20)
    req_def, lane_def = SYSTEM.request.definition, SYSTEM.lane.definition
    seen: set[str] = set()
    for shape in ((1, 1), (1, 0), (0, 1)):
        check = compile_part_check(SYSTEM, *shape)
        assert check is not None
        for _ in range(3000):
            reqs = [_Machine(req_def, rnd.choice(list(req_def.states)),
                             **{v: rnd.randint(0, 3) for v in req_def.vars}, **{p: 8 for p in req_def.params})
                    for _ in range(shape[0])]
            lanes = [_Machine(lane_def, rnd.choice(list(lane_def.states)),
                              **{v: rnd.randint(0, 3) for v in lane_def.vars}, **{p: 8 for p in lane_def.params})
                     for _ in range(shape[1])]
            binding = [rnd.choice([NONE, ELSEWHERE] + [0] * shape[1]) for _ in reqs]
            seq = [rnd.randint(0, 3) for _ in reqs]
            declared = [inv.name for inv in SYSTEM.invariants if not inv.predicate(SystemView(reqs, lanes, binding, seq))]
            got = check(reqs[0] if reqs else None, lanes[0] if lanes else None, binding[0] if reqs else 0,
                        seq[0] if reqs else 0)
            assert got == declared, (shape, declared, got)
            seen.update(declared)
    assert len(seen) >= len(SYSTEM.invariants) - 1  # the random parts break (nearly) every invariant: not vacuous


def test_a_check_of_small_parts_walks_no_declared_expression():
    """A decode step's parts (one request and its lane each) are judged by the generated check, not by the
    expression helpers (mutant: ``AcrossParts.predicate`` evaluating the declared predicate on every part again)."""
    h, monitor = build()
    for prompt in (3, 5):
        h.submit(prompt=prompt, new=40)
    for _ in range(8):
        plan = h.step()
        if plan.work is not None:
            h.run(plan)
    monitor._seen = None  # every lane looks changed: every kept request is in a part
    monitor._dirty.update(monitor.records)
    parts = monitor.advance(h.kv)
    assert parts and all(p.broken is not None for p in parts)
    verdict, walked = expression_calls(lambda: JointMonitor.verdict(parts))
    assert verdict == monitor.broken(h.kv) == []
    assert walked == []
