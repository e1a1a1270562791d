"""A job's data at the two ends of its passage through the simulated device.

At submit the host DMAs the job's payload into its InputBuf (:func:`dma_payload`, its bytes written when the
buffer is read: :func:`settle`); at completion the device turns what the job computed into its
:class:`~calculet.adapters.calrt.JobResult` (:func:`completion_record`): the job's and each lane's return code,
the §9.2 commit of the OK lanes, the engine's status counters and what an injected fault does to them (§7.4, §14).

It exists apart from :mod:`calculet.adapters.sim.device` so that the device keeps only its
bookkeeping — locks, engines, buffer binding, counts and the timeline — while the record of one
job is built here from that job alone.
"""

from __future__ import annotations

from collections.abc import MutableMapping

import numpy as np

from calculet.adapters.calrt import JobResult, JobSpec, ReturnCode, StatusCounters
from calculet.adapters.sim import fault_effects
from calculet.adapters.sim.buffers import SimBuffer
from calculet.adapters.sim.execution import Computed, LaneLayout, SimJob, commit
from calculet.adapters.sim.submit_checks import payload
from calculet.machines.job import JobEngine

_new_tuple = tuple.__new__
"""The result records are named tuples (``docs/devices.md`` §3): built once per job without their ``__new__``."""


def settle(in_buf: SimBuffer) -> SimBuffer:
    """The InputBuf with the payload of the last job DMA'd into it written (:attr:`SimBuffer.pending`), so its
    ``data`` holds exactly that job's bytes followed by zeros; a buffer with nothing pending as it is."""
    job = in_buf.pending
    if job is not None:
        dma_payload(job, in_buf)
        in_buf.pending = None
    return in_buf


def dma_payload(job: JobSpec, in_buf: SimBuffer) -> None:
    """Copy the job's payload into its InputBuf; the buffer past the payload is zero afterwards."""
    data = payload(job)
    view = in_buf.view
    n = len(data)
    if n <= len(view):
        view[:n] = data  # the DMA: a copy through the buffer's view; the buffer past it is zero afterwards
    else:
        n = len(view)
        view[:] = data[:n]
    written = in_buf.written
    if written is None or written > n:  # zero only what an earlier, longer payload left there
        in_buf.data[n:] = 0
    in_buf.written = n


def completion_record(job: SimJob, computed: Computed | None, output: np.ndarray | None, numerics: bool,
                      engine_seq: MutableMapping[JobEngine, int], now: float) -> JobResult:
    """Commit or discard a job's effects and build its result (device lock held).

    ``engine_seq`` is the device's per-engine completion count, advanced here for the job's
    engine as the status counters report it (§14).
    """
    spec = job.spec
    engine = spec.engine
    layout = LaneLayout.of(spec)
    fault = job.fault
    if fault is None:  # the common case: every lane OK, nothing to corrupt (no per-job fault machinery)
        job_rc, lane_rc = ReturnCode.OK, [ReturnCode.OK] * len(layout.valid)
    else:
        isolated = job.calbin.capabilities.lane_failure_isolation.value
        job_rc, lane_rc = fault_effects.return_codes(fault, isolated, layout.valid)
    lanes, kv_written = commit(job, computed, layout, lane_rc, output, numerics)
    sequence = engine_seq[engine] = engine_seq[engine] + 1
    counters = _new_tuple(StatusCounters, (sequence, layout.n_valid, layout.valid_tokens, kv_written))
    message = ""
    if fault is not None:
        counters = fault_effects.corrupt(fault, lanes, counters, output)
        if job_rc is not ReturnCode.OK:
            message = f"{fault.origin}"
    ticket = job.ticket
    return _new_tuple(JobResult, (ticket.job_id, spec.generation, spec.kind, engine, ticket.calbin_id,
                                  spec.compiled_batch, job_rc, tuple(lanes), counters, ticket.submitted_at, now,
                                  spec.buffers.output, message))
