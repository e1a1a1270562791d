"""SamplerPool (§3, §7.4): per-request sampling of the next token from one lane's logits.

Each lane is sampled independently (§7.4): the completion path hands every checked lane's
logits to its own request's :class:`Sampler`, which keeps the request's parameters, its random
generator and the tokens it produced so far. Supported: greedy (``temperature == 0``),
temperature, top-k, top-p (nucleus), stop on the model's EOS token, on stop token
sequences and on stop strings matched on the decoded text (issue #14: a request with stop strings
keeps an incremental detokeniser, about 9 µs per token with the bundled BPE tokenizer). Everything is numpy; a request's generator is seeded from its ``seed`` (or, without
one, from the engine seed and the request id), and draws exactly one uniform number per
sampled token, so its tokens depend only on its own logits and seed — never on which batch,
lane or engine computed them (§18: "identical alone, in B16, or under ping/pong").

Decision (DESIGN principle 2): sampling runs on the engine's actor thread, inside the
completion step. A tiny model's 260 logits sample in microseconds — less than a thread hop —
and keeping each request's generator on the one owner thread is what makes the result
deterministic. The "pool" is the set of per-request samplers, created when a request is
accepted and dropped when it closes.

A device that returns no logits (numerics-off simulation, or a profile whose lanes return only
the argmax) can only be sampled greedily: the device's ``greedy_token`` is used and counted as
``no_logits``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import NamedTuple, Protocol

import numpy as np

from calculet.errors import BadRequest
from calculet.runtime.streams.writer import StopTextMatcher


class _Detokenizer(Protocol):
    def push(self, token: int) -> str: ...


class TextDecoder(Protocol):
    """What matching stop strings needs of the tokenizer: an incremental detokeniser per request."""

    def detokenizer(self) -> _Detokenizer: ...


@dataclass(frozen=True)
class SamplingParams:
    """How a request's tokens are chosen (OpenAI-style parameters, validated on creation).

    ``stop`` holds token sequences; generation stops after the token that completes one of
    them (the stream hides the matched sequence). ``stop_text`` holds stop strings, matched on the
    decoded text (issue #14, as OpenAI and vLLM do): generation stops after the token whose text
    completes one, wherever the token boundaries fall. ``ignore_eos`` keeps generating past EOS.
    """

    temperature: float = 0.0
    top_p: float = 1.0
    top_k: int = 0
    seed: int | None = None
    stop: tuple[tuple[int, ...], ...] = ()
    ignore_eos: bool = False
    stop_text: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if not isinstance(self.temperature, (int, float)) or not 0.0 <= self.temperature <= 100.0:
            raise BadRequest(f"temperature must be in [0, 100], got {self.temperature!r}", field="temperature")
        if not isinstance(self.top_p, (int, float)) or not 0.0 < self.top_p <= 1.0:
            raise BadRequest(f"top_p must be in (0, 1], got {self.top_p!r}", field="top_p")
        if isinstance(self.top_k, bool) or not isinstance(self.top_k, int) or self.top_k < 0:
            raise BadRequest(f"top_k must be an integer >= 0 (0 = off), got {self.top_k!r}", field="top_k")
        if self.seed is not None and (isinstance(self.seed, bool) or not isinstance(self.seed, int) or self.seed < 0):
            raise BadRequest(f"seed must be an integer >= 0, got {self.seed!r}", field="seed")
        stops = tuple(tuple(seq) for seq in self.stop)
        for seq in stops:
            if not seq or any(isinstance(t, bool) or not isinstance(t, int) or t < 0 for t in seq):
                raise BadRequest(f"a stop sequence must be a non-empty list of token ids, got {list(seq)!r}",
                                 field="stop")
        object.__setattr__(self, "stop", stops)
        texts = tuple(self.stop_text)
        if any(not isinstance(t, str) or not t for t in texts):
            raise BadRequest(f"a stop string must be a non-empty string, got {list(texts)!r}", field="stop")
        object.__setattr__(self, "stop_text", texts)

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0 or self.top_k == 1


class Sample(NamedTuple):
    """One sampled token and whether it ends the request (EOS or a completed stop sequence)."""

    token: int
    stop: bool


_new_sample = tuple.__new__
"""Builds a :class:`Sample` without the named tuple's Python-level ``__new__`` (once per token, issue #20)."""


class Sampler:
    """The sampling state of one request."""

    __slots__ = ("params", "eos", "_seed", "_rng", "_history", "_max_stop", "_detok", "_text")

    def __init__(self, params: SamplingParams, *, eos: int | None, seed: int | tuple[int, int],
                 decoder: TextDecoder | None = None) -> None:
        """``seed``: the generator's seed, or the (pool seed, request id) entropy it is derived from. The generator
        is built at the first random draw (:meth:`choose` of a stochastic request with logits): a request sampled
        greedily or given its tokens by the device (the null device) never pays for one — ~55 µs a request on the
        actor (a ``SeedSequence`` and a ``PCG64``), more than its 64 tokens' sampling (#20). The draws are the
        same whenever it is built."""
        self.params = params
        self.eos = None if params.ignore_eos else eos
        self._seed = seed
        self._rng: np.random.Generator | None = None
        self._history: list[int] = []
        self._max_stop = max((len(s) for s in params.stop), default=0)
        self._detok: _Detokenizer | None = None
        self._text: StopTextMatcher | None = None
        if params.stop_text:
            if decoder is None:
                raise BadRequest("stop strings need the model's tokenizer to match the generated text",
                                 field="stop")
            self._detok = decoder.detokenizer()
            self._text = StopTextMatcher(params.stop_text)

    @property
    def stop_matched(self) -> str | None:
        """The stop string whose text ended the request, or None."""
        return self._text.matched if self._text is not None else None

    def choose(self, logits: np.ndarray | None, greedy_token: int | None) -> int | None:
        """The next token from ``logits`` (or the device's greedy token when there are none)."""
        params = self.params
        if logits is None:
            return greedy_token
        if params.greedy:
            return int(np.argmax(logits))
        x = np.asarray(logits, dtype=np.float64) / params.temperature
        if not np.all(np.isfinite(x)):
            return None
        k = params.top_k
        if 0 < k < x.shape[0]:
            cut = np.partition(x, -k)[-k]
            x = np.where(x >= cut, x, -np.inf)
        x = x - np.max(x)
        p = np.exp(x)
        p /= p.sum()
        order = np.argsort(-p, kind="stable")
        sorted_p = p[order]
        if params.top_p < 1.0:
            cum = np.cumsum(sorted_p)
            keep = int(np.searchsorted(cum, params.top_p, side="left")) + 1
            order, sorted_p = order[:keep], sorted_p[:keep]
        cum = np.cumsum(sorted_p)
        rng = self._rng
        if rng is None:
            seed = self._seed
            if isinstance(seed, tuple):
                seed = int(np.random.SeedSequence(list(seed)).generate_state(1)[0])
            rng = self._rng = np.random.Generator(np.random.PCG64(seed))
        u = rng.random() * cum[-1]
        index = min(int(np.searchsorted(cum, u, side="right")), len(order) - 1)
        return int(order[index])

    def accept(self, token: int) -> bool:
        """Record ``token`` as produced; True if it ends the request (EOS or a stop sequence)."""
        history = self._history
        history.append(token)
        if self.eos is not None and token == self.eos:
            return True
        if self._text is not None and self._detok is not None:
            self._text.feed(self._detok.push(token))
            if self._text.matched is not None:
                return True
        if self._max_stop:
            if len(history) > self._max_stop:
                del history[: len(history) - self._max_stop]
            for seq in self.params.stop:
                n = len(seq)
                if len(history) >= n and tuple(history[-n:]) == seq:
                    return True
        return False


@dataclass(frozen=True)
class SamplerStatistics:
    active: int
    sampled: int
    greedy: int
    stochastic: int
    no_logits: int
    unusable_logits: int
    stops_eos: int
    stops_sequence: int


@dataclass
class SamplerPool:
    """Samplers by request id; used by the completion path on the actor thread only."""

    seed: int = 0
    eos: int | None = None
    decoder: TextDecoder | None = None
    """The model's tokenizer, to match stop strings on the decoded text (issue #14)."""
    _samplers: dict[int, Sampler] = field(default_factory=dict)
    _sampled: int = 0
    _greedy: int = 0
    _stochastic: int = 0
    _no_logits: int = 0
    _unusable: int = 0
    _stops_eos: int = 0
    _stops_seq: int = 0

    def register(self, request_id: int, params: SamplingParams) -> Sampler:
        seed = params.seed if params.seed is not None else (self.seed, request_id)  # derived at the first draw
        sampler = Sampler(params, eos=self.eos, seed=seed, decoder=self.decoder)
        self._samplers[request_id] = sampler
        return sampler

    def release(self, request_id: int) -> None:
        self._samplers.pop(request_id, None)

    def __contains__(self, request_id: int) -> bool:
        return request_id in self._samplers

    def sample(self, request_id: int, logits: np.ndarray | None, greedy_token: int | None) -> Sample | None:
        """The next token of ``request_id`` and whether it stops; None if nothing usable came back."""
        sampler = self._samplers.get(request_id)
        if sampler is None:
            return None
        self._sampled += 1
        if logits is None:  # the device's own token (the null device, a host that does not sample): no choice
            self._no_logits += 1
            token = greedy_token
        else:
            if sampler.params.greedy:
                self._greedy += 1
            else:
                self._stochastic += 1
            token = sampler.choose(logits, greedy_token)
        if token is None:
            self._unusable += 1
            return None
        stop = sampler.accept(token)
        if stop:
            if token == sampler.eos:
                self._stops_eos += 1
            else:
                self._stops_seq += 1
        return _new_sample(Sample, (token, stop))

    def statistics(self) -> SamplerStatistics:
        return SamplerStatistics(len(self._samplers), self._sampled, self._greedy, self._stochastic,
                                 self._no_logits, self._unusable, self._stops_eos, self._stops_seq)
