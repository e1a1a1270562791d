"""Checking a job's result against the job that was submitted (§7.4, §14): crosstalk and counters.

**Result verification (crosstalk detection).** Four independent checks, each on data the host
already has:

1. :func:`~calculet.adapters.calrt.verify_result` — (generation, job id), one result per
   compiled lane, slot *i* tagged (lane *i*, the sequence bound there, valid bit), status
   counters (valid lanes, tokens processed, KV tokens written, and ``engine_sequence``
   advancing by exactly one per job on each engine);
2. job identity — the result names the job's engine, kind, calbin, compiled batch and *its own*
   OutputBuf: a result carrying the other engine's buffer is cross-job crosstalk (ping/pong);
3. lane echo — every valid lane echoes the position it was given and, when OK, the KV length
   that position implies (+1 for decode, + the chunk for prefill); an inactive lane produces
   no token: a lane whose tags are right but whose content belongs to another sequence shows
   here;
4. data channel against control channel — each lane's logits (the tagged result) must equal
   the row of the job's OutputBuf at the lane the tag names. The tags and the buffer travel
   different paths on a device; swapped lanes disagree even when each tag is self-consistent.

Any crosstalk finding fails the whole job (no lane's token is delivered, its lanes' KV become
Unknown and are recovered as a known failure) and degrades ping/pong. A counter anomaly does the
same (the device's own bookkeeping is wrong, so its output is not trusted).
"""

from __future__ import annotations

import numpy as np

from calculet.adapters.calrt import Anomaly, DecodeJob, JobKind, JobResult, JobSpec, JobTicket, ReturnCode, verify_result
from calculet.runtime.execution.inflight import InflightJob


def check_result(job: InflightJob, result: JobResult, *, previous_engine_sequence: int | None,
                 output_rows: np.ndarray | None) -> list[tuple[Anomaly, str]]:
    """Every anomaly of ``result`` against the job that was submitted (the four checks above).

    A clean decode result — every check passing, the case once per token at B1 — is recognised in one pass
    (:func:`clean_decode`, issue #20); any other result goes through the checks one by one (:func:`anomalies`),
    which name what they find. The executor asks the two itself, in this order."""
    if output_rows is None and clean_decode(job.spec, job.ticket, result, previous_engine_sequence):
        return []
    return anomalies(job, result, previous_engine_sequence=previous_engine_sequence, output_rows=output_rows)


def anomalies(job: InflightJob, result: JobResult, *, previous_engine_sequence: int | None,
              output_rows: np.ndarray | None) -> list[tuple[Anomaly, str]]:
    """The four checks above one by one, each naming what it finds ([] for a result that passes them all)."""
    spec, ticket = job.spec, job.ticket
    tagged = verify_result(spec, ticket, result, previous_engine_sequence).anomalies
    found = list(tagged) if tagged else []
    out = spec.buffers.output
    if (result.engine is not spec.engine or result.kind is not spec.kind or result.calbin_id != spec.calbin_id
            or result.compiled_batch != spec.compiled_batch
            or result.output_buffer.buffer_id != out.buffer_id):
        found.append((Anomaly.CROSSTALK,
                      f"result names engine {result.engine.name.lower()}, {result.kind.value} B{result.compiled_batch}, "
                      f"OutputBuf {result.output_buffer.buffer_id}; the job ran on {spec.engine.name.lower()}, "
                      f"{spec.kind.value} B{spec.compiled_batch}, OutputBuf {out.buffer_id}"))
    if isinstance(spec, DecodeJob):
        lanes = spec.lanes  # plain values, converted once per job (DecodeJob.lanes, issue #20)
        positions, valid = lanes.positions, lanes.valid
        step = 1  # what a valid lane's KV grows by: one token per decode lane, the chunk for prefill's one lane
    else:
        positions, valid, step = (spec.start_position,), (True,), len(spec.tokens)
    n = len(positions)
    for lane in result.lanes:  # once per token at B1 (issue #20): no per-job list of steps, the length read once
        i = lane.lane
        if not 0 <= i < n:
            found.append((Anomaly.CROSSTALK, f"a result names lane {i}, outside the job's {n} lanes"))
            continue
        if not valid[i]:
            if lane.greedy_token is not None or (lane.logits is not None and not np.all(np.isnan(lane.logits))):
                found.append((Anomaly.CROSSTALK, f"inactive lane {i} returned output"))
            continue
        if lane.position != positions[i]:
            found.append((Anomaly.CROSSTALK, f"lane {i} echoes position {lane.position}; it was given "
                                             f"{positions[i]}"))
        elif lane.rc is ReturnCode.OK and result.ok and lane.kv_len != positions[i] + step:
            found.append((Anomaly.CROSSTALK, f"lane {i} reports KV length {lane.kv_len}; position {positions[i]} "
                                             f"+ {step} was expected"))
        if output_rows is not None and lane.logits is not None and lane.rc is ReturnCode.OK:
            row = output_rows[i] if i < len(output_rows) else None
            if row is None or row.shape != lane.logits.shape or not np.array_equal(row, lane.logits):
                found.append((Anomaly.CROSSTALK, f"lane {i}'s logits differ from OutputBuf row {i}"))
    return found


def clean_decode(spec: JobSpec, ticket: JobTicket, result: JobResult, previous: int | None) -> bool:
    """Whether ``result`` is an OK decode result that passes checks 1–3 of the module docstring (check 4 needs
    the OutputBuf's rows: a caller that read them does not ask), in one pass over the lanes.

    True only where :func:`~calculet.adapters.calrt.verify_result` and the identity and echo checks of
    :func:`check_result` find nothing: same job and generation, engine, kind, calbin, batch and OutputBuf; one
    result per lane, slot *i* tagged (lane *i*, its sequence, its valid bit), every lane OK; a valid lane echoes
    its position and a KV length one past it; an inactive lane returns no output; the counters say the valid
    lanes, one token and one KV token each, and ``engine_sequence`` follows ``previous``. False sends the result
    through the checks that explain it (``test_verification_fast_path`` holds the two to the same verdict)."""
    if spec.kind is not JobKind.DECODE:
        return False
    ok = ReturnCode.OK
    # the result is a named tuple (docs/devices.md §3): its fields unpacked in one step, not read one by one (#20)
    job_id, generation, kind, engine, calbin_id, batch, rc, lanes, counters, _, _, out, _ = result
    if (rc is not ok or job_id != ticket.job_id or generation != spec.generation or engine is not spec.engine
            or kind is not spec.kind or calbin_id != spec.calbin_id or batch != spec.compiled_batch
            or out.buffer_id != spec.buffers.output.buffer_id):
        return False
    tokens, positions, valid, seqs, active = spec.lanes
    if len(lanes) != len(seqs):
        return False
    i = 0
    for lane_i, seq_id, lane_valid, lane_rc, position, kv_len, logits, greedy in lanes:
        if lane_i != i or seq_id != seqs[i] or lane_rc is not ok:
            return False
        if valid[i]:
            if lane_valid is not True or position != positions[i] or kv_len != positions[i] + 1:
                return False
        elif lane_valid is not False or greedy is not None or logits is not None:
            return False
        i += 1
    n = len(active)
    engine_sequence, lanes_valid, tokens_processed, kv_written = counters
    return (lanes_valid == n and tokens_processed == n and kv_written == n
            and (previous is None or engine_sequence == previous + 1))
