"""SamplerPool (§3, §7.4): greedy, temperature, top-k, top-p, stop sequences, per-request seeds."""

from __future__ import annotations

import numpy as np
import pytest

from calculet.errors import BadRequest
from calculet.runtime.execution.sampler import Sample, Sampler, SamplerPool, SamplingParams

LOGITS = np.array([0.0, 2.0, 1.0, 3.0, -1.0, 2.5])


@pytest.mark.req("R7.4.3")
def test_greedy_is_argmax_and_uses_no_randomness() -> None:
    sampler = Sampler(SamplingParams(), eos=None, seed=1)
    assert [sampler.choose(LOGITS, None) for _ in range(5)] == [3] * 5
    assert Sampler(SamplingParams(temperature=1.0, top_k=1), eos=None, seed=9).choose(LOGITS, None) == 3


def test_without_logits_only_the_device_greedy_token_can_be_used() -> None:
    sampler = Sampler(SamplingParams(temperature=0.7), eos=None, seed=1)
    assert sampler.choose(None, 42) == 42
    pool = SamplerPool(seed=0)
    pool.register(1, SamplingParams())
    assert pool.sample(1, None, 7) == Sample(7, False) and pool.statistics().no_logits == 1


def test_the_same_seed_gives_the_same_tokens_whatever_the_interleaving() -> None:
    """A request's tokens depend only on its own seed and logits (§18: batching-independent)."""
    params = SamplingParams(temperature=1.3, top_p=0.9, seed=77)
    rng = np.random.default_rng(0)
    rows = [rng.normal(size=32) for _ in range(20)]
    alone = SamplerPool()
    alone.register(1, params)
    a = [alone.sample(1, row, None) for row in rows]
    mixed = SamplerPool()
    mixed.register(5, params)
    mixed.register(6, SamplingParams(temperature=1.0, seed=3))
    b = []
    for row in rows:
        mixed.sample(6, row[::-1].copy(), None)
        b.append(mixed.sample(5, row, None))
    assert a == b


def test_without_a_seed_the_engine_seed_and_request_id_decide() -> None:
    rows = [np.random.default_rng(i).normal(size=16) for i in range(10)]

    def run(engine_seed: int, rid: int) -> list[int]:
        pool = SamplerPool(seed=engine_seed)
        pool.register(rid, SamplingParams(temperature=1.0))
        out = []
        for row in rows:
            sample = pool.sample(rid, row, None)
            assert sample is not None
            out.append(sample.token)
        return out

    assert run(0, 1) == run(0, 1) and run(0, 1) != run(0, 2)


def test_temperature_sampling_follows_the_softmax() -> None:
    logits = np.log(np.array([0.5, 0.3, 0.2]))
    sampler = Sampler(SamplingParams(temperature=1.0), eos=None, seed=12345)
    draws = np.bincount([sampler.choose(logits, None) for _ in range(20_000)], minlength=3) / 20_000
    np.testing.assert_allclose(draws, [0.5, 0.3, 0.2], atol=0.015)


def test_top_k_and_top_p_restrict_the_support() -> None:
    top_k = Sampler(SamplingParams(temperature=5.0, top_k=2), eos=None, seed=5)
    assert {top_k.choose(LOGITS, None) for _ in range(500)} == {3, 5}
    probs = np.log(np.array([0.6, 0.25, 0.1, 0.05]))
    top_p = Sampler(SamplingParams(temperature=1.0, top_p=0.8), eos=None, seed=5)
    assert {top_p.choose(probs, None) for _ in range(500)} == {0, 1}
    tiny = Sampler(SamplingParams(temperature=1.0, top_p=0.01), eos=None, seed=5)
    assert {tiny.choose(probs, None) for _ in range(100)} == {0}


@pytest.mark.req("R7.4.3")
def test_eos_and_stop_sequences_stop_the_request() -> None:
    pool = SamplerPool(eos=9)
    pool.register(1, SamplingParams(stop=((4, 5), (7,))))
    one_hot = lambda t: np.eye(10)[t] * 10  # noqa: E731
    assert pool.sample(1, one_hot(4), None) == Sample(4, False)
    assert pool.sample(1, one_hot(5), None) == Sample(5, True)
    assert pool.sample(1, one_hot(7), None) == Sample(7, True)
    assert pool.sample(1, one_hot(9), None) == Sample(9, True)
    pool.register(2, SamplingParams(ignore_eos=True))
    assert pool.sample(2, one_hot(9), None) == Sample(9, False)
    stats = pool.statistics()
    assert (stats.stops_eos, stats.stops_sequence, stats.active) == (1, 2, 2)
    pool.release(1)
    assert 1 not in pool and pool.sample(1, one_hot(1), None) is None


def test_unusable_logits_give_no_token() -> None:
    pool = SamplerPool()
    pool.register(1, SamplingParams(temperature=1.0))
    assert pool.sample(1, np.array([np.nan, 1.0]), None) is None
    assert pool.statistics().unusable_logits == 1


@pytest.mark.req("R5.2.3")
@pytest.mark.parametrize("kwargs", [dict(temperature=-1.0), dict(top_p=0.0), dict(top_p=1.5), dict(top_k=-1),
                                    dict(seed=-3), dict(stop=((),)), dict(stop=((1, -2),))])
def test_invalid_parameters_are_a_bad_request(kwargs: dict[str, object]) -> None:
    with pytest.raises(BadRequest):
        SamplingParams(**kwargs)  # type: ignore[arg-type]


def test_a_generator_derived_at_the_first_draw_draws_what_one_seeded_at_registration_would() -> None:
    """Without a seed, a request's generator is seeded from ``SeedSequence([engine seed, request id])`` — built at
    its first random draw now (#20), the tokens are those of a sampler given that seed at registration (the rule
    since issue #18's sampler). Catches: another derivation (the id first, the engine seed alone), a draw taken
    before the generator is kept (a fresh generator per token repeats the first draw)."""
    rows = [np.random.default_rng(i).normal(size=16) for i in range(12)]
    params = SamplingParams(temperature=1.0)
    pool = SamplerPool(seed=11)
    pool.register(7, params)
    lazy = [pool.sample(7, row, None) for row in rows]
    seeded = Sampler(params, eos=None, seed=int(np.random.SeedSequence([11, 7]).generate_state(1)[0]))
    assert [s.token for s in lazy if s is not None] == [seeded.choose(row, None) for row in rows]


def test_a_request_given_its_tokens_or_sampled_greedily_never_builds_a_generator() -> None:
    """The device's own tokens (the null device: no logits) and greedy sampling draw nothing, so the generator —
    a ``SeedSequence`` and a ``PCG64``, ~55 µs a request on the actor — is never built (#20). Catches: the
    generator built at registration again."""
    pool = SamplerPool(seed=0)
    device_tokens = pool.register(1, SamplingParams(temperature=0.8))
    greedy = pool.register(2, SamplingParams())
    for token in range(5):
        pool.sample(1, None, token)
        pool.sample(2, np.arange(8.0), None)
    assert device_tokens._rng is None and greedy._rng is None  # noqa: SLF001
