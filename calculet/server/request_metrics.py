"""What only the service layer measures (§16 latency rows, §5.3 starvation, HTTP counts, request phases).

The engine's statistics (:mod:`calculet.server.metrics`) know nothing of HTTP arrival, the
first byte a client saw or a client that went away; the service does. These histograms and
counters are recorded as requests pass (not read at scrape time) and live in the same
per-app registry as the engine collector. Names follow ``calculet_<component>_<what>_<unit>``;
the only label values are configured tenant names and route templates (R16.9).

The request phases — time queued before the first prefill job, prefill time, decode time per
token — and the prompt tokens admitted are timed by :class:`RequestPhases` from the request's
§2 state transitions (the engine's request observer, on the actor thread, on the engine's clock:
a FakeClock in virtual-time tests). They are what vLLM exports as ``request_queue_time_seconds``,
``request_prefill_time_seconds``, ``time_per_output_token_seconds`` and ``prompt_tokens_total``.
Buckets are chosen for LLM serving: milliseconds per decode step on the NPU, seconds for a long
prefill or a queue under overload, minutes only at the deadline's edge.
"""

from __future__ import annotations

import threading
from bisect import bisect_left
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, disable_created_metrics

from calculet.clock import Clock
from calculet.machines.request import DECODING, HOLDING, TERMINAL, WAITING

TTFT_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0)
ITL_BUCKETS = (0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 10.0)
E2E_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0)
HTTP_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 60.0)
QUEUE_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0)
PREFILL_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)
DECODE_TOKEN_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.5, 1.0,
                        2.5)

STARVATION_THRESHOLD_S = 30.0
"""A request still waiting for its first token after this long while a later arrival gets its
first token is one starvation event (the load simulation's definition, §5.3)."""


class BulkHistogram(Histogram):
    """A Histogram that also takes a request's samples in one call (:meth:`observe_many`).

    Why: a finished request's inter-token gaps — one per token — were observed one by one at its close, each a
    Python-level ``observe`` with its bucket walk and two locked increments, on the engine's actor (issue #20).
    Here each sample's bucket is found by ``bisect`` (the first upper bound >= the sample, as ``observe`` finds
    it) and each touched bucket and the sum are incremented once: the same counts and the sum of the same samples
    (added in another order, so it may differ from the one-by-one sum in its last bits), exposed by the library's
    own series (``test_bulk_histogram`` holds the exposition to ``observe``'s)."""

    def observe_many(self, amounts: Sequence[float]) -> None:
        """``observe`` of each of ``amounts`` (a child of a labelled histogram, as ``observe``)."""
        self._raise_if_not_observable()
        if not amounts:
            return
        bounds = self._upper_bounds
        counts = [0] * len(bounds)
        total = 0.0
        for amount in amounts:
            counts[bisect_left(bounds, amount)] += 1
            total += amount
        buckets = self._buckets
        for i, n in enumerate(counts):
            if n:
                buckets[i].inc(n)
        self._sum.inc(total)


class StarvationWatch:
    """Counts §5.3 starvation events: a request waiting > threshold while a later one starts.

    Thread-safe; ``arrived``/``started``/``ended`` are called once per request (``started`` on
    the engine's actor thread at the first token). O(waiting requests) per first token; the
    waiting set is bounded by the admission budget.
    """

    def __init__(self, on_event: Callable[[str], None], threshold_s: float = STARVATION_THRESHOLD_S) -> None:
        self.threshold_s = threshold_s
        self._on_event = on_event
        self._lock = threading.Lock()
        self._waiting: dict[int, tuple[float, str, bool]] = {}
        self.events = 0

    def arrived(self, key: int, tenant: str, at: float) -> None:
        with self._lock:
            self._waiting[key] = (at, tenant, False)

    def started(self, key: int, at: float) -> None:
        starved: list[str] = []
        with self._lock:
            mine = self._waiting.pop(key, None)
            if mine is None:
                return
            arrival = mine[0]
            for other, (since, tenant, flagged) in self._waiting.items():
                if not flagged and since < arrival and at - since > self.threshold_s:
                    self._waiting[other] = (since, tenant, True)
                    starved.append(tenant)
            self.events += len(starved)
        for tenant in starved:
            self._on_event(tenant)

    def ended(self, key: int) -> None:
        with self._lock:
            self._waiting.pop(key, None)


class TenantMetrics(NamedTuple):
    """One tenant's series of :class:`ServiceMetrics`' per-tenant families (children of ``labels(tenant)``)."""

    ttft: Any
    itl: Any
    e2e: Any
    generated: Any
    disconnects: Any
    queue_time: Any
    prefill_time: Any
    decode_token: Any
    prompt_tokens: Any


class ServiceMetrics:
    """Histograms and counters the HTTP layer measures (registered in the app's own registry)."""

    def __init__(self, registry: CollectorRegistry, tenants: Sequence[str], *,
                 starvation_threshold_s: float = STARVATION_THRESHOLD_S) -> None:
        self.ttft = Histogram("calculet_request_ttft_seconds", "Time to first token, from HTTP arrival (s).",
                              ["tenant"], buckets=TTFT_BUCKETS, registry=registry)
        self.itl = BulkHistogram("calculet_request_inter_token_latency_seconds",
                             "Gap between consecutive generated tokens of a request (s).", ["tenant"],
                             buckets=ITL_BUCKETS, registry=registry)
        self.e2e = Histogram("calculet_request_e2e_latency_seconds",
                             "HTTP arrival to the request's terminal outcome (s).", ["tenant"],
                             buckets=E2E_BUCKETS, registry=registry)
        self.generated = Counter("calculet_request_generated_tokens", "Tokens generated, per tenant.",
                                 ["tenant"], registry=registry)
        self.http_requests = Counter("calculet_http_requests", "HTTP requests by route template, method, status.",
                                     ["route", "method", "status"], registry=registry)
        # bulk: the refusal lane adds a turn's refusals' durations in one call (issue #13, RefusalLane.flush)
        self.http_duration = BulkHistogram("calculet_http_request_duration_seconds",
                                           "HTTP request duration by route template (s); streams until their end.",
                                           ["route"], buckets=HTTP_BUCKETS, registry=registry)
        self.disconnects = Counter("calculet_http_client_disconnects",
                                   "Clients that went away before their request ended (the request is cancelled).",
                                   ["tenant"], registry=registry)
        self.open_streams = Gauge("calculet_http_open_streams", "Engine requests whose stream has not closed.",
                                  registry=registry)
        self.starvation = Counter("calculet_fairness_starvation_events",
                                  f"Requests still waiting after {starvation_threshold_s:g} s while a later "
                                  "arrival got its first token (§5.3).", ["tenant"], registry=registry)
        self.watch = StarvationWatch(lambda tenant: self.starvation.labels(tenant).inc(), starvation_threshold_s)
        self.queue_time = Histogram("calculet_request_queue_time_seconds", "Arrival to the first prefill job "
                                    "on the device: admission wait plus prefill queue (s).", ["tenant"],
                                    buckets=QUEUE_BUCKETS, registry=registry)
        self.prefill_time = Histogram("calculet_request_prefill_time_seconds", "First prefill job submitted to "
                                      "the prompt's last prefill job done, chunks included (s).", ["tenant"],
                                      buckets=PREFILL_BUCKETS, registry=registry)
        self.decode_token = Histogram("calculet_request_decode_time_per_token_seconds", "A request's decode phase "
                                      "(prefill done to last decode step) divided by its decode steps (s).",
                                      ["tenant"], buckets=DECODE_TOKEN_BUCKETS, registry=registry)
        self.prompt_tokens = Counter("calculet_request_prompt_tokens", "Prompt tokens of admitted requests.",
                                     ["tenant"], registry=registry)
        self._tenants: dict[str, TenantMetrics] = {}
        for tenant in tenants:
            self.starvation.labels(tenant)
            self.of(tenant)
        self._http_children: dict[tuple[str, str, int], tuple[Any, ...]] = {}

    def of(self, tenant: str) -> TenantMetrics:
        """``tenant``'s children of the per-tenant families, resolved once. Why: ``labels()`` validates, formats and
        looks the child up under a lock on every call, and a request's metrics (its phases, its latencies at its
        close: eight series) were eight such calls on the engine's actor thread per request (#20)."""
        children = self._tenants.get(tenant)
        if children is None:
            children = self._tenants[tenant] = TenantMetrics(*(family.labels(tenant) for family in (
                self.ttft, self.itl, self.e2e, self.generated, self.disconnects, self.queue_time, self.prefill_time,
                self.decode_token, self.prompt_tokens)))
        return children

    def observe_http(self, route: str, method: str, status: int, took_s: float) -> None:
        """One HTTP request answered: ``calculet_http_requests_total`` and its duration.

        Why the children are kept here: ``labels()`` validates, formats and looks its child up under a lock on
        every call, and every request (a 429 of a burst as much as any) pays it twice on the event loop
        (issue #13); the child of a (route, method, status) is the same object for the registry's lifetime.
        The key set is bounded as the labels are (route templates, methods, statuses)."""
        key = (route, method, status)
        series = self._http_children.get(key)
        if series is None:
            count, duration = self.http_requests.labels(route, method, str(status)), self.http_duration.labels(route)
            series = self._http_children[key] = (count._value.inc, duration._upper_bounds, duration._buckets,
                                                 duration._sum.inc)
        # ``inc()`` and ``observe()`` without their per-call checks (a resolved child is observable) and bucket walk:
        # the child's values incremented as they do it (the bucket found as BulkHistogram finds it), three locked
        # increments (#20: ~17 calls of every request on the event loop were ~10)
        count_inc, bounds, buckets, sum_inc = series
        count_inc(1)
        buckets[bisect_left(bounds, took_s)].inc(1)
        sum_inc(took_s)

    def observe_request(self, tenant: str, arrival: float, token_times: Sequence[float], closed_at: float) -> None:
        """One finished request's latencies (times from ``time.perf_counter``)."""
        children = self.of(tenant)
        if token_times:
            children.ttft.observe(max(0.0, token_times[0] - arrival))
            gaps = [after - before for before, after in zip(token_times, token_times[1:])]
            children.itl.observe_many(gaps)
            children.generated.inc(len(token_times))
        children.e2e.observe(max(0.0, closed_at - arrival))



# The request states each phase spans, derived from RequestMachine's declared groups and terminal
# flags (#17: one source of truth — a state regrouped in the declaration moves here too).
_WAITING = WAITING                # not admitted yet
_PREFILL = HOLDING - DECODING     # admitted, holding a lane, no first token yet: prefill queued or running
_ENDED = TERMINAL                 # the stream closed


class RequestPhases:
    """Times each request's phases from its §2 transitions (the engine's request observer).

    Called on the engine's actor thread for every transition; holds one small list per live
    request (dropped at its terminal state), so memory is bounded by the admission budget.
    A phase is observed once: queue time at the first prefill submit, prefill time when the
    request leaves prefill, decode time per token when it leaves decode. A decode phase's steps are the tokens the
    request generated in it (its machine's ``generated_tokens`` at the phase's end less at its start: each decode
    step that ends in ``decode_ready`` or ``finishing`` yields one, no other move does), so a decode step's own
    moves are not needed: the service installs it without them (``set_observer(..., decode_steps=False)``, #20:
    two calls per token fewer on the actor) and it ignores them when told.
    """

    def __init__(self, metrics: ServiceMetrics, clock: Clock) -> None:
        self._metrics = metrics
        self._clock = clock
        self._open: dict[int, list[Any]] = {}
        """request id → [prefill start, decode start, tokens generated at the decode start]."""

    def observe(self, rec: Any, source: str, target: str) -> None:
        """``observer(rec, source, target)`` of the engine (a ``RequestRecord``).

        A decode step's two moves (its submit, its token) time nothing: its steps are counted from the record when
        the decode phase ends."""
        if target == "decode_running" or source == target or (source == "decode_running" and target == "decode_ready"):
            return  # a decode step's moves
        key = rec.request_id
        phase = self._open.get(key)
        if phase is None:
            phase = self._open[key] = [None, None, 0]
        now = self._clock.now()
        m = self._metrics.of(rec.tenant)
        if target == "prefill_ready" and source in _WAITING:
            m.prompt_tokens.inc(rec.prompt_tokens)
        elif target == "prefill_running" and phase[0] is None:
            phase[0] = now
            m.queue_time.observe(max(0.0, now - rec.arrival))
        elif source == "prefill_running" and target not in _PREFILL:
            m.prefill_time.observe(max(0.0, now - phase[0]))
            phase[1] = now
            phase[2] = rec.machine.generated_tokens
        if target in _ENDED or (target == "finishing" and source == "decode_running"):
            steps = rec.machine.generated_tokens - phase[2] if phase[1] is not None else 0
            if steps:
                m.decode_token.observe(max(0.0, now - phase[1]) / steps)
                phase[1] = None
            if target in _ENDED:
                del self._open[key]

    @property
    def open(self) -> int:
        """Requests being timed (for tests: 0 once every request ended)."""
        return len(self._open)


def make_registry() -> CollectorRegistry:
    """A registry private to one app (tests run several services in one process).

    The ``*_created`` series of prometheus-client are switched off (process-wide): they double
    the exposition without carrying a §16 fact.
    """
    disable_created_metrics()
    return CollectorRegistry(auto_describe=False)


__all__ = ["STARVATION_THRESHOLD_S", "BulkHistogram", "RequestPhases", "ServiceMetrics", "StarvationWatch",
           "TenantMetrics", "make_registry"]
