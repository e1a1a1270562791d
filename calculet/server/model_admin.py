"""The ``ModelAdmin`` seam of the admin API and its binding to the engine's model manager (§10–§12).

Why a seam: the admin routes (:mod:`calculet.server.admin`) speak HTTP; loading, draining,
unloading and rolling back a model are the runtime's (§11, §12). :class:`ModelAdmin` is the
small protocol between them — methods return plain dicts (the
:class:`~calculet.server.schemas.ModelStatusResponse` shape, with an ``OperationReport`` under
``report`` for operations) and raise the runtime's error tree: ``NotFound`` (404),
``BadRequest`` / ``PackageError`` / ``ConfigError`` / a ``LoadFailed`` at §11 steps 1–3 (400),
``Conflict`` (409: unload or drain what is already unloaded or draining), ``Unavailable`` (503),
``NotSupported`` (501). Tests bind it to fakes.

:class:`ManagedModelAdmin` binds it to the engine's
:class:`~calculet.runtime.models.manager.ModelManager` (``engine.models``).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from typing import Any, Protocol, runtime_checkable

from calculet.config import SchedulerConfig
from calculet.errors import CalculetError, Conflict, NotFound, NotSupported, Unavailable
from calculet.runtime.models.manager import ModelManager
from calculet.runtime.models.operations import OperationHandle
from calculet.runtime.models.reports import LoadReport, StepTiming, UnloadReport
from calculet.runtime.models.reports import ModelStatus as ManagerStatus

log = logging.getLogger("calculet.server.admin")


@runtime_checkable
class ModelAdmin(Protocol):
    """Model lifecycle operations of the admin API (§10–§12); the ModelManager implements it."""

    def load(self, alias: str, package: str) -> dict[str, Any]:
        """§11: verify, configure, golden/warm up and publish ``package`` under ``alias``."""
        ...

    def unload(self, alias: str) -> dict[str, Any]:
        """§12: drain the alias's generation and free everything it holds."""
        ...

    def drain(self, alias: str) -> dict[str, Any]:
        """§12 first half: reject new requests for ``alias``; accepted ones run to the end."""
        ...

    def rollback(self, alias: str) -> dict[str, Any]:
        """§11 step 11: publish the previous signed artifact of ``alias`` again."""
        ...

    def status(self) -> list[dict[str, Any]]:
        """Every generation known (alias, generation, §10 state, package, durations, ...)."""
        ...

    def unloaded(self, alias: str) -> bool:
        """True while ``alias`` was unloaded here and no generation is published or on its way."""
        ...


OPERATION_MARGIN_S = 120.0
"""How long an admin call waits for a load/rollback/unload beyond the drain deadline (the old
generation's drain, §11 step 6) before answering 503 "still running" (the operation goes on)."""
STATUS_TIMEOUT_S = 10.0
"""Longest wait for the engine's actor to answer a status read."""


def _steps(timings: tuple[StepTiming, ...]) -> dict[str, float]:
    return {t.step: round(t.seconds, 6) for t in timings}


def _load_report(report: LoadReport) -> dict[str, Any]:
    return {"kind": report.kind, "ok": report.ok, "replaced": report.replaced,
            "previous_drained": report.previous_drained, "downtime_s": report.downtime_s,
            "rollback_available": report.rollback_available, "golden": report.golden,
            "warnings": list(report.warnings), "steps": _steps(report.steps)}


def _unload_report(report: UnloadReport, deadline_ms: int) -> dict[str, Any]:
    return {"kind": "unload", "ok": not report.problems, "drain_s": report.drain_s,
            "deadline_passed": report.deadline_passed, "cancelled_requests": report.cancelled_requests,
            "drain_deadline_ms": deadline_ms, "warnings": list(report.problems), "steps": _steps(report.steps)}


class ManagedModelAdmin:
    """``ModelAdmin`` over the engine's :class:`~calculet.runtime.models.manager.ModelManager` (``engine.models``).

    * ``load`` — §11 steps 1–11 on the calling thread and the engine's actor; the package must
      resolve under ``trust.trusted_roots`` and be signed by a key in ``trust.trusted_keys_dir``
      (the manager checks both). Streams pinned to the old generation run on to their end (up to
      ``executor.drain_deadline_ms``); new requests are held meanwhile and run on the new one.
    * ``rollback`` — the artifact §11 step 11 kept, verified again and loaded as a new generation.
    * ``unload`` — §12, blocking until the generation is Unloaded (drain deadline:
      ``executor.drain_deadline_ms``).
    * ``drain`` — the same §12 unload, started and answered at once (state ``draining``): new
      requests 503 now, accepted ones run to their end or the deadline, then the generation is
      freed. The manager has no "drain and stay resident" operation; :meth:`wait` waits for it.
      Once unloaded, new requests for the alias are 503 until a load or rollback is under way
      (:meth:`unloaded`; the engine alone would hold them for the next load).
    * ``status`` — every generation the manager knows (ended ones too, bounded) with its §10
      state, package sha256, signer, pinned requests and in-flight jobs; ``stopped`` says when
      the engine's actor has ended, after which the records are read directly.

    Failures keep the runtime's error tree: :class:`~calculet.runtime.models.reports.LoadFailed` names the
    §11 step (400 for a package or config the checks refuse); another configured alias is 501
    (one alias per process on CalRT 0.7.6, §13.1); an unknown alias is 404.
    """

    def __init__(self, models: ModelManager, config: SchedulerConfig, *, timeout_s: float | None = None,
                 stopped: Callable[[], bool] = lambda: False) -> None:
        self._models = models
        self._stopped = stopped
        self._config = config
        self._deadline_ms = config.executor.drain_deadline_ms
        self._timeout_s = timeout_s if timeout_s is not None else self._deadline_ms / 1000 + OPERATION_MARGIN_S
        self._lock = threading.Lock()
        self._exclusive = threading.Lock()
        """Serialises the begin of unloads and drains (the state check and the begin are one step)."""
        self._drains: dict[str, OperationHandle] = {}
        self._unloaded: set[str] = set()
        self._operations: dict[str, OperationHandle] = {}
        """The last load, rollback or unload begun here, by alias (readiness reads it, never the actor)."""
        self._starting: dict[str, str] = {}
        """Operations asked for whose begin (§11 steps 1–4, queueing on the actor) has not returned, by alias."""

    # ------------------------------------------------------------------ ModelAdmin

    def load(self, alias: str, package: str) -> dict[str, Any]:
        self._check_alias(alias)
        report: LoadReport = self._finish("load", alias, lambda: self._models.begin_load(alias, package))
        self._published(alias)
        return self._entry(report.generation, report=_load_report(report))

    def rollback(self, alias: str) -> dict[str, Any]:
        self._check_alias(alias)
        report: LoadReport = self._finish("rollback", alias, lambda: self._models.begin_rollback(alias))
        self._published(alias)
        return self._entry(report.generation, report=_load_report(report))

    def unload(self, alias: str) -> dict[str, Any]:
        self._check_alias(alias)
        handle = self._begin_exclusive_unload(alias)
        report: UnloadReport = self._finish("unload", alias, lambda: handle)
        return self._entry(report.generation, report=_unload_report(report, self._deadline_ms))

    def drain(self, alias: str) -> dict[str, Any]:
        self._check_alias(alias)
        handle = self._begin_exclusive_unload(alias)
        log.info("drain requested", extra={"alias": alias, "generation": handle.generation,
                                           "drain_deadline_ms": self._deadline_ms})
        return self._entry(handle.generation, report={"kind": "drain", "ok": True,
                                                      "drain_deadline_ms": self._deadline_ms})

    def status(self) -> list[dict[str, Any]]:
        return [g.as_dict() for g in self._status().generations]

    def loaded_here(self, alias: str) -> bool:
        """True when ``alias`` was not unloaded or drained here: :meth:`unloaded` is then False without asking the
        engine (a set lookup, safe on the event loop)."""
        with self._lock:
            return alias not in self._unloaded

    def unloaded(self, alias: str) -> bool:
        """The engine routes a request for an alias without a generation to the next load (it waits,
        WaitingModel); the HTTP layer answers 503 instead while no load is on its way after an
        unload or drain here. Costs a status read only after such an unload."""
        with self._lock:
            if alias not in self._unloaded:
                return False
        status = self._status()
        if status.current is not None:
            self._published(alias)
            return False
        return status.operation is None and status.queued_operations == 0

    # ------------------------------------------------------------------ operations under way

    def operation_in_progress(self) -> str | None:
        """A load, rollback, unload or drain asked for here and not yet ended, e.g. ``load of 'qwen3'
        (generation 2)`` — known without asking the engine's actor, which may be busy with that very
        operation, so ``/health/ready`` answers 503 at once while a board loads or drains (§10–§12: a
        balancer routes elsewhere before the load holds new requests)."""
        with self._lock:
            running = [f"{h.kind} of {h.alias!r} (generation {h.generation})"
                       for h in (*self._operations.values(), *self._drains.values()) if not h.done()]
            running += [f"{kind} of {alias!r} (starting)" for alias, kind in self._starting.items()]
        return ", ".join(running) or None

    # ------------------------------------------------------------------ waiting

    def wait(self, alias: str, timeout: float | None = None) -> bool:
        """Block until the last drain of ``alias`` has ended (True; at once if there was none)."""
        with self._lock:
            handle = self._drains.get(alias)
        if handle is None:
            return True
        try:
            handle.result(timeout)
        except TimeoutError:
            return False
        except CalculetError:
            pass  # the generation's detail in status() says why
        with self._lock:
            if self._drains.get(alias) is handle:
                del self._drains[alias]
        return True

    # ------------------------------------------------------------------ internals

    def _check_alias(self, alias: str) -> None:
        served = self._models.alias
        if alias == served:
            return
        if alias in {m.alias for m in self._config.models}:
            raise NotSupported(f"this process serves {served!r}; {alias!r} needs a process of its own: CalRT 0.7.6 "
                               "offers no multi-model runtime contract (§13.1–§13.2)", field="alias")
        raise NotFound(f"no model alias {alias!r}; this process serves {served!r}", field="alias")

    def _begin_exclusive_unload(self, alias: str) -> OperationHandle:
        """Begin an unload (or drain) of ``alias``, one caller at a time: while one is under way, or once the
        alias has no generation and none is on its way, the answer is :class:`Conflict` (409) naming the state —
        never a second unload that finds nothing and reports generation 0."""
        with self._exclusive:
            with self._lock:
                pending = self._drains.get(alias)
            if pending is not None and not pending.done():
                raise Conflict(f"{alias!r} (generation {pending.generation}) is already being drained and unloaded; "
                               "GET /admin/models shows its progress", field="alias")
            status = self._status()
            if status.current is None and status.operation is None and status.queued_operations == 0:
                raise Conflict(f"{alias!r} is already unloaded; POST /admin/models/{alias}/load loads it",
                               field="alias")
            handle = self._begin_unload(alias)
            with self._lock:
                self._drains[alias] = handle
            return handle

    def _begin_unload(self, alias: str) -> OperationHandle:
        handle = self._models.begin_unload(alias, drain_deadline_ms=self._deadline_ms)
        with self._lock:
            self._unloaded.add(alias)
        return handle

    def _published(self, alias: str) -> None:
        with self._lock:
            self._unloaded.discard(alias)

    def _finish(self, kind: str, alias: str, begin: Callable[[], OperationHandle]) -> Any:
        with self._lock:
            self._starting[alias] = kind
        try:
            handle = begin()
            with self._lock:
                self._operations[alias] = handle
        finally:
            with self._lock:
                self._starting.pop(alias, None)
        try:
            return handle.result(self._timeout_s)
        except TimeoutError:
            raise Unavailable(f"the {kind} of {alias!r} (generation {handle.generation}) is still running after "
                              f"{self._timeout_s:.0f} s ({handle.step}); GET /admin/models shows its progress",
                              field="alias") from None

    def _status(self) -> ManagerStatus:
        if self._stopped():
            return self._models.status_now()  # the actor has ended: nothing writes the records any more
        try:
            return self._models.status(timeout=STATUS_TIMEOUT_S)
        except TimeoutError:
            raise Unavailable(f"the engine did not answer within {STATUS_TIMEOUT_S:.0f} s") from None

    def _entry(self, generation: int, *, report: dict[str, Any]) -> dict[str, Any]:
        status = self._status()
        found = [g for g in status.generations if g.id == generation]
        if found:
            entry = found[0].as_dict()
        else:  # an operation queued behind another (its generation is chosen when it runs)
            entry = {"alias": status.alias, "generation": generation, "state": "unloaded", "active": False,
                     "detail": f"queued behind: {status.operation}" if status.operation else ""}
        entry["report"] = report
        return entry


__all__ = ["OPERATION_MARGIN_S", "STATUS_TIMEOUT_S", "ManagedModelAdmin", "ModelAdmin"]
