"""The same workload on the live, real-time engine — the agreement check of the virtual-time runner.

Why: a virtual-time figure is only trustworthy if the virtual-time driver serves requests as
the threaded :class:`~calculet.runtime.engine.threaded.ThreadedEngine` does. :func:`run_live` serves a
request list on the live engine (threads, the real clock, the simulated NPU in real time) and
returns each request's tokens and single outcome, for a test to compare with
:func:`~calculet.loadsim.runner.run_engine`'s.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass
from typing import Sequence

from calculet.adapters.sim import BoardPreset, CostModel, SimCalRT, SimConfig, TimeMode
from calculet.config import SchedulerConfig
from calculet.errors import DefinitionError
from calculet.loadsim.engine_inputs import DEFAULT_MAX_SEQ, generate_request, loadsim_package_dir
from calculet.loadsim.runner import default_options
from calculet.loadsim.workload import SimRequest
from calculet.runtime.engine.types import EngineOptions
from calculet.runtime.request import RequestOutcome

__all__ = ["LiveOutcome", "run_live"]


@dataclass(frozen=True)
class LiveOutcome:
    """What one request got from the live engine: its tokens and its single outcome."""

    tokens: tuple[int, ...]
    finish_reason: str
    http_status: int
    closes: int


class _LiveSink:
    """Thread-safe sink for the real-time engine: the actor thread writes, the caller waits."""

    def __init__(self, done: threading.Semaphore) -> None:
        self.tokens: list[int] = []
        self.outcome: RequestOutcome | None = None
        self.closes = 0
        self._done = done

    def token(self, request_id: int, token: int) -> None:
        self.tokens.append(token)

    def close(self, outcome: RequestOutcome) -> None:
        self.closes += 1
        if self.outcome is None:
            self.outcome = outcome
            self._done.release()


def run_live(requests: Sequence[SimRequest], config: SchedulerConfig, *, cost: CostModel,
             max_seq: int = DEFAULT_MAX_SEQ, options: EngineOptions | None = None,
             timeout_s: float = 60.0, prefill_chunk_tokens: int | None = None) -> tuple[LiveOutcome, ...]:
    """Serve ``requests`` on the live :class:`~calculet.runtime.engine.threaded.ThreadedEngine` (threads, real clock).

    The simulated NPU runs in ``TimeMode.REAL`` (its worker thread completes jobs at their
    cost-model instants on the monotonic clock). Requests are submitted back to back from this
    thread, not at their arrival instants: outcomes that do not depend on timing (no deadline
    short enough to expire, no cancel, no rate limit) must then equal the virtual-time run's —
    which is what the agreement test checks. Waits on the sinks, never sleeps.
    """
    from calculet.runtime.engine.threaded import ThreadedEngine

    sim = SimCalRT(SimConfig(time_mode=TimeMode.REAL, numerics=False, cost=cost, board=BoardPreset.reference()))
    engine = ThreadedEngine(config, sim, loadsim_package_dir(max_seq, prefill_chunk_tokens),
                    options=options or default_options())
    done = threading.Semaphore(0)
    sinks = [_LiveSink(done) for _ in requests]
    engine.start()
    try:
        for i, (req, sink) in enumerate(zip(requests, sinks)):
            engine.submit(generate_request(i, req), sink)
        deadline = time.monotonic() + timeout_s
        for _ in sinks:
            if not done.acquire(timeout=max(0.0, deadline - time.monotonic())):
                open_ = [i for i, s in enumerate(sinks) if s.outcome is None]
                raise DefinitionError(f"the live engine left {len(open_)} request(s) open after {timeout_s} s "
                                      f"(e.g. {open_[:5]})")
    finally:
        engine.stop(drain_timeout_s=5.0)
    out: list[LiveOutcome] = []
    for sink in sinks:
        assert sink.outcome is not None
        out.append(LiveOutcome(tuple(sink.tokens), sink.outcome.finish_reason.name.lower(), sink.outcome.http_status,
                               sink.closes))
    return tuple(out)
