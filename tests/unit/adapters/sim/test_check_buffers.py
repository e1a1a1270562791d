"""check_buffers (issue #20: the pair read in one call and accepted in one condition) refuses exactly as the checks
listed one after the other do: same rc, same message, for every combination of faults in a job's two buffers."""

from __future__ import annotations

import itertools
from types import SimpleNamespace

import numpy as np
import pytest

from calculet.adapters.calrt import BufferHandle, BufferKind, JobBuffers, JobKind
from calculet.adapters.calrt.codes import VendorError
from calculet.adapters.sim.buffers import BufferTable, SimBuffer
from calculet.adapters.sim.submit_checks import _buffers_in_order, check_buffers

FAULTS = ("same", "missing", "stale", "calbin", "kind", "job_kind", "batch", "bound")


def rig(in_faults: tuple[str, ...], out_faults: tuple[str, ...]) -> tuple[object, object, BufferTable]:
    """A decode B4 job on calbin 1, epoch 2, its buffers 10 (input) and 11 (output) given the faults named."""
    table = BufferTable(memory=None, ids=iter(()))  # type: ignore[arg-type]  # lookups only, nothing allocated
    ids = {"in": 10, "out": 10 if "same" in in_faults + out_faults else 11}
    for side, want, faults in (("in", BufferKind.INPUT, in_faults), ("out", BufferKind.OUTPUT, out_faults)):
        if "missing" in faults:
            continue
        kind = (BufferKind.OUTPUT if want is BufferKind.INPUT else BufferKind.INPUT) if "kind" in faults else want
        handle = BufferHandle(ids[side], kind, JobKind.PREFILL if "job_kind" in faults else JobKind.DECODE,
                              1 if "batch" in faults else 4, 64)
        if ids[side] in table._buffers:  # the same buffer named twice: the first one stands
            continue
        table._buffers[ids[side]] = SimBuffer(handle, 9 if "calbin" in faults else 1, 1 if "stale" in faults else 2,
                                              np.zeros(64, dtype=np.uint8), bound_job=7 if "bound" in faults else None)
    handles = JobBuffers(BufferHandle(ids["in"], BufferKind.INPUT, JobKind.DECODE, 4, 64),
                         BufferHandle(ids["out"], BufferKind.OUTPUT, JobKind.DECODE, 4, 64))
    job = SimpleNamespace(buffers=handles, kind=JobKind.DECODE, compiled_batch=4)
    return job, SimpleNamespace(calbin_id=1), table


def outcome(check: object, job: object, cb: object, table: BufferTable) -> object:
    try:
        return check(job, cb, table, 2)  # type: ignore[operator]
    except VendorError as exc:
        return (exc.rc, str(exc))


CASES = [((), ())] + [(f, ()) for f in itertools.combinations(FAULTS, 1)] + \
        [((), f) for f in itertools.combinations(FAULTS[1:], 1)] + \
        [(a, b) for a in itertools.combinations(FAULTS[1:], 1) for b in itertools.combinations(FAULTS[1:], 1)] + \
        [(f, ()) for f in itertools.combinations(FAULTS[1:], 2)]


@pytest.mark.parametrize(("in_faults", "out_faults"), CASES)
def test_check_buffers_refuses_as_the_checks_in_order(in_faults: tuple[str, ...], out_faults: tuple[str, ...]) -> None:
    job, cb, table = rig(in_faults, out_faults)
    fast, in_order = outcome(check_buffers, job, cb, table), outcome(_buffers_in_order, job, cb, table)
    assert fast == in_order
    if not in_faults and not out_faults:
        assert fast == (table._buffers[10], table._buffers[11])
    else:
        assert isinstance(fast, tuple) and not isinstance(fast[0], SimBuffer), (in_faults, out_faults)
