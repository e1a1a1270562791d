"""The sampler ends a request on a stop string matched on the decoded text (issue #14, §7.4).

With the bundled BPE tokenizer a stop string is generated across token boundaries or inside one token;
the sampler must say "stop" at the token whose text completes it, whatever the token ids are.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

import numpy as np
import pytest

from calculet.adapters.sim.bundled import build_bundled
from calculet.errors import BadRequest
from calculet.runtime.execution.sampler import Sampler, SamplerPool, SamplingParams
from calculet.runtime.streams.package_tokenizer import HfTokenizer, load_tokenizer

TEXT = "the scheduler serves KV lanes"


@pytest.fixture(scope="module")
def tok(tmp_path_factory: pytest.TempPathFactory) -> HfTokenizer:
    path: Path = tmp_path_factory.mktemp("bundled") / "pkg"
    build_bundled(path)
    manifest = (path / "manifest.json").read_bytes()
    loaded = load_tokenizer(path, manifest, hashlib.sha256(manifest).hexdigest())
    assert isinstance(loaded, HfTokenizer)
    return loaded


def first_stop(sampler: Sampler, ids: list[int]) -> int | None:
    """The index of the token the sampler stops at, or None."""
    for i, t in enumerate(ids):
        if sampler.accept(t):
            return i
    return None


def ends(tok: HfTokenizer, ids: list[int]) -> list[int]:
    det = tok.detokenizer()
    out, n = [], 0
    for t in ids:
        n += len(det.push(t))
        out.append(n)
    return out


@pytest.mark.parametrize("stop", ["e s", "hedu", "r", "lanes", "KV l"])
def test_the_sampler_stops_at_the_token_that_completes_the_stop_text(tok: HfTokenizer, stop: str) -> None:
    ids = tok.encode(TEXT, add_bos=False)
    completes = TEXT.find(stop) + len(stop)
    expected = next(i for i, end in enumerate(ends(tok, ids)) if end >= completes)
    sampler = Sampler(SamplingParams(stop_text=("\x00never", stop), ignore_eos=True), eos=tok.eos, seed=0,
                      decoder=tok)
    assert first_stop(sampler, ids) == expected and sampler.stop_matched == stop


def test_token_id_matching_would_miss_a_stop_across_a_boundary(tok: HfTokenizer) -> None:
    """The bug: "e s" tokenised alone is not a subsequence of the ids that write it; by text it stops."""
    ids = tok.encode(TEXT, add_bos=False)
    stop_ids = tuple(tok.encode("e s", add_bos=False))
    by_ids = Sampler(SamplingParams(stop=(stop_ids,)), eos=tok.eos, seed=0)
    assert first_stop(by_ids, ids) is None
    by_text = Sampler(SamplingParams(stop_text=("e s",)), eos=tok.eos, seed=0, decoder=tok)
    assert first_stop(by_text, ids) is not None


def test_the_pool_counts_text_stops_and_needs_a_decoder(tok: HfTokenizer) -> None:
    ids = tok.encode(TEXT, add_bos=False)
    pool = SamplerPool(seed=1, eos=tok.eos, decoder=tok)
    pool.register(7, SamplingParams(stop_text=("serves",)))
    stops = []
    for t in ids:
        logits = np.full(tok.vocab_size, -10.0)
        logits[t] = 10.0
        sample = pool.sample(7, logits, None)
        assert sample is not None and sample.token == t
        stops.append(sample.stop)
        if sample.stop:
            break
    assert stops.count(True) == 1 and pool.statistics().stops_sequence == 1
    with pytest.raises(BadRequest):
        SamplerPool(eos=tok.eos).register(8, SamplingParams(stop_text=("x",)))
    with pytest.raises(BadRequest):
        SamplingParams(stop_text=("",))
