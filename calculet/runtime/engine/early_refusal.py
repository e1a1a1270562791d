"""What the HTTP front answers from the engine's admission snapshot (§5.2, issue #13): its 429's words, the refusal
it decides and its counters — the vocabulary :mod:`.admission_snapshot`'s :class:`~.admission_snapshot.EarlyAdmission`
decides in, kept apart from the deciding so that the server's modules read it without the decision's arithmetic.
"""

from __future__ import annotations

from dataclasses import dataclass


NEVER_REASON = ("no prospect of service before the deadline: it would finish late even on an idle device (it would "
                "fit never on this device)")
"""The 429's message of a request late even on an idle device (the engine's words, :mod:`.on_time_refusal`)."""

FIT_IN_REASON = ("no prospect of service before the deadline: with the work already admitted the shared-device "
                 "estimate finishes it late (it would fit in {:.1f} s)")
"""... and of one that would fit later, formatted with the seconds until then."""


def refusal_reason(fit_in_s: float | None) -> str:
    """The 429's message of a request that would fit in ``fit_in_s`` seconds (None: never)."""
    return NEVER_REASON if fit_in_s is None else FIT_IN_REASON.format(fit_in_s)


@dataclass(slots=True)
class EarlyRefusal:
    """A 429 decided from the snapshot: ``retry_at`` (engine clock) when it would fit, None for never.

    It keeps the seconds until it would fit (``fit_in_s``), not its message: the refusal lane writes the answer from
    bytes encoded once per message (:mod:`calculet.server.refusal_lane`), and only the full path needs the text."""

    retry_at: float | None
    retry_after_s: float | None
    fit_in_s: float | None = None
    known: bool = False
    """Decided on the lanes the engine holds once it has decided what is on its way (:meth:`.admission_snapshot.EarlyAdmission._lanes`):
    the engine's own ``Retry-After`` (else one from the snapshot's lanes, which the forwards may since have filled)."""

    @property
    def reason(self) -> str:
        """The 429's message (:func:`refusal_reason`)."""
        return refusal_reason(self.fit_in_s)


@dataclass(frozen=True)
class EarlyAdmissionStatistics:
    """The front's refusals and forwards (§16-style counters; :mod:`calculet.server.metrics_front` exports them)."""

    refused: int
    """Requests answered 429 from a snapshot, without the engine."""
    refused_never: int
    """... of which late even on an idle device (no ``Retry-After``)."""
    forwarded: dict[str, int]
    """Requests handed to the engine, by why the snapshot could not refuse them."""
    max_refusal_age_s: float
    """The oldest snapshot a refusal was made from (engine clock seconds since it was taken)."""
    max_forwarded_since_snapshot: int
    """The most requests forwarded on one snapshot before the actor replaced it (work it did not count)."""
    retry_slots: int
    """Retry slots (ghosts) the front holds."""
    held: int = 0
    """Requests that waited for the engine's next answer (and its snapshot) before being decided
    (:meth:`.admission_snapshot.EarlyAdmission.should_hold`)."""
    provisional: int = 0
    """Refusals (of :attr:`refused`) that counted requests the front forwarded on the snapshot and the engine had
    not decided yet (:meth:`.admission_snapshot.EarlyAdmission.decide`)."""


FORWARD_REASONS = ("no_snapshot", "expired", "not_latest", "kv_budget", "fits", "alone", "raced")
"""Why the front handed a request to the engine (:meth:`.admission_snapshot.EarlyAdmission.decide`): a bounded set."""
