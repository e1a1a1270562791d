"""Requests as the engine sees them (§4, §5.2, §16): checked before admission, their prompt ids
kept while they live, each streamed token timed and traced, each outcome counted.

The scheduler owns a request's state (its machine, KV lease, queue place); this desk keeps only
what the engine adds around it — the prompt the executor builds a prefill from, when the last
token left (the degrade detector's latency figure), where a token came from (generation
isolation, §10, R19.16), what the device computed for it and whether it ended on time
(:mod:`calculet.runtime.engine.goodput`, issue #13) — and wraps the caller's sink so it sees
every token and the close.
"""

from __future__ import annotations

import logging
from collections import Counter
from typing import Callable

from calculet.clock import Clock
from calculet.errors import BadRequest
from calculet.machines.request import FinishReason
from calculet.adapters.calrt import JobResult
from calculet.runtime.engine.goodput import GoodputLedger, RequestWork
from calculet.runtime.engine.types import GenerateRequest, TokenProvenance
from calculet.runtime.execution.executor import DeviceExecutor
from calculet.runtime.execution.sampler import SamplerPool, SamplingParams
from calculet.runtime.request import InferenceRequest, RequestOutcome, RequestSink
from calculet.runtime.scheduling.admission import AdmissionOutcome, Decision
from calculet.runtime.scheduling.decode import DecodeBatch
from calculet.runtime.scheduling.plan import Submission
from calculet.runtime.scheduling.prefill import PrefillWork
from calculet.runtime.scheduling.scheduler import Scheduler
from calculet.runtime.streams.package_tokenizer import Tokenizer

log = logging.getLogger("calculet.runtime.engine.requests")

__all__ = ["RequestDesk"]

Trace = list[tuple[str, int]]


class _Request:
    """Engine-side facts of a live request: its prompt ids, its stream timing, its device work."""

    __slots__ = ("prompt", "last_token_at", "work")

    def __init__(self, prompt: tuple[int, ...], work: RequestWork) -> None:
        self.prompt = prompt
        self.last_token_at: float | None = None
        self.work = work


class _Sink:
    """Wraps the caller's sink: the engine sees each token and the close, then forwards them. It holds its request's
    engine-side facts (:class:`_Request`, from its admission to its close): a token reads them here, not through the
    desk's table (issue #20: a lookup a token fewer)."""

    __slots__ = ("desk", "user", "closed", "facts")

    def __init__(self, desk: RequestDesk, user: RequestSink) -> None:
        self.desk = desk
        self.user = user
        self.closed = False
        self.facts: _Request | None = None

    def token(self, request_id: int, token: int) -> None:
        """What the engine keeps of a token — its provenance (when reported), the inter-token latency the degrade
        detector samples, the trace — then the caller's sink. The desk's part is written here, not called: once
        per token, a frame fewer (issue #20)."""
        desk = self.desk
        if desk._provenance is not None:
            desk.report_provenance(request_id, token)
        facts = self.facts
        if facts is not None:
            now = desk._clock.now()
            if facts.last_token_at is not None:
                desk._degrade.latency(now - facts.last_token_at, overlapped=desk.overlapped)
            facts.last_token_at = now
            if desk._trace is not None:
                desk._trace.append(("stream", request_id))
        self.user.token(request_id, token)

    def close(self, outcome: RequestOutcome) -> None:
        self.closed = True
        self.facts = None  # the desk forgets the request's facts now: a token after the close is not timed
        self.desk.on_close(outcome)
        self.user.close(outcome)


def _reject(sink: RequestSink, decision: Decision, status: int, reason: str) -> Submission:
    outcome = RequestOutcome(0, "failed", FinishReason.REJECTED, 0, status, reason)
    try:
        sink.close(outcome)
    except Exception:  # noqa: BLE001 - a broken client must not break the actor
        log.exception("sink.close failed on a rejection")
    return Submission(0, AdmissionOutcome(decision, reason))


class RequestDesk:
    """The live requests' engine-side facts and the counts of what came in and how it ended."""

    def __init__(self, scheduler: Scheduler, tokenizer: Tokenizer, sampler: SamplerPool,
                 executor: DeviceExecutor, clock: Clock, *, trace: Trace | None,
                 provenance: Callable[[TokenProvenance], None] | None) -> None:
        self._scheduler = scheduler
        self._tokenizer = tokenizer
        self._sampler = sampler
        self._executor = executor
        self._degrade = executor.degrade  # the executor's one detector (never replaced): its latency, once a token
        self._clock = clock
        self._trace = trace
        self._provenance = provenance
        self._requests: dict[int, _Request] = {}
        self.accepted = 0
        self.rejected: Counter[str] = Counter()
        self.finished: Counter[str] = Counter()
        self.goodput = GoodputLedger()
        """On-time completions and wasted device work (#13); ``statistics()`` reads it."""
        self.delivering: tuple[int, int, int] | None = None
        """(job generation, result generation, calbin generation) of the result being delivered."""
        self.overlapped = False
        """Whether the job whose tokens are being delivered overlapped another (ping/pong)."""

    @property
    def tracks_provenance(self) -> bool:
        """Whether each delivered token's provenance is reported (tests of model replacement): the job path
        then says which generations the result being delivered came from (:attr:`delivering`)."""
        return self._provenance is not None

    def refuse(self, sink: RequestSink, why: str, decision: Decision, status: int, reason: str) -> Submission:
        """Answer before admission (``why`` is the counted cause: stopping, invalid)."""
        self.rejected[why] += 1
        return _reject(sink, decision, status, reason)

    def validate(self, request: GenerateRequest) -> tuple[int, ...]:
        """The prompt's token ids; :class:`BadRequest` (400 before admission) if the request is malformed."""
        prompt = self._tokenizer.validate(request.prompt)
        if not prompt:
            raise BadRequest("the prompt must hold at least one token", field="prompt")
        if not isinstance(request.sampling, SamplingParams):
            raise BadRequest("sampling must be SamplingParams", field="sampling")
        return prompt

    def admit(self, request: GenerateRequest, prompt: tuple[int, ...], sink: RequestSink) -> Submission:
        """Hand a valid request to the scheduler's admission (§5.2); keep its facts if it was accepted."""
        wrapper = _Sink(self, sink)
        submission = self._scheduler.submit(
            InferenceRequest(len(prompt), request.max_new_tokens, request.tenant, request.deadline_ms), wrapper)
        rid = submission.request_id
        if rid and not wrapper.closed:
            self.accepted += 1
            rec = self._scheduler.registry.get(rid)
            work = RequestWork(request.tenant, rec.deadline if rec is not None else float("inf"))
            self._requests[rid] = wrapper.facts = _Request(prompt, work)
            self._sampler.register(rid, request.sampling)
            if self._trace is not None:
                self._trace.extend((("api", rid), ("registry", rid), ("admission", rid)))
        return submission

    def prompt(self, request_id: int) -> tuple[int, ...] | None:
        entry = self._requests.get(request_id)
        return entry.prompt if entry is not None else None

    def report_provenance(self, request_id: int, token: int) -> None:
        """Report where a delivered token came from (tests of model replacement, §10, R19.16)."""
        assert self._provenance is not None
        rec = self._scheduler.registry.get(request_id)
        job_gen, result_gen, calbin_gen = self.delivering or (0, 0, 0)
        self._provenance(TokenProvenance(request_id, token, rec.generation if rec is not None else 0, job_gen,
                                         result_gen, calbin_gen))

    def on_job_done(self, work: PrefillWork | DecodeBatch, result: JobResult) -> None:
        """A device job returned: what it computed goes to its requests' work (#13)."""
        get = self._requests.get
        if isinstance(work, DecodeBatch):  # once a token: one pass over the lanes, no list of them (issue #20)
            active = work.active
            share = self.goodput.busy(len(active), "decode", 1, result.submitted_at, result.completed_at)
            for binding in active:  # GoodputLedger.job_done's per-lane part, one decode token each
                entry = get(binding.request_id)
                if entry is not None:
                    lane = entry.work
                    lane.decode += 1
                    lane.device_s += share
            return
        entry = get(work.request_id)
        self.goodput.job_done([entry.work if entry is not None else None], "prefill", work.tokens,
                              result.submitted_at, result.completed_at)

    def on_close(self, outcome: RequestOutcome) -> None:
        self.finished[outcome.finish_reason.name.lower()] += 1
        entry = self._requests.pop(outcome.request_id, None)
        if entry is not None:
            self.goodput.ended(entry.work, outcome.finish_reason, self._clock.now())
        self._sampler.release(outcome.request_id)
