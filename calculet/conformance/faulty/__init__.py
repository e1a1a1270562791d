"""Five deliberately broken devices, built on the simulated NPU, that prove the kit can fail (#18).

Why: a conformance kit that every device passes proves nothing. Each device here breaks exactly
one rule a real board could break, and the kit must fail it with exactly that finding:

=========================  =====================================================  ==========================
device                     what is broken                                         the kit's finding
=========================  =====================================================  ==========================
``faulty-inactive-kv``     an inactive lane that names a sequence appends to its   ``inactive_lane_wrote_kv``
                           KV (§7.3)
``faulty-crosstalk``       lanes 0 and 1 of a batch come back swapped (§14)        ``lane_crosstalk``
``faulty-counters``        status counters report one token too many (§14)        ``status_counters``
``faulty-non-atomic``      a failed job still commits its first lane (§9.2)       ``non_atomic_commit``
``faulty-stale-reset``     sequences allocated after a reset inherit the KV of    ``stale_kv_after_reset``
                           those alive before it (§12)
=========================  =====================================================  ==========================

They are simulators (``simulated``): the conformance CLI knows them by name
(``python -m calculet.conformance --device faulty-crosstalk``); they are not registered as
``calculet.devices`` entry points, so the service cannot be started on one.
"""

from calculet.conformance.faulty.devices import EXPECTED_FINDINGS, FAULTY_DEVICES, Breakage, FaultyDevicePlugin

__all__ = ["EXPECTED_FINDINGS", "FAULTY_DEVICES", "Breakage", "FaultyDevicePlugin"]
