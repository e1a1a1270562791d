"""Coupled-system properties: induction, bounded model checking, vacuity (requests × lanes).

Everything is encoded from a :class:`~calculet.machines.system.CoupledSystem` declaration and
its two machines' declarations, with the per-machine building blocks of
:mod:`calculet.invariants.checks` (``takes``: a row is the one taken; ``post_state``: its
effect): a step is a chain of declared rows on request ``i`` and a chain on lane ``j``.

* **Initiation** — the initial system (requests New, lanes Free, nothing bound) satisfies every
  invariant.
* **Induction** — R requests and L lanes, all symbolic, satisfying every system invariant and
  every instance invariant (proved per machine); request 0 and lane 0 take a step (any
  variant: its guard, each row's own guard, in order); every system invariant, the moved
  instances' invariants and their rows' step properties must hold after. Invariants and steps
  are symmetric, so (0, 0) stands for any pair.

  *Why R = L = 3 covers every R and L.* A binding may also name a lane outside the encoded
  ones (``elsewhere``). Every invariant of RequestLaneSystem is a ∀ over at most two requests
  and one lane, whose atoms read only the named instances (and ``binding[i] == j``,
  ``binding[i] == NONE`` for a named request and lane), and every step reads and writes only
  its own request and lane (``SystemDefinition.local``, checked at declaration). Take a
  counterexample to induction in a system of any size: the broken instance of the invariant
  names at most two requests and one lane; keep those, the moved request and the moved lane —
  at most three requests and two lanes — and turn bindings to dropped lanes into
  ``elsewhere``. The kept pre-state still satisfies every invariant (a ∀ restricted to fewer
  instances), the step is still enabled and does the same (it reads only kept instances), and
  the broken instance is still broken; padded with fresh New requests and Free lanes (which
  satisfy every invariant and take no part) it is a counterexample at R = 3, L = 3. So none
  exists at any size when none exists here. ``check_system_induction`` reports whether the
  declaration's steps are all local; a new invariant must keep the ∀-shape (or raise R, L).
  An invariant that counts every request (``SystemInvariant.counts``: a generation's counter
  equals its pinned requests), or a step that reads other instances, is not of that shape: the
  induction then gives each count a ghost for its part over the instances not encoded and the
  same projection covers every size (:mod:`calculet.invariants.system_induction`; a count that
  does not go through ``SystemView.beyond`` is proved at the encoded size only, and says so).
* **Step properties** (``SystemStepProperty``, #20) — a property of (before, step, after) that no
  state can express ("a lane commits only while the job it is bound to has completed": both
  states of a wrong commit may satisfy every invariant). Each is a goal of the same inductive
  step, on the pre-frame, the post-frame and the variant taken, so it holds of every step from
  every state satisfying the invariants (every reachable one among them). The cutoff carries
  over unchanged: a property of the declared shape (a ∀ over at most two requests and one lane
  whose instance reads only those, before and after) broken at some size names at most two
  requests and one lane; keep them with the moved pair, and the projected step is still enabled,
  still does the same, and still breaks that instance. With ghost counts, before and after share
  the ghosts, as for the invariants. Bounded model checking searches them too, on each depth's
  step (a property that reads the step taken is asked once per move, under its selector), so a
  step only they reject is found as a run from the initial system.
* **Bounded model checking** — from the initial system (parameters and seq ids symbolic),
  every run of up to ``depth`` steps, one query for all depths, with symmetry breaking and a
  partial-order reduction (:mod:`calculet.invariants.system_bmc`).
* **Vacuity** — every step can fire from some state that satisfies the invariants.

This module is the entry point that runs them all; the symbolic system they share is
:mod:`calculet.invariants.system_encoding`, initiation, induction and vacuity are
:mod:`calculet.invariants.system_induction`, and the document is
:mod:`calculet.invariants.system_document`.
"""

from __future__ import annotations

from calculet.invariants.checks import CheckResult, Progress
from calculet.invariants.reachability import check_system_reachability
from calculet.invariants.strength import check_system_witnesses
from calculet.invariants.system_bmc import check_system_bmc
from calculet.invariants.system_induction import check_system_induction, check_system_initiation, check_system_vacuity
from calculet.machines.system import SystemDefinition

__all__ = ["check_system"]


def check_system(sd: SystemDefinition, *, requests: int = 3, lanes: int = 3, depth: int = 6,
                 progress: Progress | None = None, reach: bool = True, fast: bool = False) -> list[CheckResult]:
    """Every joint-system check; ``reach`` adds reachability of every step (the explicit-state
    search, well under a second per system, then the symbolic search for any step it misses);
    with ``fast`` a system declared ``fast_bmc = False`` skips bounded model checking (its proofs
    still run)."""
    results = [check_system_witnesses(sd), check_system_initiation(sd, requests, lanes),
               *check_system_induction(sd, requests, lanes)]
    if progress:
        progress(f"{sd.name}: induction over {len(sd.variants)} step variants")
    results += check_system_vacuity(sd)
    if reach and sd.reach_depth:
        results.append(check_system_reachability(sd, depth=sd.reach_depth))
    if not fast or sd.fast_bmc:
        results.append(check_system_bmc(sd, *(sd.bmc_size or (requests, lanes)), depth))
    if progress:
        progress(f"{sd.name}: bounded model checking to depth {depth}")
    return results
