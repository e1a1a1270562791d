"""A package's own tokenizer and chat template, loaded and checked against its manifest at model load
(#18, §11 step 3): vocabulary vs logits width, special tokens, a template that renders."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest

from calculet.adapters.sim import SimCalRT, SimConfig
from calculet.adapters.sim.build import build_package
from calculet.adapters.sim.bundled import build_bundled
from calculet.adapters.sim.model import TinyConfig
from calculet.clock import FakeClock
from calculet.config import parse_config
from calculet.errors import BadRequest, PackageError
from calculet.packages.tokenizer_files import (
    CHAT_TEMPLATE,
    TOKENIZER_CONFIG_FILE,
    bundled_tokenizer_files,
    corpus_text,
    files_for,
    train_bpe,
)
from calculet.runtime.engine.driver import EngineDriver
from calculet.runtime.engine.types import EngineOptions
from calculet.runtime.streams.package_tokenizer import HfTokenizer, load_tokenizer
from calculet.runtime.streams.tokenizer import ByteTokenizer


def load(path: Path) -> object:
    manifest = (path / "manifest.json").read_bytes()
    return load_tokenizer(path, manifest, hashlib.sha256(manifest).hexdigest())


@pytest.fixture(scope="module")
def bundled(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("bundled") / "pkg"
    build_bundled(path)
    return path


def test_the_bundled_tokenizer_is_a_trained_bpe_and_builds_reproducibly(bundled: Path,
                                                                        tmp_path: Path) -> None:
    again = tmp_path / "again"
    build_bundled(again)
    for name in ("manifest.json", "tokenizer.json", "tokenizer_config.json", "weights.bin"):
        assert (again / name).read_bytes() == (bundled / name).read_bytes(), name
    tok = load(bundled)
    assert isinstance(tok, HfTokenizer) and tok.vocab_size == 512
    text = "the scheduler serves KV lanes"
    ids = tok.encode(text, add_bos=False)
    assert len(ids) < len(text.encode()) and tok.decode(ids) == text  # merges learned, round trip exact
    assert "scheduler" in corpus_text()


def test_chat_is_rendered_by_the_package_template(bundled: Path) -> None:
    tok = load(bundled)
    assert isinstance(tok, HfTokenizer)
    text = tok.chat_text([("system", "be brief"), ("user", "hi")])
    assert text == "<|bos|><|system|>\nbe brief\n<|user|>\nhi\n<|assistant|>\n"
    ids = tok.encode_chat(text)
    assert ids[:2] == [tok.bos, 4] and ids[-2] == 6  # <|bos|> <|system|> ... <|assistant|> "\n"
    with pytest.raises(BadRequest, match="unknown role"):
        tok.chat_text([("tool", "x")])


def test_the_detokenizer_streams_text_without_splitting_characters(bundled: Path) -> None:
    tok = load(bundled)
    assert isinstance(tok, HfTokenizer)
    text = "héllo, wörld — NPU ✓"
    ids = tok.encode(text, add_bos=True)
    detok = tok.detokenizer()
    pieces = [detok.push(t) for t in ids]
    assert "".join(pieces) + detok.flush() == text
    assert all("\ufffd" not in p for p in pieces)


def test_a_byte_level_package_keeps_the_byte_tokenizer(tmp_path: Path) -> None:
    build_package(tmp_path / "byte")
    assert isinstance(load(tmp_path / "byte"), ByteTokenizer)


def test_a_tokenizer_whose_vocabulary_is_not_the_logits_width_is_refused(tmp_path: Path) -> None:
    """The model scores 512 ids; a 300-token tokenizer cannot decode them: refused naming both sizes."""
    small = files_for(train_bpe(corpus_text(), vocab_size=300))
    build_package(tmp_path / "pkg", tokenizer=small, config=TinyConfig(vocab_size=512, bos=0, eos=1, pad=2, unk=3))
    with pytest.raises(PackageError, match="vocabulary has 300 tokens but the model's logits are 512 wide"):
        load(tmp_path / "pkg")


def test_the_mismatch_stops_the_model_load(tmp_path: Path) -> None:
    """§11 step 3: the engine does not come up on such a package (the error names the tokenizer)."""
    small = files_for(train_bpe(corpus_text(), vocab_size=300))
    build_package(tmp_path / "pkg", tokenizer=small, config=TinyConfig(vocab_size=512, bos=0, eos=1, pad=2, unk=3))
    clock = FakeClock()
    with pytest.raises(PackageError, match="logits are 512 wide"):
        EngineDriver(parse_config({"schema": "calculet-scheduler/v1"}), SimCalRT(SimConfig(clock=clock)),
                     tmp_path / "pkg", clock=clock, options=EngineOptions(monitor_mode=None))


def test_special_tokens_and_template_are_checked(tmp_path: Path) -> None:
    files = bundled_tokenizer_files()
    build_package(tmp_path / "eos", tokenizer=files, config=TinyConfig(vocab_size=512, bos=0, eos=9, pad=2, unk=3))
    with pytest.raises(PackageError, match="special token eos=9"):
        load(tmp_path / "eos")
    broken = bundled_tokenizer_files(chat_template="{% for m in messages %}{{ m['content'] }")
    build_package(tmp_path / "tpl", tokenizer=broken)
    with pytest.raises(PackageError, match="chat template does not render"):
        load(tmp_path / "tpl")
    build_package(tmp_path / "bos", tokenizer=files)
    config = json.loads((tmp_path / "bos" / TOKENIZER_CONFIG_FILE).read_text())
    (tmp_path / "bos" / TOKENIZER_CONFIG_FILE).write_text(json.dumps({**config, "bos_token": "<|pad|>"}))
    with pytest.raises(PackageError, match="bos_token '<\\|pad\\|>' is not the manifest's bos id 0"):
        load(tmp_path / "bos")
    assert "{{ bos_token }}" in CHAT_TEMPLATE


def test_a_byte_level_tokenizer_streams_through_its_byte_table_exactly_as_through_the_backend(bundled: Path) -> None:
    """Issue #20 (the detokeniser decoded each token twice through the Rust backend): the bundled byte-level BPE
    tokenizer gets a table of each id's bytes, and a stream decoded by it returns the same pieces at the same
    pushes as the backend's window decoding — over random ids, specials, split and invalid UTF-8 included."""
    import random

    tok = load(bundled)
    assert isinstance(tok, HfTokenizer) and tok.byte_table is not None
    assert len(tok.byte_table) == tok.vocab_size
    by_backend = HfTokenizer(tok._backend, tok.template, vocab_size=tok.vocab_size, bos=tok.bos, eos=tok.eos,
                             specials=tok._specials)
    assert by_backend.byte_table is None
    rng = random.Random(20)
    multibyte = tok.encode("é✓ü€😀", add_bos=False)
    for _ in range(200):
        ids = [rng.choice((rng.randrange(tok.vocab_size), rng.choice(multibyte), tok.eos))
               for _ in range(rng.randrange(1, 40))]
        fast, slow = tok.detokenizer(), by_backend.detokenizer()
        assert [fast.push(t) for t in ids] == [slow.push(t) for t in ids], ids
        assert fast.flush() == slow.flush()


def test_a_tokenizer_whose_decoder_is_not_byte_level_gets_no_table(bundled: Path) -> None:
    """Only a decoder that is byte-level and nothing else is decoded by the table (another decoder may join
    pieces by rules of its own: the backend's window decoding stays the only rule there)."""
    from calculet.runtime.streams.package_tokenizer import byte_level_table

    tok = load(bundled)
    assert isinstance(tok, HfTokenizer)
    spec = json.loads(tok._backend.to_str())
    assert byte_level_table(tok._backend, spec, tok.vocab_size, tok._specials) is not None
    spec["decoder"] = {"type": "Sequence", "decoders": [spec["decoder"]]}
    assert byte_level_table(tok._backend, spec, tok.vocab_size, tok._specials) is None
    del spec["decoder"]
    assert byte_level_table(tok._backend, spec, tok.vocab_size, tok._specials) is None


def test_held_bytes_stream_as_the_backend_window_does(bundled: Path) -> None:
    """Issue #20 (the byte table keeps only the bytes not yet shown, and an id whose bytes are whole characters
    returns its precomputed text when nothing is held): against the backend's window decoding, over streams made
    to split and break characters — lone bytes >= 0x80 (continuations, lead bytes, invalid ones), a character's
    bytes pushed one by one, ids that end in half a character, and ids of whole characters between them."""
    import random

    tok = load(bundled)
    assert isinstance(tok, HfTokenizer) and tok.byte_table is not None and tok.piece_text is not None
    by_backend = HfTokenizer(tok._backend, tok.template, vocab_size=tok.vocab_size, bos=tok.bos, eos=tok.eos,
                             specials=tok._specials)
    table = tok.byte_table
    high = [i for i, b in enumerate(table) if len(b) == 1 and b[0] >= 0x80]
    broken = [i for i, b in enumerate(table) if b and i not in tok._specials and tok.piece_text[i] is None]
    whole = [i for i, text in enumerate(tok.piece_text) if text is not None]
    assert len(high) > 60 and broken and whole  # the bundled vocabulary has every byte, so all three kinds
    for i, text in enumerate(tok.piece_text):  # the precomputed text is the backend's, where it is set
        if text is not None:
            assert text == tok._backend.decode([i], skip_special_tokens=True)
    rng = random.Random(2020)
    for _ in range(400):
        ids = [rng.choice((rng.choice(high), rng.choice(high), rng.choice(broken), rng.choice(whole), tok.eos))
               for _ in range(rng.randrange(1, 30))]
        fast, slow = tok.detokenizer(), by_backend.detokenizer()
        assert [fast.push(t) for t in ids] == [slow.push(t) for t in ids], ids
        assert fast.flush() == slow.flush(), ids
