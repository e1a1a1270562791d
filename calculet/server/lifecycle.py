"""The engine's start and stop, owned once for the whole service (§12 drain, DESIGN "One owner of state").

The admin drain, a SIGTERM/SIGINT handler and a test may each ask the engine to stop; the
engine must be started once and stopped once, by whichever asks first, and every asker must be
able to wait for the same end. That bookkeeping is one idea, shared by the service and the
admin API, so it lives apart from both.
"""

from __future__ import annotations

import logging
import threading
import time

from calculet.runtime.engine.threaded import ThreadedEngine
from calculet.runtime.engine.types import EngineStatistics

log = logging.getLogger("calculet.server.admin")


class EngineLifecycle:
    """Starts the engine once and stops it once, from whichever asks first (drain, signal, test)."""

    def __init__(self, engine: ThreadedEngine, *, drain_timeout_s: float) -> None:
        self.engine = engine
        self.drain_timeout_s = drain_timeout_s
        self._lock = threading.Lock()
        self._started = False
        self._stopper: threading.Thread | None = None
        self._stopped = threading.Event()
        self.stop_requested_at: float | None = None
        self.stop_duration_s: float | None = None
        self.final: EngineStatistics | None = None

    def start(self) -> None:
        with self._lock:
            if not self._started:
                self.engine.start()
                self._started = True

    @property
    def state(self) -> str:
        """``running``, ``stopping`` or ``stopped``."""
        if self._stopped.is_set():
            return "stopped"
        return "stopping" if self._stopper is not None else "running"

    def begin_stop(self, drain_timeout_s: float | None = None) -> bool:
        """Stop admission and drain in the background (§12); True if this call began it."""
        with self._lock:
            if self._stopper is not None:
                return False
            timeout = self.drain_timeout_s if drain_timeout_s is None else drain_timeout_s
            self.stop_requested_at = time.perf_counter()
            self._stopper = threading.Thread(target=self._stop, args=(timeout,), name="calculet-drain", daemon=True)
            self._stopper.start()
            return True

    def wait_stopped(self, timeout: float | None = None) -> bool:
        return self._stopped.wait(timeout)

    def _stop(self, drain_timeout_s: float) -> None:
        try:
            self.final = self.engine.stop(drain_timeout_s)
        except Exception:  # noqa: BLE001 - reported; the service still reports itself stopped
            log.exception("engine stop failed")
        finally:
            if self.stop_requested_at is not None:
                self.stop_duration_s = time.perf_counter() - self.stop_requested_at
            self._stopped.set()
            log.info("engine stopped", extra={"drain_s": self.stop_duration_s})


__all__ = ["EngineLifecycle"]
