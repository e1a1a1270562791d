"""Lifecycle operations on the engine's actor (§11 step 5, R11.5; DESIGN principle 2).

An operation (load, unload, rollback) is a generator the actor resumes every tick: it runs a
step, then yields a :class:`Wait` — what it waits for (a drain, the device falling idle for
golden) with an optional deadline on the engine clock — and the engine keeps serving in between.
The :class:`LifecycleLock` is the lifecycle lock: one operation runs steps 5 and later, the others
wait in order. Callers on other threads hold an :class:`OperationHandle` and reach the actor
through an :class:`ActorPort` (Trio's ``op``/``op_nowait``).
"""

from __future__ import annotations

import collections
from collections.abc import Callable, Generator
from dataclasses import dataclass
from typing import Any, Protocol, TypeVar

from calculet.errors import DefinitionError
from calculet.runtime.actor import Reply
from calculet.runtime.models.reports import LoadStep, StepHook, StepTiming, UnloadStep

__all__ = ["ActorPort", "Body", "InlinePort", "LifecycleLock", "Operation", "OperationHandle", "Steps", "Wait"]

T = TypeVar("T")


@dataclass
class Wait:
    """What an operation waits for: ``ready()`` on the actor, or ``deadline`` on the engine clock."""

    ready: Callable[[], bool]
    deadline: float | None
    what: str


Body = Generator[Wait, bool | None, Any]


class Operation:
    """A lifecycle operation the actor resumes tick after tick until it returns or raises."""

    def __init__(self, kind: str, alias: str, generation: int, clock: Any) -> None:
        self.kind = kind
        self.alias = alias
        self.generation = generation
        self.reply: Reply[Any] = Reply()
        self.step = "waiting for the lifecycle lock"
        self._body: Body | None = None
        self._wait: Wait | None = None
        self._clock = clock

    def start(self, body: Body) -> Operation:
        self._body = body
        return self

    @property
    def done(self) -> bool:
        return self.reply.done()

    @property
    def waiting_for(self) -> str:
        return self._wait.what if self._wait is not None else ""

    @property
    def deadline(self) -> float | None:
        return self._wait.deadline if self._wait is not None else None

    def advance(self) -> bool:
        """Run until the operation waits for something not yet true, or ends. True when it ended."""
        while True:
            send: bool | None = None
            wait = self._wait
            if wait is not None:
                ready = wait.ready()
                if not ready and (wait.deadline is None or self._clock.now() < wait.deadline):
                    return False
                send = ready
            assert self._body is not None
            try:
                self._wait = self._body.send(send)
            except StopIteration as stop:
                self._wait = None
                self.reply.set(stop.value)
                return True
            except Exception as exc:  # noqa: BLE001 - delivered to the caller through the reply
                self._wait = None
                self.reply.fail(exc)
                return True

    def abort(self, error: BaseException) -> None:
        """The engine stopped: the operation will never resume."""
        try:
            if self._body is not None:
                self._body.close()
        finally:
            if not self.reply.done():
                self.reply.fail(error)

    def describe(self) -> str:
        wait = f", waiting for {self.waiting_for}" if self._wait is not None else ""
        return f"{self.kind} {self.alias!r} generation {self.generation}: {self.step}{wait}"


class LifecycleLock:
    """The lifecycle lock (R11.5): the active operation, then the queued ones in order.

    ``after_each`` runs after every resumption (the engine executes the machines' commands an
    operation's step emitted)."""

    def __init__(self, after_each: Callable[[], None]) -> None:
        self._after_each = after_each
        self.active: Operation | None = None
        self._queue: collections.deque[Operation] = collections.deque()

    def enqueue(self, op: Operation) -> None:
        """Queue ``op`` and let it run at once if the lock is free."""
        self._queue.append(op)
        self.poll()

    def poll(self) -> None:
        """Resume the active operation, then the queued ones in order."""
        while True:
            op = self.active
            if op is None:
                if not self._queue:
                    return
                op = self.active = self._queue.popleft()
            ended = op.advance()
            self._after_each()
            if not ended:
                return
            self.active = None

    def held(self) -> bool:
        """Whether an operation holds the lock (it is at step 5 or later, or unloading)."""
        return self.active is not None

    def busy(self) -> bool:
        return self.active is not None or bool(self._queue)

    @property
    def queued(self) -> int:
        return len(self._queue)

    def next_deadline(self) -> float | None:
        return self.active.deadline if self.active is not None else None

    def describe(self) -> str | None:
        return self.active.describe() if self.active is not None else None

    def abort_all(self, error: BaseException) -> None:
        """The engine stopped: every pending operation fails with ``error``."""
        for op in ([self.active] if self.active is not None else []) + list(self._queue):
            op.abort(error)
        self.active = None
        self._queue.clear()


class ActorPort(Protocol):
    """How the manager reaches the engine's actor (the engine and the driver provide one each)."""

    def call(self, fn: Callable[[], T], timeout: float | None) -> T:
        """Run ``fn`` on the actor and return its result."""
        ...

    def run(self, op: Operation, timeout: float | None) -> Any:
        """Wait for a queued operation to end (real time, or virtual time stepped by the caller)."""
        ...


class InlinePort:
    """The port while the engine is being built: the calling thread is the actor, nothing ticks."""

    def __init__(self, poll: Callable[[], None]) -> None:
        self._poll = poll

    def call(self, fn: Callable[[], T], timeout: float | None) -> T:
        return fn()

    def run(self, op: Operation, timeout: float | None) -> Any:
        self._poll()
        if not op.done:
            raise DefinitionError(f"bring-up cannot wait: {op.describe()}")
        return op.reply.wait(0)


class OperationHandle:
    """A queued load/unload/rollback: ``done()`` and ``result(timeout)`` from any thread."""

    def __init__(self, op: Operation, port: ActorPort) -> None:
        self._op = op
        self._port = port

    @property
    def kind(self) -> str:
        return self._op.kind

    @property
    def alias(self) -> str:
        return self._op.alias

    @property
    def generation(self) -> int:
        return self._op.generation

    @property
    def step(self) -> str:
        return self._op.step

    def done(self) -> bool:
        return self._op.done

    def result(self, timeout: float | None = None) -> Any:
        """The operation's report; raises its error (e.g. :class:`LoadFailed`) or ``TimeoutError``.

        A timeout does not stop the operation: it keeps running on the actor (``status()`` shows it)."""
        return self._port.run(self._op, timeout)



class Steps:
    """Marks each §11/§12 step as it starts: the operation's ``step`` text, the test seam
    ``hook`` (called with (step, generation); raising fails that step) and the step's timing."""

    def __init__(self, clock: Any) -> None:
        self.clock = clock
        self.hook: StepHook | None = None

    def step(self, op: Operation, step: LoadStep | UnloadStep, gen_id: int) -> float:
        kind = "load" if isinstance(step, LoadStep) else "unload"
        op.step = f"{kind} step {int(step)}: {step.title}"
        return self.start(step, gen_id)

    def start(self, step: LoadStep | UnloadStep, gen_id: int) -> float:
        """Steps 1–4 (calling thread): the hook only; the operation does not exist yet."""
        if self.hook is not None:
            self.hook(step, gen_id)
        return self.clock.now()  # type: ignore[no-any-return]

    def soft(self, op: Operation, step: LoadStep | UnloadStep, gen_id: int, problems: list[str]) -> float | None:
        """A step whose failure is recorded and does not stop the sequence; None if it failed."""
        try:
            return self.step(op, step, gen_id)
        except Exception as exc:  # noqa: BLE001 - recorded as a problem of this step
            problems.append(f"step {int(step)} ({step.title}): {exc}")
            return None

    def timed(self, timings: list[StepTiming], step: LoadStep, t0: float) -> float:
        """Record that ``step`` ran from ``t0`` until now (the report's ``steps``); its duration."""
        took: float = self.clock.now() - t0
        timings.append(StepTiming(step.name.lower(), t0, took))
        return took
