"""bench/overload_http.py judges each burst row beside its own floor and load (issue #13 session 22: on a shared
machine the same 300 GETs' floor moved 2x between rows, as much as the whole refusal): the row's 429 P99 beside its
floor's P99, the event loop's CPU per request beside the floor's, the load average at the burst's start.

Mutants caught (each checked to fail here): the floor's P50 read for its P99; the CPU of all threads read for the
event loop's; another load figure than the 1-minute one; the retries' share from the first tries' count."""

from __future__ import annotations

import math
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(ROOT / "bench"))

from overload_http import BurstRow, judgement  # noqa: E402  (bench/ is a directory of scripts, not a package)


def _row() -> BurstRow:
    return BurstRow(order="on_time", statuses={200: 6, 429: 294}, floor_ms=(11.0, 19.0), refused_ms=(14.0, 31.0),
                    probe_ms=(1.0, 2.0), floor_cpu_ms=(0.061, 0.2), burst_cpu_ms=(0.3, 0.9), window=None,  # type: ignore[arg-type]
                    refused_max_ms=40.0, refusal_cpu_ms=(0.071, 0.25), retry_after_share=1.0,
                    retry_after_s=(3.0, 9.0), retries=294, retries_admitted=290, retries_capped=0, on_time=290,
                    expired=0, wall_s=12.0, server={}, load=(1.5, 2.5, 3.5))


def test_a_row_is_judged_beside_its_own_floor_and_load() -> None:
    j = judgement(_row())
    assert (j.load_1m, j.refused_p99_ms, j.floor_p99_ms) == (1.5, 31.0, 19.0)
    assert j.over_floor_ms == 12.0
    assert (j.loop_cpu_ms, j.floor_loop_cpu_ms) == (0.071, 0.061)
    assert math.isclose(j.retries_admitted, 290 / 294)
