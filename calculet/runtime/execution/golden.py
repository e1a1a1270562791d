"""§11 step 9: a created calbin proves itself on the device before it serves.

Every golden vector of the manifest must reproduce (greedy tokens and the logits checksum), and a
warm-up runs one prefill and one decode step on every configured profile. Both drive the device
through the host driver on the session's own handles, outside the executor; a failure raises
:class:`GoldenFailed` and the session is torn down (§11: nothing unproven serves).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable

from calculet.adapters.calrt import Calbin, KvManager, ReturnCode, VirtualDevice, rc_of
from calculet.adapters.host_driver import GoldenOutcome, HostDriver
from calculet.errors import CalculetError, DeviceFault

log = logging.getLogger("calculet.runtime.execution.golden")


class GoldenFailed(DeviceFault):
    """§11 step 9: a golden vector did not reproduce; the session is not usable."""

    code = "golden_failed"


def run_golden_vectors(device: VirtualDevice, calbin: Calbin, kv: KvManager, *,
                       generation: int) -> tuple[GoldenOutcome, ...]:
    """The outcome of every golden vector of ``calbin`` (greedy tokens, logits checksum)."""
    driver = HostDriver(device, calbin, kv, generation=generation)
    try:
        return tuple(driver.check_golden(vector) for vector in calbin.golden)
    finally:
        _best_effort("free the golden driver's buffers", driver.close)


def require_reproduced(outcomes: Iterable[GoldenOutcome]) -> None:
    """Raise :class:`GoldenFailed` naming every golden vector that did not reproduce."""
    bad = [o for o in outcomes if not o.ok]
    if bad:
        raise GoldenFailed("golden check failed: " + "; ".join(f"{o.name}: {o.detail}" for o in bad),
                           rc=ReturnCode.INTERNAL)


def warm_up(device: VirtualDevice, calbin: Calbin, kv: KvManager, *, generation: int,
            sizes: Iterable[int]) -> None:
    """One prefill and one decode step on every profile in ``sizes``, in a scratch sequence freed
    afterwards (works with numerics off: the tokens are not checked)."""
    driver = HostDriver(device, calbin, kv, generation=generation)
    seq = kv.allocate_sequence()
    try:
        first = driver.prefill(seq, [calbin.bos_token])
        if not first.ok:
            raise GoldenFailed(f"warmup prefill failed: {first.rc.name} {first.message}", rc=first.rc)
        token = first.lanes[0].greedy_token if first.lanes[0].greedy_token is not None else calbin.bos_token
        for size in sizes:
            result = driver.decode(size, [(seq, int(token) % calbin.vocab_size)])
            if not result.ok:
                raise GoldenFailed(f"warmup decode on B{size} failed: {result.rc.name} {result.message}",
                                   rc=result.rc)
    finally:  # a job stuck on the device keeps its sequence and buffers (§12); teardown reports it
        _best_effort("free the warm-up sequence", lambda: kv.free_sequence(seq))
        _best_effort("free the warm-up driver's buffers", driver.close)


def _best_effort(what: str, action: Callable[[], object]) -> None:
    """Cleanup after host-driven jobs must not hide the error that ended them."""
    try:
        action()
    except CalculetError as exc:
        log.warning("cleanup failed", extra={"what": what, "rc": rc_of(exc).name, "detail": str(exc)})
