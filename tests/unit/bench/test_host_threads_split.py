"""bench/host_threads.py --split (issue #20): each label's own CPU on the actor thread, nested labelled calls
subtracted, nothing counted on another thread, and the wrapped functions restored."""

from __future__ import annotations

import sys
import threading
import types
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(ROOT / "bench"))

import host_threads  # noqa: E402  (bench/ is a directory of scripts, not a package)


class _Clock:
    """A fake CPU clock: the test's functions advance it, so the split is exact."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def _module(clock: _Clock) -> types.ModuleType:
    module = types.ModuleType("p8_split_fixture")

    class Work:
        def outer(self) -> None:
            clock.now += 1.0  # its own
            self.inner()
            self.inner()
            clock.now += 2.0  # its own

        def inner(self) -> None:
            clock.now += 5.0

    module.Work = Work  # type: ignore[attr-defined]
    return module


def test_own_cpu_per_label_on_the_actor_thread_only_and_the_functions_restored() -> None:
    """Mutants caught: the nested call's CPU not subtracted (outer 13, not 3); calls on another thread counted
    (counts 2 and 4); the undo that leaves a wrapper behind."""
    clock = _Clock()
    module = _module(clock)
    sys.modules[module.__name__] = module
    original = module.Work.outer
    acc: dict[str, float] = {}
    try:
        undo = host_threads.split_timers(acc, [(module.__name__, "Work", "outer", "outer"),
                                               (module.__name__, "Work", "inner", "inner")], clock)
        module.Work().outer()  # this thread is not the actor: not counted
        assert acc == {}
        actor = threading.Thread(target=lambda: module.Work().outer(), name=host_threads.ACTOR)
        actor.start()
        actor.join()
        undo()
    finally:
        del sys.modules[module.__name__]
    assert acc["outer"] == 3.0 and acc["outer n"] == 1
    assert acc["inner"] == 10.0 and acc["inner n"] == 2
    assert module.Work.outer is original
