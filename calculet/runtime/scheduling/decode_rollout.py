"""A cheap forward model of the device's decode set: a candidate's finish over the set's evolution (issue #13).

Why this module exists: the finish estimate reported on B>1 (``RequestRecord.estimated_finish``) read the
per-token time of the past (a long window) while the §8 profile a request decodes in is set by the decode
set over its *future* life: arrivals during a burst join the set and the profile grows (42.5-80 ms a token
on B16), at a burst's end the set drains. Session 19 measured (``docs/estimator.md``) that a rollout of the
real scheduler from the present over futures drawn from the law of arrivals reaches a P90 of 15.6-19.8 % on
every row missed today, and that knowing the *expected* arrivals over the request's life is worth most of it.
A splice of the real engine costs a second of CPU; this is the same evolution at a few hundred events.

The model (sans-io, pure; every input is a value):

* the present: the sequences decoding with their remaining tokens, the lane holders still to prefill
  (prompt, output) in prefill order, the requests waiting for a KV lane in admission order;
* the rules it follows, read from the scheduler's own: at most ``lanes`` sequences hold a KV lane
  (``admission.max_sequences``), a waiting request takes a lane the instant one frees (§5); a decode
  step's profile is the §8 selection by the Ready count (``ProfileSet.by_ready``) and a set larger than
  the profile rotates (every sequence gets ``batch / n`` of a token a step, fluid); prefill jobs and
  decode steps share the device by the §6 smooth WRR (decode 8 : short 4 : medium 2 : long 1, each class
  eligible while it holds a prompt); a chunked prefill (§6) takes ``chunk`` tokens a job and goes back to
  the tail of its class; under ping/pong (two jobs in flight, §14) two slots, each building a job from what
  is Ready when it frees, the later of two jobs in flight slowed to the measured overlap rate while the
  earlier runs (the device's own mechanics, session 22; before the rate is measured, a decode job's time is
  the step keyed by the two decode jobs' compiled batches summed, the step timer's own key);
* the future: the arrivals the forecast expects (a piecewise-constant intensity), placed where the
  expected count crosses ``k - 1/2``: a mean path, not a draw; the k-th takes its prompt and output from the law's
  recent sample at the k-th point of a low-discrepancy sequence (session 21: a storm's 40K prompts in the mean
  prompt made every later arrival a 3 000-token one), or the means when there is no sample;
* the answer: the instant the candidate's last token is produced (``prompt`` prefilled, first token,
  then ``output - 1`` decode tokens).

What it leaves out, on purpose: the §5.3 WFQ order among waiting tenants (FIFO here), refusals of future
arrivals, cancellations, the batching window (0 by default), the at-risk prefill priority. Its cost is a few
events per request alive over the candidate's life, each O(set size) (measured in ``docs/estimator.md``).
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass
from typing import Callable, Protocol, Sequence

from calculet.runtime.scheduling.prefill import SmoothWrr

__all__ = ["ArrivalFeed", "ArrivalForecast", "DeviceShape", "Present", "RatePieceLike", "WRR_DEFAULT",
           "expected_arrivals", "measured_steps", "rollout_finish"]

WRR_DEFAULT: tuple[tuple[str, int], ...] = (("decode", 8), ("short", 4), ("medium", 2), ("long", 1))
"""§6's WRR weights in the spec's order (the configuration default, ``queues.wrr_weights``)."""
HORIZON_S = 120.0
"""How far ahead the forecast is asked first; a candidate not finished by then extends it by its last piece."""
MAX_EVENTS = 20_000
"""A guard on the loop: past it the model gives no answer (the planner's estimate is reported)."""
MAX_ARRIVALS = 2_000
"""The most later arrivals one rollout places (a forecast of absurd rates, e.g. many submits at one instant, must not
cost without bound; a candidate's life at the presets' rates sees tens)."""
_EPS = 1e-9
_KRONECKER = (0.6180339887498949, 0.7548776662466927)
"""A Kronecker low-discrepancy sequence, ``k * (1/phi, 1/rho) mod 1`` (the golden ratio, the plastic number): the k-th
point's coordinates are the quantiles of the sample the mean path's k-th arrival takes its prompt and output at (session
21: the lengths' mean path, the tail at its frequency instead of spread into every arrival). Roberts' R2 (1/rho,
1/rho^2) was measured too and gave bursty b16 24.9 / b16-chunked 25.3 % against this one's 24.5 / 25.0: the choice of
sequence moves the row by about half a point (docs/estimator.md)."""
Lengths = tuple[Sequence[int], Sequence[int]]
"""(prompts, outputs) the mean path's arrivals take their lengths from, at the sequence's quantiles
(``ArrivalLaw.lengths``)."""


class RatePieceLike(Protocol):
    """One piece of a forecast: expected arrivals per second on ``[start, end)``."""

    @property
    def start(self) -> float: ...

    @property
    def end(self) -> float: ...

    @property
    def rate_per_s(self) -> float: ...


class ArrivalForecast(Protocol):
    """What the model reads of a law of arrivals (helper A20's ``ArrivalLaw`` and the bench's oracle satisfy it)."""

    mean_prompt_tokens: float
    mean_output_tokens: float

    def forecast(self, now: float, horizon_s: float) -> Sequence[RatePieceLike]: ...


class ArrivalFeed(ArrivalForecast, Protocol):
    """A law learned at run time: told of each submit and of each request that ended with its tokens (stop or
    length), the planner's calls (:meth:`.OnTimePlanner.admit`, :meth:`.OnTimePlanner.ended`)."""

    def arrived(self, now: float, prompt_tokens: int, max_new_tokens: int) -> None: ...

    def finished(self, generated_tokens: int) -> None: ...

    def lengths(self) -> tuple[Sequence[int], Sequence[int]]: ...


@dataclass(frozen=True, slots=True)
class DeviceShape:
    """The device as the rules see it.

    ``profile_of(ready)``: the compiled batch the §8 selection picks for ``ready`` sequences; ``step_s(key)``: the
    seconds of a decode job keyed as the step timer keys it (one engine: the compiled batch; ping/pong: its compiled
    batch plus the other decode job's in flight, its overlapped time); ``prefill_s(tokens)``: the seconds of one
    prefill job (or chunk) of ``tokens``."""

    lanes: int
    engines: int
    profile_of: Callable[[int], int]
    step_s: Callable[[int], float]
    prefill_s: Callable[[int], float]
    chunk_tokens: int | None = None
    short_max_tokens: int = 512
    medium_max_tokens: int = 4096
    wrr: tuple[tuple[str, int], ...] = WRR_DEFAULT
    overlap: float | None = None
    long_admitted: int | None = None
    """§6's long-task quota (R6.11, ``admission.long_prefill_quota.max_admitted``): long prompts admitted at once,
    from admission until their prefill is done; a waiting long prompt past it stays in its place while the requests
    behind it take free lanes (the admission queue parks its flow). None: no quota (session 22: without it the rollout
    ran a storm's four 40K prompts side by side on ping/pong's two engines, where the scheduler runs one at a time)."""
    """Ping/pong as the device runs it (§14; :class:`.estimates.OverlapTimer`, session 22): the rate a job submitted while the
    other engine's job runs progresses at until that one ends (the earlier job is not slowed); ``step_s(batch)`` and
    ``prefill_s`` are then a job's own time. None: the keyed model (a decode job's time ``step_s`` of its batch plus
    the other decode job's, a prefill's its measured cost), where the rate is not measured yet."""

    def prompt_class(self, tokens: int) -> str:
        """§6's class of a prompt, as ``queues.prefill_class`` answers."""
        if tokens <= self.short_max_tokens:
            return "short"
        return "medium" if tokens <= self.medium_max_tokens else "long"

    def cycle(self, n: int) -> tuple[float, float]:
        """(seconds, tokens each sequence gets) of one decode step of ``n`` decoding sequences on one engine: the
        step of the profile their count selects, a set larger than it rotating (fluid)."""
        batch = self.profile_of(n)
        return self.step_s(batch), min(1.0, batch / n)


@dataclass(frozen=True, slots=True)
class Present:
    """The engine's present: ``decoding`` remaining tokens per decoding sequence; ``prefilling`` (prompt, output
    tokens) per lane holder still to prefill, in prefill order; ``waiting`` (prompt, output) per request waiting for a
    lane, in admission order."""

    decoding: tuple[int, ...] = ()
    prefilling: tuple[tuple[int, int], ...] = ()
    waiting: tuple[tuple[int, int], ...] = ()
    place: int | None = None
    """The candidate's place among ``waiting`` (the count admitted before it, by the §5.3 queue's own order); None:
    after all of them."""
    prefilled: tuple[int, ...] = ()
    """The prompt tokens already in KV per ``prefilling`` entry, in its order (a chunked prompt's committed chunks,
    §6; missing entries: none). Only what is left is rolled out, in the class of the whole prompt (the scheduler
    re-queues a chunk in its prompt's class, ``PrefillScheduler.requeue``). Session 22 (E22c): a half-prefilled
    prompt was rolled out as if none of it had run."""


def expected_arrivals(pieces: Sequence[RatePieceLike], now: float, after: float = 0.0) -> list[float]:
    """The instants the expected count of arrivals from ``now`` crosses ``after + 1/2``, ``after + 3/2``, ...
    over ``pieces`` (a mean path of the forecast: its k-th arrival where k - 1/2 are expected)."""
    out: list[float] = []
    mass, target = 0.0, after + 0.5
    for piece in pieces:
        start, end, rate = max(piece.start, now), piece.end, piece.rate_per_s
        if end <= start or not 0 < rate < math.inf:
            continue
        top = mass + rate * (end - start)
        while target < top and len(out) < MAX_ARRIVALS:
            out.append(start + (target - mass) / rate)
            target += 1.0
        mass = top
    return out


class _Rollout:
    """One run of the model (its state; :func:`rollout_finish` is the entry point)."""

    __slots__ = ("shape", "t", "dec", "queues", "wait", "wrr", "tracer_left", "tracer_prefill", "holding",
                 "candidate", "long_held")

    def __init__(self, shape: DeviceShape, present: Present, now: float, candidate: tuple[int, int] = (1, 1)) -> None:
        self.shape = shape
        self.t = now
        self.dec: list[float] = [float(r) for r in present.decoding if r > 0]
        self.queues: dict[str, deque[list[float]]] = {name: deque() for name, _ in shape.wrr if name != "decode"}
        self.long_held = sum(1 for prompt, _ in present.prefilling if prompt > shape.medium_max_tokens)
        done = present.prefilled
        for k, (prompt, output) in enumerate(present.prefilling):
            self._enqueue(prompt, output, False, done[k] if k < len(done) else 0)
        self.wait: deque[tuple[int, int, bool]] = deque((p, o, False) for p, o in present.waiting)
        self.wrr = SmoothWrr(dict(shape.wrr))
        self.tracer_left = math.inf  # the candidate's decode tokens left once it decodes
        self.tracer_prefill = True  # the candidate has not been prefilled yet
        self.holding = len(self.dec) + len(present.prefilling)
        self.candidate = (candidate[0], candidate[1], True)

    def _enqueue(self, prompt: float, output: float, tracer: bool, done: int = 0) -> None:
        """``prompt`` joins its class's tail with ``done`` of its tokens already prefilled (at least one left)."""
        left = float(prompt - min(max(done, 0), prompt - 1)) if done else float(prompt)
        self.queues[self.shape.prompt_class(int(prompt))].append([left, float(output), float(tracer)])

    def admit(self) -> None:
        """Waiting requests take free lanes in order (§5), a long prompt only within §6's long-task quota (R6.11: past
        it, it keeps its place and the ones behind it pass)."""
        shape = self.shape
        quota = shape.long_admitted
        if quota is None:
            while self.wait and self.holding < shape.lanes:
                prompt, output, tracer = self.wait.popleft()
                self._enqueue(prompt, output, tracer)
                self.holding += 1
            return
        held: deque[tuple[int, int, bool]] | None = None
        wait, longest = self.wait, shape.medium_max_tokens
        while wait and self.holding < shape.lanes:
            entry = wait.popleft()
            if entry[0] > longest:
                if self.long_held >= quota:
                    if held is None:
                        held = deque()
                    held.append(entry)
                    continue
                self.long_held += 1
            self._enqueue(*entry)
            self.holding += 1
        if held:
            held.extend(wait)
            self.wait = held

    def prefilled(self, queue: str) -> None:
        """A prompt of ``queue`` finished its prefill: a long one's quota slot frees (``AdmissionController.
        prefill_left``)."""
        if queue == "long":
            self.long_held -= 1

    def at_event(self, arrivals: _Future, held: float | None) -> float | None:
        """At :attr:`t`: the later arrivals due join the waiting requests, the candidate joins their head once it is
        admitted (``held``: that instant), free lanes are taken; returns ``held`` (None once the candidate joined)."""
        arrivals.arrive(self.t, self.wait)
        if held is not None and self.t >= held - _EPS:
            self.wait.appendleft(self.candidate)
            held = None
        self.admit()
        return held

    def chunk_s(self, job: list[float]) -> float:
        """Take one prefill job (or chunk, §6) off ``job``'s prompt: its seconds."""
        shape = self.shape
        tokens = job[0] if shape.chunk_tokens is None else min(job[0], float(shape.chunk_tokens))
        job[0] -= tokens
        return shape.prefill_s(int(tokens))

    def prefill(self, queue: str, t: float) -> float | None:
        """One prefill job (or chunk) of ``queue``'s head from ``t``; the instant the candidate ends if it does
        with its prefill (one token asked), else None."""
        job = self.queues[queue].popleft()
        self.t = t + self.chunk_s(job)
        if job[0] > _EPS:
            self.queues[queue].append(job)  # a chunk: back to its class's tail (§6 rotates per chunk)
            return None
        self.prefilled(queue)
        if job[2]:  # the candidate's prefill yields its first token
            if job[1] <= 1:
                return self.t
            self.tracer_left = job[1] - 1
            self.tracer_prefill = False
        elif job[1] > 1:
            self.dec.append(job[1] - 1)
        else:
            self.holding -= 1
        return None

    def choose(self, decoding: bool) -> str | None:
        """The next job by §6's smooth WRR (the scheduler's own :class:`.SmoothWrr`) among the non-empty prefill
        queues and decode (eligible if ``decoding``)."""
        eligible = {name for name, queue in self.queues.items() if queue}
        if decoding:
            eligible.add("decode")
        return self.wrr.choose(eligible)


class _Future:
    """The later arrivals the model serves: explicit ones, or the forecast's mean path (extended past its horizon by
    its last piece's rate), each arrival's lengths the sample's at the low-discrepancy sequence's next point (the
    means where there is no sample)."""

    __slots__ = ("times", "given", "forecast", "prompt", "output", "horizon_s", "horizon_end", "last_rate",
                 "quantiles", "k")

    def __init__(self, now: float, forecast: ArrivalForecast | None, horizon_s: float,
                 future: Sequence[tuple[float, int, int]] | None, lengths: Lengths | None = None) -> None:
        self.times: deque[float] = deque()
        self.given: deque[tuple[int, int]] = deque()
        self.forecast = None if future else forecast
        self.prompt = self.output = 1
        self.horizon_s = horizon_s
        self.horizon_end = now
        self.last_rate = 0.0
        self.quantiles: tuple[list[int], list[int]] | None = None
        self.k = 0
        if future:
            self.times.extend(t for t, _, _ in future)
            self.given.extend((p, o) for _, p, o in future)
        elif forecast is not None:
            self.prompt = max(1, round(forecast.mean_prompt_tokens))
            self.output = max(1, round(forecast.mean_output_tokens))
            pieces = tuple(forecast.forecast(now, horizon_s))
            last = pieces[-1].rate_per_s if pieces else 0.0
            self.last_rate = last if 0 < last < math.inf else 0.0
            self.times.extend(expected_arrivals(pieces, now))
            self.horizon_end = now + horizon_s
            if lengths is not None and lengths[0] and lengths[1]:
                self.quantiles = (sorted(lengths[0]), sorted(lengths[1]))

    def next_at(self) -> float:
        """The next arrival's instant (inf: none)."""
        return self.times[0] if self.times else math.inf

    def next_event(self, held: float | None) -> float:
        """The next arrival's instant or the candidate's admission (``held``), whichever comes first (inf: none)."""
        return self.next_at() if held is None else min(self.next_at(), held)

    def arrive(self, t: float, wait: deque[tuple[int, int, bool]]) -> None:
        """Every arrival due by ``t`` joins the tail of the waiting requests."""
        times = self.times
        while times and times[0] <= t + _EPS:
            times.popleft()
            if self.given:
                wait.append((*self.given.popleft(), False))
            elif self.quantiles is not None:  # the k-th arrival's lengths: the sample at the sequence's k-th point
                self.k += 1
                prompts, outputs = self.quantiles
                u, v = (self.k * _KRONECKER[0]) % 1.0, (self.k * _KRONECKER[1]) % 1.0
                wait.append((prompts[int(u * len(prompts))], outputs[int(v * len(outputs))], False))
            else:
                wait.append((self.prompt, self.output, False))
        if not times and self.forecast is not None and self.last_rate > 0 and t >= self.horizon_end - _EPS:
            rate, end = self.last_rate, self.horizon_end  # past the forecast: its last piece goes on
            times.extend(end + (k + 0.5) / rate for k in range(min(MAX_ARRIVALS, int(rate * self.horizon_s) + 1)))
            self.horizon_end = end + self.horizon_s


def rollout_finish(present: Present, prompt: int, output: int, now: float, shape: DeviceShape,
                   forecast: ArrivalForecast | None = None, horizon_s: float = HORIZON_S,
                   future: Sequence[tuple[float, int, int]] | None = None,
                   not_before: float | None = None, lengths: Lengths | None = None) -> float | None:
    """When a candidate of ``prompt`` tokens asking ``output`` tokens, arriving now behind ``present``, is expected
    to produce its last token; None if the model cannot tell (no step time, or the guard on the loop hit).
    ``future``: explicit later arrivals (instant, prompt, output) in order, in place of the forecast's mean path
    (a realised future: what the model does with the arrivals known). ``not_before``: the instant the candidate is
    expected to be admitted (the §5.3 queue's order, which the model does not replay): it joins the head of the
    waiting requests then, instead of its place in ``present``. ``lengths``: (prompts, outputs) the mean path's
    arrivals take their lengths from (the forecast's means where None or empty)."""
    if output < 1 or shape.lanes < 1:
        return None
    state = _Rollout(shape, present, now, (prompt, output))
    held = not_before if not_before is not None and not_before > now else None
    if held is None:
        place = len(state.wait) if present.place is None else max(0, min(present.place, len(state.wait)))
        state.wait.insert(place, (prompt, output, True))
    arrivals = _Future(now, forecast, horizon_s, future, lengths)
    if shape.engines > 1:
        return _two_engines(state, arrivals, held)
    return _one_engine(state, arrivals, held)


def _one_engine(state: _Rollout, arrivals: _Future, held: float | None) -> float | None:
    """One job in flight: decode steps of the whole set (fluid rotation) and prefills, by §6's WRR; between events
    the set's steps are taken in bulk."""
    shape, dec = state.shape, state.dec
    for _ in range(MAX_EVENTS):
        held = state.at_event(arrivals, held)
        choice = state.choose(bool(dec) or not state.tracer_prefill)
        if choice is None:  # nothing on the device: idle until the next arrival (or the candidate's admission)
            state.t = arrivals.next_event(held)
            if state.t == math.inf:
                return None
            continue
        if choice != "decode":
            finished = state.prefill(choice, state.t)
            if finished is not None:
                return finished
            continue
        n = len(dec) + (0 if state.tracer_prefill else 1)
        seconds, per_step = shape.cycle(n)
        if seconds <= 0:
            return None
        # steps until the next event: a departure, the candidate's end, an arrival, or one step if prefills wait
        steps = 1
        if not any(state.queues.values()):
            least = min(dec) if dec else math.inf
            if not state.tracer_prefill:
                least = min(least, state.tracer_left)
            steps = max(1, math.ceil(least / per_step - _EPS))
            until = arrivals.next_event(held)
            if until < math.inf:
                steps = min(steps, max(1, math.ceil((until - state.t) / seconds - _EPS)))
        if not state.tracer_prefill and state.tracer_left <= steps * per_step + _EPS:
            return state.t + math.ceil(state.tracer_left / per_step - _EPS) * seconds
        state.t += steps * seconds
        done = steps * per_step
        if not state.tracer_prefill:
            state.tracer_left -= done
        left = [r - done for r in dec]
        dec[:] = [r for r in left if r > _EPS]
        state.holding -= len(left) - len(dec)
    return None


_Slot = tuple[float, int, "list[list[float]] | None", "list[float] | None", str]
"""A job in flight: (end, compiled batch, decode members | None, prefill job | None, its queue)."""


def _fill(state: _Rollout, slots: list[_Slot | None], ready: deque[list[float]], t: float) -> None:
    """Build a job for each free slot at ``t``, by §6's WRR, from what is ready (``Scheduler.step``)."""
    shape = state.shape
    for k in (0, 1):
        if slots[k] is not None:
            continue
        choice = state.choose(bool(ready))
        if choice is None:
            return
        other = slots[1 - k]
        if choice == "decode":
            batch = shape.profile_of(len(ready))
            members = [ready.popleft() for _ in range(min(batch, len(ready)))]
            if shape.overlap is not None:
                slots[k] = (_overlapped(t, shape.step_s(batch), other, shape.overlap), batch, members, None, choice)
                continue
            partner = 0 if other is None or other[2] is None else other[1]
            slots[k] = (t + shape.step_s(batch + partner), batch, members, None, choice)
        else:
            job = state.queues[choice].popleft()
            seconds = state.chunk_s(job)
            end = t + seconds if shape.overlap is None else _overlapped(t, seconds, other, shape.overlap)
            slots[k] = (end, 0, None, job, choice)


def _overlapped(t: float, seconds: float, other: _Slot | None, rate: float) -> float:
    """The end of a job of ``seconds`` (its own time) submitted at ``t`` beside ``other`` (the other slot's job, its
    end fixed): at ``rate`` while that one runs, then at full rate (the simulated device's ``CostModel.finish_time``;
    with the arrivals known the rollout's P90 on bursty b16-pingpong fell 18.3 -> 8.1 %, loads pooled, session 22)."""
    busy = None if other is None else other[0]
    if busy is None or busy <= t or seconds <= 0:
        return t + seconds
    window = busy - t
    if rate > 0 and rate * window >= seconds:
        return t + seconds / rate
    return busy + (seconds - rate * window)


def _two_engines(state: _Rollout, arrivals: _Future, held: float | None) -> float | None:
    """Ping/pong (§14): two jobs in flight. Whenever a slot is free a job is built, by §6's WRR, from what is ready
    then: a decode job takes the Ready sequences up to the profile their count selects (the rest wait for the other
    slot), so the set splits into groups that alternate, as the scheduler's own steps split it. With the overlap rate
    measured (``shape.overlap``) a job runs its own time, slowed to the rate while the job submitted before it runs
    (:func:`_overlapped`); before, a decode job's time is the step measured for its profile beside the other slot's
    decode job (the step timer's key: their compiled batches summed) and a prefill's the measured prefill. Sequences
    are [remaining tokens, the candidate?]."""
    ready: deque[list[float]] = deque([r, 0.0] for r in state.dec)
    slots: list[_Slot | None] = [None, None]  # None: the slot is free
    for _ in range(MAX_EVENTS):
        t = state.t
        held = state.at_event(arrivals, held)
        _fill(state, slots, ready, t)
        if slots[0] is None and slots[1] is None:
            state.t = arrivals.next_event(held)
            if state.t == math.inf:
                return None
            continue
        k = 0 if slots[1] is None or (slots[0] is not None and slots[0][0] <= slots[1][0]) else 1
        end, _, members, job, queue = slots[k]  # type: ignore[misc]
        until = arrivals.next_event(held)
        if until < end:  # an arrival (or the candidate's admission) before the next completion
            state.t = until
            continue
        slots[k] = None
        state.t = end
        if members is not None:
            for seq in members:
                seq[0] -= 1
                if seq[0] > _EPS:
                    ready.append(seq)
                elif seq[1]:
                    return end
                else:
                    state.holding -= 1
            continue
        assert job is not None
        if job[0] > _EPS:
            state.queues[queue].append(job)  # a chunk: back to its class's tail
            continue
        state.prefilled(queue)
        if job[1] <= 1:
            if job[2]:
                return end
            state.holding -= 1
            continue
        ready.append([job[1] - 1, job[2]])
    return None


def measured_steps(measured: dict[int, float], fallback: float, affine: bool) -> Callable[[int], float]:
    """The rollout's step of a key (one engine: a compiled batch; ping/pong: two summed, the step timer's key) from
    the keys ``measured`` so far (``StepTimer.step_at``), for keys not measured yet.

    Why (session 21): early in a run, and at a burst's first seconds, the large profiles a burst will select have
    not run yet, and the long-window step of the small ones (``fallback``) stood in for them: every rollout of the
    first burst was early (bursty b16 at 1x, first 60 s: P90 52.6 % -> 56.6 % without this, oracle law 34.8 ->
    25.2 %). ``affine`` (one engine): §13.1's device is memory-bound, a step a fixed time plus a time per compiled
    lane (the reference cost model: 40 + 2.5 ms a lane), so a key between two measured ones is interpolated and one
    outside them read on the least-squares line through them all (slope at least 0: a larger batch never reads
    a shorter step). Ping/pong: the timer's key sums the two jobs' batches and does not say
    whether the other slot was decoding (B16 alone and B8 beside B8 share key 16, at 80 and about 75 ms), so no line
    fits (tried: the row went 31.6 -> 43.0 %); the nearest measured key stands in (ties: the larger). With no key
    measured (or one, on the line's side), ``fallback``."""
    keys = sorted(k for k, v in measured.items() if v > 0)
    if not keys:
        return lambda key: fallback
    if not affine or len(keys) < 2:
        cache: dict[int, float] = {}

        def nearest(key: int) -> float:
            got = measured.get(key) or cache.get(key)
            if got:
                return got
            value = measured[min(keys, key=lambda k: (abs(k - key), -k))] if not affine else fallback
            cache[key] = value
            return value
        return nearest
    n = len(keys)
    mean_k = sum(keys) / n
    mean_v = sum(measured[k] for k in keys) / n
    var = sum((k - mean_k) ** 2 for k in keys)
    slope = max(0.0, sum((k - mean_k) * (measured[k] - mean_v) for k in keys) / var)
    line: dict[int, float] = {}

    def step(key: int) -> float:
        got = measured.get(key) or line.get(key)
        if got:
            return got
        lo = max((k for k in keys if k < key), default=None)
        hi = min((k for k in keys if k > key), default=None)
        if lo is not None and hi is not None:
            value = measured[lo] + (measured[hi] - measured[lo]) * (key - lo) / (hi - lo)
        else:
            value = max(mean_v + slope * (key - mean_k), _EPS)
        line[key] = value
        return value
    return step
