"""What the engine delivered to each offered request, as :class:`~calculet.loadsim.analysis.SimRequestRecord` s.

A load simulation observes the real engine only through its public surface: each request's
sink (token instants, the one outcome) and the engine's transition ``observer`` hook (service
start = the transition into ``prefill_running``; decode-ready instants for batch waits; the
scheduler's finish estimate, ``RequestRecord.estimated_finish``, the first time a transition
shows one — issue #13 item 2, read with ``getattr`` so a scheduler without it is fine). That is
the estimate made at admission: the §5.2 screen sets it inside ``submit``, whose own transition out
of ``new`` (to ``prefill_ready`` or ``waiting_admission``) shows it at the arrival instant (issue #13
session 20 checked every request of steady and bursty B16 at every bench load: none recorded later,
none different). A request refused after it was accepted into the admission queue keeps its
estimate in its record too (not scored: it did not complete). The
:class:`RequestTracker` joins the two into the same records the baselines emit, so one
:func:`~calculet.loadsim.analysis.summarize` judges every policy alike. Rejections get a
bounded reason label (:func:`rejection_reason`, §16 bounded labels).
"""

from __future__ import annotations

import re
from typing import Callable, Protocol, Sequence

from calculet.errors import DefinitionError
from calculet.loadsim.analysis import SimRequestRecord
from calculet.loadsim.workload import SimRequest
from calculet.machines.request import FinishReason
from calculet.runtime.request import RequestOutcome
from calculet.runtime.scheduling.registry import RequestRecord

__all__ = ["BatchWaits", "RequestTracker", "rejection_reason"]


class BatchWaits(Protocol):
    """What the tracker needs of a batch log (:class:`~calculet.loadsim.runner.BatchLog`): the
    accepted decode jobs in order, ``[start_s, compiled_batch, active_lanes, wait_s]`` each; the
    tracker raises the last job's ``wait_s`` as its lanes start running."""

    batches: list[list[float]]

_REASON_PATTERNS: tuple[tuple[re.Pattern[str], str], ...] = (
    (re.compile(r"requests already waiting"), "queue_full"),
    (re.compile(r"^waiting prompt tokens"), "waiting_tokens"),
    (re.compile(r"tenant .* waiting tokens"), "tenant_waiting_tokens"),
    (re.compile(r"long-prefill waiting quota"), "long_quota"),
    (re.compile(r"no prospect of service"), "no_prospect"),
    (re.compile(r"over its QPS limit"), "tenant_qps"),
    (re.compile(r"unknown tenant"), "unknown_tenant"),
    (re.compile(r"exceeds the context|KV budget"), "too_long"),
    (re.compile(r"stopping|model is"), "unavailable"),
)
_STATUS_DECISION = {400: "reject_invalid", 429: "reject_capacity", 503: "reject_unavailable"}


def rejection_reason(outcome: RequestOutcome) -> str:
    """A bounded label for a rejection: the §5.2 decision and which limit refused it.

    ``reject_capacity:tenant_qps``, ``reject_capacity:queue_full``... — the free-text detail
    names tenants and numbers, which must not become label values (§16 bounded labels).
    """
    decision = _STATUS_DECISION.get(outcome.http_status, f"reject_{outcome.http_status}")
    for pattern, label in _REASON_PATTERNS:
        if pattern.search(outcome.detail):
            return f"{decision}:{label}"
    return decision


class _Sink:
    """One request's sink: token instants and the single outcome (a second close is counted)."""

    __slots__ = ("tracker", "index", "tokens", "token_ids", "outcome", "closes", "late_tokens")

    def __init__(self, tracker: RequestTracker, index: int) -> None:
        self.tracker = tracker
        self.index = index
        self.tokens: list[float] = []
        self.token_ids: list[int] = []
        self.outcome: RequestOutcome | None = None
        self.closes = 0
        self.late_tokens = 0

    def token(self, request_id: int, token: int) -> None:
        if self.outcome is not None:
            self.late_tokens += 1
        self.tokens.append(self.tracker.now())
        if self.tracker.keep_tokens:
            self.token_ids.append(token)

    def close(self, outcome: RequestOutcome) -> None:
        self.closes += 1
        if self.outcome is None:
            self.outcome = outcome
            self.tracker.closed_at[self.index] = self.tracker.now()


class RequestTracker:
    """Turns sink callbacks and request transitions into :class:`SimRequestRecord` s.

    ``now`` returns the virtual time (seconds since the run's origin). Use :meth:`observer` as the
    engine's transition observer; it also completes the batch log's wait figures.
    """

    def __init__(self, now: Callable[[], float], log: BatchWaits | None = None, *, keep_tokens: bool = False) -> None:
        self.now = now
        self.log = log
        self.keep_tokens = keep_tokens
        self.sinks: list[_Sink] = []
        self.request_ids: list[int] = []
        self.closed_at: dict[int, float] = {}
        self._service_start: dict[int, float] = {}
        self._ready_since: dict[int, float] = {}
        self._estimated: dict[int, float] = {}

    def new_sink(self) -> _Sink:
        sink = _Sink(self, len(self.sinks))
        self.sinks.append(sink)
        self.request_ids.append(0)
        return sink

    def bind(self, index: int, request_id: int) -> None:
        """The engine's id for the request at input ``index`` (0: rejected before an id was made)."""
        self.request_ids[index] = request_id

    def observer(self, rec: RequestRecord, source: str, target: str) -> None:
        """The engine's transition hook: service start, decode-ready instants, batch waits."""
        if source == target:
            return
        rid = rec.request_id
        if rid not in self._estimated:
            estimate = getattr(rec, "estimated_finish", None)
            if estimate is not None:
                self._estimated[rid] = float(estimate)
        if target == "prefill_running":
            self._service_start.setdefault(rid, self.now())
        elif target == "decode_ready":
            self._ready_since[rid] = self.now()
        elif target == "decode_running":
            since = self._ready_since.pop(rid, None)
            log = self.log
            if since is not None and log is not None and log.batches:
                batch = log.batches[-1]
                wait = self.now() - since
                if wait > batch[3]:
                    batch[3] = wait
        if target in ("completed", "cancelled", "failed"):
            self._ready_since.pop(rid, None)

    def records(self, requests: Sequence[SimRequest]) -> tuple[SimRequestRecord, ...]:
        """One record per offered request, in input order (``request_id`` = input index)."""
        if len(requests) != len(self.sinks):
            raise DefinitionError(f"{len(requests)} requests but {len(self.sinks)} sinks")
        out: list[SimRequestRecord] = []
        for i, (req, sink) in enumerate(zip(requests, self.sinks)):
            outcome = sink.outcome
            if outcome is None:
                raise DefinitionError(f"request {i} has no outcome: the run did not finish")
            reason = outcome.finish_reason
            finish = self.closed_at.get(i)
            rid = self.request_ids[i]
            if reason is FinishReason.REJECTED and not sink.tokens:
                # refused at submit (no estimate), or later from the admission queue: then with the estimate it was
                # accepted with, which the estimate-bound's splices compare (issue #13 session 20: the 5 of 560
                # "mismatches" of steady b16 were such requests, refused in the splice, their estimate dropped)
                out.append(SimRequestRecord.for_request(i, req, admitted=False, rejection_reason=rejection_reason(outcome),
                                                        finish_s=finish, finish_reason="rejected",
                                                        estimated_finish_s=self._estimated.get(rid)))
                continue
            times = tuple(sink.tokens)
            out.append(SimRequestRecord.for_request(
                i, req, admitted=True, service_start_s=self._service_start.get(rid),
                first_token_s=times[0] if times else None, token_times_s=times, finish_s=finish,
                finish_reason=reason.name.lower(), estimated_finish_s=self._estimated.get(rid)))
        return tuple(out)
