"""A byte-level BPE tokenizer's ids from its pre-tokens' kept ids (:class:`PieceCache`, issue #13: the prompt's
tokenisation was an eighth of the event loop's CPU per refused request) are the backend's, on any text."""

from __future__ import annotations

import json
import random

import pytest
from tokenizers import Tokenizer as HfBackend

from calculet.adapters.sim.bundled import build_bundled
from calculet.runtime.streams.package_tokenizer import HfTokenizer, PieceCache
from tests.unit.runtime.streams.test_package_tokenizer import load

ALPHABET = ("a", "b", "s", "t", "d", "m", "l", "r", "e", "v", "Z", "Q", "0", "7", "9", " ", " ", " ", "\t", "\n", "\r",
            "'", "'", ".", ",", "!", "-", "_", "<", "|", ">", "~", "{", "\\", "é", "\u00a0", "\x0b", "\x1c", "日")
"""Letters of the contractions, digits, each whitespace (and runs of spaces), punctuation, and what the cache leaves to
the backend: non-ASCII letters and spaces, control characters."""
WORDS = ("'s", "'t", "'re", "'ve", "'m", "'ll", "'d", "'S", "  ", "   ", "<|bos|>", "<|eos|>", "<|", "bos", "the",
         " scheduler", "KV", "123456789", "\n\n", " \t ")


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory: pytest.TempPathFactory) -> HfTokenizer:
    path = tmp_path_factory.mktemp("bundled") / "pkg"
    build_bundled(path)
    tok = load(path)
    assert isinstance(tok, HfTokenizer)
    return tok


def _texts(seed: int, count: int) -> list[str]:
    """Half of them of printable ASCII and ``\\t\\n\\r`` only (the texts the cache splits itself)."""
    rng = random.Random(seed)
    plain = [c for c in ALPHABET if c.isascii() and (c.isprintable() or c in "\t\n\r")]
    texts = []
    for i in range(count):
        letters = plain if i % 2 else ALPHABET
        parts = [rng.choice(WORDS) if rng.random() < 0.3 else rng.choice(letters) for _ in range(rng.randint(0, 24))]
        texts.append("".join(parts))
    return texts


def test_the_kept_pieces_give_the_backends_ids_on_random_texts(tokenizer: HfTokenizer) -> None:
    """Random texts over contractions, every whitespace and runs of it, digits, punctuation, added tokens' contents,
    non-ASCII and control characters: the ids are the backend's, cache cold and warm, and the cache served most of
    them (it is used). Mutants caught (each checked): ``\\s+(?!\\S)`` without its look-ahead (a space run before a word
    split differently), the contractions left out, no added-token check (``<|eos|>`` in a text: its id, not its
    characters' BPE), any character let through (``\\x1c`` is whitespace to Python's ``\\s`` only)."""
    pieces = tokenizer.pieces
    assert pieces is not None  # the bundled tokenizer is GPT-2's byte-level BPE
    backend = tokenizer._backend
    for seed in (1, 2):
        for text in _texts(seed, 4000):
            assert tokenizer.encode(text, add_bos=False) == backend.encode(text, add_special_tokens=False).ids, text
            assert tokenizer.encode(text) == [tokenizer.bos, *backend.encode(text, add_special_tokens=False).ids]
    assert pieces.hits > 10 * pieces.misses > 0


def test_a_tokenizer_split_otherwise_keeps_no_pieces(tokenizer: HfTokenizer) -> None:
    """A normalizer, another pre-tokenizer, a prefix space, BPE dropout: the text goes to the backend whole. Mutant
    caught: :meth:`PieceCache.of` ignoring the configuration (a cache for each)."""
    document = json.loads(tokenizer._backend.to_str())
    assert PieceCache.of(tokenizer._backend, document) is not None
    changed = [{**document, "normalizer": {"type": "Lowercase"}},
               {**document, "pre_tokenizer": {"type": "Whitespace"}},
               {**document, "pre_tokenizer": {**document["pre_tokenizer"], "add_prefix_space": True}},
               {**document, "pre_tokenizer": {**document["pre_tokenizer"], "use_regex": False}},
               {**document, "model": {**document["model"], "dropout": 0.1}}]
    for other in changed:
        assert PieceCache.of(HfBackend.from_str(json.dumps(other)), other) is None, other


def test_a_full_cache_is_emptied_and_still_exact(tokenizer: HfTokenizer, monkeypatch: pytest.MonkeyPatch) -> None:
    """Bounded (PIECES_KEPT): emptied when full, the ids unchanged. Mutant caught: no bound (more kept than allowed)."""
    from calculet.runtime.streams import package_tokenizer

    monkeypatch.setattr(package_tokenizer, "PIECES_KEPT", 8)
    cache = PieceCache.of(tokenizer._backend, json.loads(tokenizer._backend.to_str()))
    assert cache is not None
    for text in _texts(3, 300):
        assert cache.encode(text) in (None, tokenizer._backend.encode(text, add_special_tokens=False).ids)
        assert len(cache) <= 8


def test_the_caches_counts_are_in_the_tokenizers_statistics(tokenizer: HfTokenizer) -> None:
    """DESIGN, ``statistics()`` on every component: an operator sees whether the cache pays (hits against misses)
    and how full it is. Catches: the counts not read (always 0), hits and misses swapped, a new word not counted
    as a miss or a seen one not as a hit."""
    before = tokenizer.statistics()
    tokenizer.encode("zyxwv zyxwv zyxwv", add_bos=False)  # one new pre-token ("zyxwv"), then twice " zyxwv"
    after = tokenizer.statistics()
    assert (after.piece_misses - before.piece_misses, after.piece_hits - before.piece_hits) == (2, 1)
    assert after.pieces_kept == len(tokenizer.pieces) > 0  # type: ignore[arg-type]
