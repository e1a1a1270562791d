"""Golden equivalence on the simulated NPU (real numerics).

A lane decoded inside a B4/B8/B16 batch must produce the same logits (within 1e-5) and greedy
tokens as the same sequence decoded alone on B1 (§18 "filling lanes 1..B", "mixed sequence
length"), and chunked prefill at boundaries 15/16/17 (and random ones) must give the same KV and
logits as one-shot prefill (§6 preconditions 2 and 4). This is simulated evidence of the software
path only; the hardware items (R18.x, R6.7, R6.9) still need the NPU (§20).
"""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from calculet.adapters.calrt import KvSeqId
from calculet.adapters.sim import SimKvManager, SimSession, open_sim
from calculet.adapters.host_driver import HostDriver

ATOL = 1e-5
STEPS = 4


@pytest.fixture(scope="module")
def session() -> Iterator[SimSession]:
    with open_sim("future") as s:
        yield s


@pytest.fixture(scope="module")
def driver(session: SimSession) -> HostDriver:
    return HostDriver(session.device, session.calbin, session.kv)


def random_prompts(rng: np.random.Generator, n: int) -> list[list[int]]:
    return [[256, *rng.integers(0, 256, size=int(rng.integers(2, 48))).tolist()] for _ in range(n)]


def decode_alone(driver: HostDriver, prompt: list[int], steps: int) -> tuple[list[int], list[np.ndarray]]:
    """Reference: prefill, then `steps` greedy B1 decodes; returns tokens and per-step logits."""
    kv = driver.kv
    seq = kv.allocate_sequence()
    try:
        first = driver.prefill(seq, prompt)
        assert first.ok and first.lanes[0].logits is not None
        tokens = [int(np.argmax(first.lanes[0].logits))]
        logits = []
        for _ in range(steps):
            res = driver.decode(1, [(seq, tokens[-1])])
            lane_logits = res.lanes[0].logits
            assert res.ok and lane_logits is not None
            logits.append(lane_logits)
            tokens.append(int(np.argmax(lane_logits)))
        return tokens, logits
    finally:
        kv.free_sequence(seq)


def decode_batched(driver: HostDriver, batch: int, lanes: list[int], prompts: list[list[int]], steps: int
                   ) -> tuple[list[list[int]], list[list[np.ndarray]]]:
    """Same sequences in one compiled batch, active only in `lanes` (the rest inactive)."""
    kv = driver.kv
    seqs = [kv.allocate_sequence() for _ in prompts]
    try:
        tokens: list[list[int]] = []
        for seq, prompt in zip(seqs, prompts, strict=True):
            first = driver.prefill(seq, prompt)
            assert first.ok and first.lanes[0].logits is not None
            tokens.append([int(np.argmax(first.lanes[0].logits))])
        logits: list[list[np.ndarray]] = [[] for _ in prompts]
        for _ in range(steps):
            layout: list[tuple[KvSeqId, int] | None] = [None] * batch
            for i, lane in enumerate(lanes):
                layout[lane] = (seqs[i], tokens[i][-1])
            res = driver.decode(batch, layout)
            assert res.ok
            for i, lane in enumerate(lanes):
                out = res.lanes[lane]
                assert out.lane == lane and out.seq_id == seqs[i] and out.valid and out.logits is not None
                logits[i].append(out.logits)
                tokens[i].append(int(np.argmax(out.logits)))
            for lane in set(range(batch)) - set(lanes):
                assert not res.lanes[lane].valid and res.lanes[lane].logits is None
        return tokens, logits
    finally:
        for seq in seqs:
            kv.free_sequence(seq)


@pytest.mark.req("R18.1", "R18.2", "R11.9")
def test_golden_vectors_pass_on_both_variants(driver: HostDriver) -> None:
    for vector in driver.calbin.golden:
        outcome = driver.check_golden(vector)
        assert outcome.ok, outcome.detail
    with open_sim("current") as current:
        cur = HostDriver(current.device, current.calbin, current.kv)
        assert all(cur.check_golden(v).ok for v in current.calbin.golden)


@pytest.mark.req("R18.5", "R18.8", "R7.4.1", "R19.9")
@pytest.mark.parametrize("batch", [4, 8, 16])
def test_full_batch_lanes_equal_sequences_decoded_alone(driver: HostDriver, batch: int) -> None:
    rng = np.random.default_rng(batch)
    prompts = random_prompts(rng, batch)
    assert len({len(p) for p in prompts}) > 1, "mixed lengths in one batch"
    alone = [decode_alone(driver, p, STEPS) for p in prompts]
    tokens, logits = decode_batched(driver, batch, list(range(batch)), prompts, STEPS)
    for i in range(batch):
        assert tokens[i] == alone[i][0], f"lane {i} greedy tokens differ"
        for step in range(STEPS):
            np.testing.assert_allclose(logits[i][step], alone[i][1][step], atol=ATOL, rtol=0)


@pytest.mark.req("R18.5", "R7.1.1", "R7.1.2")
@pytest.mark.parametrize("batch", [4, 8])
def test_partially_filled_batches_are_exact_for_every_fill_level(driver: HostDriver, batch: int) -> None:
    rng = np.random.default_rng(100 + batch)
    for active in range(1, batch + 1):
        lanes = sorted(rng.choice(batch, size=active, replace=False).tolist())
        prompts = random_prompts(rng, active)
        alone = [decode_alone(driver, p, 2) for p in prompts]
        tokens, logits = decode_batched(driver, batch, lanes, prompts, 2)
        for i in range(active):
            assert tokens[i] == alone[i][0]
            for step in range(2):
                np.testing.assert_allclose(logits[i][step], alone[i][1][step], atol=ATOL, rtol=0)


def prefill_in_chunks(driver: HostDriver, prompt: list[int], cuts: list[int]) -> tuple[KvSeqId, np.ndarray]:
    kv = driver.kv
    seq = kv.allocate_sequence()
    bounds = [0, *sorted(set(c for c in cuts if 0 < c < len(prompt))), len(prompt)]
    result = None
    for lo, hi in zip(bounds, bounds[1:], strict=False):
        result = driver.prefill(seq, prompt[lo:hi])
        assert result.ok and result.lanes[0].position == lo and result.lanes[0].kv_len == hi
    assert result is not None and result.lanes[0].logits is not None
    return seq, result.lanes[0].logits


def assert_chunked_equals_one_shot(driver: HostDriver, prompt: list[int], cuts: list[int]) -> None:
    kv = driver.kv
    assert isinstance(kv, SimKvManager)
    whole, whole_logits = prefill_in_chunks(driver, prompt, [])
    chunked, chunk_logits = prefill_in_chunks(driver, prompt, cuts)
    try:
        np.testing.assert_allclose(chunk_logits, whole_logits, atol=ATOL, rtol=0)
        a, b = kv.inspect(whole), kv.inspect(chunked)
        assert a.committed_len == b.committed_len == len(prompt)
        assert a.k is not None and b.k is not None and a.v is not None and b.v is not None
        np.testing.assert_allclose(b.k, a.k, atol=ATOL, rtol=0)
        np.testing.assert_allclose(b.v, a.v, atol=ATOL, rtol=0)
        # Decoding on after either prefill gives the same next step.
        token = int(np.argmax(whole_logits))
        ra = driver.decode(4, [(whole, token), (chunked, token)])
        assert ra.lanes[0].logits is not None and ra.lanes[1].logits is not None
        np.testing.assert_allclose(ra.lanes[1].logits, ra.lanes[0].logits, atol=ATOL, rtol=0)
    finally:
        kv.free_sequence(whole)
        kv.free_sequence(chunked)


@pytest.mark.req("R6.7", "R6.9")
@pytest.mark.parametrize("boundary", [15, 16, 17])
def test_chunked_prefill_at_boundaries_15_16_17_equals_one_shot(driver: HostDriver, boundary: int) -> None:
    rng = np.random.default_rng(boundary)
    prompt = [256, *rng.integers(0, 256, size=40).tolist()]
    assert_chunked_equals_one_shot(driver, prompt, [boundary])
    assert_chunked_equals_one_shot(driver, prompt, [boundary, 2 * boundary])


@pytest.mark.req("R6.7", "R6.9")
@settings(max_examples=30, deadline=None, derandomize=True)
@given(data=st.data())
def test_chunked_prefill_at_random_boundaries_equals_one_shot(driver: HostDriver, data: st.DataObject) -> None:
    length = data.draw(st.integers(min_value=2, max_value=70), label="length")
    prompt = data.draw(st.lists(st.integers(0, 259), min_size=length, max_size=length), label="prompt")
    cuts = data.draw(st.lists(st.integers(1, length - 1), max_size=5), label="cuts")
    assert_chunked_equals_one_shot(driver, prompt, cuts)
