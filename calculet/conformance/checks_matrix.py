"""Checks of the vendor contract, the §18 matrix and per-lane identity: what a board must do right
on its normal path before any capability is offered (§3, §7.3, §7.4, §14, §18, §20).

Why these: §18 lists the tests a B1 board and a B4/B8/B16 board must pass; §7.4 asks that every
lane's result be verified against its request/sequence/lane; §14 names crosstalk and counter
anomalies as the faults that must degrade a ping/pong pair. Every lane is compared with the same
prompt run alone on B1 on the same device (golden equivalence between profiles).
"""

from __future__ import annotations

from collections.abc import Sequence

from calculet.adapters.calrt import (
    CALRT_VERSION,
    Anomaly,
    JobResult,
    JobSpec,
    KvSeqId,
    LaneResult,
    MaskContract,
    ReturnCode,
    rc_of,
    records_follow_contract,
    verify_result,
)
from calculet.errors import CalculetError
from calculet.conformance.harness import Bench, NotRun, Probe, Session, next_token, same_output


def check_runtime(bench: Bench, probe: Probe) -> None:
    """§3/§20: the CalRT version, and one physical VirtualDevice per process (R3.4)."""
    version = bench.runtime.version
    probe.expect(version == CALRT_VERSION, "calrt_version", f"runtime reports CalRT {version}, not {CALRT_VERSION}")
    probe.note(f"CalRT version {version}")
    device = bench.runtime.create_virtual_device()
    try:
        try:
            second = bench.runtime.create_virtual_device()
        except CalculetError as exc:
            probe.expect(rc_of(exc) is ReturnCode.ALREADY_EXISTS, "second_device",
                         f"a second live VirtualDevice was refused with {rc_of(exc).name}, not ALREADY_EXISTS")
            probe.note(f"second VirtualDevice refused: {rc_of(exc).name}")
        else:
            second.close()
            probe.fail("second_device", "a second live physical VirtualDevice was created (§3: one per process)")
    finally:
        device.close()


def check_profiles(bench: Bench, probe: Probe) -> None:
    """§7.3/§20: every B>1 profile states its mask contract, KV mode and fill token (never 0)."""
    with bench.session() as s:
        for p in s.calbin.profiles:
            pol = p.inactive_policy
            probe.note(f"B{p.compiled_batch}: mask {pol.mask.value}, kv {pol.kv_manager_mode.value}, inactive writes "
                       f"KV {pol.inactive_writes_kv}, fill token {pol.fill_token}")
            if p.compiled_batch > 1:
                probe.expect(pol.mask is not MaskContract.NONE and not pol.inactive_writes_kv and pol.fill_token != 0,
                             "profile_contract", f"B{p.compiled_batch} has no usable inactive-lane contract (§7.3)")
        bench.facts["profiles"] = tuple(p.compiled_batch for p in s.calbin.profiles)
        bench.facts["configured"] = s.profiles


def check_single_sequence(bench: Bench, probe: Probe) -> None:
    """§18 row 1, §11 step 9: each golden vector, prefill + greedy decode on B1."""
    with bench.session() as s:
        if not s.calbin.golden:
            raise NotRun("the package carries no golden vectors")
        for vector in s.calbin.golden:
            outcome = s.driver.check_golden(vector)
            probe.expect(outcome.ok, "golden_mismatch", f"golden {vector.name}: {outcome.detail}")
            probe.note(f"golden {vector.name}: {list(outcome.tokens)} ({outcome.detail})")


def check_two_sequences(bench: Bench, probe: Probe) -> None:
    """§18 row 2: two sequences alternating on B1 each produce what they produce alone."""
    steps = 3
    prompts, refs = bench.references(2, steps)
    with bench.session() as s:
        seqs = []
        lasts = []
        for p in prompts:
            seq, first = s.prefilled(p)
            seqs.append(seq)
            lasts.append(first.lanes[0])
        for step in range(1, steps + 1):
            for i, seq in enumerate(seqs):
                res = s.driver.decode(1, [(seq, next_token(lasts[i]))])
                if not probe.expect(res.ok, "device_error", f"alternating decode failed: {res.rc.name}"):
                    return
                lasts[i] = res.lanes[0]
                if not probe.expect(same_output(lasts[i], refs[i][step], bench.atol),
                                    "sequence_interference", f"sequence {i} step {step} differs from it run alone"):
                    return
        probe.note(f"2 sequences x {steps} alternating steps equal their solo runs")


def _lane_identity(probe: Probe, bench: Bench, s: Session, res: JobResult, lanes: Sequence[int],
                   refs: Sequence[list[LaneResult]], step: int, profile: int) -> bool:
    """Each valid lane's output must be its own sequence's reference; another lane's is crosstalk."""
    atol = bench.atol
    for slot, lane_no in enumerate(lanes):
        lane = res.lanes[lane_no]
        if same_output(lane, refs[slot][step], atol):
            continue
        others = [j for j in range(len(lanes)) if j != slot and same_output(lane, refs[j][step], atol)]
        if others:
            probe.fail("lane_crosstalk", f"B{profile} lane {lane_no} carries the output of lane {lanes[others[0]]}")
        else:
            probe.fail("profile_mismatch", f"B{profile} lane {lane_no} step {step} differs from its B1 reference")
        return False
    return True


def check_fill_lanes(bench: Bench, probe: Probe) -> None:
    """§18 rows 3 and 5, §7.4: lanes 1..B filled with mixed-length sequences; every lane's tags,
    output and KV commit match the sequence run alone on B1."""
    batched = [b for b in bench.configured if b > 1]
    if not batched:
        raise NotRun("no B>1 profile is configured (the package has none, or no multi-profile residency)")
    prompts, refs = bench.references(max(batched), 1)
    with bench.session() as s:
        for b in batched:
            for fill in sorted({1, 2, b}):
                if not _fill_once(probe, bench, s, b, prompts[:fill], refs[:fill]):
                    return
            probe.note(f"B{b}: 1, 2 and {b} valid lanes of mixed lengths equal their B1 references")


def _fill_once(probe: Probe, bench: Bench, s: Session, b: int, prompts: Sequence[tuple[int, ...]],
               refs: Sequence[list[LaneResult]]) -> bool:
    fill = len(prompts)
    seqs: list[KvSeqId] = []
    try:
        firsts = []
        for p in prompts:
            seq, first = s.prefilled(p)
            seqs.append(seq)
            firsts.append(first.lanes[0])
        before = [s.kv.committed_length(q) for q in seqs]
        job = s.driver.decode_job(b, [(q, next_token(f)) for q, f in zip(seqs, firsts)])
        ticket = s.device.submit(job)
        res = s.device.wait(ticket.job_id, bench.timeout_s)
        if not probe.expect(res.ok, "device_error", f"B{b} decode of {fill} lanes failed: {res.rc.name}"):
            return False
        tags = verify_result(job, ticket, res)
        if tags.has(Anomaly.CROSSTALK) or tags.has(Anomaly.WRONG_JOB):
            probe.fail("lane_crosstalk", "; ".join(d for a, d in tags.anomalies if a is not Anomaly.COUNTERS))
            return False
        if not _lane_identity(probe, bench, s, res, list(range(fill)), refs, 1, b):
            return False
        after = [s.kv.committed_length(q) for q in seqs]
        return probe.expect(after == [n + 1 for n in before], "non_atomic_commit",
                            f"B{b}: committed lengths {before} -> {after}; every valid lane must advance by 1")
    finally:
        for q in seqs:
            s.kv.free_sequence(q)


def check_inactive_lanes(bench: Bench, probe: Probe) -> None:
    """§7.3, §18 row 4: a sequence parked in an inactive lane keeps its length and its KV."""
    batched = [b for b in bench.configured if b > 1]
    if not batched:
        raise NotRun("no B>1 profile is configured")
    (parked_prompt, live_prompt), (ref, _) = bench.references(2, 1)
    with bench.session() as s:
        for b in batched:
            parked, first = s.prefilled(parked_prompt)
            live, live_first = s.prefilled(live_prompt)
            before = s.kv.committed_length(parked)
            res = s.driver.decode(b, [(live, next_token(live_first.lanes[0])), None],
                                  inactive_seqs=[0, int(parked)])
            if not probe.expect(res.ok, "device_error", f"B{b} decode with a parked lane failed: {res.rc.name}"):
                return
            after = s.kv.committed_length(parked)
            if not probe.expect(after == before, "inactive_lane_wrote_kv",
                                f"B{b}: the sequence parked in inactive lane 1 went from {before} to {after} tokens"):
                return
            again = s.driver.decode(1, [(parked, next_token(first.lanes[0]))])
            if not probe.expect(again.ok and same_output(again.lanes[0], ref[1], bench.atol),
                                "inactive_lane_wrote_kv", f"B{b}: the parked sequence's next output changed"):
                return
            s.kv.free_sequence(parked)
            s.kv.free_sequence(live)
            probe.note(f"B{b}: a parked sequence kept {before} tokens and its next output")


def check_counters(bench: Bench, probe: Probe) -> None:
    """§14 (R14.6): status counters match every job — lanes, tokens, KV written, engine sequence."""
    with bench.session() as s:
        previous: dict[object, int] = {}
        jobs = 0
        prompts = bench.prompts(2)
        seqs = []
        for p in prompts:
            seq = s.kv.allocate_sequence()
            seqs.append(seq)
            job = s.driver.prefill_job(seq, p)
            jobs += _counted(s, probe, job, previous, bench.timeout_s)
        lasts = {q: s.kv.committed_length(q) for q in seqs}
        for b in s.profiles:
            lanes = [(q, prompts[i][-1]) for i, q in enumerate(seqs[:b])]
            job = s.driver.decode_job(b, lanes)
            jobs += _counted(s, probe, job, previous, bench.timeout_s)
        probe.note(f"{jobs} jobs' counters match (prefill, decode on {list(s.profiles)}); lengths {list(lasts.values())}")


def _counted(s: Session, probe: Probe, job: JobSpec, previous: dict[object, int], timeout_s: float) -> int:
    ticket = s.device.submit(job)
    res = s.device.wait(ticket.job_id, timeout_s)
    probe.expect(records_follow_contract(ticket, res), "result_records",
                 f"{job.kind.value} job {ticket.job_id}: the ticket, result, counters and lanes must be "
                 "calculet.adapters.calrt's named tuples (docs/devices.md §3)")
    check = verify_result(job, ticket, res, previous.get(res.engine))
    previous[res.engine] = res.counters.engine_sequence
    for anomaly, detail in check.anomalies:
        if anomaly is Anomaly.COUNTERS:
            probe.fail("status_counters", f"{job.kind.value} job {ticket.job_id}: {detail}")
    return 1
