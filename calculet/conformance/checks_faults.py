"""Checks of the §9 KV transaction rules, fault behaviour, reset and restart, ping/pong and the §9.3
context operations: what must hold when something goes wrong (§9.2, §9.3, §12, §14, §18 row 7).

Why these: a B>1 profile or a second engine is only worth offering if a failed job leaves every
lane's KV as it was (commit atomic), a fault is attributable to its lanes (so the runtime can
quarantine them), a sequence is released only once the device confirms it, and a reset leaves no
stale KV behind. Faults are produced through the device's :class:`~calculet.adapters.devices.FaultHooks`;
without hooks those checks are *not run*, and the capabilities resting on them stay unearned.
"""

from __future__ import annotations

from calculet.adapters.calrt import (
    ContextOp,
    ContextOpSupport,
    ReturnCode,
    rc_of,
    read_board_memory,
)
from calculet.adapters.devices import HookedFault
from calculet.adapters.calrt import LaneResult
from calculet.adapters.host_driver import HostDriver
from calculet.conformance.harness import Bench, NotRun, Probe, Session, next_token, same_output
from calculet.errors import CalculetError
from calculet.machines.job import JobEngine


def _refused(call: object, *args: object) -> ReturnCode | None:
    """The return code a call is refused with, or None when it succeeded."""
    try:
        call(*args)  # type: ignore[operator]
    except CalculetError as exc:
        return rc_of(exc)
    return None


def check_commit_atomic(bench: Bench, probe: Probe) -> None:
    """§9.2: a failed job commits no lane; its lanes carry the fault (so they can be quarantined);
    a reset brings the device back clean."""
    b = max(bench.configured)
    prompts, (ref, *_) = bench.references(min(b, 2), 0)
    with bench.session() as s:
        hooks = s.hooks_or_skip()
        pairs = [s.prefilled(p) for p in prompts]
        before = [s.kv.committed_length(q) for q, _ in pairs]
        hooks.fail_next_job(HookedFault.CCU_FAULT)
        res = s.driver.decode(b, [(q, next_token(f.lanes[0])) for q, f in pairs])
        if not probe.expect(not res.ok, "fault_hook_ignored", "the device completed a job it was asked to fail"):
            return
        after = [s.kv.committed_length(q) for q, _ in pairs]
        if not s.calbin.capabilities.lane_failure_isolation.value:
            probe.expect(after == before, "non_atomic_commit",
                         f"B{b} job failed with {res.rc.name} but committed lengths went {before} -> {after}")
        for lane, (q, _) in zip(res.lanes, pairs):
            probe.expect(lane.seq_id == q and (lane.rc.is_device_fault or s.calbin.capabilities.lane_failure_isolation.value),
                         "fault_not_attributable", f"lane {lane.lane} of the failed job: seq {lane.seq_id}, rc {lane.rc.name}")
        probe.note(f"B{b} job failed {res.rc.name}; lengths {before} -> {after}")
        refused = _refused(s.driver.decode, b, [(q, next_token(f.lanes[0])) for q, f in pairs])
        probe.note(f"submit after the fault: {'refused ' + refused.name if refused else 'accepted'} until reset")
        _clean_after_reset(bench, probe, s, pairs[0][0], prompts[0], ref[0])


def check_release(bench: Bench, probe: Probe) -> None:
    """§9.2/§12: a sequence or buffer bound to an in-flight job cannot be released; a freed sequence
    is gone and its id is never handed out again."""
    with bench.session() as s:
        (prompt,) = bench.prompts(1)
        seq, first = s.prefilled(prompt)
        job = s.driver.decode_job(1, [(seq, next_token(first.lanes[0]))])
        ticket = s.device.submit(job)
        if ticket.job_id in {t.job_id for t in s.device.inflight()}:
            rc = _refused(s.kv.free_sequence, seq)
            probe.expect(rc is not None, "release_while_in_flight", "a sequence was freed while a job was writing it")
            rc_buf = _refused(s.device.free_job_buffers, job.buffers)
            probe.expect(rc_buf is not None, "buffer_reuse_while_in_flight",
                         "job buffers were freed while their job was in flight")
            probe.note(f"in flight: free sequence refused {rc.name if rc else '-'}, free buffers refused "
                       f"{rc_buf.name if rc_buf else '-'}")
        else:
            probe.note("the job completed before the release could be tried (inconclusive on this run)")
        s.device.wait(ticket.job_id, bench.timeout_s)
        s.kv.free_sequence(seq)
        gone = _refused(s.kv.committed_length, seq)
        probe.expect(gone is not None, "freed_sequence_visible", f"freed sequence {seq} still answers")
        again = s.kv.allocate_sequence()
        probe.expect(again != seq, "sequence_id_reused", f"freed sequence id {seq} was handed out again")
        probe.note(f"freed seq {seq} answers {gone.name if gone else 'OK'}; next allocation is seq {again}")


def _clean_after_reset(bench: Bench, probe: Probe, s: Session, old_seq: int, prompt: tuple[int, ...],
                       reference: LaneResult) -> None:
    old_kv = s.kv
    s.device.reset_configuration()
    probe.expect(not s.device.inflight(), "reset_kept_jobs", "jobs are still in flight after ResetConfiguration")
    probe.expect(_refused(old_kv.committed_length, old_seq) is not None, "stale_kv_after_reset",
                 "the old KvManager's sequence still answers after ResetConfiguration")
    s.reconfigure()
    fresh = s.kv.allocate_sequence()
    length = s.kv.committed_length(fresh)
    if not probe.expect(length == 0, "stale_kv_after_reset",
                        f"a sequence allocated after ResetConfiguration starts with {length} committed tokens"):
        return
    res = s.driver.prefill(fresh, prompt)
    probe.expect(res.ok and same_output(res.lanes[0], reference, bench.atol),
                 "stale_kv_after_reset", "a prefill after ResetConfiguration differs from a fresh device's")
    probe.note("after ResetConfiguration: old sequences gone, new ones start empty and compute as on a fresh device")


def check_reset_clean(bench: Bench, probe: Probe) -> None:
    """§12: ResetConfiguration discards every sequence; nothing stale survives into the next configuration."""
    (prompt,), (ref,) = bench.references(1, 0)
    with bench.session() as s:
        seq, _ = s.prefilled(prompt)
        _clean_after_reset(bench, probe, s, seq, prompt, ref[0])


def check_timeout_reset(bench: Bench, probe: Probe) -> None:
    """§12, §18 row 7: a timed-out job stays in flight with its buffers bound until a reset discards it."""
    (prompt,), (ref,) = bench.references(1, 0)
    with bench.session() as s:
        hooks = s.hooks_or_skip()
        seq, first = s.prefilled(prompt)
        hooks.fail_next_job(HookedFault.TIMEOUT)
        job = s.driver.decode_job(1, [(seq, next_token(first.lanes[0]))])
        ticket = s.device.submit(job)
        rc = _refused(s.device.wait, ticket.job_id, min(bench.timeout_s, 1.0))
        probe.expect(rc is ReturnCode.TIMEOUT, "timeout_not_reported", f"Wait on a stuck job answered {rc}")
        probe.expect(ticket.job_id in {t.job_id for t in s.device.inflight()}, "timed_out_job_dropped",
                     "a timed-out job left the in-flight set before any reset")
        probe.expect(_refused(s.device.free_job_buffers, job.buffers) is not None, "buffer_reuse_while_in_flight",
                     "the buffers of a timed-out job were freed before a reset")
        probe.note("Wait timed out; the job stayed in flight with its buffers bound")
        _clean_after_reset(bench, probe, s, seq, prompt, ref[0])


def check_restart(bench: Bench, probe: Probe) -> None:
    """§12 restart: closing the device and creating it again yields a working device."""
    with bench.session() as s:
        (prompt,) = bench.prompts(1)
        s.prefilled(prompt)
    with bench.session() as s:
        for vector in s.calbin.golden[:1]:
            outcome = s.driver.check_golden(vector)
            probe.expect(outcome.ok, "restart_failed", f"after a restart, golden {vector.name}: {outcome.detail}")
        probe.note("close + create_virtual_device: the package loads and golden passes")


def check_ping_pong(bench: Bench, probe: Probe) -> None:
    """§14, §18 row 8: two jobs on PING and PONG with their own buffers and KV transactions."""
    prompts, refs = bench.references(3, 1)
    with bench.session() as s:
        caps = s.calbin.capabilities
        pairs = [s.prefilled(p) for p in prompts]
        lanes = [[(q, next_token(f.lanes[0]))] for q, f in pairs]
        if not caps.ping_pong.value:
            rc = _refused(s.device.submit, s.driver.decode_job(1, lanes[0], engine=JobEngine.PONG))
            probe.expect(rc is ReturnCode.NOT_SUPPORTED, "pong_without_capability",
                         f"a PONG job without the ping/pong capability answered {rc}")
            probe.note("ping/pong not offered: a PONG job is refused NOT_SUPPORTED")
            return
        jobs = [s.driver.decode_job(1, lanes[0], engine=JobEngine.PING),
                s.driver.decode_job(1, lanes[1], engine=JobEngine.PONG)]
        tickets = [s.device.submit(j) for j in jobs]
        inflight = {t.job_id for t in s.device.inflight()}
        if all(t.job_id in inflight for t in tickets):
            own_buffers = HostDriver(s.device, s.calbin, s.kv, timeout_s=bench.timeout_s)  # a third buffer pair
            third = _refused(s.device.submit, own_buffers.decode_job(1, lanes[2], engine=JobEngine.PING))
            probe.expect(third is ReturnCode.DEVICE_BUSY, "inflight_limit",
                         f"a third job with two in flight answered {third}")
        results = [s.device.wait(t.job_id, bench.timeout_s) for t in tickets]
        for i, (res, engine) in enumerate(zip(results, (JobEngine.PING, JobEngine.PONG))):
            if not probe.expect(res.ok and res.engine is engine, "device_error",
                                f"{engine.name} job: rc {res.rc.name}, engine {res.engine.name}"):
                return
            if not same_output(res.lanes[0], refs[i][1], bench.atol):
                crossed = same_output(res.lanes[0], refs[1 - i][1], bench.atol)
                probe.fail("lane_crosstalk" if crossed else "profile_mismatch",
                           f"{engine.name} job's output is not its own sequence's")
        probe.note("PING and PONG jobs in flight together; each output equals its sequence run alone")


_EMPTY_CALLS = {
    ContextOp.COPY_PREFIX: lambda kv, q: kv.copy_prefix(q, q, 1),
    ContextOp.KEEP_ONE_SEQ: lambda kv, q: kv.keep_one_sequence(q),
    ContextOp.POSITION_ADD_DIV: lambda kv, q: kv.position_add(q, 0, 1, 1),
    ContextOp.SAVE_LOAD_SESSION: lambda kv, q: kv.save_session(q),
}


def check_context_ops(bench: Bench, probe: Probe) -> None:
    """§9.3: empty operations fail NOT_SUPPORTED (never a silent success); RemoveTokensAtEnd's
    boundaries hold and decoding continues from the shorter sequence as if never longer."""
    with bench.session() as s:
        ops = s.calbin.capabilities.context_ops
        (prompt,) = bench.prompts(1)
        seq, first = s.prefilled(prompt)
        for op, call in _EMPTY_CALLS.items():
            if ops.support(op).value is ContextOpSupport.EMPTY:
                rc = _refused(call, s.kv, seq)
                probe.expect(rc is ReturnCode.NOT_SUPPORTED, "silent_empty_op",
                             f"{op.value} is empty in the contract but answered {rc}")
        probe.note("copy prefix, keep one seq, position add/div, save/load session: NOT_SUPPORTED")
        n = s.kv.committed_length(seq)
        rc = _refused(s.kv.remove_tokens_at_end, seq, n + 1)
        probe.expect(rc is ReturnCode.INVALID_ARGUMENT, "remove_tail_semantics",
                     f"removing {n + 1} of {n} tokens answered {rc}")
        s.kv.remove_tokens_at_end(seq, 1)
        res = s.driver.decode(1, [(seq, prompt[-1])])
        probe.expect(res.ok and s.kv.committed_length(seq) == n
                     and same_output(res.lanes[0], first.lanes[0], bench.atol),
                     "remove_tail_semantics", "after RemoveTokensAtEnd(1), re-decoding the last token differs")
        probe.note(f"RemoveTokensAtEnd: {n + 1} of {n} refused; removing 1 then re-decoding reproduces the prefill")


def check_incremental_prefill(bench: Bench, probe: Probe) -> None:
    """§6: a prompt prefilled in two chunks (the second onto a non-empty sequence) ends where one
    prefill ends; without the capability the second chunk is refused NOT_SUPPORTED."""
    (prompt,), (ref,) = bench.references(1, 0)
    with bench.session() as s:
        chunk = s.calbin.profile(1).prefill_chunk_tokens or max(1, len(prompt) // 2)
        if len(prompt) <= chunk:
            raise NotRun(f"the golden prompts are not longer than one chunk ({chunk} tokens)")
        seq, _ = s.prefilled(prompt[:chunk])
        if not s.calbin.capabilities.incremental_prefill.value:
            rc = _refused(s.driver.prefill, seq, prompt[chunk:])
            probe.expect(rc is ReturnCode.NOT_SUPPORTED, "prefill_without_capability",
                         f"a second prefill chunk without incremental prefill answered {rc}")
            probe.note("incremental prefill not offered: a second chunk is refused NOT_SUPPORTED")
            return
        res = s.driver.prefill(seq, prompt[chunk:])
        probe.expect(res.ok and s.kv.committed_length(seq) == len(prompt)
                     and same_output(res.lanes[0], ref[0], bench.atol), "chunked_prefill_mismatch",
                     f"{chunk} + {len(prompt) - chunk} tokens in two prefills differ from one prefill")
        probe.note(f"{chunk} + {len(prompt) - chunk} tokens in two prefills equal one prefill of {len(prompt)}")


LOAD_UNLOAD_CYCLES = 5


def check_load_unload(bench: Bench, probe: Probe) -> None:
    """§18 "load/unload soak" (a short one), §12 order: buffers, sequences, KvManager, calbin — and
    ReadMem back at its baseline after every cycle (nothing leaks on the device)."""
    (prompt,) = bench.prompts(1)
    device = bench.runtime.create_virtual_device()
    try:
        baseline = [m.used_bytes for m in read_board_memory(device)]
        for cycle in range(LOAD_UNLOAD_CYCLES):
            calbin = device.create_calbin(bench.package)
            device.configure(calbin, bench.configured)
            kv = device.create_kv_manager(calbin)
            driver = HostDriver(device, calbin, kv, timeout_s=bench.timeout_s)
            seq = kv.allocate_sequence()
            probe.expect(driver.prefill(seq, prompt).ok, "device_error", f"cycle {cycle}: prefill failed")
            kv.free_sequence(seq)
            driver.close()
            device.destroy_kv_manager(kv)
            device.destroy_calbin(calbin)
            used = [m.used_bytes for m in read_board_memory(device)]
            if not probe.expect(used == baseline, "memory_leak",
                                f"cycle {cycle}: ReadMem used {used} after unload, baseline {baseline}"):
                return
    finally:
        device.close()
    probe.note(f"{LOAD_UNLOAD_CYCLES} load/prefill/unload cycles; ReadMem back at {baseline} after each")


def check_memory(bench: Bench, probe: Probe) -> None:
    """§13.1: ReadMem per chiplet is consistent (used + free = total) and the calbin is accounted."""
    with bench.session() as s:
        infos = read_board_memory(s.device)
        if not infos:
            raise NotRun("ReadMem reports no chiplet")
        for info in infos:
            probe.expect(0 <= info.used_bytes <= info.total_bytes and info.used_bytes + info.free_bytes == info.total_bytes,
                         "read_mem", f"chip {info.chip}: total {info.total_bytes}, used {info.used_bytes}, "
                         f"free {info.free_bytes}")
        probe.expect(sum(i.used_bytes for i in infos) > 0, "read_mem", "a configured calbin uses no memory")
        probe.note(f"{len(infos)} chiplet(s); used {[i.used_bytes for i in infos]} of {[i.total_bytes for i in infos]}")
