"""Job buffers of the simulated NPU: InputBuf/OutputBuf pairs and their binding to jobs (§12, §14).

Each in-flight job has its own pair (§14). A buffer is bound to its job from submit until the job
completes; until then it can be neither reused nor freed (BUFFER_IN_USE), and a timed-out job's
buffers stay bound until ResetConfiguration or close, so a late completion can never write into a
buffer the runtime has reused (§12). Buffers die with the configuration: a handle from an older
configuration epoch fails NOT_FOUND.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field

import numpy as np

from calculet.adapters.calrt import (
    BufferHandle,
    BufferKind,
    JobBuffers,
    JobKind,
    JobSpec,
    ReturnCode,
    TensorRole,
    VendorError,
)
from calculet.adapters.sim.calbin import SimCalbin
from calculet.adapters.sim.memory import MemoryLedger


@dataclass
class SimBuffer:
    handle: BufferHandle
    calbin_id: int
    epoch: int
    data: np.ndarray
    bound_job: int | None = None
    written: int | None = None
    """How many leading bytes the last DMA wrote (the rest are zero); None: unknown, the whole buffer may hold data."""
    pending: JobSpec | None = field(default=None, repr=False, compare=False)
    """The job whose payload the last DMA carried, not yet written into ``data`` (an InputBuf): the bytes are
    written when the buffer is read (:func:`~calculet.adapters.sim.job_record.settle`), the only place anyone
    sees them — the simulated engines compute from the job itself. Issue #20: the copy per decode step, a
    tenth of the null device's submit, was made for a reader that almost never comes."""
    view: memoryview = field(init=False, repr=False, compare=False)
    """A byte view of ``data``, made once: the DMA of every job writes through it (issue #20: a view made per
    job, and the payload sliced to fit it, cost ~2.5 µs of a B1 token)."""

    def __post_init__(self) -> None:
        self.view = self.data.data.cast("B")


class BufferTable:
    """Every live buffer of one device, with its memory reservation (``buffer:<id>``)."""

    def __init__(self, memory: MemoryLedger, ids: Iterator[int]) -> None:
        self._memory = memory
        self._ids = ids
        self._buffers: dict[int, SimBuffer] = {}

    def __len__(self) -> int:
        return len(self._buffers)

    def bound(self) -> int:
        return sum(1 for b in self._buffers.values() if b.bound_job is not None)

    def of_calbin(self, calbin_id: int) -> int:
        return sum(1 for b in self._buffers.values() if b.calbin_id == calbin_id)

    def get(self, buffer_id: int) -> SimBuffer | None:
        return self._buffers.get(buffer_id)

    def lookup(self, handle: BufferHandle, epoch: int) -> SimBuffer:
        b = self._buffers.get(handle.buffer_id)
        if b is None or b.epoch != epoch:
            raise VendorError(ReturnCode.NOT_FOUND,
                              f"buffer {handle.buffer_id} does not exist (freed, or lost with a reset)")
        return b

    def live_pair(self, input_id: int, output_id: int, epoch: int) -> tuple[SimBuffer | None, SimBuffer | None]:
        """A job's two buffers in one call (once per job, issue #20), each None where :meth:`lookup` would refuse."""
        get = self._buffers.get
        in_buf, out_buf = get(input_id), get(output_id)
        return (in_buf if in_buf is not None and in_buf.epoch == epoch else None,
                out_buf if out_buf is not None and out_buf.epoch == epoch else None)

    def allocate(self, cb: SimCalbin, kind: JobKind, compiled_batch: int, epoch: int) -> JobBuffers:
        """An InputBuf/OutputBuf pair sized from the profile's exact tensors (§14: one pair per job)."""
        if compiled_batch not in cb.configured_profiles:
            raise VendorError(ReturnCode.INVALID_ARGUMENT,
                              f"profile B{compiled_batch} is not configured (configured: "
                              f"{list(cb.configured_profiles)})")
        if kind is JobKind.PREFILL and compiled_batch != 1:
            raise VendorError(ReturnCode.INVALID_ARGUMENT, "prefill runs one sequence: use compiled_batch=1")
        profile = cb.profile(compiled_batch)
        vocab = cb.vocab_size
        if kind is JobKind.DECODE:
            in_bytes = sum(t.nbytes for t in profile.tensors
                           if t.role is TensorRole.INPUT and not t.name.startswith("prefill_"))
            out_rows = compiled_batch
        else:
            in_bytes = profile.tensor("prefill_tokens").nbytes
            out_rows = 1
        out_bytes = out_rows * vocab * profile.logit_dtype.itemsize
        handles: list[BufferHandle] = []
        try:
            for bkind, nbytes in ((BufferKind.INPUT, in_bytes), (BufferKind.OUTPUT, out_bytes)):
                buf_id = next(self._ids)
                self._memory.reserve_bytes(f"buffer:{buf_id}", f"{bkind.value} buffer {buf_id}", nbytes)
                handle = BufferHandle(buf_id, bkind, kind, compiled_batch, nbytes)
                data = (np.zeros(nbytes, dtype=np.uint8) if bkind is BufferKind.INPUT
                        else np.zeros((out_rows, vocab), dtype=np.float64))
                self._buffers[buf_id] = SimBuffer(handle, cb.calbin_id, epoch, data)
                handles.append(handle)
        except VendorError:
            for h in handles:
                self._release(h.buffer_id)
            raise
        return JobBuffers(input=handles[0], output=handles[1])

    def free(self, buffers: JobBuffers, epoch: int) -> None:
        """Refused (nothing freed) while either buffer is bound to an uncompleted job (§12)."""
        bufs = [self.lookup(h, epoch) for h in (buffers.input, buffers.output)]
        for b in bufs:
            if b.bound_job is not None:
                raise VendorError(ReturnCode.BUFFER_IN_USE,
                                  f"buffer {b.handle.buffer_id} is bound to job {b.bound_job}, which has not "
                                  "completed; it is released only by completion or reset (§12)")
        for b in bufs:
            self._release(b.handle.buffer_id)

    def unbind(self, job_id: int, buffers: JobBuffers) -> None:
        """The job completed: the device has finished with its buffers."""
        for handle in (buffers.input, buffers.output):
            buf = self._buffers.get(handle.buffer_id)
            if buf is not None and buf.bound_job == job_id:
                buf.bound_job = None

    def clear(self) -> None:
        """Every buffer dies with the configuration (reset or close)."""
        for buf_id in list(self._buffers):
            self._release(buf_id)

    def _release(self, buf_id: int) -> None:
        self._memory.release(f"buffer:{buf_id}")
        del self._buffers[buf_id]
