"""A session's job buffer pools (§14) and the decode targets built on them.

One InputBuf/OutputBuf pair per (engine, job kind, compiled batch): a job runs wholly on one engine and an engine
runs one job at a time, so two in-flight jobs never share a buffer; the buffers of a job stuck on the device stay
bound until a reset or restart. Every decode step of a configuration is built on the same calbin id and pair for
its engine and batch, so those are kept as :attr:`JobPools.decode_targets` — made with the pools, dropped with
them — and the executor reads one entry per step instead of asking for the calbin and the buffers (issue #20).
"""

from __future__ import annotations

from collections.abc import Iterable

from calculet.adapters.calrt import Calbin, JobBuffers, JobKind, VirtualDevice, rc_of
from calculet.errors import CalculetError, DefinitionError
from calculet.machines.job import JobEngine

__all__ = ["JobPools"]


class JobPools:
    """The buffer pairs of one session's configuration and its decode targets."""

    def __init__(self) -> None:
        self._pairs: dict[tuple[JobEngine, JobKind, int], JobBuffers] = {}
        self.decode_targets: dict[tuple[JobEngine, int], tuple[int, JobBuffers]] = {}
        """Per (engine, compiled batch), the calbin id and buffer pair a decode step is built on (one dictionary for
        the pools' life: it is emptied and filled in place, so a reference to it stays current)."""

    def create(self, device: VirtualDevice, calbin: Calbin, engines: Iterable[JobEngine], sizes: Iterable[int]
               ) -> None:
        """§11 step 7d: a prefill pair and a decode pair per configured batch size, on every engine."""
        sizes = tuple(sizes)
        for engine in engines:
            self._pairs[(engine, JobKind.PREFILL, 1)] = device.allocate_job_buffers(calbin, JobKind.PREFILL, 1)
            for size in sizes:
                pair = self._pairs[(engine, JobKind.DECODE, size)] = device.allocate_job_buffers(
                    calbin, JobKind.DECODE, size)
                self.decode_targets[(engine, size)] = (calbin.calbin_id, pair)

    def pair(self, engine: JobEngine, kind: JobKind, compiled_batch: int) -> JobBuffers:
        """The pair of ``engine`` for a ``kind`` job of ``compiled_batch`` lanes; DefinitionError if there is none."""
        try:
            return self._pairs[(engine, kind, compiled_batch)]
        except KeyError:
            raise DefinitionError(f"no {kind.value} B{compiled_batch} buffers for engine {engine.name.lower()}") from None

    def __len__(self) -> int:
        return len(self._pairs)

    def nbytes(self) -> int:
        """The device memory the pairs hold."""
        return sum(b.input.nbytes + b.output.nbytes for b in self._pairs.values())

    def forget(self) -> None:
        """The device dropped every pair (a reset, or the device closed): forget them without freeing."""
        self._pairs.clear()
        self.decode_targets.clear()

    def destroy(self, device: VirtualDevice) -> list[str]:
        """§12: free every pair (refused by the device while a job holds a buffer); the problems (empty: clean).
        Every pair is forgotten either way: one the device refused to free is reported, not retried."""
        problems: list[str] = []
        for key, buffers in list(self._pairs.items()):
            try:
                device.free_job_buffers(buffers)
            except CalculetError as exc:
                problems.append(f"free {key[1].value} B{key[2]} buffers of {key[0].value}: {rc_of(exc).name}")
            del self._pairs[key]
        self.decode_targets.clear()
        return problems
