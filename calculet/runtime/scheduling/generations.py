"""Which model generation requests are pinned to, and what a change of generation does to them
(§10, §11 steps 5–10, §12, R10.3).

The model manager tells the scheduler the alias's generation, its availability and its profiles
(``Scheduler.set_model``); this is where that view is kept and acted on. A request is pinned
(bound) to one generation once and never moved (R10.3). Decisions where the spec is silent:

* one generation is served at a time (CalRT 0.7.6 cannot co-reside, §11 step 6); requests still
  pinned to a replaced generation are ended when it goes away (running ones drain);
* while a replacement runs (§11 step 5 "stop new admission" until step 10), new requests are
  *held*: they wait unbound (WaitingModel) and are pinned to whichever generation is Ready when
  the hold ends — the new one, or the old one again if the load failed; requests already pinned
  keep being served;
* §12 draining cancels the requests still waiting for admission to the draining generation.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable

from calculet.runtime.scheduling.admission import AdmissionController, ModelAvailability
from calculet.runtime.scheduling.apply import end_between_chunks
from calculet.runtime.scheduling.plan import SchedulingCapabilities
from calculet.runtime.scheduling.prefill import PrefillScheduler
from calculet.runtime.scheduling.profiles import ProfileSet
from calculet.runtime.scheduling.registry import RUNNING_STATES, RequestRecord, RequestRegistry


class GenerationBinding:
    """The serving generation as the scheduler sees it, and the requests waiting for one."""

    def __init__(self, *, registry: RequestRegistry, admission: AdmissionController, prefill: PrefillScheduler,
                 capabilities: SchedulingCapabilities, default_max_seq: int,
                 pump: Callable[[float], None], admit_now: Callable[[RequestRecord, float], bool]) -> None:
        self.registry = registry
        self.admission = admission
        self.prefill = prefill
        self.capabilities = capabilities
        self._default_max_seq = default_max_seq
        self._pump = pump
        """Admit waiting requests (the scheduler's ``_pump``)."""
        self._admit_now = admit_now
        """Admit a new request at once if nothing else waits and the budget has room (``admit_now``, its
        one event), else False (the scheduler's ``_admit_now``)."""
        self.generation = 0
        self.availability = ModelAvailability.UNLOADED
        self.held = False
        self.profiles: ProfileSet | None = None
        self._model_wait: deque[RequestRecord] = deque()

    def max_seq(self) -> int:
        """The context a new request must fit: the serving profiles', or the configured default."""
        return self.profiles.max_seq if self.profiles is not None else self._default_max_seq

    def set_model(self, generation: int, availability: ModelAvailability, profiles: ProfileSet | None,
                  detail: str, now: float) -> None:
        """The model manager's view of the alias (see ``Scheduler.set_model``)."""
        old = self.generation
        if old and generation != old:
            self._end_generation(old, detail)
        self.generation = generation
        self.availability = availability
        if profiles is not None:
            self.profiles = profiles
            self.prefill.chunk_tokens = profiles.prefill_chunk_tokens if self.capabilities.incremental_prefill else None
        if availability is ModelAvailability.READY:
            if not self.held:
                self._bind_waiting_model()
            self._pump(now)
        elif availability is ModelAvailability.DRAINING:  # §12: cancel waiting requests
            for rec in self.registry.live():
                if rec.state == "waiting_admission" and rec.generation == generation:
                    self.registry.fire(rec, "cancel")
        elif availability is ModelAvailability.FAILED:
            self._end_generation(generation, detail)

    def hold(self, hold: bool, now: float) -> None:
        """Hold new requests unbound, or release the hold (see ``Scheduler.hold_new_requests``)."""
        self.held = hold
        if not hold and self.availability is ModelAvailability.READY:
            self._bind_waiting_model()
            self._pump(now)

    def place(self, rec: RequestRecord, now: float) -> None:
        """A new request that passed screening: admitted at once (pinned and admitted by one event,
        never holding waiting budget) when the serving generation is Ready, nothing else waits and the
        budget has room; else it takes waiting budget (``accept``) and is pinned to the serving
        generation and queued for admission, or, with no generation Ready or new requests held,
        waits unbound (WaitingModel)."""
        if self.availability is ModelAvailability.READY and not self.held:
            if self._admit_now(rec, now):
                return
            self.admission.accept(rec)
            self.registry.fire(rec, "bind", gen=self.generation)
            self.admission.enqueue(rec)
            self._pump(now)
        else:
            self.admission.accept(rec)
            self.registry.fire(rec, "wait_model")
            self._model_wait.append(rec)

    def reject_waiting(self, detail: str) -> int:
        """End every request still waiting for a generation with 503. Returns how many ended."""
        waiting, self._model_wait = self._model_wait, deque()
        ended = 0
        for rec in waiting:
            if rec.state == "waiting_model":
                self.registry.reject(rec, 503, detail)
                ended += 1
        return ended

    def shutdown(self) -> None:
        """Refuse new requests (503); cancel everything not on the device; running jobs drain."""
        self.availability = ModelAvailability.SHUTDOWN
        for rec in self.registry.live():
            state = rec.state
            if state == "finishing":
                self.registry.finish(rec.request_id)
            elif state == "prefill_running" and self.prefill.queued(rec):
                self.registry.fire(rec, "cancel")
                end_between_chunks(self.registry, rec)
            else:
                self.registry.cancel(rec.request_id)

    def _end_generation(self, generation: int, detail: str = "") -> None:
        """Requests pinned to a generation that can no longer serve them end (running ones drain)."""
        for rec in self.registry.live():
            if rec.generation != generation:
                continue
            state = rec.state
            if state == "finishing":
                self.registry.finish(rec.request_id)
            elif state == "prefill_running" and self.prefill.queued(rec):
                if detail:
                    rec.detail = detail
                self.registry.fire(rec, "prefill_done", job=rec.job_id, ok=False, stop=False)
            elif state not in RUNNING_STATES:
                self.registry.fail(rec, detail)

    def _bind_waiting_model(self) -> None:
        max_seq = self.max_seq()
        waiting, self._model_wait = self._model_wait, deque()
        for rec in waiting:
            if rec.state != "waiting_model":
                continue
            if rec.prompt_tokens + rec.max_new_tokens > max_seq:
                self.registry.reject(rec, 400, f"prompt + max_new_tokens exceeds the context of {max_seq}")
                continue
            self.registry.fire(rec, "bind", gen=self.generation)
            self.admission.enqueue(rec)
