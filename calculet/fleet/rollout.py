"""Rolling model upgrade across boards (§10–§12 blue-green; §11: one board cannot be zero-downtime).

Why: ``configure`` is whole-device state on CalRT 0.7.6, so replacing a model on a board holds its
new requests while the old generation drains and the new one is configured and golden-checked
(R11.16). With N boards behind HAProxy no client needs to see that: one board at a time is

1. set to ``drain`` through HAProxy's runtime API (no new requests; its streams go on),
2. waited on until HAProxy counts no connection to it and calculet reports no active request and
   no job in flight (``GET /admin/models``),
3. loaded with the new package through the admin API — §11 steps 1–11, golden vectors included;
   the call answers once the new generation is Ready or the load failed,
4. checked (it serves the package just loaded, Ready), set back to ``ready`` in HAProxy, and waited on until
   HAProxy's health checks see it ``UP`` — only then is the next board touched.

If any step fails the rollout stops there. The failed board is left serving its old generation
(calculet restores it itself when a load fails after the old one was unloaded; this module checks
that it did) and put back in rotation only if it does; the boards already changed are rolled back
(``POST …/rollback``, the same drain/idle/ready steps around it), unless ``rollback=False``. Every
step lands in a :class:`~calculet.fleet.record.RolloutRecord`; an observer sees each as it ends.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import TypeVar

from calculet.clock import Clock, MonotonicClock
from calculet.errors import CalculetError, Unavailable
from calculet.fleet.board_admin import BoardAdmin, Served
from calculet.fleet.haproxy_runtime import HAProxyRuntime
from calculet.fleet.record import BoardRecord, RolloutRecord, StepRecord

T = TypeVar("T")
Observer = Callable[[StepRecord], None]


@dataclass(frozen=True)
class RolloutOptions:
    drain_timeout_s: float = 150.0
    """Longest wait for a drained board to have no connection and no active request."""
    up_timeout_s: float = 60.0
    """Longest wait for HAProxy to see a board UP (and its /health/ready 200) after a load."""
    poll_s: float = 0.2
    rollback: bool = True
    """Roll the changed boards back when a step fails (False: leave them on the new package)."""


class StepFailed(CalculetError):
    """A rollout step failed; the rollout stops (``board`` and ``action`` name where)."""

    http_status = 503
    code = "rollout_step_failed"


class Rollout:
    """Roll ``package`` under ``alias`` across ``boards`` (in order) of HAProxy ``backend``."""

    def __init__(self, haproxy: HAProxyRuntime, backend: str, boards: Sequence[BoardAdmin], *, alias: str,
                 package: str, options: RolloutOptions = RolloutOptions(), clock: Clock | None = None,
                 pause: Callable[[float], None] = time.sleep, observer: Observer | None = None) -> None:
        self.haproxy = haproxy
        self.backend = backend
        self.boards = list(boards)
        self.alias = alias
        self.package = package
        self.options = options
        self.clock = clock or MonotonicClock()
        self.pause = pause
        self.observer = observer
        self._t0 = self.clock.now()
        self.record = RolloutRecord(backend=backend, alias=alias, package=package,
                                    started_at=datetime.now(timezone.utc).isoformat(timespec="seconds"),
                                    boards=[BoardRecord(b.name) for b in self.boards])

    def package_for(self, board: BoardAdmin) -> str:
        """The package path as ``board`` sees it: ``{board}`` in the path becomes the board's name
        (one store per board, e.g. ``/srv/calculet/{board}/packages/qwen3-v2``)."""
        return self.package.replace("{board}", board.name)

    # ------------------------------------------------------------------ the whole rollout

    def run(self) -> RolloutRecord:
        """Every board in turn; on a failure stop, keep the failed board on its old generation and
        roll the changed ones back. Returns the record (``record.ok`` when every board changed)."""
        try:
            for board in self.boards:
                self.record.board(board.name).before = self._step(board, "before", board.served)
        except CalculetError as exc:
            self.record.outcome, self.record.error = "stopped", f"before any change: {exc}"
            self.boards = []
        for index, board in enumerate(self.boards):
            try:
                self._upgrade(board)
            except CalculetError as exc:
                self.record.failed_board, self.record.error = board.name, str(exc)
                self.record.outcome = "stopped"
                done = index + 1 if self.record.board(board.name).changed else index
                if done == index:
                    self._recover_failed(board)
                self._roll_back(list(reversed(self.boards[:done])))
                break
        self.record.duration_s = round(self.clock.now() - self._t0, 3)
        return self.record

    def _upgrade(self, board: BoardAdmin) -> None:
        entry = self.record.board(board.name)
        self._out_of_rotation(board)
        result = self._step(board, "load", lambda: board.load(self.alias, self.package_for(board)))
        entry.changed = True
        served = self._expect_ready(board, str(result.get("package_sha256") or ""), want_same=True)
        if entry.before is not None and served.package_sha256 == entry.before.package_sha256:
            entry.changed = False  # the same package again: nothing to roll back
        entry.after = served
        self._into_rotation(board)

    # ------------------------------------------------------------------ after a failure

    def _recover_failed(self, board: BoardAdmin) -> None:
        """The failed board: back in rotation only if it serves its old package, Ready."""
        entry = self.record.board(board.name)
        before = entry.before
        try:
            if before is not None:
                entry.after = self._expect_ready(board, before.package_sha256, want_same=True,
                                                 action="restore_check")
                entry.changed = False
            self._into_rotation(board)
        except CalculetError as exc:
            self.record.outcome = "rollback_failed"
            self.record.error = f"{self.record.error}; and board {board.name} was not restored: {exc}"

    def _roll_back(self, changed: list[BoardAdmin]) -> None:
        changed = [b for b in changed if self.record.board(b.name).changed]
        if not changed or not self.options.rollback:
            return
        for board in changed:
            entry = self.record.board(board.name)
            try:
                self._out_of_rotation(board)
                self._step(board, "rollback", lambda b=board: b.rollback(self.alias))  # type: ignore[misc]
                want = entry.before.package_sha256 if entry.before else ""
                entry.after = self._expect_ready(board, want, want_same=True, action="rollback_check")
                entry.rolled_back, entry.changed = True, False
                self._into_rotation(board)
            except CalculetError as exc:
                self.record.outcome = "rollback_failed"
                self.record.error = f"{self.record.error}; and the rollback of {board.name} failed: {exc}"
                return
        if self.record.outcome != "rollback_failed":
            self.record.outcome = "stopped_rolled_back"

    # ------------------------------------------------------------------ steps

    def _out_of_rotation(self, board: BoardAdmin) -> None:
        self._step(board, "drain", lambda: self.haproxy.set_state(self.backend, board.name, "drain"))
        self._step(board, "wait_idle", lambda: self._wait(board, self._idle, self.options.drain_timeout_s,
                                                            "to have no connection and no active request"))

    def _into_rotation(self, board: BoardAdmin) -> None:
        self._step(board, "ready", lambda: self.haproxy.set_state(self.backend, board.name, "ready"))
        self._step(board, "wait_up", lambda: self._wait(board, self._up, self.options.up_timeout_s,
                                                          "to be UP in HAProxy with /health/ready 200"))

    def _expect_ready(self, board: BoardAdmin, sha256: str, *, want_same: bool, action: str = "check") -> Served:
        def check() -> Served:
            served = board.served()
            if served is None or served.state != "ready":
                raise StepFailed(f"board {board.name} serves no Ready generation ({served})")
            if sha256 and want_same and served.package_sha256 != sha256:
                raise StepFailed(f"board {board.name} serves package {served.package_sha256[:12]}, "
                                 f"expected {sha256[:12]}")
            return served
        return self._step(board, action, check)

    def _idle(self, board: BoardAdmin) -> bool:
        return self.haproxy.server(self.backend, board.name).current_sessions == 0 and board.busy() == 0

    def _up(self, board: BoardAdmin) -> bool:
        return self.haproxy.server(self.backend, board.name).up and board.ready()[0]

    def _wait(self, board: BoardAdmin, done: Callable[[BoardAdmin], bool], timeout_s: float, what: str) -> str:
        deadline = self.clock.now() + timeout_s
        while not done(board):
            if self.clock.now() >= deadline:
                raise Unavailable(f"board {board.name} did not come {what} within {timeout_s:g} s")
            self.pause(self.options.poll_s)
        return ""

    def _step(self, board: BoardAdmin, action: str, body: Callable[[], T]) -> T:
        started = self.clock.now()
        ok, detail = False, ""
        try:
            result = body()
            ok = True
            detail = _describe(result)
            return result
        except CalculetError as exc:
            detail = str(exc)
            raise
        finally:
            step = StepRecord(board.name, action, ok, round(started - self._t0, 3),
                              round(self.clock.now() - started, 3), detail)
            self.record.steps.append(step)
            if self.observer is not None:
                self.observer(step)


def _describe(result: object) -> str:
    if isinstance(result, Served):
        return f"generation {result.generation} {result.state} package {result.package_sha256[:12]}"
    if isinstance(result, dict):
        report = result.get("report") or {}
        return (f"generation {result.get('generation')} {result.get('state')}"
                + (f", golden {report.get('golden')}" if report.get("golden") else ""))
    return ""


__all__ = ["Observer", "Rollout", "RolloutOptions", "StepFailed"]
