"""Model generation lifecycle (§10 ModelState, §11 load, §12 unload) — the one declaration of it."""

from __future__ import annotations

from calculet.logic.expr import And, If, Implies, Not, Or
from calculet.logic.types import Bool, Int
from calculet.machines.core import Machine
from calculet.machines.definition import Event, Invariant, Param, State, StepProperty, T, Var


INFLIGHT = Int(ge=0)
"""The type of the ``inflight`` argument: how many jobs of this generation the device may still write
(submitted, timed out or quarantined), counted in the jobs table, their one owner
(``calculet/runtime/models/generations.py`` ``jobs_on_device``), when the event fires. The machine keeps no
copy of that count (issue #20: a counter fired up and down per job was two events per decoded token); the
properties that read it are proved on the jobs × generations system
(:class:`~calculet.machines.model_couplings.GenerationJobSystem`), whose step guards hold the argument to it."""


def _self_loops(states, event, guard=None, effect=None) -> list[T]:
    """Counter bookkeeping: the same self-loop in every state where the counted thing may happen."""
    return [T(s, event, s, guard=guard, effect=effect) for s in states]


def _drain_asked(v, replace):
    """Every ``drain`` row records the unload and why (§11 step 6 replacement or §12 unload); an unload
    asked again while one is pending keeps the first one's cause (``drain_cause_is_fixed``)."""
    return {"unload_pending": True, "replacing": If(v.unload_pending, v.replacing, replace)}


class ModelMachine(Machine):
    """One immutable model generation, from load to unload (§10–§12).

    ``buffers`` stands for everything step 7 of a load creates on the device (calbin,
    configuration, KvManager, pools, runtime buffers); the rule the spec repeats in §12 is that
    none of it is freed while a submitted job may still write it.

    Decisions where the spec is silent (requirements.md, ambiguities 11, 14, 15):

    * Load steps map to states: 1–4 Validating, 5–7 Configuring, 8–9 Warming, 10 Ready.
    * A load that fails before step 7 returns to Unloaded (nothing was created); one that fails
      at or after step 7 goes through Unloading so the cleanup is verified like any unload.
    * Unloading is the state in which §12's "free sequences/KV … verify device memory/health"
      runs; it is entered from Draining once the generation is idle.
    * At the drain deadline with jobs still submitted the generation goes to Recovering and
      keeps its buffers (§12); a device reset per the contract is what ends those jobs.
    * The jobs in flight are counted where they live, in the jobs table, not here: the events
      whose guards need the count take it as their ``inflight`` argument (:data:`INFLIGHT`), and
      what must hold of it — every job on the device has a live generation with its buffers, and
      none is in doubt while the generation is Ready — is proved on the joint system
      (``GenerationJobSystem``). Recovering ends (``recovered``) once every job of the generation
      ended, none being left in doubt.
    * Failed is where a generation goes when recovery gives up (reset budget exhausted,
      §15 recovery), at once, even with jobs still in flight: they stay in doubt and keep their
      buffers until they end (or a device restart ends them); it can be unloaded once nothing is
      pinned or in flight.
    * An unload (or a replacement's step 6) is recorded the moment it is asked for, whatever the
      state (``unload_pending``, and ``replacing`` for why: §11 step 5 holds new requests, a
      plain unload rejects them, R12.2), and is never undone: a Recovering generation with an
      unload pending goes back to Draining, not Ready, when recovery succeeds.

    With these, the scheduler's availability of a generation is a function of this valuation
    (``calculet.runtime.models.availability.availability_of``), not a second copy kept by hand.
    """

    spec = "§10, §11, §12, §13.1"
    examples = [dict(generation=1)]

    generation = Param(Int(ge=1), doc="ModelGenerationId")

    active_requests = Var(Int(ge=0), doc="requests pinned to this generation and not yet terminal")
    buffers = Var(Bool(), doc="device resources of step 7 exist")
    unload_pending = Var(Bool(), doc="an unload or a replacement asked to drain this generation (set by every "
                                     "drain row, in Ready, Recovering or Failed); cleared only once it is Unloaded")
    replacing = Var(Bool(), doc="that drain is a replacement's (§11 steps 5–6: new requests held, pinned ones "
                                "still served), not a plain unload (§12: new requests rejected); fixed by the drain")

    unloaded = State(initial=True)
    validating = State(doc="steps 1–4: trusted path, signature and hashes, static checks, capacity plan")
    configuring = State(doc="steps 5–7: lifecycle lock, drain old if needed, CreateCalbin → configure → KvManager → pools")
    warming = State(doc="steps 8–9: inspect exact tensors/profile, golden + warmup")
    ready = State(doc="serving; the alias may point here (step 10)")
    draining = State(doc="no new requests; admitted ones and submitted jobs finish")
    unloading = State(doc="idle; freeing sequences, pools, buffers, KvManager, calbin; verifying the device")
    recovering = State(doc="a timeout/CCU fault or drain deadline left jobs in doubt")
    failed = State(doc="recovery gave up; unavailable until unloaded")

    load = Event("load(alias, package) began")
    validated = Event("steps 1–4 passed")
    configured = Event("step 7 created calbin, configuration, KvManager and pools")
    warmed = Event("steps 8–9 passed: tensors/profile match, golden and warmup OK")
    load_failed = Event("a load step failed")
    acquire = Event("a request was pinned to this generation")
    release_request = Event("a pinned request reached a terminal state")
    drain = Event("unload() or a replacement began (§12 Ready → Draining); recorded in Recovering/Failed",
                  replace=Bool(), inflight=INFLIGHT)
    drained = Event("no active requests and no in-flight jobs remain", inflight=INFLIGHT)
    drain_deadline = Event("the drain deadline passed with jobs still submitted (§12)", inflight=INFLIGHT)
    fault = Event("timeout / CCU fault / unknown DMA on a job of this generation")
    recovered = Event("recovery succeeded; serve again, or go on draining if an unload is pending",
                      inflight=INFLIGHT)
    give_up = Event("recovery failed or its budget is exhausted (jobs still in flight stay in doubt)")
    resume_unload = Event("recovery of a draining generation finished; continue the unload", inflight=INFLIGHT)
    freed = Event("step 12: sequences, pools, buffers, KvManager and calbin destroyed")
    verified = Event("device memory and health back to baseline")

    transitions = [
        T(unloaded, load, validating),
        T(validating, validated, configuring),
        T(configuring, configured, warming, effect=lambda v: {"buffers": True}),
        T(warming, warmed, ready),
        T(validating, load_failed, unloaded),
        T((configuring, warming), load_failed, unloading, effect=lambda v: {"buffers": True}),
        T(ready, acquire, ready, effect=lambda v: {"active_requests": v.active_requests + 1}),
        *_self_loops((ready, draining, recovering, failed), release_request,
                      guard=lambda v: v.active_requests >= 1,
                      effect=lambda v: {"active_requests": v.active_requests - 1}),
        T(ready, drain, draining, effect=_drain_asked),
        T(recovering, drain, recovering, effect=_drain_asked,
          doc="an unload asked while the device recovers: recorded; the drain goes on once recovery ends"),
        T(failed, drain, failed, guard=lambda v, inflight: Or(v.active_requests >= 1, inflight >= 1),
          effect=_drain_asked, doc="an unload asked of a Failed generation that still has pinned requests or "
                                   "jobs in flight: recorded; it is unloaded (unload_failed) once they ended"),
        T(failed, drain, unloading, name="unload_failed", effect=_drain_asked,
          guard=lambda v, inflight: And(v.active_requests == 0, inflight == 0)),
        T(draining, drained, unloading,
          guard=lambda v, inflight: And(v.active_requests == 0, inflight == 0)),
        T(draining, drain_deadline, recovering, guard=lambda v, inflight: inflight >= 1,
          policy="§12: the deadline matters only while jobs are still submitted; with none the drain ends"),
        T((ready, draining), fault, recovering),
        T(recovering, recovered, ready, guard=lambda v, inflight: And(inflight == 0, Not(v.unload_pending)),
          doc="every job of the generation ended (a reset per the contract ended those still on the device, or "
              "each its own late end): none is left in doubt"),
        T(recovering, recovered, draining, guard=lambda v, inflight: And(inflight == 0, v.unload_pending),
          doc="recovery ended while an unload was pending: the drain goes on (never Ready again)"),
        T(recovering, give_up, failed),
        T(recovering, resume_unload, unloading,
          guard=lambda v, inflight: And(inflight == 0, v.active_requests == 0)),
        T(unloading, freed, unloading, guard=lambda v: v.buffers, effect=lambda v: {"buffers": False},
          policy="§12 step 12 destroys what step 7 created, once: a second free is refused, not repeated"),
        T(unloading, verified, unloaded, guard=lambda v: Not(v.buffers),
          effect=lambda v: {"unload_pending": False, "replacing": False}),
    ]

    invariants = [
        Invariant("R3.3", name="serving_has_resources", rejects=({"state": "ready", "buffers": False},),
                  doc="from warm-up until unload, the generation owns its device resources",
                  predicate=lambda v: Implies(v.at("warming", "ready", "draining", "recovering", "failed"),
                                              v.buffers)),
        Invariant("R12.9", name="unloaded_is_clean", rejects=({"state": "unloaded", "buffers": True}, {"state": "warming", "buffers": True, "active_requests": 1}),
                  doc="before step 7 nothing is on the device; before Ready nothing is pinned (nor in flight: "
                      "GenerationJobSystem.jobs_only_on_a_live_generation)",
                  predicate=lambda v: And(
                      Implies(v.at("unloaded", "validating", "configuring"), Not(v.buffers)),
                      Implies(v.at("unloaded", "validating", "configuring", "warming"), v.active_requests == 0))),
        Invariant("R12.3", name="unloading_is_idle",
                  rejects=({"state": "unloading", "active_requests": 1, "buffers": True},),
                  doc="cleanup runs only when no request is pinned (and no job is in flight: "
                      "GenerationJobSystem.jobs_only_on_a_live_generation)",
                  predicate=lambda v: Implies(v.at("unloading"), v.active_requests == 0)),
        Invariant("R12.2", name="unload_is_never_undone",
                  doc="an unload is recorded as soon as it is asked for and holds until Unloaded: a Draining "
                      "generation always has one (and knows whether a replacement holds new requests, §11 step 5, "
                      "or they are rejected, §12), and a generation that loads or serves (Ready) never has one — "
                      "so the scheduler's availability is a function of the machine (runtime/models/availability.py)",
                  predicate=lambda v: And(Implies(v.replacing, v.unload_pending),
                                          Implies(v.at("draining"), v.unload_pending),
                                          Implies(v.at("unloaded", "validating", "configuring", "warming", "ready"),
                                                  Not(v.unload_pending))),
                  rejects=({"state": "ready", "unload_pending": True, "buffers": True},
                           {"state": "draining", "unload_pending": False, "buffers": True},
                           {"state": "recovering", "unload_pending": False, "replacing": True, "buffers": True},
                           {"state": "unloaded", "unload_pending": True})),
        StepProperty("R11.5", name="drain_cause_is_fixed",
                     rejects=(({"state": "recovering", "unload_pending": True, "replacing": False, "buffers": True},
                               {"unload_pending": True, "replacing": True}),
                              ({"state": "draining", "unload_pending": True, "replacing": True, "buffers": True},
                               {"state": "recovering", "unload_pending": True, "replacing": False})),
                     doc="the cause of a pending unload never changes: a replacement keeps new requests held until "
                         "the old generation is gone (§11 steps 5–10), a plain unload keeps rejecting them (§12)",
                     predicate=lambda pre, post: Implies(And(pre.unload_pending, post.unload_pending),
                                                         post.replacing == pre.replacing)),
        StepProperty("R12.2", name="admission_only_when_ready", rejects=(({"state": "draining", "active_requests": 0}, {"active_requests": 1}),),
                     doc="new requests are pinned only to a Ready generation",
                     predicate=lambda pre, post: Implies(post.active_requests > pre.active_requests,
                                                         pre.at("ready"))),
    ]
